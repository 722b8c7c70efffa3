//! Listening sockets and serving threads.
//!
//! Each serving thread runs its own single-threaded event loop with its own listening
//! socket on the same port (`SO_REUSEPORT`), the way nginx runs workers: no task ever
//! moves between threads, and idle backend connections are per thread, so the hot path
//! shares nothing but the endpoints' atomics.

use crate::access_log::AccessLog;
use crate::conn;
use crate::descriptors;
use crate::handoff;
use crate::options::{Protocol, ProxyOptions};
use crate::routes::{self, RouteTarget, Routes};
use crate::state::{BalancerState, ClientConnection, Lasting, ThreadCell, ThreadState};
use crate::tcp;
use crate::tls::{self, Certificates};
use arc_swap::{ArcSwap, ArcSwapOption};
use drover_balance::{clock, Balancer};
use drover_metrics::{BalancerStats, CertificateExpiry};
use drover_registry::{is_local_shortage, Pool, WarnLimit};
use socket2::{Domain, Socket, Type};
use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::sync::watch;
use tracing::{debug, error, info, warn};

/// A running balancer listener.
pub struct Proxy {
    /// `None`: a balancer without a listener (`Proxy::unbound`).
    local_addr: Option<SocketAddr>,
    /// Where else it accepts (`start_also`).
    also_addrs: Vec<SocketAddr>,
    /// The address as configured (`:0` stays `:0`), to tell a changed one on reload.
    listen: Option<SocketAddr>,
    /// The settings in force; each serving thread's `ThreadCell` holds a state over it.
    /// Shared with the listeners whose routes send connections here (`route_target`).
    current: Arc<ArcSwap<BalancerState>>,
    /// Each serving thread's state (a balancer without a listener has no threads: the
    /// threads of listeners whose routes send here use these).
    cells: Arc<[Arc<ThreadCell>]>,
    /// Open client connections, over every generation of settings.
    active: Arc<AtomicUsize>,
    shutdown: watch::Sender<bool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

/// Why `Proxy::reconfigure` refused new settings; nothing was changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReconfigureError {
    /// The listening address differs: that is a new listener, not new settings.
    ListenChanged {
        from: Option<SocketAddr>,
        to: Option<SocketAddr>,
    },
    /// The serving threads differ: each owns a listening socket, and closing one would
    /// reset the connections waiting in its accept queue.
    ThreadsChanged { from: usize, to: usize },
    /// The new access log's path cannot be opened for append.
    AccessLog { path: String, error: String },
    /// The mode (HTTP or TCP) differs: connections open under one would be served by
    /// the other's rules (a kept-alive HTTP connection's next request relayed to a TCP
    /// backend), so the mode applies when drover starts.
    ModeChanged { from: Protocol, to: Protocol },
}

impl std::fmt::Display for ReconfigureError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReconfigureError::ListenChanged { from, to } => {
                let show = |a: &Option<SocketAddr>| a.map_or("none".to_string(), |a| a.to_string());
                write!(f, "listen changed from {} to {}", show(from), show(to))
            }
            ReconfigureError::ThreadsChanged { from, to } => write!(
                f,
                "threads changed from {from} to {to}; the thread count applies when drover starts"
            ),
            ReconfigureError::AccessLog { path, error } => {
                write!(f, "access_log.path: cannot open {path} for append: {error}")
            }
            ReconfigureError::ModeChanged { from, to } => write!(
                f,
                "mode changed from {from} to {to}; a balancer's mode applies when drover starts (or give it a new listen address)"
            ),
        }
    }
}

impl std::error::Error for ReconfigureError {}

impl Proxy {
    /// Binds `opts.listen` and starts `opts.threads` serving threads, each with its own
    /// socket (`SO_REUSEPORT`).
    pub fn start(
        opts: ProxyOptions,
        pool: Arc<Pool>,
        balancer: Arc<dyn Balancer>,
    ) -> io::Result<Proxy> {
        Proxy::start_also(opts, Vec::new(), pool, balancer)
    }

