//! Listening sockets and serving threads.
//!
//! Each serving thread runs its own single-threaded event loop with its own listening
//! socket on the same port (`SO_REUSEPORT`), the way nginx runs workers: no task ever
//! moves between threads, and idle backend connections are per thread, so the hot path
//! shares nothing but the endpoints' atomics.

use crate::admission::Admission;
use crate::conn::{self, Shared, Worker};
use crate::http1::request::KeySpec;
use crate::options::ProxyOptions;
use crate::upstream::Upstreams;
use drover_balance::cost::CostTable;
use drover_balance::Balancer;
use drover_registry::{is_local_shortage, Pool, WarnLimit};
use socket2::{Domain, Socket, Type};
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tracing::{debug, error, warn};

/// A running balancer listener.
pub struct Proxy {
    local_addr: SocketAddr,
    shared: Arc<Shared>,
    shutdown: watch::Sender<bool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Proxy {
    /// Binds `opts.listen` and starts `opts.threads` serving threads.
    pub fn start(
        opts: ProxyOptions,
        pool: Arc<Pool>,
        balancer: Arc<dyn Balancer>,
    ) -> io::Result<Proxy> {
        let threads = opts.threads.max(1);
        let first = bind(opts.listen, threads > 1)?;
        let local_addr = first.local_addr()?;
        let mut listeners = vec![first];
        for _ in 1..threads {
            listeners.push(bind(local_addr, true)?);
        }
        let (shutdown, shutdown_rx) = watch::channel(false);
        let shared = Arc::new(Shared {
            admission: Arc::new(Admission::new(
                Arc::clone(&balancer),
                Arc::clone(&pool),
                opts.queue.max,
                opts.queue.timeout,
            )),
            costs: CostTable::new(),
            keys: KeySpec {
                hash: opts.hash_key.clone(),
                sticky_cookie: opts.sticky_cookie.clone(),
            },
            opts,
            pool,
            shutdown: shutdown_rx,
            active: Default::default(),
        });
        let mut handles = Vec::new();
        for (i, listener) in listeners.into_iter().enumerate() {
            let shared = Arc::clone(&shared);
            let handle = std::thread::Builder::new()
                .name(format!("drover-{}-{i}", shared.opts.name))
                .spawn(move || serve_thread(listener, shared))?;
            handles.push(handle);
        }
        Ok(Proxy {
            local_addr,
            shared,
            shutdown,
            threads: handles,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    pub fn name(&self) -> &str {
        &self.shared.opts.name
    }

    /// Open client connections.
    pub fn active_connections(&self) -> usize {
        self.shared.active.load(Relaxed)
    }

    /// Requests waiting for a free endpoint.
    pub fn queued(&self) -> usize {
        self.shared.admission.waiting()
    }

    /// Stops accepting; idle connections close, busy ones close after their response.
    pub fn begin_shutdown(&self) {
        let _ = self.shutdown.send(true);
    }

    /// Waits until every connection has closed, or `timeout`; true when drained.
    pub async fn drained(&self, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        while self.active_connections() > 0 {
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        true
    }

    /// Serving threads still running (they end once their connections have closed).
    pub fn running_threads(&self) -> usize {
        self.threads.iter().filter(|t| !t.is_finished()).count()
    }
}

fn bind(addr: SocketAddr, reuse_port: bool) -> io::Result<std::net::TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    socket.set_reuse_address(true)?;
    if reuse_port {
        socket.set_reuse_port(true)?;
    }
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    Ok(socket.into())
}

/// How long the accept loop pauses after a failed accept.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(10);

/// Warnings about drover's own shortages on accept, shared by every serving thread.
static ACCEPT_SHORTAGE: WarnLimit = WarnLimit::new(Duration::from_secs(1));

/// A failed accept. Running out of descriptors or memory is drover's own problem and an
/// operator must hear of it (at most once a second, with how many were held back);
/// anything else (a client that reset before the accept) concerns one connection only.
fn accept_failed(balancer: &str, e: &io::Error) {
    if !is_local_shortage(e) {
        debug!("accept failed: {e}");
    } else if let Some(held_back) = ACCEPT_SHORTAGE.check_now() {
        warn!(
            balancer,
            held_back,
            "cannot accept connections, drover is out of resources (raise `ulimit -n`?): {e}"
        );
    }
}

fn serve_thread(listener: std::net::TcpListener, shared: Arc<Shared>) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            error!("cannot start a serving thread: {e}");
            return;
        }
    };
    runtime.block_on(async move {
        let listener = match tokio::net::TcpListener::from_std(listener) {
            Ok(l) => l,
            Err(e) => {
                error!("cannot register the listening socket: {e}");
                return;
            }
        };
        let timeouts = shared.opts.timeouts;
        let worker = Arc::new(Worker {
            upstreams: Upstreams::new(shared.opts.max_idle_per_endpoint, timeouts.idle),
            shared: Arc::clone(&shared),
        });
        let mut shutdown = shared.shutdown.clone();
        let mut sweep = tokio::time::interval((timeouts.idle / 2).max(Duration::from_millis(100)));
        loop {
            tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((stream, peer)) => {
                        let _ = stream.set_nodelay(true);
                        tokio::spawn(conn::serve(stream, peer, Arc::clone(&worker)));
                    }
                    Err(e) => {
                        accept_failed(&shared.opts.name, &e);
                        // The listener stays readable while the error lasts (the
                        // connection waits in the backlog): pause instead of spinning.
                        tokio::time::sleep(ACCEPT_BACKOFF).await;
                    }
                },
                _ = sweep.tick() => worker.upstreams.sweep(),
                _ = shutdown.changed() => break,
            }
        }
        drop(listener);
        // Keep the event loop turning until this balancer's connections have finished.
        while shared.active.load(Relaxed) > 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
}
