//! One worker slot: start a process, wait until it is ready, put it in the pool, watch
//! it, and when it ends take it out and start another after the back-off. Each slot is
//! one tokio task; slots never wait for each other, so a crash-looping worker cannot
//! hold up the ones that serve.
//!
//! A serving slot can also be asked to replace its process without a gap (rolling
//! reload, memory limit): the new process starts and becomes ready while the old one
//! serves; the new one joins the pool before the old one leaves it; the old one gets no
//! new requests, finishes the ones it holds, and only then is stopped.

use crate::cpu;
use crate::cpu_watch::{grid_interval, CpuWake, CpuWatch};
use crate::first_listen::{FirstListen, FirstListenCell};
use crate::fixed_port::FixedPortLook;
use crate::forensics::{RestartCounts, RestartHistory, RestartReason, RestartRecord, StderrTail};
use crate::health;
use crate::loop_watch;
use crate::memory;
use crate::output::{self, LineSink, Stream};
use crate::process::{self, Listen, Port};
use crate::scout;
use crate::spec::{AppSpec, Mode, Workers};
use crate::status::{WorkerState, WorkerStatus};
use crate::steer::{SlotState, Steering, RESCUE_AFTER};
use drover_balance::WorkerLife;
use drover_registry::{Pool, Probing, Source, TakesConnections, WrapProbe};
use std::fmt;
use std::net::SocketAddr;
use std::ops::{Deref, DerefMut};
use std::process::ExitStatus;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant, SystemTime};
use tokio::process::Child;
use tokio::sync::{mpsc, oneshot, watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;

/// How often a serving worker's RSS and CPU time are sampled (for its restart record)
/// and its RSS compared with `max_memory`.
const MEMORY_POLL: Duration = Duration::from_secs(1);

/// How long a restart record waits for the rest of the ended process's stderr. The
/// process group is gone by then, so the pipe is at EOF as soon as what is buffered is
/// read; only a process that left the group and kept the pipe makes this wait in full.
const STDERR_EOF_WAIT: Duration = Duration::from_secs(1);

/// How often a draining worker's in-flight count is looked at.
const DRAIN_POLL: Duration = Duration::from_millis(10);

/// What every slot of one app shares with the `Supervisor` handle.
pub(crate) struct AppState {
    pub app: Arc<str>,
    pub pool: Arc<Pool>,
    pub sink: LineSink,
    /// Shared mode: each slot's socket and the program that places connections on
    /// them (see `steer`). `None` in proxy mode.
    pub steer: Option<Steering>,
    /// One per worker id, `0..count`; scaling adds or removes at the end. Locked
    /// briefly to update or read; never across an await.
    slots: Mutex<Vec<WorkerSlot>>,
    /// The spec new processes are started from, and its generation: a reload bumps it,
    /// and a process older than the current generation is due for replacement.
    current: Mutex<(Arc<AppSpec>, u64)>,
    /// Why this app's processes ended, last ones only. Here rather than in the slots,
    /// so a record outlives a slot that was scaled away.
    history: RestartHistory,
    /// One permit: the worker restarted for health holds it until its successor is
    /// ready, so health restarts of one app go one at a time (Kubernetes'
    /// `maxUnavailable: 1`). Workers that exit by themselves need none.
    pub health_restarts: Arc<Semaphore>,
    /// The longest stalls the app's workers came back from (`stalls`).
    stalls: crate::stalls::Stalls,
    /// Replacements for `max_memory` take turns (`memory::MemoryTurns`).
    memory_turns: memory::MemoryTurns,
    /// When a worker last started early because none of the app served (`scout`).
    last_scout: Mutex<Option<Instant>>,
    /// Starts a health probe's connection as an HTTP/2 stream, for specs whose workers
    /// speak only HTTP/2 (`AppSpec::h2c`); `None`: such specs are refused.
    pub http2_probe: Option<Arc<dyn WrapProbe>>,
    /// Where the first worker to serve listened (`Supervisor::first_listen`).
    pub first_listen: Arc<FirstListenCell>,
    /// The ports a Node app's workers listen on after their first, which they share
    /// as under Node's cluster module (`drover_node::SharedPorts`).
    pub shared_ports: drover_node::SharedPorts,
    /// socket.io's cluster adapter messages between the app's workers
    /// (`drover_node::Relay`).
    pub relay: drover_node::Relay,
    /// Brings the workers' CPU reads back to their fast pace when the app gets work
    /// after idling (see `cpu_watch`).
    cpu_wake: Arc<CpuWake>,
    /// Old processes of a rolling reload that drain in the background while the reload
    /// goes on to the next worker (see `Retiree`). Locked briefly, never across an await.
    retiring: Mutex<Vec<JoinHandle<()>>>,
}

/// One slot, locked: all of an app's slots share a lock (they are touched rarely and
/// briefly), and this reads as the slot itself.
pub(crate) struct SlotGuard<'a> {
    slots: MutexGuard<'a, Vec<WorkerSlot>>,
    id: usize,
}

impl Deref for SlotGuard<'_> {
    type Target = WorkerSlot;
    fn deref(&self) -> &WorkerSlot {
        &self.slots[self.id]
    }
}

impl DerefMut for SlotGuard<'_> {
    fn deref_mut(&mut self) -> &mut WorkerSlot {
        &mut self.slots[self.id]
    }
}

/// Asks a serving slot to replace its process with one of the current generation.
/// The answer is `Ok` once the slot runs the current generation (or will, on its next
/// start), `Err` with the reason when the replacement never became ready; the old
/// process then still serves.
pub(crate) type ReplaceRequest = oneshot::Sender<Result<(), ReplaceError>>;

/// Why a worker's process was not replaced (rolling reload); the old process, if it
/// still runs, serves on.
#[derive(Debug)]
pub enum ReplaceError {
    /// The replacement process could not be spawned.
    SpawnFailed(std::io::Error),
    /// The replacement exited before it was ready.
    ExitedEarly(ExitStatus),
    /// Waiting for the replacement failed.
    LostTrack(std::io::Error),
    /// The replacement did not become ready within `ready_timeout`.
    NotReady(health::NotReady),
    /// drover began shutting down during the replacement.
    ShutdownBegan,
    /// The slot's task is gone, so nothing can be replaced.
    TaskEnded,
    /// The slot's task ended before it answered.
    TaskEndedDuringReload,
}

impl fmt::Display for ReplaceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReplaceError::SpawnFailed(e) => write!(f, "replacement failed to start: {e}"),
            ReplaceError::ExitedEarly(s) => {
                write!(f, "replacement exited with {s} before it was ready")
            }
            ReplaceError::LostTrack(e) => write!(f, "lost track of the replacement: {e}"),
            ReplaceError::NotReady(e) => fmt::Display::fmt(e, f),
            ReplaceError::ShutdownBegan => f.write_str("shutdown began"),
            ReplaceError::TaskEnded => f.write_str("the worker's task has ended"),
            ReplaceError::TaskEndedDuringReload => {
                f.write_str("the worker's task ended during the reload")
            }
        }
    }
}

impl std::error::Error for ReplaceError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ReplaceError::SpawnFailed(e) | ReplaceError::LostTrack(e) => Some(e),
            // Transparent: its message is this one's.
            ReplaceError::NotReady(e) => e.source(),
            _ => None,
        }
    }
}

/// A slot's live state; `WorkerStatus` is built from it on demand.
#[derive(Debug)]
pub(crate) struct WorkerSlot {
    pub pid: Option<u32>,
    /// The app's process below a runner, once found (`Proc::find_app`).
    pub app_pid: Option<u32>,
    pub port: Option<u16>,
    pub state: WorkerState,
    pub restarts: u32,
    pub crash_streak: u32,
    pub spawned: Option<Instant>,
    /// When its current process became ready (`scout`: has the app recovered?).
    pub ready_at: Option<Instant>,
    pub last_exit: Option<String>,
    /// From the last restart record: its reason, exit code and signal.
    pub last_reason: Option<RestartReason>,
    pub last_exit_code: Option<i32>,
    pub last_signal: Option<i32>,
    pub restart_counts: RestartCounts,
    /// Wall-clock spawn time of the current process.
    pub started_at: Option<SystemTime>,
    /// The address this slot put in the pool, so shutdown can take it out at once.
    pub in_pool: Option<SocketAddr>,
    /// The endpoint it served at, once shutdown took it out of the pool: the streams
    /// drover still relays to it are ended for it after its SIGTERM (`shutdown_proc`).
    pub left_for_shutdown: Option<Arc<drover_balance::Endpoint>>,
    /// Shared mode: its process serves, so the program may place connections on its
    /// socket (the counterpart of `in_pool`).
    pub placed: bool,
    /// `scale` is retiring this slot: its stop is a scale-down, not drover's shutdown.
    pub retiring: bool,
    /// The app's health-restart permit, from a health kill until this slot's next
    /// process is ready (see `Shared::health_restarts`).
    pub health_permit: Option<OwnedSemaphorePermit>,
    /// Its last process ended by itself, or could not start, before it was ready; until
    /// one of its processes is ready (see `AppState::note_failed_starts`).
    pub start_failed: bool,
}

impl WorkerSlot {
    pub(crate) fn new() -> WorkerSlot {
        WorkerSlot {
            pid: None,
            app_pid: None,
            port: None,
            state: WorkerState::Starting,
            restarts: 0,
            crash_streak: 0,
            spawned: None,
            ready_at: None,
            last_exit: None,
            last_reason: None,
            last_exit_code: None,
            last_signal: None,
            restart_counts: RestartCounts::default(),
            started_at: None,
            in_pool: None,
            left_for_shutdown: None,
            placed: false,
            retiring: false,
            health_permit: None,
            start_failed: false,
        }
    }

    pub(crate) fn status(&self, app: &str, id: usize) -> WorkerStatus {
        WorkerStatus {
            app: app.to_string(),
            id,
            pid: self.pid,
            app_pid: self.app_pid,
            port: self.port,
            state: self.state,
            restarts: self.restarts,
            crash_streak: self.crash_streak,
            uptime: self.spawned.map(|t| t.elapsed()),
            last_exit: self.last_exit.clone(),
            last_reason: self.last_reason,
            last_exit_code: self.last_exit_code,
            last_signal: self.last_signal,
            restarts_by_reason: self.restart_counts,
            started_at: self.started_at,
            cpu_seconds: None,
            rss_bytes: None,
            in_flight: None,
            clients: None,
        }
    }
}

impl AppState {
    pub(crate) fn new(
        spec: AppSpec,
        pool: Arc<Pool>,
        sink: LineSink,
        steer: Option<Steering>,
        http2_probe: Option<Arc<dyn WrapProbe>>,
    ) -> AppState {
        AppState {
            app: Arc::from(spec.name.as_str()),
            slots: Mutex::new(
                (0..spec.workers.resolve())
                    .map(|_| WorkerSlot::new())
                    .collect(),
            ),
            pool,
            sink,
            steer,
            current: Mutex::new((Arc::new(spec), 0)),
            history: RestartHistory::default(),
            health_restarts: Arc::new(Semaphore::new(1)),
            stalls: crate::stalls::Stalls::default(),
            memory_turns: memory::MemoryTurns::new(),
            last_scout: Mutex::new(None),
            http2_probe,
            first_listen: Arc::new(FirstListenCell::new()),
            shared_ports: drover_node::SharedPorts::new(),
            relay: drover_node::Relay::default(),
            cpu_wake: Arc::default(),
            retiring: Mutex::default(),
        }
    }

    /// Drains and stops `retiree` (a worker's old process, replaced by a reload) in a
    /// task of its own, so the reload goes on to the next worker.
    fn retire_in_background(self: &Arc<Self>, id: usize, retiree: Box<Retiree>) {
        let shared = Arc::clone(self);
        let task = tokio::spawn(async move { retire(&shared, id, retiree).await });
        let mut retiring = self.retiring.lock().unwrap_or_else(|e| e.into_inner());
        retiring.retain(|t| !t.is_finished());
        retiring.push(task);
    }

    /// Returns once every old process retiring in the background has stopped.
    pub(crate) async fn retired(&self) {
        loop {
            let tasks =
                std::mem::take(&mut *self.retiring.lock().unwrap_or_else(|e| e.into_inner()));
            if tasks.is_empty() {
                return;
            }
            for task in tasks {
                if let Err(e) = task.await {
                    tracing::error!(app = %self.app, "retiring a worker failed: {e}");
                }
            }
        }
    }

