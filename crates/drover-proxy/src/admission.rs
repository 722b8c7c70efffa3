//! Late binding: a request waits in drover's queue while every endpoint is at its
//! concurrency limit, and is bound to an endpoint only when one has room.
//!
//! Queueing here rather than inside a busy backend is what keeps cheap requests from
//! waiting behind expensive ones in a single-threaded server: a queued request goes to
//! whichever endpoint frees up first, not to the one it happened to be sent to.
//!
//! The queue is first come, first served, with one exception: a request joins ahead of
//! queued requests whose learned cost is more than `PASS_RATIO` times its own, passing
//! each of them at most `MAX_PASSES` times. So a cheap request that arrives while two
//! expensive ones wait for a busy endpoint no longer waits for both to be served, and an
//! expensive one waits for a few cheap ones more at most, and never starves.
//!
//! Why bounded passes rather than a deadline per request (measured: "Queue order" in
//! bench/README.md): in bursts that drain, priority to short jobs cuts their wait a lot
//! and adds little to the long ones'; but when the queue stands (overload, or a
//! closed-loop load that refills it as fast as it empties), cheap requests keep
//! passing, expensive ones pile up behind each other, and the tail grows two- to
//! three-fold. A bound on passes keeps most of the first and none of the second.
//!
//! Each release hands slots to the waiters at the head, in order, for as long as there
//! is room. (A wake-up primitive would let a waiter that lost a race drop to the back,
//! which is what makes tails long.)

use crate::error::ProxyError;
use drover_balance::{clock, Balancer, Endpoint, Nanos, NoPick, Pick, PickContext};
use drover_registry::Pool;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::oneshot;

/// A request passes queued ones that cost more than this many times what it costs.
pub const PASS_RATIO: Nanos = 4;

/// How many later requests may pass a queued one.
pub const MAX_PASSES: u32 = 8;

/// How many waiters pinned to a full endpoint one dispatch looks past, so a long queue
/// of pinned requests (every request carries a sticky cookie) costs a bounded scan.
const MAX_PINNED_SKIPS: usize = 32;

pub struct Admission {
    balancer: Arc<dyn Balancer>,
    pool: Arc<Pool>,
    queue: Mutex<VecDeque<Waiter>>,
    /// The queue's length, readable without the lock on every release.
    waiting: AtomicUsize,
    max: usize,
    timeout: Duration,
}

/// A queued request: what its pick needs, owned, and where to send the slot.
struct Waiter {
    cost: Nanos,
    /// Later requests that joined ahead of this one.
    passed: u32,
    hash_key: Option<Vec<u8>>,
    sticky: Option<String>,
    exclude: Vec<Arc<Endpoint>>,
    reply: oneshot::Sender<Result<Slot, ProxyError>>,
}

impl Waiter {
    /// Whether the request may only go to one endpoint while that one is up.
    fn is_pinned(&self) -> bool {
        self.hash_key.is_some() || self.sticky.is_some()
    }
}

impl Admission {
    pub fn new(
        balancer: Arc<dyn Balancer>,
        pool: Arc<Pool>,
        max: usize,
        timeout: Duration,
    ) -> Self {
        Admission {
            balancer,
            pool,
            queue: Mutex::new(VecDeque::new()),
            waiting: AtomicUsize::new(0),
            max,
            timeout,
        }
    }

    pub fn waiting(&self) -> usize {
        self.waiting.load(Relaxed)
    }

