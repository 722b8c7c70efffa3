//! Active health checks: probe every endpoint of a pool on a timer, except the workers
//! drover supervises (`Source::Supervisor`). Their supervisor checks them itself and
//! restarts a hung one; a probe from here could take a worker that is only busy out of
//! rotation, and nothing here would restart it.
//!
//! Probes run concurrently each round, each bounded by `timeout`. An endpoint goes down
//! after `fall` failed probes in a row and comes back after `rise` passing ones, slow
//! starting over the pool's `slow_start`. Streak counters live here, keyed by address,
//! not on `Endpoint`: only the checker reads them, so the hot path never pays for them.
//!
//! Endpoints start healthy (unless the pool says `initially_unhealthy`), so a fresh
//! balancer serves at once and a dead endpoint is caught by the first failed connect
//! (passive ejection) long before `fall` rounds have passed.
//!
//! A probe that got no answer while requests to the endpoint completed is neither a
//! pass nor a failure (`liveness`): a backend busy with a burst is not down. Probes that
//! get no answer take down at most half the endpoints (`NoAnswerBudget`), and none when
//! every endpoint up times out in the same round (`is_common_timeout`): drover cannot
//! see load others put on a backend, and a slow answer is not a refusal.
//!
//! Active and passive health are independent: a passing check does not end a passive
//! ejection early, and an ejection does not mark the endpoint down.

use crate::liveness::{self, Interval, Outcome, Progress};
use crate::pool::{Pool, Source};
pub use crate::probe::{
    probe, probe_sending, probe_with, CheckKind, ProbeError, ProbeStream, Prober, Probing,
    WrapFuture, WrapProbe,
};
use drover_balance::{clock, Endpoint};
use std::collections::HashMap;
use std::fmt;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::MissedTickBehavior;

/// An active health check. Defaults follow nginx plus and HAProxy: every 2 s, 1 s
/// timeout, 2 passes to rise, 3 failures to fall.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthCheck {
    /// What a probe does.
    pub kind: CheckKind,
    /// Time between probes of one endpoint; default 2s.
    pub interval: Duration,
    /// How long one probe may take before it counts as failed; default 1s.
    pub timeout: Duration,
    /// Consecutive passes that mark an endpoint healthy; default 2.
    pub rise: u32,
    /// Consecutive failures that mark an endpoint unhealthy; default 3.
    pub fall: u32,
}

impl Default for HealthCheck {
    fn default() -> Self {
        HealthCheck {
            kind: CheckKind::Tcp,
            interval: Duration::from_secs(2),
            timeout: Duration::from_secs(1),
            rise: 2,
            fall: 3,
        }
    }
}

impl HealthCheck {
    /// An HTTP check of `path` with default timing.
    pub fn http(path: impl Into<String>) -> Self {
        HealthCheck {
            kind: CheckKind::http(path),
            ..HealthCheck::default()
        }
    }

    /// Rejects settings that cannot work, naming the field, for the config layer.
    pub fn validate(&self) -> Result<(), HealthCheckError> {
        if self.interval.is_zero() {
            return Err(HealthCheckError::ZeroInterval);
        }
        if self.timeout.is_zero() {
            return Err(HealthCheckError::ZeroTimeout);
        }
        if self.rise == 0 || self.fall == 0 {
            return Err(HealthCheckError::ZeroRiseOrFall);
        }
        if let CheckKind::Http { path, .. } = &self.kind {
            if !path.starts_with('/') || path.bytes().any(|b| b <= b' ' || b == 0x7f) {
                return Err(HealthCheckError::BadPath { path: path.clone() });
            }
        }
        Ok(())
    }
}

/// Why a `HealthCheck` cannot work; its `Display` names the field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HealthCheckError {
    /// `interval` is zero.
    ZeroInterval,
    /// `timeout` is zero.
    ZeroTimeout,
    /// `rise` or `fall` is zero.
    ZeroRiseOrFall,
    /// An HTTP check's path does not start with '/' or holds spaces or control
    /// characters.
    BadPath { path: String },
}

