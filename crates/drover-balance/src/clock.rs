//! One monotonic clock for all load state, in nanoseconds since the process first asked.
//!
//! Endpoint state lives in atomics, and an `Instant` does not fit in one; a `u64` of
//! nanoseconds does, and lasts 584 years. Every function that needs the time takes it as
//! an argument so tests can drive time by hand.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Nanoseconds on the process-wide monotonic clock.
pub type Nanos = u64;

fn origin() -> Instant {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    *ORIGIN.get_or_init(Instant::now)
}

/// The current time on the process clock. Never 0, so 0 can mean "never".
pub fn now() -> Nanos {
    origin().elapsed().as_nanos() as Nanos + 1
}

/// A `Duration` as clock nanoseconds, saturating.
pub fn nanos(d: Duration) -> Nanos {
    d.as_nanos().min(u64::MAX as u128) as Nanos
}
