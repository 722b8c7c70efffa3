//! Endpoints that take client connections themselves: a worker that is handed a
//! connection serves it directly, with drover no longer in its path (a Node app under
//! `drover run --mode handoff`, through drover-node's cluster channel).
//!
//! The balancer's accept loop asks `Handoffs::hand_off` for each new connection. It goes
//! to the endpoint that is least behind: fewest connections given and not yet taken up
//! (a worker whose event loop is busy does not take them, so this is its load, seen
//! without a request), then one not saturated by its CPU report, then the one given the
//! fewest so far, which spreads equal workers evenly. An endpoint out of the pool (not
//! ready, draining, ejected) gets none. When none can take it, the caller serves the
//! connection itself.
//!
//! A worker of its own (`hand_to_own`): while an app has more workers than client
//! connections, a connection may go to a worker that serves nothing else, and nothing
//! waits behind anything. Once connections outnumber the workers, `reclaim` asks for
//! them back, and each request is placed again.
//!
//! The other way: a worker that retires (a reload, a scale-down) gives its connections
//! back between two requests (`give_back`), and the balancer serves them from then on
//! (`take_returned`); so does one asked to by `reclaim`.

use arc_swap::ArcSwap;
use drover_balance::{clock, Endpoint};
use std::collections::VecDeque;
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;

/// A worker's way of taking connections.
pub trait TakesConnections: Send + Sync {
    /// Connections given and not yet taken up by the worker.
    fn queued(&self) -> usize;
    /// Connections wait and the worker has taken up none of them for a while: it is
    /// busy in one long task, stopped, or hung, and gets no more for now.
    fn is_stalled(&self) -> bool;
    /// Gives it `stream`, or returns it when the worker can take no more.
    fn give(&self, stream: TcpStream) -> Result<(), TcpStream>;
    /// Client connections given to it that it serves now; `None` when it cannot say.
    fn clients(&self) -> Option<usize>;
    /// Asks it to give back the client connections it serves, each between two
    /// requests, and to go on serving.
    fn reclaim(&self);
}

/// What the workers that count their client connections serve.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Occupancy {
    /// Workers in the pool (available) that say how many client connections they serve.
    pub workers: usize,
    /// Client connections those workers serve.
    pub clients: usize,
}

/// Which free worker `Handoffs::hand_to_own` gives a connection to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OwnWorker {
    /// The one given the fewest so far; `prefer` (the worker that served the
    /// connection's last request) if it is free.
    AnyFree { prefer: Option<SocketAddr> },
    /// This one if it is free; none else.
    Only(SocketAddr),
}

/// Past this many queued connections a worker is given no more, stalled or not: a
/// burst (a load test opening its connections at once) is taken up within a turn or
/// two of the workers' event loops; this bounds what one worker can be left holding.
const MAX_QUEUED: usize = 256;

/// Connections given back and not yet taken by a serving thread. Serving threads take
/// them at once; a bound keeps a balancer that no longer serves (reconfigured away)
/// from holding descriptors: past it, a connection is closed between two requests, as
/// the retiring worker would have closed it.
const MAX_RETURNED: usize = 4096;

/// A worker at or above this CPU share (its main thread's, from the supervisor's
/// reports) is saturated: new connections go to one that is not, when there is one.
const SATURATED: f64 = 0.95;

struct Taker {
    addr: SocketAddr,
    takes: Arc<dyn TakesConnections>,
    given: AtomicU64,
}

/// The endpoints of one pool that take connections.
#[derive(Default)]
pub struct Handoffs {
    takers: ArcSwap<Vec<Arc<Taker>>>,
    /// Serializes writers; the accept path only loads `takers`.
    writer: Mutex<()>,
    /// Connections workers gave back, oldest first.
    returned: Mutex<VecDeque<TcpStream>>,
    returned_ready: Notify,
    /// The counts of the balancer that hands the connections over, where the requests
    /// the workers answer on them are added (drover sees none of them pass).
    counted_in: arc_swap::ArcSwapOption<drover_metrics::BalancerStats>,
}