impl fmt::Display for HealthCheckError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HealthCheckError::ZeroInterval => f.write_str("interval must be greater than 0"),
            HealthCheckError::ZeroTimeout => f.write_str("timeout must be greater than 0"),
            HealthCheckError::ZeroRiseOrFall => f.write_str("rise and fall must be at least 1"),
            HealthCheckError::BadPath { path } => write!(
                f,
                "path {path:?} must start with '/' and contain no spaces or control characters"
            ),
        }
    }
}

impl std::error::Error for HealthCheckError {}

/// Runs active checks for a pool until dropped (or `stop`ped).
#[derive(Debug)]
#[must_use = "the checks stop when the handle is dropped"]
pub struct ActiveChecks {
    task: JoinHandle<()>,
    reports: Reports,
    pool: Arc<Pool>,
}

impl ActiveChecks {
    /// Stops the checks; endpoints keep the health they have.
    pub fn stop(self) {
        // Drop aborts the task.
    }

    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }

    /// The checker's view of every endpoint it has probed, for the admin API ("why is
    /// this endpoint down?"). Sorted by address.
    pub fn report(&self) -> Vec<CheckReport> {
        let mut all: Vec<CheckReport> = lock(&self.reports).values().cloned().collect();
        all.sort_by_key(|r| r.addr);
        all
    }
}

impl Drop for ActiveChecks {
    fn drop(&mut self) {
        self.task.abort();
        // Probation is these checks' doing; with them gone (a reload that turns them
        // off) nothing would ever lift it.
        for r in lock(&self.reports).values().filter(|r| r.held_up) {
            if let Some(ep) = self.pool.find(r.addr) {
                ep.set_on_probation(false);
            }
        }
    }
}

/// Starts checking every endpoint of `pool` but its supervised workers (its membership
/// as of each round) on the current tokio runtime. The first round runs at once.
pub fn spawn_active_checks(pool: Arc<Pool>, check: HealthCheck) -> ActiveChecks {
    spawn_active_checks_sending(pool, check, Vec::new())
}

/// [`spawn_active_checks`] whose probes write `preamble` first on each connection: the
/// PROXY protocol header of a balancer that sends one, since a backend that expects it
/// refuses a connection without one.
pub fn spawn_active_checks_sending(
    pool: Arc<Pool>,
    check: HealthCheck,
    preamble: Vec<u8>,
) -> ActiveChecks {
    let probing = Probing {
        preamble: preamble.into(),
        wrap: None,
    };
    spawn_active_checks_with(pool, check, probing)
}

/// [`spawn_active_checks`] whose probes start each connection as `probing` says: the
/// PROXY protocol header first, then TLS for a balancer whose backends speak it, so a
/// certificate that does not verify fails the check with that reason.
pub fn spawn_active_checks_with(
    pool: Arc<Pool>,
    check: HealthCheck,
    probing: Probing,
) -> ActiveChecks {
    let reports = Reports::default();
    ActiveChecks {
        task: tokio::spawn(run(
            Arc::clone(&pool),
            check,
            Arc::new(probing),
            Arc::clone(&reports),
        )),
        reports,
        pool,
    }
}

/// Consecutive probe results for one endpoint, and the last failure's reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckReport {
    pub addr: SocketAddr,
    pub passes: u32,
    pub failures: u32,
    /// Why the last failed probe failed (kept after passes, so "why was it down" stays
    /// answerable).
    pub last_error: Option<String>,
    /// Whether it failed `fall` checks in a row with no answer but was kept in rotation,
    /// since half the endpoints are down on no answer already (`NoAnswerBudget`).
    pub held_up: bool,
}

/// Shared with the handle for `report`; locked briefly once per probe result, never
/// across an await, never by the request path.
type Reports = Arc<Mutex<HashMap<SocketAddr, CheckReport>>>;

