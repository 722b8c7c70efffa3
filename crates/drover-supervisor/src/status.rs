//! What a worker is doing, for `drover status`, the admin API and tests.

use crate::forensics::{RestartCounts, RestartReason};
use std::fmt;
use std::time::{Duration, SystemTime};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WorkerState {
    /// Spawned, waiting for its port to accept connections (and health to pass).
    Starting,
    /// In the pool, serving.
    Ready,
    /// In the pool, serving, and too busy to answer its health checks: they get no
    /// answer, but its requests complete. Busy is not hung; it is not restarted.
    Busy,
    /// Failed `fall` health checks in a row; out of the pool, being restarted.
    Unhealthy,
    /// Answered nothing and completed nothing for `fall` health checks in a row (an
    /// endless loop, a deadlock, a stopped process); out of the pool, killed and
    /// replaced at once.
    Hung,
    /// Being stopped for shutdown (SIGTERM, then SIGKILL after the grace).
    Stopping,
    /// Exited; waiting out the back-off before the next start.
    BackingOff,
    /// Like `BackingOff`, after `crash_loop_after` crashes in a row.
    CrashLooping,
    /// Crashed more than `max_restarts` times in a row: not started again until a
    /// reload or a scale (PM2's `errored`).
    Errored,
    /// Shut down for good.
    Stopped,
}

impl WorkerState {
    /// In the pool and serving (busy included).
    pub fn is_serving(self) -> bool {
        matches!(self, WorkerState::Ready | WorkerState::Busy)
    }

    /// The kebab-case name used in JSON and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            WorkerState::Starting => "starting",
            WorkerState::Ready => "ready",
            WorkerState::Busy => "busy",
            WorkerState::Unhealthy => "unhealthy",
            WorkerState::Hung => "hung",
            WorkerState::Stopping => "stopping",
            WorkerState::BackingOff => "backing-off",
            WorkerState::CrashLooping => "crash-looping",
            WorkerState::Errored => "errored",
            WorkerState::Stopped => "stopped",
        }
    }
}

impl fmt::Display for WorkerState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One worker slot. The slot (`app`, `id`) is stable; the process in it changes on
/// every restart.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerStatus {
    pub app: String,
    pub id: usize,
    /// The current process, while there is one.
    pub pid: Option<u32>,
    /// The app's own process below a runner (`npm start`'s node), once drover's preload
    /// there has said: its CPU time and RSS are the worker's (npm's own are an idle
    /// 55 MB beside a Next.js server's 200). `None` where the process is the app's.
    pub app_pid: Option<u32>,
    /// The current process's `PORT`, while there is one (a restart picks a fresh port).
    pub port: Option<u16>,
    pub state: WorkerState,
    /// How many times this slot started a new process after the first, or replaced one
    /// over max_memory (reloads and scale-downs are not counted).
    pub restarts: u32,
    /// Crashes in a row (exits before `min_uptime`); 0 once a process served long enough.
    pub crash_streak: u32,
    /// Time since the current process was spawned.
    pub uptime: Option<Duration>,
    /// Why the previous process ended, e.g. "exit status: 1" or "not ready within 5s".
    pub last_exit: Option<String>,
    /// The reason of the previous process's restart record.
    pub last_reason: Option<RestartReason>,
    /// The previous process's exit code, when it exited with one.
    pub last_exit_code: Option<i32>,
    /// The signal that killed the previous process, when one did (drover's too).
    pub last_signal: Option<i32>,
    /// Processes of this slot that ended, by reason (reloads and start failures
    /// included, so this can exceed `restarts`).
    pub restarts_by_reason: RestartCounts,
    /// Wall-clock time the current process was spawned.
    pub started_at: Option<SystemTime>,
    /// CPU time (user + system) the app's process has used, from `/proc`.
    pub cpu_seconds: Option<f64>,
    /// Resident memory of the app's process, from `/proc`.
    pub rss_bytes: Option<u64>,
    /// Requests the balancer has in flight to this worker (proxy mode, while in the pool).
    pub in_flight: Option<u32>,
    /// Client connections handed to this worker that it serves directly (`auto` and
    /// `handoff` modes): their requests are not in `in_flight`.
    pub clients: Option<usize>,
}
