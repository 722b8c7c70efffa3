//! Readiness (is the fresh worker serving yet?) and liveness (is it still?) probes,
//! both built on `drover_registry::probe`.
//!
//! Liveness tells busy from hung. A probe that gets no answer while the worker
//! completes requests is not a failure: the probe waits behind work, as every request
//! does under a burst (`drover_registry::liveness`). A worker is hung when `fall` probes
//! in a row get no answer and no request completes meanwhile: it spins without
//! finishing anything, sleeps without answering (a deadlock), or is stopped. A Node
//! worker must also leave drover's ping over its IPC channel unanswered: its event loop
//! answers at once while its requests (and its `/health`) wait on a slow database, and
//! cannot while it spins or is stopped. Such a
//! worker is killed at once (it could not act on a SIGTERM) and replaced. And only one
//! worker of an app is restarted for health at a time: the next waits until the
//! replacement of the first is ready, so a cause that hits every worker at once (a slow
//! shared dependency, a burst the busy rule misjudges) never takes them all away.

use crate::cpu::{self, ThreadTimes};
use crate::spec::{Mode, BACKGROUND_SETTLE};
use crate::stalls::Stalls;
use crate::status::WorkerState;
use crate::waiting;
use drover_registry::liveness::{self, Outcome, Progress};
use drover_registry::{
    probe, probe_with, CheckKind, HealthCheck, Pool, ProbeError, Prober, Probing,
};
use std::collections::HashMap;
use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::MissedTickBehavior;

/// How often a starting worker's port is tried. Connecting to a closed loopback port
/// fails at once, so this is the readiness latency, not a cost.
const READY_POLL: Duration = Duration::from_millis(50);

/// Bound on one readiness connect. Loopback connects answer at once; this only matters
/// for a worker whose accept queue is full or whose kernel is swamped.
const READY_CONNECT: Duration = Duration::from_millis(500);

/// A worker that did not become ready in time.
#[derive(Debug)]
pub struct NotReady {
    /// The time it had (`ready_timeout`).
    pub within: Duration,
    /// Why the last readiness attempt failed; `None` when none finished.
    pub last: Option<ProbeError>,
}

impl fmt::Display for NotReady {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.last {
            Some(e) => write!(f, "not ready within {:?} ({e})", self.within),
            None => write!(
                f,
                "not ready within {:?} (no attempt finished)",
                self.within
            ),
        }
    }
}

impl std::error::Error for NotReady {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.last.as_ref().map(|e| e as _)
    }
}

/// Waits until `addr` accepts TCP and, when `check` is set, one probe of it passes
/// (each connection started as `probing` says: an HTTP/2 stream for `h2c` workers).
/// One pass is enough here (not `rise`): a worker that answers its health route is
/// ready, and a slow start just delays traffic. Fails after `within` with the last
/// reason, for the log.
pub(crate) async fn wait_ready(
    addr: SocketAddr,
    check: Option<&HealthCheck>,
    probing: &Probing,
    within: Duration,
) -> Result<(), NotReady> {
    let mut last = None;
    let attempts = async {
        let mut said = false;
        loop {
            match ready_once(addr, check, probing).await {
                Ok(()) => return,
                Err(e) => {
                    // An answer, but the wrong one (a health path the app does not
                    // have answers 404): said at once, not only when `within` runs
                    // out (30 s of no traffic, and nothing in the log, before).
                    if !said && matches!(e, ProbeError::Status(_) | ProbeError::Grpc(_)) {
                        tracing::warn!(endpoint = %addr,
                            "worker listens, but its health check failed ({e}): it gets no \
                             traffic until the check passes (it is stopped and started \
                             again if none does within {within:?})");
                        said = true;
                    }
                    last = Some(e);
                }
            }
            tokio::time::sleep(READY_POLL).await;
        }
    };
    match tokio::time::timeout(within, attempts).await {
        Ok(()) => Ok(()),
        Err(_) => Err(NotReady { within, last }),
    }
}