    /// How each health probe of a worker of `spec` starts its connection.
    pub(crate) fn probing(&self, spec: &AppSpec) -> Probing {
        Probing {
            preamble: Arc::from(&[][..]),
            wrap: self.http2_probe.clone().filter(|_| spec.h2c),
        }
    }

    /// The app's last restart records, oldest first.
    pub(crate) fn restart_history(&self) -> Vec<RestartRecord> {
        self.history.records()
    }

    /// Keeps `record` in the history and counts it in its slot.
    fn keep_record(&self, record: RestartRecord) {
        {
            let mut slot = self.slot(record.worker);
            slot.restart_counts.add(record.reason);
            slot.last_reason = Some(record.reason);
            slot.last_exit_code = record.exit_code;
            slot.last_signal = record.signal;
            // Every end, as the two fields above: a reload's or a scale's too, so the
            // line never shows an older crash beside a newer exit code.
            if let Some(exit) = record.exit_text() {
                slot.last_exit = Some(exit);
            }
        }
        tracing::debug!(app = %self.app, worker = record.worker, pid = %output::ShownPid(record.pid),
            reason = %record.reason, "restart recorded");
        self.history.push(record);
    }

    /// Records a process that could not even be spawned.
    fn record_spawn_failure(&self, id: usize, error: &std::io::Error) {
        self.keep_record(RestartRecord {
            at: SystemTime::now(),
            app: self.app.to_string(),
            worker: id,
            pid: None,
            reason: RestartReason::StartFailed,
            detail: Some(format!("failed to start: {error}")),
            exit_code: None,
            signal: None,
            uptime: None,
            rss_bytes: None,
            cpu_seconds: None,
            stderr_tail: Vec::new(),
        });
    }

    /// Marks slot `id` as being retired by `scale`, before its stop is sent.
    pub(crate) fn mark_retiring(&self, id: usize) {
        self.slot(id).retiring = true;
    }

