//! The handle to one app's workers.

use crate::cpu;
use crate::forensics::RestartRecord;
use crate::memory;
use crate::output::{stderr_sink, LineSink};
use crate::spec::{check_workers, AppSpec, Mode, ProgramError, SpecError};
use crate::status::{WorkerState, WorkerStatus};
use crate::steer::{SharedListener, Steering, STEER_IDLE_PERIOD, STEER_PERIOD};
use crate::worker::{self, AppState, ReplaceError, ReplaceRequest};
use drover_registry::{Pool, WrapProbe};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

/// Keeps `spec.workers` processes of one app running and their addresses in a pool.
///
/// Dropping it without `shutdown` still stops the workers gracefully in the background
/// (each slot sees its stop channel close), as long as the tokio runtime keeps running;
/// if the runtime goes away first, each worker's process group gets SIGKILL.
pub struct Supervisor {
    shared: Arc<AppState>,
    /// The slots' tasks, in id order. Emptied by the first `shutdown`; later calls wait
    /// on the lock until it is done.
    slots: tokio::sync::Mutex<SlotTasks>,
    /// One reload or scale at a time: two interleaved ones would replace or retire each
    /// other's workers.
    reloading: tokio::sync::Mutex<()>,
    /// Shared mode: the task that re-weights the program every `STEER_PERIOD`.
    steering: Option<JoinHandle<()>>,
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        if let Some(task) = &self.steering {
            task.abort();
        }
        if let Some(steer) = &self.shared.steer {
            steer.stop_watching();
        }
    }
}

struct SlotTasks {
    tasks: Vec<SlotTask>,
    /// Shutdown has begun: no slot may be added.
    closed: bool,
}

/// One slot's task and how to reach it.
struct SlotTask {
    /// `true` (or dropped): stop the process for good, after draining it.
    stop: watch::Sender<bool>,
    replace: mpsc::UnboundedSender<ReplaceRequest>,
    task: JoinHandle<()>,
}

impl SlotTask {
    fn start(shared: &Arc<AppState>, id: usize) -> SlotTask {
        let (stop, stop_rx) = watch::channel(false);
        let (replace, replace_rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(worker::run(Arc::clone(shared), id, stop_rx, replace_rx));
        SlotTask {
            stop,
            replace,
            task,
        }
    }
}

/// How often `scale` looks whether the workers it added are ready.
const READY_POLL: Duration = Duration::from_millis(20);

impl Supervisor {
    /// Where the app's first worker to serve listened; `None` until one does. Node
    /// workers say so when their `listen()` is answered, before they are ready.
    pub fn first_listen(&self) -> watch::Receiver<Option<crate::FirstListen>> {
        self.shared.first_listen.subscribe()
    }

    /// The ports a Node app's workers listen on after their first, and its Unix sockets,
    /// which they share as under Node's cluster module: (where, workers listening there).
    pub fn shared_ports(&self) -> Vec<(drover_node::Place, usize)> {
        self.shared.shared_ports.ports()
    }

    /// Each shared port as it is bound (see `shared_ports`); ends with the app.
    pub fn shared_ports_bound(&self) -> watch::Receiver<Vec<drover_node::Place>> {
        self.shared.shared_ports.bound()
    }

    /// Validates `spec` and starts its workers on the current tokio runtime, forwarding
    /// their output to drover's stderr. Returns at once; workers join `pool` as they
    /// become ready (see `wait_ready`). Panics outside a tokio runtime.
    ///
    /// In shared mode (`spec.mode`), use `start_shared` instead.
    pub fn start(spec: AppSpec, pool: Arc<Pool>) -> Result<Supervisor, SupervisorError> {
        Supervisor::start_with_output(spec, pool, stderr_sink())
    }

    /// Like `start`, with worker output lines sent to `sink` instead of stderr.
    pub fn start_with_output(
        spec: AppSpec,
        pool: Arc<Pool>,
        sink: LineSink,
    ) -> Result<Supervisor, SupervisorError> {
        Supervisor::start_probing(spec, pool, sink, None)
    }

    /// Like `start_with_output`; `http2` (`drover_proxy::H2Probe`, in the binary)
    /// turns each health probe of a worker that speaks only HTTP/2 (`AppSpec::h2c`)
    /// into a stream on a connection of its own. Without it such an app's checks
    /// cannot be made, and its spec (or a reload's) is refused.
    pub fn start_probing(
        spec: AppSpec,
        pool: Arc<Pool>,
        sink: LineSink,
        http2: Option<Arc<dyn WrapProbe>>,
    ) -> Result<Supervisor, SupervisorError> {
        if spec.mode == Mode::Shared {
            return Err(SupervisorError::SharedNeedsSocket { app: spec.name });
        }
        Supervisor::launch(spec, pool, sink, None, http2)
    }

