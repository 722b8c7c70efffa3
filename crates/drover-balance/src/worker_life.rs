//! Whether the process behind an endpoint still runs, and how it ended: what decides if
//! a request it dropped (took, then closed on with no answer) may go to another endpoint.
//!
//! A supervisor that runs the process says so (`Endpoint::set_worker_life`); an endpoint
//! nobody supervises (a backend of `drover proxy`) has no life to tell. A request that
//! ends a worker (an uncaught exception, a crash) would end every
//! worker it was retried on: one such request took down all three workers of an app
//! within 30 ms, where Node's cluster module loses the one it was on. So a request a
//! worker dropped goes again only when something outside the worker ended it (`kill -9`,
//! the kernel's OOM killer, drover's memory limit), and fails as under Node cluster when
//! the worker ended by its own doing.

use std::sync::atomic::{AtomicU8, Ordering::Relaxed};

/// How a supervised endpoint's process is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerLife {
    /// It runs (as far as its supervisor has seen).
    Running,
    /// It ended by its own doing: it exited (with any status) or raised a fatal signal
    /// of its own (SIGSEGV, SIGABRT from a failed allocation, ...). A request it dropped
    /// may be what ended it.
    Crashed,
    /// Something outside it ended it: a signal (`kill -9`, the OOM killer), or drover
    /// (it hung, failed its checks, outgrew its memory, or outlasted a drain). What it
    /// dropped goes again, once: a second endpoint that drops a request is its last.
    Killed,
}

/// `WorkerLife` in one atomic; 0 while no supervisor has said anything.
#[derive(Debug, Default)]
pub(crate) struct LifeCell(AtomicU8);

impl LifeCell {
    pub(crate) fn set(&self, life: WorkerLife) {
        let v = match life {
            WorkerLife::Running => 1,
            WorkerLife::Crashed => 2,
            WorkerLife::Killed => 3,
        };
        self.0.store(v, Relaxed);
    }

    pub(crate) fn get(&self) -> Option<WorkerLife> {
        match self.0.load(Relaxed) {
            1 => Some(WorkerLife::Running),
            2 => Some(WorkerLife::Crashed),
            3 => Some(WorkerLife::Killed),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsupervised_until_told() {
        let cell = LifeCell::default();
        assert_eq!(cell.get(), None);
        for life in [WorkerLife::Running, WorkerLife::Crashed, WorkerLife::Killed] {
            cell.set(life);
            assert_eq!(cell.get(), Some(life));
        }
    }
}
