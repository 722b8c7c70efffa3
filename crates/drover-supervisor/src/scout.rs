//! When a worker in back-off starts before its delay ends.
//!
//! The back-off protects the machine from a program that cannot start. While the app
//! has no capacity at all, that protection is the outage: workers that lost their
//! database crash together, back off together, and find the database back only when
//! their delays end, up to the back-off's `max` (30 s by default) after it returned.
//! So while nothing of the app serves or starts, one worker at a time goes early, at
//! most one every `NO_CAPACITY_RETRY` (the app's scout); and once a worker that became
//! ready after another's crash has served `min_uptime`, the app has recovered and the
//! others stop waiting. A worker that crash-loops beside workers that serve keeps its
//! back-off: its crashes are its own.

use crate::status::WorkerState;
use std::time::{Duration, Instant};

/// How often an app with no worker serving or starting tries one.
pub(crate) const NO_CAPACITY_RETRY: Duration = Duration::from_secs(1);

/// How often a worker in back-off looks, once it has waited `NO_CAPACITY_RETRY`.
pub(crate) const LOOK_EVERY: Duration = Duration::from_millis(250);

/// Why a worker in back-off starts now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Early {
    /// A worker ready since this one's crash has served `min_uptime`.
    Recovered,
    /// Nothing of the app serves or starts: this one tries.
    Scout,
}

/// What a worker in back-off sees of one of the app's other workers.
#[derive(Clone, Copy)]
pub(crate) struct Other {
    pub state: WorkerState,
    /// When its current process became ready.
    pub ready_at: Option<Instant>,
}

/// Whether a worker that crashed at `crashed_at` starts now, given the app's other
/// workers and when the app's last scout went (updated when this one is the scout).
pub(crate) fn start_early(
    others: impl Iterator<Item = Other> + Clone,
    crashed_at: Instant,
    min_uptime: Duration,
    last_scout: &mut Option<Instant>,
    now: Instant,
) -> Option<Early> {
    let recovered = others.clone().any(|o| {
        o.state.is_serving()
            && o.ready_at
                .is_some_and(|r| r > crashed_at && now.saturating_duration_since(r) >= min_uptime)
    });
    if recovered {
        return Some(Early::Recovered);
    }
    // Starting, stopping or being replaced: a process is on its way or still serves.
    let none_runs = others.into_iter().all(|o| {
        matches!(
            o.state,
            WorkerState::BackingOff
                | WorkerState::CrashLooping
                | WorkerState::Errored
                | WorkerState::Stopped
        )
    });
    let paced = last_scout.is_none_or(|t| now.saturating_duration_since(t) >= NO_CAPACITY_RETRY);
    if none_runs && paced {
        *last_scout = Some(now);
        return Some(Early::Scout);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn other(state: WorkerState, ready_at: Option<Instant>) -> Other {
        Other { state, ready_at }
    }

    #[test]
    fn one_scout_a_second_while_nothing_runs() {
        let t0 = Instant::now();
        let down = || {
            [
                other(WorkerState::CrashLooping, None),
                other(WorkerState::BackingOff, None),
            ]
            .into_iter()
        };
        let mut last = None;
        let min_uptime = Duration::from_secs(1);
        assert_eq!(
            start_early(down(), t0, min_uptime, &mut last, t0),
            Some(Early::Scout)
        );
        // Another worker of the app, a moment later: the scout went.
        let soon = t0 + Duration::from_millis(500);
        assert_eq!(start_early(down(), t0, min_uptime, &mut last, soon), None);
        let later = t0 + NO_CAPACITY_RETRY;
        assert_eq!(
            start_early(down(), t0, min_uptime, &mut last, later),
            Some(Early::Scout)
        );
        // A single-worker app has no others: it is its own scout.
        let mut alone = None;
        assert_eq!(
            start_early(std::iter::empty(), t0, min_uptime, &mut alone, t0),
            Some(Early::Scout)
        );
    }

    #[test]
    fn no_scout_while_a_worker_starts_or_serves() {
        let t0 = Instant::now();
        let min_uptime = Duration::from_secs(1);
        for state in [
            WorkerState::Starting,
            WorkerState::Ready,
            WorkerState::Busy,
            WorkerState::Unhealthy,
            WorkerState::Hung,
            WorkerState::Stopping,
        ] {
            let mut last = None;
            let others = [other(WorkerState::BackingOff, None), other(state, Some(t0))].into_iter();
            assert_eq!(
                start_early(others, t0, min_uptime, &mut last, t0),
                None,
                "{state:?}"
            );
            assert_eq!(last, None);
        }
    }

    #[test]
    fn recovered_once_a_worker_ready_since_the_crash_served_min_uptime() {
        let t0 = Instant::now();
        let min_uptime = Duration::from_secs(1);
        let crashed_at = t0 + Duration::from_secs(5);
        let ready = |at| [other(WorkerState::Ready, Some(at))].into_iter();
        let mut last = None;
        // Served all along: this worker's crashes are its own.
        let all_along = t0 + Duration::from_secs(60);
        assert_eq!(
            start_early(ready(t0), crashed_at, min_uptime, &mut last, all_along),
            None
        );
        // Ready after the crash, not yet for min_uptime; then for it.
        let back = crashed_at + Duration::from_secs(3);
        assert_eq!(
            start_early(ready(back), crashed_at, min_uptime, &mut last, back),
            None
        );
        let stable = back + min_uptime;
        assert_eq!(
            start_early(ready(back), crashed_at, min_uptime, &mut last, stable),
            Some(Early::Recovered)
        );
        assert_eq!(last, None);
    }
}
