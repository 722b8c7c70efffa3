//! Late binding: a request waits in drover's queue while every endpoint is at its
//! concurrency limit, and is bound to an endpoint only when one has room.
//!
//! Queueing here rather than inside a busy backend is what keeps cheap requests from
//! waiting behind expensive ones in a single-threaded server: a queued request goes to
//! whichever endpoint frees up first, not to the one it happened to be sent to.
//!
//! The queue is ordered by deadline, earliest first: a request's deadline is the moment
//! it joined plus `SLOWDOWN` times its expected cost (the route's learned latency). Among
//! requests of one route that is first come, first served. Across routes, a cheap
//! request passes an expensive one that has waited less than its slack, so a burst of
//! expensive requests no longer holds every cheap request behind it, while the expensive
//! request's extra wait is bounded by its slack (it never starves). Queueing theory says
//! why this pays: giving short jobs priority cuts their wait by about 1 / (1 - load of
//! the long ones) and adds to the long ones' wait only about 1 / (1 - load of the short
//! ones), small when short jobs are a small share of the work, as they are here.
//! Each release hands slots to the waiters at the head, in order, for as long as there
//! is room. (A wake-up primitive would let a waiter that lost a race drop to the back,
//! which is what makes tails long.)

use crate::error::ProxyError;
use drover_balance::{clock, Balancer, Endpoint, Nanos, NoPick, Pick, PickContext};
use drover_registry::Pool;
use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::oneshot;

/// How many times its own expected cost a queued request may wait before requests that
/// joined after it stop passing it. 4: a 10 ms request lets cheaper work ahead for at most
/// 40 ms, a 0.2 ms one for 0.8 ms. Lower tends to FIFO (longer waits for cheap requests
/// behind expensive bursts); higher to strict shortest-first (expensive tails grow).
pub const SLOWDOWN: Nanos = 4;

pub struct Admission {
    balancer: Arc<dyn Balancer>,
    pool: Arc<Pool>,
    queue: Mutex<BinaryHeap<Waiter>>,
    /// Arrival order, to break ties between equal deadlines first come, first served.
    next_seq: AtomicU64,
    /// The queue's length, readable without the lock on every release.
    waiting: AtomicUsize,
    max: usize,
    timeout: Duration,
}

/// A queued request: what its pick needs, owned, and where to send the slot.
struct Waiter {
    deadline: Nanos,
    seq: u64,
    cost: Nanos,
    hash_key: Option<Vec<u8>>,
    sticky: Option<String>,
    exclude: Vec<Arc<Endpoint>>,
    reply: oneshot::Sender<Result<Slot, ProxyError>>,
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
            queue: Mutex::new(BinaryHeap::new()),
            next_seq: AtomicU64::new(0),
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
            queue.push(Waiter {
                deadline: ctx.now.saturating_add(ctx.cost.saturating_mul(SLOWDOWN)),
                seq: self.next_seq.fetch_add(1, Relaxed),
                cost: ctx.cost,
                hash_key: ctx.hash_key.map(<[u8]>::to_vec),
                sticky: ctx.sticky.map(str::to_owned),
                exclude: ctx.exclude.to_vec(),
                reply,
            });
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

    /// Hands free slots to the waiters with the earliest deadlines, in order, until the
    /// first of them cannot be placed.
    fn dispatch(self: &Arc<Self>) {
        let mut queue = self.lock();
        if queue.is_empty() {
            return;
        }
        let set = self.pool.snapshot();
        while let Some(head) = queue.peek() {
            if head.reply.is_closed() {
                // Gave up (timeout or client gone).
                queue.pop();
                continue;
            }
            let ctx = PickContext {
                now: clock::now(),
                cost: head.cost,
                hash_key: head.hash_key.as_deref(),
                sticky: head.sticky.as_deref(),
                exclude: &head.exclude,
            };
            let result = match self.balancer.pick(&set, &ctx) {
                Ok(pick) => Ok(self.slot(pick)),
                Err(NoPick::NoneAvailable) => Err(ProxyError::NoEndpoint),
                Err(NoPick::AllBusy) => break,
            };
            let Some(waiter) = queue.pop() else {
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

    fn lock(&self) -> std::sync::MutexGuard<'_, BinaryHeap<Waiter>> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn slot(self: &Arc<Self>, pick: Pick) -> Slot {
        Slot {
            pick: Some(pick),
            admission: Arc::clone(self),
        }
    }
}

// `BinaryHeap` pops its greatest element: the greatest waiter is the one with the
// earliest deadline, and of equal deadlines the one that came first.
impl Ord for Waiter {
    fn cmp(&self, other: &Self) -> Ordering {
        (other.deadline, other.seq).cmp(&(self.deadline, self.seq))
    }
}

impl PartialOrd for Waiter {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Waiter {
    fn eq(&self, other: &Self) -> bool {
        self.seq == other.seq
    }
}

impl Eq for Waiter {}

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
}

impl Drop for Slot {
    fn drop(&mut self) {
        if self.pick.take().is_some() && self.admission.waiting() > 0 {
            self.admission.dispatch();
        }
    }
}