    /// Slot `id`, locked. Panics if there is no such slot: a slot's task only ever
    /// asks for its own, and a slot is removed only after its task has ended.
    pub(crate) fn slot(&self, id: usize) -> SlotGuard<'_> {
        let slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        assert!(id < slots.len(), "no worker slot {id}");
        SlotGuard { slots, id }
    }

    pub(crate) fn slot_count(&self) -> usize {
        self.slots.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Adds a slot at the end; returns its id.
    pub(crate) fn add_slot(&self) -> usize {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        slots.push(WorkerSlot::new());
        slots.len() - 1
    }

    /// Every slot's status and pool address, read under one lock.
    pub(crate) fn statuses(&self) -> Vec<(WorkerStatus, Option<SocketAddr>)> {
        let slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        slots
            .iter()
            .enumerate()
            .map(|(id, slot)| (slot.status(&self.app, id), slot.in_pool))
            .collect()
    }

    /// Records a new worker count in the current spec, without starting a new
    /// generation: the running workers are as current as before.
    pub(crate) fn set_workers(&self, workers: usize) {
        let mut cur = self.current.lock().unwrap_or_else(|e| e.into_inner());
        let mut spec = (*cur.0).clone();
        spec.workers = Workers::Count(workers);
        cur.0 = Arc::new(spec);
    }

    /// Removes the last slot, whose task has ended.
    pub(crate) fn remove_last_slot(&self) {
        self.slots.lock().unwrap_or_else(|e| e.into_inner()).pop();
        self.note_failed_starts();
    }

    /// The spec new processes start from, with its generation.
    pub(crate) fn current(&self) -> (Arc<AppSpec>, u64) {
        let cur = self.current.lock().unwrap_or_else(|e| e.into_inner());
        (Arc::clone(&cur.0), cur.1)
    }

    /// Makes `spec` the one new processes start from, as a new generation.
    pub(crate) fn set_spec(&self, spec: Arc<AppSpec>) {
        let mut cur = self.current.lock().unwrap_or_else(|e| e.into_inner());
        *cur = (spec, cur.1 + 1);
    }

    /// Shows a serving slot as busy (probes unanswered, requests completing) or ready.
    fn show_serving(&self, id: usize, state: WorkerState) {
        let mut slot = self.slot(id);
        if slot.state.is_serving() && slot.state != state {
            slot.state = state;
        }
    }

    /// Shared mode: re-weights where new connections go from what the slots do now
    /// (see `steer`). Called every `STEER_PERIOD`, and at once when a slot starts or
    /// stops serving, so a dead worker's socket is named in the program as briefly as
    /// possible. Answers whether the workers are busy (see `Steering::look`).
    pub(crate) fn steer(&self) -> bool {
        let Some(steer) = &self.steer else {
            return false;
        };
        let slots: Vec<SlotState> = self
            .slots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|s| SlotState {
                pid: s.pid,
                serving: s.placed && s.state.is_serving() && !s.retiring,
            })
            .collect();
        match steer.look(&slots) {
            Ok(active) => active,
            Err(e) => {
                // The program attached before keeps placing connections; nothing is lost.
                tracing::warn!(app = %self.app, "shared mode: cannot re-weight the workers' sockets: {e}");
                true
            }
        }
    }

    /// Whether slot `id`, in back-off since `crashed_at`, starts now (`scout`).
    fn starts_early(
        &self,
        id: usize,
        crashed_at: Instant,
        min_uptime: Duration,
    ) -> Option<scout::Early> {
        let slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let others = slots
            .iter()
            .enumerate()
            .filter(move |(i, _)| *i != id)
            .map(|(_, s)| scout::Other {
                state: s.state,
                ready_at: s.ready_at,
            });
        let mut last = self.last_scout.lock().unwrap_or_else(|e| e.into_inner());
        scout::start_early(others, crashed_at, min_uptime, &mut last, Instant::now())
    }

    /// Shared mode: whether a slot other than `id` has a process that serves.
    fn others_placed(&self, id: usize) -> bool {
        let slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        slots
            .iter()
            .enumerate()
            .any(|(i, s)| i != id && s.placed && s.state.is_serving() && !s.retiring)
    }

    /// Tells the pool whether each of the app's workers failed its last start, so
    /// requests stop waiting for workers while none is on its way (see
    /// `Pool::set_members_failing`). A worker that is starting again after such an
    /// exit still counts as failing until it is ready: an app that fails at boot does
    /// so at each start, and its clients should not wait 30 s each to be told, where
    /// nginx in front of it answers 502 at once. But one whose process listens is on
    /// its way: a program that binds a fixed port of its own (see `fixed_port`) starts
    /// again after its serving copy died, and the copies that fail to bind the port
    /// meanwhile say nothing of it (its clients were told 502 while it came up).
    pub(crate) fn note_failed_starts(&self) {
        let (all_failed, starting) = {
            let slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
            let mut serving = slots.iter().filter(|s| !s.retiring).peekable();
            let starting: Vec<u32> = slots
                .iter()
                .filter(|s| s.state == WorkerState::Starting)
                .filter_map(|s| s.pid)
                .collect();
            (
                serving.peek().is_some() && serving.all(|s| s.start_failed),
                starting,
            )
        };
        // Each worker leads its own process group. Looked at only when all failed.
        let failing = all_failed && !starting.into_iter().any(crate::listening::group_listens);
        if !self.pool.set_members_failing(failing) {
            return;
        }
        if failing {
            tracing::warn!(
                app = %self.app,
                "every worker of app \"{}\" exited before it was ready (`drover ctl restarts` \
                 shows why); requests that reach drover for it are answered 503 \
                 workers-not-starting at once, not queued, until one is (drover keeps starting \
                 them; a port that follows the app's listen() opens once a worker has listened)",
                self.app,
            );
        } else {
            tracing::info!(
                app = %self.app,
                "a worker of app \"{}\" is ready: requests wait for workers again while none \
                 is free",
                self.app,
            );
        }
    }

    /// `leave_pool` at shutdown: the endpoint is kept for the worker's stop
    /// (`left_for_shutdown`).
    pub(crate) fn leave_pool_for_shutdown(&self, id: usize) {
        let addr = self.slot(id).in_pool;
        let endpoint = addr.and_then(|a| self.pool.find(a));
        self.leave_pool(id);
        self.slot(id).left_for_shutdown = endpoint;
    }

    /// Takes a slot's endpoint out of the pool, if it has one there.
    pub(crate) fn leave_pool(&self, id: usize) {
        let (addr, placed) = {
            let mut slot = self.slot(id);
            (slot.in_pool.take(), std::mem::take(&mut slot.placed))
        };
        if let Some(addr) = addr {
            self.pool.remove(Source::Supervisor, addr);
        }
        if placed {
            // At once, not at the next look: a connection placed on a dead worker's
            // socket waits for its successor.
            let _ = self.steer();
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
    /// drover killed it: it failed its health checks, or was lost track of.
    Killed(String),
    /// drover stopped it: it was not ready within its time (`ready_patience`).
    NotReady(String),
    /// It could not be started (no such program, no free port, ...).
    NotStarted(std::io::Error),
    /// Shutdown: do not restart.
    Shutdown,
}

impl fmt::Display for End {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            End::Exited(status) => write!(f, "exited with {status}"),
            End::Killed(reason) | End::NotReady(reason) => write!(f, "was stopped: {reason}"),
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

/// One running worker process.
struct Proc {
    /// The process and the group it leads.
    worker: process::Worker,
    pid: Option<u32>,
    /// Proxy mode: its own port, held so no other worker of drover gets it meanwhile.
    port: Option<Port>,
    spec: Arc<AppSpec>,
    generation: u64,
    spawned: Instant,
    started_at: SystemTime,
    /// Its last stderr lines, fed by the stderr forwarding task `stderr_done`.
    stderr_tail: Arc<StderrTail>,
    stderr_done: Option<JoinHandle<()>>,
    /// Last sampled RSS and CPU time: a process that has exited can no longer be read.
    last_rss: Option<u64>,
    last_cpu_seconds: Option<f64>,
    /// Proxy mode: drover as its Node cluster primary (idle for other programs).
    node_session: Option<NodeSession>,
    /// The Node process below it that runs the app, when that is not the process drover
    /// started: `npm start`, `tsx app.ts`, `sh -c 'node app.js'` (see `find_app`).
    app_below: Option<u32>,
    /// Where it serves instead of its `PORT`: a program that binds a fixed port of its
    /// own, taken up while it started (see `fixed_port`).
    fixed_port: Arc<OnceLock<SocketAddr>>,
}

impl Proc {
    /// Where the balancer reaches it: its `PORT`, or the fixed port it binds instead;
    /// `None` in shared mode.
    fn addr(&self) -> Option<SocketAddr> {
        let own = self.port.as_ref().map(Port::addr)?;
        Some(self.fixed_port.get().copied().unwrap_or(own))
    }

    /// Why it never became ready, when neither the program listened on its PORT nor a
    /// Node app asked drover to serve it: the usual cause of a worker that is not ready
    /// in time. A Node app whose only server listened on port 0 is told so: the port it
    /// printed works, but drover routes no client there.
    fn never_listened(&self) -> Option<String> {
        let port = self.port.as_ref()?.get();
        let listened = self
            .node_session
            .as_ref()
            .is_some_and(|s| s.listened.load(std::sync::atomic::Ordering::Relaxed))
            || std::net::TcpStream::connect(self.port.as_ref()?.addr()).is_ok();
        if listened {
            return None;
        }
        // drover's preload runs in a Node app (it says so before the app's code runs).
        let Some(session) = self
            .node_session
            .as_ref()
            .filter(|s| s.inbox.can_give_back())
        else {
            return Some(self.never_listened_not_node(port));
        };
        Some(
            match session.own_port.load(std::sync::atomic::Ordering::Relaxed) {
                0 if session.inbox.asked_primary() => format!(
                    "it never listened on its PORT ({port}) nor on a port of its own: it \
                     asked Node's cluster module whether it is the primary \
                     (cluster.isPrimary or isMaster), and as drover's worker it is not. An \
                     app whose own primary listens and passes connections to its workers \
                     by code of its own (@socket.io/sticky's are served as they are) runs \
                     as one process with --mode background (mode = \"background\"; PM2's \
                     fork mode), which starts its primary as `node app.js` does; or leave \
                     out its primary, and drover's workers serve the app (drover keeps \
                     each socket.io session on its worker)"
                ),
                0 => format!(
                    "it never listened on its PORT ({port}); a Node app may listen on any \
                     port, any other program must listen on $PORT or take {{port}} in its \
                     arguments; an app that serves no port (a queue consumer, a scheduler) \
                     runs with mode = \"background\" (--mode background)"
                ),
                own => format!(
                    "it never listened on its PORT ({port}): its server listened on port 0 \
                     and got port {own} of its own, which drover leaves to the app (a helper \
                     server); drover routes the first fixed port a worker listens on, so \
                     listen on a port number (any: drover routes it) or on $PORT"
                ),
            },
        )
    }

    /// `never_listened` for a program that is not Node: where it listens instead, when
    /// it does (`app.run(port=5000)`, `ListenAndServe(":8080")`: one worker binds the
    /// port and serves there, past drover, and every other one fails to bind it), and
    /// how to give it its port. Before, the log said only that it was not ready in time,
    /// and that the next start gets longer, as if it were slow.
    fn never_listened_not_node(&self, port: u16) -> String {
        let own: Vec<String> = self
            .pid
            .map(crate::listening::group_listening_addrs)
            .unwrap_or_default()
            .iter()
            .map(SocketAddr::to_string)
            .collect();
        let instead = if own.is_empty() {
            String::new()
        } else {
            format!(
                ", it listens on {} instead, a port of its own, which every worker's copy \
                 binds (all but one fail); drover sends clients to a port of the \
                 program's own once it is the one port a worker listens on, for a second",
                own.join(", ")
            )
        };
        format!(
            "it never listened on its PORT ({port}){instead}; have it listen on $PORT, or \
             put {{port}} in its arguments (drover run -- python3 app.py --port {{port}}); \
             a program that serves no port (a queue consumer) runs with --mode background"
        )
    }

    /// Notes the process its app runs in, once drover's preload there has said (it
    /// does before the app's code runs, so before the worker is ready). Below a runner,
    /// npm's or tsx's main thread is idle while the app's is saturated: drover reads the
    /// app's CPU and memory, and sees it exit. Only a process in the worker's own group
    /// is taken: one that left it is not the worker's to judge.
    fn find_app(&mut self) {
        if self.app_below.is_some() {
            return;
        }
        let (Some(own), Some(said)) = (
            self.pid,
            self.node_session.as_ref().and_then(|s| s.inbox.app_pid()),
        ) else {
            return;
        };
        if said != own && cpu::process_group(said) == Some(own) {
            self.app_below = Some(said);
        }
    }

    /// The process whose main thread serves: the app's (`find_app`), or the worker's.
    fn app_pid(&self) -> Option<u32> {
        self.app_below.or(self.pid)
    }

    /// Why it must be stopped when the app's own process below a runner has ended while
    /// the runner lives on (`tsx watch` starts the app again in a process that cannot
    /// rejoin drover's channel; a script may go on): the worker would hold its port and
    /// answer nothing.
    fn app_ended(&self) -> Option<String> {
        // Each worker leads its own process group, where `find_app` found the app.
        let group = self.pid?;
        let app = self
            .app_below
            .filter(|&app| cpu::has_left_group(app, group))?;
        Some(format!(
            "its app's Node process (pid {app}) ended while the program drover started (pid \
             {}) kept running (a watch mode starting it again, or a runner waiting for a \
             change): the app's process is the worker, so drover restarts it",
            self.pid.map_or_else(|| "-".to_string(), |p| p.to_string()),
        ))
    }

    /// Reads its RSS and CPU time now (the app's process, see `find_app`); returns the
    /// RSS just read. A reading that fails (it has exited; a zombie has no RSS) keeps the
    /// previous one for the record.
    fn sample(&mut self) -> Option<u64> {
        let pid = self.app_pid()?;
        let rss = memory::rss_bytes(pid);
        if rss.is_some() {
            self.last_rss = rss;
        }
        if let Some(cpu) = cpu::process_cpu_seconds(pid) {
            self.last_cpu_seconds = Some(cpu);
        }
        rss
    }

    /// Its restart record, once it has ended (`status`, when known) and drover has
    /// stopped its group. Waits (briefly) for its stderr to reach EOF, so the lines it
    /// wrote just before dying are in the record.
    async fn record(
        &mut self,
        app: &str,
        id: usize,
        reason: RestartReason,
        detail: Option<String>,
        status: Option<ExitStatus>,
    ) -> RestartRecord {
        let uptime = self.spawned.elapsed();
        if let Some(done) = self.stderr_done.take() {
            let _ = tokio::time::timeout(STDERR_EOF_WAIT, done).await;
        }
        RestartRecord {
            at: SystemTime::now(),
            app: app.to_string(),
            worker: id,
            pid: self.pid,
            reason,
            detail,
            exit_code: None,
            signal: None,
            uptime: Some(uptime),
            rss_bytes: self.last_rss,
            cpu_seconds: self.last_cpu_seconds,
            stderr_tail: self.stderr_tail.lines(),
        }
        .with_status(status)
    }
}

impl AppState {
    /// Records how `proc` ended (see `Proc::record`).
    async fn record_end(
        &self,
        id: usize,
        proc: &mut Proc,
        reason: RestartReason,
        detail: Option<String>,
        status: Option<ExitStatus>,
    ) {
        let record = proc.record(&self.app, id, reason, detail, status).await;
        self.keep_record(record);
    }

    /// Records a process that ended by itself (`status` from waiting for it).
    async fn record_exit(
        &self,
        id: usize,
        proc: &mut Proc,
        status: &std::io::Result<ExitStatus>,
        detail: Option<String>,
    ) {
        match status {
            Ok(s) => {
                self.record_end(id, proc, RestartReason::of_exit(*s), detail, Some(*s))
                    .await
            }
            Err(e) => {
                let detail = Some(format!("lost track of the process: {e}"));
                self.record_end(id, proc, RestartReason::Lost, detail, None)
                    .await
            }
        }
    }

    /// After a stop that was not drover's shutdown's: a scale-down retired the slot.
    async fn record_if_retired(&self, id: usize, proc: &mut Proc, status: Option<ExitStatus>) {
        if self.slot(id).retiring {
            let detail = Some("the app was scaled down".to_string());
            self.record_end(id, proc, RestartReason::Scale, detail, status)
                .await;
        }
    }
}

/// Starts a process of the current spec for slot `id`; it is not ready yet.
fn spawn(shared: &AppState, id: usize) -> std::io::Result<Proc> {
    let (spec, generation) = shared.current();
    let socket = match &shared.steer {
        Some(steer) => Some(steer.socket(id)?),
        None => None,
    };
    let (port, listen) = match &socket {
        Some(socket) => (None, Listen::Socket(socket)),
        None if spec.mode == Mode::Background => (None, Listen::Nothing),
        None => {
            let mut port = Port::pick(spec.worker_ports)?;
            // Node's listen() asks drover, which binds the port (seconds later under a
            // runner) with SO_REUSEADDR; any other program binds it itself.
            if !spec.runs_in_node() {
                port.release_hold();
            }
            let listen = Listen::Port(port.get(), shared.shared_ports.unix_sockets());
            (Some(port), listen)
        }
    };
    let mut worker = process::spawn(&spec, id, listen)?;
    let node_session = match (worker.node_channel.take(), &port) {
        (Some(channel), Some(port)) => Some(node_session(shared, id, channel, port, &spec)?),
        _ => None,
    };
    let stderr_tail = Arc::new(StderrTail::default());
    let stderr_done = forward_output(shared, id, &mut worker.child, &stderr_tail);
    let pid = worker.pid();
    tracing::debug!(app = %spec.name, worker = id, ?pid, port = port.as_ref().map(Port::get), "worker spawned");
    Ok(Proc {
        worker,
        pid,
        port,
        spec,
        generation,
        spawned: Instant::now(),
        started_at: SystemTime::now(),
        stderr_tail,
        stderr_done,
        last_rss: None,
        last_cpu_seconds: None,
        node_session,
        app_below: None,
        fixed_port: Arc::new(OnceLock::new()),
    })
}

/// What a starting worker's readiness waits on (see `ready_for_clients`).
struct ReadyWait {
    addr: Option<SocketAddr>,
    spec: Arc<AppSpec>,
    /// Whether the app has sent `process.send('ready')`; `None` without a cluster
    /// channel.
    app_ready: Option<watch::Receiver<bool>>,
    spawned: Instant,
    /// The app's pool: whether another worker serves while this one warms up.
    pool: Arc<Pool>,
    app: Arc<str>,
    id: usize,
    /// Proxy mode: where else it may serve (a fixed port of its own).
    fixed_port: Option<FixedPortLook>,
}

impl Proc {
    fn ready_wait(&self, shared: &AppState, id: usize) -> ReadyWait {
        ReadyWait {
            fixed_port: self
                .port
                .as_ref()
                .zip(self.pid)
                .map(|(port, group)| FixedPortLook {
                    group,
                    own_port: port.get(),
                    node: self.node_session.as_ref().map(|s| s.inbox.clone()),
                    found: Arc::clone(&self.fixed_port),
                }),
            addr: self.addr(),
            spec: Arc::clone(&self.spec),
            app_ready: self.node_session.as_ref().map(|s| s.app_ready.clone()),
            spawned: self.spawned,
            pool: Arc::clone(&shared.pool),
            app: Arc::clone(&shared.app),
            id,
        }
    }
}

/// What tells a starting Node worker that has not listened from a hung one (see
/// `ready_unless_hung`).
struct Starting {
    inbox: drover_node::Inbox,
    /// The app's server is served at the worker's port.
    listened: Arc<std::sync::atomic::AtomicBool>,
    /// The port its first `listen(0)` got: it has started, on a port drover leaves
    /// alone (see `Proc::never_listened`).
    own_port: Arc<std::sync::atomic::AtomicU16>,
}

impl Proc {
    /// `None` for a worker with no cluster channel (not Node, shared or background
    /// mode): drover cannot ask its event loop.
    fn starting(&self) -> Option<Starting> {
        let session = self.node_session.as_ref()?;
        Some(Starting {
            inbox: session.inbox.clone(),
            listened: Arc::clone(&session.listened),
            own_port: Arc::clone(&session.own_port),
        })
    }
}

impl Starting {
    /// Whether the app has not listened yet, and its event loop answers drover's ping
    /// within `EVENT_LOOP_ANSWER` (only with drover's preload, which answers it). Not
    /// one that asked whether it is the cluster's primary: its worker branch may wait
    /// for connections from a primary of its own, which never come, and its record
    /// says so at the first timeout (`Proc::never_listened`).
    async fn waits_for_something(&self) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        if self.listened.load(Relaxed)
            || self.own_port.load(Relaxed) != 0
            || self.inbox.asked_primary()
        {
            return false;
        }
        let asked = Instant::now();
        self.inbox.ping();
        while asked.elapsed() < EVENT_LOOP_ANSWER {
            tokio::time::sleep(Duration::from_millis(20)).await;
            if self.inbox.event_loop_answered_since(asked) {
                // It may have listened meanwhile: then readiness decides at once.
                return true;
            }
        }
        false
    }
}

/// How long a starting worker's event loop has to answer drover's ping. A loop that
/// turns answers within milliseconds; one busy with a synchronous step of its start
/// (a require of a large bundle) may take a while.
const EVENT_LOOP_ANSWER: Duration = Duration::from_secs(2);

/// `ready_for_clients` for a worker's start (or restart), within `patience`. A Node
/// worker that has not listened when that runs out, but whose event loop answers
/// drover's ping, is starting, not hung: it waits on a migration, a database slow to
/// answer, a cache to warm. Stopped, it would be started again, its migration run a
/// second time from the start, and it would serve later than if left alone (an app
/// that listened after 40 s served after 71 s, where PM2 served it after 41 s). So it
/// gets another `ready_timeout` while its loop answers, up to `MAX_READY_DOUBLINGS`'
/// worth in all, as slow starts in a row get. One that spins in a loop, is stopped
/// (SIGSTOP), has no preload, or is not starting (see `Starting::waits_for_something`)
/// is stopped at `patience`, as before.
async fn ready_unless_hung(
    wait: &ReadyWait,
    probing: &Probing,
    patience: Duration,
    starting: Option<&Starting>,
) -> Result<(), health::NotReady> {
    let most = ready_patience(wait.spec.ready_timeout, MAX_READY_DOUBLINGS).max(patience);
    let mut within = patience;
    let mut waited_on = false;
    loop {
        let mut not_ready = match ready_for_clients(wait, probing, within).await {
            Ok(()) => return Ok(()),
            Err(e) => e,
        };
        if waited_on {
            // The time it had in all, not the last extension's.
            not_ready.within = Duration::from_secs(wait.spawned.elapsed().as_secs());
        }
        let Some(starting) = starting.filter(|_| wait.spawned.elapsed() < most) else {
            return Err(not_ready);
        };
        if !starting.waits_for_something().await {
            return Err(not_ready);
        }
        let waited = wait.spawned.elapsed();
        within = wait.spec.ready_timeout.min(most.saturating_sub(waited));
        if within.is_zero() {
            return Err(not_ready);
        }
        if !waited_on {
            tracing::warn!(
                app = %wait.app,
                worker = wait.id,
                "worker {}/{} has not listened after {:?}, but its event loop answers: it \
                 is starting, not hung (a migration, a database slow to answer), so drover \
                 waits for it, up to {most:?} in all while its event loop answers (drover \
                 run --ready-timeout or ready_timeout in drover.toml sets it)",
                wait.app,
                wait.id,
                Duration::from_secs(waited.as_secs()),
            );
        }
        waited_on = true;
    }
}

/// Readiness at the worker's `PORT`, or, for a program that listens on a fixed port of
/// its own instead, there (see `fixed_port`), within `within`.
async fn ready_here_or_at_fixed_port(
    wait: &ReadyWait,
    probing: &Probing,
    within: Duration,
) -> Result<(), health::NotReady> {
    let spec = &wait.spec;
    let here = health::wait_ready_at(wait.addr, spec.health.as_ref(), probing, within, spec.mode);
    let Some(look) = &wait.fixed_port else {
        return here.await;
    };
    let began = Instant::now();
    let at = tokio::select! {
        biased;
        r = here => return r,
        at = look.adopted() => at,
    };
    let (app, id, port) = (&wait.app, wait.id, look.own_port);
    tracing::warn!(
        app = %app, worker = id,
        "worker {app}/{id} listens on {at}, not on its PORT ({port}): the program names a port of its own (Sinatra's set :port, Puma's 9292, a port in its arguments), so drover sends its clients there. Every copy of the program binds that one port, so one worker serves and the others cannot start; to run more, have it listen on $PORT, or put {{port}} in its arguments (drover run -- ruby app.rb -p {{port}})",
    );
    let left = within.saturating_sub(began.elapsed());
    health::wait_ready_at(Some(at), spec.health.as_ref(), probing, left, spec.mode).await
}

/// How long a worker that listens but has not sent 'ready' (`wait_ready`) is held back
/// while no other worker of its app serves: PM2's own wait for the message
/// (`GRACEFUL_LISTEN_TIMEOUT`). Holding the app's only capacity for all of
/// `ready_timeout` would make a `wait_ready` its code never answers an outage at every
/// cold start and after every crash of all workers; while others serve, waiting costs
/// no client anything.
const LONE_READY_GRACE: Duration = Duration::from_secs(3);

/// Readiness (`health::wait_ready_at`, within `within` of the spawn), and then, for an
/// app with `wait_ready`, its `process.send('ready')` within what is left of `within`,
/// or `LONE_READY_GRACE` while no other worker of the app serves. An app that has not
/// sent it by then gets clients anyway, as PM2 serves it after `listen_timeout`, with a
/// warning: the worker listens, and a `wait_ready` its code never answers must not
/// turn into a restart loop or an outage.
async fn ready_for_clients(
    wait: &ReadyWait,
    probing: &Probing,
    within: Duration,
) -> Result<(), health::NotReady> {
    let spec = &wait.spec;
    ready_here_or_at_fixed_port(wait, probing, within).await?;
    let (true, Some(mut said)) = (spec.wait_ready, wait.app_ready.clone()) else {
        return Ok(());
    };
    let (app, id) = (&wait.app, wait.id);
    let listening = Instant::now();
    let deadline = wait.spawned + within;
    loop {
        if *said.borrow_and_update() {
            return Ok(());
        }
        if listening.elapsed() >= LONE_READY_GRACE && wait.pool.endpoints().is_empty() {
            tracing::warn!(
                app = %app, worker = id,
                "worker {app}/{id} listens but has not sent process.send('ready') within {LONE_READY_GRACE:?} (wait_ready), and no other worker of {app} serves: it gets clients now, as under PM2",
            );
            return Ok(());
        }
        if Instant::now() >= deadline {
            tracing::warn!(
                app = %app, worker = id,
                "worker {app}/{id} listens but has not sent process.send('ready') within {within:?} (wait_ready): it gets clients anyway, as under PM2",
            );
            return Ok(());
        }
        // Woken by the message, or every 100 ms to look at the pool and the clock. A
        // closed channel means the worker is going; its exit is the caller's to see.
        let tick = Duration::from_millis(100);
        if let Ok(Err(_)) = tokio::time::timeout(tick, said.changed()).await {
            tokio::time::sleep(tick).await;
        }
    }
}

/// drover as the Node cluster primary of one worker (drover-node): whatever port the
/// app's `listen()` names, its connections arrive at `port`. Ends when the worker's end
/// of the channel closes, or when the `Proc` is dropped.
fn node_session(
    shared: &AppState,
    id: usize,
    channel: std::os::unix::net::UnixStream,
    port: &Port,
    spec: &AppSpec,
) -> std::io::Result<NodeSession> {
    let session = drover_node::Session::new(
        channel,
        port.get(),
        shared.shared_ports.clone(),
        shared.relay.clone(),
    )?
    .balancing(spec.app_port);
    let inbox = session.inbox();
    let app = Arc::clone(&shared.app);
    let pool = Arc::clone(&shared.pool);
    let addr = port.addr();
    let listened = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let listened_here = listened.clone();
    let own_port = Arc::new(std::sync::atomic::AtomicU16::new(0));
    let own_port_here = own_port.clone();
    let takes: Arc<dyn TakesConnections> = Arc::new(NodeInbox(inbox.clone()));
    let first_listen = Arc::clone(&shared.first_listen);
    let (said_ready, app_ready) = watch::channel(false);
    let task = tokio::spawn(async move {
        let report = |event| match event {
            drover_node::SessionEvent::Serving {
                asked,
                address,
                port,
                speaks,
                unix,
                keeps_sessions,
            } => {
                listened_here.store(true, std::sync::atomic::Ordering::Relaxed);
                let seen = FirstListen::of_listen(asked, address, port, speaks, unix);
                if let Some(first) = first_listen.moved(&seen) {
                    // Under PM2 the new code's port serves; drover's clients connect
                    // where the first workers listened, and that address stays.
                    tracing::warn!(
                        app = %app,
                        worker = id,
                        "worker {app}/{id} listens on {} where the app's first workers \
                         listened on {}: drover serves it where clients connect, at the \
                         address it took from the first workers; restart drover to serve \
                         the new port, or give -l ADDR",
                        seen.port_in_words(),
                        first.port_in_words(),
                    );
                }
                first_listen.note(seen);
                // Taken up only by a balancer in handoff mode, and only once this
                // worker is in its pool (ready). Not for an app whose first server is a
                // Unix socket: its worker could not give a TCP client back on a reload
                // (drover's preload gives back the first port's), so a balancer in
                // front of it (`-l`) places each request. Nor for one that keeps
                // socket.io sessions: each of a session's requests must pass the
                // balancer, which sends it to the worker that holds the session.
                if !unix && !keeps_sessions {
                    pool.handoffs().register(addr, Arc::clone(&takes));
                }
                if keeps_sessions && id == 0 {
                    tracing::info!(
                        app = %app,
                        "the app serves socket.io: drover places each of its requests, and \
                         keeps each session's on the worker that holds it"
                    );
                }
                if asked != i64::from(port) && !unix {
                    tracing::info!(
                        app = %app,
                        worker = id,
                        "the app listens on port {asked}; drover serves it at 127.0.0.1:{port} \
                         behind its own listen address"
                    );
                }
            }
            drover_node::SessionEvent::OwnPort { port } => {
                // The first one: what a worker that never becomes ready is told about.
                let _ = own_port_here.compare_exchange(
                    0,
                    port,
                    std::sync::atomic::Ordering::Relaxed,
                    std::sync::atomic::Ordering::Relaxed,
                );
            }
            drover_node::SessionEvent::AlsoServing { place, bound } => {
                // drover's user hears of the place once, from `Supervisor::shared_ports_bound`.
                tracing::debug!(app = %app, worker = id, %place, bound, "the worker listens on a shared place");
            }
            drover_node::SessionEvent::Refused { reason } => {
                tracing::error!(app = %app, worker = id, "the app's listen() failed: {reason}");
            }
            drover_node::SessionEvent::Returned(stream) => pool.handoffs().give_back(stream),
            drover_node::SessionEvent::ServesClients(serves) => {
                if let Some(ep) = pool.find(addr) {
                    if serves {
                        ep.note_handed_connection();
                    } else {
                        ep.serves_no_clients();
                    }
                }
            }
            drover_node::SessionEvent::Served(served) => {
                let served = drover_metrics::ServedByWorker {
                    by_class: served.by_class,
                    durations: served.durations_ns().collect(),
                };
                pool.handoffs().served(&served);
                if let Some(ep) = pool.find(addr) {
                    ep.stats().record_served_by_worker(&served);
                }
            }
            drover_node::SessionEvent::AppReady => {
                said_ready.send_replace(true);
            }
        };
        if let Err(e) = session.run(report).await {
            tracing::debug!(app = %app, worker = id, error = %e, "Node cluster channel ended");
        }
    });
    Ok(NodeSession {
        task,
        listened,
        own_port,
        inbox,
        addr,
        pool: Arc::clone(&shared.pool),
        app_ready,
    })
}

/// drover's handoff (`Pool::hand_off`) gives a Node worker client connections through
/// its session.
struct NodeInbox(drover_node::Inbox);

impl TakesConnections for NodeInbox {
    fn queued(&self) -> usize {
        self.0.queued()
    }

    fn is_stalled(&self) -> bool {
        self.0.is_stalled()
    }

    fn give(&self, stream: std::net::TcpStream) -> Result<(), std::net::TcpStream> {
        self.0.give(stream)
    }

    fn clients(&self) -> Option<usize> {
        self.0.clients()
    }

    fn reclaim(&self) {
        self.0.reclaim()
    }
}

/// A worker's Node session, stopped with its `Proc`: the loopback listener it holds
/// must close when the worker goes, so the balancer sees the port refuse at once.
struct NodeSession {
    task: JoinHandle<()>,
    /// The app's server is served at the worker's port.
    listened: Arc<std::sync::atomic::AtomicBool>,
    /// The port the app's first `listen(0)` got, a socket of its own; 0 while none.
    own_port: Arc<std::sync::atomic::AtomicU16>,
    inbox: drover_node::Inbox,
    addr: SocketAddr,
    pool: Arc<Pool>,
    /// The app has sent `process.send('ready')` (for `wait_ready`).
    app_ready: watch::Receiver<bool>,
}

impl NodeSession {
    /// Whether clients were handed to the worker directly (by the balancer, or on a
    /// port its workers share): drover does not see their requests, so draining it means
    /// asking it to close its servers and waiting until it has (it leaves the channel
    /// once its connections have ended).
    fn serves_clients_directly(&self) -> bool {
        self.inbox.was_given() || self.inbox.shares_ports()
    }
}

impl Drop for NodeSession {
    fn drop(&mut self) {
        self.pool.handoffs().unregister(self.addr);
        self.task.abort();
    }
}

/// Runs slot `id` until shutdown.
pub(crate) async fn run(
    shared: Arc<AppState>,
    id: usize,
    mut stop: watch::Receiver<bool>,
    mut replace: mpsc::UnboundedReceiver<ReplaceRequest>,
) {
    let mut crashes = 0u32;
    // Starts in a row that were not ready in time: each doubles the next one's time.
    let mut slow_starts = 0u32;
    let mut first = true;
    while !is_stopping(&stop) {
        if !first {
            shared.slot(id).restarts += 1;
        }
        first = false;
        let life = run_once(&shared, id, &mut stop, &mut replace, slow_starts).await;
        if matches!(life.end, End::Shutdown) {
            break;
        }
        slow_starts = match life.end {
            End::NotReady(_) => {
                let ready_timeout = shared.current().0.ready_timeout;
                let (had, next) = (
                    ready_patience(ready_timeout, slow_starts),
                    ready_patience(ready_timeout, slow_starts + 1),
                );
                if next > had {
                    tracing::warn!(
                        app = %shared.app,
                        worker = id,
                        "worker {}/{id} was not ready within {had:?}; its next start gets \
                         {next:?} (a slow start is not a failed one: the time doubles after \
                         each start that ran out of it, up to {}x ready_timeout; \
                         drover run --ready-timeout or ready_timeout in drover.toml sets it)",
                        shared.app,
                        1u32 << MAX_READY_DOUBLINGS,
                    );
                }
                slow_starts.saturating_add(1)
            }
            _ => 0,
        };
        let policy = shared.current().0.restart.clone();
        // Whether it lived counts from readiness: a worker that takes 5 s to boot and
        // dies right after is crashing, however long its process existed.
        crashes = if life.served >= policy.min_uptime {
            0
        } else {
            crashes.saturating_add(1)
        };
        let delay = policy.delay(crashes);
        let looping = crashes >= policy.crash_loop_after;
        let gave_up = policy.max_restarts.filter(|&most| crashes > most);
        {
            let mut slot = shared.slot(id);
            slot.start_failed =
                life.served.is_zero() && matches!(life.end, End::Exited(_) | End::NotStarted(_));
            slot.pid = None;
            slot.app_pid = None;
            slot.port = None;
            slot.spawned = None;
            slot.started_at = None;
            slot.crash_streak = crashes;
            slot.last_exit = Some(match &life.end {
                End::Exited(status) => status.to_string(),
                other => other.to_string(),
            });
            slot.state = if gave_up.is_some() {
                WorkerState::Errored
            } else if looping {
                WorkerState::CrashLooping
            } else {
                WorkerState::BackingOff
            };
        }
        shared.note_failed_starts();
        if let Some(most) = gave_up {
            log_end(&shared.app, id, &life, None);
            tracing::error!(
                app = %shared.app,
                worker = id,
                "worker {}/{id} is errored: it crashed {crashes} times in a row (each \
                 before it was ready or within {:?} of it), past max_restarts = {most} \
                 (--max-restarts); \
                 drover starts it no more (drover ctl reload, or a scale, starts it again)",
                shared.app,
                policy.min_uptime,
            );
            // Until drover stops, or a reload or a scale asks for it again.
            tokio::select! {
                _ = stopped(&mut stop) => {}
                Some(reply) = replace.recv() => {
                    crashes = 0;
                    let _ = reply.send(Ok(()));
                }
            }
            continue;
        }
        log_end(&shared.app, id, &life, Some(delay));
        if looping {
            tracing::warn!(
                app = %shared.app,
                worker = id,
                "worker {}/{id} is crash-looping: {crashes} exits in a row before it was \
                 ready or within {:?} of it; next start in {delay:?}{}{}",
                shared.app,
                policy.min_uptime,
                sooner(delay),
                port_taken_hint(&shared.restart_history(), id),
            );
        }
        let backoff = tokio::time::sleep(delay);
        tokio::pin!(backoff);
        // Past `NO_CAPACITY_RETRY`, it looks whether the app recovered, or has nothing
        // that runs and wants it as its scout (see `scout`).
        let crashed_at = Instant::now();
        let mut look = tokio::time::interval_at(
            (crashed_at + scout::NO_CAPACITY_RETRY).into(),
            scout::LOOK_EVERY,
        );
        look.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Shared mode, crash-looping: what was queued on the slot's socket goes to the
        // workers that serve rather than wait out the back-off (see `Steering::rescue`).
        let rescue = async {
            match &shared.steer {
                Some(steer) if delay >= RESCUE_AFTER => {
                    steer.rescue(id, || shared.others_placed(id)).await
                }
                _ => std::future::pending().await,
            }
        };
        tokio::pin!(rescue);
        loop {
            tokio::select! {
                _ = &mut backoff => break,
                _ = look.tick(), if delay > scout::NO_CAPACITY_RETRY => {
                    if let Some(early) = shared.starts_early(id, crashed_at, policy.min_uptime) {
                        log_early_start(&shared.app, id, early);
                        break;
                    }
                }
                _ = &mut rescue => {}
                _ = stopped(&mut stop) => break,
                // Nothing to replace while no process runs; the next one starts from
                // the current spec anyway.
                Some(reply) = replace.recv() => { let _ = reply.send(Ok(())); }
            }
        }
    }
    let mut slot = shared.slot(id);
    slot.state = WorkerState::Stopped;
    slot.health_permit = None;
    slot.pid = None;
    slot.port = None;
    slot.spawned = None;
    slot.started_at = None;
}

/// At most this many doublings of `ready_timeout` for a worker that keeps starting
/// slowly: 16 x, 8 minutes at the default 30 s.
const MAX_READY_DOUBLINGS: u32 = 4;

/// The time a starting worker has to become ready after `slow_starts` starts in a row
/// that ran out of theirs: `ready_timeout`, doubled for each (up to
/// `MAX_READY_DOUBLINGS`).
///
/// Why: an app that takes 35 s to boot (ts-node compiling a large project, a wait for
/// its database) was killed at 30 s and started again, forever, and never served, where
/// PM2 and Node's cluster module run it. Killing a slow start again brings nothing
/// closer; a program that never listens still gets its restart record and its reason
/// at the first `ready_timeout`. A rolling reload or a scale-up keeps `ready_timeout`
/// as it is: there the old workers keep serving, and a new one that is not ready in
/// time fails the change instead.
pub(crate) fn ready_patience(ready_timeout: Duration, slow_starts: u32) -> Duration {
    ready_timeout.saturating_mul(1 << slow_starts.min(MAX_READY_DOUBLINGS))
}

/// When a start `delay` away may come sooner (see `scout`). Said wherever the delay is:
/// a crash-loop warning that said only "next start in 30s" of an app with one worker
/// was never true, as its starts came every second.
fn sooner(delay: Duration) -> &'static str {
    if delay > scout::NO_CAPACITY_RETRY {
        " (sooner while no worker of the app serves: then one starts each second; or once it recovers)"
    } else {
        ""
    }
}

