//! Late binding: a request waits in drover's queue while every endpoint is at its
//! concurrency limit, and is bound to an endpoint only when one has room.
//!
//! Queueing here rather than inside a busy backend is what keeps cheap requests from
//! waiting behind expensive ones in a single-threaded server: a queued request goes to
//! whichever endpoint frees up first, not to the one it happened to be sent to.
//!
//! The queue is first come, first served, with two exceptions. While clients are leaving
//! it (a client closed its connection while its request waited, within the last
//! `NEWEST_FIRST_HOLD`), the newest waiters go first: see that constant for why. And a
//! request joins ahead of queued requests whose learned cost is more than `PASS_RATIO`
//! times its own, passing each of them at most `MAX_PASSES` times. So a cheap request
//! that arrives while two expensive ones wait for a busy endpoint no longer waits for
//! both to be served, and an expensive one waits for a few cheap ones more at most, and
//! never starves.
//!
//! Why bounded passes rather than a deadline per request (measured: "Queue order" in
//! bench/README.md): in bursts that drain, priority to short jobs cuts their wait a lot
//! and adds little to the long ones'; but when the queue stands (overload, or a
//! closed-loop load that refills it as fast as it empties), cheap requests keep
//! passing, expensive ones pile up behind each other, and the tail grows two- to
//! three-fold. A bound on passes keeps most of the first and none of the second.
//!
//! Turns go by when a request came, not when drover read it: a connection that waited
//! in the kernel's listen backlog (see `backed_up`) joins ahead of waiters that came
//! after it (`acquire_in_turn`). Each serving thread has a listening socket of its own,
//! and when accepting resumed each drained its backlog as a block: under `ab -c 100` of
//! 0.3 s CPU requests on 2 workers, connections that had waited in one socket's backlog
//! were served ~8 s after later ones from the other's, p99 20-24 s where Node's cluster
//! module's was 16-17 s (drover's own with no pause 16 s; by turns 14.7-16.7 s in 4 runs).
//!
//! A retry (a request whose endpoint failed it safely, a worker killed mid-request)
//! joins ahead of every first attempt, behind earlier retries only, and may exceed
//! `--queue-max`: it has waited once already, and under overload it would otherwise
//! time out behind the arrivals that came after it. Retries are bounded by the requests
//! that were in flight, so this cannot grow the queue without bound.
//!
//! A request that has waited the whole queue timeout gets a 503, unless the queue is
//! moving towards it (`reached_in_time`): no more wait ahead of it than left the queue
//! while it waited. Then, at the pace the queue already moves, it is served within
//! another timeout, and it waits that long at most. A burst that is still being served
//! is busy, not stuck: 200 requests of 0.6 s each on 2 workers, 100 at a time, wait
//! ~30 s each in turn, and with a plain deadline 5 and 9 of them got `503 queue-timeout`
//! in two runs, where Node's cluster module (no queue timeout) answered them late; with
//! this rule none did (`bench/burst.sh` with `POINTS=20000000`). The same holds for clients that send again as soon as they are
//! answered (a closed loop): the queue stands, and moves. A queue that does not move
//! (every endpoint held) still sheds at the timeout, as HAProxy's `timeout queue` does,
//! and one that grows (sustained overload) sheds what would wait past twice the timeout.
//!
//! The queue also tells the accept loop when it is backed up (`backed_up`): while the
//! oldest waiter has waited a quarter of the queue timeout, new connections are left
//! in the kernel's listen backlog instead of joining a queue that is not draining.
//!
//! A pool that expects endpoints (a supervised app's workers, which start and restart
//! on their own: `PoolOptions::expects_members`) queues a request also while no
//! endpoint is available at all, as Node's cluster module and PM2 hold connections
//! while workers start: drover started and at once sent traffic answers, late, instead
//! of `503`. The pool wakes the queue when an endpoint joins or rises (`Pool::watch_up`);
//! a request that waited the whole queue timeout for one gets `no-healthy-endpoint`.
//! Once each of those workers has ended by itself before it was ready (an app that
//! fails at boot: `Pool::set_members_failing`), no endpoint is on its way: requests get
//! `workers-not-starting` at once, and those waiting are told then, as nginx answers
//! 502 at once in front of an app that is down, rather than after 30 s each.
//! Fixed backends that are all down still get a `503` at once.
//!
//! Each release hands slots to the waiters at the head, in order, for as long as there
//! is room. (A wake-up primitive would let a waiter that lost a race drop to the back,
//! which is what makes tails long.) Room also opens with no release: a backend's CPU
//! stops being saturated, so its learned limit is no longer in force, or its requests
//! turn out to mostly wait. So while anyone waits, one task also looks every `RECHECK`.

use crate::error::ProxyError;
use drover_balance::{clock, Balancer, Endpoint, Nanos, NoPick, Pick, PickContext};
use drover_metrics::BalancerStats;
use drover_registry::Pool;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::sync::oneshot;

/// A request passes queued ones that cost more than this many times what it costs.
pub const PASS_RATIO: Nanos = 4;

/// How many later requests may pass a queued one.
pub const MAX_PASSES: u32 = 8;