async fn ready_once(
    addr: SocketAddr,
    check: Option<&HealthCheck>,
    probing: &Probing,
) -> Result<(), ProbeError> {
    probe(addr, &CheckKind::Tcp, READY_CONNECT).await?;
    match check {
        Some(c) if c.kind != CheckKind::Tcp => probe_with(addr, probing, &c.kind, c.timeout).await,
        _ => Ok(()),
    }
}

/// Why a serving worker must go, and the app's permit to restart it.
pub(crate) struct Unhealthy {
    /// For the log and the restart record.
    pub reason: String,
    /// It gave no answer and completed nothing: it cannot finish its requests or act on
    /// a SIGTERM either, so it is killed at once rather than after `stop_timeout`.
    pub hung: bool,
    /// Hung because its process is stopped (SIGSTOP, a debugger): none of the requests
    /// it holds did that.
    pub stopped: bool,
    /// Held until this slot's next process is ready, so the app's other workers are not
    /// restarted for health meanwhile (see `Supervisor`'s one-at-a-time rule).
    pub permit: OwnedSemaphorePermit,
}

/// What the liveness watch needs of a serving worker.
pub(crate) struct Watched<'a> {
    pub addr: SocketAddr,
    pub pid: Option<u32>,
    pub check: &'a HealthCheck,
    /// How each probe's connection starts (HTTP/2 for `h2c` workers).
    pub probing: &'a Probing,
    /// The pool the worker serves in: its endpoint counts the responses it completes.
    pub pool: &'a Pool,
    /// One per app: taken by the worker about to be restarted for health.
    pub restarts: &'a Arc<Semaphore>,
    /// One per app: the longest stalls its workers came back from (see `stalls`).
    pub stalls: &'a Stalls,
    /// Told `Busy` while probes go unanswered but requests complete (or its event loop
    /// answers), `Ready` otherwise.
    pub show: &'a (dyn Fn(WorkerState) + Sync),
    /// A Node worker's session with drover's preload: whether its event loop turns.
    pub event_loop: Option<&'a drover_node::Inbox>,
    /// It speaks HTTP/2 (`AppSpec::h2c`), and answers the streams it took together in
    /// batches (see `works_on_a_batch`).
    pub answers_in_batches: bool,
}

/// Whether a worker that completed nothing since the last probe is working through a
/// batch of streams: a Node HTTP/2 server (grpc-js) runs every stream that arrived in
/// one read before its answers leave (its writes go out when the event loop turns), so
/// 20 calls of 300 ms each came back together after 6 s, and a worker busy with a burst
/// completed nothing for longer than `fall` probes: it was restarted as hung, with every
/// call it held, and its replacement took the queued calls and was restarted in turn.
/// So a worker whose main thread stayed mostly busy while streams drover sent it are
/// pending is busy. An endless loop is still found: its streams end at the request
/// timeout (`504`), and with none pending the probes count again.
fn works_on_a_batch(main_thread_share: Option<f64>, pending: u32) -> bool {
    pending > 0 && main_thread_share.is_some_and(|s| s >= WORKING)
}

/// Whether a worker whose probes get no answer waits on a program it started while it
/// was quiet (`quiet_for`: since the interval it last answered or completed a request
/// in began, plus an interval for `/proc`'s 10 ms clock and the ticker's lag): Node's
/// `execSync('convert ...')` or Python's `subprocess.run` blocks the main thread, idle
/// in a wait, until the program ends. It is busy: the program works, and a restart
/// would fail the request that waits on it (a 10 s `execSync` was killed as deadlocked
/// after 4 s). A deadlocked worker starts nothing; one that waits forever on a program
/// of its own is the app's to time out, as it is under PM2 and Node's cluster module.
/// Only a program started since the worker was ready counts (`quiet_for` never reaches
/// back past that): a wrapper's app (`sh -c "python3 app.py"`) is its child from the
/// start, and one that deadlocked right after its first answer read as waiting on it.
fn waits_on_a_child(pid: Option<u32>, main_thread_share: Option<f64>, quiet_for: Duration) -> bool {
    let Some(pid) = pid else {
        return false;
    };
    main_thread_share.is_some_and(|s| s < WORKING)
        && cpu::youngest_child_age(pid).is_some_and(|age| age <= quiet_for)
}

