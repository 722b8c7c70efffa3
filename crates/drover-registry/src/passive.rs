//! Passive health: take an endpoint out of rotation from what real requests see.
//!
//! Pure logic over `Endpoint` atomics and caller-supplied time, so tests drive the clock
//! by hand. The proxy reports each outcome; nothing here runs on its own:
//!
//! - a refused or reset connect means nothing listens there, so the endpoint is ejected
//!   at once (`connect_failures`, default 1);
//! - a connect that times out counts like a failed request: a busy backend whose listen
//!   backlog overflowed drops SYNs, so the timeout says it is busy, not that it is gone
//!   (on loopback, where only a full backlog times out, it never ejects);
//! - `consecutive_5xx` failed responses in a row (default 5) eject it too, unless the
//!   other endpoints in rotation fail at least half as often (`fails_like_the_others`);
//! - the ejection lasts `base_ejection * 2^(ejections - 1)`, capped at `max_ejection`;
//! - when it ends the endpoint takes traffic again, slow-starting over `slow_start`;
//! - the back-off exponent is forgiven once the endpoint has served well for as long as
//!   its last ejection lasted (see `on_success`).
//!
//! Ejecting every endpoint is allowed for refused connects (nothing listens there; a
//! clear 503 at once beats a doomed connect attempt, and ejections end by themselves),
//! but not for 5xx: a backend that answers is alive, and when every backend returns 5xx
//! the cause is usually the request or a shared dependency. Ejecting them all would turn
//! a partial outage (one broken route) into a total one, which Envoy guards against with
//! `max_ejection_percent` and nginx by reviving all peers when every one has failed.

