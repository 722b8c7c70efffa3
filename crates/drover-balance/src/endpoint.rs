//! One backend address and its live load state.
//!
//! Every field a request touches is an atomic, with one exception: an endpoint whose
//! limit is learned keeps its pending requests in the order they were sent
//! (`SendOrder`, under a lock held for a map insert or removal), to tell the requests
//! that work from those that wait. An `Endpoint` is shared as `Arc<Endpoint>` between
//! successive `EndpointSet` snapshots, so its load state survives membership changes.

use crate::clock::Nanos;
use crate::worker_life::{LifeCell, OldestHeld, WorkerLife};
use drover_metrics::EndpointStats;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock};

/// Told when an endpoint that had no request pending gets one, or is handed a client
/// connection: what a watcher that sleeps while its endpoint idles waits for. The
/// supervisor reads an idle worker's CPU once a second instead of 40 times, and a
/// burst's first request brings the fast reads back (see drover-supervisor's
/// `cpu_watch`). Called on the request path, only when pending goes from none to some:
/// it must cost next to nothing when no one sleeps.
pub trait WorkArrives: Send + Sync + std::fmt::Debug {
    fn work_arrived(&self);
}

/// Latency assumed for an endpoint that has not answered yet: low enough that a new
/// endpoint is tried, high enough that one request does not make it look idle forever.
pub const DEFAULT_RTT: Nanos = 1_000_000;

/// How quickly the latency estimate forgets a peak (tower and Finagle use ~10 s).
pub const EWMA_DECAY: Nanos = 10_000_000_000;

/// A reported load older than this is ignored: a backend that stops reporting must not
/// keep its last word forever.
pub const REPORT_TTL: Nanos = 5_000_000_000;

/// A backend whose reported (or measured) utilisation is at least this is saturated: its
/// CPU is busy, so a request sent to it now waits inside it behind other work. Only then
/// does the learned limit hold requests back in drover's queue (see `concurrency_cap`).
pub const SATURATED: f64 = 0.9;

/// A saturated backend counts as saturated until its load falls below this. Without the
/// band, one report of 0.87 from a worker at 100 % lifted the limit for a whole report
/// interval, and the queue (a thousand requests past capacity) was released onto that
/// worker at once: its listen backlog overflowed, connects timed out and it was ejected
/// (bench: `loadtest --rps` at twice capacity over `drover run -w 2`).
pub const SATURATION_ENDS: f64 = 0.75;

/// ...and only once its load has stayed below that for this long. The cap itself lowers
/// the load drover measures: a worker held to about one request at a time idles between
/// them. With 7 workers on 2 cores and a burst, one 100 ms sample at 0.70 lifted a
/// worker's cap and drover's queue went onto it at once: 410 requests in flight there
/// against 12-108 at the others, and the rounds' p99 about twice the peers'
/// (`bench/sweep.sh --only 6`). Twelve of `drover run`'s CPU samples.
pub const SATURATION_LINGER: Nanos = 300_000_000;

/// A busy endpoint's CPU is judged by the first report that comes at least this long
/// after it became busy (see `holds_an_unjudged_burst`): `drover run` samples every
/// 25 ms, so such a report's window lies wholly in the busy spell, with 25 ms for the
/// worker to read what it was sent.
pub const JUDGED_AFTER: Nanos = 50_000_000;

/// ...and once it has been busy this long, it counts as judged whatever its reports say:
/// a burst held back for a judgement that never comes (its reports stopped) must go on.
pub const JUDGEMENT_WAIT_MAX: Nanos = 150_000_000;

/// How often an endpoint's requests are judged CPU-bound or waiting (`mostly_waits`): the
/// busy time measured over this window against the expected cost of the requests that
/// finished in it. Four of `drover run`'s CPU samples.
pub const WORK_SHARE_WINDOW: Nanos = 100_000_000;

/// A saturated endpoint whose busy time is under this share of its finished requests'
/// expected cost serves requests that mostly wait (on a timer, a database, another
/// service), and no learned limit holds them back. A handler of 1 ms of work and a 50 ms
/// query reads 0.02; a 50 ms timer 0.004; CPU-bound requests about 1 (more when they
/// wait for a core, which also counts as busy).
pub const MOSTLY_WAITING: f64 = 0.05;

/// How many past `WORK_SHARE_WINDOW`s the work share is also judged over (2 s): requests
/// mostly wait only if they do in the last window *and* over these. A backend that
/// answers in batches lands seconds of work in one window: a grpc-js worker runs every
/// call that came in one read before any answer leaves, so 46 calls of 100 ms landed
/// together after 5 s of saturated work. One window read 0.1 s busy against 4.6 s
/// answered, "mostly waits"; the learned limit lifted and drover's 90 queued calls went
/// to that worker at once, a batch of 9 s. Over 2 s the same work reads 2 s against
/// 4.6 s: working. Requests that really wait read alike over both (`bench/io-crowd.sh`:
/// 0.1 s against a minute per window).
pub const WORK_SHARE_HISTORY: usize = 20;

/// A pending request is overtaken, and from then on counted as waiting rather than
/// working, once a request sent at least this much later, and at least that request's
/// own latency later, has been answered first (`SendOrder::settled`).
///
/// Why: a backend's CPU serves its requests in about the order they came, so a request
/// that many later ones pass is not queued behind work: it waits on a timer, a
/// database, another service or its client. A long-poll is the common case. Counted as
/// work, long-polls filled the learned limit of a saturated worker and no other request
/// got in: 40 open long-polls beside CPU-bound traffic over `drover run -w 2` left 62
/// requests answered in 10 s where Node cluster answered 10,115. The margin keeps two
/// requests sent a moment apart on two connections, which a backend may read in either
/// order, from counting as one passing the other.
pub const OVERTAKEN_BY: Nanos = 1_000_000;

/// In the load score a pending request counts for at most this much work (ns). Longer
/// requests (long-polls, slow queries, reports) are nearly all waiting, not work: counted
/// at their full cost, a few long-polls would outweigh hundreds of short requests and
/// send all short traffic to whichever endpoint holds one long-poll fewer.
pub const WORK_CAP: Nanos = 100_000_000;

/// Adaptive concurrency limit: where it starts, its bounds, and how it moves.
pub const LIMIT_INITIAL: f64 = 4.0;
pub const LIMIT_MIN: f64 = 1.0;
pub const LIMIT_MAX: f64 = 1024.0;
/// A request whose latency is this many times its uncontended cost waited inside the
/// backend behind other work: the endpoint holds more than it serves at once.
const QUEUED_RATIO: f64 = 2.0;
/// A request this close to its uncontended cost did not wait.
const UNQUEUED_RATIO: f64 = 1.5;
/// Multiplicative decrease per queued request, additive increase per unqueued one
/// served at the limit (spread so the limit grows by about 1 per `limit × GROWTH`
/// requests): the limit falls fast when requests queue and creeps up when they don't,
/// as in TCP Vegas and Netflix's concurrency-limits.
const DECREASE: f64 = 0.9;
const GROWTH: f64 = 4.0;
/// Above its learned limit, an adaptive endpoint still takes requests while the work it
/// holds is under this (ns). A backend that serves one request at a time learns a
/// limit near 1, and at 1 it idles while each response travels back through the proxy;
/// a little cheap work in the pipe keeps it busy, and an expensive request (more than
/// this on its own) still never has anything queued behind it.
///
/// 10 ms, not 2: with more workers than cores every worker reads as saturated (it runs
/// or waits for a core all the time), each request's latency is a few times its cost,
/// and 2 ms held each worker to about one request. Holding the rest in drover's queue
/// then cost capacity and made a burst's backlog drain slower than Node cluster's or
/// HAProxy's (`bench/sweep.sh --seed 1 --only 6`: 7 workers on 2 cores, p99 1.62 x the
/// best peer's at 2 ms, 1.15 x at 10 ms, medians of 5 paired runs). A request that costs
/// 10 ms or more still waits for an endpoint with nothing ahead of it: the 236 ms
/// requests of sample 10 keep drover's lead there (0.27 x the best peer's p99).
pub const PIPELINE_BUDGET: Nanos = 10_000_000;

/// Requests in flight on an endpoint on probation (`Endpoint::set_on_probation`).
pub const PROBATION_CAP: u32 = 1;

/// The least share a ramping endpoint gets, so slow start never starves it of the
/// traffic it needs to warm up.
const MIN_RAMP: f64 = 0.1;

/// `Endpoint::failure_share`'s whole, and how many outcomes its average spans: each
/// moves it an eighth of the way to 1 (a failure) or 0.
const SHARE_ONE: u32 = 1 << 16;
const SHARE_STEPS: u32 = 8;