/// Says how a worker ended, and when it starts again: `None`, never (it is errored).
fn log_end(app: &str, id: usize, life: &Life, delay: Option<Duration>) {
    let pid = life.pid.map_or_else(|| "-".to_string(), |p| p.to_string());
    let next = match delay {
        Some(delay) => format!("restarting in {delay:?}{}", sooner(delay)),
        None => "not restarted".to_string(),
    };
    tracing::warn!(
        app = %app,
        worker = id,
        "worker {app}/{id} (pid {pid}) {}; {next}",
        life.end,
    );
}

/// What to say of a crash loop whose last exit said its address was taken: a program
/// that binds a port of its own (`app.run(port=5000)`, `ListenAndServe(":8080")`) runs
/// once, and every other worker fails to bind it. The app's own message ("Address
/// already in use") does not say that its PORT went unread, and drover's said only
/// "crash-looping" (and, 30 s later, that it never listened on its PORT).
fn port_taken_hint(history: &[RestartRecord], id: usize) -> &'static str {
    let said = history
        .iter()
        .rev()
        .find(|r| r.worker == id)
        .is_some_and(|r| {
            r.stderr_tail.iter().any(|line| {
                let line = line.to_ascii_lowercase();
                line.contains("address already in use") || line.contains("eaddrinuse")
            })
        });
    if said {
        " (its output says its address is in use: if the app binds a port of its own, \
         every worker but one fails so; have it listen on $PORT, or on {port} in its \
         arguments: drover run -- python3 app.py --port {port})"
    } else {
        ""
    }
}

