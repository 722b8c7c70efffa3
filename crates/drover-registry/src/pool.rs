//! The live membership of one backend pool.
//!
//! Readers (every request) take a lock-free snapshot with `Pool::snapshot`; writers
//! (sources, the admin API, the supervisor) build a new `EndpointSet` and swap it in. A
//! new set reuses the `Arc<Endpoint>` of every address that stays, so in-flight counts,
//! latency estimates, health and ejection state survive membership changes.

use crate::passive::PassivePolicy;
use arc_swap::{ArcSwap, Guard};
use drover_balance::{clock, Endpoint, EndpointSet, Nanos};
use drover_metrics::{Ejection, EndpointSnapshot};
use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

/// How a pool treats its members.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolOptions {
    /// Slow start for endpoints that join a running pool and for endpoints that active
    /// checks bring back up: their share ramps up over this long (one that joins, over
    /// at most as long as the pool has had members). Zero disables it.
    pub slow_start: Duration,
    /// Concurrency limit applied to every endpoint (0 = none). Above it the balancer
    /// queues requests in drover instead of inside a busy backend.
    pub max_conns: u32,
    /// With `max_conns` 0: learn each endpoint's limit from how its latency grows with
    /// load (`Endpoint::adapt_limit`), so requests wait in drover rather than queue
    /// inside a backend that serves one at a time.
    pub adaptive_limit: bool,
    /// New endpoints start unhealthy and wait for `rise` passing active checks. Off by
    /// default so a fresh balancer serves at once; supervised workers that need time to
    /// boot turn it on. Without active checks such endpoints would never be picked.
    pub initially_unhealthy: bool,
    /// Passive health: ejection on connect failures and 5xx streaks.
    pub passive: PassivePolicy,
    /// Endpoints are on their way whenever none is available: the pool is fed by
    /// workers drover supervises, which start, and restart, on their own. While none is
    /// available a request then waits in the queue for one (up to the queue timeout)
    /// instead of getting a 503 at once. Off for fixed backends: nothing says a dead one
    /// comes back soon, and a fast 503 lets the client go elsewhere.
    pub expects_members: bool,
}

impl Default for PoolOptions {
    fn default() -> Self {
        PoolOptions {
            slow_start: Duration::ZERO,
            max_conns: 0,
            adaptive_limit: false,
            initially_unhealthy: false,
            passive: PassivePolicy::default(),
            expects_members: false,
        }
    }
}

/// Where a pool member comes from. A pool serves the union of its sources, in this
/// order; an address that two sources name is one endpoint, weighted as the first says,
/// and it stays until every source that named it lets it go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Source {
    /// The balancer's configured `backends` (flags or file).
    Static,
    /// Workers drover runs itself.
    Supervisor,
    /// Registered at runtime through the admin API (or the SDK) of this balancer.
    Admin,
    /// Members under the balancer's etcd prefix.
    Etcd,
    /// A DNS name's current answer.
    Dns,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Static => "static",
            Source::Supervisor => "supervisor",
            Source::Admin => "admin",
            Source::Etcd => "etcd",
            Source::Dns => "dns",
        }
    }
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a membership change did to the pool.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MembershipChange {
    pub added: Vec<SocketAddr>,
    pub removed: Vec<SocketAddr>,
}

impl MembershipChange {
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.removed.is_empty()
    }
}

/// One endpoint's state, for the admin API and logs.
#[derive(Debug, Clone, PartialEq)]
pub struct EndpointStatus {
    pub addr: SocketAddr,
    /// Stable id (the one sticky cookies carry).
    pub id: String,
    /// Active health checks' verdict.
    pub healthy: bool,
    /// Passive ejection end on the `drover_balance::clock` (0 = never ejected).
    pub ejected_until: Nanos,
    /// Time left in the current passive ejection (zero when not ejected).
    pub ejected_for: Duration,
    /// Healthy and not ejected: the balancer may pick it.
    pub available: bool,
    pub in_flight: u32,
    /// Utilisation the backend reported, or drover measured for its worker (1.0 =
    /// saturated); 0 when none is fresh.
    pub load: f64,
    /// The concurrency cap in force now (a fixed `max_conns`, or the learned limit while
    /// the backend is saturated); 0 = none.
    pub limit: u32,
    /// Why `limit` is what it is.
    pub limit_reason: LimitReason,
    /// The learned limit, also while it is not in force; 0 when none is learned.
    pub learned_limit: u32,
    /// Requests sent and not yet answered with a response head: what a learned limit
    /// counts (a fixed `max_conns` counts `in_flight`, streams included).
    pub pending: u32,
    /// Of `pending`, the requests later ones overtook (long-polls, waits on a database):
    /// a learned limit does not count them (`drover_balance::OVERTAKEN_BY`).
    pub waiting: u32,
    /// Peak-EWMA latency estimate in ns.
    pub rtt_ns: u64,
    pub weight: u32,
    pub max_conns: u32,
    /// Slow-start factor in (0, 1]; 1 when not ramping.
    pub ramp: f64,
    /// Consecutive failed requests, and consecutive ejections (the back-off exponent).
    pub fail_streak: u32,
    pub ejections: u32,
}

