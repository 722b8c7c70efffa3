//! drover-supervisor: run N worker processes of any program and keep them serving.
//!
//! For each worker slot, a task picks a free loopback port, spawns the command with
//! `PORT`, `DROVER_WORKER_ID` and `DROVER_APP` set (and each `{port}` in its arguments
//! replaced by the port), forwards its output with a
//! `[app/ID] ` prefix, waits until the port accepts connections (and the health check
//! passes, if any), and only then adds `127.0.0.1:PORT` to the app's `Pool`. When the
//! process exits or fails `fall` health checks in a row, its endpoint leaves the pool
//! at once and a fresh process starts on a fresh port after an exponential back-off.
//!
//! ```no_run
//! # async fn demo() {
//! use drover_registry::{Pool, PoolOptions};
//! use drover_supervisor::{AppSpec, Supervisor, Workers};
//! use std::sync::Arc;
//!
//! let pool = Arc::new(Pool::new("pi", &[], PoolOptions::default()));
//! let mut spec = AppSpec::new("pi", vec!["node".into(), "examples/pi-server.js".into()]);
//! spec.workers = Workers::Count(2);
//! let sup = Supervisor::start(spec, Arc::clone(&pool)).unwrap();
//! sup.wait_ready(std::time::Duration::from_secs(10)).await;
//! // ... a balancer serves from `pool` ...
//! sup.shutdown().await;
//! # }
//! ```

pub mod cpu;
mod cpu_watch;
mod first_listen;
mod fixed_port;
pub mod forensics;
mod health;
pub mod listening;
mod loop_watch;
pub mod memory;
mod orphans;
pub mod output;
mod process;
mod scout;
pub mod spec;
mod stalls;
pub mod status;
mod steer;
mod supervisor;
mod tcp_diag;
mod waiting;
pub mod watch;
mod worker;

pub use drover_node::{Place, Speaks};
pub use first_listen::FirstListen;
pub use forensics::{
    signal_name, RestartCounts, RestartReason, RestartRecord, UnknownRestartReason,
    HISTORY_PER_APP, STDERR_LINE_MAX, STDERR_TAIL_LINES,
};
pub use health::NotReady;
pub use orphans::adopt_orphans;
pub use output::{stderr_sink, LineSink, LogLine, Stream};
pub use spec::{
    check_workers, command_uses_port, command_with_port, with_interpreter, AppSpec, Backoff,
    BackoffError, Mode, ParseModeError, PortRange, ProgramError, SpecError, Workers, MAX_WORKERS,
    PORT_PLACEHOLDER,
};
pub use status::{WorkerState, WorkerStatus};
pub use steer::SharedListener;
pub use supervisor::{StuckWorker, Supervisor, SupervisorError, Undone};
pub use worker::ReplaceError;