use crate::status::StatusRange;
use drover_balance::{clock, Endpoint, EndpointSet, Nanos};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Ejection decisions take this lock so that concurrent failures of one endpoint (many
/// requests fail together when a backend dies) eject it once, not once per request,
/// which would inflate the back-off exponent. Only failures that reach a threshold take
/// it, so the hot path never does.
static EJECT: Mutex<()> = Mutex::new(());

/// When to eject an endpoint and for how long.
#[derive(Debug, Clone, PartialEq)]
pub struct PassivePolicy {
    /// Connect failures in a row that eject (0 disables). Default 1.
    pub connect_failures: u32,
    /// Failed responses in a row that eject (0 disables). Default 5: one 5xx is often the
    /// request's fault; five in a row is the endpoint's.
    pub consecutive_5xx: u32,
    /// Which statuses count as failed responses. Default: every 5xx.
    pub failure_statuses: StatusRange,
    /// First ejection's length. Default 2 s: long enough to stop hammering a dead
    /// process, short enough that a restarted worker is back quickly (Envoy's 30 s is
    /// tuned for fleets, not for local workers that restart in a second).
    pub base_ejection: Duration,
    /// Cap on the doubled ejection. Default 60 s.
    pub max_ejection: Duration,
    /// Slow start after an ejection ends (zero disables). Default off, as the pool's
    /// own `slow_start`: a bare pool ramps nothing. A balancer sets both to its
    /// configured slow start (the config model holds the product's default).
    pub slow_start: Duration,
}

impl Default for PassivePolicy {
    fn default() -> Self {
        PassivePolicy {
            connect_failures: 1,
            consecutive_5xx: 5,
            failure_statuses: StatusRange::SERVER_ERROR,
            base_ejection: Duration::from_secs(2),
            max_ejection: Duration::from_secs(60),
            slow_start: Duration::ZERO,
        }
    }
}

impl PassivePolicy {
    /// Whether `status` counts against the endpoint.
    pub fn is_failure(&self, status: u16) -> bool {
        self.failure_statuses.contains(status)
    }

    /// Length of the `n`th ejection in a row (n >= 1): base doubled n-1 times, capped.
    pub fn ejection_len(&self, n: u32) -> Duration {
        let factor = 1u32.checked_shl(n.saturating_sub(1)).unwrap_or(u32::MAX);
        self.base_ejection
            .saturating_mul(factor)
            .min(self.max_ejection)
    }

    /// A connection to `ep` could not be made. Returns the ejection length when this call
    /// ejected it.
    pub fn on_connect_failure(
        &self,
        set: &EndpointSet,
        ep: &Arc<Endpoint>,
        now: Nanos,
    ) -> Option<Duration> {
        self.fail(set, ep, now, self.connect_failures, Cause::Connect)
    }

    /// A response with `status` came from `ep`. Failed statuses count toward
    /// `consecutive_5xx`; any other status is a success.
    pub fn on_response(
        &self,
        set: &EndpointSet,
        ep: &Arc<Endpoint>,
        status: u16,
        now: Nanos,
    ) -> Option<Duration> {
        if self.is_failure(status) {
            self.fail(set, ep, now, self.consecutive_5xx, Cause::Status(status))
        } else {
            self.on_success(ep, now);
            None
        }
    }

    /// `ep` accepted the request but failed it without a status (reset, EOF before the
    /// response, response timeout). Counts like a 5xx: the process answered the connect,
    /// so it may be alive but overloaded.
    pub fn on_request_failure(
        &self,
        set: &EndpointSet,
        ep: &Arc<Endpoint>,
        now: Nanos,
    ) -> Option<Duration> {
        self.fail(set, ep, now, self.consecutive_5xx, Cause::Request)
    }

    /// A connection to `ep` was not accepted within the connect timeout. A process that
    /// is gone refuses at once; one whose listen backlog overflowed drops the SYN, so a
    /// timeout is a busy endpoint: it counts like a failed request and never ejects the
    /// last available endpoint. On loopback (the workers drover runs) it never ejects at
    /// all: a closed loopback port refuses at once and no network lies between, so there
    /// a timeout can only mean a full backlog, and the supervisor's own checks tell a hung
    /// worker from a busy one.
    pub fn on_connect_timeout(
        &self,
        set: &EndpointSet,
        ep: &Arc<Endpoint>,
        now: Nanos,
    ) -> Option<Duration> {
        if ep.addr().ip().is_loopback() {
            return None;
        }
        self.fail(set, ep, now, self.consecutive_5xx, Cause::ConnectTimeout)
    }

    /// A request on `ep` succeeded: the failure streak ends.
    ///
    /// The back-off exponent (`ejections`) is reset only by a success at least one
    /// ejection-length after the last ejection ended. Resetting it on the first success
    /// after return would let a flapping backend (one good answer, then failures) come
    /// back every `base_ejection` forever; requiring a probation as long as the last
    /// ejection means "it stayed up as long as it was out", needs no extra state (an
    /// ejection in between moves `ejected_until`), and costs the hot path two loads.
    pub fn on_success(&self, ep: &Endpoint, now: Nanos) {
        ep.note_success();
        let n = ep.ejections();
        if n == 0 || !self.probation_over(ep, n, now) {
            return;
        }
        let _lock = EJECT.lock().unwrap_or_else(|e| e.into_inner());
        // Re-check under the lock: a concurrent ejection may have just happened.
        let n = ep.ejections();
        if n != 0 && self.probation_over(ep, n, now) {
            ep.set_ejections(0);
        }
    }

    fn probation_over(&self, ep: &Endpoint, n: u32, now: Nanos) -> bool {
        let probation = clock::nanos(self.ejection_len(n));
        now >= ep.ejected_until().saturating_add(probation)
    }

    fn fail(
        &self,
        set: &EndpointSet,
        ep: &Arc<Endpoint>,
        now: Nanos,
        threshold: u32,
        cause: Cause,
    ) -> Option<Duration> {
        // Requests that were in flight when the endpoint was ejected report their
        // failures late; they say nothing new, so they neither count nor re-eject.
        if now < ep.ejected_until() {
            return None;
        }
        let streak = ep.note_failure();
        if threshold == 0 || streak < threshold {
            return None;
        }
        let _lock = EJECT.lock().unwrap_or_else(|e| e.into_inner());
        if now < ep.ejected_until() {
            return None; // another request ejected it first
        }
        if cause != Cause::Connect && !others_available(set, ep, now) {
            tracing::debug!(
                endpoint = %ep.addr(),
                streak,
                "not ejecting the last available endpoint for {cause}"
            );
            return None;
        }
        if cause != Cause::Connect && fails_like_the_others(set, ep, now) {
            tracing::debug!(
                endpoint = %ep.addr(),
                streak,
                share = ep.failure_share(),
                "not ejecting for {cause}: the other endpoints fail as often (a shared cause)"
            );
            return None;
        }
        let n = ep.ejections().saturating_add(1);
        let len = self.ejection_len(n);
        let until = now.saturating_add(clock::nanos(len));
        ep.set_ejections(n);
        ep.eject_until(until);
        // The streak that led here is spent; on return it must fail anew to go again.
        ep.end_streak();
        if !self.slow_start.is_zero() {
            // Ramp from the moment it returns, so no timer is needed to start it.
            ep.start_ramp(until, clock::nanos(self.slow_start));
        }
        tracing::warn!(
            endpoint = %ep.addr(),
            ejections = n,
            "endpoint ejected for {len:?} after {streak} {cause} in a row"
        );
        Some(len)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cause {
    Connect,
    ConnectTimeout,
    Status(u16),
    Request,
}

impl std::fmt::Display for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Cause::Connect => f.write_str("connect failure(s)"),
            Cause::ConnectTimeout => f.write_str("connect timeout(s)"),
            Cause::Status(s) => write!(f, "failed response(s), last status {s}"),
            Cause::Request => f.write_str("failed request(s)"),
        }
    }
}