/// Why an endpoint's concurrency limit is in force, or why none is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitReason {
    /// A fixed `max_conns`, on requests in flight.
    MaxConns,
    /// The learned limit, in force while the backend is saturated, on pending requests.
    Saturated,
    /// A limit is learned, but not in force: the backend's CPU has room.
    NotSaturated,
    /// The backend is saturated, but its requests mostly wait (on a timer, a database)
    /// rather than work, so the learned limit is not in force
    /// (`Endpoint::mostly_waits`).
    MostlyWaits,
    /// No limit in force: client connections were handed to the worker, so it serves
    /// requests drover does not count (`Endpoint::concurrency_cap`).
    ServesClients,
    /// No limit (`max_conns` 0 and no learning).
    Off,
    /// One request at a time: its health checks get no answer, yet it was kept in
    /// rotation (`Endpoint::set_on_probation`).
    Probation,
}

impl LimitReason {
    fn of(e: &Endpoint, now: Nanos) -> LimitReason {
        if e.is_on_probation() {
            LimitReason::Probation
        } else if e.max_conns() > 0 {
            LimitReason::MaxConns
        } else if !e.is_adaptive() {
            LimitReason::Off
        } else if e.serves_clients() {
            LimitReason::ServesClients
        } else if e.is_saturated(now) && e.mostly_waits() {
            LimitReason::MostlyWaits
        } else if e.is_saturated(now) {
            LimitReason::Saturated
        } else {
            LimitReason::NotSaturated
        }
    }

    /// The name the admin API's JSON carries.
    pub fn as_str(self) -> &'static str {
        match self {
            LimitReason::MaxConns => "max-conns",
            LimitReason::Saturated => "saturated",
            LimitReason::NotSaturated => "not-saturated",
            LimitReason::ServesClients => "serves-clients",
            LimitReason::MostlyWaits => "mostly-waits",
            LimitReason::Off => "off",
            LimitReason::Probation => "probation",
        }
    }
}

/// The live endpoint set of one backend pool.
#[derive(Debug)]
pub struct Pool {
    name: String,
    options: ArcSwap<PoolOptions>,
    set: ArcSwap<EndpointSet>,
    /// Each source's members as `(address, weight)`. The lock also serializes writers, so
    /// two membership changes cannot lose each other's endpoints. Readers never take it.
    sources: Mutex<BTreeMap<Source, Vec<(SocketAddr, u32)>>>,
    /// Bumped when an endpoint may have become available (`endpoint_up`), so requests
    /// queued for want of one are dispatched then rather than at their timeout.
    up: watch::Sender<()>,
    /// Endpoints that take client connections themselves (see `handoff`).
    handoffs: crate::Handoffs,
    /// How many members a supervisor runs here (`expect_members`); 0 for other pools.
    expected: AtomicUsize,
    /// The supervisor's word that each of its members here ended, by itself, before it
    /// was ready (`set_members_failing`).
    members_failing: AtomicBool,
    /// When the pool first had a member (0 until then): how long the others may have
    /// been warming up when one joins (see `new_endpoint`).
    serving_since: AtomicU64,
}