/// Whether a worker whose probes get no answer, and whose event loop did not answer
/// drover's ping either (every program but Node has none), waits on a dependency: a
/// TCP connection it opened (see `waiting`). gunicorn's sync worker blocked on a
/// stalled redis was killed as deadlocked after 4 s, with the POST it held and three
/// queued behind it, where nginx in front of gunicorn failed none. Busy, as a Node
/// worker whose event loop answers: a restart would fail what it holds and make the
/// dependency no faster. One that waits forever is the app's to time out (gunicorn's
/// own `--timeout` kills a sync worker silent for 30 s). Said once per quiet spell.
fn waits_on_a_dependency(pid: Option<u32>, serving_port: u16, logged: &mut bool) -> bool {
    let Some(pid) = pid else {
        return false;
    };
    let group = cpu::process_group(pid).unwrap_or(pid);
    let Some(dependency) = waiting::waits_on(group, serving_port) else {
        return false;
    };
    if !*logged {
        tracing::warn!(
            "worker (pid {pid}) answers no health check while it waits on a connection to \
             {dependency}: busy, not restarted while it waits"
        );
        *logged = true;
    }
    true
}

/// How long a worker in one timed sleep (`waiting::sleeps_through`) is spared from its
/// first failed check: longer than handlers sleep (a 10 s `sleep` standing for a slow
/// call), and a bound on how long an idle thread's timed wait can hide a deadlock.
const SLEEP_SPARES: Duration = Duration::from_secs(30);

/// A main thread busy at least this share of the time since the last probe is working
/// through something, not stuck. Not the balancer's `SATURATED` (0.9): the share runs
/// from the last probe, which a burst often follows after an idle spell: beside other
/// load, the first window of a burst read 0.82-0.90 (and a CI run whose worker was
/// restarted with 20 calls read 0.90 over two failed probes), later ones 0.99-1.0. A
/// deadlocked or waiting worker stays near 0.
const WORKING: f64 = 0.5;