    /// Shared mode: each worker accepts on a socket of its own (passed as fd 3 with
    /// `LISTEN_FDS=1`), all in one `SO_REUSEPORT` group on `listener`'s address, and
    /// drover places each new connection on a worker's socket by the workers' load
    /// (see the `steer` module), with no proxy hop.
    pub fn start_shared(
        spec: AppSpec,
        listener: SharedListener,
        sink: LineSink,
    ) -> Result<Supervisor, SupervisorError> {
        if spec.mode != Mode::Shared {
            return Err(SupervisorError::NotShared { app: spec.name });
        }
        let pool = Arc::new(Pool::new(
            spec.name.clone(),
            &[],
            drover_registry::PoolOptions::default(),
        ));
        let steer = Steering::new(listener).map_err(|source| SupervisorError::Steering {
            app: spec.name.clone(),
            source,
        })?;
        Supervisor::launch(spec, pool, sink, Some(steer), None)
    }

    fn launch(
        spec: AppSpec,
        pool: Arc<Pool>,
        sink: LineSink,
        steer: Option<Steering>,
        http2: Option<Arc<dyn WrapProbe>>,
    ) -> Result<Supervisor, SupervisorError> {
        let spec = spec.resolved();
        spec.validate()
            .map_err(|source| SupervisorError::InvalidSpec {
                app: spec.name.clone(),
                source,
            })?;
        if spec.h2c && http2.is_none() {
            return Err(SupervisorError::NoHttp2Probe { app: spec.name });
        }
        // Before any worker: a program that cannot start would only restart forever.
        spec.resolve_program()
            .map_err(|source| SupervisorError::Program {
                app: spec.name.clone(),
                source,
            })?;
        let workers = spec.workers.resolve();
        let steering = steer.is_some();
        let shared = Arc::new(AppState::new(spec, pool, sink, steer, http2));
        if steering {
            let app = shared.app.to_string();
            let shared = Arc::clone(&shared);
            // A thread, not a task: it blocks in epoll_wait (see `Steering::watch`).
            std::thread::Builder::new()
                .name("drover-steer".into())
                .spawn(move || {
                    if let Some(steer) = &shared.steer {
                        steer.watch();
                    }
                })
                .map_err(|source| SupervisorError::Steering { app, source })?;
        }
        // After the watcher: a failure before this point leaves nothing running.
        shared.pool.expect_members(workers);
        let tasks = (0..workers)
            .map(|id| SlotTask::start(&shared, id))
            .collect();
        let steering = steering.then(|| {
            let shared = Arc::clone(&shared);
            tokio::spawn(async move {
                loop {
                    let next = if shared.steer() {
                        STEER_PERIOD
                    } else {
                        STEER_IDLE_PERIOD
                    };
                    tokio::time::sleep(next).await;
                }
            })
        });
        Ok(Supervisor {
            shared,
            steering,
            slots: tokio::sync::Mutex::new(SlotTasks {
                tasks,
                closed: false,
            }),
            reloading: tokio::sync::Mutex::new(()),
        })
    }

    pub fn name(&self) -> &str {
        &self.shared.app
    }

    /// The spec new workers start from (the latest reloaded one).
    pub fn spec(&self) -> Arc<AppSpec> {
        self.shared.current().0
    }

    pub fn pool(&self) -> &Arc<Pool> {
        &self.shared.pool
    }

    /// Shared mode: the address workers accept on.
    pub fn shared_addr(&self) -> Option<std::net::SocketAddr> {
        self.shared.steer.as_ref().map(Steering::local_addr)
    }

    /// Every worker slot, by id, with its RSS, CPU time and in-flight count.
    pub fn status(&self) -> Vec<WorkerStatus> {
        self.shared
            .statuses()
            .into_iter()
            .map(|(mut status, in_pool)| {
                // The app's process, below a runner: the runner's are an idle one's.
                let app = status.app_pid.or(status.pid);
                status.rss_bytes = app.and_then(memory::rss_bytes);
                status.cpu_seconds = app.and_then(cpu::process_cpu_seconds);
                status.in_flight = in_pool
                    .and_then(|a| self.shared.pool.find(a))
                    .map(|ep| ep.in_flight());
                status.clients = in_pool.and_then(|a| self.shared.pool.handoffs().clients_of(a));
                status
            })
            .collect()
    }

