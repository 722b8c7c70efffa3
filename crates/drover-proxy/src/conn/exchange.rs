//! Phase 2, **decide**: the request body read up to the buffer before binding, an
//! endpoint from `Admission` (strategy pick, limits, the queue), the retries, and
//! drover's own answer when every try failed. Also where a request is counted.

use crate::access_log::RequestFields;
use crate::body::{self, BodyPace, Framer, REQUEST_BUFFER};
use crate::error::ProxyError;
use crate::http1::error_page;
use crate::http1::redirect;
use crate::http1::request::{RequestHead, Routed};
use crate::http1::BodyKind;
use drover_balance::{clock, Endpoint, Nanos, PickContext, Pooled};
use drover_registry::WarnLimit;
use std::sync::Arc;
use std::time::Duration;
use tracing::{debug, warn};

use super::attempt::Attempt;
use super::{Conn, Outcome};

/// Before retrying a request that met drover's own shortage (descriptors, memory).
const LOCAL_SHORTAGE_PAUSE: Duration = Duration::from_millis(10);

/// How often a request waiting in the queue looks whether its client is still there,
/// when the client's end cannot be seen at once (it sent more bytes first: a pipelined
/// request, a TLS close_notify). A close with nothing before it is seen at once.
///
/// Why it matters: under overload, clients give up (a browser, an app's 10 s timeout)
/// while their requests wait. Sent on, every such request costs a backend the same as
/// one somebody waits for. With 1 s client timeouts at twice the capacity of 2 Node
/// workers, drover served 189 of 3,000 requests in time while its workers ran about
/// 2,300: the queue fed them requests whose clients had left, while the ones behind
/// them waited out their own timeouts.
const LOOK_AT_CLIENT: Duration = Duration::from_secs(1);

/// Warnings about requests that failed (every thread of every balancer shares it).
static FAILURE_WARNINGS: WarnLimit = WarnLimit::new(Duration::from_secs(1));

/// Warnings about gRPC calls refused for want of HTTP/2 to the backends.
static GRPC_DOWNGRADES: WarnLimit = WarnLimit::new(Duration::from_secs(1));

/// The status a request is counted and logged with when its client left before any
/// answer came, after it was sent on: nginx's 499, which its users look for.
pub(super) const CLIENT_CLOSED_REQUEST: u16 = 499;

/// A backend's response head: its status and when it came.
#[derive(Debug, Clone, Copy)]
pub(super) struct Answered {
    pub(super) status: u16,
    pub(super) head_at: Nanos,
}

