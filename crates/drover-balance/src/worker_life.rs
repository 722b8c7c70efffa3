//! Whether the process behind an endpoint still runs, and how it ended: what decides if
//! a request it dropped (took, then closed on with no answer) may go to another endpoint.
//!
//! A supervisor that runs the process says so (`Endpoint::set_worker_life`); an endpoint
//! nobody supervises (a backend of `drover proxy`) has no life to tell. A request that
//! ends a worker (an uncaught exception, a crash) would end every
//! worker it was retried on: one such request took down all three workers of an app
//! within 30 ms, where Node's cluster module loses the one it was on. So a request a
//! worker dropped goes again only when no error of the worker's ended it: something
//! outside (`kill -9`, the kernel's OOM killer, drover's memory limit), or the worker's
//! own plan (an exit with status 0), and fails as under Node cluster when the worker
//! failed by its own doing.
//!
//! A worker drover kills as hung (spinning or deadlocked, nothing completed) was most
//! likely hung by the request it had held longest: the ones that came after waited
//! behind it and did nothing. Retried, that request hung the next worker too (one GET
//! that loops for ever under Bun took both workers of an app, one after the other). So
//! the requests it held say when each was sent (`OldestHeld`): the oldest fails, the
//! others go again.

use crate::clock::Nanos;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering::Relaxed};

/// How a supervised endpoint's process is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerLife {
    /// It runs (as far as its supervisor has seen).
    Running,
    /// It ended by an error of its own: it exited with a status other than 0, or raised
    /// a fatal signal of its own (SIGSEGV, SIGABRT from a failed allocation, ...). A
    /// request it dropped may be what ended it.
    Crashed,
    /// It ended by no error of its own: a signal from outside (`kill -9`, the OOM
    /// killer), drover (it hung, failed its checks, outgrew its memory, or outlasted a
    /// drain), or an exit with status 0, as planned: an app that recycles itself
    /// (`process.exit(0)` after N requests or at a memory mark) ends with the requests
    /// of others in it, and under Node cluster each of them failed. What it dropped goes
    /// again, once: a second endpoint that drops a request is its last, so a request
    /// that itself exits with 0 (a `/quit` route) ends one more worker, not all of them.
    Ended,
    /// drover killed it as hung while it ran: it spun or waited on itself with no
    /// answer and nothing completed (not stopped from outside: a SIGSTOP is nobody's
    /// request's doing). What it dropped goes again as after `Ended`, but for the
    /// request it held longest (`OldestHeld`), which most likely hung it.
    Hung,
}

/// `WorkerLife` in one atomic; 0 while no supervisor has said anything.
#[derive(Debug, Default)]
pub(crate) struct LifeCell(AtomicU8);

impl LifeCell {
    pub(crate) fn set(&self, life: WorkerLife) {
        let v = match life {
            WorkerLife::Running => 1,
            WorkerLife::Crashed => 2,
            WorkerLife::Ended => 3,
            WorkerLife::Hung => 4,
        };
        self.0.store(v, Relaxed);
    }

    pub(crate) fn get(&self) -> Option<WorkerLife> {
        match self.0.load(Relaxed) {
            1 => Some(WorkerLife::Running),
            2 => Some(WorkerLife::Crashed),
            3 => Some(WorkerLife::Ended),
            4 => Some(WorkerLife::Hung),
            _ => None,
        }
    }
}

/// Of the requests a hung worker held when it was killed, when the first was sent: each
/// offers its own time as its connection closes, and the one whose time stays the
/// least is the one the worker hung on.
#[derive(Debug)]
pub(crate) struct OldestHeld(AtomicU64);

impl Default for OldestHeld {
    fn default() -> Self {
        OldestHeld(AtomicU64::new(Nanos::MAX))
    }
}

impl OldestHeld {
    pub(crate) fn offer(&self, sent: Nanos) {
        self.0.fetch_min(sent, Relaxed);
    }

    /// Whether the request sent at `sent` is the oldest offered so far.
    pub(crate) fn is(&self, sent: Nanos) -> bool {
        self.0.load(Relaxed) == sent
    }

    /// A new process: nothing it holds hung it.
    pub(crate) fn clear(&self) {
        self.0.store(Nanos::MAX, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsupervised_until_told() {
        let cell = LifeCell::default();
        assert_eq!(cell.get(), None);
        for life in [
            WorkerLife::Running,
            WorkerLife::Crashed,
            WorkerLife::Ended,
            WorkerLife::Hung,
        ] {
            cell.set(life);
            assert_eq!(cell.get(), Some(life));
        }
    }

    #[test]
    fn the_oldest_request_offered_is_the_one_hung_on() {
        let held = OldestHeld::default();
        assert!(!held.is(5));
        for sent in [7, 5, 9] {
            held.offer(sent);
        }
        assert!(held.is(5));
        assert!(!held.is(7) && !held.is(9));
        held.clear();
        assert!(!held.is(5));
    }
}