    /// Whether every worker of the app is errored (`Backoff::max_restarts`): it has one
    /// at least, and none is started again until a reload or a scale.
    pub fn is_errored(&self) -> bool {
        let states: Vec<WorkerState> = self
            .shared
            .statuses()
            .iter()
            .map(|(s, _)| s.state)
            .collect();
        !states.is_empty() && states.iter().all(|&s| s == WorkerState::Errored)
    }

    /// Why this app's worker processes ended: the last `HISTORY_PER_APP` restart
    /// records, oldest first. Kept across scaling; lost when drover exits.
    pub fn restarts(&self) -> Vec<RestartRecord> {
        self.shared.restart_history()
    }

    /// Waits until every worker is ready, up to `timeout`. True if they all are.
    /// For `drover up` to report "all workers up", and for tests.
    pub async fn wait_ready(&self, timeout: Duration) -> bool {
        let all_ready = || {
            self.shared
                .statuses()
                .iter()
                .all(|(w, _)| w.state.is_serving())
        };
        // Polling keeps the workers free of any notification plumbing; this runs once
        // at startup, so a 20 ms poll costs nothing.
        let wait = async {
            while !all_ready() {
                tokio::time::sleep(READY_POLL).await;
            }
        };
        tokio::time::timeout(timeout, wait).await.is_ok()
    }

    /// Changes the number of workers, as `pm2 scale` does. Growing starts the new
    /// workers and waits until each is ready (up to `ready_timeout`); if one is not, the
    /// new ones are stopped again and the app keeps its old count: nothing is left half
    /// done. Shrinking retires the highest ids: each leaves the pool at once, finishes
    /// the requests it holds (up to `drain_timeout`), then gets SIGTERM. Returns a line
    /// saying what changed.
    ///
    /// A count outside `1..=MAX_WORKERS` fails with `SupervisorError::InvalidWorkers`
    /// before anything is touched.
    pub async fn scale(&self, workers: usize) -> Result<String, SupervisorError> {
        let app = Arc::clone(&self.shared.app);
        check_workers(workers).map_err(|source| SupervisorError::InvalidWorkers {
            app: app.to_string(),
            source,
        })?;
        let _one = self.reloading.lock().await;
        let from = {
            let mut slots = self.slots.lock().await;
            if slots.closed {
                return Err(SupervisorError::ShuttingDown {
                    app: app.to_string(),
                });
            }
            let from = slots.tasks.len();
            self.shared.pool.expect_members(workers);
            for _ in from..workers {
                let id = self.shared.add_slot();
                slots.tasks.push(SlotTask::start(&self.shared, id));
            }
            from
        };
        if workers > from {
            if let Err(stuck) = self.wait_new_ready(from..workers).await {
                self.shared.pool.expect_members(from);
                self.retire_down_to(from).await;
                return Err(SupervisorError::ScaleFailed {
                    app: app.to_string(),
                    stuck,
                    kept: from,
                });
            }
        } else {
            self.retire_down_to(workers).await;
        }
        self.shared.set_workers(workers);
        Ok(format!("app {app:?}: {from} -> {workers} workers"))
    }

    /// Waits until the slots `ids` serve; fails on the first that crash-loops, or when
    /// `ready_timeout` (plus the back-off of one retry) has passed.
    async fn wait_new_ready(&self, ids: std::ops::Range<usize>) -> Result<(), StuckWorker> {
        let spec = self.spec();
        let deadline = tokio::time::Instant::now() + spec.ready_timeout + spec.restart.delay(1);
        loop {
            let statuses = self.shared.statuses();
            let new = &statuses[ids.clone()];
            if new.iter().all(|(w, _)| w.state.is_serving()) {
                return Ok(());
            }
            let stuck = new
                .iter()
                .find(|(w, _)| matches!(w.state, WorkerState::CrashLooping | WorkerState::Errored));
            let late = tokio::time::Instant::now() >= deadline;
            if stuck.is_some() || late {
                let (w, _) = stuck
                    .or_else(|| new.iter().find(|(w, _)| !w.state.is_serving()))
                    .expect("one is not ready");
                return Err(StuckWorker {
                    id: w.id,
                    state: w.state,
                    after: spec.ready_timeout,
                    last_exit: w.last_exit.clone(),
                });
            }
            tokio::time::sleep(READY_POLL).await;
        }
    }

