//! One client connection: read a request, bind it to an endpoint, relay the exchange,
//! repeat while keep-alive lasts (`Conn::run`). A request's phases, in order:
//!
//! 1. **Read** (`read_head`): the head, parsed and checked by `http1::request`, which
//!    also writes the head the backend will see (`http1::forward`) and reads the
//!    balancing keys and cost class (`http1::keys`). Only this phase and the wire
//!    format of phase 3 know the protocol.
//! 2. **Decide** (`exchange_timed`): read the body up to the buffer before binding,
//!    then ask `Admission` for an endpoint (strategy pick, limits, the queue), and
//!    retry on another endpoint while it is safe to.
//! 3. **Forward** (`attempt`): `upstream` (an idle connection or a new one),
//!    `send_request`, `final_response_head` (1xx passed on), `relay_response`.
//! 4. **Account** (`account_response`, `endpoint_failed`, `exchange`): latency and
//!    load for the balancer, the route's cost, passive health, the metrics.
//!
//! Between two requests of a keep-alive connection it may leave for a worker
//! (`handoff`).

use crate::admission::Slot;
use crate::body::{
    self, BodyError, BodyPace, Ends, Framer, Relayed, REQUEST_BUFFER, RESPONSE_BUFFER,
};
use crate::error::ProxyError;
use crate::handoff;
use crate::http1::error_page;
use crate::http1::forward::ClientInfo;
use crate::http1::request::{self, BadRequest, Parsed, RequestHead};
use crate::http1::response::{self, Exchange, ResponseHead};
use crate::http1::BodyKind;
use crate::options::{Handoff, ProxyOptions};
use crate::state::{ClientConnection, ThreadCell, ThreadState};
use crate::upstream::{self};
use drover_balance::{clock, Endpoint, Nanos, PickContext};
use drover_metrics::Cause;
use drover_registry::{is_local_shortage, WarnLimit};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::{timeout_at, Instant};
use tracing::{debug, warn};

/// After answering a request whose body was not read in full, how long drover keeps
/// reading (and discarding) what the client still sends before it closes. Closing with
/// unread bytes makes the kernel reset the connection, and a reset can destroy the
/// answer before the client reads it (RFC 9112 §9.6; nginx's `lingering_close`).
const LINGER: Duration = Duration::from_secs(5);

/// Before retrying a request that met drover's own shortage (descriptors, memory).
const LOCAL_SHORTAGE_PAUSE: Duration = Duration::from_millis(10);

/// Warnings about requests that failed (every thread of every balancer shares it).
static FAILURE_WARNINGS: WarnLimit = WarnLimit::new(Duration::from_secs(1));

/// Warnings about connects that failed (the endpoint's fault, as far as drover can tell).
static CONNECT_FAILURES: WarnLimit = WarnLimit::new(Duration::from_secs(1));

/// Warnings about drover's own shortages on connect, shared by every connection.
static CONNECT_SHORTAGE: WarnLimit = WarnLimit::new(Duration::from_secs(1));

struct ActiveGuard(Arc<AtomicUsize>);

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
    }
}

pub(crate) async fn serve(
    client: TcpStream,
    peer: std::net::SocketAddr,
    cell: Arc<ThreadCell>,
    _counted: ClientConnection,
) {
    let thread = cell.load_full();
    thread.shared.active.fetch_add(1, Relaxed);
    let _active = ActiveGuard(Arc::clone(&thread.shared.active));
    let mut conn = Conn {
        shutdown: thread.shared.shutdown.clone(),
        info: ClientInfo::new(peer, "http"),
        client,
        cell,
        thread,
        cbuf: Vec::new(),
        ubuf: Vec::new(),
        out: Vec::new(),
        reqbody: Vec::new(),
        requests: 0,
        hand_over_at: handoff::HAND_OVER_AFTER_REQUESTS,
    };
    loop {
        match conn.run().await {
            Ended::Closed => return,
            Ended::HandOver => {
                let shared = Arc::clone(&conn.thread.shared);
                match handoff::give(&shared, conn.client) {
                    Ok(()) => return,
                    Err(back) => {
                        // Every worker is behind: serve it here a while longer.
                        conn.client = back;
                        conn.hand_over_at = conn.requests + handoff::RETRY_AFTER_REQUESTS;
                    }
                }
            }
        }
    }
}

