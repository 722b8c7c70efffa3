//! Phase 4, **account**: what a response head, or a failed try, tells drover about
//! the endpoint and the route: latency and load for the balancer, the route's cost,
//! passive health (ejection), the endpoint's failure counts.

use crate::admission::Slot;
use crate::engine_io::{self, EngineIo};
use crate::error::ProxyError;
use crate::http1::request::RequestHead;
use crate::http1::response::ResponseHead;
use crate::options::Handoff;
use drover_balance::{clock, Endpoint, Nanos, WorkerLife};
use drover_metrics::Cause;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::{debug, warn};

/// How long a request a supervised worker dropped waits for the supervisor to say how
/// the worker ended: its socket closes as it exits, and the supervisor learns of the
/// exit a moment later (within a few milliseconds, more on a saturated machine). A
/// worker that still runs after this closed the connection itself.
const WORKER_END_WAIT: Duration = Duration::from_millis(250);
const WORKER_END_POLL: Duration = Duration::from_millis(1);
/// How long a request a hung worker dropped waits for the others it held to say when
/// they were sent (`after_drop`): the kill closes every connection to it at once, and
/// a request that hears late only fails where it could have gone again.
const HELD_SETTLE: Duration = Duration::from_millis(200);

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
        // A subscription that waited for news (`Pick::stop_pending`) cost its app
        // nothing all that time: learned as its route's cost, minutes of it would make
        // the app's costs look uneven, and connections would stay proxied for it.
        let waited = slot.pick().waited();
        match (waited, slot.pick().was_alone()) {
            (true, _) => {}
            (false, true) => shared.costs.observe(head.cost_key, latency),
            (false, false) => shared.costs.observe_beside_others(head.cost_key, latency),
        }
        // Only where a worker could take the connection (not a Python app's, say).
        if !waited && shared.opts.handoff == Handoff::WhenEven && shared.pool.handoffs().any() {
            let cost = shared.costs.estimate(head.cost_key).unwrap_or(latency);
            shared.spread.observe(now, head.cost_key, cost);
        }
        if let Some(load) = resp.load {
            endpoint.report_load(now, load);
        }
        if let Some(ejected) = shared.pool.on_response(endpoint, resp.status, now) {
            warn!(endpoint = %endpoint.addr(), status = resp.status, "ejected for {ejected:?} after repeated errors");
        }
        // A socket.io handshake's answer names the session, in the bytes that came with
        // its head (Node writes a small answer with its head): its requests follow it.
        if head.engine_io == Some(EngineIo::Handshake) && resp.status == 200 {
            let body = self.ubuf.get(resp.head_len..).unwrap_or_default();
            if let Some(sid) = engine_io::sid_in_handshake(body) {
                shared.sessions.pin(sid, endpoint.id(), now);
            }
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

    /// `endpoint` took an idempotent request and closed on it with no answer (dropped):
    /// `Ok` when it may go to another endpoint. Retries exist for workers that die
    /// under a request (`kill -9`, the OOM killer), but a request that itself ends a
    /// worker would end each one it was retried on: one GET with an uncaught exception
    /// took down all three workers of an app in 30 ms, where Node's cluster module
    /// loses one. So it fails when the supervised worker ended by an error of its own
    /// (see `drover_balance::worker_life`), and a second endpoint that drops it is its last:
    /// what two backends dropped in turn is more likely the request's doing than two
    /// kills. A kept-alive connection closing as the request crossed it is not counted
    /// (`Conn::attempt` sends it again on a new one).
    ///
    /// A worker drover killed as hung dropped all it held: the request it held longest
    /// (sent first, at `sent`) most likely hung it, and fails; the others waited behind
    /// it and go again. Each waits `HELD_SETTLE` for the others to say when they were
    /// sent (`Endpoint::held_when_hung`): the kill closes their connections at once.
    pub(super) async fn after_drop(
        &mut self,
        endpoint: &Endpoint,
        sent: Nanos,
        reused: bool,
    ) -> Result<(), ProxyError> {
        if worker_ended_by_itself(endpoint).await {
            debug!(endpoint = %endpoint.addr(), "the worker ended with the request in it");
            return Err(ProxyError::BackendCrashed);
        }
        if endpoint.worker_life() == Some(WorkerLife::Hung) {
            tokio::time::sleep(HELD_SETTLE).await;
            if endpoint.hung_on(sent) {
                debug!(endpoint = %endpoint.addr(), "the worker hung on the request");
                return Err(ProxyError::BackendHung);
            }
        }
        if reused {
            return Ok(());
        }
        self.count_drop()
    }

    /// Counts a drop of the request under way (see `after_drop`): `Err` when an
    /// endpoint dropped it before, so this endpoint is its last.
    pub(super) fn count_drop(&mut self) -> Result<(), ProxyError> {
        match std::mem::replace(&mut self.dropped, true) {
            true => Err(ProxyError::BackendClosed),
            false => Ok(()),
        }
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

/// Whether the supervised worker behind `endpoint` ended by an error of its own, waiting up to
/// `WORKER_END_WAIT` for its supervisor's word; false for an endpoint nobody supervises.
async fn worker_ended_by_itself(endpoint: &Endpoint) -> bool {
    let deadline = Instant::now() + WORKER_END_WAIT;
    loop {
        match endpoint.worker_life() {
            None | Some(WorkerLife::Ended | WorkerLife::Hung) => return false,
            Some(WorkerLife::Crashed) => return true,
            Some(WorkerLife::Running) if Instant::now() >= deadline => return false,
            Some(WorkerLife::Running) => tokio::time::sleep(WORKER_END_POLL).await,
        }
    }
}