    /// Stops the slots above `keep`, all at once, and forgets them.
    async fn retire_down_to(&self, keep: usize) {
        let mut slots = self.slots.lock().await;
        let keep = keep.min(slots.tasks.len());
        let retired: Vec<SlotTask> = slots.tasks.drain(keep..).collect();
        for (id, slot) in (keep..).zip(&retired) {
            // Before the stop, so the slot records its process as scaled away.
            self.shared.mark_retiring(id);
            slot.stop.send_replace(true);
        }
        for slot in retired.into_iter().rev() {
            if let Err(e) = slot.task.await {
                tracing::error!(app = %self.shared.app, "worker task failed: {e}");
            }
            self.shared.remove_last_slot();
        }
    }

    /// Rolling reload: replaces the workers one at a time, each new one started from
    /// `spec` (or the current spec when `None`, to pick up new code on disk) and ready
    /// before the old one stops getting requests; the old one then finishes what it
    /// holds (up to `drain_timeout`) and is stopped. No request fails on the way.
    ///
    /// When a replacement does not become ready, the reload stops there with an error;
    /// if `spec` changed anything, the workers already replaced are rolled back to the
    /// previous spec, so the app never ends up half on each. A worker that is not
    /// serving (backing off) is not waited for: its next start uses the new spec.
    ///
    /// A `spec` that cannot be applied fails with `InvalidReloadSpec`, `Program`,
    /// `Renamed`, `ModeChanged` or `WorkersChanged` before any worker is touched; a
    /// replacement that fails gives `ReloadFailed`, which says what was undone.
    pub async fn reload(&self, spec: Option<AppSpec>) -> Result<(), SupervisorError> {
        let _one = self.reloading.lock().await;
        let previous = self.shared.current().0;
        let next = match spec {
            Some(spec) => {
                let spec = spec.resolved();
                spec.validate()
                    .map_err(SupervisorError::InvalidReloadSpec)?;
                if spec.h2c && self.shared.http2_probe.is_none() {
                    return Err(SupervisorError::NoHttp2Probe { app: spec.name });
                }
                // A new command that cannot start fails the reload before any worker
                // is touched, rather than after a replacement's ready_timeout.
                spec.resolve_program()
                    .map_err(|source| SupervisorError::Program {
                        app: spec.name.clone(),
                        source,
                    })?;
                if spec.name != previous.name {
                    return Err(SupervisorError::Renamed {
                        app: previous.name.clone(),
                        to: spec.name,
                    });
                }
                if spec.mode != previous.mode {
                    return Err(SupervisorError::ModeChanged {
                        app: previous.name.clone(),
                    });
                }
                if spec.workers != previous.workers {
                    return Err(SupervisorError::WorkersChanged {
                        app: previous.name.clone(),
                        workers: previous.workers.resolve(),
                    });
                }
                Arc::new(spec)
            }
            None => Arc::clone(&previous),
        };
        let changed = *next != *previous;
        self.shared.set_spec(next);
        let count = self.slots.lock().await.tasks.len();
        for id in 0..count {
            if let Err(source) = self.replace_worker(id).await {
                let undone = if changed && id > 0 {
                    self.shared.set_spec(Arc::clone(&previous));
                    futures_in_order(self, id).await
                } else if changed {
                    self.shared.set_spec(previous);
                    Undone::NothingChanged
                } else {
                    Undone::PartlyRestarted { upto: id }
                };
                self.shared.retired().await;
                return Err(SupervisorError::ReloadFailed {
                    app: self.shared.app.to_string(),
                    worker: id,
                    source,
                    undone,
                });
            }
        }
        // Each old process drains in the background while the next is replaced; the
        // reload is done when they have all stopped.
        self.shared.retired().await;
        Ok(())
    }

    async fn replace_worker(&self, id: usize) -> Result<(), ReplaceError> {
        let (tx, rx) = oneshot::channel();
        let replace = self
            .slots
            .lock()
            .await
            .tasks
            .get(id)
            .map(|s| s.replace.clone());
        replace
            .ok_or(ReplaceError::TaskEnded)?
            .send(tx)
            .map_err(|_| ReplaceError::TaskEnded)?;
        rx.await.unwrap_or(Err(ReplaceError::TaskEndedDuringReload))
    }