impl Conn {
    /// Proxies one request; returns whether the client connection may be kept.
    pub(super) async fn exchange(&mut self, head: &RequestHead) -> bool {
        let arrived = clock::now();
        // Copied now: the head drover wrote for the backend is overwritten by the answer.
        let fields = self
            .thread
            .shared
            .access_log
            .as_ref()
            .map(|_| RequestFields::capture(&self.out));
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
        } else if self.outcome.status == CLIENT_CLOSED_REQUEST {
            // Sent on, and the client left before any answer: nothing else counts it
            // (the backend may well have worked on it).
            self.thread
                .shared
                .stats
                .record_response(CLIENT_CLOSED_REQUEST, clock::now().saturating_sub(arrived));
        }
        let outcome = std::mem::take(&mut self.outcome);
        if let Some(fields) = fields {
            self.log_exchange(head, &fields, &outcome, answered, arrived);
        }
        keep
    }

    /// Writes the request's access log line, if it was answered at all or went on to a
    /// backend (a client that left then is logged with 499; one that left while its
    /// request waited in the queue gets none).
    fn log_exchange(
        &self,
        head: &RequestHead,
        fields: &RequestFields,
        outcome: &Outcome,
        answered: Option<Answered>,
        arrived: Nanos,
    ) {
        let Some(log) = &self.thread.shared.access_log else {
            return;
        };
        if outcome.status == 0 && answered.is_none() {
            return;
        }
        let duration = clock::now().saturating_sub(arrived);
        let mut r = outcome.record(&self.info.ip, duration, answered.map(|a| a.status));
        fields.fill(&mut r);
        r.protocol = Some(if head.http2 {
            "HTTP/2.0"
        } else if head.http10 {
            "HTTP/1.0"
        } else {
            "HTTP/1.1"
        });
        log.log(&r);
    }

    /// A balancer that redirects to HTTPS answers every request itself. A request body
    /// is not read: the connection closes after the answer.
    async fn redirect_to_https(&mut self, head: &RequestHead, port: u16) -> bool {
        let close = !head.keep_alive || head.body.is_some();
        let stats = Arc::clone(&self.thread.shared.stats);
        let mut answer = Vec::new();
        match redirect::write(&mut answer, &self.out, port, close) {
            Ok(()) => {
                stats.record_refusal(308);
                self.outcome.status = 308;
                self.out = answer;
                self.send_out(close).await;
            }
            Err(why) => {
                stats.record_refusal(400);
                self.send_error(400, "bad-request", why, true).await;
                return false;
            }
        }
        if head.body.is_some() {
            self.linger().await;
        }
        !close
    }

    /// drover's own answer to a request it will not send to any backend, counted; the
    /// request body is not read, so the connection closes after the answer.
    async fn answer_unsent(
        &mut self,
        head: &RequestHead,
        status: u16,
        cause: &'static str,
        detail: &str,
    ) -> bool {
        let close = !head.keep_alive || head.body.is_some();
        self.thread.shared.stats.record_refusal(status);
        self.write_own_error(head, status, cause, detail, close, None);
        self.outcome.status = status;
        self.outcome.error = Some(cause);
        self.send_out(close).await;
        if head.body.is_some() {
            self.linger().await;
        }
        !close
    }

    /// drover's own error answer to `head` into `out`: in gRPC's form for a gRPC call
    /// (`error_page::write_grpc_error`), whose client reads no HTTP status.
    fn write_own_error(
        &mut self,
        head: &RequestHead,
        status: u16,
        cause: &str,
        detail: &str,
        close: bool,
        retry_after: Option<u32>,
    ) {
        if head.grpc {
            error_page::write_grpc_error(&mut self.out, status, cause, detail, close);
        } else {
            error_page::write_error(&mut self.out, status, cause, detail, close, retry_after);
        }
    }

    /// `exchange`, with the first response head's status and time left in `answered`
    /// (drover's own answers are counted where they are made).
    /// When this request came, for its turn in drover's queue: when drover read it,
    /// except for a connection's first request, which may have come long before (its
    /// connection waited in the listen backlog while the queue was backed up): then when
    /// the kernel received it. Asked only of a request that queues, so one `TCP_INFO`
    /// call (~1 µs) at most per new connection. Every first request is asked, not only
    /// those that find others waiting: the one read as accepting resumes found the queue
    /// empty, and timed by drover it went behind the whole backlog that came after it
    /// (one request in 400 waited 27 s where the rest waited 13-15 s).
    fn came(&self, arrived: Nanos) -> Nanos {
        if self.requests != 0 {
            return arrived;
        }
        match self.client.data_received_ago() {
            Some(ago) => arrived.saturating_sub(clock::nanos(ago)).max(1),
            None => arrived,
        }
    }

    async fn exchange_timed(
        &mut self,
        head: &RequestHead,
        arrived: Nanos,
        answered: &mut Option<Answered>,
    ) -> bool {
        if head.routed == Routed::Nowhere {
            // A redirecting listener's routes take what they match (certbot's
            // `/.well-known/acme-challenge/`, as nginx's `location` beside its `return
            // 301`), and it redirects the rest: that was a 404 for every other path.
            if let Some(port) = self.opts().redirect_to_https {
                return self.redirect_to_https(head, port).await;
            }
            // No route takes it, and the listener's own balancer has no backends: 404,
            // as nginx answers a `location` nothing matches.
            let why = "no route matches this request's host and path";
            return self.answer_unsent(head, 404, "no-route", why).await;
        }
        if let Some(port) = self.opts().redirect_to_https {
            return self.redirect_to_https(head, port).await;
        }
        let http2_backends = self.opts().backend_protocol.is_http2();
        if head.upgrade && http2_backends {
            // An HTTP/2 stream has no Upgrade (RFC 9113 §8.6): sent on without it, the
            // request would leave its client waiting for a 101 that never comes.
            let why = "this balancer speaks HTTP/2 to its backends (backend_protocol), which carries no Upgrade";
            return self
                .answer_unsent(head, 501, "upgrade-over-http2", why)
                .await;
        }
        if head.grpc && !http2_backends {
            // Never downgraded: HTTP/1.1 would lose the trailers a call's status rides
            // in (the client would see a call that ended with no status).
            if let Some(held_back) = GRPC_DOWNGRADES.check_now() {
                warn!(balancer = %self.opts().name, held_back, "a gRPC call to backends spoken to in HTTP/1.1: refused; set backend_protocol = \"h2c\" (or \"h2\")");
            }
            let why = "a gRPC call needs HTTP/2 to the backends, and this balancer speaks HTTP/1.1 to them: set backend_protocol = \"h2c\" (or \"h2\")";
            return self.answer_unsent(head, 502, "grpc-over-http1", why).await;
        }
        let max_body = self.opts().limits.max_body_bytes;
        if let (Some(max), Some(BodyKind::Length(len))) = (max_body, head.body) {
            // Said in its head: answered before any of it is read (and before a `100
            // Continue`, so a client that waits for one sends none of it).
            if len > max {
                let why = super::too_large(max);
                return self
                    .answer_unsent(head, 413, super::BODY_TOO_LARGE, &why)
                    .await;
            }
        }
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
        let mut framer = Framer::new(head.body.unwrap_or(BodyKind::None), false).limited(max_body);
        self.reqbody.clear();
        // Only a request with a body keeps a pace: the others read no clock for it.
        let mut pace = None;
        let duplex = self.is_duplex(head);
        if head.body.is_some() && !duplex {
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
        // A socket.io session's requests go where its handshake went; a sticky cookie
        // says where the client was.
        let session = match &head.engine_io {
            Some(eio) => {
                if shared.sessions.saw_one() {
                    // Its requests must all pass here from now on: the workers give
                    // back the connections they were handed, between two requests.
                    shared.pool.handoffs().reclaim();
                }
                eio.sid()
                    .and_then(|sid| shared.sessions.endpoint_of(sid, arrived))
            }
            None => None,
        };
        let pinned = session.as_deref().or(head.sticky.as_deref());
        let cost = shared.costs.estimate(head.cost_key).unwrap_or(0);
        let guess = shared.costs.typical().unwrap_or(0);
        let mut tried: Vec<Arc<Endpoint>> = Vec::new();
        let mut attempts = 0;
        let mut last_failure = None;
        // Why the try before failed: counted as a retry once the next one has an
        // endpoint, so a retry that finds none (every other one tried or ejected) is
        // not counted as sent.
        let mut retrying = None;
        // When drover first ran short of descriptors for this request (see below).
        let mut short_since = None;
        self.dropped = false;
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
                guess,
                route: head.cost_key,
                hash_key: head.hash_key.as_deref(),
                pinned,
                exclude: &tried,
                previous: self.served_by.as_ref(),
                pooled: (!self.opts().backend_protocol.is_http2()
                    && self.opts().send_proxy_protocol.is_none())
                .then_some(&self.thread.upstreams as &dyn Pooled),
            };
            // A client that leaves while its request waits takes the request with it:
            // sent on to a backend, it would spend capacity that the waiters behind it
            // need (under overload with clients that time out, most of it: see
            // `LOOK_AT_CLIENT`). The look costs nothing unless the request waits. The
            // queue counts the departure (an HTTP/2 stream's reset drops the exchange
            // the same way: see `http2::serve_stream`).
            let acquired = tokio::select! {
                biased;
                acquired = shared.admission.acquire_in_turn(&ctx, || self.came(arrived)) => acquired,
                () = self.client.gone(LOOK_AT_CLIENT) => {
                    debug!(client = %self.info.ip, "client left while its request waited in the queue");
                    return false;
                }
            };
            let slot = match acquired {
                Ok(slot) => slot,
                // Every endpoint was tried: report the last real failure, not "none healthy".
                Err(e) => break last_failure.unwrap_or(e),
            };
            if let Some(cause) = retrying.take() {
                shared.stats.record_retry(cause);
                self.outcome.retries = attempts;
            }
            let endpoint = Arc::clone(slot.pick().endpoint());
            let waited = slot.pick().started().saturating_sub(asked);
            shared.stats.record_queue_wait(waited);
            self.outcome.queue += waited;
            endpoint.stats().record_queue_wait(waited);
            match self
                .attempt(head, &slot, &mut framer, pace.as_mut(), answered)
                .await
            {
                Attempt::Done(keep) => {
                    // The backend is done: free its slot before the client takes the rest.
                    drop(slot);
                    if shared.opts.connection_affinity {
                        self.served_by = Some(Arc::clone(&endpoint));
                    }
                    self.outcome.endpoint = Some(endpoint);
                    let tail = std::mem::take(&mut self.out);
                    let sent = body::write_all(&mut self.client, &tail, client_timeout).await;
                    if sent.is_ok() {
                        self.outcome.bytes += tail.len() as u64;
                    }
                    self.out = tail;
                    self.out.clear();
                    if sent.is_err() {
                        return false;
                    }
                    if !framer.is_done() && !duplex {
                        // Answered before the request body ended (an early 413, say).
                        self.linger().await;
                        return false;
                    }
                    return keep && head.keep_alive;
                }
                Attempt::Abort => {
                    self.outcome.endpoint = Some(endpoint);
                    self.cut = true;
                    return false;
                }
                Attempt::Fail(e) => {
                    self.outcome.endpoint = Some(endpoint);
                    break e;
                }
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
                Attempt::Retry(e @ ProxyError::ConnectRefused) => {
                    // Refused at once (nothing listens: a member that died), with nothing
                    // sent: the request goes on to another endpoint without spending a
                    // retry, each endpoint once, as nginx tries every upstream on
                    // `error`. After 500 of 506 members were killed, 382 requests failed
                    // with 3 tries each (multi-machine seat).
                    retrying = Some(e.metric_cause());
                    last_failure = Some(e);
                    tried.push(endpoint);
                }
                Attempt::Retry(e) => {
                    attempts += 1;
                    if attempts > shared.opts.retries {
                        self.outcome.endpoint = Some(endpoint);
                        break e;
                    }
                    retrying = Some(e.metric_cause());
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
        self.outcome.status = failure.status();
        self.outcome.error = Some(failure.cause());
        self.write_own_error(
            head,
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
}
