//! What a balancer's serving threads share, what each thread holds of its own, and the
//! process-wide count of open client connections.

use crate::access_log::AccessLog;
use crate::admission::Admission;
use crate::engine_io::Sessions;
use crate::http1::keys::KeySpec;
use crate::http2::backend::H2Backends;
use crate::options::ProxyOptions;
use crate::routes::Routes;
use crate::tls::Certificates;
use crate::upstream::Upstreams;
use arc_swap::{ArcSwap, ArcSwapOption};
use drover_balance::cost::CostTable;
use drover_balance::{Balancer, CostSpread};
use drover_metrics::BalancerStats;
use drover_registry::Pool;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use tokio::sync::watch;

/// What every serving thread of one balancer shares.
pub(crate) struct BalancerState {
    pub opts: ProxyOptions,
    pub pool: Arc<Pool>,
    pub admission: Arc<Admission>,
    pub costs: CostTable,
    /// Whether the app's requests cost alike (read by `Handoff::WhenEven`).
    pub spread: CostSpread,
    pub keys: KeySpec,
    pub shutdown: watch::Receiver<bool>,
    /// Open client connections, for draining on shutdown (one count for every
    /// generation of settings of a listener).
    pub active: Arc<AtomicUsize>,
    /// What the balancer's requests counted (one for every generation of settings).
    pub stats: Arc<BalancerStats>,
    /// `None` when the access log is off: the request path's one check.
    pub access_log: Option<Arc<AccessLog>>,
    /// The certificates new connections' handshakes use; `None`: plain HTTP. One for
    /// every generation of settings, so a reload that only re-reads the certificate
    /// files swaps them here and keeps everything else (`Proxy::set_tls`).
    pub tls: Arc<ArcSwapOption<Certificates>>,
    /// The balancers new connections (TCP mode, by the SNI of their ClientHello) or
    /// requests (HTTP, by host and path) go to; `None`: this balancer's own pool. One
    /// for every generation of settings: the routes name other balancers, so they are
    /// set after every balancer of a reload is in place (`Proxy::set_routes`).
    pub routes: Arc<ArcSwapOption<Routes>>,
    /// Which endpoint holds each socket.io session (one for every generation of
    /// settings: a reload keeps the sessions where they are).
    pub sessions: Arc<Sessions>,
    /// Set once a reload has replaced these settings: an HTTP/2 connection then sends
    /// GOAWAY, so its client moves to a new connection under the new ones (an HTTP/1.1
    /// connection moves at its next request).
    pub retired: watch::Sender<bool>,
}

/// What a listener keeps from one generation of its settings to the next.
pub(crate) struct Lasting {
    pub shutdown: watch::Receiver<bool>,
    pub active: Arc<AtomicUsize>,
    pub stats: Arc<BalancerStats>,
    pub tls: Arc<ArcSwapOption<Certificates>>,
    pub routes: Arc<ArcSwapOption<Routes>>,
    pub sessions: Arc<Sessions>,
}

impl BalancerState {
    pub fn new(
        opts: ProxyOptions,
        pool: Arc<Pool>,
        balancer: Arc<dyn Balancer>,
        lasting: Lasting,
        access_log: Option<Arc<AccessLog>>,
    ) -> Arc<BalancerState> {
        let Lasting {
            shutdown,
            active,
            stats,
            tls,
            routes,
            sessions,
        } = lasting;
        // The requests its workers answer on connections it hands them count here.
        pool.handoffs().count_into(Arc::clone(&stats));
        Arc::new(BalancerState {
            admission: Arc::new(Admission::new(
                balancer,
                Arc::clone(&pool),
                opts.queue.max,
                opts.queue.timeout,
                Arc::clone(&stats),
            )),
            costs: CostTable::new(),
            spread: CostSpread::new(),
            keys: KeySpec {
                hash: opts.hash_key.clone(),
                sticky_cookie: opts.sticky_cookie.clone(),
            },
            opts,
            pool,
            shutdown,
            active,
            stats,
            access_log,
            tls,
            routes,
            sessions,
            retired: watch::Sender::new(false),
        })
    }
}

/// One serving thread's view: the shared state plus its own backend connections.
pub(crate) struct ThreadState {
    pub shared: Arc<BalancerState>,
    pub upstreams: Upstreams,
    /// HTTP/2 connections to the endpoints (`backend_protocol` h2c or h2).
    pub h2_upstreams: H2Backends,
}

impl ThreadState {
    pub fn new(shared: Arc<BalancerState>) -> ThreadState {
        ThreadState {
            upstreams: Upstreams::new(shared.opts.max_idle_per_endpoint, shared.opts.timeouts.idle),
            h2_upstreams: H2Backends::default(),
            shared,
        }
    }

    /// Lets go of backend connections idle past the idle timeout.
    pub fn sweep(&self) {
        self.upstreams.sweep();
        self.h2_upstreams.sweep(self.shared.opts.timeouts.idle);
    }
}

/// A serving thread's current state; a reload swaps in one over new settings, and each
/// connection moves to it at its next request.
pub(crate) type ThreadCell = ArcSwap<ThreadState>;

/// Open client connections in this process, over every balancer: they share one
/// descriptor limit, which the accept loops keep them within.
static CLIENT_CONNECTIONS: AtomicUsize = AtomicUsize::new(0);

/// One accepted client connection, counted in `CLIENT_CONNECTIONS` from the accept
/// (before its task first runs, so a burst of accepts cannot overshoot) to its close.
pub(crate) struct ClientConnection(());

impl ClientConnection {
    pub fn accepted() -> ClientConnection {
        CLIENT_CONNECTIONS.fetch_add(1, Relaxed);
        ClientConnection(())
    }

    /// Open client connections in this process now.
    pub fn open() -> usize {
        CLIENT_CONNECTIONS.load(Relaxed)
    }

    /// Whether clients wait in a listen backlog for a descriptor that open client
    /// connections hold: then a keep-alive connection closes after its response (with
    /// `Connection: close`) and its client joins the line again. Before, the first
    /// connections kept every descriptor: under `ulimit -n 1024`, 450 of 2,000 clients
    /// were served over and over and 1,550 got nothing for as long as the load lasted.
    pub fn crowded() -> bool {
        CROWDED_THREADS.load(Relaxed) != 0
    }

    /// Serving thread `index` has clients waiting in its backlog for a descriptor, or
    /// no longer (see `crowded`).
    pub(crate) fn set_crowded(index: usize, crowded: bool) {
        let bit = 1u64 << (index % 64);
        if crowded {
            CROWDED_THREADS.fetch_or(bit, Relaxed);
        } else if CROWDED_THREADS.load(Relaxed) & bit != 0 {
            CROWDED_THREADS.fetch_and(!bit, Relaxed);
        }
    }
}

/// The serving threads (a bit each) whose listeners have clients waiting for a
/// descriptor (see `ClientConnection::crowded`).
static CROWDED_THREADS: AtomicU64 = AtomicU64::new(0);

impl Drop for ClientConnection {
    fn drop(&mut self) {
        CLIENT_CONNECTIONS.fetch_sub(1, Relaxed);
    }
}