/// The queue counts as backed up once its oldest waiter has waited this fraction of
/// the queue timeout: late enough that a burst which drains is never held at accept,
/// early enough that the waiters already in drover are served before they time out.
const BACKED_UP_FRACTION: u32 = 4;

/// How many waiters at the tail a request that came before them may go ahead of: a
/// bounded scan under the queue's lock, well past the few hundred connections one
/// socket's backlog gives at once.
const MAX_TURN_SCAN: usize = 4096;

/// How many waiters at the head are looked at for the oldest one. Passes and retries
/// put younger waiters ahead of older ones, but boundedly (`MAX_PASSES`, retries), so
/// the oldest is near the head; a bounded look keeps the lock short however long the
/// queue.
const OLDEST_SCAN: usize = 16;

/// How often a queue that nobody releases into looks again whether an endpoint has room
/// (`Admission::keep_rechecking`): a little less than the supervisor's CPU sample period, so
/// the queue moves within one sample of saturation ending.
///
/// Found stalled without it: 40 long-polls arrived at a cold start and saturated both
/// workers for a moment; 16 short requests that came then queued behind their learned
/// limits. Within 300 ms neither worker was saturated and no limit held, but the
/// long-polls held every slot for 20 s and released none, so nothing dispatched the
/// queue: the 16 waited until their clients gave up after 10 s.
const RECHECK: Duration = Duration::from_millis(20);

/// How many waiters pinned to a full endpoint one dispatch looks past, so a long queue
/// of pinned requests (every request carries a sticky cookie) costs a bounded scan.
const MAX_PINNED_SKIPS: usize = 32;

/// How long after a client last left the queue the newest waiters go first.
///
/// Clients that leave while they wait (a browser's user, an app's 10 s timeout) say the
/// queue has grown past their patience: served first come first served, each request
/// would reach a backend just as its client gives up, and a backend would spend its
/// time on answers nobody reads. Newest first, the requests served are the ones whose
/// clients are still there, and the oldest, whose clients are the likeliest to have
/// left, wait (as Facebook's "adaptive LIFO" does under a standing queue; here the
/// switch is the clients' own departures, so patient clients, a burst that drains, a
/// closed loop, keep first come first served). Measured with 1 s client timeouts at
/// twice the capacity of 2 Node workers (`--mode proxy`, 15 s): 189 of 3,000 requests
/// answered in time first come first served, even with the departed clients' requests
/// taken out of the queue; 1,516 newest first, the workers' whole capacity
/// (`bench/impatient.sh` runs it beside Node's cluster module).
const NEWEST_FIRST_HOLD: Duration = Duration::from_secs(1);

pub struct Admission {
    balancer: Arc<dyn Balancer>,
    pool: Arc<Pool>,
    queue: Mutex<VecDeque<Waiter>>,
    /// The queue's length, readable without the lock on every release.
    waiting: AtomicUsize,
    /// When the oldest waiter near the head joined (0: nobody waits), readable without
    /// the lock by the accept loop.
    oldest_joined: AtomicU64,
    /// A task re-checks the queue every `RECHECK` (set and cleared under the queue's
    /// lock, so a waiter that joins as it stops starts a new one).
    rechecking: AtomicBool,
    /// Requests that joined the queue, and that left it for an endpoint, ever (changed
    /// under the queue's lock). A waiter's ticket is the count of joins before it.
    joins: AtomicU64,
    departures: AtomicU64,
    /// When a client last left while its request waited here (0: never): while that
    /// was within `NEWEST_FIRST_HOLD`, the newest waiters go first.
    client_left_at: AtomicU64,
    /// The balancer's counts: a waiter whose client left is one.
    stats: Arc<BalancerStats>,
    max: usize,
    timeout: Duration,
}

/// A queued request: what its pick needs, owned, and where to send the slot.
struct Waiter {
    /// Its place among all joins (`Admission::joins`): who it is in the queue.
    ticket: u64,
    cost: Nanos,
    /// `PickContext::guess`.
    guess: Nanos,
    /// `PickContext::route`.
    route: u64,
    /// When it joined the queue.
    joined: Nanos,
    /// When the request came (`acquire_in_turn`): its turn.
    came: Nanos,
    /// A retry: it joins ahead of first attempts (see the module docs).
    retry: bool,
    /// Later requests that joined ahead of this one.
    passed: u32,
    hash_key: Option<Vec<u8>>,
    pinned: Option<String>,
    exclude: Vec<Arc<Endpoint>>,
    reply: oneshot::Sender<Result<Slot, ProxyError>>,
}

impl Waiter {
    /// Whether the request may only go to one endpoint while that one is up.
    fn is_pinned(&self) -> bool {
        self.hash_key.is_some() || self.pinned.is_some()
    }
}

