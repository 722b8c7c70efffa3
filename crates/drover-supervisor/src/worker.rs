//! One worker slot: start a process, wait until it is ready, put it in the pool, watch
//! it, and when it ends take it out and start another after the back-off. Each slot is
//! one tokio task; slots never wait for each other, so a crash-looping worker cannot
//! hold up the ones that serve.

use crate::health;
use crate::output::{self, LineSink, Stream};
use crate::process::{self, Port};
use crate::spec::AppSpec;
use crate::status::{WorkerState, WorkerStatus};
use drover_registry::Pool;
use std::fmt;
use std::net::SocketAddr;
use std::process::ExitStatus;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::process::Child;
use tokio::sync::watch;

/// What every slot of one app shares with the `Supervisor` handle.
pub(crate) struct Shared {
    pub spec: AppSpec,
    pub app: Arc<str>,
    pub pool: Arc<Pool>,
    pub sink: LineSink,
    /// One per worker id. Locked briefly to update or read; never across an await.
    pub slots: Vec<Mutex<Slot>>,
}

/// A slot's live state; `WorkerStatus` is built from it on demand.
#[derive(Debug)]
pub(crate) struct Slot {
    pub pid: Option<u32>,
    pub port: Option<u16>,
    pub state: WorkerState,
    pub restarts: u32,
    pub crash_streak: u32,
    pub spawned: Option<Instant>,
    pub last_exit: Option<String>,
    /// The address this slot put in the pool, so shutdown can take it out at once.
    pub in_pool: Option<SocketAddr>,
}

impl Slot {
    pub(crate) fn new() -> Slot {
        Slot {
            pid: None,
            port: None,
            state: WorkerState::Starting,
            restarts: 0,
            crash_streak: 0,
            spawned: None,
            last_exit: None,
            in_pool: None,
        }
    }

    pub(crate) fn status(&self, app: &str, id: usize) -> WorkerStatus {
        WorkerStatus {
            app: app.to_string(),
            id,
            pid: self.pid,
            port: self.port,
            state: self.state,
            restarts: self.restarts,
            crash_streak: self.crash_streak,
            uptime: self.spawned.map(|t| t.elapsed()),
            last_exit: self.last_exit.clone(),
        }
    }
}

impl Shared {
    pub(crate) fn slot(&self, id: usize) -> MutexGuard<'_, Slot> {
        self.slots[id].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes a slot's endpoint out of the pool, if it has one there.
    pub(crate) fn leave_pool(&self, id: usize) {
        let addr = self.slot(id).in_pool.take();
        if let Some(addr) = addr {
            self.pool.remove(addr);
        }
    }
}

/// Resolves once shutdown has been asked for, or the `Supervisor` was dropped.
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

fn is_stopping(stop: &watch::Receiver<bool>) -> bool {
    *stop.borrow() || stop.has_changed().is_err()
}

/// How one process's life ended.
enum End {
    /// It exited by itself (crash, clean exit, or killed from outside drover).
    Exited(ExitStatus),
    /// drover killed it: not ready in time, or failed its health checks.
    Killed(String),
    /// It could not be started (no such program, no free port, ...).
    NotStarted(std::io::Error),
    /// Shutdown: do not restart.
    Shutdown,
}

impl fmt::Display for End {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            End::Exited(status) => write!(f, "exited with {status}"),
            End::Killed(reason) => write!(f, "was stopped: {reason}"),
            End::NotStarted(e) => write!(f, "failed to start: {e}"),
            End::Shutdown => f.write_str("was stopped for shutdown"),
        }
    }
}

struct Life {
    end: End,
    pid: Option<u32>,
    /// How long it was in the pool; zero if it never became ready.
    served: Duration,
}

/// Runs slot `id` until shutdown.
pub(crate) async fn run(shared: Arc<Shared>, id: usize, mut stop: watch::Receiver<bool>) {
    let policy = &shared.spec.restart;
    let mut crashes = 0u32;
    let mut first = true;
    while !is_stopping(&stop) {
        if !first {
            shared.slot(id).restarts += 1;
        }
        first = false;
        let life = run_once(&shared, id, &mut stop).await;
        if matches!(life.end, End::Shutdown) {
            break;
        }
        // Whether it lived counts from readiness: a worker that takes 5 s to boot and
        // dies right after is crashing, however long its process existed.
        crashes = if life.served >= policy.min_uptime {
            0
        } else {
            crashes.saturating_add(1)
        };
        let delay = policy.delay(crashes);
        let looping = crashes >= policy.crash_loop_after;
        {
            let mut slot = shared.slot(id);
            slot.pid = None;
            slot.port = None;
            slot.spawned = None;
            slot.crash_streak = crashes;
            slot.last_exit = Some(match &life.end {
                End::Exited(status) => status.to_string(),
                other => other.to_string(),
            });
            slot.state = if looping {
                WorkerState::CrashLooping
            } else {
                WorkerState::BackingOff
            };
        }
        log_end(&shared.spec, id, &life, delay);
        if looping {
            tracing::warn!(
                app = %shared.app,
                worker = id,
                "worker {}/{id} is crash-looping: {crashes} exits in a row within {:?} \
                 of becoming ready; next start in {delay:?}",
                shared.app,
                policy.min_uptime,
            );
        }
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = stopped(&mut stop) => break,
        }
    }
    let mut slot = shared.slot(id);
    slot.state = WorkerState::Stopped;
    slot.pid = None;
    slot.port = None;
    slot.spawned = None;
}