fn log_early_start(app: &str, id: usize, early: scout::Early) {
    let why = match early {
        scout::Early::Recovered => "a worker of the app started since serves",
        scout::Early::Scout => "no worker of the app serves or starts (one tries each second)",
    };
    tracing::info!(app = %app, worker = id, "worker {app}/{id} starts before its back-off ends: {why}");
}

/// One process, from spawn to its end (replacements included: a slot's process may be
/// swapped several times within one `run_once`).
async fn run_once(
    shared: &Arc<AppState>,
    id: usize,
    stop: &mut watch::Receiver<bool>,
    replace: &mut mpsc::UnboundedReceiver<ReplaceRequest>,
    slow_starts: u32,
) -> Life {
    // Requests queued while no process ran are already met: this one starts from the
    // current spec.
    while let Ok(reply) = replace.try_recv() {
        let _ = reply.send(Ok(()));
    }
    let mut proc = match spawn(shared, id) {
        Ok(p) => p,
        Err(e) => {
            shared.record_spawn_failure(id, &e);
            return Life {
                end: End::NotStarted(e),
                pid: None,
                served: Duration::ZERO,
            };
        }
    };
    shared.slot(id).started(&proc, WorkerState::Starting);
    let pid = proc.pid;
    let life = |end, served| Life { end, pid, served };

    // Phase 1: wait for readiness, unless the process dies or shutdown comes first.
    let probing = shared.probing(&proc.spec);
    let wait = proc.ready_wait(shared, id);
    let starting = proc.starting();
    let ready = tokio::select! {
        r = ready_unless_hung(
            &wait,
            &probing,
            ready_patience(proc.spec.ready_timeout, slow_starts),
            starting.as_ref(),
        ) => r,
        status = proc.worker.child.wait() => {
            // What it started may still run and hold the port the next one needs.
            proc.worker.stop(proc.spec.stop_timeout).await;
            // A Node script that ends its work without listening (its channel no
            // longer keeps it alive, preload item 15) is told why it is no server, as
            // a worker that never listens in time is. A crash says why itself, in the
            // stderr its record keeps.
            let clean = status.as_ref().is_ok_and(|s| s.success());
            let detail = Some(match proc.never_listened().filter(|_| clean) {
                Some(why) => format!("ended before it was ready: {why}"),
                None => "ended before it was ready".to_string(),
            });
            shared.record_exit(id, &mut proc, &status, detail).await;
            return life(exited(status), Duration::ZERO);
        }
        _ = stopped(stop) => {
            let status = shutdown_proc(shared, id, &mut proc).await;
            shared.record_if_retired(id, &mut proc, status).await;
            return life(End::Shutdown, Duration::ZERO);
        }
    };
    if let Err(reason) = ready {
        proc.sample();
        // The log says why too: a worker that never listened is the usual first
        // experience of an app drover cannot serve as it is. Looked at while it still
        // runs: where it listens instead goes with it.
        let detail = match proc.never_listened() {
            Some(why) => format!("{reason}: {why}"),
            None => reason.to_string(),
        };
        let status = proc.worker.stop(proc.spec.stop_timeout).await;
        shared
            .record_end(
                id,
                &mut proc,
                RestartReason::StartFailed,
                Some(detail.clone()),
                status,
            )
            .await;
        return life(End::NotReady(detail), Duration::ZERO);
    }
    if is_stopping(stop) {
        let status = shutdown_proc(shared, id, &mut proc).await;
        shared.record_if_retired(id, &mut proc, status).await;
        return life(End::Shutdown, Duration::ZERO);
    }
    // Sampled before it is shown ready, so even a worker killed at that moment leaves a
    // restart record with its memory and CPU time.
    proc.sample();
    join_pool(shared, id, &proc);
    tracing::info!(app = %shared.app, worker = id, ?pid, addr = ?proc.addr(), "worker ready");
    serve(shared, id, proc, stop, replace).await
}

/// `Proc::find_app`, and what it found for the slot's status.
fn find_app(shared: &AppState, id: usize, proc: &mut Proc) {
    proc.find_app();
    shared.slot(id).app_pid = proc.app_below;
}