impl Admission {
    pub fn new(
        balancer: Arc<dyn Balancer>,
        pool: Arc<Pool>,
        max: usize,
        timeout: Duration,
        stats: Arc<BalancerStats>,
    ) -> Self {
        Admission {
            balancer,
            pool,
            queue: Mutex::new(VecDeque::new()),
            waiting: AtomicUsize::new(0),
            oldest_joined: AtomicU64::new(0),
            rechecking: AtomicBool::new(false),
            joins: AtomicU64::new(0),
            departures: AtomicU64::new(0),
            client_left_at: AtomicU64::new(0),
            stats,
            max,
            timeout,
        }
    }

    pub fn waiting(&self) -> usize {
        self.waiting.load(Relaxed)
    }

    /// A request dropped while it waited (`Departure`): counted, and for
    /// `NEWEST_FIRST_HOLD` the newest waiters go first. Its waiter leaves the queue at
    /// the next dispatch that reaches it.
    fn client_left(&self) {
        self.stats.record_queue_abandoned();
        self.client_left_at.store(clock::now().max(1), Relaxed);
    }

    /// Whether the newest waiters go first at `now`: a client left the queue within
    /// `NEWEST_FIRST_HOLD` (see the module docs).
    fn newest_first(&self, now: Nanos) -> bool {
        let left_at = self.client_left_at.load(Relaxed);
        left_at != 0 && now.saturating_sub(left_at) < clock::nanos(NEWEST_FIRST_HOLD)
    }

    /// Whether the queue is backed up at `now`: its oldest waiter has waited at least
    /// a quarter of the queue timeout. The accept loop stops accepting meanwhile.
    pub fn backed_up(&self, now: Nanos) -> bool {
        let joined = self.oldest_joined.load(Relaxed);
        joined != 0 && now.saturating_sub(joined) >= clock::nanos(self.timeout / BACKED_UP_FRACTION)
    }

    /// Picks an endpoint, waiting in the queue while all are busy.
    pub async fn acquire(self: &Arc<Self>, ctx: &PickContext<'_>) -> Result<Slot, ProxyError> {
        self.acquire_in_turn(ctx, || ctx.now).await
    }

    /// As `acquire`, for a request that came at `came()`, perhaps long before drover
    /// read it (its connection waited in the listen backlog): it joins the queue ahead
    /// of the waiters that came after it. `came` is asked only if the request queues.
    pub async fn acquire_in_turn(
        self: &Arc<Self>,
        ctx: &PickContext<'_>,
        came: impl FnOnce() -> Nanos,
    ) -> Result<Slot, ProxyError> {
        // While others wait, a newcomer queues behind them instead of taking the slot
        // that is about to be handed to the first of them.
        if self.waiting() == 0 {
            let set = self.pool.snapshot();
            match self.balancer.pick(&set, ctx) {
                Ok(pick) => return Ok(self.slot(pick)),
                Err(NoPick::NoneAvailable) if !self.expects_endpoints() => {
                    return Err(self.none_to_wait_for())
                }
                Err(_) => {}
            }
        }
        // Before joining: an endpoint that comes up after this is seen by the wait
        // below, one that came up before by the dispatch after joining.
        let mut up = self.pool.watch_up();
        let (reply, mut answer) = oneshot::channel();
        let came = came();
        let joined_at = {
            let mut queue = self.lock();
            let retry = !ctx.exclude.is_empty();
            if queue.len() >= self.max && !retry {
                return Err(ProxyError::QueueFull);
            }
            let at = join_position(&queue, ctx.cost, retry, came);
            // Only those that came first were passed; the rest it was ahead of anyway.
            for ahead in queue.range_mut(at..).filter(|w| w.came <= came) {
                ahead.passed += 1;
            }
            let joined_at = QueueMark {
                ticket: self.joins.fetch_add(1, Relaxed),
                departures: self.departures.load(Relaxed),
            };
            queue.insert(
                at,
                Waiter {
                    ticket: joined_at.ticket,
                    cost: ctx.cost,
                    guess: ctx.guess,
                    route: ctx.route,
                    joined: clock::now().max(1),
                    came,
                    retry,
                    passed: 0,
                    hash_key: ctx.hash_key.map(<[u8]>::to_vec),
                    pinned: ctx.pinned.map(str::to_owned),
                    exclude: ctx.exclude.to_vec(),
                    reply,
                },
            );
            self.note_length(&queue);
            if !self.rechecking.swap(true, Relaxed) {
                self.keep_rechecking();
            }
            joined_at
        };
        // Dropped while it waits (this future is), the request's client has left.
        let mut departure = Departure {
            admission: self,
            waiting: true,
        };
        // A slot may have freed between the pick above and joining the queue.
        self.dispatch();
        let expired = tokio::time::sleep(self.timeout);
        tokio::pin!(expired);
        let mut extended = false;
        loop {
            tokio::select! {
                result = &mut answer => {
                    departure.waiting = false;
                    return result.unwrap_or(Err(ProxyError::QueueTimeout));
                }
                // No release may come while no endpoint is available: an endpoint that
                // joins or rises dispatches the queue. (Every waiter wakes; the first
                // places as many as there is room for, the rest find nothing to do.)
                Ok(()) = up.changed() => self.dispatch(),
                () = &mut expired => {
                    if extended || !self.reached_in_time(joined_at) {
                        break;
                    }
                    extended = true;
                    expired.as_mut().reset(tokio::time::Instant::now() + self.timeout);
                }
            }
        }
        departure.waiting = false;
        // A slot sent just as the timeout fired is still ours to use.
        answer.close();
        let result = answer.try_recv().unwrap_or_else(|_| Err(self.timed_out()));
        // Take the expired waiters off the head now, not at the next release (there may
        // be none for long): their age must not keep the queue counting as backed up.
        self.dispatch();
        result
    }