    /// Stops every worker for good: takes all endpoints out of the pool, sends SIGTERM,
    /// gives each up to `stop_timeout`, then SIGKILL, and reaps them all. Nothing is
    /// restarted once this has begun. Safe to call more than once.
    pub async fn shutdown(&self) {
        let mut slots = self.slots.lock().await;
        slots.closed = true;
        for slot in &slots.tasks {
            slot.stop.send_replace(true);
        }
        // Out of the pool first, all at once, so the balancer stops sending new requests
        // while workers finish the ones they hold.
        for id in 0..slots.tasks.len() {
            self.shared.leave_pool_for_shutdown(id);
        }
        for slot in slots.tasks.drain(..) {
            // A slot task only ends early by panicking; its child was SIGKILLed on drop.
            if let Err(e) = slot.task.await {
                tracing::error!(app = %self.shared.app, "worker task failed: {e}");
            }
        }
        // Old processes of a reload still draining stop before drover does.
        self.shared.retired().await;
    }

    /// `shutdown`, consuming the handle.
    pub async fn stop(self) {
        self.shutdown().await;
    }
}

/// Replaces workers `0..upto` again (after the spec was set back), in order; says how
/// that went.
async fn futures_in_order(sup: &Supervisor, upto: usize) -> Undone {
    for id in 0..upto {
        if let Err(source) = sup.replace_worker(id).await {
            return Undone::RollbackFailed {
                upto,
                worker: id,
                source,
            };
        }
    }
    Undone::RolledBack { upto }
}

impl std::fmt::Debug for Supervisor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Supervisor")
            .field("app", &self.shared.app)
            .field("workers", &self.shared.slot_count())
            .finish_non_exhaustive()
    }
}

/// Why a `Supervisor` call failed. The `Display` of each variant is the message drover
/// prints or answers; match on the variant to tell a bad request (`InvalidSpec`,
/// `InvalidWorkers`, `InvalidReloadSpec`, `Program`, `Renamed`, `ModeChanged`,
/// `WorkersChanged`, `SharedNeedsSocket`, `NotShared`) from a failure (`ScaleFailed`,
/// `ReloadFailed`, `ShuttingDown`).
#[derive(Debug)]
pub enum SupervisorError {
    /// `start` or `start_with_output` with a spec in shared mode.
    SharedNeedsSocket { app: String },
    /// Shared mode: the listening socket could not be set up for steering.
    Steering { app: String, source: std::io::Error },
    /// `start_shared` with a spec not in shared mode.
    NotShared { app: String },
    /// The spec given to start is invalid.
    InvalidSpec { app: String, source: SpecError },
    /// A spec whose workers speak only HTTP/2 (`AppSpec::h2c`), given to a supervisor
    /// started without `start_probing`'s HTTP/2 probe.
    NoHttp2Probe { app: String },
    /// The app's program cannot be started (on start or reload).
    Program { app: String, source: ProgramError },
    /// `scale` to a count outside `1..=MAX_WORKERS`.
    InvalidWorkers { app: String, source: SpecError },
    /// `scale` after `shutdown` began.
    ShuttingDown { app: String },
    /// `scale` up: a new worker did not become ready; the new workers were stopped and
    /// the app keeps `kept` workers.
    ScaleFailed {
        app: String,
        stuck: StuckWorker,
        kept: usize,
    },
    /// The spec given to `reload` is invalid.
    InvalidReloadSpec(SpecError),
    /// `reload` with a spec of another name.
    Renamed { app: String, to: String },
    /// `reload` with a spec of another mode.
    ModeChanged { app: String },
    /// `reload` with a spec of another worker count (`workers` is the app's).
    WorkersChanged { app: String, workers: usize },
    /// `reload`: `worker`'s replacement failed; `undone` says what happened to the rest.
    ReloadFailed {
        app: String,
        worker: usize,
        source: ReplaceError,
        undone: Undone,
    },
}