/// Probes a ready worker every `interval` and returns once `fall` probes in a row have
/// failed with no request completing meanwhile (see `drover_registry::liveness`: busy
/// is not hung) and no other worker of the app is being restarted for health. Never
/// returns for a healthy worker; the caller races it against the process exiting.
pub(crate) async fn until_unhealthy(w: Watched<'_>) -> Unhealthy {
    let completed = || {
        w.pool
            .find(w.addr)
            .map_or(0, |ep| ep.stats().signs_of_life())
    };
    let mut progress = Progress::new(completed());
    let mut ticker = tokio::time::interval(w.check.interval.max(Duration::from_millis(1)));
    // A probe that hangs until its timeout delays the next one instead of bunching up.
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    // Readiness just passed a probe; the first tick of `interval` fires at once, skip it.
    ticker.tick().await;
    let mut failures = 0;
    // When the failures in a row began, with the main thread's busy time then.
    let mut quiet_since = Quiet::now(w.pid);
    // The main thread's busy time at the last probe (for `works_on_a_batch`).
    let mut last_probe = Quiet::now(w.pid);
    let mut waiting_logged = false;
    let mut starved_logged = false;
    let mut computing_logged = false;
    let mut sleeping_logged = false;
    let mut dependency_logged = false;
    // The start of the last interval in which a probe passed or the worker showed work
    // of its own (not only a program it waits on); and when the watch began, once the
    // worker was ready.
    let mut last_progress = Instant::now();
    let watching_since = last_progress;
    // When the worker's completed requests were last counted: those counted at a look
    // completed after the look before, which is where a program it ran after them may
    // have begun. Not the look itself: a worker that served until it ran a 3 s program
    // showed work at the probe after, and the program, started up to two probes before
    // that, read as older than the quiet spell (so not the worker's) and the worker was
    // killed as deadlocked.
    let mut last_look = last_progress;
    // When the probe before this one asked (and pinged the worker's event loop).
    let mut last_asked = last_progress;
    // The worker's probes share a kept connection, as its clients' requests do, and
    // one at most is in it at a time (see `Probes`).
    let mut probes = Probes::new(&w);
    loop {
        ticker.tick().await;
        let asked_at = Instant::now();
        let previous_ask = std::mem::replace(&mut last_asked, asked_at);
        if let Some(event_loop) = w.event_loop {
            event_loop.ping();
        }
        let (result, answered_late) = probes.next(w.check.timeout).await;
        // A Node worker whose event loop answered drover's ping while the probe got no
        // answer is waiting (its `/health` waits on the same slow database as its
        // requests), not hung: a restart would fail the requests it holds and make the
        // database no faster. A busy loop or a stopped process cannot answer. Any
        // answer since the probe before counts: a worker computing requests longer
        // than a probe waits turns its loop only between them, after the probe that
        // asked gave up (on connections handed to it, drover sees no other sign).
        let waits = matches!(&result, Err(e) if e.is_no_answer())
            && w.event_loop
                .is_some_and(|l| l.event_loop_answered_since(previous_ask));
        let share = last_probe.main_thread_share(w.pid);
        let batch = w.answers_in_batches
            && works_on_a_batch(share, w.pool.find(w.addr).map_or(0, |ep| ep.pending()));
        let on_child = matches!(&result, Err(e) if e.is_no_answer())
            && !waits
            && waits_on_a_child(
                w.pid,
                share,
                (last_progress.elapsed() + w.check.interval).min(watching_since.elapsed()),
            );
        let on_dependency = matches!(&result, Err(e) if e.is_no_answer())
            && !waits
            && !on_child
            && share.is_some_and(|s| s < WORKING)
            && waits_on_a_dependency(w.pid, w.addr.port(), &mut dependency_logged);
        last_probe = Quiet::now(w.pid);
        let interval_began = std::mem::replace(&mut last_look, Instant::now());
        let worked = progress.advanced(completed()) || waits || batch || answered_late;
        let advanced = worked || on_child || on_dependency;
        if let Err(e @ ProbeError::LocalShortage(_)) = &result {
            // drover could not make the probe (out of descriptors, say: overload): that
            // says nothing about the worker, and counting it would restart workers for
            // drover's own shortage.
            tracing::debug!(endpoint = %w.addr, "worker health check not run, not counted: {e}");
            continue;
        }
        let outcome = liveness::judge(&result, advanced);
        let answered = result.is_ok();
        let e = match (outcome, result) {
            (Outcome::Failed, Err(e)) => e,
            (outcome, _) => {
                // Not while it only waits on its program: that one's age is measured
                // from the last interval with work of its own.
                if worked || answered {
                    // Measured as the stall it is judged by below: from the start of
                    // the last interval with a sign of life to now.
                    if failures > 0 && quiet_since.spinning(w.pid) {
                        w.stalls.came_back_from(last_progress.elapsed());
                    }
                    last_progress = interval_began;
                }
                if on_child && !worked {
                    tracing::debug!(endpoint = %w.addr, "worker waits on a program it started");
                }
                if !on_dependency {
                    dependency_logged = false;
                }
                if failures > 0 || outcome == Outcome::Busy {
                    tracing::debug!(endpoint = %w.addr, ?outcome, "worker health check");
                }
                failures = 0;
                waiting_logged = false;
                starved_logged = false;
                computing_logged = false;
                sleeping_logged = false;
                (w.show)(if outcome == Outcome::Busy {
                    WorkerState::Busy
                } else {
                    WorkerState::Ready
                });
                continue;
            }
        };
        if failures == 0 {
            quiet_since = Quiet::spell(w.pid);
        }
        failures += 1;
        tracing::debug!(endpoint = %w.addr, failures, "worker health check failed: {e}");
        if failures < w.check.fall.max(1) {
            continue;
        }
        // The checks allow a request `fall - 1` intervals of computing (the spell from
        // the first failed check to the last). A worker kept busy that long but off a
        // core most of it, by other processes' load (a noisy neighbour, a build), has
        // computed less: its 2 s requests took 13 s and it was killed as spinning, with
        // them, where Node's cluster module and PM2 served them. It stays, and is judged
        // again at each check, on the time it ran. An endless loop still reaches the
        // allowance, later by as much as it is starved.
        let allowed = w.check.interval * (w.check.fall.max(1) - 1);
        if let Some(ran) = quiet_since
            .starved(w.pid, allowed)
            .filter(|_| e.is_no_answer())
        {
            if !starved_logged {
                tracing::warn!(endpoint = %w.addr, failures,
                    "worker failing its health checks while other processes keep it off a \
                     core: it ran {:.1}s of the {:.1}s since, under the {:.1}s its checks \
                     allow a request; not restarted while it has computed less",
                    ran.as_secs_f64(), quiet_since.at.elapsed().as_secs_f64(),
                    allowed.as_secs_f64());
                starved_logged = true;
            }
            (w.show)(WorkerState::Busy);
            continue;
        }
        // In one timed sleep the whole spell (a handler's `sleep 10`: Ruby's, Python's):
        // it ends by itself, so busy, not hung. A single-threaded Puma with a 10 s sleep
        // in a handler was killed as deadlocked at 6.9 s, and the GET sent on to the other
        // worker killed that one too (Ruby seat); nginx in front of it answers at 10 s.
        // Bounded (`SLEEP_SPARES`): an idle pool thread's timed wait (a JVM's, for a
        // minute) reads the same, and must not hide a deadlock for long.
        // Seen asleep for half an interval at least: with `fall = 1` the spell has just
        // begun, and every thread is still where it was at its start.
        let slept = quiet_since.at.elapsed();
        if e.is_no_answer()
            && (w.check.interval / 2..SLEEP_SPARES).contains(&slept)
            && !quiet_since.spinning(w.pid)
        {
            if let Some(sleeper) = quiet_since.sleeps_through(w.pid, w.addr.port()) {
                if !sleeping_logged {
                    tracing::warn!(endpoint = %w.addr, failures,
                        "worker answers no health check while a thread of process {sleeper} \
                         sleeps ({:.1}s so far, one timed sleep: it ends by itself): busy, not \
                         restarted while it sleeps, for up to {}s",
                        slept.as_secs_f64(), SLEEP_SPARES.as_secs());
                    sleeping_logged = true;
                }
                (w.show)(WorkerState::Busy);
                continue;
            }
        }
        // Computing no longer than the app's workers have computed before and come back
        // from (see `stalls`): busy.
        let stalled = last_progress.elapsed();
        if let Some((longest, allowed)) = w
            .stalls
            .allowed()
            .filter(|(_, allowed)| e.is_no_answer() && stalled < *allowed)
            .filter(|_| quiet_since.spinning(w.pid))
        {
            if !computing_logged {
                tracing::warn!(endpoint = %w.addr, failures,
                    "worker failing its health checks while it computes, {:.1}s so far: the \
                     app's workers came back from {:.1}s of it lately; not restarted before \
                     {:.1}s",
                    stalled.as_secs_f64(), longest.as_secs_f64(), allowed.as_secs_f64());
                computing_logged = true;
            }
            (w.show)(WorkerState::Busy);
            continue;
        }
        match Arc::clone(w.restarts).try_acquire_owned() {
            Ok(permit) => {
                let hung = e.is_no_answer();
                let reason = if hung {
                    format!(
                        "hung: no answer to {failures} health checks in a row and no request \
                         completed for {:.1}s; {} (last: {e})",
                        quiet_since.at.elapsed().as_secs_f64(),
                        quiet_since.what_it_did(w.pid),
                    )
                } else {
                    format!("failed {failures} health checks in a row (last: {e})")
                };
                return Unhealthy {
                    reason,
                    hung,
                    stopped: hung && w.pid.is_some_and(cpu::is_stopped),
                    permit,
                };
            }
            Err(_) => {
                // Another worker of the app is being replaced; this one keeps serving
                // what it can until that one's successor is ready.
                if !waiting_logged {
                    tracing::warn!(endpoint = %w.addr, failures,
                        "worker failing its health checks ({e}); waiting for the app's \
                         other replacement to be ready before restarting it");
                    waiting_logged = true;
                }
            }
        }
    }
}