    /// Dispatches the queue every `RECHECK` until it is empty: room that opens with no
    /// release (saturation ends, a report expires, a reload raises `max_conns`) reaches
    /// the waiters too. One task per queue, whatever its length; it holds the admission
    /// weakly, so a reload that replaces it ends the task.
    fn keep_rechecking(self: &Arc<Self>) {
        let mut task = RecheckTask(Arc::downgrade(self));
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(RECHECK).await;
                let Some(admission) = task.0.upgrade() else {
                    return;
                };
                {
                    let queue = admission.lock();
                    if queue.is_empty() {
                        admission.rechecking.store(false, Relaxed);
                        task.disarm();
                        return;
                    }
                }
                admission.dispatch();
            }
        });
    }

    /// Whether the waiter that joined at `joined_at`, having waited the whole timeout,
    /// will be served within another at the pace the queue moved meanwhile: some left
    /// it, and no more wait ahead of this one than left. (A waiter already answered is
    /// not in the queue: `false`, and its answer is taken as it stands.)
    fn reached_in_time(&self, joined_at: QueueMark) -> bool {
        let queue = self.lock();
        let Some(ahead) = queue.iter().position(|w| w.ticket == joined_at.ticket) else {
            return false;
        };
        let left = self.departures.load(Relaxed) - joined_at.departures;
        left > 0 && ahead as u64 <= left
    }

    /// Whether a request waits while no endpoint is available, for one to come.
    fn expects_endpoints(&self) -> bool {
        self.pool.awaits_members()
    }

    /// Why a request that found no endpoint available is not waiting for one: the
    /// pool's workers all failed their last start, or its backends are all down.
    fn none_to_wait_for(&self) -> ProxyError {
        if self.pool.members_failing() {
            ProxyError::WorkersNotStarting
        } else {
            ProxyError::NoEndpoint
        }
    }

    /// Why a request waited the whole queue timeout: every endpoint was busy, or there
    /// was none to wait for (workers that never became ready).
    fn timed_out(&self) -> ProxyError {
        let now = clock::now();
        let set = self.pool.snapshot();
        if set.endpoints().iter().any(|e| e.is_available(now)) {
            ProxyError::QueueTimeout
        } else {
            self.none_to_wait_for()
        }
    }

    /// Hands free slots to the waiters at the head of the queue, in order, until the
    /// head cannot be placed. A waiter pinned to one endpoint (sticky, hash) that is
    /// still full keeps its place without holding back the waiters behind it, which may
    /// go anywhere: it waits for its endpoint, they need not. Likewise one with no
    /// endpoint available to it in a pool that expects endpoints (a retry that may not
    /// go back to the worker that failed it waits for its replacement).
    fn dispatch(self: &Arc<Self>) {
        let mut queue = self.lock();
        if queue.is_empty() {
            return;
        }
        let set = self.pool.snapshot();
        let newest_first = self.newest_first(clock::now());
        if newest_first {
            // Those gone from the head, which newest first does not reach: their age
            // must not keep the queue counting as backed up.
            while queue.front().is_some_and(|w| w.reply.is_closed()) {
                queue.pop_front();
            }
        }
        // How many waiters, in the order of service, were looked past.
        let mut skipped = 0;
        loop {
            let at = service_index(&queue, skipped, newest_first);
            let Some(waiter) = queue.get(at) else {
                break;
            };
            if waiter.reply.is_closed() {
                // Gave up (timeout or client gone).
                queue.remove(at);
                continue;
            }
            let ctx = PickContext {
                now: clock::now(),
                cost: waiter.cost,
                guess: waiter.guess,
                route: waiter.route,
                hash_key: waiter.hash_key.as_deref(),
                pinned: waiter.pinned.as_deref(),
                exclude: &waiter.exclude,
                previous: None,
                // Placed by whichever thread freed the room, whose idle connections are
                // not the waiter's: a queued request goes where room opened.
                pooled: None,
            };
            let result = match self.balancer.pick(&set, &ctx) {
                Ok(pick) => Ok(self.slot(pick)),
                Err(NoPick::NoneAvailable) if !self.expects_endpoints() => {
                    Err(self.none_to_wait_for())
                }
                Err(NoPick::NoneAvailable) if skipped < MAX_PINNED_SKIPS => {
                    skipped += 1;
                    continue;
                }
                Err(NoPick::AllBusy) if waiter.is_pinned() && skipped < MAX_PINNED_SKIPS => {
                    skipped += 1;
                    continue;
                }
                Err(_) => break,
            };
            let Some(waiter) = queue.remove(at) else {
                break;
            };
            self.departures.fetch_add(1, Relaxed);
            if let Err(Ok(mut unsent)) = waiter.reply.send(result) {
                // The waiter left after all: release the slot without re-entering
                // dispatch (we hold the queue), and offer it to the next waiter.
                drop(unsent.pick.take());
            }
        }
        self.note_length(&queue);
    }

    /// Publishes the queue's length and its oldest waiter's age for lock-free readers.
    fn note_length(&self, queue: &VecDeque<Waiter>) {
        self.waiting.store(queue.len(), Relaxed);
        let oldest = queue
            .iter()
            .take(OLDEST_SCAN)
            .filter(|w| !w.reply.is_closed())
            .map(|w| w.joined)
            .min()
            .unwrap_or(0);
        self.oldest_joined.store(oldest, Relaxed);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Waiter>> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn slot(self: &Arc<Self>, pick: Pick) -> Slot {
        Slot {
            pick: Some(pick),
            admission: Arc::clone(self),
        }
    }
}