impl std::fmt::Debug for Handoffs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let addrs: Vec<SocketAddr> = self.takers.load().iter().map(|t| t.addr).collect();
        f.debug_struct("Handoffs").field("takers", &addrs).finish()
    }
}

impl Handoffs {
    /// Requests workers answer on connections handed to them are counted in `stats`,
    /// the balancer's that hands them over.
    pub fn count_into(&self, stats: Arc<drover_metrics::BalancerStats>) {
        self.counted_in.store(Some(stats));
    }

    /// Requests a worker reported it answered on connections handed to it.
    pub fn served(&self, served: &drover_metrics::ServedByWorker) {
        if let Some(stats) = self.counted_in.load().as_ref() {
            stats.record_served_by_worker(served);
        }
    }

    /// `addr` takes connections through `takes` (replacing what it had).
    pub fn register(&self, addr: SocketAddr, takes: Arc<dyn TakesConnections>) {
        let _w = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        let mut list: Vec<Arc<Taker>> = self
            .takers
            .load()
            .iter()
            .filter(|t| t.addr != addr)
            .cloned()
            .collect();
        list.push(Arc::new(Taker {
            addr,
            takes,
            given: AtomicU64::new(0),
        }));
        self.takers.store(Arc::new(list));
    }

    /// `addr` takes no more connections.
    pub fn unregister(&self, addr: SocketAddr) {
        let _w = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        let list: Vec<Arc<Taker>> = self
            .takers
            .load()
            .iter()
            .filter(|t| t.addr != addr)
            .cloned()
            .collect();
        self.takers.store(Arc::new(list));
    }

    /// A retiring worker gave `stream` back, between two requests: the balancer serves
    /// it from now on. It is closed when too many wait already.
    pub fn give_back(&self, stream: TcpStream) {
        let mut returned = self.returned.lock().unwrap_or_else(|e| e.into_inner());
        if returned.len() < MAX_RETURNED {
            returned.push_back(stream);
            self.returned_ready.notify_one();
        }
    }

    /// The oldest connection given back and not yet taken.
    pub fn take_returned(&self) -> Option<TcpStream> {
        self.returned
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop_front()
    }

    /// Ready when a connection may have been given back since the last call.
    pub async fn returned(&self) {
        self.returned_ready.notified().await
    }

    /// Whether any endpoint takes connections (a cheap test for the accept path).
    pub fn any(&self) -> bool {
        !self.takers.load().is_empty()
    }

    /// How many endpoints take connections, in the pool or not.
    pub fn taker_count(&self) -> usize {
        self.takers.load().len()
    }

    /// What the workers that count their client connections serve now (see
    /// `Occupancy`); workers out of the pool are left out.
    pub fn occupancy(&self, find: impl Fn(SocketAddr) -> Option<Arc<Endpoint>>) -> Occupancy {
        let now = clock::now();
        let mut o = Occupancy::default();
        for t in self.takers.load().iter() {
            let Some(clients) = t.takes.clients() else {
                continue;
            };
            o.clients += clients;
            if find(t.addr).is_some_and(|ep| ep.is_available(now)) {
                o.workers += 1;
            }
        }
        o
    }

    /// Client connections the worker at `addr` serves directly now; `None` when it takes
    /// none, or cannot say.
    pub fn clients_of(&self, addr: SocketAddr) -> Option<usize> {
        self.takers
            .load()
            .iter()
            .find(|t| t.addr == addr)
            .and_then(|t| t.takes.clients())
    }

    /// Asks every worker that serves client connections to give them back.
    pub fn reclaim(&self) {
        for t in self.takers.load().iter() {
            if t.takes.clients().is_some_and(|n| n > 0) {
                t.takes.reclaim();
            }
        }
    }