/// A worker's liveness probes, one in it at a time. A probe that gets no answer within
/// the check's timeout counts as failed, but it is not given up: the next check waits
/// for its answer (on the same kept connection) instead of sending another. A worker that
/// serves one request at a time (gunicorn's sync worker, Python's `http.server`) runs
/// every probe it was sent, answered or not: with a `/health` that took 4 s (its redis
/// down, the client retrying), a probe every 2 s that gave up after 1 s queued two
/// more each time, the worker spent all its time on probes, its clients' requests
/// waited 10-14 s behind them (11-29 ms behind nginx, which probes nothing), and it was
/// killed as hung. A late answer is a sign of life: busy, not hung (a bad status still
/// fails the check).
struct Probes {
    addr: SocketAddr,
    probing: Probing,
    kind: CheckKind,
    /// How long one probe is waited for in all: past the checks' whole allowance, the
    /// worker is judged on the failures anyway.
    patience: Duration,
    /// The kept connection's prober, while no probe is out.
    idle: Option<Prober>,
    /// The probe sent and not yet answered, which holds the prober.
    out: Option<OutProbe>,
}

/// A probe in flight: aborted with the watch (a worker killed, a watch dropped).
struct OutProbe(tokio::task::JoinHandle<(Prober, Result<(), ProbeError>)>);