/// Why `Conn::run` returned.
enum Ended {
    /// The connection is done (closed, failed, or drover is stopping).
    Closed,
    /// Between two requests, with nothing of the next one read: a worker may take it.
    HandOver,
}

/// A backend's response head: its status and when it came.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Answered {
    status: u16,
    head_at: Nanos,
}

/// How one attempt on one endpoint ended.
enum Attempt {
    /// The exchange completed; whether the client connection may be kept.
    Done(bool),
    /// Failed before the backend could have acted on it: try another endpoint.
    Retry(ProxyError),
    /// Failed in a way that must not be retried; the client gets this error.
    Fail(ProxyError),
    /// Failed after the response started, or on the client's side: close quietly.
    Abort,
}

struct Conn {
    client: TcpStream,
    info: ClientInfo,
    /// This serving thread's state over the settings in force, which a reload replaces.
    cell: Arc<ThreadCell>,
    /// The worker this connection's current request uses.
    thread: Arc<ThreadState>,
    shutdown: watch::Receiver<bool>,
    /// Bytes from the client not yet used (a partial head, body, pipelined requests).
    cbuf: Vec<u8>,
    /// Bytes from the backend not yet used.
    ubuf: Vec<u8>,
    /// The next head to write: to the backend, then reused for the client.
    out: Vec<u8>,
    /// The request body read before an endpoint was picked (up to `REQUEST_BUFFER`).
    reqbody: Vec<u8>,
    /// Requests served on this connection.
    requests: u32,
    /// From this many requests on, it may be handed to a worker (`handoff`).
    hand_over_at: u32,
}

impl Conn {
    fn opts(&self) -> &ProxyOptions {
        &self.thread.shared.opts
    }

    async fn run(&mut self) -> Ended {
        loop {
            let head = match self.read_head(self.requests == 0).await {
                Ok(Some(head)) => head,
                Ok(None) => return Ended::Closed,
                Err(bad) => {
                    debug!(client = %self.info.ip, status = bad.status, reason = bad.reason, "refused request");
                    self.thread.shared.stats.record_refusal(bad.status);
                    self.send_error(bad.status, "bad-request", bad.reason, true)
                        .await;
                    return Ended::Closed;
                }
            };
            self.cbuf.drain(..head.head_len);
            // New settings (a reload) apply from the next request on.
            if !Arc::ptr_eq(&self.cell.load(), &self.thread) {
                self.thread = self.cell.load_full();
            }
            // Boxed: an exchange's state is most of a connection's, and an idle keep-alive
            // connection should not carry it (the connection's future: 952 bytes instead
            // of 2,064; bench/idle.sh measures the whole idle connection).
            if !Box::pin(self.exchange(&head)).await || *self.shutdown.borrow() {
                return Ended::Closed;
            }
            self.requests = self.requests.saturating_add(1);
            if self.cbuf.is_empty() {
                // An idle keep-alive connection holds no buffers.
                self.cbuf = Vec::new();
                self.ubuf = Vec::new();
                self.out = Vec::new();
                self.reqbody = Vec::new();
                if self.requests >= self.hand_over_at
                    && handoff::between_requests(&self.thread.shared)
                {
                    return Ended::HandOver;
                }
            }
        }
    }