    /// As `start`, and every serving thread also accepts on each of `also`: listening
    /// sockets bound elsewhere (`drover run` serves an app that listens at `localhost`
    /// at both loopback addresses, as Node's cluster primary binds each address the
    /// app's `listen()` calls name). Not kept across a reload's `reconfigure`, which
    /// keeps the sockets it has.
    pub fn start_also(
        opts: ProxyOptions,
        also: Vec<std::net::TcpListener>,
        pool: Arc<Pool>,
        balancer: Arc<dyn Balancer>,
    ) -> io::Result<Proxy> {
        let threads = opts.threads.max(1);
        let Some(listen) = opts.listen else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "no listen address (a balancer without one starts with Proxy::unbound)",
            ));
        };
        let group = if threads > 1 { Bind::Lead } else { Bind::Alone };
        let first = bind(listen, group)?;
        let local_addr = first.local_addr()?;
        let mut listeners = vec![first];
        for _ in 1..threads {
            listeners.push(bind(local_addr, Bind::Join)?);
        }
        Proxy::serve(opts, listeners, also, pool, balancer)
    }

    /// Starts serving on `listener`, a listening socket bound elsewhere (one systemd
    /// passed): every serving thread accepts from it, since another socket could only
    /// share its port if it had been bound with `SO_REUSEPORT`.
    pub fn start_on(
        opts: ProxyOptions,
        listener: std::net::TcpListener,
        pool: Arc<Pool>,
        balancer: Arc<dyn Balancer>,
    ) -> io::Result<Proxy> {
        listener.set_nonblocking(true)?;
        let mut listeners = Vec::new();
        for _ in 1..opts.threads.max(1) {
            listeners.push(listener.try_clone()?);
        }
        listeners.push(listener);
        Proxy::serve(opts, listeners, Vec::new(), pool, balancer)
    }

    /// A balancer without a listener: it serves only what other listeners' routes send
    /// it, on their serving threads, each with one of this balancer's `opts.threads`
    /// states (its settings, and idle backend connections of its own).
    pub fn unbound(
        opts: ProxyOptions,
        pool: Arc<Pool>,
        balancer: Arc<dyn Balancer>,
    ) -> io::Result<Proxy> {
        Proxy::serve(opts, Vec::new(), Vec::new(), pool, balancer)
    }

    /// Serves on `listeners`, a serving thread each (none: `unbound`), each thread also
    /// on every one of `also`.
    fn serve(
        opts: ProxyOptions,
        listeners: Vec<std::net::TcpListener>,
        also: Vec<std::net::TcpListener>,
        pool: Arc<Pool>,
        balancer: Arc<dyn Balancer>,
    ) -> io::Result<Proxy> {
        let threads = match listeners.len() {
            0 => opts.threads.max(1),
            n => n,
        };
        let listen = opts.listen;
        let local_addr = listeners.first().map(|l| l.local_addr()).transpose()?;
        let also_addrs = also
            .iter()
            .map(std::net::TcpListener::local_addr)
            .collect::<io::Result<Vec<_>>>()?;
        let (shutdown, shutdown_rx) = watch::channel(false);
        let active = Arc::new(AtomicUsize::new(0));
        let stats = Arc::new(BalancerStats::default());
        let access_log = AccessLog::start(&opts.access_log, Arc::clone(&stats))
            .map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!(
                        "access_log.path: cannot open {} for append: {e}",
                        opts.access_log.path
                    ),
                )
            })?
            .map(Arc::new);
        let tls = Arc::new(ArcSwapOption::empty());
        install_tls(&opts.name, &tls, &stats, opts.tls.clone());
        let lasting = Lasting {
            shutdown: shutdown_rx,
            active: Arc::clone(&active),
            stats,
            tls,
            routes: Arc::new(ArcSwapOption::empty()),
            sessions: Arc::default(),
        };
        let shared = BalancerState::new(opts, pool, balancer, lasting, access_log);
        let cells: Arc<[Arc<ThreadCell>]> = (0..threads)
            .map(|_| {
                Arc::new(ThreadCell::from_pointee(ThreadState::new(Arc::clone(
                    &shared,
                ))))
            })
            .collect();
        // Read once: drover raises its soft limit at start, before any listener.
        let client_budget = descriptors::client_budget(descriptors::limit()?.0);
        let mut handles = Vec::new();
        for (i, (listener, cell)) in listeners.into_iter().zip(cells.iter()).enumerate() {
            let mut listeners = vec![listener];
            for other in &also {
                listeners.push(other.try_clone()?);
            }
            let (cell, shutdown, active) =
                (Arc::clone(cell), shutdown.subscribe(), Arc::clone(&active));
            let name = shared.opts.name.clone();
            let handle = std::thread::Builder::new()
                .name(format!("drover-{name}-{i}"))
                .spawn(move || {
                    serve_thread(listeners, name, cell, shutdown, active, client_budget, i)
                })?;
            handles.push(handle);
        }
        Ok(Proxy {
            local_addr,
            also_addrs,
            listen,
            current: Arc::new(ArcSwap::new(shared)),
            cells,
            active,
            shutdown,
            threads: handles,
        })
    }

    /// Serves with new settings, pool and strategy from now on, on the same listening
    /// sockets: no connection is refused or closed. Each connection moves to them at its
    /// next request; requests already under way finish as they began.
    pub fn reconfigure(
        &self,
        opts: ProxyOptions,
        pool: Arc<Pool>,
        balancer: Arc<dyn Balancer>,
    ) -> Result<(), ReconfigureError> {
        if opts.listen != self.listen {
            return Err(ReconfigureError::ListenChanged {
                from: self.listen,
                to: opts.listen,
            });
        }
        if opts.threads.max(1) != self.cells.len() {
            return Err(ReconfigureError::ThreadsChanged {
                from: self.cells.len(),
                to: opts.threads.max(1),
            });
        }
        let current = self.current.load();
        if opts.protocol != current.opts.protocol {
            return Err(ReconfigureError::ModeChanged {
                from: current.opts.protocol,
                to: opts.protocol,
            });
        }
        // The same settings keep the log (and its writer) as it is; new ones open anew,
        // and the old log writes out what waits once its last request is done.
        let access_log = match &current.access_log {
            Some(log) if *log.settings() == opts.access_log => Some(Arc::clone(log)),
            _ if opts.access_log == current.opts.access_log => None,
            _ => AccessLog::start(&opts.access_log, Arc::clone(&current.stats))
                .map_err(|e| ReconfigureError::AccessLog {
                    path: opts.access_log.path.clone(),
                    error: e.to_string(),
                })?
                .map(Arc::new),
        };
        let tls = Arc::clone(&current.tls);
        install_tls(&opts.name, &tls, &current.stats, opts.tls.clone());
        let lasting = Lasting {
            shutdown: self.shutdown.subscribe(),
            active: Arc::clone(&self.active),
            stats: Arc::clone(&current.stats),
            tls,
            routes: Arc::clone(&current.routes),
            sessions: Arc::clone(&current.sessions),
        };
        let shared = BalancerState::new(opts, pool, balancer, lasting, access_log);
        for cell in self.cells.iter() {
            cell.store(Arc::new(ThreadState::new(Arc::clone(&shared))));
        }
        self.current.store(shared);
        current.retired.send_replace(true);
        Ok(())
    }

    /// Serves new connections with these certificates from now on (`None`: plain HTTP),
    /// every other setting as it is: a reload that re-read unchanged settings' files.
    /// Connections under way keep the session they have.
    pub fn set_tls(&self, certs: Option<Arc<Certificates>>) {
        let current = self.current.load();
        install_tls(&current.opts.name, &current.tls, &current.stats, certs);
    }

    /// This balancer, as another listener's routes send connections to it: with the
    /// settings in force whenever one arrives.
    pub fn route_target(&self) -> RouteTarget {
        RouteTarget {
            name: self.name(),
            current: Arc::clone(&self.current),
            cells: Arc::clone(&self.cells),
        }
    }

    /// Places new connections (TCP mode) or requests (HTTP) by these routes from now
    /// on (`None`: on this balancer's own pool, as without routes); what is under way
    /// stays where it is.
    pub fn set_routes(&self, routes: Option<Routes>) {
        self.current.load().routes.store(routes.map(Arc::new));
    }

    /// What this balancer's requests counted, since it started (kept across
    /// `reconfigure`).
    pub fn stats(&self) -> Arc<BalancerStats> {
        Arc::clone(&self.current.load().stats)
    }

    /// Requests waiting in the queue now.
    pub fn queue_depth(&self) -> usize {
        self.current.load().admission.waiting()
    }

    /// Open client connections now.
    pub fn connections(&self) -> usize {
        self.active.load(Relaxed)
    }

    /// socket.io sessions kept on each endpoint now, by the endpoint's id.
    pub fn sessions_by_endpoint(&self) -> HashMap<Box<str>, u64> {
        self.current.load().sessions.held_by_endpoint(clock::now())
    }

    /// Where it listens; `None`: nowhere (`unbound`).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.local_addr
    }

    /// Where else it accepts (`start_also`).
    pub fn also_addrs(&self) -> &[SocketAddr] {
        &self.also_addrs
    }

    pub fn name(&self) -> String {
        self.current.load().opts.name.clone()
    }

    /// Serving threads, each with its own listening socket.
    pub fn thread_count(&self) -> usize {
        self.cells.len()
    }

    /// Stops accepting; idle connections close, busy ones close after their response.
    pub fn begin_shutdown(&self) {
        let _ = self.shutdown.send(true);
    }

    /// Whether `begin_shutdown` was called.
    pub fn is_shutting_down(&self) -> bool {
        *self.shutdown.borrow()
    }

    /// Waits until every connection has closed, or `timeout`; true when drained.
    pub async fn drained(&self, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        while self.connections() > 0 {
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

/// Reads the listener's certificates again when their files change (`tls::watch`), on
/// its first serving thread: a `stat` per file every 2 s, and a read (a few ms) only on
/// a change. A reload meanwhile wins: what was read is put in force only over the
/// certificates it was read for.
async fn watch_certificates(cell: Arc<ThreadCell>, mut shutdown: watch::Receiver<bool>) {
    let mut watch = tls::watch::Watch::default();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(tls::watch::INTERVAL) => {}
            _ = shutdown.changed() => return,
        }
        let state = cell.load();
        let shared = &state.shared;
        let current = shared.tls.load_full();
        let Some(certs) = &current else { continue };
        let name = &shared.opts.name;
        match watch.look(certs) {
            None => {}
            Some(Ok(read)) => {
                let read = Some(Arc::new(read));
                let before = shared.tls.compare_and_swap(&current, read.clone());
                let swapped = match (&*before, &current) {
                    (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                    _ => false,
                };
                if swapped {
                    info!(balancer = %name, "TLS certificate files changed: read again, serving them from now on");
                    show_tls(name, &shared.stats, read.as_deref());
                }
            }
            Some(Err(e)) => error!(
                balancer = %name,
                "TLS certificate files changed but cannot be used; the certificates read before serve on: {e}"
            ),
        }
    }
}

/// Puts `certs` in force for new handshakes, shows them in the metrics, and warns of
/// each that expires within `tls::EXPIRY_WARNING`. A reload's certificates that would
/// put an expired one where a valid one serves are not put in force
/// (`Certificates::check_renewal_of`): the listener's certificates stay as they are, and
/// the rest of the reload applies.
fn install_tls(
    balancer: &str,
    slot: &ArcSwapOption<Certificates>,
    stats: &BalancerStats,
    certs: Option<Arc<Certificates>>,
) {
    if let (Some(new), Some(served)) = (&certs, &*slot.load()) {
        if let Err(e) = new.check_renewal_of(served, std::time::SystemTime::now()) {
            error!(balancer, "TLS certificates not changed by the reload, the ones read before serve on: {e}, where the one served has not");
            return;
        }
    }
    show_tls(balancer, stats, certs.as_deref());
    slot.store(certs);
}

/// Shows `certs` in the metrics, and warns of each that expires within
/// `tls::EXPIRY_WARNING` (an error for one that has expired: clients refuse it).
fn show_tls(balancer: &str, stats: &BalancerStats, certs: Option<&Certificates>) {
    let info = certs.map_or(&[][..], |c| c.info());
    stats.set_tls_certificates(
        info.iter()
            .map(|c| CertificateExpiry {
                cert: c.path.clone(),
                not_after: c.not_after,
            })
            .collect(),
    );
    if let Some(certs) = certs {
        let now = std::time::SystemTime::now();
        for c in certs.expired(now) {
            error!(
                balancer,
                cert = %c.path,
                names = %c.names.join(","),
                "the TLS certificate expired on {}: clients refuse it (served still, so the \
                 listener's other names serve on); renew it (drover reads renewed files by itself)",
                c.not_after_text()
            );
        }
        for c in certs
            .expiring(now)
            .filter(|c| !certs.expired(now).any(|e| e.path == c.path))
        {
            warn!(
                balancer,
                cert = %c.path,
                names = %c.names.join(","),
                "the TLS certificate expires on {}: renew it (drover reads renewed files by itself)",
                c.not_after_text()
            );
        }
    }
}

/// How a serving thread's listening socket takes its address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bind {
    /// The only one: no `SO_REUSEPORT`.
    Alone,
    /// The first of several: the address must be free, so it binds without
    /// `SO_REUSEPORT` and sets it after, for the others to join. Set before, the bind
    /// would join another drover's group on the address (every drover with more than
    /// one thread has one), and the two would silently split the connections: a second
    /// `drover run -l 127.0.0.1:8080` started, where it must fail with "address in use".
    Lead,
    /// One more, joining the first's group.
    Join,
}