/// Phase 2: serve until the process dies, fails its health checks, or shutdown;
/// replace it gracefully when asked or when it grows past `max_memory`.
async fn serve(
    shared: &Arc<AppState>,
    id: usize,
    mut proc: Proc,
    stop: &mut watch::Receiver<bool>,
    replace: &mut mpsc::UnboundedReceiver<ReplaceRequest>,
) -> Life {
    let mut ready_at = Instant::now();
    find_app(shared, id, &mut proc);
    // Kept across loop turns: recreating it on every event would reset its count of
    // failed checks.
    let mut unhealthy = Box::pin(watch_health(shared, id, &proc));
    // On the grid the CPU reads share, so an idle app's workers, read only here, wake
    // drover once a second in all.
    let mut memory_poll = grid_interval(MEMORY_POLL);
    let mut cpu = CpuWatch::new(Arc::clone(&shared.cpu_wake));
    let mut own_port_looks = OwnPortLooks::new(shared);
    // Its place in the app's line to be replaced for its memory, while over it.
    let mut memory_turn: Option<memory::TurnWait> = None;
    loop {
        let read_slowly = cpu.is_slow();
        let why = tokio::select! {
            status = proc.worker.child.wait() => {
                return after_exit(shared, id, &mut proc, status, ready_at).await;
            }
            health::Unhealthy { reason, hung, stopped, permit } = &mut unhealthy => {
                // drover ends it, so the GETs it holds go to another worker: those that
                // wait behind an endless loop did nothing. The loop's own request, the
                // one it held longest, fails (`WorkerLife::Hung`): sent on, a GET that
                // loops for ever hung the next worker too.
                let life = if hung && !stopped { WorkerLife::Hung } else { WorkerLife::Ended };
                tell_life(shared, &proc, life);
                shared.leave_pool(id);
                {
                    let mut slot = shared.slot(id);
                    slot.state = if hung { WorkerState::Hung } else { WorkerState::Unhealthy };
                    slot.health_permit = Some(permit);
                }
                tracing::warn!(app = %shared.app, worker = id, pid = %output::ShownPid(proc.pid), "worker {}/{id} unhealthy: {reason}", shared.app);
                proc.sample();
                // A hung process finishes nothing and cannot act on a SIGTERM: waiting
                // `stop_timeout` for it only delays its replacement. One that fails its
                // checks but still runs first gives back the clients it serves itself.
                let status = if hung {
                    proc.worker.kill().await
                } else {
                    take_back_clients(proc.node_session.as_ref(), proc.spec.stop_timeout).await;
                    proc.worker.stop(proc.spec.stop_timeout).await
                };
                shared.record_end(id, &mut proc, RestartReason::Health, Some(reason.clone()), status).await;
                return Life { end: End::Killed(reason), pid: proc.pid, served: ready_at.elapsed() };
            }
            _ = stopped(stop) => {
                proc.sample();
                let status = shutdown_proc(shared, id, &mut proc).await;
                shared.record_if_retired(id, &mut proc, status).await;
                return Life { end: End::Shutdown, pid: proc.pid, served: ready_at.elapsed() };
            }
            Some(reply) = replace.recv() => Why::Asked(reply),
            turn = async { memory_turn.as_mut()?.await }, if memory_turn.is_some() => {
                memory_turn = None;
                // A reload may have replaced the process it waited for.
                match (proc.sample(), proc.spec.max_memory) {
                    (Some(rss), Some(max)) if rss > max => Why::Memory(rss, turn),
                    _ => continue,
                }
            }
            _ = cpu.fast_read_due(), if proc.addr().is_some() && !read_slowly => {
                if let Some(pid) = proc.app_pid() {
                    cpu.read_fast(pid, own_endpoint(shared, &proc).as_deref());
                }
                continue;
            }
            _ = shared.cpu_wake.notified(), if read_slowly => {
                cpu.go_fast();
                continue;
            }
            // Every worker is sampled, so its restart record has its last RSS and CPU
            // time; only one with `max_memory` is compared.
            _ = memory_poll.tick() => {
                find_app(shared, id, &mut proc);
                own_port_looks.look(shared, id, &proc, ready_at);
                if let (Some(pid), true) = (proc.app_pid(), proc.addr().is_some()) {
                    cpu.read_slow(pid, own_endpoint(shared, &proc).as_deref());
                }
                if let Some(reason) = proc.app_ended() {
                    // A runner that ends with its app (npm, tsx) does so within moments:
                    // that is its exit, with its own status.
                    let wait = tokio::time::timeout(RUNNER_GRACE, proc.worker.child.wait());
                    if let Ok(status) = wait.await {
                        return after_exit(shared, id, &mut proc, status, ready_at).await;
                    }
                    // Like an exit: what it held may go again, as the app never read it.
                    tell_life(shared, &proc, WorkerLife::Ended);
                    shared.leave_pool(id);
                    proc.sample();
                    let status = proc.worker.stop(proc.spec.stop_timeout).await;
                    shared.record_end(id, &mut proc, RestartReason::Exit, Some(reason.clone()), status).await;
                    return Life { end: End::Killed(reason), pid: proc.pid, served: ready_at.elapsed() };
                }
                // Only a fresh reading counts: an exited process is not over anything.
                match (proc.sample(), proc.spec.max_memory) {
                    (Some(rss), Some(max)) if rss > max => {
                        if !memory::past_overshoot(rss, max) {
                            memory_turn.get_or_insert_with(|| shared.memory_turns.wait());
                            continue;
                        }
                        memory_turn = None;
                        Why::Memory(rss, None)
                    }
                    _ => {
                        memory_turn = None;
                        continue;
                    }
                }
            }
        };
        let (reply, cause, turn) = match why {
            Why::Asked(reply) => {
                if proc.generation == shared.current().1 {
                    let _ = reply.send(Ok(()));
                    continue;
                }
                let cause = (RestartReason::Reload, "rolling reload".to_string());
                (Some(reply), cause, None)
            }
            Why::Memory(rss, turn) => {
                let over = format!(
                    "uses {} MiB, over max_memory {} MiB",
                    rss >> 20,
                    proc.spec.max_memory.unwrap_or(0) >> 20,
                );
                tracing::warn!(
                    app = %shared.app, worker = id, pid = %output::ShownPid(proc.pid),
                    "worker {}/{id} {over}; replacing it", shared.app,
                );
                (None, (RestartReason::Memory, over), turn)
            }
        };
        let reloading = reply.is_some();
        let outcome = replace_proc(shared, id, proc, stop, cause).await;
        let result = match outcome {
            Replaced::Done(new, retiree) => {
                // A reload goes on to the next worker while this one's old process
                // finishes what it holds: an event stream or a WebSocket can take the
                // whole drain timeout, and waiting it out worker by worker made a
                // reload of 4 workers with streams take 4 x 10 s (PM2: 0.8 s, cutting
                // them). A memory replacement waits: its turn is the memory it frees.
                if reloading {
                    shared.retire_in_background(id, retiree);
                } else {
                    // A memory replacement is a restart of the slot (a reload is not),
                    // as PM2 counts one.
                    shared.slot(id).restarts += 1;
                    retire(shared, id, retiree).await;
                }
                // The old process is stopped (or retiring): the app's next worker over
                // may go.
                drop(turn);
                proc = new;
                ready_at = Instant::now();
                find_app(shared, id, &mut proc);
                unhealthy = Box::pin(watch_health(shared, id, &proc));
                Ok(())
            }
            Replaced::Kept(old, reason) => {
                drop(turn);
                proc = old;
                tracing::warn!(app = %shared.app, worker = id, "worker {}/{id} not replaced: {reason}", shared.app);
                Err(reason)
            }
            Replaced::OldExited(mut old, status, reason) => {
                drop(turn);
                shared.record_exit(id, &mut old, &status, None).await;
                if let Some(reply) = reply {
                    let _ = reply.send(Err(reason));
                }
                return Life {
                    end: exited(status),
                    pid: old.pid,
                    served: ready_at.elapsed(),
                };
            }
        };
        if let Some(reply) = reply {
            let _ = reply.send(result);
        }
    }
}

/// What follows a worker's exit (`status`): out of the pool, what it started stopped,
/// its record kept.
async fn after_exit(
    shared: &AppState,
    id: usize,
    proc: &mut Proc,
    status: std::io::Result<ExitStatus>,
    ready_at: Instant,
) -> Life {
    // What it dropped may go again only if no error of its own ended it.
    tell_life(shared, proc, life_after(&status));
    // Out of the pool before anything else, so no new request goes to a corpse.
    shared.leave_pool(id);
    // Then what it started, before the replacement needs its port.
    proc.worker.stop(proc.spec.stop_timeout).await;
    shared.record_exit(id, proc, &status, None).await;
    Life {
        end: exited(status),
        pid: proc.pid,
        served: ready_at.elapsed(),
    }
}

/// How long a runner (npm, tsx, a shell) whose app's process ended has to end by
/// itself before drover takes it for one that lives on (see `Proc::app_ended`).
const RUNNER_GRACE: Duration = Duration::from_secs(1);

enum Why {
    Asked(ReplaceRequest),
    /// Its RSS, and the app's turn (`None`: past the overshoot, it did not wait).
    Memory(u64, Option<OwnedSemaphorePermit>),
}

/// How a replacement went.
enum Replaced {
    /// The new process serves; the old one is out of the pool, to be drained and
    /// stopped (`retire`).
    Done(Proc, Box<Retiree>),
    /// The new process never became ready (or shutdown began); the old one still serves.
    Kept(Proc, ReplaceError),
    /// The old process exited while its replacement was starting, and the replacement
    /// failed too: the slot has nothing running. The old one is stopped, not recorded.
    OldExited(Proc, std::io::Result<ExitStatus>, ReplaceError),
}

/// A worker's old process, out of the pool once its replacement serves: what `retire`
/// drains and stops.
struct Retiree {
    old: Proc,
    endpoint: Option<Arc<drover_balance::Endpoint>>,
    /// Its exit, when it exited by itself while its replacement started.
    status: Option<std::io::Result<ExitStatus>>,
    /// Why it is replaced, for its restart record.
    cause: (RestartReason, String),
}

/// How long a replacement whose readiness only a connect said must stay up before it
/// takes the old one's place (see `connect_says_ready`).
const REPLACEMENT_SETTLE: Duration = Duration::from_secs(1);

/// Whether an accepted connect says a worker of `spec` is ready: no health check but a
/// TCP one (a Node app with drover's preload says more: its `listen()` comes once the
/// app has loaded). A server that opens
/// its port before it loads the app (gunicorn's master, then its worker imports the
/// code) is "ready" at once, and new code that fails to load ends it half a second
/// later: a reload of a broken deploy said "reloaded", retired every old worker, and
/// the app was down (502s) until the next deploy. Such a replacement stays up
/// `REPLACEMENT_SETTLE` first, as the reload of a uvicorn app (which loads before it
/// binds) or one with a health path already refused it.
fn connect_says_ready(spec: &AppSpec) -> bool {
    spec.health
        .as_ref()
        .is_none_or(|c| c.kind == drover_registry::CheckKind::Tcp)
        && matches!(spec.mode, Mode::Auto | Mode::Proxy | Mode::Handoff)
}