fn lock(reports: &Reports) -> MutexGuard<'_, HashMap<SocketAddr, CheckReport>> {
    reports.lock().unwrap_or_else(|e| e.into_inner())
}

async fn run(pool: Arc<Pool>, check: HealthCheck, probing: Arc<Probing>, reports: Reports) {
    let check = Arc::new(check);
    let mut ticker = tokio::time::interval(check.interval.max(Duration::from_millis(1)));
    // A round slower than the interval (probes at their timeout) delays the next one
    // instead of firing a burst to catch up.
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    // Each endpoint's completed responses at its last probe (see `liveness`).
    let mut progress: HashMap<SocketAddr, Progress> = HashMap::new();
    // Each endpoint's prober, with the connection it keeps; taken by its probe each
    // round and given back, so an endpoint that left the pool drops its own.
    let mut probers: HashMap<SocketAddr, Prober> = HashMap::new();
    loop {
        ticker.tick().await;
        let endpoints = pool.endpoints_not_from(Source::Supervisor);
        let mut probes = JoinSet::new();
        for ep in &endpoints {
            let (ep, check, probing) = (Arc::clone(ep), Arc::clone(&check), Arc::clone(&probing));
            let mut prober = probers.remove(&ep.addr()).unwrap_or_default();
            probes.spawn(async move {
                let result = prober
                    .probe(ep.addr(), &probing, &check.kind, check.timeout)
                    .await;
                // Read after the probe: what completed while it waited counts.
                let looked = (ep.stats().signs_of_life(), ep.pending());
                ((ep, result, looked), prober)
            });
        }
        // A probe task only fails by panicking, which it does not.
        let (results, kept): (Vec<_>, Vec<_>) = probes.join_all().await.into_iter().unzip();
        probers = results
            .iter()
            .map(|(ep, _, _)| ep.addr())
            .zip(kept)
            .collect();
        let mut no_answer_budget = NoAnswerBudget::new(&endpoints);
        let common_timeout = is_common_timeout(&results);
        if common_timeout {
            if let Some(held_back) = COMMON_TIMEOUT.check_now() {
                tracing::warn!(
                    pool = %pool.name(),
                    held_back,
                    "health checks timed out on every endpoint up at once: not counted against them (overloaded alike, or drover's side is slow; a backend that refuses or answers badly still goes down)"
                );
            }
        }
        for (ep, result, (completed, pending)) in results {
            let interval = progress
                .entry(ep.addr())
                .or_insert_with(|| Progress::new(completed))
                .look(completed, pending);
            // Stuck requests do not overrule this: with every backend's queue longer
            // than the interval (another balancer's load), drover's own few requests wait
            // on each, and counting them would be the outage this rule prevents.
            if common_timeout && is_timeout(&result) {
                continue;
            }
            let result = match liveness::judge(&result, interval.advanced) {
                Outcome::Busy => {
                    // A request completed there: it serves, whatever its checks say.
                    ep.set_on_probation(false);
                    tracing::debug!(
                        pool = %pool.name(),
                        endpoint = %ep.addr(),
                        "health check got no answer, not counted: requests completed meanwhile (busy, not hung)"
                    );
                    continue;
                }
                Outcome::Passed | Outcome::Failed => result,
            };
            let mut reports = lock(&reports);
            let r = reports.entry(ep.addr()).or_insert_with(|| CheckReport {
                addr: ep.addr(),
                passes: 0,
                failures: 0,
                last_error: None,
                held_up: false,
            });
            apply(
                &pool,
                &check,
                &ep,
                r,
                result,
                interval,
                &mut no_answer_budget,
            );
        }
        // Forget endpoints no longer checked (they left the pool) so a returning address
        // starts fresh.
        lock(&reports).retain(|addr, _| endpoints.iter().any(|e| e.addr() == *addr));
        progress.retain(|addr, _| endpoints.iter().any(|e| e.addr() == *addr));
    }
}

/// One probe's result, with the endpoint's completed responses and pending requests
/// read just after it.
type Probed = (Arc<Endpoint>, Result<(), ProbeError>, (u64, u32));