/// A listening socket at `addr`, bound as a balancer binds its own: for `start_also`.
pub fn listener(addr: SocketAddr) -> io::Result<std::net::TcpListener> {
    bind(addr, Bind::Alone)
}

fn bind(addr: SocketAddr, how: Bind) -> io::Result<std::net::TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    socket.set_reuse_address(true)?;
    if how == Bind::Join {
        socket.set_reuse_port(true)?;
    }
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    if how == Bind::Lead {
        socket.set_reuse_port(true)?;
    }
    socket.listen(1024)?;
    Ok(socket.into())
}

/// How long the accept loop pauses after a failed accept.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(10);

/// How often a paused accept loop looks again whether it may accept (two atomic loads
/// and a clock read each time).
const ACCEPT_PAUSE_POLL: Duration = Duration::from_millis(5);

/// Notices that accepting paused, shared by every serving thread.
static ACCEPT_PAUSES: WarnLimit = WarnLimit::new(Duration::from_secs(1));

/// Why the accept loop leaves new connections in the kernel's listen backlog for now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backpressure {
    /// Open client connections reached what the descriptor limit allows, with room
    /// for a backend connection each.
    Descriptors,
    /// The oldest queued request has waited a quarter of the queue timeout.
    QueueBackedUp,
}

impl Backpressure {
    /// Whether accepting should pause now, and why.
    fn now(cell: &ThreadCell, client_budget: usize) -> Option<Backpressure> {
        if ClientConnection::open() >= client_budget {
            Some(Backpressure::Descriptors)
        } else if backed_up(&cell.load().shared, clock::now()) {
            Some(Backpressure::QueueBackedUp)
        } else {
            None
        }
    }

