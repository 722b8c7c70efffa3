//! Phase 4, **account**: what a response head, or a failed try, tells drover about
//! the endpoint and the route: latency and load for the balancer, the route's cost,
//! passive health (ejection), the endpoint's failure counts.

use crate::admission::Slot;
use crate::error::ProxyError;
use crate::http1::request::RequestHead;
use crate::http1::response::ResponseHead;
use crate::options::Handoff;
use drover_balance::{clock, Endpoint, Nanos};
use drover_metrics::Cause;
use std::sync::Arc;
use tracing::{debug, warn};

use super::attempt::Attempt;
use super::exchange::Answered;
use super::Conn;

impl Conn {
    /// What a response head tells: the endpoint's latency and load, the request's cost,
    /// passive health. Returns the latency.
    pub(super) fn account_response(
        &mut self,
        head: &RequestHead,
        slot: &Slot,
        resp: &ResponseHead,
        answered: &mut Option<Answered>,
    ) -> Nanos {
        let shared = &self.thread.shared;
        let endpoint = slot.pick().endpoint();
        let now = clock::now();
        slot.observe(now);
        let latency = now.saturating_sub(slot.pick().started());
        endpoint.stats().record_response_head(resp.status, latency);
        *answered = Some(Answered {
            status: resp.status,
            head_at: now,
        });
        if slot.pick().was_alone() {
            shared.costs.observe(head.cost_key, latency);
        } else {
            shared.costs.observe_beside_others(head.cost_key, latency);
        }
        // Only where a worker could take the connection (not a Python app's, say).
        if shared.opts.handoff == Handoff::WhenEven && shared.pool.handoffs().any() {
            let cost = shared.costs.estimate(head.cost_key).unwrap_or(latency);
            shared.spread.observe(now, cost);
        }
        if let Some(load) = resp.load {
            endpoint.report_load(now, load);
        }
        if let Some(ejected) = shared.pool.on_response(endpoint, resp.status, now) {
            warn!(endpoint = %endpoint.addr(), status = resp.status, "ejected for {ejected:?} after repeated errors");
        }
        self.ubuf.drain(..resp.head_len);
        latency
    }

    /// The endpoint failed this request (`cause`): counted, and held against its
    /// passive health.
    pub(super) fn endpoint_failed(&self, endpoint: &Arc<Endpoint>, cause: Cause) {
        endpoint.stats().record_failure(cause);
        self.thread
            .shared
            .pool
            .on_request_failure(endpoint, clock::now());
    }

    /// Records a backend-side failure. A stale keep-alive connection closing is not the
    /// endpoint's fault, so it does not count against its health.
    pub(super) fn backend_failed(
        &self,
        endpoint: &Arc<Endpoint>,
        reused: bool,
        e: ProxyError,
        retry: bool,
    ) -> Attempt {
        debug!(endpoint = %endpoint.addr(), reused, retry, "{e}");
        if reused {
            endpoint.stats().record_failure(e.metric_cause());
        } else {
            self.endpoint_failed(endpoint, e.metric_cause());
        }
        if retry {
            Attempt::Retry(e)
        } else {
            Attempt::Fail(e)
        }
    }
}