impl Drop for OutProbe {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Probes {
    fn new(w: &Watched<'_>) -> Probes {
        Probes {
            addr: w.addr,
            probing: w.probing.clone(),
            kind: w.check.kind.clone(),
            patience: w.check.interval * w.check.fall.max(1) + w.check.timeout,
            idle: Some(Prober::default()),
            out: None,
        }
    }

    /// This check's result, within `timeout`: the answer to the probe still out, or to a
    /// new one. `true` with it when that answer is a late one, to a probe an earlier
    /// check counted as failed (the result is then that check's timeout, or the late
    /// answer's bad status).
    async fn next(&mut self, timeout: Duration) -> (Result<(), ProbeError>, bool) {
        let late = self.out.is_some();
        let mut out = match self.out.take() {
            Some(out) => out,
            None => {
                let mut prober = self.idle.take().unwrap_or_default();
                let (addr, probing, kind) = (self.addr, self.probing.clone(), self.kind.clone());
                let patience = self.patience;
                OutProbe(tokio::spawn(async move {
                    let result = prober.probe(addr, &probing, &kind, patience).await;
                    (prober, result)
                }))
            }
        };
        match tokio::time::timeout(timeout, &mut out.0).await {
            Ok(Ok((prober, result))) => {
                self.idle = Some(prober);
                match result {
                    Ok(()) if late => (Err(ProbeError::Timeout(timeout)), true),
                    // Waited out in all (`patience`): this check's timeout, as any.
                    Err(e) if late && e.is_no_answer() => {
                        (Err(ProbeError::Timeout(timeout)), false)
                    }
                    result => (result, late),
                }
            }
            // The task ended without an answer (it cannot panic; aborted only on drop).
            Ok(Err(_)) => (Err(ProbeError::Timeout(timeout)), false),
            Err(_) => {
                self.out = Some(out);
                (Err(ProbeError::Timeout(timeout)), false)
            }
        }
    }
}

/// Where a quiet spell (failed probes, no completions) began: for telling a worker that
/// spins from one that sleeps.
struct Quiet {
    at: Instant,
    busy_ns: Option<u64>,
    /// The main thread's time on a core (busy without waiting for one).
    run_ns: Option<u64>,
    /// Every thread of the worker's process group then, at the start of a spell only
    /// (`Quiet::spell`): what spins or starves may be a thread other than the main one.
    threads: Option<HashMap<u32, ThreadTimes>>,
}

impl Quiet {
    fn now(pid: Option<u32>) -> Quiet {
        Quiet {
            at: Instant::now(),
            busy_ns: pid.and_then(cpu::main_thread_busy_ns),
            run_ns: pid.and_then(cpu::main_thread_run_ns),
            threads: None,
        }
    }