/// A waiter's ticket, and how many had left the queue when it joined.
#[derive(Debug, Clone, Copy)]
struct QueueMark {
    ticket: u64,
    departures: u64,
}

/// Where in the queue the waiter served after `skipped` others is. First come first
/// served: the head on. Newest first: the retries at the head (each has waited once
/// already), then from the tail. An index past the end: nobody is left.
fn service_index(queue: &VecDeque<Waiter>, skipped: usize, newest_first: bool) -> usize {
    if !newest_first {
        return skipped;
    }
    let retries = queue.iter().take_while(|w| w.retry).count();
    if skipped < retries {
        return skipped;
    }
    // `skipped - retries` looked past from the tail.
    queue
        .len()
        .checked_sub(1 + skipped - retries)
        .filter(|&at| at >= retries)
        .unwrap_or(usize::MAX)
}

/// Where a request of `cost` that came at `came` joins: behind the last waiter it may
/// not pass. A retry passes every first attempt and no other retry. A first attempt goes
/// ahead of the waiters at the tail that came after it (at most `MAX_TURN_SCAN`), and
/// passes those that cost more than `PASS_RATIO` times as much and have been passed
/// fewer than `MAX_PASSES` times; never a retry. An unknown cost (0) passes nobody.
fn join_position(queue: &VecDeque<Waiter>, cost: Nanos, retry: bool, came: Nanos) -> usize {
    if retry {
        return queue.iter().take_while(|w| w.retry).count();
    }
    let mut at = queue.len();
    let stop = at.saturating_sub(MAX_TURN_SCAN);
    while at > stop {
        let ahead = &queue[at - 1];
        let came_later = ahead.came > came;
        let passes =
            cost != 0 && ahead.passed < MAX_PASSES && ahead.cost > cost.saturating_mul(PASS_RATIO);
        if ahead.retry || !(came_later || passes) {
            break;
        }
        at -= 1;
    }
    at
}

/// A request in the queue, as seen from its own wait: dropped while still `waiting`,
/// its request was dropped with it, which only its client's leaving does (a closed
/// connection, seen by `conn::exchange`; a reset HTTP/2 stream, by
/// `http2::serve_stream`). drover's own answers (a slot, the queue timeout) end the
/// wait first.
struct Departure<'a> {
    admission: &'a Admission,
    waiting: bool,
}

impl Drop for Departure<'_> {
    fn drop(&mut self) {
        if self.waiting {
            self.admission.client_left();
        }
    }
}

/// The re-checking task's hold on its admission. Dropped with the task while the queue
/// still holds waiters (the serving thread that spawned it ended: a reload removed its
/// listener, whose routes sent to this balancer), it lets the next waiter start another.
struct RecheckTask(Weak<Admission>);

impl RecheckTask {
    /// It ends having cleared the flag under the queue's lock itself.
    fn disarm(&mut self) {
        self.0 = Weak::new();
    }
}

impl Drop for RecheckTask {
    fn drop(&mut self) {
        if let Some(admission) = self.0.upgrade() {
            admission.rechecking.store(false, Relaxed);
        }
    }
}

/// A `Pick` that, when released, hands its room to the next queued request.
pub struct Slot {
    pick: Option<Pick>,
    admission: Arc<Admission>,
}

impl Slot {
    pub fn pick(&self) -> &Pick {
        self.pick
            .as_ref()
            .expect("slot holds its pick until dropped")
    }

