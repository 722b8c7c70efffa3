//! drover's own resource shortages, told apart from an endpoint's failures.
//!
//! A connect that fails because drover ran out of file descriptors, memory, socket
//! buffers or local ports says nothing about the endpoint: every endpoint would fail the
//! same way. Counting it against the endpoint ejected healthy backends exactly when
//! drover was under the most load (issue 11, item 4), turning a shortage into an outage.

use drover_balance::{clock, Nanos};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Whether `e` is drover running short of its own resources rather than a peer failing:
/// `EMFILE`/`ENFILE` (descriptors), `ENOBUFS`/`ENOMEM` (kernel memory), `EADDRNOTAVAIL`
/// (no local port left for an outgoing connection).
pub fn is_local_shortage(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM | libc::EADDRNOTAVAIL)
    )
}

/// Lets one warning through per interval and counts the ones held back, so a shortage
/// that hits every request (or every accept) is reported without flooding the log.
#[derive(Debug)]
pub struct WarnLimit {
    interval: Nanos,
    /// When the last warning went out (0: never).
    last: AtomicU64,
    suppressed: AtomicU64,
}

impl WarnLimit {
    pub const fn new(interval: Duration) -> Self {
        WarnLimit {
            interval: interval.as_nanos() as Nanos,
            last: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
        }
    }

    /// `Some(n)` when a warning may go out now, `n` being how many were held back since
    /// the last one; `None` (and one more held back) otherwise.
    pub fn check(&self, now: Nanos) -> Option<u64> {
        let last = self.last.load(Relaxed);
        let due = last == 0 || now.saturating_sub(last) >= self.interval;
        if due
            && self
                .last
                .compare_exchange(last, now, Relaxed, Relaxed)
                .is_ok()
        {
            return Some(self.suppressed.swap(0, Relaxed));
        }
        self.suppressed.fetch_add(1, Relaxed);
        None
    }

    /// `check` at the current time.
    pub fn check_now(&self) -> Option<u64> {
        self.check(clock::now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shortages_are_drovers_and_peer_errors_are_not() {
        for code in [
            libc::EMFILE,
            libc::ENFILE,
            libc::ENOBUFS,
            libc::ENOMEM,
            libc::EADDRNOTAVAIL,
        ] {
            assert!(
                is_local_shortage(&io::Error::from_raw_os_error(code)),
                "{code}"
            );
        }
        for code in [
            libc::ECONNREFUSED,
            libc::ECONNRESET,
            libc::ETIMEDOUT,
            libc::EHOSTUNREACH,
        ] {
            assert!(
                !is_local_shortage(&io::Error::from_raw_os_error(code)),
                "{code}"
            );
        }
        assert!(!is_local_shortage(&io::Error::new(
            io::ErrorKind::TimedOut,
            "connect timed out"
        )));
    }

    #[test]
    fn one_warning_per_interval_with_the_count_held_back() {
        let limit = WarnLimit::new(Duration::from_secs(1));
        let s = 1_000_000_000;
        assert_eq!(limit.check(5), Some(0));
        assert_eq!(limit.check(6), None);
        assert_eq!(limit.check(s / 2), None);
        assert_eq!(limit.check(s + 4), None);
        assert_eq!(limit.check(s + 5), Some(3));
        assert_eq!(limit.check(3 * s), Some(0));
    }
}