/// Starts a process of the current spec next to `old` and swaps them in the pool once
/// the new one is ready; `old` is then to be retired. `cause` is why `old` is replaced,
/// for its restart record; a replacement that fails gets a record of its own.
async fn replace_proc(
    shared: &AppState,
    id: usize,
    mut old: Proc,
    stop: &mut watch::Receiver<bool>,
    cause: (RestartReason, String),
) -> Replaced {
    let mut new = match spawn(shared, id) {
        Ok(p) => p,
        Err(e) => {
            shared.record_spawn_failure(id, &e);
            return Replaced::Kept(old, ReplaceError::SpawnFailed(e));
        }
    };
    tracing::info!(app = %shared.app, worker = id, old = ?old.pid, new = ?new.pid, "replacing worker");
    let probing = shared.probing(&new.spec);
    let wait = new.ready_wait(shared, id);
    let settles = connect_says_ready(&new.spec);
    let preload = new.node_session.as_ref().map(|s| s.inbox.clone());
    // A replacement whose event loop answers while it starts is waited for as a cold
    // start is: an app that listens after 8 s started with `--ready-timeout 5s`, and
    // every reload of it was refused at 5 s.
    let starting = new.starting();
    let ready = async move {
        ready_unless_hung(&wait, &probing, wait.spec.ready_timeout, starting.as_ref())
            .await
            .map_err(ReplaceError::NotReady)?;
        // A Node app's preload said it runs (its `listen()` comes once the app loaded).
        if settles && !preload.is_some_and(|p| p.can_give_back()) {
            // Its exit meanwhile is seen below, while the old one still serves.
            tokio::time::sleep(REPLACEMENT_SETTLE).await;
        }
        Ok(())
    };
    tokio::pin!(ready);
    let mut old_status = None;
    let mut new_status = None;
    let ready = loop {
        tokio::select! {
            r = &mut ready => break r,
            status = new.worker.child.wait() => {
                new_status = status.as_ref().ok().copied();
                break Err(match status {
                    Ok(s) => ReplaceError::ExitedEarly(s),
                    Err(e) => ReplaceError::LostTrack(e),
                });
            }
            status = old.worker.child.wait(), if old_status.is_none() => {
                tell_life(shared, &old, life_after(&status));
                shared.leave_pool(id);
                old_status = Some(status);
            }
            _ = stopped(stop) => break Err(ReplaceError::ShutdownBegan),
        }
    };
    if let Err(reason) = ready {
        new.sample();
        let stopped_status = new.worker.stop(new.spec.stop_timeout).await;
        // Shutdown cut it short; it did not fail.
        if !matches!(reason, ReplaceError::ShutdownBegan) {
            let detail = Some(format!("as a replacement: {reason}"));
            let status = new_status.or(stopped_status);
            shared
                .record_end(id, &mut new, RestartReason::StartFailed, detail, status)
                .await;
        }
        return match old_status {
            Some(status) => {
                old.worker.stop(old.spec.stop_timeout).await;
                Replaced::OldExited(old, status, reason)
            }
            None => Replaced::Kept(old, reason),
        };
    }
    if is_stopping(stop) {
        new.worker.stop(new.spec.stop_timeout).await;
        return Replaced::Kept(old, ReplaceError::ShutdownBegan);
    }

    // The new one joins before the old one leaves, so capacity never dips.
    let old_endpoint = old.addr().and_then(|a| shared.pool.find(a));
    join_pool(shared, id, &new);
    if let Some(addr) = old.addr() {
        shared.pool.remove(Source::Supervisor, addr);
    }
    shared.slot(id).started(&new, WorkerState::Ready);
    tracing::info!(app = %shared.app, worker = id, old = ?old.pid, new = ?new.pid, "worker replaced");
    let retiree = Retiree {
        old,
        endpoint: old_endpoint,
        status: old_status,
        cause,
    };
    Replaced::Done(new, Box::new(retiree))
}

/// Drains a replaced process (requests already bound to it finish there; none are
/// added), stops it and keeps its record.
async fn retire(shared: &AppState, id: usize, retiree: Box<Retiree>) {
    let Retiree {
        mut old,
        endpoint,
        status,
        cause,
    } = *retiree;
    if status.is_none() {
        if let Some(ep) = &endpoint {
            drain(shared, id, &mut old, ep).await;
        }
    }
    // Also when it already exited: what it started may still run.
    old.sample();
    if let (Some(ep), None) = (&endpoint, &status) {
        // Whatever it still holds after the drain, drover ends: not the requests' doing.
        ep.set_worker_life(WorkerLife::Ended);
    }
    let stopped_status = old.worker.stop(old.spec.stop_timeout).await;
    match status {
        // It exited by itself while its replacement started: that is how it ended.
        Some(status) => shared.record_exit(id, &mut old, &status, None).await,
        None => {
            let (reason, detail) = cause;
            shared
                .record_end(id, &mut old, reason, Some(detail), stopped_status)
                .await;
        }
    }
    tracing::info!(app = %shared.app, worker = id, pid = %output::ShownPid(old.pid), "old worker stopped");
}

impl WorkerSlot {
    fn started(&mut self, proc: &Proc, state: WorkerState) {
        self.pid = proc.pid;
        self.port = proc.port.as_ref().map(Port::get);
        self.spawned = Some(proc.spawned);
        self.started_at = Some(proc.started_at);
        if state.is_serving() {
            self.ready_at = Some(Instant::now());
        }
        self.state = state;
    }
}

/// `Child::wait` only fails if the child was already reaped, which nothing else does;
/// treat it as an exit of unknown status rather than a panic.
fn exited(status: std::io::Result<ExitStatus>) -> End {
    match status {
        Ok(s) => End::Exited(s),
        Err(e) => End::Killed(format!("lost track of the process: {e}")),
    }
}

/// Tells the balancer how the process ended, while its endpoint is still in the pool
/// (see `drover_balance::worker_life`).
fn tell_life(shared: &AppState, proc: &Proc, life: WorkerLife) {
    if let Some(ep) = proc.addr().and_then(|a| shared.pool.find(a)) {
        ep.set_worker_life(life);
    }
}

/// Whether a process that exited with `status` ended by an error of its own. A signal
/// it raises itself (a crash, an abort) or an exit with a failing status is; a signal
/// sent from outside is not, nor a shell's report of one (128 + SIGHUP, SIGINT, SIGKILL,
/// SIGTERM: `sh -c`, npm), nor an exit with status 0 (it ended as planned: a recycle).
fn life_after(status: &std::io::Result<ExitStatus>) -> WorkerLife {
    use std::os::unix::process::ExitStatusExt;
    const OWN_SIGNALS: [i32; 7] = [
        libc::SIGSEGV,
        libc::SIGABRT,
        libc::SIGBUS,
        libc::SIGILL,
        libc::SIGFPE,
        libc::SIGSYS,
        libc::SIGTRAP,
    ];
    const SENT: [i32; 4] = [libc::SIGHUP, libc::SIGINT, libc::SIGKILL, libc::SIGTERM];
    match status {
        Ok(s) => match (s.signal(), s.code()) {
            (Some(sig), _) if OWN_SIGNALS.contains(&sig) => WorkerLife::Crashed,
            (Some(_), _) => WorkerLife::Ended,
            (None, Some(code)) if code > 128 && SENT.contains(&(code - 128)) => WorkerLife::Ended,
            (None, Some(0)) => WorkerLife::Ended,
            _ => WorkerLife::Crashed,
        },
        // Reaped elsewhere: nothing says it was its doing.
        Err(_) => WorkerLife::Ended,
    }
}

/// Shared mode: whether a worker serves the socket drover passed it as fd 3, or listens
/// on a port of its own, as an app that reads `PORT` (unset in this mode) or names a
/// port does. Such a worker never accepts from its socket: what the program places
/// there waits until the client gives up. drover cannot serve the app elsewhere in this
/// mode, but it can say so, with the way out. Looked at 1, 2, 4, 8 and 16 s after the
/// worker is ready (an app may listen late), and no more: /proc/net/tcp lists every
/// connection, so reading it is for rare looks.
struct OwnPortLooks {
    /// The shared socket's address; `None` outside shared mode: nothing to look at.
    shared: Option<SocketAddr>,
    next: Duration,
}

impl OwnPortLooks {
    const FIRST: Duration = Duration::from_secs(1);
    const LAST: Duration = Duration::from_secs(16);

    fn new(shared: &AppState) -> OwnPortLooks {
        OwnPortLooks {
            shared: shared.steer.as_ref().map(Steering::local_addr),
            next: Self::FIRST,
        }
    }

    fn look(&mut self, shared: &AppState, id: usize, proc: &Proc, ready_at: Instant) {
        // The worker leads a process group of its own: the app may be below a runner.
        let (Some(socket), Some(pid)) = (self.shared, proc.pid) else {
            return;
        };
        if self.next > Self::LAST || ready_at.elapsed() < self.next {
            return;
        }
        self.next *= 2;
        let own: Vec<String> = crate::listening::group_listening_addrs(pid)
            .iter()
            .filter(|a| a.port() != socket.port())
            .map(SocketAddr::to_string)
            .collect();
        if own.is_empty() {
            return;
        }
        self.next = Self::LAST * 2;
        let app = &shared.app;
        tracing::error!(
            app = %app, worker = id, ?pid,
            "worker {app}/{id} listens on {} itself: in shared mode clients reach only the socket drover passed it as fd 3 (LISTEN_FDS=1), where a worker that does not accept leaves them waiting, and each worker's copy of the app binds any other port itself, so all but one fail. Serve that socket (Node: server.listen({{ fd: 3 }}), which drover's preload makes of a Node app's first listen(); Python: socket.socket(fileno=3)), or run the app without --mode shared: drover then serves every port where the app listens",
            own.join(", "),
        );
    }
}

/// The endpoint of a serving worker's own port; `None` in shared mode.
fn own_endpoint(shared: &AppState, proc: &Proc) -> Option<Arc<drover_balance::Endpoint>> {
    shared.pool.find(proc.addr()?)
}

/// Watches a serving process's health (see `health::until_unhealthy`); never resolves
/// when it has no health check or no port of its own (shared mode).
fn watch_health<'a>(
    shared: &'a AppState,
    id: usize,
    proc: &Proc,
) -> impl std::future::Future<Output = health::Unhealthy> + 'a {
    let (addr, pid, check) = (proc.addr(), proc.app_pid(), proc.spec.health.clone());
    let event_loop = proc.node_session.as_ref().map(|s| s.inbox.clone());
    let probing = shared.probing(&proc.spec);
    let answers_in_batches = proc.spec.h2c;
    let own_pid = proc.pid;
    async move {
        let (Some(addr), Some(check)) = (addr, check) else {
            // No check to fail: a Node worker's silent event loop still tells an
            // endless loop (see `loop_watch`).
            return match (addr, own_pid, event_loop.as_ref()) {
                (Some(_), Some(pid), Some(event_loop)) => {
                    loop_watch::until_loop_hangs(loop_watch::LoopWatched {
                        pid,
                        event_loop,
                        restarts: &shared.health_restarts,
                    })
                    .await
                }
                _ => std::future::pending().await,
            };
        };
        let show = |state| shared.show_serving(id, state);
        health::until_unhealthy(health::Watched {
            addr,
            pid,
            check: &check,
            probing: &probing,
            pool: &shared.pool,
            restarts: &shared.health_restarts,
            stalls: &shared.stalls,
            show: &show,
            event_loop: event_loop.as_ref(),
            answers_in_batches,
        })
        .await
    }
}

fn join_pool(shared: &AppState, id: usize, proc: &Proc) {
    let mut slot = shared.slot(id);
    slot.state = WorkerState::Ready;
    slot.ready_at = Some(Instant::now());
    if std::mem::take(&mut slot.start_failed) {
        drop(slot);
        shared.note_failed_starts();
        slot = shared.slot(id);
    }
    // Its predecessor's health restart is over: the app's next may go.
    slot.health_permit = None;
    let Some(addr) = proc.addr() else {
        // Shared mode: no pool; the program may name this slot from now on.
        slot.placed = true;
        drop(slot);
        let _ = shared.steer();
        return;
    };
    // A worker ready with no listen() heard (not Node) serves at its PORT, or at the
    // fixed port it binds instead, which its status shows.
    if let Some(&at) = proc.fixed_port.get() {
        slot.port = Some(at.port());
    }
    shared.first_listen.note(FirstListen::own_port());
    shared.pool.insert(Source::Supervisor, addr, 1);
    if let Some(ep) = shared.pool.find(addr) {
        ep.watch_work(Arc::clone(&shared.cpu_wake) as Arc<dyn drover_balance::WorkArrives>);
        ep.set_worker_life(WorkerLife::Running);
        ep.set_retiring(false);
    }
    // We just saw it serve, so it is healthy even in a pool whose members start
    // unhealthy (those wait for active checks that may be minutes apart).
    if shared.pool.options().initially_unhealthy {
        if let Some(ep) = shared.pool.find(addr) {
            ep.set_healthy(true);
            // The insert woke queued requests while it was still down.
            shared.pool.endpoint_up();
        }
    }
    slot.in_pool = Some(addr);
}

/// Stops a slot's process for good: out of the pool, then SIGTERM. When it leaves the
/// pool here (the app scaled down) the requests it holds finish first, up to
/// `drain_timeout`; on shutdown `Supervisor::shutdown` has taken every worker out of
/// the pool already, after the balancers drained. Returns how it ended, when known.
async fn shutdown_proc(shared: &AppState, id: usize, proc: &mut Proc) -> Option<ExitStatus> {
    let endpoint = proc.addr().and_then(|a| shared.pool.find(a));
    shared.leave_pool(id);
    let retiring = {
        let mut slot = shared.slot(id);
        slot.state = WorkerState::Stopping;
        slot.retiring
    };
    if let (Some(steer), true) = (&shared.steer, retiring) {
        // Scaled away in shared mode: no new connection is placed here from now on,
        // and what is already queued on its socket is accepted by this process before
        // it stops (nothing else will accept there until the app grows again).
        let _ = shared.steer();
        drain_queue(shared, id, proc, steer).await;
    }
    if let Some(ep) = endpoint {
        drain(shared, id, proc, &ep).await;
        ep.set_worker_life(WorkerLife::Ended);
    }
    let handles_stop = proc
        .node_session
        .as_ref()
        .is_some_and(|s| s.inbox.handles_stop());
    if handles_stop {
        proc.worker.set_late_hint(LATE_NODE_APP);
    }
    let left = shared.slot(id).left_for_shutdown.take();
    let stop_timeout = proc.spec.stop_timeout;
    let stop = proc.worker.stop(stop_timeout);
    let Some(ep) = left else {
        return stop.await;
    };
    // Shutdown drained drover's clients until only streams were left (or its drain
    // timeout passed): those it still relays to this worker end, as in `drain`.
    tokio::pin!(stop);
    tokio::select! {
        status = &mut stop => return status,
        () = tokio::time::sleep(streams_cut_after(stop_timeout)) => {}
    }
    ep.cut_streams();
    stop.await
}