    /// The start of a quiet spell, with every thread of the worker's process group.
    fn spell(pid: Option<u32>) -> Quiet {
        Quiet {
            threads: pid.map(|pid| cpu::group_thread_times(cpu::process_group(pid).unwrap_or(pid))),
            ..Quiet::now(pid)
        }
    }

    /// How long the busiest thread of the worker's process group ran on a core since,
    /// when it was busy (running or waiting for a core) most of the time but ran less
    /// than half of it, kept off a core by other processes, and ran less than
    /// `allowed`: starved, with less computed than the checks allow (see
    /// `until_unhealthy`).
    fn starved(&self, pid: Option<u32>, allowed: Duration) -> Option<Duration> {
        let (share, ran) = self.busiest(pid)?;
        let wall = self.at.elapsed();
        (share >= WORKING && ran.as_secs_f64() < WORKING * wall.as_secs_f64() && ran < allowed)
            .then_some(ran)
    }

    /// The share of the time since that the busiest thread of the worker's process group
    /// was busy, and how long it ran on a core: a pre-fork server's (gunicorn's) main
    /// thread only waits on its children, which serve, so a spinning gunicorn worker
    /// read as busy 0% (deadlocked), and one starved of a core was killed as hung where
    /// a Node worker was spared. The main thread's without a reading of the group.
    fn busiest(&self, pid: Option<u32>) -> Option<(f64, Duration)> {
        let wall = self.at.elapsed().as_nanos() as f64;
        if wall <= 0.0 {
            return None;
        }
        let group = self.threads.as_ref().zip(pid).and_then(|(then, pid)| {
            let now = cpu::group_thread_times(cpu::process_group(pid).unwrap_or(pid));
            cpu::busiest_since(then, &now)
        });
        let spent = match group {
            Some(spent) => spent,
            None => ThreadTimes {
                busy: pid
                    .and_then(cpu::main_thread_busy_ns)?
                    .checked_sub(self.busy_ns?)?,
                run: pid
                    .and_then(cpu::main_thread_run_ns)?
                    .checked_sub(self.run_ns?)?,
            },
        };
        Some((spent.busy as f64 / wall, Duration::from_nanos(spent.run)))
    }

    /// The process of the worker's group, serving `serving_port`, with a thread in one
    /// timed sleep since the spell began (see `waiting::sleeps_through`).
    fn sleeps_through(&self, pid: Option<u32>, serving_port: u16) -> Option<u32> {
        let (then, pid) = self.threads.as_ref().zip(pid)?;
        waiting::sleeps_through(cpu::process_group(pid).unwrap_or(pid), serving_port, then)
    }

