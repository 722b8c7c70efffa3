//! The handle to one app's workers.

use crate::output::{stderr_sink, LineSink};
use crate::spec::AppSpec;
use crate::status::{WorkerState, WorkerStatus};
use crate::worker::{self, Shared, Slot};
use drover_registry::Pool;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Keeps `spec.workers` processes of one app running and their addresses in a pool.
///
/// Dropping it without `shutdown` still stops the workers gracefully in the background
/// (each slot sees the stop channel close), as long as the tokio runtime keeps running;
/// if the runtime goes away first, `kill_on_drop` SIGKILLs them.
pub struct Supervisor {
    shared: Arc<Shared>,
    stop: watch::Sender<bool>,
    /// Taken by the first `shutdown`; later calls wait on the lock until it is done.
    tasks: tokio::sync::Mutex<Vec<JoinHandle<()>>>,
}

impl Supervisor {
    /// Validates `spec` and starts its workers on the current tokio runtime, forwarding
    /// their output to drover's stderr. Returns at once; workers join `pool` as they
    /// become ready (see `wait_ready`). Panics outside a tokio runtime.
    pub fn start(spec: AppSpec, pool: Arc<Pool>) -> Result<Supervisor, String> {
        Supervisor::start_with_output(spec, pool, stderr_sink())
    }

    /// Like `start`, with worker output lines sent to `sink` instead of stderr.
    pub fn start_with_output(
        spec: AppSpec,
        pool: Arc<Pool>,
        sink: LineSink,
    ) -> Result<Supervisor, String> {
        spec.validate()
            .map_err(|e| format!("app {:?}: {e}", spec.name))?;
        let shared = Arc::new(Shared {
            app: Arc::from(spec.name.as_str()),
            slots: (0..spec.workers).map(|_| Mutex::new(Slot::new())).collect(),
            spec,
            pool,
            sink,
        });
        let (stop, stop_rx) = watch::channel(false);
        let tasks = (0..shared.spec.workers)
            .map(|id| tokio::spawn(worker::run(Arc::clone(&shared), id, stop_rx.clone())))
            .collect();
        Ok(Supervisor {
            shared,
            stop,
            tasks: tokio::sync::Mutex::new(tasks),
        })
    }

    pub fn name(&self) -> &str {
        &self.shared.spec.name
    }

    pub fn spec(&self) -> &AppSpec {
        &self.shared.spec
    }

    pub fn pool(&self) -> &Arc<Pool> {
        &self.shared.pool
    }

    /// Every worker slot, by id.
    pub fn status(&self) -> Vec<WorkerStatus> {
        (0..self.shared.slots.len())
            .map(|id| self.shared.slot(id).status(&self.shared.spec.name, id))
            .collect()
    }

    /// Waits until every worker is ready, up to `timeout`. True if they all are.
    /// For `drover up` to report "all workers up", and for tests.
    pub async fn wait_ready(&self, timeout: Duration) -> bool {
        let all_ready = || self.status().iter().all(|w| w.state == WorkerState::Ready);
        // Polling keeps the workers free of any notification plumbing; this runs once
        // at startup, so a 20 ms poll costs nothing.
        let wait = async {
            while !all_ready() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        tokio::time::timeout(timeout, wait).await.is_ok()
    }

    /// Stops every worker for good: takes all endpoints out of the pool, sends SIGTERM,
    /// gives each up to `stop_timeout`, then SIGKILL, and reaps them all. Nothing is
    /// restarted once this has begun. Safe to call more than once.
    pub async fn shutdown(&self) {
        self.stop.send_replace(true);
        // Out of the pool first, all at once, so the balancer stops sending new requests
        // while workers finish the ones they hold.
        for id in 0..self.shared.slots.len() {
            self.shared.leave_pool(id);
        }
        let mut tasks = self.tasks.lock().await;
        for task in tasks.drain(..) {
            // A slot task only ends early by panicking; its child was SIGKILLed on drop.
            if let Err(e) = task.await {
                tracing::error!(app = %self.shared.app, "worker task failed: {e}");
            }
        }
    }

    /// `shutdown`, consuming the handle.
    pub async fn stop(self) {
        self.shutdown().await;
    }
}

impl std::fmt::Debug for Supervisor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Supervisor")
            .field("app", &self.shared.spec.name)
            .field("workers", &self.shared.spec.workers)
            .finish_non_exhaustive()
    }
}