impl Pool {
    /// A pool with `addrs` as `(address, weight)`, its static members. They do not
    /// slow-start: there is no traffic to protect them from yet, and a fresh balancer
    /// should serve at full speed. Duplicate addresses keep their first weight.
    pub fn new(name: impl Into<String>, addrs: &[(SocketAddr, u32)], options: PoolOptions) -> Pool {
        let addrs = dedup(addrs);
        let pool = Pool {
            name: name.into(),
            options: ArcSwap::from_pointee(options),
            set: ArcSwap::from_pointee(EndpointSet::default()),
            sources: Mutex::new(BTreeMap::from([(Source::Static, addrs.clone())])),
            up: watch::Sender::new(()),
            handoffs: crate::Handoffs::default(),
            expected: AtomicUsize::new(0),
            members_failing: AtomicBool::new(false),
            serving_since: AtomicU64::new(if addrs.is_empty() { 0 } else { clock::now() }),
        };
        let endpoints = addrs
            .into_iter()
            .map(|(addr, weight)| pool.new_endpoint(addr, weight, None))
            .collect();
        pool.set.store(Arc::new(EndpointSet::new(endpoints)));
        pool
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn options(&self) -> Arc<PoolOptions> {
        self.options.load_full()
    }

    /// New options from a reload. Every endpoint keeps its state; the concurrency limit
    /// and whether it is learned apply to each at once, the rest as it is next used.
    /// Per-endpoint `max_conns` overrides must be set again after this.
    pub fn set_options(&self, options: PoolOptions) {
        let _writer = self.lock_sources();
        for ep in self.set.load().endpoints() {
            ep.set_max_conns(options.max_conns);
            ep.set_adaptive(options.adaptive_limit);
        }
        self.options.store(Arc::new(options));
    }

    /// The current membership. Lock-free; this is what the hot path calls. Hold the guard
    /// only for the pick (it pins the snapshot), not across I/O.
    pub fn snapshot(&self) -> Guard<Arc<EndpointSet>> {
        self.set.load()
    }

    /// The current membership as an owned `Arc`, for code that keeps it across awaits.
    pub fn load_full(&self) -> Arc<EndpointSet> {
        self.set.load_full()
    }

    /// Says how many members the pool's supervisor runs (its worker count), so that while
    /// fewer are here a burst is not all placed on the ones that started first (see
    /// `EndpointSet::awaited`).
    pub fn expect_members(&self, n: usize) {
        let sources = self.lock_sources();
        if self.expected.swap(n, Relaxed) != n {
            let set = self.set.load();
            self.set
                .store(Arc::new(set.now_awaiting(self.awaited(&sources))));
        }
    }

    /// How many of the members a supervisor runs are not among `sources`' yet.
    fn awaited(&self, sources: &BTreeMap<Source, Vec<(SocketAddr, u32)>>) -> usize {
        let supervised = sources.get(&Source::Supervisor).map_or(0, Vec::len);
        self.expected.load(Relaxed).saturating_sub(supervised)
    }

    /// The supervisor says whether every member it runs here ended by itself before it
    /// was ready, each at its last start (an app that fails at boot: a syntax error, a
    /// missing module, a port it cannot bind). Then no member is on its way, and a
    /// request that finds none available gets its answer at once instead of waiting the
    /// queue timeout for one (see `awaits_members`); requests queued now are woken to be
    /// told. Returns whether this changed the pool's state.
    pub fn set_members_failing(&self, failing: bool) -> bool {
        let changed = self.members_failing.swap(failing, Relaxed) != failing;
        if changed && failing {
            self.endpoint_up();
        }
        changed
    }

    /// Whether every member the supervisor runs here last ended before it was ready.
    pub fn members_failing(&self) -> bool {
        self.members_failing.load(Relaxed)
    }

    /// Whether a request that finds no endpoint available waits for one: the pool's
    /// members start and restart on their own (`PoolOptions::expects_members`), and
    /// they have not all failed their last start.
    pub fn awaits_members(&self) -> bool {
        self.options.load().expects_members && !self.members_failing()
    }

    /// Wakes when an endpoint may have become available: one joined, or rose
    /// (`endpoint_up`). Subscribe before looking at the pool, so nothing is missed.
    pub fn watch_up(&self) -> watch::Receiver<()> {
        self.up.subscribe()
    }

    /// Tells `watch_up` receivers an endpoint may be available now. Membership changes
    /// that add one call it; whoever marks an endpoint healthy calls it after that.
    pub fn endpoint_up(&self) {
        self.up.send_replace(());
    }

    /// A copy of the current endpoint list (not for the hot path).
    pub fn endpoints(&self) -> Vec<Arc<Endpoint>> {
        self.set.load().endpoints().to_vec()
    }

    /// The endpoints that take client connections themselves.
    pub fn handoffs(&self) -> &crate::Handoffs {
        &self.handoffs
    }

    /// Gives a client connection to the member that takes connections and is least
    /// behind (see `handoff`); the stream back when none can take it.
    pub fn hand_off(
        &self,
        stream: std::net::TcpStream,
        prefer: Option<SocketAddr>,
    ) -> Result<SocketAddr, std::net::TcpStream> {
        let set = self.set.load();
        self.handoffs
            .hand_off(stream, prefer, |addr| set.find(addr).cloned())
    }

    /// Gives a client connection to a member that takes connections and serves nothing
    /// else (see `Handoffs::hand_to_own`); the stream back when none is free.
    pub fn hand_to_own(
        &self,
        stream: std::net::TcpStream,
        to: crate::OwnWorker,
    ) -> Result<SocketAddr, std::net::TcpStream> {
        let set = self.set.load();
        self.handoffs
            .hand_to_own(stream, to, |addr| set.find(addr).cloned())
    }

    /// What the members that take connections serve (see `Handoffs::occupancy`).
    pub fn handoff_occupancy(&self) -> crate::Occupancy {
        let set = self.set.load();
        self.handoffs.occupancy(|addr| set.find(addr).cloned())
    }

    pub fn find(&self, addr: SocketAddr) -> Option<Arc<Endpoint>> {
        self.set.load().find(addr).cloned()
    }

    /// Replaces what `source` says the members are, as `(address, weight)` in that
    /// order; the pool then serves the union of all sources.
    ///
    /// Addresses that stay keep their `Arc<Endpoint>` (and so their load and health
    /// state); only their weight is updated. New addresses slow-start when
    /// `slow_start` is set (see `new_endpoint`). Removed endpoints live on while requests hold them. When
    /// neither addresses nor weights change, the snapshot is kept, so strategies that
    /// cache tables per generation (Maglev) do not rebuild them for nothing.
    pub fn set_source(&self, source: Source, members: &[(SocketAddr, u32)]) -> MembershipChange {
        self.modify(source, |list| *list = dedup(members))
    }

    /// The endpoints `source` does not name, in pool order. An address it shares with
    /// another source counts as its: there is one endpoint, with one health.
    pub fn endpoints_not_from(&self, source: Source) -> Vec<Arc<Endpoint>> {
        // Under the writers' lock the endpoint set is the union of the sources as read.
        let sources = self.lock_sources();
        let theirs: HashSet<SocketAddr> = sources
            .get(&source)
            .map(|list| list.iter().map(|m| m.0).collect())
            .unwrap_or_default();
        self.set
            .load()
            .endpoints()
            .iter()
            .filter(|e| !theirs.contains(&e.addr()))
            .cloned()
            .collect()
    }

    /// The sources that name `addr` now, in order (empty when none does).
    pub fn sources_of(&self, addr: SocketAddr) -> Vec<Source> {
        self.lock_sources()
            .iter()
            .filter(|(_, list)| list.iter().any(|m| m.0 == addr))
            .map(|(s, _)| *s)
            .collect()
    }

    fn lock_sources(&self) -> std::sync::MutexGuard<'_, BTreeMap<Source, Vec<(SocketAddr, u32)>>> {
        self.sources.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes the endpoint set the union of `sources`; the caller holds their lock.
    fn apply(&self, sources: &BTreeMap<Source, Vec<(SocketAddr, u32)>>) -> MembershipChange {
        let current = self.set.load_full();
        let all: Vec<(SocketAddr, u32)> = sources.values().flatten().copied().collect();
        let members = dedup(&all);
        let now = clock::now();

        if !members.is_empty() {
            // Only the first member sets it; compare_exchange keeps an earlier time.
            let _ = self
                .serving_since
                .compare_exchange(0, now, Relaxed, Relaxed);
        }
        let mut change = MembershipChange::default();
        let mut weights_changed = false;
        let endpoints: Vec<Arc<Endpoint>> = members
            .iter()
            .map(|&(addr, weight)| match current.find(addr) {
                Some(ep) => {
                    weights_changed |= ep.weight() != weight.max(1);
                    ep.set_weight(weight);
                    Arc::clone(ep)
                }
                None => {
                    change.added.push(addr);
                    self.new_endpoint(addr, weight, Some(now))
                }
            })
            .collect();
        let kept: HashSet<SocketAddr> = members.iter().map(|m| m.0).collect();
        change.removed = current
            .endpoints()
            .iter()
            .map(|e| e.addr())
            .filter(|a| !kept.contains(a))
            .collect();

        let reordered = !change.is_empty()
            || current
                .endpoints()
                .iter()
                .zip(&endpoints)
                .any(|(a, b)| !Arc::ptr_eq(a, b));
        if reordered || weights_changed {
            let awaited = self.awaited(sources);
            self.set.store(Arc::new(
                EndpointSet::new(endpoints)
                    .awaiting(awaited)
                    .taking_turns_after(&current),
            ));
        }
        if !change.added.is_empty() {
            self.endpoint_up();
        }
        if !change.is_empty() {
            tracing::info!(
                pool = %self.name,
                added = ?change.added,
                removed = ?change.removed,
                "pool membership changed"
            );
        }
        change
    }

    /// Adds one endpoint to `source` (or updates its weight there), for sources that
    /// register one backend at a time.
    pub fn insert(&self, source: Source, addr: SocketAddr, weight: u32) -> MembershipChange {
        self.modify(source, |members| {
            match members.iter_mut().find(|m| m.0 == addr) {
                Some(m) => m.1 = weight,
                None => members.push((addr, weight)),
            }
        })
    }

    /// Removes one endpoint from `source`, if it is there; the pool lets it go once no
    /// other source names it.
    pub fn remove(&self, source: Source, addr: SocketAddr) -> MembershipChange {
        self.modify(source, |members| members.retain(|m| m.0 != addr))
    }

    /// Read-modify-write of one source's list, holding the lock across both so a
    /// concurrent change is not lost.
    fn modify(
        &self,
        source: Source,
        f: impl FnOnce(&mut Vec<(SocketAddr, u32)>),
    ) -> MembershipChange {
        let mut sources = self.lock_sources();
        f(sources.entry(source).or_default());
        self.apply(&sources)
    }

    /// Every endpoint's state, for the admin API.
    pub fn status(&self) -> Vec<EndpointStatus> {
        self.status_at(clock::now())
    }

    pub fn status_at(&self, now: Nanos) -> Vec<EndpointStatus> {
        self.set
            .load()
            .endpoints()
            .iter()
            .map(|e| endpoint_status(e, now))
            .collect()
    }

    /// Passive health, forwarded with this pool's current set. See `PassivePolicy`.
    pub fn on_connect_failure(&self, ep: &Arc<Endpoint>, now: Nanos) -> Option<Duration> {
        let ejected = self
            .options
            .load()
            .passive
            .on_connect_failure(&self.set.load(), ep, now);
        counted(ep, ejected, Ejection::ConnectFailures)
    }

    /// Passive health: a connect timed out (a busy backend, see `PassivePolicy`).
    pub fn on_connect_timeout(&self, ep: &Arc<Endpoint>, now: Nanos) -> Option<Duration> {
        let ejected = self
            .options
            .load()
            .passive
            .on_connect_timeout(&self.set.load(), ep, now);
        counted(ep, ejected, Ejection::RequestFailures)
    }

    /// Passive health for a response status. Successes skip the snapshot load.
    pub fn on_response(&self, ep: &Arc<Endpoint>, status: u16, now: Nanos) -> Option<Duration> {
        let options = self.options.load();
        let passive = &options.passive;
        if passive.is_failure(status) {
            let ejected = passive.on_response(&self.set.load(), ep, status, now);
            counted(ep, ejected, Ejection::ErrorResponses)
        } else {
            passive.on_success(ep, now);
            None
        }
    }

    /// Passive health: the backend took the request but failed it without a status.
    pub fn on_request_failure(&self, ep: &Arc<Endpoint>, now: Nanos) -> Option<Duration> {
        let ejected = self
            .options
            .load()
            .passive
            .on_request_failure(&self.set.load(), ep, now);
        counted(ep, ejected, Ejection::RequestFailures)
    }

    /// Every endpoint's counts and gauges, for `/metrics` and the dashboard: the same
    /// state the admin API's status shows, with the endpoint's counts. `sessions` gives
    /// the socket.io sessions kept on an endpoint, by its id.
    pub fn metrics(&self, sessions: impl Fn(&str) -> u64) -> Vec<EndpointSnapshot> {
        let now = clock::now();
        self.set
            .load()
            .endpoints()
            .iter()
            .map(|e| {
                let status = endpoint_status(e, now);
                EndpointSnapshot {
                    address: status.addr.to_string(),
                    counts: e.stats().snapshot(),
                    in_flight: u64::from(status.in_flight),
                    limit: u64::from(status.limit),
                    limit_reason: status.limit_reason.as_str().to_owned(),
                    waiting: u64::from(status.waiting),
                    latency_estimate_seconds: status.rtt_ns as f64 / 1e9,
                    reported_load: status.load,
                    weight: u64::from(status.weight),
                    healthy: status.healthy,
                    available: status.available,
                    sessions: sessions(e.id()),
                }
            })
            .collect()
    }

    pub fn on_success(&self, ep: &Arc<Endpoint>, now: Nanos) {
        self.options.load().passive.on_success(ep, now);
    }

    /// `joined`: when the endpoint joins a running pool; it slow-starts from then.
    ///
    /// Slow start protects a cold member from a share of traffic that warm members
    /// carry. So a member ramps only over as long as the pool has had members, at most
    /// `slow_start`: at a fresh start no one is warmer than anyone (HAProxy applies
    /// `slowstart` at boot to no server, for the same reason), and a worker that joins
    /// 1 s after the first ramps over that 1 s, not for 10 s at half its sibling's share.
    /// A member that joins a pool that has served longer than `slow_start`, a
    /// replacement or a scale-up, ramps over all of it. (A member that comes back from an
    /// ejection or failed checks always ramps over all of it: it failed, the others did
    /// not.)
    fn new_endpoint(&self, addr: SocketAddr, weight: u32, joined: Option<Nanos>) -> Arc<Endpoint> {
        let ep = Endpoint::with_weight(addr, weight);
        let options = self.options.load();
        ep.set_max_conns(options.max_conns);
        ep.set_adaptive(options.adaptive_limit);
        if options.initially_unhealthy {
            // Active checks start the ramp when it rises, so none is needed here.
            ep.set_healthy(false);
        } else if let Some(now) = joined {
            let served = now.saturating_sub(self.serving_since.load(Relaxed));
            let len = clock::nanos(options.slow_start).min(served);
            if len > 0 {
                ep.start_ramp(now, len);
            }
        }
        Arc::new(ep)
    }
}

/// One endpoint's state at `now`.
fn endpoint_status(e: &Endpoint, now: Nanos) -> EndpointStatus {
    let until = e.ejected_until();
    EndpointStatus {
        addr: e.addr(),
        id: e.id().to_string(),
        healthy: e.is_healthy(),
        ejected_until: until,
        ejected_for: Duration::from_nanos(until.saturating_sub(now)),
        available: e.is_available(now),
        in_flight: e.in_flight(),
        load: e.reported_load(now),
        limit: e.concurrency_cap(now),
        limit_reason: LimitReason::of(e, now),
        learned_limit: if e.is_adaptive() {
            e.learned_limit() as u32
        } else {
            0
        },
        pending: e.pending(),
        waiting: e.waiting(),
        rtt_ns: e.rtt_estimate() as u64,
        weight: e.weight(),
        max_conns: e.max_conns(),
        ramp: e.ramp(now),
        fail_streak: e.fail_streak(),
        ejections: e.ejections(),
    }
}

/// Counts an ejection passive health just made (`ejected` is its length).
fn counted(ep: &Endpoint, ejected: Option<Duration>, why: Ejection) -> Option<Duration> {
    if ejected.is_some() {
        ep.stats().record_ejection(why);
    }
    ejected
}

/// Drops repeated addresses, keeping the first.
fn dedup(members: &[(SocketAddr, u32)]) -> Vec<(SocketAddr, u32)> {
    let mut seen = HashSet::with_capacity(members.len());
    members
        .iter()
        .copied()
        .filter(|m| seen.insert(m.0))
        .collect()
}
