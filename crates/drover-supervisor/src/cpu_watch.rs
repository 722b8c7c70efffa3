//! When drover reads a serving worker's CPU: 40 times a second while the app works,
//! once a second while it idles.
//!
//! The fast reads let the balancer see a burst saturate a worker within a few dozen of
//! its requests (`CPU_POLL`). An idle app needs none of them, yet they woke drover 40
//! times a second, idle or not (66 context switches a second and 0.4 % of a core for
//! `drover run -w 2` doing nothing, where Node cluster's primary made none and PM2's
//! daemon 5). So a worker whose readings stay quiet for `QUIET_READS` with no request
//! pending is read only on the memory poll's tick, and the first request the app gets
//! after that (`WorkArrives`) brings every worker's fast reads back at once.
//!
//! Coming back does not read sooner than before: the first fast reading spans the time
//! since the last slow one, so it is diluted as the first window of a burst always was
//! (it began somewhere inside a 25 ms window), and saturation shows at the second, as
//! it did. A wake-up lost to a race costs at most one slow tick: the slow read also
//! comes back on a pending request or a busy reading.

use crate::cpu::CpuMeter;
use drover_balance::{Endpoint, WorkArrives};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::{Instant, Interval, MissedTickBehavior};

/// How often a working worker's CPU use is read and passed to its endpoint as its load
/// (see `cpu`): often enough that a burst of CPU-bound work is seen within a few dozen of
/// its requests, rarely enough to cost nothing (one `pread` of a `/proc` file kept open,
/// well under 0.1 % of a core per worker). At 100 ms, a burst's first quarter second
/// went out before any worker read saturated, each request on a connection of its own,
/// and a sweep sample of 7 workers on 2 cores read p99 392-500 ms where the peers read
/// 211-266 ms; at 25 ms, 179-211 ms (`bench/sweep.sh --only 6`, bench/README.md).
/// `schedstat` counts nanoseconds, so a 25 ms window is exact; only the fallback to
/// `stat`'s 10 ms ticks is coarse at this length.
pub(crate) const CPU_POLL: Duration = Duration::from_millis(25);

/// A reading below this share of a core is quiet: an idle Node worker's timers and
/// garbage collector read about 0.1 %.
const QUIET_BUSY: f64 = 0.05;

/// Fast readings in a row that must be quiet, with nothing pending, before a worker is
/// read only slowly: one second of them.
const QUIET_READS: u32 = 40;

/// The next instant on a grid of `period` that every worker of the process shares, so
/// that reads of all workers come due together on one timer wake-up instead of one each
/// (workers start a few ms apart). Grids of periods that divide each other line up.
pub(crate) fn on_shared_grid(period: Duration) -> Instant {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let epoch = *EPOCH.get_or_init(Instant::now);
    let period_ns = period.as_nanos().max(1);
    let since_ns = epoch.elapsed().as_nanos();
    let next_ns = (since_ns / period_ns + 1) * period_ns;
    epoch + Duration::from_nanos(u64::try_from(next_ns).unwrap_or(u64::MAX))
}

/// An interval on the shared grid. Skip, not Delay: a late tick does not move the next
/// ones off the grid.
pub(crate) fn grid_interval(period: Duration) -> Interval {
    let mut interval = tokio::time::interval_at(on_shared_grid(period), period);
    interval.set_missed_tick_behavior(MissedTickBehavior::Skip);
    interval
}

/// One app's wake-up for its workers' slow reads: told by each of its endpoints when
/// work arrives after none.
#[derive(Debug, Default)]
pub(crate) struct CpuWake {
    /// Workers read slowly now; while none is, an arrival costs one load.
    slow: AtomicUsize,
    notify: Notify,
}

impl CpuWake {
    /// Resolves when work arrives at the app while some of its workers are read slowly.
    pub(crate) fn notified(&self) -> tokio::sync::futures::Notified<'_> {
        self.notify.notified()
    }
}

impl WorkArrives for CpuWake {
    fn work_arrived(&self) {
        if self.slow.load(Ordering::Relaxed) > 0 {
            self.notify.notify_waiters();
        }
    }
}

/// One serving worker's CPU reads.
#[derive(Debug)]
pub(crate) struct CpuWatch {
    meter: CpuMeter,
    /// The fast reads; `None` while the worker is read slowly.
    fast: Option<Interval>,
    quiet_reads: u32,
    wake: Arc<CpuWake>,
}

impl CpuWatch {
    pub(crate) fn new(wake: Arc<CpuWake>) -> CpuWatch {
        CpuWatch {
            meter: CpuMeter::default(),
            fast: Some(grid_interval(CPU_POLL)),
            quiet_reads: 0,
            wake,
        }
    }

    pub(crate) fn is_slow(&self) -> bool {
        self.fast.is_none()
    }

    /// The next fast read is due; never, while the worker is read slowly.
    pub(crate) async fn fast_read_due(&mut self) {
        match &mut self.fast {
            Some(interval) => {
                interval.tick().await;
            }
            None => std::future::pending().await,
        }
    }