    /// Gives `stream` to a worker of its own: one in the pool that serves no client
    /// connection, has none on its way, and has no request of the balancer's in flight;
    /// of those, the one `to` says. The address it went to, or the stream back when
    /// there is none.
    pub fn hand_to_own(
        &self,
        stream: TcpStream,
        to: OwnWorker,
        find: impl Fn(SocketAddr) -> Option<Arc<Endpoint>>,
    ) -> Result<SocketAddr, TcpStream> {
        let (prefer, only) = match to {
            OwnWorker::AnyFree { prefer } => (prefer, None),
            OwnWorker::Only(addr) => (Some(addr), Some(addr)),
        };
        self.give_to_least(stream, prefer, find, |t, ep, now| {
            if only.is_some_and(|addr| addr != t.addr) {
                return None;
            }
            let free = t.takes.clients() == Some(0)
                && t.takes.queued() == 0
                && ep.is_available(now)
                && ep.in_flight() == 0;
            free.then(|| (0, false, t.given.load(Relaxed)))
        })
    }

    /// Gives `stream` to the endpoint of `endpoints` least behind, `prefer` among those
    /// as far behind as it; the address it went to, or the stream back when none can
    /// take it.
    pub fn hand_off(
        &self,
        stream: TcpStream,
        prefer: Option<SocketAddr>,
        find: impl Fn(SocketAddr) -> Option<Arc<Endpoint>>,
    ) -> Result<SocketAddr, TcpStream> {
        self.give_to_least(stream, prefer, find, |t, ep, now| {
            if !ep.is_available(now) {
                return None;
            }
            let queued = t.takes.queued();
            if queued >= MAX_QUEUED || t.takes.is_stalled() {
                return None;
            }
            let saturated = ep.reported_load(now) >= SATURATED;
            Some((queued, saturated, t.given.load(Relaxed)))
        })
    }