/// Warnings about rounds whose timeouts were not counted (`is_common_timeout`).
static COMMON_TIMEOUT: crate::local::WarnLimit =
    crate::local::WarnLimit::new(Duration::from_secs(10));

fn is_timeout(result: &Result<(), ProbeError>) -> bool {
    matches!(result, Err(ProbeError::Timeout(_)))
}

/// Whether a round's probes timed out on every endpoint that was up, two or more of
/// them. Several independent backends that all stop answering at the same moment point
/// to a cause they share: a load on all of them (another balancer's traffic while drover
/// carries none, so no completed request says they are busy), or drover's own side. The
/// sweep (`bench/sweep.sh --seed 13 --only 10`) shared 4 backends with nginx and HAProxy
/// under 375 connections: drover, idle meanwhile, took all four down at once and
/// answered its next round with 164,948 `503`s where the others failed none. Counted as
/// failures, such timeouts take away all capacity at once; one of several while another
/// answers still goes down on them, within `NoAnswerBudget` or past it when drover's
/// own requests are stuck on it (`Interval::stuck`).
fn is_common_timeout(results: &[Probed]) -> bool {
    let mut up = results.iter().filter(|(ep, _, _)| ep.is_healthy());
    up.clone().nth(1).is_some() && up.all(|(_, result, _)| is_timeout(result))
}

/// How many endpoints probes that got no answer may hold down: half of those checked,
/// rounded down. A probe that times out says "no answer in time", which a hung backend
/// and one busy with load drover cannot see both give. Where some endpoints answer and
/// others do not, the common-timeout rule above does not apply: in `bench/sweep.sh
/// --seed 20 --only 7`, nginx and HAProxy loaded 5 shared backends (10 s of queue each)
/// while drover carried nothing, and its checks took 2-3 of them down, so its own load
/// found 2-3 backends for 5. Past this budget an endpoint that stops answering stays in
/// rotation and its report says why. Not held: an endpoint on which drover's own
/// requests waited a whole interval and none completed (`Interval::stuck`), which is a
/// hang by drover's own evidence, and one that refuses or answers badly, which is an
/// answer. Envoy balances over every host when fewer than half are healthy (its panic
/// threshold); nginx never marks a lone server down.
#[derive(Debug)]
struct NoAnswerBudget {
    checked: usize,
    down: usize,
}

impl NoAnswerBudget {
    fn new(endpoints: &[Arc<Endpoint>]) -> Self {
        // Hung: down on probes that got no answer in time (timeouts; a reset or a close
        // is an answer).
        let down = endpoints
            .iter()
            .filter(|ep| !ep.is_healthy() && ep.is_hung())
            .count();
        NoAnswerBudget {
            checked: endpoints.len(),
            down,
        }
    }

    /// The most endpoints that may be down on no answer.
    fn most(&self) -> usize {
        self.checked / 2
    }

    /// Takes one endpoint down on no answer, if the budget allows.
    fn take(&mut self) -> bool {
        let allowed = self.down < self.most();
        self.down += usize::from(allowed);
        allowed
    }
}

/// Warnings about endpoints kept in rotation past `fall` (`NoAnswerBudget`).
static NO_ANSWER_HELD: crate::local::WarnLimit =
    crate::local::WarnLimit::new(Duration::from_secs(10));

/// Warnings about probes drover could not make for want of its own resources.
static PROBE_SHORTAGE: crate::local::WarnLimit =
    crate::local::WarnLimit::new(Duration::from_secs(1));