    /// Reads the next request head. `Ok(None)`: the client left, idled out, or drover
    /// is shutting down between requests.
    async fn read_head(&mut self, first: bool) -> Result<Option<RequestHead>, BadRequest> {
        let timeouts = self.opts().timeouts;
        if self.cbuf.is_empty() {
            if *self.shutdown.borrow() {
                return Ok(None);
            }
            let wait = if first {
                timeouts.header_read
            } else {
                timeouts.idle
            };
            // Wait for bytes before allocating a buffer for them: an idle keep-alive
            // connection then holds no buffer at all.
            loop {
                let ready = tokio::select! {
                    r = tokio::time::timeout(wait, self.client.readable()) => r,
                    _ = self.shutdown.changed() => return Ok(None),
                };
                if !matches!(ready, Ok(Ok(()))) {
                    return Ok(None);
                }
                self.cbuf.reserve(4096);
                match self.client.try_read_buf(&mut self.cbuf) {
                    Ok(n) if n > 0 => break,
                    // Readiness left over from the last read: nothing came after all, so
                    // give the buffer back before waiting again (this kept 4 KiB on every
                    // idle connection).
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        self.cbuf = Vec::new();
                    }
                    _ => return Ok(None),
                }
            }
        }
        let deadline = tokio::time::Instant::now() + timeouts.header_read;
        let shared = &self.thread.shared;
        loop {
            match request::parse(
                &self.cbuf,
                &shared.opts.limits,
                &self.info,
                &shared.keys,
                &mut self.out,
            )? {
                Parsed::Complete(head) => return Ok(Some(head)),
                Parsed::Partial => {}
            }
            self.cbuf.reserve(4096);
            match tokio::time::timeout_at(deadline, self.client.read_buf(&mut self.cbuf)).await {
                Err(_) => {
                    return Err(BadRequest {
                        status: 408,
                        reason: "request head not received within the header read timeout",
                    })
                }
                Ok(Ok(n)) if n > 0 => {}
                Ok(_) => return Ok(None),
            }
        }
    }

    /// Proxies one request; returns whether the client connection may be kept.
    async fn exchange(&mut self, head: &RequestHead) -> bool {
        let arrived = clock::now();
        let mut answered = None;
        let keep = self.exchange_timed(head, arrived, &mut answered).await;
        // A response head came from a backend: count the request as answered with its
        // status, for as long as it took to pass on (an upgrade: until its 101).
        if let Some(Answered { status, head_at }) = answered {
            let end = if status == 101 { head_at } else { clock::now() };
            self.thread
                .shared
                .stats
                .record_response(status, end.saturating_sub(arrived));
        }
        keep
    }

    /// `exchange`, with the first response head's status and time left in `answered`
    /// (drover's own answers are counted where they are made).
    async fn exchange_timed(
        &mut self,
        head: &RequestHead,
        arrived: Nanos,
        answered: &mut Option<Answered>,
    ) -> bool {
        let client_timeout = self.opts().timeouts.client;
        if head.expect_continue && head.body.is_some() {
            // Answer 100 ourselves: the body is streamed to whichever endpoint is picked,
            // so the client must not wait for a particular backend's go-ahead.
            let go_ahead = b"HTTP/1.1 100 Continue\r\n\r\n";
            if body::write_all(&mut self.client, go_ahead, client_timeout)
                .await
                .is_err()
            {
                return false;
            }
        }
        // Read the body (up to the buffer) before binding: a client that sends it slowly
        // then holds no backend connection and no endpoint's capacity while it does.
        let mut framer = Framer::new(head.body.unwrap_or(BodyKind::None), false);
        self.reqbody.clear();
        // Only a request with a body keeps a pace: the others read no clock for it.
        let mut pace = None;
        if head.body.is_some() {
            let timeouts = self.opts().timeouts;
            let pace = pace.insert(BodyPace::start(timeouts.body, timeouts.body_min_rate));
            let read = body::prefetch(
                &mut framer,
                &mut self.client,
                &mut self.cbuf,
                &mut self.reqbody,
                REQUEST_BUFFER,
                client_timeout,
                pace,
            )
            .await;
            if let Err(e) = read {
                self.refuse_body(e).await;
                return false;
            }
            // Queued for an endpoint and connecting is drover's time, not the client's.
            pace.pause();
        }
        let shared = Arc::clone(&self.thread.shared);
        let cost = shared.costs.estimate(head.cost_key).unwrap_or(0);
        let mut tried: Vec<Arc<Endpoint>> = Vec::new();
        let mut attempts = 0;
        let mut last_failure = None;
        // When drover first ran short of descriptors for this request (see below).
        let mut short_since = None;
        let failure = loop {
            // A first try without a body asks as the request arrives: one clock read
            // fewer per request. (With a body, reading it was the client's time, not
            // the queue's.)
            let asked = if attempts == 0 && head.body.is_none() {
                arrived
            } else {
                clock::now()
            };
            let ctx = PickContext {
                now: asked,
                cost,
                hash_key: head.hash_key.as_deref(),
                sticky: head.sticky.as_deref(),
                exclude: &tried,
            };
            let slot = match shared.admission.acquire(&ctx).await {
                Ok(slot) => slot,
                // Every endpoint was tried: report the last real failure, not "none healthy".
                Err(e) => break last_failure.unwrap_or(e),
            };
            let endpoint = Arc::clone(slot.pick().endpoint());
            let waited = slot.pick().started().saturating_sub(asked);
            shared.stats.record_queue_wait(waited);
            endpoint.stats().record_queue_wait(waited);
            match self
                .attempt(head, &slot, &mut framer, pace.as_mut(), answered)
                .await
            {
                Attempt::Done(keep) => {
                    // The backend is done: free its slot before the client takes the rest.
                    drop(slot);
                    let tail = std::mem::take(&mut self.out);
                    let sent = body::write_all(&mut self.client, &tail, client_timeout).await;
                    self.out = tail;
                    self.out.clear();
                    if sent.is_err() {
                        return false;
                    }
                    if !framer.is_done() {
                        // Answered before the request body ended (an early 413, say).
                        self.linger().await;
                        return false;
                    }
                    return keep && head.keep_alive;
                }
                Attempt::Abort => return false,
                Attempt::Fail(e) => break e,
                Attempt::Retry(ProxyError::LocalResources) => {
                    // drover's own shortage, not the endpoint's, and not the request's:
                    // other exchanges give descriptors back every moment. So it spends
                    // no retry and the endpoint stays a candidate; the request tries
                    // again after a pause, for as long as a connect may take. (Two
                    // retries 10 ms apart answered hundreds of requests with 503 under a
                    // burst of new connections at 1.5 x capacity.)
                    let now = clock::now();
                    let since = *short_since.get_or_insert(now);
                    if now.saturating_sub(since) >= clock::nanos(shared.opts.timeouts.connect) {
                        break ProxyError::LocalResources;
                    }
                    if since == now {
                        shared
                            .stats
                            .record_retry(ProxyError::LocalResources.metric_cause());
                    }
                    drop(slot);
                    tokio::time::sleep(LOCAL_SHORTAGE_PAUSE).await;
                }
                Attempt::Retry(e) => {
                    attempts += 1;
                    if attempts > shared.opts.retries {
                        break e;
                    }
                    shared.stats.record_retry(e.metric_cause());
                    last_failure = Some(e);
                    tried.push(endpoint);
                }
            }
        };
        // Past capacity every request may fail alike: one line a second says so, with
        // the count of the ones it stands for, instead of one line per request.
        if let Some(held_back) = FAILURE_WARNINGS.check_now() {
            warn!(balancer = %shared.opts.name, cause = failure.cause(), held_back, "{failure}");
        }
        shared.stats.record_error(
            failure.metric_cause(),
            failure.status(),
            clock::now().saturating_sub(arrived),
        );
        // A request body not read in full leaves the connection unusable for the next one.
        let close = !framer.is_done() || !head.keep_alive;
        error_page::write_error(
            &mut self.out,
            failure.status(),
            failure.cause(),
            &failure.to_string(),
            close,
            failure.retry_after(),
        );
        self.send_out(close).await;
        if !framer.is_done() {
            self.linger().await;
        }
        !close
    }

    /// The client's request body could not be read: answer what can be answered.
    async fn refuse_body(&mut self, e: BodyError) {
        match e {
            BodyError::Framing(e) => {
                debug!(client = %self.info.ip, "{e}");
                self.thread.shared.stats.record_refusal(400);
                self.send_error(400, "bad-request", "invalid chunked request body", true)
                    .await;
            }
            BodyError::Timeout => {
                debug!(client = %self.info.ip, "request body stalled");
                self.thread.shared.stats.record_refusal(408);
                self.send_error(
                    408,
                    "client-timeout",
                    "request body not received within the client timeout",
                    true,
                )
                .await;
            }
            BodyError::TooSlow => {
                debug!(client = %self.info.ip, "request body below the minimum rate");
                self.thread.shared.stats.record_refusal(408);
                self.send_error(
                    408,
                    "body-too-slow",
                    "request body arrived slower than the minimum body rate",
                    true,
                )
                .await;
            }
            BodyError::Read | BodyError::Write | BodyError::Stalled => {}
        }
    }

    /// One try on the endpoint `slot` holds, in its four steps: a connection to it, the
    /// request sent, the final response head read (and accounted for), the response
    /// relayed. On `Done`, `out` holds what the client has not taken yet of the
    /// response; the caller sends it once the slot is released.
    async fn attempt(
        &mut self,
        head: &RequestHead,
        slot: &Slot,
        framer: &mut Framer,
        pace: Option<&mut BodyPace>,
        answered: &mut Option<Answered>,
    ) -> Attempt {
        let endpoint = slot.pick().endpoint();
        let mut pace = pace;
        let mut fresh = false;
        let (up, resp, request_sent) = loop {
            let (mut up, reused) = match self.upstream(slot, fresh).await {
                Ok(up) => up,
                Err(attempt) => return attempt,
            };
            let sent = self
                .send_request(&mut up, head, endpoint, reused, framer, pace.as_deref_mut())
                .await;
            let answer = match sent {
                Ok(sent) => self
                    .final_response_head(&mut up, head, endpoint, reused, sent)
                    .await
                    .map(|resp| (resp, sent)),
                Err(attempt) => Err(attempt),
            };
            match answer {
                Ok((resp, sent)) => break (up, resp, sent),
                // A kept-alive connection the backend closed as the request crossed it
                // (its idle timeout, or a restart) says nothing of the endpoint: the
                // request goes to the same endpoint again on a new connection, spending
                // no retry and keeping its slot. Only what is safe to send twice comes
                // here (see `backend_failed`). Without this, a GET met one stale
                // connection on each of two workers in a burst and got a 502.
                Err(Attempt::Retry(_)) if reused => fresh = true,
                Err(attempt) => return attempt,
            }
        };
        let latency = self.account_response(head, slot, &resp, answered);
        if resp.switching {
            endpoint.stats().record_request_duration(latency);
            return self.tunnel(up).await;
        }
        self.relay_response(up, &resp, slot, request_sent).await
    }

    /// A connection to the endpoint `slot` holds: an idle kept-alive one (unless `fresh`),
    /// or a new one; and whether it was reused.
    async fn upstream(&mut self, slot: &Slot, fresh: bool) -> Result<(TcpStream, bool), Attempt> {
        let endpoint = slot.pick().endpoint();
        let addr = endpoint.addr();
        if !fresh {
            if let Some(stream) = self.thread.upstreams.checkout(addr) {
                return Ok((stream, true));
            }
        }
        let shared = &self.thread.shared;
        match upstream::connect(addr, shared.opts.timeouts.connect).await {
            Ok(stream) => {
                let connected = clock::now().saturating_sub(slot.pick().started());
                endpoint.stats().record_connect(connected);
                Ok((stream, false))
            }
            Err(e) if is_local_shortage(&e) => {
                // drover's own shortage: the endpoint is not to blame.
                if let Some(held_back) = CONNECT_SHORTAGE.check_now() {
                    warn!(endpoint = %addr, error = %e, held_back, "cannot connect, drover is out of resources; not counted against the endpoint");
                }
                Err(Attempt::Retry(ProxyError::LocalResources))
            }
            Err(e) => {
                endpoint.stats().record_failure(Cause::ConnectFailed);
                // Refused: nothing listens. Timed out: the backend's listen backlog
                // overflowed and dropped the SYN, so it is busy, and the last endpoint
                // that still answers must stay in rotation.
                let ejected = if e.kind() == std::io::ErrorKind::TimedOut {
                    shared.pool.on_connect_timeout(endpoint, clock::now())
                } else {
                    shared.pool.on_connect_failure(endpoint, clock::now())
                };
                // Each ejection is logged where it happens; a failure that hits every
                // request at once is told once a second, with the count it stands for.
                if let Some(held_back) = CONNECT_FAILURES.check_now() {
                    warn!(endpoint = %addr, error = %e, ejected_for = ?ejected, held_back, "connect failed");
                }
                Err(Attempt::Retry(ProxyError::ConnectFailed))
            }
        }
    }

    /// The request: head, the body read so far, then the rest streamed from the client
    /// while watching for an answer that comes before the body ends. `Ok(false)`: the
    /// backend answered before the body ended, and the rest is never sent.
    async fn send_request(
        &mut self,
        up: &mut TcpStream,
        head: &RequestHead,
        endpoint: &Arc<Endpoint>,
        reused: bool,
        framer: &mut Framer,
        pace: Option<&mut BodyPace>,
    ) -> Result<bool, Attempt> {
        let timeouts = self.opts().timeouts;
        if head.body.is_none() {
            if body::write_all(up, &self.out, timeouts.request)
                .await
                .is_err()
            {
                // Nothing reached the backend: safe to send elsewhere.
                return Err(self.backend_failed(endpoint, reused, ProxyError::BackendClosed, true));
            }
            return Ok(true);
        }
        self.out.extend_from_slice(&self.reqbody);
        let (up_read, mut up_write) = up.split();
        let ends = Ends {
            src: &mut self.client,
            pending: &mut self.cbuf,
            dst: &mut up_write,
            out: &mut self.out,
            read_timeout: timeouts.client,
            write_timeout: timeouts.request,
            pace,
        };
        let answered = async {
            let _ = up_read.readable().await;
        };
        match body::relay(framer, ends, REQUEST_BUFFER, true, answered, &mut 0).await {
            Ok(Relayed::Complete) => Ok(true),
            Ok(Relayed::Interrupted) => {
                // The rest is never sent: the backend connection cannot be reused.
                self.out.clear();
                Ok(false)
            }
            Err(BodyError::Write) => {
                Err(self.backend_failed(endpoint, reused, ProxyError::BackendClosed, false))
            }
            Err(BodyError::Stalled) => {
                self.endpoint_failed(endpoint, Cause::BackendTimeout);
                warn!(endpoint = %endpoint.addr(), "backend stopped reading the request body");
                Err(Attempt::Fail(ProxyError::Timeout))
            }
            Err(e) => {
                self.refuse_body(e).await;
                Err(Attempt::Abort)
            }
        }
    }

    /// The response head after any 1xx, which go to the client as they come.
    async fn final_response_head(
        &mut self,
        up: &mut TcpStream,
        head: &RequestHead,
        endpoint: &Arc<Endpoint>,
        reused: bool,
        request_sent: bool,
    ) -> Result<ResponseHead, Attempt> {
        self.ubuf.clear();
        let sticky_cookie = self
            .opts()
            .sticky_cookie
            .as_ref()
            .filter(|_| head.sticky.as_deref() != Some(endpoint.id()))
            .map(|name| format!("{name}={}; Path=/; HttpOnly", endpoint.id()));
        let ex = Exchange {
            is_head: head.is_head,
            http10_client: head.http10,
            client_keep_alive: head.keep_alive && request_sent,
            upgrade: head.upgrade,
        };
        let client_timeout = self.opts().timeouts.client;
        loop {
            let resp = match self
                .read_response_head(up, &ex, sticky_cookie.as_deref())
                .await
            {
                Ok(resp) => resp,
                Err(ReadHead::Closed { got_bytes }) => {
                    let retry = !got_bytes && head.idempotent && head.body.is_none();
                    return Err(self.backend_failed(
                        endpoint,
                        reused,
                        ProxyError::BackendClosed,
                        retry,
                    ));
                }
                Err(ReadHead::Timeout) => {
                    self.endpoint_failed(endpoint, Cause::BackendTimeout);
                    return Err(Attempt::Fail(ProxyError::Timeout));
                }
                Err(ReadHead::Bad(why)) => {
                    self.endpoint_failed(endpoint, Cause::BadResponse);
                    warn!(endpoint = %endpoint.addr(), "invalid response: {why}");
                    return Err(Attempt::Fail(ProxyError::BadResponse(why)));
                }
            };
            if !resp.informational {
                return Ok(resp);
            }
            if !self.out.is_empty()
                && body::write_all(&mut self.client, &self.out, client_timeout)
                    .await
                    .is_err()
            {
                return Err(Attempt::Abort);
            }
            self.ubuf.drain(..resp.head_len);
        }
    }

    /// What a response head tells: the endpoint's latency and load, the request's cost,
    /// passive health. Returns the latency.
    fn account_response(
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

    /// The response body, read up to the buffer ahead of the client: a response that
    /// fits frees the backend at once, however slowly the client reads it. The
    /// connection goes back to the idle pool when it can carry another request.
    async fn relay_response(
        &mut self,
        mut up: TcpStream,
        resp: &ResponseHead,
        slot: &Slot,
        request_sent: bool,
    ) -> Attempt {
        let timeouts = self.opts().timeouts;
        let endpoint = slot.pick().endpoint();
        let mut framer = Framer::new(resp.body, resp.dechunk);
        let ends = Ends {
            src: &mut up,
            pending: &mut self.ubuf,
            dst: &mut self.client,
            out: &mut self.out,
            read_timeout: timeouts.request,
            write_timeout: timeouts.client,
            pace: None,
        };
        let mut written = 0;
        let sent = body::relay(
            &mut framer,
            ends,
            RESPONSE_BUFFER,
            false,
            std::future::pending(),
            &mut written,
        )
        .await;
        endpoint
            .stats()
            .record_request_duration(clock::now().saturating_sub(slot.pick().started()));
        match sent {
            Ok(_) => {
                if resp.backend_keep_alive && request_sent && self.ubuf.is_empty() {
                    self.thread.upstreams.checkin(endpoint.addr(), up);
                }
                Attempt::Done(resp.client_keep_alive)
            }
            Err(BodyError::Write) => Attempt::Abort,
            Err(BodyError::Stalled) => {
                debug!(client = %self.info.ip, "client stopped reading the response: cut off");
                Attempt::Abort
            }
            Err(e) => {
                warn!(endpoint = %endpoint.addr(), "response body failed mid-stream: {e:?}");
                Attempt::Abort
            }
        }
    }

    /// The endpoint failed this request (`cause`): counted, and held against its
    /// passive health.
    fn endpoint_failed(&self, endpoint: &Arc<Endpoint>, cause: Cause) {
        endpoint.stats().record_failure(cause);
        self.thread
            .shared
            .pool
            .on_request_failure(endpoint, clock::now());
    }

    /// Records a backend-side failure. A stale keep-alive connection closing is not the
    /// endpoint's fault, so it does not count against its health.
    fn backend_failed(
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

    async fn read_response_head(
        &mut self,
        up: &mut TcpStream,
        ex: &Exchange,
        set_cookie: Option<&str>,
    ) -> Result<ResponseHead, ReadHead> {
        let timeout = self.opts().timeouts.request;
        loop {
            if !self.ubuf.is_empty() {
                // Shutdown may have begun while the backend worked: then this response
                // tells the client to close.
                let ex = Exchange {
                    client_keep_alive: ex.client_keep_alive && !*self.shutdown.borrow(),
                    ..*ex
                };
                match response::parse(
                    &self.ubuf,
                    &ex,
                    set_cookie.map(str::as_bytes),
                    &mut self.out,
                ) {
                    Ok(Some(head)) => return Ok(head),
                    Ok(None) => {}
                    Err(bad) => return Err(ReadHead::Bad(bad.0)),
                }
            }
            match body::read_some(up, &mut self.ubuf, timeout).await {
                Ok(0)
                | Err(
                    BodyError::Read
                    | BodyError::Write
                    | BodyError::Stalled
                    | BodyError::TooSlow
                    | BodyError::Framing(_),
                ) => {
                    return Err(ReadHead::Closed {
                        got_bytes: !self.ubuf.is_empty(),
                    })
                }
                Ok(_) => {}
                Err(BodyError::Timeout) => return Err(ReadHead::Timeout),
            }
        }
    }

    /// After a 101: relay bytes both ways until either side closes.
    async fn tunnel(&mut self, mut up: TcpStream) -> Attempt {
        self.out.extend_from_slice(&self.ubuf);
        self.ubuf.clear();
        let client_timeout = self.opts().timeouts.client;
        if body::write_all(&mut self.client, &self.out, client_timeout)
            .await
            .is_err()
        {
            return Attempt::Abort;
        }
        self.out.clear();
        if !self.cbuf.is_empty() {
            if up.write_all(&self.cbuf).await.is_err() {
                return Attempt::Abort;
            }
            self.cbuf.clear();
        }
        let _ = tokio::io::copy_bidirectional(&mut self.client, &mut up).await;
        Attempt::Done(false)
    }

    async fn send_error(&mut self, status: u16, cause: &str, detail: &str, close: bool) {
        error_page::write_error(&mut self.out, status, cause, detail, close, None);
        self.send_out(close).await;
    }

    /// Sends the answer in `out`, then closes the connection's sending side if `close`.
    async fn send_out(&mut self, close: bool) {
        let client_timeout = self.opts().timeouts.client;
        let _ = body::write_all(&mut self.client, &self.out, client_timeout).await;
        self.out.clear();
        if close {
            let _ = self.client.shutdown().await;
        }
    }

    /// Closes the client connection after an answer given before its request body was
    /// read in full: stop writing, then discard what the client still sends (see
    /// `LINGER`) until it closes its side.
    async fn linger(&mut self) {
        let _ = self.client.shutdown().await;
        let deadline = Instant::now() + LINGER;
        loop {
            self.cbuf.clear();
            match timeout_at(deadline, self.client.read_buf(&mut self.cbuf)).await {
                Ok(Ok(n)) if n > 0 => {}
                _ => return,
            }
        }
    }
}

enum ReadHead {
    Closed { got_bytes: bool },
    Timeout,
    Bad(&'static str),
}