/// One backend.
#[derive(Debug)]
pub struct Endpoint {
    addr: SocketAddr,
    id: String,
    weight: AtomicU32,
    max_conns: AtomicU32,
    /// When set and `max_conns` is 0, the in-flight cap is learned (`limit`).
    adaptive: AtomicBool,
    /// The learned concurrency limit (f64 bits).
    limit: AtomicU64,
    /// Requests from pick until the exchange is over (a body still streaming, a tunnel):
    /// what `least-conn` and a fixed `max_conns` count, as nginx and HAProxy do.
    in_flight: AtomicU32,
    /// Requests still waiting for their response head, and the sum of their expected
    /// cost (ns, each at most `WORK_CAP`): the work the backend still has to do. Once the
    /// head is in, a response that keeps streaming (SSE, a download, a WebSocket) is not
    /// load on the backend, so it leaves these.
    pending: AtomicU32,
    pending_cost: AtomicU64,
    /// When `pending` last went from none to some (ns; see `holds_an_unjudged_burst`).
    busy_since: AtomicU64,
    /// Of those, the requests overtaken by later ones (`OVERTAKEN_BY`) and their expected
    /// cost: they wait, so neither the learned limit nor the load score counts them.
    waiting: AtomicU32,
    waiting_cost: AtomicU64,
    /// The pending requests in the order they were sent, while the limit is learned.
    send_order: Mutex<SendOrder>,
    /// Peak-EWMA latency estimate (f64 bits, ns); 0 bits = no observation yet.
    rtt_estimate: AtomicU64,
    rtt_stamp: AtomicU64,
    /// Backend-reported utilisation (f64 bits, 1.0 = saturated) and when it came.
    reported_load: AtomicU64,
    reported_at: AtomicU64,
    /// Where its last turn among idle endpoints ended (f64 bits, a pool's virtual time),
    /// and when it took it (a count of the pool's turns; see `idle_turns`).
    last_idle_turn: AtomicU64,
    last_idle_turn_taken: AtomicU64,
    /// Saturation with hysteresis: set at `SATURATED`, cleared below `SATURATION_ENDS`
    /// held for `SATURATION_LINGER`.
    saturated: AtomicBool,
    /// Since when every report has been below `SATURATION_ENDS` (ns; 0: the last one
    /// was not).
    low_since: AtomicU64,
    /// Client connections were handed to it (`drover run`'s `auto` and `handoff`
    /// modes): it serves requests drover never sees, so drover's pending count is not
    /// its concurrency, and no limit is learned or enforced from it.
    serves_clients: AtomicBool,
    /// Whether its requests mostly wait rather than work (see `MOSTLY_WAITING`), judged
    /// once per `WORK_SHARE_WINDOW` from what the next three fields add up, and the
    /// first time as soon as a window has answered anything.
    mostly_waits: AtomicBool,
    judged_once: AtomicBool,
    /// Busy time the load reports account for since `judged_at` (ns).
    busy_since_judged: AtomicU64,
    /// Expected cost of the requests answered since `judged_at` (ns, each at most
    /// `WORK_CAP`).
    answered_cost: AtomicU64,
    judged_at: AtomicU64,
    /// The last `WORK_SHARE_HISTORY` judged windows' busy time and answered cost.
    work_history: Mutex<WorkHistory>,
    /// Active health checks' verdict.
    healthy: AtomicBool,
    /// Kept in rotation while its checks get no answer (see `set_on_probation`).
    on_probation: AtomicBool,
    /// Down because its checks got no answer (see `set_hung`).
    hung: AtomicBool,
    /// Passive ejection: not picked before this time.
    ejected_until: AtomicU64,
    /// Slow start: share ramps from `ramp_start` over `ramp_len`.
    ramp_start: AtomicU64,
    ramp_len: AtomicU64,
    /// Passive health: failures in a row, and ejections in a row (the back-off exponent).
    fail_streak: AtomicU32,
    /// Passive health: the share of its recent outcomes that failed, in 1/65536 (an
    /// average over about its last 8), to compare with the other endpoints': a failure
    /// they all share (one route's bug, a database they all use) is not this one's.
    failure_share: AtomicU32,
    ejections: AtomicU32,
    /// Whether its process runs, for an endpoint a supervisor runs (see `worker_life`).
    life: LifeCell,
    /// When it was killed as hung, the oldest request it held (see `worker_life`).
    oldest_held: OldestHeld,
    /// Its worker left the pool to drain (a reload, a scale-down, a stop): a backend
    /// connection freed from then on is closed, not kept for reuse.
    retiring: AtomicBool,
    /// Its supervisor's word that the event streams and tunnels relayed to its draining
    /// worker are to end (`cut_streams`), and who waits for it (`streams_cut`).
    streams_cut: AtomicBool,
    streams_cut_told: tokio::sync::Notify,
    /// What requests to it counted (for /metrics and the dashboard).
    stats: EndpointStats,
    /// Who is told when work arrives after none (`watch_work`).
    work_watch: OnceLock<Arc<dyn WorkArrives>>,
}

impl Endpoint {
    pub fn new(addr: SocketAddr) -> Self {
        Self::with_weight(addr, 1)
    }

