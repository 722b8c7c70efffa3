//! The handle to one app's workers.

use crate::memory;
use crate::output::{stderr_sink, LineSink};
use crate::spec::{AppSpec, Mode};
use crate::status::{WorkerState, WorkerStatus};
use crate::worker::{self, ReplaceRequest, Shared};
use drover_registry::Pool;
use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

/// Keeps `spec.workers` processes of one app running and their addresses in a pool.
///
/// Dropping it without `shutdown` still stops the workers gracefully in the background
/// (each slot sees the stop channel close), as long as the tokio runtime keeps running;
/// if the runtime goes away first, `kill_on_drop` SIGKILLs them.
pub struct Supervisor {
    shared: Arc<Shared>,
    stop: watch::Sender<bool>,
    replace: Vec<mpsc::UnboundedSender<ReplaceRequest>>,
    /// Taken by the first `shutdown`; later calls wait on the lock until it is done.
    tasks: tokio::sync::Mutex<Vec<JoinHandle<()>>>,
    /// One reload at a time: two interleaved ones would replace each other's workers.
    reloading: tokio::sync::Mutex<()>,
}

impl Supervisor {
    /// Validates `spec` and starts its workers on the current tokio runtime, forwarding
    /// their output to drover's stderr. Returns at once; workers join `pool` as they
    /// become ready (see `wait_ready`). Panics outside a tokio runtime.
    ///
    /// In shared mode (`spec.mode`), use `start_shared` instead.
    pub fn start(spec: AppSpec, pool: Arc<Pool>) -> Result<Supervisor, String> {
        Supervisor::start_with_output(spec, pool, stderr_sink())
    }

    /// Like `start`, with worker output lines sent to `sink` instead of stderr.
    pub fn start_with_output(
        spec: AppSpec,
        pool: Arc<Pool>,
        sink: LineSink,
    ) -> Result<Supervisor, String> {
        if spec.mode == Mode::Shared {
            return Err(format!(
                "app {:?}: shared mode needs a listening socket (start_shared)",
                spec.name
            ));
        }
        Supervisor::launch(spec, pool, sink, None)
    }

    /// Shared mode: every worker accepts on `socket` (passed as fd 3 with
    /// `LISTEN_FDS=1`), so the kernel spreads connections over them with no proxy hop.
    pub fn start_shared(
        spec: AppSpec,
        socket: TcpListener,
        sink: LineSink,
    ) -> Result<Supervisor, String> {
        if spec.mode != Mode::Shared {
            return Err(format!("app {:?}: not in shared mode", spec.name));
        }
        let pool = Arc::new(Pool::new(
            spec.name.clone(),
            &[],
            drover_registry::PoolOptions::default(),
        ));
        Supervisor::launch(spec, pool, sink, Some(socket))
    }

    fn launch(
        spec: AppSpec,
        pool: Arc<Pool>,
        sink: LineSink,
        socket: Option<TcpListener>,
    ) -> Result<Supervisor, String> {
        spec.validate()
            .map_err(|e| format!("app {:?}: {e}", spec.name))?;
        let workers = spec.workers;
        let shared = Arc::new(Shared::new(spec, pool, sink, socket));
        let (stop, stop_rx) = watch::channel(false);
        let mut replace = Vec::with_capacity(workers);
        let mut tasks = Vec::with_capacity(workers);
        for id in 0..workers {
            let (tx, rx) = mpsc::unbounded_channel();
            replace.push(tx);
            tasks.push(tokio::spawn(worker::run(
                Arc::clone(&shared),
                id,
                stop_rx.clone(),
                rx,
            )));
        }
        Ok(Supervisor {
            shared,
            stop,
            replace,
            tasks: tokio::sync::Mutex::new(tasks),
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
        self.shared
            .socket
            .as_ref()
            .and_then(|s| s.local_addr().ok())
    }

    /// Every worker slot, by id, with its RSS and in-flight count.
    pub fn status(&self) -> Vec<WorkerStatus> {
        (0..self.shared.slots.len())
            .map(|id| {
                let (mut status, in_pool) = {
                    let slot = self.shared.slot(id);
                    (slot.status(&self.shared.app, id), slot.in_pool)
                };
                status.rss_bytes = status.pid.and_then(memory::rss_bytes);
                status.in_flight = in_pool
                    .and_then(|a| self.shared.pool.find(a))
                    .map(|ep| ep.in_flight());
                status
            })
            .collect()
    }

    /// Waits until every worker is ready, up to `timeout`. True if they all are.
    /// For `drover up` to report "all workers up", and for tests.
    pub async fn wait_ready(&self, timeout: Duration) -> bool {
        let all_ready = || {
            (0..self.shared.slots.len()).all(|id| self.shared.slot(id).state == WorkerState::Ready)
        };
        // Polling keeps the workers free of any notification plumbing; this runs once
        // at startup, so a 20 ms poll costs nothing.
        let wait = async {
            while !all_ready() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        tokio::time::timeout(timeout, wait).await.is_ok()
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
    pub async fn reload(&self, spec: Option<AppSpec>) -> Result<(), String> {
        let _one = self.reloading.lock().await;
        let previous = self.shared.current().0;
        let next = match spec {
            Some(spec) => {
                spec.validate()?;
                if spec.name != previous.name {
                    return Err(format!(
                        "cannot reload app {:?} as {:?}",
                        previous.name, spec.name
                    ));
                }
                if spec.workers != previous.workers || spec.mode != previous.mode {
                    return Err(format!(
                        "app {:?}: workers and mode cannot change on reload (restart drover for that)",
                        previous.name
                    ));
                }
                Arc::new(spec)
            }
            None => Arc::clone(&previous),
        };
        let changed = *next != *previous;
        self.shared.set_spec(next);
        for id in 0..self.replace.len() {
            if let Err(e) = self.replace_worker(id).await {
                let mut msg = format!("app {:?}: worker {id}: {e}", self.shared.app);
                if changed && id > 0 {
                    self.shared.set_spec(Arc::clone(&previous));
                    let rolled = futures_in_order(self, id).await;
                    msg.push_str(&format!("; workers 0..{id} rolled back: {rolled}"));
                } else if changed {
                    self.shared.set_spec(previous);
                    msg.push_str("; nothing was changed");
                } else {
                    msg.push_str(&format!(
                        "; workers 0..{id} were restarted, the rest were not"
                    ));
                }
                return Err(msg);
            }
        }
        Ok(())
    }

    async fn replace_worker(&self, id: usize) -> Result<(), String> {
        let (tx, rx) = oneshot::channel();
        self.replace[id]
            .send(tx)
            .map_err(|_| "the worker's task has ended".to_string())?;
        rx.await
            .unwrap_or_else(|_| Err("the worker's task ended during the reload".to_string()))
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

/// Replaces workers `0..upto` again (after the spec was set back), in order; says how
/// that went.
async fn futures_in_order(sup: &Supervisor, upto: usize) -> String {
    for id in 0..upto {
        if let Err(e) = sup.replace_worker(id).await {
            return format!("rollback failed at worker {id}: {e}");
        }
    }
    "ok".to_string()
}

impl std::fmt::Debug for Supervisor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Supervisor")
            .field("app", &self.shared.app)
            .field("workers", &self.shared.slots.len())
            .finish_non_exhaustive()
    }
}