    /// A fast read: reports the worker's load to its endpoint, and goes slow once the
    /// worker has been quiet long enough.
    pub(crate) fn read_fast(&mut self, pid: u32, endpoint: Option<&Endpoint>) {
        let busy = self.read(pid, endpoint);
        let quiet = busy.is_some_and(|busy| busy < QUIET_BUSY)
            && endpoint.is_some_and(|ep| ep.pending() == 0);
        self.quiet_reads = if quiet { self.quiet_reads + 1 } else { 0 };
        if self.quiet_reads >= QUIET_READS {
            self.go_slow();
        }
    }

    /// A slow read (the memory poll's tick), only while reads are slow: reports the
    /// load, and goes fast again if the worker works or has a request pending, which a
    /// wake-up lost to a race, or requests on connections handed to it, leave unheard.
    pub(crate) fn read_slow(&mut self, pid: u32, endpoint: Option<&Endpoint>) {
        if !self.is_slow() {
            return;
        }
        let busy = self.read(pid, endpoint);
        if busy.is_some_and(|busy| busy >= QUIET_BUSY)
            || endpoint.is_some_and(|ep| ep.pending() > 0)
        {
            self.go_fast();
        }
    }

    pub(crate) fn go_fast(&mut self) {
        if self.fast.is_none() {
            self.wake.slow.fetch_sub(1, Ordering::Relaxed);
            self.fast = Some(grid_interval(CPU_POLL));
        }
        self.quiet_reads = 0;
    }

    fn go_slow(&mut self) {
        if self.fast.take().is_some() {
            self.wake.slow.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn read(&mut self, pid: u32, endpoint: Option<&Endpoint>) -> Option<f64> {
        let busy = self.meter.sample(pid)?;
        if let Some(ep) = endpoint {
            ep.report_load(drover_balance::clock::now(), busy.min(1.0));
        }
        Some(busy)
    }
}

impl Drop for CpuWatch {
    fn drop(&mut self) {
        if self.is_slow() {
            self.wake.slow.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn slow_count(wake: &CpuWake) -> usize {
        wake.slow.load(Ordering::Relaxed)
    }

    /// Reads fast until the watch goes slow; how many reads that took.
    fn read_until_slow(watch: &mut CpuWatch, pid: u32, ep: &Endpoint) -> u32 {
        let mut reads = 0;
        while !watch.is_slow() && reads < 10 * QUIET_READS {
            std::thread::sleep(Duration::from_millis(1));
            watch.read_fast(pid, Some(ep));
            reads += 1;
        }
        reads
    }

    #[tokio::test]
    async fn an_idle_worker_is_read_slowly_until_work_arrives() {
        let mut idle = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = idle.id();
        let ep = Endpoint::new("127.0.0.1:9".parse().unwrap());
        let wake = Arc::new(CpuWake::default());
        ep.watch_work(Arc::clone(&wake) as Arc<dyn WorkArrives>);
        let mut watch = CpuWatch::new(Arc::clone(&wake));
        // The first read has no window, so it is not quiet; then QUIET_READS of them
        // (more while the process is still starting).
        let reads = read_until_slow(&mut watch, pid, &ep);
        assert!(watch.is_slow(), "never quiet in {reads} reads");
        assert!(reads > QUIET_READS, "slow after {reads} reads");
        assert_eq!(slow_count(&wake), 1);

        // A request made pending wakes whoever waits on the app's wake-up.
        let woken = wake.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        ep.note_handed_connection();
        tokio::time::timeout(Duration::from_secs(5), woken)
            .await
            .expect("woken by the work");
        watch.go_fast();
        assert!(!watch.is_slow());
        assert_eq!(slow_count(&wake), 0);

        // A worker that works is never read slowly; one read slowly that starts to work
        // (on connections handed to it, say, which drover does not see) is read fast
        // again at its next slow read. Stopped, a spinning process reads as idle.
        let mut spin = std::process::Command::new("sh")
            .args(["-c", "while :; do :; done"])
            .spawn()
            .unwrap();
        let mut busy = CpuWatch::new(Arc::clone(&wake));
        for _ in 0..2 * QUIET_READS {
            std::thread::sleep(Duration::from_millis(2));
            busy.read_fast(spin.id(), Some(&ep));
        }
        assert!(!busy.is_slow());
        let signal = |name: &str| {
            let sent = std::process::Command::new("kill")
                .args([name, &spin.id().to_string()])
                .status()
                .unwrap();
            assert!(sent.success(), "kill {name}");
        };
        signal("-STOP");
        std::thread::sleep(Duration::from_millis(20));
        read_until_slow(&mut busy, spin.id(), &ep);
        assert!(busy.is_slow(), "stopped, it idles");
        busy.read_slow(spin.id(), Some(&ep));
        assert!(busy.is_slow(), "still idle");
        signal("-CONT");
        std::thread::sleep(Duration::from_millis(50));
        busy.read_slow(spin.id(), Some(&ep));
        assert!(!busy.is_slow(), "working again: read fast");
        spin.kill().unwrap();
        spin.wait().unwrap();

        // Dropped while slow, a watch no longer counts.
        read_until_slow(&mut watch, pid, &ep);
        assert_eq!(slow_count(&wake), 1);
        drop(watch);
        assert_eq!(slow_count(&wake), 0);
        idle.kill().unwrap();
        idle.wait().unwrap();
    }
}