    fn reason(self) -> &'static str {
        match self {
            Backpressure::Descriptors => {
                "open client connections are at what the descriptor limit allows"
            }
            Backpressure::QueueBackedUp => {
                "queued requests have waited a quarter of the queue timeout"
            }
        }
    }
}

/// Whether the queue of what serves the listener's requests is backed up at `now`: its
/// own balancer's, or with HTTP routes, every balancer they (and what no route matches)
/// may go to. One route's overload alone leaves the listener accepting: its other
/// routes' clients are not held in the backlog for it.
fn backed_up(listener: &BalancerState, now: drover_balance::Nanos) -> bool {
    match listener.routes.load().as_deref() {
        Some(Routes::Http(routes)) => {
            (!routes.listener_default() || listener.admission.backed_up(now))
                && routes
                    .distinct_targets()
                    .iter()
                    .all(|t| t.current.load().admission.backed_up(now))
        }
        _ => listener.admission.backed_up(now),
    }
}

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

fn serve_thread(
    listeners: Vec<std::net::TcpListener>,
    name: String,
    cell: Arc<ThreadCell>,
    mut shutdown: watch::Receiver<bool>,
    active: Arc<AtomicUsize>,
    client_budget: usize,
    index: usize,
) {
    routes::set_serving_thread(index);
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
        if index == 0 {
            tokio::spawn(watch_certificates(Arc::clone(&cell), shutdown.clone()));
        }
        let listeners = match listeners
            .into_iter()
            .map(|l| l.set_nonblocking(true).and_then(|()| tokio::net::TcpListener::from_std(l)))
            .collect::<io::Result<Vec<_>>>()
        {
            Ok(listeners) => listeners,
            Err(e) => {
                error!("cannot register the listening socket: {e}");
                return;
            }
        };
        let mut turn = 0;
        // Idle backend connections are swept at a period that follows the idle timeout in
        // force; a reload that changes it takes effect at the next tick.
        let period = |cell: &ThreadCell| {
            (cell.load().shared.opts.timeouts.idle / 2).max(Duration::from_millis(100))
        };
        let mut sweep = tokio::time::interval(period(&cell));
        let mut paused = false;
        loop {
            // Backpressure: past capacity, new connections wait in the kernel's listen
            // backlog (as under Node's cluster module) rather than in drover, where
            // they would hold descriptors until accepts and backend connects fail.
            let pause = Backpressure::now(&cell, client_budget);
            // Out of descriptors with clients in the backlog: connections open now
            // close after their responses, so the descriptors go round.
            ClientConnection::set_crowded(
                index,
                matches!(pause, Some(Backpressure::Descriptors)) && someone_waits(&listeners),
            );
            if pause.is_some() != paused {
                paused = pause.is_some();
                match pause {
                    Some(why) => {
                        if let Some(held_back) = ACCEPT_PAUSES.check_now() {
                            warn!(balancer = %name, held_back, "not accepting new connections for now, they wait in the listen backlog: {}", why.reason());
                        }
                    }
                    None => debug!(balancer = %name, "accepting again"),
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(ACCEPT_PAUSE_POLL), if paused => {}
                accepted = accept_any(&listeners, &mut turn), if !paused => match accepted {
                    Ok((stream, peer)) => {
                        let _ = stream.set_nodelay(true);
                        let Some(stream) = handoff::at_accept(&cell, stream) else {
                            continue;
                        };
                        let counted = ClientConnection::accepted();
                        // A listener's mode is fixed (`ReconfigureError::ModeChanged`).
                        if cell.load().shared.opts.protocol == Protocol::Tcp {
                            tokio::spawn(tcp::serve(stream, peer, Arc::clone(&cell), counted));
                        } else {
                            tokio::spawn(conn::serve(stream, peer, Arc::clone(&cell), counted, true));
                        }
                    }
                    Err(e) => {
                        accept_failed(&name, &e);
                        // The listener stays readable while the error lasts (the
                        // connection waits in the backlog): pause instead of spinning.
                        tokio::time::sleep(ACCEPT_BACKOFF).await;
                    }
                },
                _ = handoff::returned(&cell) => serve_returned(&cell),
                _ = sweep.tick() => {
                    let state = cell.load();
                    state.sweep();
                    if let Some(routes) = &*state.shared.routes.load() {
                        routes.sweep();
                    }
                    if sweep.period() != period(&cell) {
                        sweep = tokio::time::interval(period(&cell));
                        sweep.reset();
                    }
                }
                _ = shutdown.changed() => break,
            }
        }
        drop(listeners);
        // Keep the event loop turning until this balancer's connections have finished.
        while active.load(Relaxed) > 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
}

/// Whether a connection waits in the backlog of one of `listeners` (they are not
/// accepting: see `Backpressure`).
fn someone_waits(listeners: &[tokio::net::TcpListener]) -> bool {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::AsFd;
    let mut fds: Vec<PollFd> = listeners
        .iter()
        .map(|l| PollFd::new(l.as_fd(), PollFlags::POLLIN))
        .collect();
    matches!(poll(&mut fds, PollTimeout::ZERO), Ok(n) if n > 0)
}

/// The next connection from any of `listeners`, asking each in turn from `turn` on, so
/// a busy one does not starve the others.
async fn accept_any(
    listeners: &[tokio::net::TcpListener],
    turn: &mut usize,
) -> io::Result<(TcpStream, SocketAddr)> {
    std::future::poll_fn(|cx| {
        for k in 0..listeners.len() {
            let i = (*turn + k) % listeners.len();
            if let std::task::Poll::Ready(accepted) = listeners[i].poll_accept(cx) {
                *turn = (i + 1) % listeners.len();
                return std::task::Poll::Ready(accepted);
            }
        }
        std::task::Poll::Pending
    })
    .await
}

/// Serves here every connection given back and not yet taken: from its next request on,
/// as if it had just been accepted.
pub(crate) fn serve_returned(cell: &Arc<ThreadCell>) {
    let worker = cell.load();
    let shared = &worker.shared;
    while let Some(plain) = shared.pool.handoffs().take_returned() {
        let peer = match plain.peer_addr() {
            Ok(peer) => peer,
            // The client left meanwhile.
            Err(_) => continue,
        };
        let stream = match TcpStream::from_std(plain) {
            Ok(stream) => stream,
            Err(e) => {
                debug!("cannot serve a connection a worker gave back: {e}");
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        shared.stats.record_returned();
        let counted = ClientConnection::accepted();
        tokio::spawn(conn::serve(stream, peer, Arc::clone(cell), counted, false));
    }
}