/// Whether the endpoints in rotation besides `ep` fail at least half as often as it
/// does: then its failures are not its own. One route that answers 500 on every backend
/// (an app's bug, a table missing), retried by its clients, put five in a row on each
/// backend in turn: two of three were ejected, and the last took 86 of 90 requests of
/// every other route, where nginx and HAProxy (which eject on no status by default)
/// spread them evenly. A backend whose database is gone fails where the others answer:
/// it is still ejected.
fn fails_like_the_others(set: &EndpointSet, ep: &Arc<Endpoint>, now: Nanos) -> bool {
    let (sum, n) = set
        .endpoints()
        .iter()
        .filter(|e| !Arc::ptr_eq(e, ep) && e.is_available(now))
        .fold((0.0, 0u32), |(sum, n), e| (sum + e.failure_share(), n + 1));
    n > 0 && sum / f64::from(n) * 2.0 >= ep.failure_share()
}

/// Whether any endpoint but `ep` could take traffic at `now`.
fn others_available(set: &EndpointSet, ep: &Arc<Endpoint>, now: Nanos) -> bool {
    set.endpoints()
        .iter()
        .any(|e| !Arc::ptr_eq(e, ep) && e.is_available(now))
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Nanos = 1_000_000_000;

    fn set(n: u16) -> EndpointSet {
        EndpointSet::new(
            (0..n)
                .map(|i| Arc::new(Endpoint::new(([127, 0, 0, 1], 9000 + i).into())))
                .collect(),
        )
    }

    fn policy() -> PassivePolicy {
        PassivePolicy {
            base_ejection: Duration::from_secs(1),
            max_ejection: Duration::from_secs(5),
            slow_start: Duration::ZERO,
            ..PassivePolicy::default()
        }
    }

    #[test]
    fn connect_failure_ejects_at_once() {
        let s = set(2);
        let ep = &s.endpoints()[0];
        let p = policy();
        assert_eq!(
            p.on_connect_failure(&s, ep, 10 * S),
            Some(Duration::from_secs(1))
        );
        assert!(!ep.is_available(10 * S));
        assert!(ep.is_available(11 * S));
        assert_eq!(ep.ejections(), 1);
        assert_eq!(ep.fail_streak(), 0);
    }

    #[test]
    fn late_failures_while_ejected_do_not_count() {
        let s = set(2);
        let ep = &s.endpoints()[0];
        let p = policy();
        assert!(p.on_connect_failure(&s, ep, 10 * S).is_some());
        // Ten requests that were in flight fail after the ejection.
        for _ in 0..10 {
            assert_eq!(p.on_connect_failure(&s, ep, 10 * S + 1), None);
        }
        assert_eq!(ep.ejections(), 1);
        assert_eq!(ep.ejected_until(), 11 * S);
    }

    #[test]
    fn back_off_doubles_and_caps() {
        let s = set(2);
        let ep = &s.endpoints()[0];
        let p = policy();
        let mut now = 10 * S;
        let mut lens = Vec::new();
        for _ in 0..6 {
            let len = p.on_connect_failure(&s, ep, now).unwrap();
            lens.push(len.as_secs());
            // Returns, and fails again at once.
            now = ep.ejected_until();
        }
        assert_eq!(lens, [1, 2, 4, 5, 5, 5]);
        assert_eq!(p.ejection_len(u32::MAX), Duration::from_secs(5));
    }

    #[test]
    fn five_5xx_in_a_row_eject_and_a_success_breaks_the_streak() {
        let s = set(2);
        let ep = &s.endpoints()[0];
        let p = policy();
        for _ in 0..4 {
            assert_eq!(p.on_response(&s, ep, 503, S), None);
        }
        assert_eq!(p.on_response(&s, ep, 200, S), None);
        assert_eq!(ep.fail_streak(), 0);
        for _ in 0..4 {
            assert_eq!(p.on_response(&s, ep, 500, S), None);
        }
        assert_eq!(p.on_response(&s, ep, 404, S), None, "4xx is a success");
        for _ in 0..4 {
            assert_eq!(p.on_response(&s, ep, 502, S), None);
        }
        assert!(ep.is_available(S));
        assert_eq!(
            p.on_request_failure(&s, ep, S),
            Some(Duration::from_secs(1))
        );
        assert!(!ep.is_available(S));
    }

    #[test]
    fn failures_every_endpoint_shares_eject_none_and_one_endpoints_own_still_do() {
        // One route answers 500 everywhere, its requests spread over the endpoints and
        // interleaved with successes of other routes: streaks of five and more on each,
        // but the others fail as often.
        let s = set(3);
        let p = policy();
        let eps = s.endpoints();
        for round in 0..40 {
            for _ in 0..5 + round % 3 {
                for ep in eps.iter() {
                    assert_eq!(p.on_response(&s, ep, 500, round * S), None);
                }
            }
            for ep in eps.iter() {
                assert_eq!(p.on_response(&s, ep, 200, round * S), None);
            }
        }
        assert!(eps.iter().all(|e| e.ejections() == 0));
        // Then one endpoint fails everything while the others answer: its own.
        let t = 100 * S;
        for _ in 0..20 {
            assert_eq!(p.on_response(&s, &eps[1], 200, t), None);
            assert_eq!(p.on_response(&s, &eps[2], 200, t), None);
        }
        let ejected = (0..5).find_map(|_| p.on_response(&s, &eps[0], 500, t));
        assert_eq!(ejected, Some(Duration::from_secs(1)));
        // And one that fails far more often than the others, which fail now and then.
        let s = set(3);
        let eps = s.endpoints();
        for _ in 0..20 {
            for ep in &eps[1..] {
                assert_eq!(p.on_response(&s, ep, 500, S), None);
                for _ in 0..4 {
                    assert_eq!(p.on_response(&s, ep, 200, S), None);
                }
            }
        }
        let ejected = (0..5).find_map(|_| p.on_response(&s, &eps[0], 503, S));
        assert!(ejected.is_some(), "share {}", eps[0].failure_share());
    }

    #[test]
    fn failure_statuses_are_configurable() {
        let s = set(2);
        let ep = &s.endpoints()[0];
        let p = PassivePolicy {
            consecutive_5xx: 1,
            failure_statuses: StatusRange::new(502, 504),
            ..policy()
        };
        assert_eq!(p.on_response(&s, ep, 500, S), None);
        assert!(p.on_response(&s, ep, 503, S).is_some());
    }

    #[test]
    fn the_last_available_endpoint_is_not_ejected_for_5xx() {
        let s = set(2);
        let [a, b] = s.endpoints() else { panic!() };
        let p = PassivePolicy {
            consecutive_5xx: 1,
            ..policy()
        };
        assert!(p.on_response(&s, a, 500, S).is_some());
        // b is the only one left: 5xx keep it in rotation...
        assert_eq!(p.on_response(&s, b, 500, S), None);
        assert_eq!(p.on_response(&s, b, 500, S), None);
        assert!(b.is_available(S));
        // ...but a refused connect ejects it: nothing listens there.
        assert!(p.on_connect_failure(&s, b, S).is_some());
        assert!(!b.is_available(S));
    }

    /// Endpoints on another machine, where a connect timeout may mean a dead host.
    fn remote_set(n: u8) -> EndpointSet {
        EndpointSet::new(
            (0..n)
                .map(|i| Arc::new(Endpoint::new(([10, 0, 0, 1 + i], 9000).into())))
                .collect(),
        )
    }

    #[test]
    fn a_connect_timeout_on_loopback_never_ejects() {
        let s = set(2);
        let p = PassivePolicy {
            consecutive_5xx: 2,
            ..policy()
        };
        for _ in 0..10 {
            assert_eq!(p.on_connect_timeout(&s, &s.endpoints()[0], S), None);
        }
        assert!(s.endpoints()[0].is_available(S));
    }

    #[test]
    fn a_connect_timeout_never_ejects_the_last_available_endpoint() {
        let s = remote_set(2);
        let [a, b] = s.endpoints() else { panic!() };
        let p = PassivePolicy {
            consecutive_5xx: 2,
            ..policy()
        };
        // Timeouts count like failed requests: one is not enough...
        assert_eq!(p.on_connect_timeout(&s, a, S), None);
        assert!(a.is_available(S));
        // ...a streak ejects while another endpoint is available...
        assert!(p.on_connect_timeout(&s, a, S).is_some());
        assert!(!a.is_available(S));
        // ...but the last one stays: its backlog overflowed, it is busy, not gone.
        for _ in 0..10 {
            assert_eq!(p.on_connect_timeout(&s, b, S), None);
        }
        assert!(b.is_available(S));
        let single = remote_set(1);
        for _ in 0..10 {
            assert_eq!(
                p.on_connect_timeout(&single, &single.endpoints()[0], S),
                None
            );
        }
        assert!(single.endpoints()[0].is_available(S));
    }

    #[test]
    fn a_single_endpoint_pool_may_be_ejected_on_connect_failure() {
        let s = set(1);
        let ep = &s.endpoints()[0];
        assert!(policy().on_connect_failure(&s, ep, S).is_some());
        assert!(!ep.is_available(S));
    }

    #[test]
    fn back_off_is_forgiven_after_a_probation_as_long_as_the_ejection() {
        let s = set(2);
        let ep = &s.endpoints()[0];
        let p = policy();
        p.on_connect_failure(&s, ep, 10 * S); // out until 11 s
        p.on_connect_failure(&s, ep, 11 * S); // 2nd: 2 s, until 13 s
        assert_eq!(ep.ejections(), 2);
        // Back at 13 s; a success during probation does not forgive.
        p.on_success(ep, 14 * S);
        assert_eq!(ep.ejections(), 2);
        // Fails again within probation: the back-off keeps doubling.
        assert_eq!(
            p.on_connect_failure(&s, ep, 14 * S),
            Some(Duration::from_secs(4))
        );
        // Out until 18 s; probation 4 s more; at 22 s it is forgiven.
        p.on_success(ep, 21 * S);
        assert_eq!(ep.ejections(), 3);
        p.on_success(ep, 22 * S);
        assert_eq!(ep.ejections(), 0);
        assert_eq!(
            p.on_connect_failure(&s, ep, 23 * S),
            Some(Duration::from_secs(1))
        );
    }

    #[test]
    fn slow_start_begins_when_the_ejection_ends() {
        let s = set(2);
        let ep = &s.endpoints()[0];
        let p = PassivePolicy {
            slow_start: Duration::from_secs(10),
            ..policy()
        };
        p.on_connect_failure(&s, ep, 10 * S); // back at 11 s
        assert!(ep.ramp(11 * S) < 0.2);
        assert!((ep.ramp(16 * S) - 0.5).abs() < 1e-9);
        assert_eq!(ep.ramp(21 * S), 1.0);
    }

    #[test]
    fn zero_threshold_disables() {
        let s = set(2);
        let ep = &s.endpoints()[0];
        let p = PassivePolicy {
            connect_failures: 0,
            consecutive_5xx: 0,
            ..policy()
        };
        for _ in 0..10 {
            assert_eq!(p.on_connect_failure(&s, ep, S), None);
            assert_eq!(p.on_response(&s, ep, 500, S), None);
        }
        assert!(ep.is_available(S));
    }

    #[test]
    fn concurrent_failures_eject_once() {
        let s = Arc::new(set(2));
        let p = Arc::new(policy());
        let ejected: usize = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..8)
                .map(|_| {
                    let (s, p) = (Arc::clone(&s), Arc::clone(&p));
                    scope.spawn(move || {
                        (0..100)
                            .filter(|_| p.on_connect_failure(&s, &s.endpoints()[0], S).is_some())
                            .count()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).sum()
        });
        assert_eq!(ejected, 1);
        assert_eq!(s.endpoints()[0].ejections(), 1);
    }
}