    /// Whether the busiest thread of the worker's process group was busy most of the
    /// time since: it computes (or spins), it does not wait.
    fn spinning(&self, pid: Option<u32>) -> bool {
        self.busiest(pid).is_some_and(|(share, _)| share >= WORKING)
    }

    /// The share of the time since that the main thread was busy; `None` when its CPU
    /// could not be read.
    fn main_thread_share(&self, pid: Option<u32>) -> Option<f64> {
        let wall = self.at.elapsed().as_nanos() as f64;
        match (self.busy_ns, pid.and_then(cpu::main_thread_busy_ns)) {
            (Some(then), Some(now)) if wall > 0.0 => Some(now.saturating_sub(then) as f64 / wall),
            _ => None,
        }
    }

    /// What the worker did since: stopped, spinning or idle.
    fn what_it_did(&self, pid: Option<u32>) -> String {
        if pid.is_some_and(cpu::is_stopped) {
            return "the process is stopped (SIGSTOP, or a debugger)".to_string();
        }
        match self.busiest(pid) {
            // A request that computes for longer than the checks allow looks the same:
            // the user learns how to allow it.
            Some((share, _)) if share >= WORKING => format!(
                "its busiest thread was busy {:.0}% of the time (an endless loop? a \
                 request that computes this long needs a larger health fall or interval: \
                 --fall, --health-interval)",
                share.min(1.0) * 100.0
            ),
            Some((share, _)) => format!(
                "its busiest thread was busy {:.0}% of the time (deadlocked, or waiting \
                 for something that does not come?)",
                share * 100.0
            ),
            None => "its CPU could not be read".to_string(),
        }
    }
}

/// How long a shared-mode worker must stay alive to count as ready. drover cannot reach
/// one worker through a shared socket, so it cannot probe it; until the worker accepts,
/// connections wait in the kernel's accept queue (or go to the other workers), so a
/// short settle costs latency at worst, never a failed request.
pub(crate) const SHARED_SETTLE: Duration = Duration::from_millis(300);

/// Readiness for a worker of any mode: `addr` is its own port in proxy mode, `None` in
/// shared and background mode.
pub(crate) async fn wait_ready_at(
    addr: Option<SocketAddr>,
    check: Option<&HealthCheck>,
    probing: &Probing,
    within: Duration,
    mode: Mode,
) -> Result<(), NotReady> {
    match (addr, mode) {
        (Some(addr), _) => wait_ready(addr, check, probing, within).await,
        // Nothing to probe: a worker that has run this long is up (one that exits
        // first failed to start, which the caller sees).
        (None, Mode::Background) => {
            tokio::time::sleep(BACKGROUND_SETTLE.min(within)).await;
            Ok(())
        }
        (None, _) => {
            tokio::time::sleep(SHARED_SETTLE.min(within)).await;
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_saturated_worker_holding_streams_works_on_a_batch() {
        assert!(works_on_a_batch(Some(1.0), 3));
        assert!(works_on_a_batch(Some(0.95), 1));
        // A burst that came a fifth of the way into the window since the last probe.
        assert!(works_on_a_batch(Some(0.8), 18));
        // Nothing of drover's pending (its calls timed out): an endless loop.
        assert!(!works_on_a_batch(Some(1.0), 0));
        // Idle with streams pending: deadlocked, or waiting (the event-loop ping says).
        assert!(!works_on_a_batch(Some(0.1), 3));
        assert!(!works_on_a_batch(None, 3));
    }

    #[test]
    fn not_ready_says_the_last_reason() {
        let within = Duration::from_secs(5);
        let none = NotReady { within, last: None };
        assert_eq!(
            none.to_string(),
            "not ready within 5s (no attempt finished)"
        );
        let refused = NotReady {
            within,
            last: Some(ProbeError::Refused),
        };
        assert_eq!(
            refused.to_string(),
            "not ready within 5s (connection refused)"
        );
        assert!(std::error::Error::source(&refused).is_some());
    }
}