fn log_end(spec: &AppSpec, id: usize, life: &Life, delay: Duration) {
    let pid = life.pid.map_or_else(|| "-".to_string(), |p| p.to_string());
    tracing::warn!(
        app = %spec.name,
        worker = id,
        "worker {}/{id} (pid {pid}) {}; restarting in {delay:?}",
        spec.name,
        life.end,
    );
}

/// One process, from spawn to its end.
async fn run_once(shared: &Shared, id: usize, stop: &mut watch::Receiver<bool>) -> Life {
    let spec = &shared.spec;
    let not_started = |e| Life {
        end: End::NotStarted(e),
        pid: None,
        served: Duration::ZERO,
    };
    // Held for the process's life so no other worker of drover gets this port meanwhile.
    let port = match Port::pick() {
        Ok(p) => p,
        Err(e) => return not_started(e),
    };
    let addr = port.addr();
    let mut child = match process::spawn(spec, id, port.get()) {
        Ok(c) => c,
        Err(e) => return not_started(e),
    };
    let pid = child.id();
    {
        let mut slot = shared.slot(id);
        slot.pid = pid;
        slot.port = Some(port.get());
        slot.spawned = Some(Instant::now());
        slot.state = WorkerState::Starting;
    }
    forward_output(shared, id, &mut child);
    tracing::debug!(app = %spec.name, worker = id, ?pid, %addr, "worker spawned");
    let life = |end, served| Life { end, pid, served };

    // Phase 1: wait for readiness, unless the process dies or shutdown comes first.
    let ready = tokio::select! {
        r = health::wait_ready(addr, spec.health.as_ref(), spec.ready_timeout) => r,
        status = child.wait() => return life(exited(status), Duration::ZERO),
        _ = stopped(stop) => {
            shutdown_child(shared, id, &mut child).await;
            return life(End::Shutdown, Duration::ZERO);
        }
    };
    if let Err(reason) = ready {
        process::stop(&mut child, spec.stop_timeout).await;
        return life(End::Killed(reason), Duration::ZERO);
    }
    if is_stopping(stop) {
        shutdown_child(shared, id, &mut child).await;
        return life(End::Shutdown, Duration::ZERO);
    }

    // Phase 2: serve until the process dies, fails its health checks, or shutdown.
    join_pool(shared, id, addr);
    tracing::info!(app = %spec.name, worker = id, ?pid, %addr, "worker ready");
    let ready_at = Instant::now();
    let unhealthy = async {
        match &spec.health {
            Some(check) => health::until_unhealthy(addr, check).await,
            None => std::future::pending().await,
        }
    };
    let end = tokio::select! {
        status = child.wait() => {
            // Out of the pool before anything else, so no new request goes to a corpse.
            shared.leave_pool(id);
            exited(status)
        }
        reason = unhealthy => {
            shared.leave_pool(id);
            shared.slot(id).state = WorkerState::Unhealthy;
            tracing::warn!(app = %spec.name, worker = id, ?pid, "worker {}/{id} unhealthy: {reason}", spec.name);
            process::stop(&mut child, spec.stop_timeout).await;
            End::Killed(reason)
        }
        _ = stopped(stop) => {
            shutdown_child(shared, id, &mut child).await;
            End::Shutdown
        }
    };
    life(end, ready_at.elapsed())
}

/// `Child::wait` only fails if the child was already reaped, which nothing else does;
/// treat it as an exit of unknown status rather than a panic.
fn exited(status: std::io::Result<ExitStatus>) -> End {
    match status {
        Ok(s) => End::Exited(s),
        Err(e) => End::Killed(format!("lost track of the process: {e}")),
    }
}

fn join_pool(shared: &Shared, id: usize, addr: SocketAddr) {
    shared.pool.insert(addr, 1);
    // We just saw it serve, so it is healthy even in a pool whose members start
    // unhealthy (those wait for active checks that may be minutes apart).
    if shared.pool.options().initially_unhealthy {
        if let Some(ep) = shared.pool.find(addr) {
            ep.set_healthy(true);
        }
    }
    let mut slot = shared.slot(id);
    slot.in_pool = Some(addr);
    slot.state = WorkerState::Ready;
}

async fn shutdown_child(shared: &Shared, id: usize, child: &mut Child) {
    shared.leave_pool(id);
    shared.slot(id).state = WorkerState::Stopping;
    process::stop(child, shared.spec.stop_timeout).await;
}

fn forward_output(shared: &Shared, id: usize, child: &mut Child) {
    if let Some(out) = child.stdout.take() {
        let (app, sink) = (Arc::clone(&shared.app), Arc::clone(&shared.sink));
        output::forward(out, app, id, Stream::Stdout, sink);
    }
    if let Some(err) = child.stderr.take() {
        let (app, sink) = (Arc::clone(&shared.app), Arc::clone(&shared.sink));
        output::forward(err, app, id, Stream::Stderr, sink);
    }
}