    pub fn with_weight(addr: SocketAddr, weight: u32) -> Self {
        Endpoint {
            addr,
            id: stable_id(&addr.to_string()),
            weight: AtomicU32::new(weight.max(1)),
            max_conns: AtomicU32::new(0),
            adaptive: AtomicBool::new(false),
            limit: AtomicU64::new(LIMIT_INITIAL.to_bits()),
            in_flight: AtomicU32::new(0),
            pending: AtomicU32::new(0),
            pending_cost: AtomicU64::new(0),
            busy_since: AtomicU64::new(0),
            waiting: AtomicU32::new(0),
            waiting_cost: AtomicU64::new(0),
            send_order: Mutex::new(SendOrder::default()),
            rtt_estimate: AtomicU64::new(0),
            rtt_stamp: AtomicU64::new(0),
            reported_load: AtomicU64::new(0),
            reported_at: AtomicU64::new(0),
            last_idle_turn: AtomicU64::new(0),
            last_idle_turn_taken: AtomicU64::new(0),
            saturated: AtomicBool::new(false),
            low_since: AtomicU64::new(0),
            serves_clients: AtomicBool::new(false),
            mostly_waits: AtomicBool::new(false),
            judged_once: AtomicBool::new(false),
            busy_since_judged: AtomicU64::new(0),
            answered_cost: AtomicU64::new(0),
            judged_at: AtomicU64::new(0),
            work_history: Mutex::new(WorkHistory::default()),
            healthy: AtomicBool::new(true),
            on_probation: AtomicBool::new(false),
            hung: AtomicBool::new(false),
            ejected_until: AtomicU64::new(0),
            ramp_start: AtomicU64::new(0),
            ramp_len: AtomicU64::new(0),
            fail_streak: AtomicU32::new(0),
            failure_share: AtomicU32::new(0),
            ejections: AtomicU32::new(0),
            life: LifeCell::default(),
            oldest_held: OldestHeld::default(),
            retiring: AtomicBool::new(false),
            streams_cut: AtomicBool::new(false),
            streams_cut_told: tokio::sync::Notify::new(),
            stats: EndpointStats::default(),
            work_watch: OnceLock::new(),
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// What requests to this endpoint counted.
    pub fn stats(&self) -> &EndpointStats {
        &self.stats
    }

    /// A short id that stays the same across restarts of drover (used in sticky cookies).
    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn weight(&self) -> u32 {
        self.weight.load(Relaxed)
    }

    pub fn set_weight(&self, weight: u32) {
        self.weight.store(weight.max(1), Relaxed);
    }

    /// 0 means no limit.
    pub fn max_conns(&self) -> u32 {
        self.max_conns.load(Relaxed)
    }

    pub fn set_max_conns(&self, max: u32) {
        self.max_conns.store(max, Relaxed);
    }

    pub fn in_flight(&self) -> u32 {
        self.in_flight.load(Relaxed)
    }

    /// Requests waiting for their response head.
    pub fn pending(&self) -> u32 {
        self.pending.load(Relaxed)
    }

    /// Expected work of the requests waiting for their response head (ns).
    pub fn pending_cost(&self) -> Nanos {
        self.pending_cost.load(Relaxed)
    }

    /// Pending requests that later ones overtook (`OVERTAKEN_BY`): they wait rather
    /// than work.
    pub fn waiting(&self) -> u32 {
        self.waiting.load(Relaxed)
    }

    /// Pending requests not overtaken: the work the backend may still be doing for us.
    pub fn working(&self) -> u32 {
        self.pending().saturating_sub(self.waiting())
    }

    /// The expected cost of the `working` requests (ns).
    pub fn working_cost(&self) -> Nanos {
        self.pending_cost()
            .saturating_sub(self.waiting_cost.load(Relaxed))
    }

    /// No request of ours is pending here, overtaken ones included: they may wait where
    /// drover cannot see, unread on a connection the backend has not accepted yet (see
    /// `pending_score`).
    pub fn is_idle(&self) -> bool {
        self.pending() == 0
    }

    /// Idle and not saturated by anyone else's work: as good as any other free endpoint
    /// for the next request (see `strategy::common::least_loaded`).
    pub fn is_free(&self, now: Nanos) -> bool {
        self.is_idle() && !self.is_saturated(now)
    }

    /// Learns the concurrency limit from latency instead of a fixed `max_conns`.
    pub fn set_adaptive(&self, on: bool) {
        self.adaptive.store(on, Relaxed);
    }

    pub fn is_adaptive(&self) -> bool {
        self.adaptive.load(Relaxed) && self.max_conns() == 0
    }

    /// A client connection was handed to it: from now on it also serves requests that
    /// never pass through drover, for as long as it lives, unless its worker says it
    /// serves none any more (`serves_no_clients`).
    pub fn note_handed_connection(&self) {
        if !self.serves_clients.load(Relaxed) {
            self.serves_clients.store(true, Relaxed);
        }
        self.work_arrived();
    }

    /// Tells `watch` whenever a request becomes pending here while none was, and when a
    /// client connection is handed over. One watcher, set once: an endpoint that comes
    /// back under the same address belongs to the same app.
    pub fn watch_work(&self, watch: Arc<dyn WorkArrives>) {
        let _ = self.work_watch.set(watch);
    }

    fn work_arrived(&self) {
        if let Some(watch) = self.work_watch.get() {
            watch.work_arrived();
        }
    }

    /// Its worker counts the client connections it was handed, and none is left (they
    /// closed, or came back): drover sees all its requests again.
    pub fn serves_no_clients(&self) {
        if self.serves_clients.load(Relaxed) {
            self.serves_clients.store(false, Relaxed);
        }
    }

    /// Its supervisor's word on its process (see `worker_life`).
    pub fn set_worker_life(&self, life: WorkerLife) {
        if life == WorkerLife::Running {
            self.oldest_held.clear();
        }
        self.life.set(life);
    }

    /// A request it held as drover killed its worker as hung (`WorkerLife::Hung`)
    /// says when it was sent here (its pick's `started`).
    pub fn held_when_hung(&self, sent: Nanos) {
        self.oldest_held.offer(sent);
    }

    /// Whether the request sent here at `sent` is the oldest of those that said they
    /// were held when its worker was killed as hung: the one it most likely hung on.
    pub fn hung_on(&self, sent: Nanos) -> bool {
        self.oldest_held.is(sent)
    }

    /// How its process is doing; `None` when no supervisor runs it.
    pub fn worker_life(&self) -> Option<WorkerLife> {
        self.life.get()
    }

    /// Its supervisor's word that its worker drains (see `is_retiring`).
    pub fn set_retiring(&self, retiring: bool) {
        self.retiring.store(retiring, Relaxed);
        if !retiring {
            // A new worker at this address: its streams are its own.
            self.streams_cut.store(false, Relaxed);
        }
    }

    /// Its supervisor's word that its draining worker, told to stop, waits for the
    /// event streams and tunnels drover relays to it to end: a server that closes on
    /// SIGTERM and waits for its connections (Node's `server.close()`, Nuxt's and
    /// SvelteKit's) then exits by itself, where it held on until killed.
    pub fn cut_streams(&self) {
        self.streams_cut.store(true, Relaxed);
        self.streams_cut_told.notify_waiters();
    }

    /// Resolves once `cut_streams` was said (at once if it was already).
    pub async fn streams_cut(&self) {
        loop {
            let told = self.streams_cut_told.notified();
            let mut told = std::pin::pin!(told);
            // Waiting before the flag is read: a word said in between is not missed.
            told.as_mut().enable();
            if self.streams_cut.load(Relaxed) {
                return;
            }
            told.await;
        }
    }

    /// Whether its worker drains: no request is sent to it any more, and a backend
    /// connection that a response frees is closed rather than kept. Kept, an idle
    /// connection held a worker whose server waits for its connections to end (Next.js
    /// on SIGTERM) until the keep-alive timeout, 6 s after its last stream ended.
    pub fn is_retiring(&self) -> bool {
        self.retiring.load(Relaxed)
    }

    /// Whether it serves client connections of its own (see `note_handed_connection`).
    pub fn serves_clients(&self) -> bool {
        self.serves_clients.load(Relaxed)
    }

    /// The learned limit, fractional (it moves in small steps).
    pub fn learned_limit(&self) -> f64 {
        f64::from_bits(self.limit.load(Relaxed))
    }

    /// Whether the backend says (or drover measured) that its CPU is saturated: its load
    /// reached `SATURATED` and has not fallen below `SATURATION_ENDS` since, in a report
    /// that is still fresh.
    pub fn is_saturated(&self, now: Nanos) -> bool {
        self.saturated.load(Relaxed) && self.reported_load(now) > 0.0
    }

    /// The cap in force now: `max_conns` when set (on requests in flight); the learned
    /// limit when adaptive *and* the backend is saturated (on pending requests); 0 (none)
    /// otherwise.
    ///
    /// Why only when saturated: a request that waits on a timer, a database or a client
    /// costs its backend nothing, and from latency alone drover cannot tell waiting from
    /// working. A limit learned from latency throttled I/O-bound apps to a few requests at
    /// a time and counted every long-poll as overload. Queueing in drover beats queueing
    /// in the backend only when the backend's CPU is the bottleneck, which the backend's
    /// own report (`endpoint-load-metrics`, e.g. event-loop utilisation) or, for
    /// supervised workers, the worker's CPU time says directly.
    ///
    /// Nor on requests that mostly wait (`mostly_waits`): a worker saturated by the HTTP
    /// work of hundreds of requests that each wait 50 ms on a database serves them all
    /// at once, and a limit of a few at a time cut it to a small fraction of that
    /// (`bench/io-crowd.sh`, 1,000 connections under `drover run --mode proxy`: 4,800
    /// req/s with the limit, 12,100 without; Node cluster 16,900).
    ///
    /// And never on an endpoint that serves client connections of its own: it holds
    /// requests drover does not count, so a limit on drover's share of them protects
    /// nothing and only makes drover's requests wait while the handed connections' go
    /// straight in: an I/O-bound app under `drover run` at 1,000 connections, most of
    /// them handed over, held drover's requests to one at a time per worker while its
    /// queue waits reached a second.
    pub fn concurrency_cap(&self, now: Nanos) -> u32 {
        if self.is_on_probation() {
            return PROBATION_CAP;
        }
        match self.max_conns() {
            0 if self.limit_in_force(now) => self.learned_limit() as u32,
            max => max,
        }
    }

    /// Whether the learned limit holds requests back now (see `concurrency_cap`).
    pub fn limit_in_force(&self, now: Nanos) -> bool {
        self.limit_may_apply() && self.is_saturated(now)
    }

    /// Whether its learned limit holds requests back now and it has no room under it.
    pub fn is_full_at_its_limit(&self, now: Nanos) -> bool {
        self.limit_in_force(now) && !self.has_capacity(now)
    }

    /// Whether its CPU reads saturated by work (its requests do not mostly wait), yet no
    /// learned limit holds drover's requests back, because it serves client connections
    /// of its own (`concurrency_cap`). Beside siblings that are full at their limits it
    /// is then the only endpoint with room, and strategies keep it level with them
    /// (`strategy::common::claim`).
    pub fn is_saturated_but_lifted(&self, now: Nanos) -> bool {
        self.serves_clients()
            && self.is_adaptive()
            && !self.mostly_waits()
            && self.is_saturated(now)
    }

    /// Whether the learned limit would hold requests back here if its CPU read saturated.
    fn limit_may_apply(&self) -> bool {
        self.is_adaptive() && !self.mostly_waits() && !self.serves_clients()
    }

    /// Whether it holds a burst that no CPU report has judged yet: its learned limit
    /// would apply if it were saturated, it is not (yet), it holds `LIMIT_INITIAL`
    /// working requests or more, and its CPU is reported, but no report came
    /// `JUDGED_AFTER` it became busy (for at most `JUDGEMENT_WAIT_MAX`). While a
    /// sibling is full at its limit or on its way, strategies send it no more until a
    /// report judges it (`strategy::common::claim`).
    ///
    /// A worker a supervisor runs counts as reported before its first report, which
    /// comes a CPU sample or two after it joined: a burst that came with it was
    /// otherwise never held.
    pub fn holds_an_unjudged_burst(&self, now: Nanos) -> bool {
        let since = self.busy_since.load(Relaxed);
        let reported = self.reported_at.load(Relaxed);
        (reported != 0 || self.worker_life().is_some())
            && now.saturating_sub(since) < JUDGEMENT_WAIT_MAX
            && reported < since.saturating_add(JUDGED_AFTER)
            && self.pending().saturating_sub(self.waiting()) >= LIMIT_INITIAL as u32
            && self.limit_may_apply()
            && !self.is_saturated(now)
    }

    /// Whether, in the last judged window, its busy time was under `MOSTLY_WAITING` of
    /// the expected cost of the requests it answered: they wait, they do not work.
    pub fn mostly_waits(&self) -> bool {
        self.mostly_waits.load(Relaxed)
    }

    pub fn has_capacity(&self, now: Nanos) -> bool {
        match self.in_flight_cap() {
            0 => self.admits_pending(self.pending(), now),
            max => self.in_flight() < max,
        }
    }

    /// The cap on requests in flight: a fixed `max_conns`, or `PROBATION_CAP` while on
    /// probation; 0 when none (a learned limit, on pending requests, may apply).
    fn in_flight_cap(&self) -> u32 {
        match (self.is_on_probation(), self.max_conns()) {
            (true, _) => PROBATION_CAP,
            (false, max) => max,
        }
    }

    /// Whether one more request may go in, `pending` being sent and unanswered: the
    /// learned limit counts the working ones only (overtaken requests wait).
    ///
    /// The pipeline budget trusts the working requests' costs, so it does not apply
    /// while one of them that was counted at a guess (its route not timed yet) has been
    /// pending longer than the whole budget: that guess was wrong. A burst at a cold
    /// start put 50 requests of 300 ms on each of two Node workers, each counted at the
    /// cost of the health checks timed before it (0.5 ms). With 10 left (3 s of work) they
    /// read as 5 ms, and the budget let the queue's next requests in beside them. The
    /// worker served those first (a Node worker serves a kept connection before sockets
    /// that wait their turn), they overtook the burst's last ones, and those waited until
    /// the queue ran dry: 18-20 s where the burst's work was done in 15.
    fn admits_pending(&self, pending: u32, now: Nanos) -> bool {
        let cap = self.concurrency_cap(now);
        cap == 0
            || pending.saturating_sub(self.waiting()) < cap
            || (self.working_cost() < PIPELINE_BUDGET
                && !self
                    .order()
                    .holds_a_stale_guess(now.saturating_sub(PIPELINE_BUDGET)))
    }

    /// `try_acquire_as` for a request of no known route whose cost is its route's.
    #[cfg(test)]
    pub(crate) fn try_acquire(&self, cost: Nanos, now: Nanos) -> Option<(u32, u64)> {
        self.try_acquire_as(cost, false, 0, now)
    }

    /// Takes a slot unless the endpoint is at its cap; returns the working count
    /// including this one, and the request's place in the send order (0: not tracked).
    /// `guessed`: its cost is a guess (`PickContext::guess`, or the latency estimate),
    /// not its route's; `route`: `PickContext::route`. Only `Pick` calls it.
    pub(crate) fn try_acquire_as(
        &self,
        cost: Nanos,
        guessed: bool,
        route: u64,
        now: Nanos,
    ) -> Option<(u32, u64)> {
        let working = match self.in_flight_cap() {
            0 => {
                let before = self
                    .pending
                    .fetch_update(Relaxed, Relaxed, |n| {
                        self.admits_pending(n, now).then_some(n + 1)
                    })
                    .ok()?;
                if before == 0 {
                    self.busy_since.store(now.max(1), Relaxed);
                    self.work_arrived();
                }
                self.in_flight.fetch_add(1, Relaxed);
                self.pending_cost.fetch_add(cost.min(WORK_CAP), Relaxed);
                (before + 1).saturating_sub(self.waiting())
            }
            max => {
                self.in_flight
                    .fetch_update(Relaxed, Relaxed, |n| (n < max).then_some(n + 1))
                    .ok()?;
                self.pending_cost.fetch_add(cost.min(WORK_CAP), Relaxed);
                let before = self.pending.fetch_add(1, Relaxed);
                if before == 0 {
                    self.work_arrived();
                }
                before + 1
            }
        };
        // Only a learned limit needs to tell working from waiting; a fixed `max_conns`
        // counts everything in flight, as nginx and HAProxy do.
        let seq = if self.is_adaptive() {
            self.order().sent(now, cost.min(WORK_CAP), guessed, route)
        } else {
            0
        };
        Some((working.max(1), seq))
    }

    fn order(&self) -> std::sync::MutexGuard<'_, SendOrder> {
        self.send_order.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adapts the learned limit after a request whose uncontended cost was known.
    /// `pending_at_start` is how many requests awaited an answer with this one.
    ///
    /// It learns only while the backend is saturated, the only time the limit is in
    /// force: latencies of an unsaturated backend say nothing about its capacity.
    /// Only a request that filled the endpoint exactly to its limit may raise it: an
    /// idle endpoint serving quickly says nothing about how much more it could take,
    /// and one let in above the limit on the pipeline budget says nothing either.
    pub fn adapt_limit(&self, now: Nanos, latency: Nanos, expected: Nanos, pending_at_start: u32) {
        if expected == 0 || !self.limit_in_force(now) {
            return;
        }
        let ratio = latency as f64 / expected as f64;
        let limit = self.learned_limit();
        let next = if ratio >= QUEUED_RATIO {
            (limit * DECREASE).max(LIMIT_MIN)
        } else if ratio <= UNQUEUED_RATIO && pending_at_start == limit as u32 {
            (limit + 1.0 / (limit * GROWTH)).min(LIMIT_MAX)
        } else {
            return;
        };
        self.limit.store(next.to_bits(), Relaxed);
    }

    /// The request `seq` (from `try_acquire`) is no longer pending: its response head
    /// came at `answered_at`, or the exchange ended without one (`None`). An answer
    /// overtakes the pending requests sent before it by at least its own latency (and
    /// `OVERTAKEN_BY`; see `SendOrder::settled`).
    pub(crate) fn settle(&self, cost: Nanos, seq: u64, answered_at: Option<Nanos>) {
        if seq != 0 {
            // The counts change under the lock: another thread's answer may overtake
            // this request at the same moment, and its increment must come first.
            let mut order = self.order();
            let (overtaken, count, count_cost) = order.settled(seq, answered_at);
            if overtaken {
                self.waiting.fetch_sub(1, Relaxed);
                self.waiting_cost.fetch_sub(cost.min(WORK_CAP), Relaxed);
            }
            if count > 0 {
                self.waiting.fetch_add(count, Relaxed);
                self.waiting_cost.fetch_add(count_cost, Relaxed);
            }
            drop(order);
        }
        self.pending.fetch_sub(1, Relaxed);
        self.pending_cost.fetch_sub(cost.min(WORK_CAP), Relaxed);
        // Bounded as in the load score: a long-poll that waited 25 s is one request
        // that waited, not 250 of them.
        self.answered_cost.fetch_add(cost.min(WORK_CAP), Relaxed);
    }

    /// The exchange is over; `settled` says whether `settle` already ran for it.
    pub(crate) fn release(&self, cost: Nanos, seq: u64, settled: bool) {
        if !settled {
            self.settle(cost, seq, None);
        }
        self.in_flight.fetch_sub(1, Relaxed);
    }

    /// The latency estimate in ns, or `DEFAULT_RTT` before the first observation.
    pub fn rtt_estimate(&self) -> f64 {
        match self.rtt_estimate.load(Relaxed) {
            0 => DEFAULT_RTT as f64,
            bits => f64::from_bits(bits),
        }
    }

    /// Peak-EWMA: a slower response than the estimate replaces it at once; a faster one
    /// pulls it down with a weight that grows with the time since the last observation.
    /// Concurrent updates may lose one observation; the estimate stays sane.
    pub fn observe_rtt(&self, now: Nanos, rtt: Nanos) {
        let rtt = rtt as f64;
        let prev_bits = self.rtt_estimate.load(Relaxed);
        let next = if prev_bits == 0 {
            rtt
        } else {
            let prev = f64::from_bits(prev_bits);
            if rtt > prev {
                rtt
            } else {
                let elapsed = now.saturating_sub(self.rtt_stamp.load(Relaxed)) as f64;
                let w = (-elapsed / EWMA_DECAY as f64).exp();
                prev * w + rtt * (1.0 - w)
            }
        };
        self.rtt_estimate.store(next.max(1.0).to_bits(), Relaxed);
        self.rtt_stamp.store(now, Relaxed);
    }

    /// Records the backend's own utilisation report (1.0 = saturated).
    pub fn report_load(&self, now: Nanos, load: f64) {
        if load.is_finite() && load >= 0.0 {
            self.reported_load.store(load.to_bits(), Relaxed);
            let previous = self.reported_at.swap(now, Relaxed);
            self.judge_work_share(now, previous, load);
            if load >= SATURATED {
                self.saturated.store(true, Relaxed);
                self.low_since.store(0, Relaxed);
            } else if load < SATURATION_ENDS {
                match self.low_since.load(Relaxed) {
                    0 => self.low_since.store(now.max(1), Relaxed),
                    since if now.saturating_sub(since) >= SATURATION_LINGER => {
                        self.saturated.store(false, Relaxed)
                    }
                    _ => {}
                }
            } else {
                self.low_since.store(0, Relaxed);
            }
        }
    }

    /// Adds the busy time this report accounts for (its load over the time since the
    /// last one), and once per `WORK_SHARE_WINDOW` judges whether the requests answered
    /// in the window mostly wait. A window in which none were answered keeps the last
    /// verdict. The first verdict comes at the first report after an answer: at a cold
    /// start the limit is in force from the first saturated report, and a thousand
    /// requests that wait must not be held to it for a whole window. Reports that race
    /// may lose a little busy time; the verdict stays sane.
    fn judge_work_share(&self, now: Nanos, previous: Nanos, load: f64) {
        if previous != 0 && now > previous && now - previous <= REPORT_TTL {
            let busy = load.min(1.0) * (now - previous) as f64;
            self.busy_since_judged.fetch_add(busy as u64, Relaxed);
        }
        let judged_at = self.judged_at.load(Relaxed);
        if judged_at == 0 {
            // The first window starts here: what was answered before it is no one's.
            self.judged_at.store(now.max(1), Relaxed);
            self.answered_cost.store(0, Relaxed);
        } else if now > judged_at
            && (now - judged_at >= WORK_SHARE_WINDOW || !self.judged_once.load(Relaxed))
        {
            let answered = self.answered_cost.swap(0, Relaxed) as f64;
            if answered == 0.0 && !self.judged_once.load(Relaxed) {
                return; // nothing to judge by yet: the first window goes on
            }
            self.judged_at.store(now, Relaxed);
            let busy = self.busy_since_judged.swap(0, Relaxed) as f64;
            let (busy_long, answered_long) = self
                .work_history
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(busy, answered);
            if answered > 0.0 {
                self.mostly_waits.store(
                    busy < MOSTLY_WAITING * answered && busy_long < MOSTLY_WAITING * answered_long,
                    Relaxed,
                );
                self.judged_once.store(true, Relaxed);
            }
        }
    }

    /// The last reported load, or 0 when none came within `REPORT_TTL`.
    pub fn reported_load(&self, now: Nanos) -> f64 {
        let at = self.reported_at.load(Relaxed);
        if at == 0 || now.saturating_sub(at) > REPORT_TTL {
            0.0
        } else {
            f64::from_bits(self.reported_load.load(Relaxed))
        }
    }

    pub fn is_healthy(&self) -> bool {
        self.healthy.load(Relaxed)
    }

    /// Up again, it is no longer hung (`set_hung`).
    pub fn set_healthy(&self, healthy: bool) {
        self.healthy.store(healthy, Relaxed);
        if healthy {
            self.hung.store(false, Relaxed);
        }
    }

    /// Hung: down because its health checks got no answer (a stopped or deadlocked
    /// process, not one that answers "unhealthy"). A request waiting on it with no byte
    /// of answer that may be sent twice then goes to another endpoint instead of waiting
    /// out the request timeout. One whose checks answer with a bad status is not hung:
    /// it may still finish what it holds, as an app that fails its checks to drain does.
    pub fn set_hung(&self, hung: bool) {
        self.hung.store(hung, Relaxed);
    }

    pub fn is_hung(&self) -> bool {
        self.hung.load(Relaxed)
    }

    /// On probation: its health checks failed `fall` times with no answer, yet it stays
    /// in rotation (a slow answer may be load drover cannot see), so it takes one request
    /// at a time until a check passes or a request completes. A truly hung backend then
    /// holds one of drover's requests, not as many as the load-aware strategies would
    /// send to a backend whose stuck requests read as waiting, not working.
    pub fn set_on_probation(&self, on: bool) {
        self.on_probation.store(on, Relaxed);
    }

    pub fn is_on_probation(&self) -> bool {
        self.on_probation.load(Relaxed)
    }

    /// Passive ejection: keep the endpoint out of rotation until `until`.
    pub fn eject_until(&self, until: Nanos) {
        self.ejected_until.store(until, Relaxed);
    }

    pub fn ejected_until(&self) -> Nanos {
        self.ejected_until.load(Relaxed)
    }

    pub fn is_available(&self, now: Nanos) -> bool {
        self.is_healthy() && now >= self.ejected_until.load(Relaxed)
    }

    /// A request succeeded: the failure streak ends, and the failure share decays.
    /// Reads first so the common case (no streak, no recent failure) does not write a
    /// shared cache line on every request.
    pub fn note_success(&self) {
        self.end_streak();
        let share = self.failure_share.load(Relaxed);
        if share != 0 {
            // Racing updates lose a step now and then: fine for an average.
            self.failure_share
                .store(share - share.div_ceil(SHARE_STEPS), Relaxed);
        }
    }

    /// The failure streak ends (an ejection spent it), the failure share stays.
    pub fn end_streak(&self) {
        if self.fail_streak.load(Relaxed) != 0 {
            self.fail_streak.store(0, Relaxed);
        }
    }

    /// A request failed; returns the streak including this failure.
    pub fn note_failure(&self) -> u32 {
        let share = self.failure_share.load(Relaxed);
        self.failure_share
            .store(share + (SHARE_ONE - share) / SHARE_STEPS, Relaxed);
        self.fail_streak.fetch_add(1, Relaxed) + 1
    }

    /// The share of its recent outcomes that failed, 0.0 to 1.0 (see `failure_share`).
    pub fn failure_share(&self) -> f64 {
        f64::from(self.failure_share.load(Relaxed)) / f64::from(SHARE_ONE)
    }

    pub fn fail_streak(&self) -> u32 {
        self.fail_streak.load(Relaxed)
    }

    /// Ejections in a row without a healthy spell between them (the back-off exponent).
    pub fn ejections(&self) -> u32 {
        self.ejections.load(Relaxed)
    }

    pub fn set_ejections(&self, n: u32) {
        self.ejections.store(n, Relaxed);
    }

    /// Starts slow start: the endpoint's share ramps from `MIN_RAMP` to full over `len`.
    pub fn start_ramp(&self, now: Nanos, len: Nanos) {
        self.ramp_len.store(len, Relaxed);
        self.ramp_start.store(now, Relaxed);
    }

    /// The slow-start factor in (0, 1]; 1 when not ramping.
    pub fn ramp(&self, now: Nanos) -> f64 {
        let len = self.ramp_len.load(Relaxed);
        let start = self.ramp_start.load(Relaxed);
        if len == 0 || start == 0 {
            return 1.0;
        }
        let done = now.saturating_sub(start) as f64 / len as f64;
        done.clamp(MIN_RAMP, 1.0)
    }

    /// Weight after slow start, as used by every weight-aware strategy.
    pub fn effective_weight(&self, now: Nanos) -> f64 {
        self.weight() as f64 * self.ramp(now)
    }

    /// The share an idle endpoint gets among idle ones: its weight after slow start, less
    /// the load it reports (other balancers' traffic, or its own background work).
    pub fn idle_share(&self, now: Nanos) -> f64 {
        self.effective_weight(now) / (1.0 + self.reported_load(now))
    }

    /// Where its last turn among idle endpoints ended, and when it took it (see
    /// `idle_turns`).
    pub fn last_idle_turn(&self) -> (f64, u64) {
        (
            f64::from_bits(self.last_idle_turn.load(Relaxed)),
            self.last_idle_turn_taken.load(Relaxed),
        )
    }

    pub fn set_last_idle_turn(&self, end: f64, taken: u64) {
        self.last_idle_turn.store(end.to_bits(), Relaxed);
        self.last_idle_turn_taken.store(taken, Relaxed);
    }

    /// The load score `peak-ewma` ranks by; lower is better.
    ///
    /// Outstanding work is the expected cost of the requests still waiting for an answer
    /// plus one more request at the latency estimate. A backend that reports itself busy
    /// scales that up; weight and slow start scale it down, so a heavier endpoint takes
    /// proportionally more.
    pub fn load_score(&self, now: Nanos) -> f64 {
        let work = self.working_cost() as f64 + self.rtt_estimate();
        work * self.busy_factor(now)
    }

    /// The work a new request would find ahead of it here, the score `p2c` compares busy
    /// endpoints by; lower is better: the expected cost of the pending requests, scaled
    /// down by weight and slow start.
    ///
    /// Unlike `load_score` it leaves the latency estimate out: that is a peak over every
    /// route, so right after one expensive request it adds that request's cost to an
    /// endpoint that may hold only cheap ones, and a cheap request is sent to queue behind
    /// an expensive one elsewhere. A slower endpoint still gets less: its requests stay
    /// pending longer. It leaves the reported load out too: that report is up to a window
    /// old and noisy, and the pending work it would scale already says what waits there;
    /// scaling by it sent cheap requests behind expensive ones on mixed CPU-bound load
    /// (`BENCH_REPORT_LOAD=1` matrix, cpu-mixed-open75 p99 0.93 → 0.82 × HAProxy
    /// leastconn). (Idle endpoints are not ranked at all; see `is_free`.)
    ///
    /// Each pending request also counts 1 ns, which breaks ties by count. A request of a
    /// route drover has not timed counts the same on every endpoint
    /// (`PickContext::guess`), and before anything was timed (a burst at a cold start)
    /// every cost is alike, and the scores of busy endpoints were all equal: a coin flip settled each pick, and a burst of 100
    /// requests split 55/45 or worse about one time in three, where round-robin splits
    /// it 50/50 and finishes sooner. Against any measured cost (µs and more) the nanosecond is nothing.
    ///
    /// An overtaken request (`waiting`) counts for at most `typical` (the cost of a
    /// request of any route here, `PickContext::guess`). Overtaken is not proof of
    /// waiting: a Node worker busy with CPU work accepts new connections a few per turn
    /// of its event loop and serves the connections it already has first, so a request
    /// that drover sent on a fresh connection at a cold start sat unread for a second
    /// while later ones on older connections overtook it. Counted as nothing, 26 such
    /// requests made their worker look idle, p2c sent it everything, and it held 38
    /// requests against the other's 9 (`drover proxy` over two Node backends, 47
    /// connections, 4.5 % of requests at 112 ms, the rest at 1.6 ms: p99 2.3 s against
    /// nginx least_conn's 0.5 s). Counted at their full cost, long-polls would outweigh
    /// hundreds of short requests (`WORK_CAP`); at `typical`, 20 of them weigh as 20
    /// ordinary requests.
    pub fn pending_score(&self, now: Nanos, typical: Nanos) -> f64 {
        let waiting = self
            .waiting_cost
            .load(Relaxed)
            .min(u64::from(self.waiting()).saturating_mul(typical));
        (self.working_cost() as f64 + waiting as f64 + self.pending() as f64)
            / self.effective_weight(now)
    }

    /// Reported load scales a score up; weight and slow start scale it down.
    fn busy_factor(&self, now: Nanos) -> f64 {
        (1.0 + self.reported_load(now)) / self.effective_weight(now)
    }
}

/// The busy time and answered cost of the last `WORK_SHARE_HISTORY` judged windows.
#[derive(Debug, Default)]
struct WorkHistory {
    windows: std::collections::VecDeque<(f64, f64)>,
}

impl WorkHistory {
    /// Adds a judged window; the sums over the kept ones, this one included.
    fn push(&mut self, busy: f64, answered: f64) -> (f64, f64) {
        if self.windows.len() == WORK_SHARE_HISTORY {
            self.windows.pop_front();
        }
        self.windows.push_back((busy, answered));
        self.windows
            .iter()
            .fold((0.0, 0.0), |(b, a), (wb, wa)| (b + wb, a + wa))
    }
}

/// The pending requests of an endpoint with a learned limit, by the order they were
/// sent, with when, at what expected cost (capped at `WORK_CAP`) and of which route.
#[derive(Debug, Default)]
struct SendOrder {
    /// The last place given; places start at 1 (0 means untracked).
    last: u64,
    /// Those no later answer has overtaken, by place.
    pending: BTreeMap<u64, Sent>,
    /// The places of those overtaken (counted in `Endpoint::waiting`).
    overtaken: BTreeSet<u64>,
}

/// How many pending requests one look at a `SendOrder` walks past without a change.
const SCAN_LIMIT: usize = 64;

/// One pending request in a `SendOrder`.
#[derive(Debug, Clone, Copy)]
struct Sent {
    at: Nanos,
    cost: Nanos,
    /// Its cost is a guess, not its route's estimate.
    guessed: bool,
    /// Its route (`CostTable::key`); 0: not known.
    route: u64,
}

impl SendOrder {
    /// A request sent at `now`: its place.
    fn sent(&mut self, now: Nanos, cost: Nanos, guessed: bool, route: u64) -> u64 {
        self.last += 1;
        let sent = Sent {
            at: now,
            cost,
            guessed,
            route,
        };
        self.pending.insert(self.last, sent);
        self.last
    }

    /// Whether a working (not overtaken) request counted at a guess was sent before
    /// `before`. Only the oldest `SCAN_LIMIT` are looked at: the budget is for a few
    /// cheap requests, and this runs on every pick above the limit.
    fn holds_a_stale_guess(&self, before: Nanos) -> bool {
        self.pending
            .values()
            .take(SCAN_LIMIT)
            .take_while(|s| s.at < before)
            .any(|s| s.guessed)
    }

    /// Request `seq` is no longer pending (answered at `answered_at`, or ended without
    /// an answer). Returns whether it had been overtaken, and the count and cost of the
    /// requests its answer overtakes now.
    ///
    /// An answer overtakes a request only if that one was sent before it by at least
    /// the answer's own latency: the overtaken request has then waited more than twice
    /// as long as a request that came later and got through. A request that queued
    /// behind CPU work overtakes nothing by that rule: requests that wait in one
    /// backend's queue come out in about any order (a Node worker reads the sockets
    /// that became ready during a long handler in an order of its own), and with only
    /// `OVERTAKEN_BY` as the margin, a queue of half a second could count most of
    /// itself as waiting, its endpoint look idle, and p2c send it more
    /// (`requests_queued_behind_cpu_work_overtake_nothing_when_answered_out_of_order`).
    ///
    /// Nor does an answer overtake a request of its own route: both asked for the same
    /// work, so the earlier one is queued, not waiting on something else. A Node worker
    /// busy with CPU work serves a request that came on a kept connection before those
    /// that wait unread on connections it accepted later: at a cold start drover opens
    /// a connection per request of a burst, and the queue's next requests, sent on the
    /// connections the burst's first answers freed, came out first. Counted as waiting,
    /// the burst's last requests let more of the queue in beside them, which passed them
    /// again, and they were answered only when the queue ran dry: 18-20 s where the
    /// burst's work was done in 15 (`bench/burst.sh` with `NEW_CONN=1`).
    fn settled(&mut self, seq: u64, answered_at: Option<Nanos>) -> (bool, u32, Nanos) {
        if self.overtaken.remove(&seq) {
            return (true, 0, 0);
        }
        let Some(answer) = self.pending.remove(&seq) else {
            return (false, 0, 0); // sent before the limit was learned: never tracked
        };
        let Some(now) = answered_at else {
            return (false, 0, 0);
        };
        let latency = now.saturating_sub(answer.at);
        let before = answer.at.saturating_sub(OVERTAKEN_BY.max(latency));
        // Requests of its own route stay where they are, so each answer walks past them
        // again: past at most `SCAN_LIMIT` of them (thousands of long-polls of one route
        // would otherwise be walked on every answer). Answers of other routes still
        // overtake what lies beyond.
        let (mut passed, mut own_route) = (Vec::new(), 0);
        let (mut count, mut cost) = (0, 0);
        for (&place, s) in &self.pending {
            if s.at >= before {
                break;
            }
            if answer.route != 0 && s.route == answer.route {
                own_route += 1;
                if own_route > SCAN_LIMIT {
                    break;
                }
                continue;
            }
            passed.push(place);
            count += 1;
            cost += s.cost;
        }
        for place in passed {
            self.pending.remove(&place);
            self.overtaken.insert(place);
        }
        (false, count, cost)
    }
}

/// FNV-1a, 64 bit: stable across Rust versions and machines (unlike `DefaultHasher`), so
/// ids in cookies and Maglev tables stay the same after a restart.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= *b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

fn stable_id(name: &str) -> String {
    format!("{:012x}", fnv1a(name.as_bytes()) >> 16)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep() -> Endpoint {
        Endpoint::new("127.0.0.1:8001".parse().unwrap())
    }

    #[test]
    fn acquire_respects_max_conns() {
        let e = ep();
        e.set_max_conns(2);
        assert_eq!(e.try_acquire(10, 1), Some((1, 0)));
        assert_eq!(e.try_acquire(10, 1), Some((2, 0)));
        assert_eq!(e.try_acquire(10, 1), None);
        assert_eq!(e.pending_cost(), 20);
        // A fixed cap counts until the exchange ends, even after the head came.
        e.settle(10, 0, Some(1));
        assert_eq!(e.try_acquire(10, 1), None);
        e.release(10, 0, true);
        assert_eq!(e.try_acquire(5, 1), Some((2, 0)));
        assert_eq!((e.in_flight(), e.pending()), (2, 2));
    }

    #[test]
    fn probation_takes_one_request_at_a_time_whatever_else_allows() {
        for max_conns in [0, 8] {
            let e = ep();
            e.set_max_conns(max_conns);
            e.set_on_probation(true);
            assert_eq!(e.concurrency_cap(1), PROBATION_CAP);
            assert_eq!(e.try_acquire(10, 1), Some((1, 0)));
            // The pipeline budget (a learned limit's) and `max_conns` would both admit more.
            assert!(!e.has_capacity(1));
            assert_eq!(e.try_acquire(10, 1), None);
            e.release(10, 0, false);
            assert!(e.has_capacity(1));
            assert_eq!(e.try_acquire(10, 1), Some((1, 0)));
            e.set_on_probation(false);
            assert!(e.has_capacity(1));
            assert!(e.try_acquire(10, 1).is_some());
        }
    }

    #[test]
    fn an_endpoint_back_up_is_no_longer_hung() {
        let e = ep();
        e.set_healthy(false);
        e.set_hung(true);
        assert!(e.is_hung());
        e.set_healthy(false);
        assert!(e.is_hung());
        e.set_healthy(true);
        assert!(!e.is_hung());
    }

    #[derive(Debug, Default)]
    struct CountArrivals(AtomicU32);

    impl WorkArrives for CountArrivals {
        fn work_arrived(&self) {
            self.0.fetch_add(1, Relaxed);
        }
    }

    #[test]
    fn a_watcher_hears_of_work_only_when_it_follows_none() {
        for max_conns in [0, 4] {
            let e = ep();
            e.set_max_conns(max_conns);
            let watch = Arc::new(CountArrivals::default());
            e.watch_work(watch.clone());
            let heard = || watch.0.load(Relaxed);
            let (_, a) = e.try_acquire(10, 1).unwrap();
            let (_, b) = e.try_acquire(10, 1).unwrap();
            assert_eq!(heard(), 1, "the second request came while one was pending");
            e.release(10, a, false);
            e.release(10, b, false);
            let (_, c) = e.try_acquire(10, 2).unwrap();
            assert_eq!(heard(), 2, "work after none, again");
            e.release(10, c, false);
            e.note_handed_connection();
            assert_eq!(
                heard(),
                3,
                "a handed connection is work drover does not see"
            );
        }
    }

    #[test]
    fn long_requests_count_as_bounded_work() {
        let e = ep();
        let (_, seq) = e.try_acquire(60_000_000_000, 1).unwrap();
        assert_eq!(e.pending_cost(), WORK_CAP);
        e.release(60_000_000_000, seq, false);
        assert_eq!((e.in_flight(), e.pending(), e.pending_cost()), (0, 0, 0));
    }

    #[test]
    fn the_learned_limit_holds_only_while_the_backend_is_saturated() {
        let e = ep();
        e.set_adaptive(true);
        // Not saturated (nothing reported): no cap, however many wait, and latencies
        // teach nothing: an I/O-bound backend is slow without being busy.
        for _ in 0..30 {
            e.adapt_limit(1, 10_000_000, 60_000, 2);
        }
        assert_eq!(
            (e.learned_limit(), e.concurrency_cap(1)),
            (LIMIT_INITIAL, 0)
        );
        for _ in 0..100 {
            e.try_acquire(100_000_000, 1).unwrap();
        }
        // Saturated: the limit holds further requests back...
        e.report_load(1, 0.95);
        assert_eq!(e.concurrency_cap(2), LIMIT_INITIAL as u32);
        assert!(!e.has_capacity(2));
        // ...until the report is stale or says otherwise.
        assert!(e.has_capacity(2 + REPORT_TTL + 1));
        e.report_load(3, 0.5);
        e.report_load(3 + SATURATION_LINGER, 0.5);
        assert!(e.has_capacity(4 + SATURATION_LINGER));
    }

    #[test]
    fn adaptive_limit_falls_when_requests_queue_and_creeps_up_when_not() {
        let e = ep();
        let busy = |t| {
            e.report_load(t, 1.0);
            t
        };
        // Not adaptive: nothing moves and there is no cap.
        e.adapt_limit(busy(1), 100, 1, 1);
        assert_eq!(
            (e.learned_limit(), e.concurrency_cap(1)),
            (LIMIT_INITIAL, 0)
        );
        e.set_adaptive(true);
        assert_eq!(e.concurrency_cap(1), LIMIT_INITIAL as u32);
        // Cheap requests stuck behind expensive ones: down to one at a time.
        for _ in 0..30 {
            e.adapt_limit(busy(2), 10_000_000, 60_000, 2);
        }
        assert_eq!(e.learned_limit(), LIMIT_MIN);
        assert_eq!(e.concurrency_cap(2), 1);
        // Served at the limit without queueing: it grows, slowly.
        let steps = (1..100)
            .find(|_| {
                e.adapt_limit(busy(3), 60_000, 60_000, 1);
                e.concurrency_cap(3) == 2
            })
            .unwrap();
        assert!((4..=8).contains(&steps), "{steps} steps from 1 to 2");
        // Served below the limit: no evidence, no growth.
        let before = e.learned_limit();
        e.adapt_limit(busy(4), 60_000, 60_000, 1);
        assert_eq!(e.learned_limit(), before);
        // A fixed max_conns overrides learning.
        e.set_max_conns(7);
        assert_eq!(e.concurrency_cap(4), 7);
        assert!(!e.is_adaptive());
    }

    #[test]
    fn peak_ewma_takes_peaks_and_decays_slowly() {
        let e = ep();
        e.observe_rtt(1, 1_000);
        e.observe_rtt(2, 50_000);
        assert_eq!(e.rtt_estimate(), 50_000.0);
        // A fast answer right after barely moves the estimate...
        e.observe_rtt(3, 1_000);
        assert!(e.rtt_estimate() > 49_000.0);
        // ...one long after mostly replaces it.
        e.observe_rtt(3 + 10 * EWMA_DECAY, 1_000);
        assert!(e.rtt_estimate() < 1_100.0);
    }

    /// Reports a saturated worker every 25 ms for `windows` judging windows, answering
    /// `per_report` requests of `cost` between two reports; the time after.
    fn saturated_serving(
        e: &Endpoint,
        mut t: Nanos,
        windows: u64,
        per_report: u32,
        cost: Nanos,
    ) -> Nanos {
        const EVERY: Nanos = 25_000_000;
        for _ in 0..windows * (WORK_SHARE_WINDOW / EVERY) + 1 {
            for _ in 0..per_report {
                let (_, seq) = e.try_acquire(cost, t).unwrap();
                e.release(cost, seq, false);
            }
            e.report_load(t, 1.0);
            t += EVERY;
        }
        t
    }

    #[test]
    fn the_first_verdict_comes_with_the_first_answers() {
        let e = ep();
        e.set_adaptive(true);
        e.report_load(1, 1.0);
        assert_eq!(
            e.concurrency_cap(1),
            LIMIT_INITIAL as u32,
            "saturated, nothing known"
        );
        // Nothing answered yet: no verdict, however long.
        e.report_load(25_000_000, 1.0);
        assert!(!e.mostly_waits());
        // 100 requests of 50 ms each answered by the next report, 25 ms later.
        for _ in 0..100 {
            let (_, seq) = e.try_acquire(50_000_000, 30_000_000).unwrap();
            e.release(50_000_000, seq, false);
        }
        e.report_load(50_000_000, 1.0);
        assert!(e.mostly_waits());
        assert_eq!(e.concurrency_cap(50_000_000), 0);
    }

    #[test]
    fn requests_that_mostly_wait_are_not_held_to_a_learned_limit() {
        let e = ep();
        e.set_adaptive(true);
        // 1 ms of work per request, 25 per 25 ms: CPU-bound, the limit holds.
        let t = saturated_serving(&e, 1, 2, 25, 1_000_000);
        assert!(!e.mostly_waits());
        assert_eq!(e.concurrency_cap(t), LIMIT_INITIAL as u32);
        // The same worker, saturated by the HTTP work of requests that each wait 50 ms:
        // 125 of them per 25 ms take 6.25 s of expected cost for 25 ms of busy time.
        let t = saturated_serving(&e, t, 2, 125, 50_000_000);
        assert!(e.mostly_waits());
        assert!(e.is_saturated(t));
        assert_eq!(e.concurrency_cap(t), 0);
        let seqs: Vec<u64> = (0..100)
            .map(|_| e.try_acquire(50_000_000, t).expect("no limit in force").1)
            .collect();
        for seq in seqs {
            e.release(50_000_000, seq, false);
        }
        // A window with nothing answered keeps the verdict; work again changes it.
        let t = saturated_serving(&e, t, 1, 0, 0);
        assert!(e.mostly_waits());
        let t = saturated_serving(&e, t, 2, 25, 1_000_000);
        assert!(!e.mostly_waits());
        assert_eq!(e.concurrency_cap(t), LIMIT_INITIAL as u32);
    }

    #[test]
    fn answers_that_land_in_a_batch_are_work_not_waiting() {
        let e = ep();
        e.set_adaptive(true);
        let t = saturated_serving(&e, 1, 2, 25, 1_000_000);
        // 5 s of saturated work with nothing answered, then 46 answers of 100 ms at
        // once (a grpc-js worker's batch): one window reads 0.1 s busy for 4.6 s
        // answered, but the last 2 s read 2 s busy: it works, and the limit holds.
        let t = saturated_serving(&e, t, 49, 0, 0);
        let t = saturated_serving(&e, t, 0, 46, 100_000_000);
        let t = saturated_serving(&e, t, 1, 0, 0);
        assert!(!e.mostly_waits());
        assert_eq!(e.concurrency_cap(t), LIMIT_INITIAL as u32);
    }

    #[test]
    fn an_answer_overtakes_requests_of_other_routes_only() {
        const MS: Nanos = 1_000_000;
        const POLL: u64 = 1;
        const CPU: u64 = 2;
        let e = ep();
        e.set_adaptive(true);
        // A burst of one route, then a long-poll of another, sent within 2 ms.
        let burst: Vec<u64> = (0..5)
            .map(|i| e.try_acquire_as(MS, false, CPU, 1 + i).unwrap().1)
            .collect();
        let (_, poll) = e.try_acquire_as(MS, false, POLL, 2 * MS).unwrap();
        // A request of the burst's route, sent a second later and answered in 1 ms,
        // came out first: the burst is queued for the same work, the poll waits.
        let (_, later) = e.try_acquire_as(MS, false, CPU, 1_000 * MS).unwrap();
        e.settle(MS, later, Some(1_001 * MS));
        assert_eq!((e.working(), e.waiting()), (5, 1));
        // Of no known route, an answer overtakes any.
        let (_, unknown) = e.try_acquire_as(MS, false, 0, 1_000 * MS).unwrap();
        e.settle(MS, unknown, Some(1_001 * MS));
        assert_eq!((e.working(), e.waiting()), (0, 6));
        for seq in burst.into_iter().chain([poll]) {
            e.release(MS, seq, false);
        }
        assert_eq!((e.pending(), e.waiting(), e.working_cost()), (0, 0, 0));
    }

    #[test]
    fn overtaken_requests_wait_and_the_learned_limit_does_not_count_them() {
        const MS: Nanos = 1_000_000;
        let e = ep();
        e.set_adaptive(true);
        // 20 long-polls, sent while the worker had room; an untracked request, one sent
        // less than `OVERTAKEN_BY` after the last poll and one sent later. Then the
        // worker is saturated.
        let polls: Vec<u64> = (0..20)
            .map(|i| e.try_acquire(MS, 1 + i).unwrap().1)
            .collect();
        e.set_adaptive(false);
        let (_, untracked) = e.try_acquire(MS, 20).unwrap();
        e.set_adaptive(true);
        let (_, quick) = e.try_acquire(MS, 20 + MS / 2).unwrap();
        let (_, later) = e.try_acquire(MS, 5 * MS).unwrap();
        e.report_load(25, 1.0);
        assert!(
            !e.has_capacity(30),
            "saturated: 23 requests at a limit of 4"
        );
        // Nothing answered yet: nothing is known to wait.
        assert_eq!((e.working(), e.waiting()), (23, 0));
        e.settle(MS, untracked, Some(6 * MS));
        assert_eq!(e.waiting(), 0, "an untracked answer overtakes nothing");
        e.settle(MS, quick, Some(6 * MS));
        assert_eq!(
            (e.working(), e.waiting()),
            (21, 0),
            "answered 5.5 ms after it was sent, it overtakes nothing sent 0.5 ms before it"
        );
        e.settle(MS, later, Some(6 * MS));
        assert_eq!((e.working(), e.waiting()), (0, 20));
        assert_eq!(e.working_cost(), 0);
        assert!(
            !e.is_idle(),
            "waiting requests may still be queued unseen: not idle for placement"
        );
        // In the score each weighs at most the typical request's cost, here 0.1 ms.
        let twenty_typical = 20.0 * 100_000.0 + 20.0;
        assert_eq!(e.pending_score(6 * MS, 100_000), twenty_typical);
        assert_eq!(e.pending_score(6 * MS, 0), 20.0, "nothing timed: the count");
        // The limit holds working requests only: four go in, the fifth waits in drover.
        let working: Vec<u64> = (0..4)
            .map(|_| e.try_acquire(20 * MS, 6 * MS).expect("below the limit").1)
            .collect();
        assert_eq!(e.working(), 4);
        assert!(!e.has_capacity(6 * MS));
        // A poll answered at last leaves the waiting count, not the working one.
        e.settle(MS, polls[3], Some(7 * MS));
        assert_eq!((e.pending(), e.working(), e.waiting()), (23, 4, 19));
        // Requests that end without an answer overtake nothing.
        e.release(20 * MS, working[3], false);
        assert_eq!((e.working(), e.waiting()), (3, 19));
        for seq in &working[..3] {
            e.release(20 * MS, *seq, false);
        }
        for seq in polls[..3].iter().chain(&polls[4..]) {
            e.release(MS, *seq, false);
        }
        e.release(MS, quick, true);
        e.release(MS, later, true);
        e.release(MS, untracked, true);
        e.release(MS, polls[3], true);
        assert_eq!((e.in_flight(), e.pending(), e.waiting()), (0, 0, 0));
        assert_eq!((e.pending_cost(), e.working_cost()), (0, 0));
    }

    #[test]
    fn requests_queued_behind_cpu_work_overtake_nothing_when_answered_out_of_order() {
        const MS: Nanos = 1_000_000;
        let e = ep();
        e.set_adaptive(true);
        // 40 requests of 2 ms sent 2 ms apart to a worker that runs a 100 ms request
        // first: they queue, and come out in an order of their own, about 100 ms later.
        let sent: Vec<u64> = (0..40)
            .map(|i| e.try_acquire(2 * MS, 1 + 2 * MS * i).unwrap().1)
            .collect();
        let mut now = 180 * MS;
        for i in (0..40).rev().step_by(2).chain((0..40).step_by(2)) {
            now += MS;
            e.settle(2 * MS, sent[i as usize], Some(now));
            assert_eq!(e.waiting(), 0, "queued, not waiting: {i} answered at {now}");
        }
        // A request sent well after, answered quickly, overtakes what still waits.
        let polls: Vec<u64> = (0..3)
            .map(|i| e.try_acquire(MS, now + i).unwrap().1)
            .collect();
        let (_, quick) = e.try_acquire(MS, now + 10 * MS).unwrap();
        e.settle(MS, quick, Some(now + 12 * MS));
        assert_eq!((e.working(), e.waiting()), (0, 3));
        for seq in polls {
            e.release(MS, seq, false);
        }
        for seq in sent.into_iter().chain([quick]) {
            e.release(MS, seq, true);
        }
        assert_eq!((e.in_flight(), e.pending(), e.waiting()), (0, 0, 0));
    }

    #[test]
    fn concurrent_requests_and_answers_leave_every_count_at_zero() {
        let e = std::sync::Arc::new(ep());
        e.set_adaptive(true);
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let e = e.clone();
                std::thread::spawn(move || {
                    let mut held = std::collections::VecDeque::new();
                    for i in 0..20_000u64 {
                        let now = i * 100_000 + t;
                        if let Some((_, seq)) = e.try_acquire(1_000 + i % 7, now) {
                            held.push_back((seq, 1_000 + i % 7));
                        }
                        assert!(e.waiting() <= e.pending() + 8, "waiting ran past pending");
                        // Answer the newest of a few, so older ones are overtaken.
                        if held.len() > 3 {
                            let (seq, cost) = held.pop_back().unwrap();
                            e.settle(cost, seq, (i % 3 != 0).then_some(now));
                            e.release(cost, seq, true);
                            if i % 5 == 0 {
                                let (seq, cost) = held.pop_front().unwrap();
                                e.release(cost, seq, false);
                            }
                        }
                    }
                    for (seq, cost) in held {
                        e.release(cost, seq, false);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!((e.in_flight(), e.pending(), e.waiting()), (0, 0, 0));
        assert_eq!((e.pending_cost(), e.working_cost()), (0, 0));
    }

    #[test]
    fn an_endpoint_serving_handed_connections_is_never_held_to_a_learned_limit() {
        let e = ep();
        e.set_adaptive(true);
        e.report_load(1, 1.0);
        for _ in 0..LIMIT_INITIAL as usize {
            e.try_acquire(50_000_000, 1).unwrap();
        }
        assert!(!e.has_capacity(1), "saturated, at its learned limit");
        e.note_handed_connection();
        assert!(e.serves_clients());
        assert_eq!(e.concurrency_cap(1), 0);
        assert!(e.has_capacity(1));
        // Nor does it learn: its latencies are those of requests drover does not count.
        e.adapt_limit(2, 500_000_000, 50_000_000, 1);
        assert_eq!(e.learned_limit(), LIMIT_INITIAL);
        // A fixed max_conns still holds.
        e.set_max_conns(4);
        assert!(!e.has_capacity(2));
    }

    #[test]
    fn saturation_ends_only_well_below_the_threshold() {
        let e = ep();
        e.report_load(10, 0.85);
        assert!(!e.is_saturated(10), "0.85 does not start saturation");
        e.report_load(11, 0.95);
        assert!(e.is_saturated(11));
        e.report_load(12, 0.8);
        assert!(e.is_saturated(12), "a dip to 0.8 does not end it");
        e.report_load(13, 0.7);
        assert!(e.is_saturated(13), "one report below 0.75 does not end it");
        e.report_load(13 + SATURATION_LINGER / 2, 0.8);
        e.report_load(13 + SATURATION_LINGER, 0.7);
        assert!(
            e.is_saturated(13 + SATURATION_LINGER),
            "0.8 between the low reports starts the wait again"
        );
        e.report_load(13 + 2 * SATURATION_LINGER, 0.7);
        assert!(!e.is_saturated(13 + 2 * SATURATION_LINGER));
        e.report_load(14 + 2 * SATURATION_LINGER, 0.85);
        assert!(!e.is_saturated(14 + 2 * SATURATION_LINGER));
        e.report_load(15, 0.95);
        assert!(
            !e.is_saturated(15 + REPORT_TTL + 1),
            "an old report says nothing"
        );
    }

    #[test]
    fn reported_load_expires() {
        let e = ep();
        e.report_load(10, 0.5);
        assert_eq!(e.reported_load(11), 0.5);
        assert_eq!(e.reported_load(11 + REPORT_TTL), 0.0);
        e.report_load(12, f64::NAN);
        assert_eq!(e.reported_load(13), 0.5);
    }

    #[test]
    fn ejection_and_health_gate_availability() {
        let e = ep();
        assert!(e.is_available(5));
        e.eject_until(100);
        assert!(!e.is_available(99));
        assert!(e.is_available(100));
        e.set_healthy(false);
        assert!(!e.is_available(200));
    }

    #[test]
    fn slow_start_ramps_share() {
        let e = ep();
        e.start_ramp(1_000, 1_000);
        assert_eq!(e.ramp(1_000), MIN_RAMP);
        assert!((e.ramp(1_500) - 0.5).abs() < 1e-9);
        assert_eq!(e.ramp(3_000), 1.0);
    }

    #[test]
    fn score_prefers_less_work_and_more_weight() {
        let a = ep();
        let b = Endpoint::with_weight("127.0.0.1:8002".parse().unwrap(), 2);
        assert!(b.load_score(1) < a.load_score(1));
        assert!(a.try_acquire(5_000_000, 1).is_some());
        let c = ep();
        assert!(a.load_score(1) > c.load_score(1));
    }

    #[test]
    fn unknown_costs_rank_by_pending_count() {
        let (a, b) = (ep(), Endpoint::new("127.0.0.1:8002".parse().unwrap()));
        for _ in 0..3 {
            a.try_acquire(0, 1).unwrap();
        }
        b.try_acquire(0, 1).unwrap();
        assert!(b.pending_score(1, 0) < a.pending_score(1, 0));
        // A measured cost outweighs any count.
        b.try_acquire(50_000, 1).unwrap();
        assert!(a.pending_score(1, 0) < b.pending_score(1, 0));
    }

    #[test]
    fn ids_are_stable_and_distinct() {
        let a = ep();
        let b = Endpoint::new("127.0.0.1:8002".parse().unwrap());
        assert_eq!(a.id(), ep().id());
        assert_ne!(a.id(), b.id());
        assert_eq!(a.id().len(), 12);
    }
}