    /// Gives `stream` to the taker with the lowest `rank` (`None`: it may not take it);
    /// of those as far behind, `prefer`: the worker that served the connection's last
    /// request, where the app may keep its client's state (an in-memory session), as it
    /// would under Node's cluster module, which never moves a connection. Handed to
    /// another idle worker, one browser tab's connection found its login gone on every
    /// page after it; handed elsewhere while its worker's CPU read saturated (from that
    /// very request), on one page in a hundred.
    fn give_to_least(
        &self,
        stream: TcpStream,
        prefer: Option<SocketAddr>,
        find: impl Fn(SocketAddr) -> Option<Arc<Endpoint>>,
        rank: impl Fn(&Taker, &Endpoint, u64) -> Option<(usize, bool, u64)>,
    ) -> Result<SocketAddr, TcpStream> {
        let takers = self.takers.load();
        let now = clock::now();
        let best = takers
            .iter()
            .filter_map(|t| {
                let ep = find(t.addr)?;
                let (behind, saturated, given) = rank(t, &ep, now)?;
                let elsewhere = prefer != Some(t.addr);
                Some(((behind, elsewhere, saturated, given), (t, ep)))
            })
            .min_by_key(|(key, _)| *key)
            .map(|(_, best)| best);
        let Some((taker, ep)) = best else {
            return Err(stream);
        };
        taker.takes.give(stream)?;
        taker.given.fetch_add(1, Relaxed);
        ep.note_handed_connection();
        Ok(taker.addr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    const ANY: OwnWorker = OwnWorker::AnyFree { prefer: None };
    use std::net::TcpListener;
    use std::sync::atomic::AtomicUsize;

    struct Fake {
        queued: AtomicUsize,
        stalled: std::sync::atomic::AtomicBool,
        got: Mutex<Vec<TcpStream>>,
        /// `usize::MAX`: cannot say.
        clients: AtomicUsize,
        reclaims: AtomicUsize,
    }

    impl TakesConnections for Fake {
        fn queued(&self) -> usize {
            self.queued.load(Relaxed)
        }
        fn is_stalled(&self) -> bool {
            self.stalled.load(Relaxed)
        }
        fn give(&self, stream: TcpStream) -> Result<(), TcpStream> {
            self.got.lock().unwrap().push(stream);
            Ok(())
        }
        fn clients(&self) -> Option<usize> {
            Some(self.clients.load(Relaxed)).filter(|&n| n != usize::MAX)
        }
        fn reclaim(&self) {
            self.reclaims.fetch_add(1, Relaxed);
        }
    }

    fn fake(queued: usize) -> Arc<Fake> {
        Arc::new(Fake {
            queued: AtomicUsize::new(queued),
            stalled: std::sync::atomic::AtomicBool::new(false),
            got: Mutex::new(Vec::new()),
            clients: AtomicUsize::new(usize::MAX),
            reclaims: AtomicUsize::new(0),
        })
    }

    fn stream(l: &TcpListener) -> TcpStream {
        TcpStream::connect(l.local_addr().unwrap()).unwrap()
    }

    /// Two endpoints, each a registered taker that has taken up all it was given.
    fn two_takers() -> ([Arc<Endpoint>; 2], Handoffs, Arc<Fake>, Arc<Fake>) {
        let eps = [1, 2].map(|p| Arc::new(Endpoint::new(SocketAddr::from(([127, 0, 0, 1], p)))));
        let h = Handoffs::default();
        let (fa, fb) = (fake(0), fake(0));
        h.register(eps[0].addr(), fa.clone());
        h.register(eps[1].addr(), fb.clone());
        (eps, h, fa, fb)
    }

    #[test]
    fn equal_workers_alternate_and_a_worker_behind_gets_none() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let (eps, h, fa, fb) = two_takers();
        let (a, b) = (eps[0].addr(), eps[1].addr());
        let find = |addr: SocketAddr| eps.iter().find(|e| e.addr() == addr).cloned();
        assert!(!eps[0].serves_clients());
        for _ in 0..10 {
            h.hand_off(stream(&l), None, find).unwrap();
        }
        assert_eq!(fa.got.lock().unwrap().len(), 5);
        assert_eq!(fb.got.lock().unwrap().len(), 5);
        // Each now serves requests drover does not see (no learned limit holds there).
        assert!(eps.iter().all(|e| e.serves_clients()));

        // a's event loop is busy: it has not taken up what it was given.
        fa.queued.store(1, Relaxed);
        for _ in 0..6 {
            assert_eq!(h.hand_off(stream(&l), None, find).unwrap(), b);
        }
        // Both far behind, or stalled: the caller keeps the connection.
        fa.queued.store(MAX_QUEUED, Relaxed);
        fb.queued.store(MAX_QUEUED, Relaxed);
        assert!(h.hand_off(stream(&l), None, find).is_err());
        fa.queued.store(1, Relaxed);
        fa.stalled.store(true, Relaxed);
        assert!(h.hand_off(stream(&l), None, find).is_err());
        fa.stalled.store(false, Relaxed);

        // Out of the pool: none.
        h.unregister(a);
        fb.queued.store(0, Relaxed);
        assert_eq!(
            h.hand_off(stream(&l), None, |_| None).map_err(|_| ()),
            Err(())
        );
        assert_eq!(h.hand_off(stream(&l), None, find).unwrap(), b);
    }

    #[test]
    fn a_connection_goes_back_to_the_worker_that_served_it_unless_that_one_is_behind() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let (eps, h, _, fb) = two_takers();
        let (a, b) = (eps[0].addr(), eps[1].addr());
        let find = |addr: SocketAddr| eps.iter().find(|e| e.addr() == addr).cloned();
        // b served the connection's last request: it gets it, however many it has,
        // and while its CPU reads saturated.
        for _ in 0..4 {
            assert_eq!(h.hand_off(stream(&l), Some(b), find).unwrap(), b);
        }
        eps[1].report_load(clock::now(), 1.0);
        assert_eq!(h.hand_off(stream(&l), Some(b), find).unwrap(), b);
        assert_eq!(h.hand_off(stream(&l), None, find).unwrap(), a);
        // Unless it is behind: then the other one.
        fb.queued.store(1, Relaxed);
        assert_eq!(h.hand_off(stream(&l), Some(b), find).unwrap(), a);
        // A worker of its own likewise, when the one that served it is free.
        let own = Handoffs::default();
        let (fa, fb) = (fake(0), fake(0));
        fa.clients.store(0, Relaxed);
        fb.clients.store(0, Relaxed);
        own.register(a, fa);
        own.register(b, fb.clone());
        assert_eq!(
            own.hand_to_own(stream(&l), OwnWorker::AnyFree { prefer: Some(b) }, find)
                .unwrap(),
            b
        );
        // When it is not free (it says it serves a client, maybe one already gone),
        // `Only` leaves the connection where it is, and `AnyFree` gives it to another.
        fb.clients.store(1, Relaxed);
        assert!(own
            .hand_to_own(stream(&l), OwnWorker::Only(b), find)
            .is_err());
        assert_eq!(
            own.hand_to_own(stream(&l), OwnWorker::AnyFree { prefer: Some(b) }, find)
                .unwrap(),
            a
        );
        fb.clients.store(0, Relaxed);
        assert_eq!(
            own.hand_to_own(stream(&l), OwnWorker::Only(b), find)
                .unwrap(),
            b
        );
    }

