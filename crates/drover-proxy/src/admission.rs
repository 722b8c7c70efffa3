//! Late binding: a request waits in drover's queue while every endpoint is at its
//! concurrency limit, and is bound to an endpoint only when one has room.
//!
//! Queueing here rather than inside a busy backend is what keeps cheap requests from
//! waiting behind expensive ones in a single-threaded server: the request goes to
//! whichever endpoint frees up first, not to the one it happened to be sent to.

use crate::error::ProxyError;
use drover_balance::{Balancer, EndpointSet, NoPick, Pick, PickContext};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

pub struct Admission {
    waiting: AtomicUsize,
    freed: Notify,
    max: usize,
    timeout: Duration,
}

impl Admission {
    pub fn new(max: usize, timeout: Duration) -> Self {
        Admission {
            waiting: AtomicUsize::new(0),
            freed: Notify::new(),
            max,
            timeout,
        }
    }

    pub fn waiting(&self) -> usize {
        self.waiting.load(Relaxed)
    }

    /// Picks an endpoint, waiting in the queue while all are busy.
    pub async fn acquire(
        self: &Arc<Self>,
        balancer: &dyn Balancer,
        set: &EndpointSet,
        ctx: &PickContext<'_>,
    ) -> Result<Slot, ProxyError> {
        // While others wait, a newcomer queues behind them instead of taking the slot
        // that was freed for the first of them.
        if self.waiting() == 0 {
            match balancer.pick(set, ctx) {
                Ok(pick) => return Ok(self.slot(pick)),
                Err(NoPick::NoneAvailable) => return Err(ProxyError::NoEndpoint),
                Err(NoPick::AllBusy) => {}
            }
        }
        if self.waiting.fetch_add(1, Relaxed) >= self.max {
            self.waiting.fetch_sub(1, Relaxed);
            return Err(ProxyError::QueueFull);
        }
        let result = self.wait(balancer, set, ctx).await;
        self.waiting.fetch_sub(1, Relaxed);
        result
    }

    async fn wait(
        self: &Arc<Self>,
        balancer: &dyn Balancer,
        set: &EndpointSet,
        ctx: &PickContext<'_>,
    ) -> Result<Slot, ProxyError> {
        let deadline = tokio::time::Instant::now() + self.timeout;
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            // Register before trying, so a slot freed between the try and the wait is
            // not missed.
            freed.as_mut().enable();
            let ctx = PickContext {
                now: drover_balance::clock::now(),
                ..*ctx
            };
            match balancer.pick(set, &ctx) {
                Ok(pick) => {
                    // One release can make room for several requests (an expensive one
                    // leaving makes room for many cheap ones): pass the wake-up on, and
                    // the queue drains as far as there is room.
                    if self.waiting() > 1 {
                        self.freed.notify_one();
                    }
                    return Ok(self.slot(pick));
                }
                Err(NoPick::NoneAvailable) => return Err(ProxyError::NoEndpoint),
                Err(NoPick::AllBusy) => {}
            }
            if tokio::time::timeout_at(deadline, freed).await.is_err() {
                return Err(ProxyError::QueueTimeout);
            }
        }
    }

    fn slot(self: &Arc<Self>, pick: Pick) -> Slot {
        Slot {
            pick: Some(pick),
            admission: Arc::clone(self),
        }
    }
}

/// A `Pick` that wakes the next queued request when it is released.
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
        // Release first, then wake: the woken request must find the slot free.
        drop(self.pick.take());
        if self.admission.waiting.load(Relaxed) > 0 {
            self.admission.freed.notify_one();
        }
    }
}