impl fmt::Display for SupervisorError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SupervisorError::SharedNeedsSocket { app } => write!(
                f,
                "app {app:?}: shared mode needs a listening socket (start_shared)"
            ),
            SupervisorError::NotShared { app } => write!(f, "app {app:?}: not in shared mode"),
            SupervisorError::Steering { app, source } => {
                write!(
                    f,
                    "app {app:?}: cannot set up the workers' sockets: {source}"
                )
            }
            SupervisorError::InvalidSpec { app, source }
            | SupervisorError::InvalidWorkers { app, source } => {
                write!(f, "app {app:?}: {source}")
            }
            SupervisorError::Program { app, source } => write!(f, "app {app:?}: {source}"),
            SupervisorError::NoHttp2Probe { app } => write!(
                f,
                "app {app:?}: its workers speak only HTTP/2, and this supervisor has no HTTP/2 probe for their health checks"
            ),
            SupervisorError::ShuttingDown { app } => write!(f, "app {app:?} is shutting down"),
            SupervisorError::ScaleFailed { app, stuck, kept } => write!(
                f,
                "app {app:?}: {stuck}; the new workers were stopped and the app keeps {kept}"
            ),
            SupervisorError::InvalidReloadSpec(e) => fmt::Display::fmt(e, f),
            SupervisorError::Renamed { app, to } => {
                write!(f, "cannot reload app {app:?} as {to:?}")
            }
            SupervisorError::ModeChanged { app } => write!(
                f,
                "app {app:?}: the mode cannot change on reload (restart drover for that)"
            ),
            SupervisorError::WorkersChanged { app, workers } => write!(
                f,
                "app {app:?}: reload keeps {workers} workers; scale to change the count"
            ),
            SupervisorError::ReloadFailed {
                app,
                worker,
                source,
                undone,
            } => write!(f, "app {app:?}: worker {worker}: {source}; {undone}"),
        }
    }
}

impl std::error::Error for SupervisorError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SupervisorError::InvalidSpec { source, .. }
            | SupervisorError::InvalidWorkers { source, .. } => Some(source),
            SupervisorError::Program { source, .. } => Some(source),
            SupervisorError::ReloadFailed { source, .. } => Some(source),
            SupervisorError::Steering { source, .. } => Some(source),
            // Transparent: its message is this one's.
            SupervisorError::InvalidReloadSpec(e) => e.source(),
            _ => None,
        }
    }
}

/// A worker added by `scale` that did not become ready.
#[derive(Debug, Clone, PartialEq)]
pub struct StuckWorker {
    pub id: usize,
    /// `CrashLooping`, or whatever it was in when `after` had passed.
    pub state: WorkerState,
    /// The app's `ready_timeout`.
    pub after: Duration,
    /// Why its last process ended, if one did.
    pub last_exit: Option<String>,
}

impl fmt::Display for StuckWorker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "worker {} is {} after {:?}",
            self.id, self.state, self.after
        )?;
        match &self.last_exit {
            Some(e) => write!(f, " (last exit: {e})"),
            None => Ok(()),
        }
    }
}

/// What a failed reload did about the workers before the one that failed.
#[derive(Debug)]
pub enum Undone {
    /// The spec changed and the first worker failed: nothing was replaced.
    NothingChanged,
    /// The spec did not change (a plain reload): workers `0..upto` were restarted and
    /// stay so; the rest were not.
    PartlyRestarted { upto: usize },
    /// Workers `0..upto` were rolled back to the previous spec.
    RolledBack { upto: usize },
    /// Rolling workers `0..upto` back failed at `worker`.
    RollbackFailed {
        upto: usize,
        worker: usize,
        source: ReplaceError,
    },
}

/// Workers `0..upto` in words (`upto` ≥ 1): "worker 0", "workers 0-2".
fn first_workers(upto: usize) -> String {
    match upto {
        0 | 1 => "worker 0".into(),
        n => format!("workers 0-{}", n - 1),
    }
}

impl fmt::Display for Undone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Undone::NothingChanged => f.write_str("nothing was changed"),
            Undone::PartlyRestarted { upto: 0 } => {
                f.write_str("no worker was restarted: each runs what it ran before")
            }
            Undone::PartlyRestarted { upto: 1 } => {
                f.write_str("worker 0 was restarted, the others were not")
            }
            Undone::PartlyRestarted { upto } => write!(
                f,
                "{} were restarted, the others were not",
                first_workers(*upto)
            ),
            Undone::RolledBack { upto } => {
                write!(f, "{} rolled back: ok", first_workers(*upto))
            }
            Undone::RollbackFailed {
                upto,
                worker,
                source,
            } => write!(
                f,
                "{} rolled back: rollback failed at worker {worker}: {source}",
                first_workers(*upto)
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_failed_reload_undid_reads_as_worker_numbers() {
        for (undone, says) in [
            (
                Undone::PartlyRestarted { upto: 0 },
                "no worker was restarted: each runs what it ran before",
            ),
            (
                Undone::PartlyRestarted { upto: 1 },
                "worker 0 was restarted, the others were not",
            ),
            (
                Undone::PartlyRestarted { upto: 3 },
                "workers 0-2 were restarted, the others were not",
            ),
            (Undone::RolledBack { upto: 1 }, "worker 0 rolled back: ok"),
        ] {
            assert_eq!(undone.to_string(), says);
        }
    }
}
