//! Late binding: a request waits in drover's queue while every endpoint is at its
//! concurrency limit, and is bound to an endpoint only when one has room.
//!
//! Queueing here rather than inside a busy backend is what keeps cheap requests from
//! waiting behind expensive ones in a single-threaded server: a queued request goes to
//! whichever endpoint frees up first, not to the one it happened to be sent to.
//!
//! The queue is strictly first come, first served: each release hands slots to the
//! waiters at the head, in order, for as long as there is room. (A wake-up primitive
//! would let a waiter that lost a race drop to the back, which is what makes tails long.)

use crate::error::ProxyError;
use drover_balance::{clock, Balancer, Endpoint, Nanos, NoPick, Pick, PickContext};
use drover_registry::Pool;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::oneshot;

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
            queue.push_back(Waiter {
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

    /// Hands free slots to the waiters at the head of the queue, in order, until the
    /// head cannot be placed.
    fn dispatch(self: &Arc<Self>) {
        let mut queue = self.lock();
        if queue.is_empty() {
            return;
        }
        let set = self.pool.snapshot();
        while let Some(head) = queue.front() {
            if head.reply.is_closed() {
                // Gave up (timeout or client gone).
                queue.pop_front();
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
            let Some(waiter) = queue.pop_front() else {
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