    /// The response head arrived (see `Pick::observe`). The request stops counting
    /// against a learned limit now, while its body may stream for long after, so the
    /// room goes to the next queued request at once.
    pub fn observe(&self, now: Nanos) {
        self.pick().observe(now);
        if self.admission.waiting() > 0 {
            self.admission.dispatch();
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if self.pick.take().is_some() && self.admission.waiting() > 0 {
            self.admission.dispatch();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiter(cost: Nanos, passed: u32) -> Waiter {
        Waiter {
            ticket: 0,
            cost,
            guess: 0,
            route: 0,
            joined: 1,
            came: 1,
            retry: false,
            passed,
            hash_key: None,
            pinned: None,
            exclude: Vec::new(),
            reply: oneshot::channel().0,
        }
    }

    fn queue(waiters: &[(Nanos, u32)]) -> VecDeque<Waiter> {
        waiters.iter().map(|&(c, p)| waiter(c, p)).collect()
    }

    #[test]
    fn a_cheap_request_joins_ahead_of_the_expensive_tail_only() {
        // [cheap, expensive, expensive]: a cheap newcomer passes both expensive ones
        // but not the cheap one at the head.
        assert_eq!(
            join_position(&queue(&[(10, 0), (1000, 0), (1000, 0)]), 10, false, 1),
            1
        );
        // A newcomer of similar cost (within PASS_RATIO) keeps its place in line.
        assert_eq!(join_position(&queue(&[(1000, 0)]), 400, false, 1), 1);
        assert_eq!(join_position(&queue(&[(1000, 0)]), 249, false, 1), 0);
        // An expensive one in the middle shields the ones ahead of it only by its place:
        // the newcomer stops at the first waiter it may not pass.
        assert_eq!(
            join_position(&queue(&[(1000, 0), (10, 0), (1000, 0)]), 10, false, 1),
            2
        );
        assert_eq!(join_position(&VecDeque::new(), 10, false, 1), 0);
    }

    #[test]
    fn a_retry_joins_ahead_of_first_attempts_behind_earlier_retries() {
        let mut q = queue(&[(10, 0), (10, 0), (1000, 0)]);
        assert_eq!(join_position(&q, 10, true, 1), 0);
        assert_eq!(join_position(&q, 0, true, 1), 0);
        q[0].retry = true;
        assert_eq!(join_position(&q, 1000, true, 1), 1);
        // First attempts never pass a retry, however cheap.
        let mut q = queue(&[(1000, 0), (1000, 0)]);
        q[1].retry = true;
        assert_eq!(join_position(&q, 10, false, 1), 2);
    }

    #[test]
    fn newest_first_serves_the_retries_at_the_head_then_from_the_tail() {
        let mut q = queue(&[(10, 0), (10, 0), (10, 0), (10, 0)]);
        // First come first served: the head on.
        assert_eq!(service_index(&q, 0, false), 0);
        assert_eq!(service_index(&q, 3, false), 3);
        // Newest first: from the tail; past the head, nobody.
        assert_eq!(service_index(&q, 0, true), 3);
        assert_eq!(service_index(&q, 3, true), 0);
        assert_eq!(service_index(&q, 4, true), usize::MAX);
        // Retries at the head go first, in order; then the tail, down to the retries.
        q[0].retry = true;
        q[1].retry = true;
        assert_eq!(service_index(&q, 0, true), 0);
        assert_eq!(service_index(&q, 1, true), 1);
        assert_eq!(service_index(&q, 2, true), 3);
        assert_eq!(service_index(&q, 3, true), 2);
        assert_eq!(service_index(&q, 4, true), usize::MAX);
        assert_eq!(service_index(&VecDeque::new(), 0, true), usize::MAX);
    }

    #[tokio::test]
    async fn the_queue_counts_as_backed_up_once_its_oldest_waiter_waited_a_quarter_of_the_timeout()
    {
        let options = drover_registry::PoolOptions {
            max_conns: 1,
            ..Default::default()
        };
        let (_, admission) = one_endpoint(options, Duration::from_secs(4));
        let held = admission.acquire(&any_request()).await.unwrap();
        assert!(!admission.backed_up(clock::now()));
        let waiter = queued(&admission).await;
        let joined = admission.oldest_joined.load(Relaxed);
        assert!(!admission.backed_up(joined + clock::nanos(Duration::from_millis(999))));
        assert!(admission.backed_up(joined + clock::nanos(Duration::from_secs(1))));
        drop(held);
        assert!(waiter.await.unwrap().is_ok());
        assert!(!admission.backed_up(joined + clock::nanos(Duration::from_secs(9))));
    }

    /// An admission over a pool of one endpoint, by least-conn, with no queue bound.
    fn one_endpoint(
        options: drover_registry::PoolOptions,
        timeout: Duration,
    ) -> (Arc<Pool>, Arc<Admission>) {
        admission_over(&[(([127, 0, 0, 1], 9).into(), 1)], options, timeout)
    }

    fn admission_over(
        members: &[(std::net::SocketAddr, u32)],
        options: drover_registry::PoolOptions,
        timeout: Duration,
    ) -> (Arc<Pool>, Arc<Admission>) {
        let pool = Arc::new(Pool::new("t", members, options));
        let admission = Arc::new(Admission::new(
            Arc::new(drover_balance::strategy::LeastConn::new()),
            Arc::clone(&pool),
            usize::MAX,
            timeout,
            Arc::new(BalancerStats::default()),
        ));
        (pool, admission)
    }

    fn any_request() -> PickContext<'static> {
        PickContext {
            now: clock::now(),
            cost: 0,
            guess: 0,
            route: 0,
            hash_key: None,
            pinned: None,
            exclude: &[],
            previous: None,
            pooled: None,
        }
    }

    fn empty_pool(expects_members: bool, timeout: Duration) -> (Arc<Pool>, Arc<Admission>) {
        let options = drover_registry::PoolOptions {
            expects_members,
            ..Default::default()
        };
        admission_over(&[], options, timeout)
    }

    /// A request queued in `admission`, its answer to come.
    async fn queued(admission: &Arc<Admission>) -> tokio::task::JoinHandle<Result<(), ProxyError>> {
        let waiter = {
            let admission = Arc::clone(admission);
            tokio::spawn(async move { admission.acquire(&any_request()).await.map(|_| ()) })
        };
        tokio::task::yield_now().await;
        assert_eq!(admission.waiting(), 1);
        waiter
    }

    #[tokio::test]
    async fn with_no_endpoint_a_request_fails_at_once_unless_the_pool_expects_some() {
        let (_, admission) = empty_pool(false, Duration::from_secs(60));
        let result = admission.acquire(&any_request()).await.map(|_| ());
        assert_eq!(result, Err(ProxyError::NoEndpoint));

        let (pool, admission) = empty_pool(true, Duration::from_secs(60));
        let waiter = queued(&admission).await;
        // No slot is released: the endpoint joining is what dispatches the queue.
        pool.insert(
            drover_registry::Source::Supervisor,
            ([127, 0, 0, 1], 9).into(),
            1,
        );
        assert_eq!(waiter.await.unwrap(), Ok(()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_queued_request_gets_room_that_opens_with_no_release() {
        let (pool, admission) = one_endpoint(Default::default(), Duration::from_secs(60));
        let endpoint = pool.endpoints()[0].clone();
        endpoint.set_adaptive(true);
        let t0 = clock::now();
        endpoint.report_load(t0, 1.0);
        // Saturated: the learned limit holds requests of 20 ms at four.
        let costly = PickContext {
            cost: 20_000_000,
            ..any_request()
        };
        let mut held = Vec::new();
        for _ in 0..drover_balance::endpoint::LIMIT_INITIAL as usize {
            held.push(admission.acquire(&costly).await.unwrap());
        }
        let waiter = {
            let admission = Arc::clone(&admission);
            tokio::spawn(async move {
                let costly = PickContext {
                    cost: 20_000_000,
                    ..any_request()
                };
                admission.acquire(&costly).await.map(|_| ())
            })
        };
        tokio::task::yield_now().await;
        assert_eq!(admission.waiting(), 1);
        // Its CPU reports low for `SATURATION_LINGER`: no limit holds, and nothing held
        // is released.
        endpoint.report_load(t0 + 1, 0.1);
        endpoint.report_load(t0 + 1 + drover_balance::endpoint::SATURATION_LINGER, 0.1);
        assert!(!endpoint.limit_in_force(t0 + 2 + drover_balance::endpoint::SATURATION_LINGER));
        let placed = tokio::time::timeout(Duration::from_secs(1), waiter).await;
        assert_eq!(placed.expect("placed without a release").unwrap(), Ok(()));
        assert_eq!(admission.waiting(), 0);
        drop(held);
        // With the queue empty the re-checking task ends.
        tokio::time::sleep(RECHECK * 2).await;
        assert!(!admission.rechecking.load(Relaxed));
    }

    #[test]
    fn a_re_checking_task_that_ends_with_its_runtime_lets_another_start() {
        let options = drover_registry::PoolOptions {
            max_conns: 1,
            ..Default::default()
        };
        let (_, admission) = one_endpoint(options, Duration::from_secs(60));
        let runtime = || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
        };
        let held = runtime()
            .block_on(admission.acquire(&any_request()))
            .unwrap();
        // A serving thread's runtime queues a request, then ends with it still queued.
        let queue_one = |runtime: &tokio::runtime::Runtime| {
            runtime.block_on(async {
                let waiter = Arc::clone(&admission);
                tokio::spawn(async move { waiter.acquire(&any_request()).await.map(|_| ()) });
                tokio::task::yield_now().await;
            });
            admission.rechecking.load(Relaxed)
        };
        let first = runtime();
        assert!(queue_one(&first));
        drop(first);
        assert!(
            !admission.rechecking.load(Relaxed),
            "the task ended with its runtime"
        );
        // The next waiter, on another thread's runtime, starts another.
        let second = runtime();
        assert!(queue_one(&second));
        drop(held);
    }

    #[tokio::test]
    async fn once_every_worker_failed_its_start_waiters_are_told_and_newcomers_at_once() {
        let (pool, admission) = empty_pool(true, Duration::from_secs(600));
        let waiter = queued(&admission).await;
        assert!(pool.set_members_failing(true));
        assert_eq!(waiter.await.unwrap(), Err(ProxyError::WorkersNotStarting));
        let result = admission.acquire(&any_request()).await.map(|_| ());
        assert_eq!(result, Err(ProxyError::WorkersNotStarting));
        // A worker that starts after all: requests wait for workers again.
        assert!(pool.set_members_failing(false));
        let waiter = queued(&admission).await;
        pool.insert(
            drover_registry::Source::Supervisor,
            ([127, 0, 0, 1], 9).into(),
            1,
        );
        assert_eq!(waiter.await.unwrap(), Ok(()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_that_waited_in_vain_for_an_endpoint_says_there_was_none() {
        let (_, admission) = empty_pool(true, Duration::from_secs(1));
        let result = admission.acquire(&any_request()).await.map(|_| ());
        assert_eq!(result, Err(ProxyError::NoEndpoint));
        assert_eq!(admission.waiting(), 0);
    }

    /// One endpoint that holds one request at a time, its slot held, and a queue with a
    /// timeout of 10 s.
    fn one_at_a_time() -> (Arc<Admission>, Slot) {
        let options = drover_registry::PoolOptions {
            max_conns: 1,
            ..Default::default()
        };
        let (_, admission) = one_endpoint(options, Duration::from_secs(10));
        let held = admission.try_acquire_now();
        (admission, held)
    }

    impl Admission {
        fn try_acquire_now(self: &Arc<Self>) -> Slot {
            let set = self.pool.snapshot();
            self.slot(self.balancer.pick(&set, &any_request()).unwrap())
        }

        /// A request that joins the queue now: its slot, and how long it waited.
        fn queue_one(
            self: &Arc<Self>,
        ) -> tokio::task::JoinHandle<(Result<Slot, ProxyError>, Duration)> {
            let admission = Arc::clone(self);
            tokio::spawn(async move {
                let start = tokio::time::Instant::now();
                let result = admission.acquire(&any_request()).await;
                (result, start.elapsed())
            })
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_queue_that_drains_keeps_its_waiters_past_the_timeout_at_most_twice_it() {
        let (admission, held) = one_at_a_time();
        let first = admission.queue_one();
        tokio::task::yield_now().await;
        let second = admission.queue_one();
        let third = admission.queue_one();
        tokio::task::yield_now().await;
        assert_eq!(admission.waiting(), 3);
        // At 6 s the first is served: one left while the others waited, none joined.
        tokio::time::sleep(Duration::from_secs(6)).await;
        drop(held);
        let (served, waited) = first.await.unwrap();
        assert_eq!(waited, Duration::from_secs(6));
        // At 10 s the second has nobody ahead and the third one: both stay. At 15 s the
        // second is served.
        tokio::time::sleep(Duration::from_secs(9)).await;
        drop(served.unwrap());
        let (served, waited) = second.await.unwrap();
        assert_eq!(waited, Duration::from_secs(15));
        // Nothing more leaves: the third waits twice the timeout, no longer.
        let (result, waited) = third.await.unwrap();
        assert_eq!(result.map(|_| ()), Err(ProxyError::QueueTimeout));
        assert_eq!(waited, Duration::from_secs(20));
        drop(served);
    }

    #[tokio::test(start_paused = true)]
    async fn a_queue_that_stands_still_or_moves_too_slowly_sheds_at_the_timeout() {
        // Still: nothing leaves.
        let (admission, held) = one_at_a_time();
        let (result, waited) = admission.queue_one().await.unwrap();
        assert_eq!(result.map(|_| ()), Err(ProxyError::QueueTimeout));
        assert_eq!(waited, Duration::from_secs(10));
        drop(held);

        // Too slowly: one left while the last waited, and two more wait ahead of it.
        let (admission, held) = one_at_a_time();
        let first = admission.queue_one();
        tokio::task::yield_now().await;
        let ahead = [admission.queue_one(), admission.queue_one()];
        tokio::task::yield_now().await;
        let last = admission.queue_one();
        tokio::time::sleep(Duration::from_secs(5)).await;
        drop(held);
        let (served, _) = first.await.unwrap();
        let (result, waited) = last.await.unwrap();
        assert_eq!(result.map(|_| ()), Err(ProxyError::QueueTimeout));
        assert_eq!(waited, Duration::from_secs(10));
        // The two ahead stay, and are served as room opens.
        drop(served);
        for waiter in ahead {
            drop(waiter.await.unwrap().0.unwrap());
        }
    }

    #[test]
    fn a_request_that_came_first_goes_ahead_of_those_that_came_later() {
        let mut q = queue(&[(1000, 0), (1000, 0), (1000, 0)]);
        for (w, came) in q.iter_mut().zip([10, 30, 40]) {
            w.came = came;
        }
        // It came at 20: behind the one of 10, ahead of those of 30 and 40, at any cost.
        assert_eq!(join_position(&q, 1000, false, 20), 1);
        assert_eq!(join_position(&q, 0, false, 20), 1);
        assert_eq!(join_position(&q, 1000, false, 50), 3);
        // Never ahead of a retry, however late it came.
        q[0].retry = true;
        q[0].came = 100;
        assert_eq!(join_position(&q, 1000, false, 5), 1);
    }

    #[test]
    fn passes_are_bounded_and_unknown_costs_pass_nobody() {
        assert_eq!(
            join_position(&queue(&[(1000, MAX_PASSES)]), 10, false, 1),
            1
        );
        assert_eq!(
            join_position(&queue(&[(1000, MAX_PASSES - 1)]), 10, false, 1),
            0
        );
        assert_eq!(join_position(&queue(&[(1000, 0)]), 0, false, 1), 1);
    }
}