/// Updates one endpoint's streaks and flips its health at `fall` / `rise`.
fn apply(
    pool: &Pool,
    check: &HealthCheck,
    ep: &Endpoint,
    s: &mut CheckReport,
    result: Result<(), ProbeError>,
    interval: Interval,
    no_answer_budget: &mut NoAnswerBudget,
) {
    match result {
        Ok(()) => {
            ep.stats().record_check(true);
            s.passes = s.passes.saturating_add(1);
            s.failures = 0;
            s.held_up = false;
            ep.set_on_probation(false);
            if !ep.is_healthy() && s.passes >= check.rise {
                ep.set_healthy(true);
                let slow_start = pool.options().slow_start;
                if !slow_start.is_zero() {
                    ep.start_ramp(clock::now(), clock::nanos(slow_start));
                }
                pool.endpoint_up();
                tracing::info!(
                    pool = %pool.name(),
                    endpoint = %ep.addr(),
                    "endpoint up after {} passing health checks", s.passes
                );
            }
        }
        // Neither a pass nor a failure: every endpoint would fail this probe alike.
        Err(e @ ProbeError::LocalShortage(_)) => {
            if let Some(held_back) = PROBE_SHORTAGE.check_now() {
                tracing::warn!(
                    pool = %pool.name(),
                    endpoint = %ep.addr(),
                    held_back,
                    "health check not run, not counted against the endpoint: {e}"
                );
            }
        }
        Err(e) => {
            ep.stats().record_check(false);
            s.failures = s.failures.saturating_add(1);
            s.passes = 0;
            s.held_up = false;
            s.last_error = Some(e.to_string());
            // Only silence is held: a reset or a close is the backend's own doing.
            let silent = matches!(e, ProbeError::Timeout(_));
            if !ep.is_healthy() {
                // Down already: what it says now is why it stays down.
                ep.set_hung(silent);
            } else if s.failures < check.fall {
                tracing::debug!(endpoint = %ep.addr(), "health check failed: {e}");
            } else if silent && !interval.stuck && !no_answer_budget.take() {
                s.held_up = true;
                ep.set_on_probation(true);
                let why = format!(
                    "{e}; kept in rotation: checks that get no answer take down at most {} of {} endpoints (half, rounded down), and {} are down on them",
                    no_answer_budget.most(),
                    no_answer_budget.checked,
                    no_answer_budget.down,
                );
                if let Some(held_back) = NO_ANSWER_HELD.check_now() {
                    tracing::warn!(
                        pool = %pool.name(),
                        endpoint = %ep.addr(),
                        held_back,
                        "{} failed health checks in a row: {why} (a slow answer may be load drover cannot see; a refused or bad answer still takes it down)",
                        s.failures,
                    );
                }
                s.last_error = Some(why);
            } else {
                ep.set_healthy(false);
                ep.set_on_probation(false);
                ep.set_hung(silent);
                tracing::warn!(
                    pool = %pool.name(),
                    endpoint = %ep.addr(),
                    "endpoint down after {} failed health checks: {e}", s.failures
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::StatusRange;

    #[test]
    fn validation_names_the_problem() {
        assert!(HealthCheck::default().validate().is_ok());
        assert!(HealthCheck::http("health").validate().is_ok());
        let bad = HealthCheck {
            kind: CheckKind::Http {
                path: "/a b\r\nX: y".into(),
                expect: StatusRange::default(),
            },
            ..HealthCheck::default()
        };
        assert_eq!(
            bad.validate(),
            Err(HealthCheckError::BadPath {
                path: "/a b\r\nX: y".into()
            })
        );
        assert!(bad.validate().unwrap_err().to_string().contains("path"));
        let zero = HealthCheck {
            rise: 0,
            ..HealthCheck::default()
        };
        assert_eq!(zero.validate(), Err(HealthCheckError::ZeroRiseOrFall));
        assert_eq!(
            zero.validate().unwrap_err().to_string(),
            "rise and fall must be at least 1"
        );
    }

    #[test]
    fn errors_read_well_in_logs() {
        assert_eq!(
            ProbeError::Timeout(Duration::from_secs(1)).to_string(),
            "timeout after 1s"
        );
        assert_eq!(ProbeError::Status(500).to_string(), "status 500");
        assert_eq!(ProbeError::Refused.to_string(), "connection refused");
        assert_eq!(ProbeError::Malformed.to_string(), "malformed status line");
    }
}
