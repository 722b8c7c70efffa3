//! Busy or hung: what a failed probe means, given what real requests saw meanwhile.
//!
//! A probe is one more request, and it waits behind the work the endpoint already
//! holds. A single-threaded server (a Node worker, a Python one) answers its health
//! route only when its event loop gets to it: under a burst of CPU-bound requests the
//! probe waits behind seconds of queued work and times out while the worker completes
//! request after request. Counted as failures, such timeouts restarted (or took out of
//! rotation) every worker of an app at once, on the first burst, the way Kubernetes
//! liveness probes are infamous for. So a probe that got no answer counts against the
//! endpoint only when no request to it completed since the previous probe: an endpoint
//! that keeps answering requests is busy, not hung.
//!
//! A bad answer still counts: a status the check does not expect means the process
//! answered and said it is not well, and a refused connect means nothing listens.

use crate::probe::ProbeError;

/// What one probe says, once the endpoint's progress is taken into account.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The probe passed.
    Passed,
    /// The probe got no answer, but requests to the endpoint completed meanwhile.
    Busy,
    /// The probe failed and nothing shows the endpoint is alive.
    Failed,
}

/// Follows an endpoint's completed responses, and drover's own requests waiting on it,
/// from one probe to the next.
#[derive(Debug, Clone, Copy)]
pub struct Progress {
    seen: u64,
    waited: bool,
}

/// What an endpoint's requests did between two probes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interval {
    /// A request to it completed.
    pub advanced: bool,
    /// Requests of drover's waited on it through the whole interval (some were pending
    /// at both looks) and none completed: drover's own evidence of a hang, which no load
    /// elsewhere explains away.
    pub stuck: bool,
}

impl Progress {
    /// Starts from `completed`, the endpoint's count of responses now.
    pub fn new(completed: u64) -> Progress {
        Progress {
            seen: completed,
            waited: false,
        }
    }

    /// Whether the count grew since the last look (or `new`); remembers `completed`, for
    /// a caller that does not follow pending requests (the supervisor's checks).
    pub fn advanced(&mut self, completed: u64) -> bool {
        self.look(completed, 0).advanced
    }

    /// What happened since the last look (or `new`), given the endpoint's count of
    /// responses and its requests pending now; remembers both.
    pub fn look(&mut self, completed: u64, pending: u32) -> Interval {
        let advanced = completed > self.seen;
        let stuck = !advanced && self.waited && pending > 0;
        self.seen = completed;
        self.waited = pending > 0;
        Interval { advanced, stuck }
    }
}

impl ProbeError {
    /// Whether the endpoint gave no answer at all: the probe timed out or its
    /// connection broke. (A refused connect is an answer: nothing listens there.)
    pub fn is_no_answer(&self) -> bool {
        match self {
            ProbeError::Timeout(_) | ProbeError::Io(_) | ProbeError::Closed => true,
            ProbeError::Connect(_) => true,
            ProbeError::Refused
            | ProbeError::LocalShortage(_)
            | ProbeError::Malformed
            | ProbeError::Status(_)
            | ProbeError::Unexpected(_)
            | ProbeError::Grpc(_) => false,
            // A certificate that does not verify is an answer; a handshake that stalls
            // is bounded by the probe's own timeout, which comes first.
            ProbeError::Tls(_) => false,
        }
    }
}

/// Judges a probe's `result`; `advanced` says whether requests to the endpoint
/// completed since the previous probe.
pub fn judge(result: &Result<(), ProbeError>, advanced: bool) -> Outcome {
    match result {
        Ok(()) => Outcome::Passed,
        Err(e) if advanced && e.is_no_answer() => Outcome::Busy,
        Err(_) => Outcome::Failed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn no_answer_while_requests_complete_is_busy() {
        let timeout = Err(ProbeError::Timeout(Duration::from_secs(1)));
        assert_eq!(judge(&timeout, true), Outcome::Busy);
        assert_eq!(judge(&timeout, false), Outcome::Failed);
        assert_eq!(judge(&Err(ProbeError::Closed), true), Outcome::Busy);
        assert_eq!(judge(&Ok(()), false), Outcome::Passed);
    }

    #[test]
    fn a_bad_answer_counts_whatever_else_completes() {
        assert_eq!(judge(&Err(ProbeError::Status(503)), true), Outcome::Failed);
        assert_eq!(judge(&Err(ProbeError::Refused), true), Outcome::Failed);
        assert_eq!(judge(&Err(ProbeError::Malformed), true), Outcome::Failed);
    }

    #[test]
    fn progress_is_growth_since_the_last_look() {
        let mut p = Progress::new(10);
        assert!(!p.look(10, 0).advanced);
        assert!(p.look(11, 0).advanced);
        assert!(!p.look(11, 0).advanced);
        // A smaller count (a new endpoint at a reused address) is no progress.
        assert!(!p.look(3, 0).advanced);
        assert!(p.look(4, 0).advanced);
    }

    #[test]
    fn stuck_is_pending_through_a_whole_interval_with_nothing_done() {
        let mut p = Progress::new(0);
        // Pending now, but not at the last look: they may have just been sent.
        assert!(!p.look(0, 3).stuck);
        // Pending at both looks, nothing completed: stuck.
        assert!(p.look(0, 1).stuck);
        // Something completed: not stuck, whatever is pending.
        assert!(!p.look(1, 5).stuck);
        // Nothing pending now: not stuck.
        assert!(!p.look(1, 0).stuck);
        assert!(!p.look(1, 2).stuck);
    }
}
