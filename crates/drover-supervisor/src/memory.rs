//! A worker's resident memory, read from `/proc` (Linux), and the turns its app's
//! workers take to be replaced for it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Resident set size of process `pid` in bytes, or `None` when it is gone or `/proc` is
/// not there. `VmRSS` in `/proc/PID/status` is in kB, independent of the page size.
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    parse_vm_rss(&status)
}

fn parse_vm_rss(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line["VmRSS:".len()..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    kb.checked_mul(1024)
}

/// Replacements for `max_memory` take turns within an app, first come first served.
/// Workers of one app leak alike and cross the limit in the same second; replaced all
/// at once, each replacement is a cold start on a machine under load (measured at 25
/// MB/s per worker, 4 Node workers: p99 2.9 ms all at once, 1.4-1.6 ms one at a time,
/// and a lower peak RSS). But a worker that waits goes on growing: at 160 MB/s the
/// waiting ones reached twice the peak of all at once. So a worker waits only while it
/// is under `OVERSHOOT` × `max_memory` (`past_overshoot`).
#[derive(Clone)]
pub(crate) struct MemoryTurns(Arc<Semaphore>);

/// A worker's place in its app's line for a turn; dropped, it leaves the line.
pub(crate) type TurnWait = Pin<Box<dyn Future<Output = Option<OwnedSemaphorePermit>> + Send>>;

/// How far past `max_memory` a worker may grow while it waits for its turn.
const OVERSHOOT: (u64, u64) = (3, 2);

impl MemoryTurns {
    pub(crate) fn new() -> Self {
        Self(Arc::new(Semaphore::new(1)))
    }

    /// The app's turn, held until the old process is stopped. Tokio's semaphore is
    /// fair, so the workers get it in the order they asked: a worker whose successor is
    /// over at once cannot keep the others waiting.
    pub(crate) fn wait(&self) -> TurnWait {
        let turns = Arc::clone(&self.0);
        Box::pin(async move { turns.acquire_owned().await.ok() })
    }
}

/// Whether a worker that uses `rss` is too far over `max` to wait for its turn.
pub(crate) fn past_overshoot(rss: u64, max: u64) -> bool {
    let (num, den) = OVERSHOOT;
    u128::from(rss) * u128::from(den) > u128::from(max) * u128::from(num)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether `wait` is still waiting, polled once.
    fn waiting(wait: &mut TurnWait) -> bool {
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        wait.as_mut().poll(&mut cx).is_pending()
    }

    #[tokio::test]
    async fn turns_go_in_the_order_asked() {
        let turns = MemoryTurns::new();
        let first = turns.wait().await.expect("a turn");
        let mut second = turns.wait();
        let mut third = turns.wait();
        assert!(waiting(&mut second));
        assert!(waiting(&mut third));
        drop(first);
        // The third asks again before the second is polled: the second still goes first.
        assert!(waiting(&mut third));
        let second = second.await.expect("a turn");
        assert!(waiting(&mut third));
        drop(second);
        assert!(third.await.is_some());
    }

    #[test]
    fn waits_up_to_one_and_a_half_times_max_memory() {
        const MIB: u64 = 1 << 20;
        assert!(!past_overshoot(150 * MIB, 100 * MIB));
        assert!(past_overshoot(150 * MIB + 1, 100 * MIB));
        assert!(past_overshoot(u64::MAX, u64::MAX / 2));
        assert!(!past_overshoot(u64::MAX, u64::MAX));
    }

    #[test]
    fn reads_vm_rss() {
        let status = "Name:\tnode\nVmPeak:\t  99 kB\nVmRSS:\t   45312 kB\nThreads:\t7\n";
        assert_eq!(parse_vm_rss(status), Some(45312 * 1024));
        assert_eq!(parse_vm_rss("Name:\tkthreadd\n"), None);
        assert_eq!(parse_vm_rss("VmRSS:\tlots kB\n"), None);
    }

    #[test]
    fn own_rss_is_positive() {
        let rss = rss_bytes(std::process::id()).expect("/proc/self/status");
        assert!(rss > 0);
    }
}