/// Shared mode: waits until slot `id`'s accept queue stays empty (its process accepts
/// what is there), it exits, or `drain_timeout` passes. Twice empty in a row: a SYN
/// placed here just before the program changed completes its handshake a moment later.
async fn drain_queue(shared: &AppState, id: usize, proc: &mut Proc, steer: &Steering) {
    let drained = async {
        let mut empty = 0;
        while empty < 2 {
            tokio::time::sleep(DRAIN_POLL).await;
            // Unreadable: nothing to wait for that drover could see.
            empty = match steer.queued(id) {
                Some(0) | None => empty + 1,
                Some(_) => 0,
            };
        }
    };
    tokio::select! {
        r = tokio::time::timeout(proc.spec.drain_timeout, drained) => {
            if r.is_err() {
                tracing::warn!(app = %shared.app, worker = id, pid = %output::ShownPid(proc.pid),
                    "connections still queued for a retired worker after drain_timeout {:?}; stopping it", proc.spec.drain_timeout);
            }
        }
        _ = proc.worker.child.wait() => {}
    }
}

/// Waits until the requests bound to `proc` (out of the pool now) are answered, it
/// exits, or `drain_timeout` passes.
async fn drain(shared: &AppState, id: usize, proc: &mut Proc, endpoint: &drover_balance::Endpoint) {
    endpoint.set_retiring(true);
    // Clients handed to the worker are its own. With drover's preload in it, it first
    // gives each connection back between two requests (drover serves them from then
    // on); then it closes its server, finishes what it still has, and leaves its
    // channel (Node's `worker.disconnect()`).
    let direct = proc
        .node_session
        .as_ref()
        .filter(|s| s.serves_clients_directly());
    let drained = async {
        if let Some(session) = direct {
            take_back_clients(Some(session), proc.spec.drain_timeout).await;
            session.inbox.disconnect();
        }
        while endpoint.in_flight() > 0 || direct.is_some_and(|s| !s.task.is_finished()) {
            tokio::time::sleep(DRAIN_POLL).await;
        }
    };
    tokio::pin!(drained);
    let handles_stop = proc
        .node_session
        .as_ref()
        .is_some_and(|s| s.inbox.handles_stop());
    let began = tokio::time::Instant::now();
    let deadline = began + proc.spec.drain_timeout;
    let mut termed = None;
    let mut streams_since = None;
    let mut cut = false;
    let cut_after = streams_cut_after(proc.spec.stop_timeout);
    loop {
        let until = match termed {
            Some(at) => deadline.min(at + proc.spec.stop_timeout),
            None => deadline,
        };
        tokio::select! {
            () = &mut drained => return,
            // Told to stop, it still holds streams: it waits for its connections to
            // end (Node's `server.close()`; Nuxt, SvelteKit) rather than ending them.
            () = tokio::time::sleep_until(termed.unwrap_or(began) + cut_after), if termed.is_some() && !cut => {
                cut = true;
                tracing::info!(app = %shared.app, worker = id, pid = %output::ShownPid(proc.pid),
                    "worker {}/{id} still holds streams {cut_after:?} after SIGTERM; ending them, so that a server waiting for its connections to close can exit", shared.app);
                endpoint.cut_streams();
                continue;
            }
            _ = proc.worker.child.wait() => return,
            () = tokio::time::sleep_until(until) => {
                if termed.is_none() {
                    tracing::warn!(app = %shared.app, worker = id, pid = %output::ShownPid(proc.pid),
                        "worker still busy after drain_timeout {:?}; stopping it", proc.spec.drain_timeout);
                }
                return;
            }
            () = tokio::time::sleep(DRAIN_POLL), if termed.is_none() && !cut => {}
        }
        // What drover sees of it: only responses under way (an event stream, a
        // download) and tunnels (WebSockets), none waiting for its head.
        // For a second: a response's body is under way for a moment after its head.
        let only_streams = direct.is_none() && endpoint.pending() == 0;
        let now = tokio::time::Instant::now();
        streams_since = only_streams.then(|| streams_since.unwrap_or(now));
        let streams_left = streams_since.is_some_and(|t| now - t >= STREAMS_SETTLE);
        if !handles_stop {
            if streams_left {
                // Nothing of the app's hears SIGTERM, so nothing would end them: a
                // WebSocket app as the `ws` README writes one held each reload for
                // all of `drain_timeout` (30 s; PM2's 0.9 s), its clients on the old
                // code. They end now, and come back to the new workers; its drain is
                // then over, and SIGTERM follows.
                cut = true;
                tracing::info!(app = %shared.app, worker = id, pid = %output::ShownPid(proc.pid),
                    "worker {}/{id} holds only streams (WebSockets, event streams) into its drain, and its app does not handle SIGTERM; ending them, so that their clients come back to the new workers", shared.app);
                endpoint.cut_streams();
            }
            continue;
        }
        if streams_left || began.elapsed() >= STREAMS_AFTER {
            proc.worker.term_early();
            termed = Some(tokio::time::Instant::now());
            tracing::info!(
                app = %shared.app, worker = id, pid = %output::ShownPid(proc.pid),
                "worker {}/{id} still holds clients {:?} into its drain (WebSockets, event streams, long requests); its app handles SIGTERM, so it gets it now to end them itself, as under PM2, and has stop_timeout ({:?}) to exit",
                shared.app,
                Duration::from_millis(began.elapsed().as_millis() as u64),
                proc.spec.stop_timeout,
            );
        }
    }
}

/// How long a retired worker whose app handles SIGTERM is drained before it gets the
/// signal while drover cannot tell what it still holds (clients it serves directly):
/// a request of the usual sort is over by then, while a WebSocket or an event stream
/// would hold it for all of `drain_timeout` (a reload of an app with one WebSocket open
/// took 30 s, PM2's 4.6 s), and its app, told only at the end, could not close them.
const STREAMS_AFTER: Duration = Duration::from_secs(5);

/// Why a Node worker whose app handles SIGTERM may outlive its `stop_timeout`, and
/// what to do: Express's guide closes the server on SIGTERM and lets Node exit once
/// nothing is left, but a timer or a database pool keeps it up, and every stop and
/// reload then waited the 10 s to SIGKILL (PM2's 0.5 s: its SIGINT ends such an app;
/// Node seat #2).
const LATE_NODE_APP: &str = "its app handles SIGTERM, and something still kept its event loop alive after that (a timer, a database pool, a socket): exit when the shutdown is done (process.exit() in the handler), or lower --stop-timeout (stop_timeout; PM2's --kill-timeout)";

/// How long a worker told to stop while it holds streams (event streams, WebSockets)
/// relayed by drover keeps them before drover ends them (`Endpoint::cut_streams`). An
/// app that ends them itself on SIGTERM (socket.io's and Fastify's close()) has done so
/// by then; one whose server waits for its connections to close (Node's
/// `server.close()`, Nitro's and adapter-node's shutdown) exits once they are ended,
/// where before it held on until `stop_timeout` and SIGKILL: a stop of Nuxt with one
/// event stream open took 14 s, PM2's 2 s.
const STREAMS_CUT_AFTER: Duration = Duration::from_secs(2);

/// How long after its SIGTERM the streams still relayed to a worker are ended for it:
/// `STREAMS_CUT_AFTER`, or half its `stop_timeout` when that is shorter.
fn streams_cut_after(stop_timeout: Duration) -> Duration {
    STREAMS_CUT_AFTER.min(stop_timeout / 2)
}

/// How long a retired worker drover proxies to must hold only streams and tunnels
/// before its app gets SIGTERM (see `STREAMS_AFTER`).
const STREAMS_SETTLE: Duration = Duration::from_secs(1);

/// A worker that serves clients directly (connections drover handed it) gives each one
/// back between two requests, when drover's preload runs in it, so that stopping it
/// closes none under a request: drover serves them from then on. Returns once it has,
/// once it has left, or after `bound`.
async fn take_back_clients(session: Option<&NodeSession>, bound: Duration) {
    let Some(session) = session.filter(|s| s.serves_clients_directly() && s.inbox.can_give_back())
    else {
        return;
    };
    session.inbox.give_back_connections();
    let given_back = async {
        while !session.inbox.all_given_back() && !session.task.is_finished() {
            tokio::time::sleep(DRAIN_POLL).await;
        }
    };
    let _ = tokio::time::timeout(bound, given_back).await;
}

/// Starts forwarding the child's output; returns the stderr task, which also fills
/// `stderr_tail`.
fn forward_output(
    shared: &AppState,
    id: usize,
    child: &mut Child,
    stderr_tail: &Arc<StderrTail>,
) -> Option<JoinHandle<()>> {
    if let Some(out) = child.stdout.take() {
        let (app, sink) = (Arc::clone(&shared.app), Arc::clone(&shared.sink));
        output::forward(out, app, id, Stream::Stdout, sink, None);
    }
    let err = child.stderr.take()?;
    let (app, sink) = (Arc::clone(&shared.app), Arc::clone(&shared.sink));
    let tail = Some(Arc::clone(stderr_tail));
    Some(output::forward(err, app, id, Stream::Stderr, sink, tail))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failing_exit_or_a_crash_is_the_workers_doing_and_a_signal_sent_or_exit_0_is_not() {
        use std::os::unix::process::ExitStatusExt;
        // Wait statuses: a code in the high byte, a signal in the low bits.
        let exited = |code: i32| Ok(ExitStatus::from_raw(code << 8));
        let signalled = |sig: i32| Ok(ExitStatus::from_raw(sig));
        for status in [
            exited(1),
            exited(7),
            exited(134),
            signalled(libc::SIGSEGV),
            signalled(libc::SIGABRT),
        ] {
            assert_eq!(life_after(&status), WorkerLife::Crashed, "{status:?}");
        }
        for status in [
            exited(0),
            signalled(libc::SIGKILL),
            signalled(libc::SIGTERM),
            exited(137),
            exited(143),
        ] {
            assert_eq!(life_after(&status), WorkerLife::Ended, "{status:?}");
        }
        assert_eq!(
            life_after(&Err(std::io::Error::other("reaped"))),
            WorkerLife::Ended
        );
    }

    #[test]
    fn a_crash_loop_whose_output_says_address_in_use_is_told_of_its_port() {
        let record = |worker: usize, line: &str| RestartRecord::exited_1(worker, &[line]);
        let python = record(1, "OSError: [Errno 98] Address already in use");
        let other = record(0, "SyntaxError: invalid syntax");
        assert!(port_taken_hint(&[python.clone(), other.clone()], 1).contains("$PORT"));
        assert_eq!(port_taken_hint(&[python.clone(), other], 0), "");
        assert_eq!(port_taken_hint(&[python], 2), "");
        let node = record(
            0,
            "Error: listen EADDRINUSE: address already in use :::3000",
        );
        assert!(port_taken_hint(&[node], 0).contains("{port}"));
    }

    #[test]
    fn a_slow_start_gets_twice_the_time_next_up_to_a_bound() {
        let t = Duration::from_secs(30);
        assert_eq!(ready_patience(t, 0), t);
        assert_eq!(ready_patience(t, 1), Duration::from_secs(60));
        assert_eq!(ready_patience(t, 4), Duration::from_secs(480));
        assert_eq!(ready_patience(t, 5), Duration::from_secs(480));
        assert_eq!(ready_patience(t, u32::MAX), Duration::from_secs(480));
        assert_eq!(ready_patience(Duration::MAX, 3), Duration::MAX);
    }
}
