//! How long an app's workers have computed without a sign of life and come back: what
//! its requests (or events) can take.
//!
//! A check that gets no answer while nothing completes cannot tell a long computation
//! from an endless loop, so `fall` checks allow a request `fall - 1` intervals of it.
//! A socket.io app whose event handler blocked its loop for 5 s at a time, sent again
//! and again by one client, was killed as spinning; the client reconnected to the next
//! worker and sent it again, and that one was killed too (2 of 4 workers, 313 of 600
//! clients cut off). PM2 and Node's cluster module, with no checks, lost none. The
//! app had shown what it does: its worker came back from one such stall before. So a
//! spinning worker is allowed `ALLOWANCE` times the longest stall the app's workers
//! came back from lately; an endless loop is still found, after that long.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How many times its longest recent stall a spinning worker may take: a request of
/// twice or three times the usual size is no endless loop.
pub(crate) const ALLOWANCE: u32 = 3;

/// How long a stall is remembered after a worker last came back from one as long (or
/// half as long): an app whose long computations stopped is held to its checks again.
const REMEMBERED: Duration = Duration::from_secs(600);

/// The longest stall an app's workers came back from, and when one at least half as
/// long was last seen.
#[derive(Debug, Default)]
pub(crate) struct Stalls(Mutex<Option<(Duration, Instant)>>);

impl Stalls {
    /// A worker of the app showed life again after `stall` without one.
    pub(crate) fn came_back_from(&self, stall: Duration) {
        self.came_back_at(stall, Instant::now());
    }

    fn came_back_at(&self, stall: Duration, now: Instant) {
        let mut longest = self.0.lock().unwrap_or_else(|e| e.into_inner());
        *longest = match *longest {
            Some((known, seen)) if now.duration_since(seen) < REMEMBERED && known > stall => {
                Some((known, if stall >= known / 2 { now } else { seen }))
            }
            _ => Some((stall, now)),
        };
    }

    /// How long a spinning worker of the app may go without a sign of life: `ALLOWANCE`
    /// times the longest stall remembered; `None` when none is.
    pub(crate) fn allowed(&self) -> Option<(Duration, Duration)> {
        self.allowed_at(Instant::now())
    }

    /// The longest stall remembered at `now`, and what it allows.
    fn allowed_at(&self, now: Instant) -> Option<(Duration, Duration)> {
        let longest = self.0.lock().unwrap_or_else(|e| e.into_inner());
        longest
            .filter(|(_, seen)| now.duration_since(*seen) < REMEMBERED)
            .map(|(stall, _)| (stall, stall * ALLOWANCE))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_stall_is_remembered_while_half_as_long_ones_recur() {
        let stalls = Stalls::default();
        let t0 = Instant::now();
        let s = Duration::from_secs;
        assert_eq!(stalls.allowed_at(t0), None);
        stalls.came_back_at(s(4), t0);
        stalls.came_back_at(s(1), t0 + s(300));
        assert_eq!(stalls.allowed_at(t0 + s(599)), Some((s(4), s(12))));
        // Forgotten 10 minutes after it was last seen.
        assert_eq!(stalls.allowed_at(t0 + s(600)), None);
        // One at least half as long keeps it.
        stalls.came_back_at(s(2), t0 + s(500));
        assert_eq!(stalls.allowed_at(t0 + s(1000)), Some((s(4), s(12))));
        // A longer one replaces it; after it is forgotten, a shorter one counts.
        stalls.came_back_at(s(6), t0 + s(1000));
        assert_eq!(stalls.allowed_at(t0 + s(1001)), Some((s(6), s(18))));
        stalls.came_back_at(s(1), t0 + s(1700));
        assert_eq!(stalls.allowed_at(t0 + s(1701)), Some((s(1), s(3))));
    }
}