    /// Picks an endpoint, waiting in the queue while all are busy.
    pub async fn acquire(self: &Arc<Self>, ctx: &PickContext<'_>) -> Result<Slot, ProxyError> {
        // While others wait, a newcomer queues behind them instead of taking the slot
        // that is about to be handed to the first of them.
        if self.waiting() == 0 {
            let set = self.pool.snapshot();
            match self.balancer.pick(&set, ctx) {
                Ok(pick) => return Ok(self.slot(pick)),
                Err(NoPick::NoneAvailable) => return Err(ProxyError::NoEndpoint),
                Err(NoPick::AllBusy) => {}
            }
        }
        let (reply, mut answer) = oneshot::channel();
        {
            let mut queue = self.lock();
            if queue.len() >= self.max {
                return Err(ProxyError::QueueFull);
            }
            let at = join_position(&queue, ctx.cost);
            for ahead in queue.range_mut(at..) {
                ahead.passed += 1;
            }
            queue.insert(
                at,
                Waiter {
                    cost: ctx.cost,
                    passed: 0,
                    hash_key: ctx.hash_key.map(<[u8]>::to_vec),
                    sticky: ctx.sticky.map(str::to_owned),
                    exclude: ctx.exclude.to_vec(),
                    reply,
                },
            );
            self.waiting.store(queue.len(), Relaxed);
        }
        // A slot may have freed between the pick above and joining the queue.
        self.dispatch();
        match tokio::time::timeout(self.timeout, &mut answer).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(ProxyError::QueueTimeout),
            Err(_) => {
                // A slot sent just as the timeout fired is still ours to use.
                answer.close();
                answer.try_recv().unwrap_or(Err(ProxyError::QueueTimeout))
            }
        }
    }

    /// Hands free slots to the waiters at the head of the queue, in order, until the
    /// head cannot be placed. A waiter pinned to one endpoint (sticky, hash) that is
    /// still full keeps its place without holding back the waiters behind it, which may
    /// go anywhere: it waits for its endpoint, they need not.
    fn dispatch(self: &Arc<Self>) {
        let mut queue = self.lock();
        if queue.is_empty() {
            return;
        }
        let set = self.pool.snapshot();
        let mut at = 0;
        while let Some(waiter) = queue.get(at) {
            if waiter.reply.is_closed() {
                // Gave up (timeout or client gone).
                queue.remove(at);
                continue;
            }
            let ctx = PickContext {
                now: clock::now(),
                cost: waiter.cost,
                hash_key: waiter.hash_key.as_deref(),
                sticky: waiter.sticky.as_deref(),
                exclude: &waiter.exclude,
            };
            let result = match self.balancer.pick(&set, &ctx) {
                Ok(pick) => Ok(self.slot(pick)),
                Err(NoPick::NoneAvailable) => Err(ProxyError::NoEndpoint),
                Err(NoPick::AllBusy) if waiter.is_pinned() && at < MAX_PINNED_SKIPS => {
                    at += 1;
                    continue;
                }
                Err(NoPick::AllBusy) => break,
            };
            let Some(waiter) = queue.remove(at) else {
                break;
            };
            if let Err(Ok(mut unsent)) = waiter.reply.send(result) {
                // The waiter left after all: release the slot without re-entering
                // dispatch (we hold the queue), and offer it to the next waiter.
                drop(unsent.pick.take());
            }
        }
        self.waiting.store(queue.len(), Relaxed);
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

/// Where a request of `cost` joins: behind the last waiter it may not pass. It passes
/// waiters at the tail that cost more than `PASS_RATIO` times as much and have been
/// passed fewer than `MAX_PASSES` times. An unknown cost (0) passes nobody.
fn join_position(queue: &VecDeque<Waiter>, cost: Nanos) -> usize {
    let mut at = queue.len();
    if cost == 0 {
        return at;
    }
    while at > 0 {
        let ahead = &queue[at - 1];
        if ahead.passed >= MAX_PASSES || ahead.cost <= cost.saturating_mul(PASS_RATIO) {
            break;
        }
        at -= 1;
    }
    at
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
            cost,
            passed,
            hash_key: None,
            sticky: None,
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
            join_position(&queue(&[(10, 0), (1000, 0), (1000, 0)]), 10),
            1
        );
        // A newcomer of similar cost (within PASS_RATIO) keeps its place in line.
        assert_eq!(join_position(&queue(&[(1000, 0)]), 400), 1);
        assert_eq!(join_position(&queue(&[(1000, 0)]), 249), 0);
        // An expensive one in the middle shields the ones ahead of it only by its place:
        // the newcomer stops at the first waiter it may not pass.
        assert_eq!(
            join_position(&queue(&[(1000, 0), (10, 0), (1000, 0)]), 10),
            2
        );
        assert_eq!(join_position(&VecDeque::new(), 10), 0);
    }

    #[test]
    fn passes_are_bounded_and_unknown_costs_pass_nobody() {
        assert_eq!(join_position(&queue(&[(1000, MAX_PASSES)]), 10), 1);
        assert_eq!(join_position(&queue(&[(1000, MAX_PASSES - 1)]), 10), 0);
        assert_eq!(join_position(&queue(&[(1000, 0)]), 0), 1);
    }
}