    #[test]
    fn a_worker_of_its_own_serves_nothing_else_and_is_asked_back() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addrs: Vec<SocketAddr> = (1..=3)
            .map(|p| SocketAddr::from(([127, 0, 0, 1], p)))
            .collect();
        let eps: Vec<Arc<Endpoint>> = addrs.iter().map(|&a| Arc::new(Endpoint::new(a))).collect();
        let find = |addr: SocketAddr| eps.iter().find(|e| e.addr() == addr).cloned();
        let h = Handoffs::default();
        let fakes: Vec<Arc<Fake>> = addrs.iter().map(|_| fake(0)).collect();
        for (a, f) in addrs.iter().zip(&fakes) {
            h.register(*a, f.clone());
        }
        // None can say what it serves: none is its own, and none is counted.
        assert!(h.hand_to_own(stream(&l), ANY, find).is_err());
        assert_eq!(h.occupancy(find), Occupancy::default());

        for f in &fakes {
            f.clients.store(0, Relaxed);
        }
        assert_eq!(
            h.occupancy(find),
            Occupancy {
                workers: 3,
                clients: 0
            }
        );
        // The first serves a client, the second has a request of drover's in flight:
        // only the third is free.
        fakes[0].clients.store(1, Relaxed);
        let ctx = drover_balance::PickContext {
            now: clock::now(),
            ..Default::default()
        };
        let pick = drover_balance::Pick::try_new(&eps[1], &ctx).unwrap();
        assert_eq!(h.hand_to_own(stream(&l), ANY, find).unwrap(), addrs[2]);
        assert!(eps[2].serves_clients());
        // It has one on its way (not yet taken up): not free either.
        fakes[2].queued.store(1, Relaxed);
        assert!(h.hand_to_own(stream(&l), ANY, find).is_err());
        drop(pick);
        assert_eq!(h.hand_to_own(stream(&l), ANY, find).unwrap(), addrs[1]);
        fakes[1].clients.store(1, Relaxed);
        fakes[2].clients.store(1, Relaxed);
        assert_eq!(
            h.occupancy(find),
            Occupancy {
                workers: 3,
                clients: 3
            }
        );

        // Asked back: only the workers that serve clients hear it.
        fakes[1].clients.store(0, Relaxed);
        h.reclaim();
        let asked: Vec<usize> = fakes.iter().map(|f| f.reclaims.load(Relaxed)).collect();
        assert_eq!(asked, [1, 0, 1]);
    }
}
