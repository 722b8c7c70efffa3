//! One client connection: read a request, bind it to an endpoint, relay the exchange,
//! repeat while keep-alive lasts (`Conn::run`). A request's phases, in order, each in a
//! file of its own:
//!
//! 1. **Read** (here, `read_head`): the head, parsed and checked by `http1::request`,
//!    which also writes the head the backend will see (`http1::forward`) and reads the
//!    balancing keys and cost class (`http1::keys`). Only this phase and the wire
//!    format of phase 3 know the protocol.
//! 2. **Decide** (`exchange.rs`): read the body up to the buffer before binding, then
//!    ask `Admission` for an endpoint (strategy pick, limits, the queue), and retry on
//!    another endpoint while it is safe to.
//! 3. **Forward** (`attempt.rs`): one try on one endpoint: an idle connection or a new
//!    one, the request sent, the final response head (1xx passed on), the response
//!    relayed.
//! 4. **Account** (`account.rs`): latency and load for the balancer, the route's cost,
//!    passive health; `exchange.rs` counts the request in the metrics.
//!
//! Between two requests of a keep-alive connection it may leave for a worker
//! (`handoff`).
//!
//! An HTTP/2 connection (ALPN `h2`, or `h2c`'s preface) goes to `http2` instead, which
//! runs each of its streams as one exchange here (`serve_stream`) with the stream as
//! the client: phases 2 to 4 are the same code for both protocols.

mod account;
mod attempt;
mod client;
pub(crate) use client::ClientStream;
mod exchange;

use crate::access_log::Record;
use crate::body::{self, BodyError};
use crate::handoff;
use crate::http1::error_page;
use crate::http1::forward::ClientInfo;
use crate::http1::request::{self, BadRequest, Parsed, RequestHead, Routed};
use crate::http2;
use crate::options::ProxyOptions;
use crate::proxy_protocol;
use crate::routes::Routes;
use crate::state::{ClientConnection, ThreadCell, ThreadState};
use crate::tls;
use drover_balance::{Endpoint, Nanos};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::{timeout_at, Instant};
use tracing::debug;

/// Warnings about HTTP/2 clients on a listener that reads HTTP/1.1 only.
static HTTP2_REFUSALS: drover_registry::WarnLimit =
    drover_registry::WarnLimit::new(Duration::from_secs(10));

/// After answering a request whose body was not read in full, how long drover keeps
/// reading (and discarding) what the client still sends before it closes. Closing with
/// unread bytes makes the kernel reset the connection, and a reset can destroy the
/// answer before the client reads it (RFC 9112 §9.6; nginx's `lingering_close`).
const LINGER: Duration = Duration::from_secs(5);

/// How long closing a TLS connection waits to send its `close_notify`: without one, a
/// client cannot tell a response that ends at the close (HTTP/1.0, close-delimited) from
/// one cut short, and OpenSSL reports an unexpected EOF.
const CLOSE_NOTIFY_WAIT: Duration = Duration::from_secs(1);

/// The cause of drover's 413 to a request body over `limits.max_body_bytes`.
const BODY_TOO_LARGE: &str = "body-too-large";

/// Why that 413: the limit, and the setting that sets it.
fn too_large(max: u64) -> String {
    format!("request body larger than {max} bytes (limits.max_body_bytes)")
}

struct ActiveGuard(Arc<AtomicUsize>);

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
    }
}

/// Serves a client connection: `accepted` just now, or given back by a worker (which
/// read its PROXY protocol header, if any, when drover first accepted it: none comes
/// again). On a TLS listener, the handshake comes first (after a PROXY header): only
/// plain connections are ever handed to workers, so none comes back mid-session.
pub(crate) async fn serve(
    mut client: TcpStream,
    peer: std::net::SocketAddr,
    cell: Arc<ThreadCell>,
    _counted: ClientConnection,
    accepted: bool,
) {
    let thread = cell.load_full();
    thread.shared.active.fetch_add(1, Relaxed);
    let _active = ActiveGuard(Arc::clone(&thread.shared.active));
    if accepted {
        handoff::at_new_connection(&thread.shared);
    }
    let mut cbuf = Vec::new();
    let mut client_addr = peer;
    // The PROXY header and the TLS handshake share the header read timeout.
    let deadline = Instant::now() + thread.shared.opts.timeouts.header_read;
    if let (Some(trusted), true) = (&thread.shared.opts.proxy_protocol, accepted) {
        let stats = &thread.shared.stats;
        let named =
            proxy_protocol::read_client(trusted, stats, &mut client, &mut cbuf, peer, deadline);
        match named.await {
            Some(named) => client_addr = named,
            None => return,
        }
    }
    let inside = tls::Inside::http(thread.shared.opts.http2);
    let mut asks_client_cert = false;
    let mut client = match thread.shared.tls.load_full() {
        Some(certs) if accepted => {
            asks_client_cert = certs.asks_client_certs();
            let stats = &thread.shared.stats;
            // Boxed: a handshake's state (rustls's, ~1 KiB) would otherwise size every
            // connection's future, plain ones included.
            match Box::pin(tls::handshake(&certs, client, &mut cbuf, deadline, inside)).await {
                Ok(tls) => {
                    stats.record_tls_handshake();
                    ClientStream::Tls(Box::new(tls))
                }
                Err(why) => {
                    stats.record_tls_failure(why);
                    debug!(%peer, reason = why.as_str(), "TLS handshake failed: closed");
                    return;
                }
            }
        }
        _ => ClientStream::Plain(client),
    };
    let proto = if client.is_plain() { "http" } else { "https" };
    let server = client
        .local_addr()
        .unwrap_or_else(|_| std::net::SocketAddr::from(([0, 0, 0, 0], 0)));
    let mut info = ClientInfo::new(client_addr, server, proto);
    if let Some(trusted) = &thread.shared.opts.forwarded_headers_from {
        info.keeps_forwarded = trusted.trusts(info.addr.ip());
    }
    if let (ClientStream::Tls(tls), true) = (&client, asks_client_cert) {
        info.asks_client_cert = true;
        info.client_cert = tls
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|chain| chain.first())
            .map(|cert| tls::forwarded_client_cert(cert).into());
    }
    let speaks_h2 = if let ClientStream::Tls(tls) = &client {
        tls.get_ref().1.alpn_protocol() == Some(b"h2")
    } else if thread.shared.opts.h2c && accepted {
        // Not a connection given back by a worker (`accepted` false): it is mid-HTTP/1.1.
        match Box::pin(read_preface(&mut client, &mut cbuf, deadline)).await {
            Some(is_h2) => is_h2,
            None => return,
        }
    } else {
        false
    };
    if speaks_h2 {
        drop(thread);
        let io = http2::Rewound::new(std::mem::take(&mut cbuf), client);
        Box::pin(http2::serve(io, cell, info, deadline)).await;
        return;
    }
    let mut conn = Conn::new(client, info, cell, thread, cbuf);
    loop {
        match conn.run().await {
            Ended::Closed => {
                // Not after a response cut short: the client must see a cut as one.
                if !conn.client.is_plain() && !conn.cut {
                    let _ = tokio::time::timeout(CLOSE_NOTIFY_WAIT, conn.client.shutdown()).await;
                }
                return;
            }
            Ended::HandOver(to) => {
                let shared = Arc::clone(&conn.thread.shared);
                // `run` hands over plain connections only.
                let served_by = conn.served_by.as_ref().map(|e| e.addr());
                let given = match conn.client.into_plain() {
                    Ok(plain) => handoff::offer(
                        &shared,
                        plain,
                        to,
                        served_by,
                        &mut conn.offers,
                        conn.requests,
                    ),
                    Err(tls) => Err(tls),
                };
                match given {
                    Ok(()) => return,
                    // No worker took it: serve it here a while longer.
                    Err(back) => conn.client = back,
                }
            }
        }
    }
}

/// Reads a plain connection's first bytes on an `h2c` listener until they show whether
/// they are the HTTP/2 preface; `None`: the client left or said nothing in time.
async fn read_preface(
    client: &mut ClientStream,
    buf: &mut Vec<u8>,
    deadline: Instant,
) -> Option<bool> {
    loop {
        if !buf.is_empty() {
            if let Some(is_h2) = http2::is_preface(buf) {
                return Some(is_h2);
            }
        }
        buf.reserve(4096);
        match timeout_at(deadline, client.read_buf(buf)).await {
            Ok(Ok(n)) if n > 0 => {}
            _ => return None,
        }
    }
}

/// One HTTP/2 stream's exchange (`http2`), with the stream as its client: `head` is its
/// request written as HTTP/1.1 for the parser (`read`: or why it was refused before).
pub(crate) async fn serve_stream(
    client: ClientStream,
    cell: Arc<ThreadCell>,
    info: ClientInfo,
    head: Vec<u8>,
    read: Result<(), BadRequest>,
) {
    let thread = cell.load_full();
    thread.shared.stats.record_http2_stream();
    let mut conn = Conn::new(client, info, cell, thread, head);
    let head = match read {
        Ok(()) => conn.read_head(true).await,
        Err(bad) => Err(bad),
    };
    match head {
        Ok(Some(mut head)) => {
            conn.cbuf.clear();
            head.http2 = true;
            if let Some(routed) = conn.routed.take() {
                conn.thread = routed;
            }
            conn.exchange(&head).await;
        }
        Ok(None) => {}
        Err(bad) => conn.refuse(bad).await,
    }
    if let Some(stream) = conn.client.h2() {
        stream.finish(conn.cut);
    }
}

/// Why `Conn::run` returned.
enum Ended {
    /// The connection is done (closed, failed, or drover is stopping).
    Closed,
    /// Between two requests, with nothing of the next one read: a worker may take it.
    HandOver(handoff::HandOver),
}

struct Conn {
    client: ClientStream,
    info: ClientInfo,
    /// This serving thread's state over the settings in force, which a reload replaces.
    cell: Arc<ThreadCell>,
    /// The worker this connection's current request uses: the listener's, or during a
    /// routed request's exchange, the balancer's its route picked.
    thread: Arc<ThreadState>,
    /// The balancer the last head read was routed to, if not the listener's.
    routed: Option<Arc<ThreadState>>,
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
    /// When it is next offered to a worker (`handoff`).
    offers: handoff::Offers,
    /// How the request under way was answered, for its access log line: plain stores
    /// as it goes, read only when the log is on.
    outcome: Outcome,
    /// The idle backend connection that carries this client's PROXY protocol header
    /// (`send_proxy_protocol`), kept for its next request: no other client may use it.
    private_upstream: Option<Box<(std::net::SocketAddr, crate::upstream::Upstream)>>,
    /// Whether the backend connection of the try under way carries a PROXY protocol
    /// header: it then goes back to `private_upstream`, never to the thread's pool.
    upstream_is_private: bool,
    /// A response was cut short (the backend failed mid-body, or the client stalled):
    /// a TLS connection then closes without its `close_notify`, as nginx's does, so that
    /// a body that ends at the close does not look complete.
    cut: bool,
    /// An endpoint took the request under way and closed on it with no answer: the
    /// next one to do so is its last (see `Conn::after_drop`).
    dropped: bool,
    /// The endpoint that answered this connection's last request: its next one, and a
    /// hand-over, go there again while it has nothing pending (`PickContext::previous`).
    served_by: Option<Arc<Endpoint>>,
}

impl Outcome {
    /// A line's record: `status` when drover did not answer itself, `duration` since
    /// the head arrived; the request's own fields are the caller's to fill in.
    fn record<'a>(
        &self,
        client: &'a str,
        duration: Nanos,
        backend_status: Option<u16>,
    ) -> Record<'a> {
        let ms = std::time::Duration::from_nanos;
        Record {
            time: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default(),
            client: Some(client),
            status: if self.status != 0 {
                self.status
            } else {
                backend_status.unwrap_or(0)
            },
            bytes: self.bytes,
            body_bytes: self.bytes.saturating_sub(self.head_bytes),
            duration: ms(duration),
            upstream: self.upstream.map(ms),
            queue: ms(self.queue),
            endpoint: self.endpoint.as_ref().map(|e| e.addr()),
            retries: self.retries,
            error: self.error,
            ..Record::default()
        }
    }
}

/// What an access log line says of how a request went, beyond its head.
#[derive(Debug, Default)]
struct Outcome {
    /// drover's own answer's status (0: none, a backend's answer, if any, says).
    status: u16,
    /// Its `drover-error` cause.
    error: Option<&'static str>,
    /// Response bytes the client took.
    bytes: u64,
    /// Of those, the response heads' (the rest is body, for the combined log).
    head_bytes: u64,
    retries: u32,
    queue: Nanos,
    /// Bound to the endpoint until its response head.
    upstream: Option<Nanos>,
    endpoint: Option<Arc<Endpoint>>,
}

impl Conn {
    fn new(
        client: ClientStream,
        info: ClientInfo,
        cell: Arc<ThreadCell>,
        thread: Arc<ThreadState>,
        cbuf: Vec<u8>,
    ) -> Conn {
        Conn {
            shutdown: thread.shared.shutdown.clone(),
            info,
            client,
            cell,
            thread,
            routed: None,
            cbuf,
            ubuf: Vec::new(),
            out: Vec::new(),
            reqbody: Vec::new(),
            requests: 0,
            offers: handoff::Offers::new(),
            outcome: Outcome::default(),
            private_upstream: None,
            upstream_is_private: false,
            cut: false,
            dropped: false,
            served_by: None,
        }
    }

    fn opts(&self) -> &ProxyOptions {
        &self.thread.shared.opts
    }

    /// A request refused before any backend saw it: drover's error page, its count,
    /// and its access log line (with `-` for the request: nothing of its head is
    /// trusted). The connection closes after it.
    async fn refuse(&mut self, bad: BadRequest) {
        debug!(client = %self.info.ip, status = bad.status, reason = bad.reason, "refused request");
        // Not the client's mistake but the balancer's settings: said where it is read.
        if bad.reason == request::HTTP2_ON_HTTP1_LISTENER {
            if let Some(held_back) = HTTP2_REFUSALS.check_now() {
                tracing::warn!(balancer = %self.opts().name, held_back, "{}", bad.reason);
            }
        }
        self.thread.shared.stats.record_refusal(bad.status);
        self.send_error(bad.status, "bad-request", bad.reason, true)
            .await;
        if let Some(log) = &self.thread.shared.access_log {
            let outcome = std::mem::take(&mut self.outcome);
            log.log(&outcome.record(&self.info.ip, 0, None));
        }
    }

    async fn run(&mut self) -> Ended {
        loop {
            let head = match self.read_head(self.requests == 0).await {
                Ok(Some(head)) => head,
                Ok(None) => return Ended::Closed,
                Err(bad) => {
                    self.refuse(bad).await;
                    return Ended::Closed;
                }
            };
            self.cbuf.drain(..head.head_len);
            // New settings (a reload) apply from the next request on.
            if !Arc::ptr_eq(&self.cell.load(), &self.thread) {
                self.thread = self.cell.load_full();
            }
            // A routed request is the route's balancer's from here to its end.
            let listener = self
                .routed
                .take()
                .map(|routed| std::mem::replace(&mut self.thread, routed));
            // Boxed: an exchange's state is most of a connection's, and an idle keep-alive
            // connection should not carry it (the connection's future: 952 bytes instead
            // of 2,064; bench/idle.sh measures the whole idle connection).
            let keep = Box::pin(self.exchange(&head)).await;
            if let Some(listener) = listener {
                self.thread = listener;
            }
            if !keep || *self.shutdown.borrow() {
                return Ended::Closed;
            }
            self.requests = self.requests.saturating_add(1);
            if self.cbuf.is_empty() {
                // An idle keep-alive connection holds no buffers.
                self.cbuf = Vec::new();
                self.ubuf = Vec::new();
                self.out = Vec::new();
                self.reqbody = Vec::new();
                if self.offers.are_due(self.requests) && self.client.is_plain() {
                    if let Some(to) = handoff::between_requests(&self.thread.shared) {
                        return Ended::HandOver(to);
                    }
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
            let read = tokio::select! {
                r = tokio::time::timeout(wait, self.client.read_first(&mut self.cbuf)) => r,
                _ = self.shutdown.changed() => return Ok(None),
            };
            if !matches!(read, Ok(Ok(n)) if n > 0) {
                return Ok(None);
            }
        }
        let deadline = tokio::time::Instant::now() + timeouts.header_read;
        let shared = &self.thread.shared;
        loop {
            {
                let routes = shared.routes.load();
                let routes = match routes.as_deref() {
                    Some(Routes::Http(routes)) => Some(routes),
                    _ => None,
                };
                let parsed = request::parse(
                    &self.cbuf,
                    &shared.opts.limits,
                    &self.info,
                    &shared.keys,
                    routes,
                    &mut self.out,
                )?;
                if let Parsed::Complete(head) = parsed {
                    // Resolved under the routes the head was parsed by.
                    self.routed = match (head.routed, routes) {
                        (Routed::Route(i), Some(routes)) => Some(routes.target(i).thread()),
                        _ => None,
                    };
                    return Ok(Some(head));
                }
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
            BodyError::TooLarge => {
                debug!(client = %self.info.ip, "request body larger than limits.max_body_bytes");
                self.thread.shared.stats.record_refusal(413);
                let max = self.opts().limits.max_body_bytes.unwrap_or(u64::MAX);
                let why = too_large(max);
                self.send_error(413, BODY_TOO_LARGE, &why, true).await;
            }
            BodyError::Read | BodyError::Write | BodyError::Stalled => {}
        }
    }

    async fn send_error(&mut self, status: u16, cause: &'static str, detail: &str, close: bool) {
        error_page::write_error(&mut self.out, status, cause, detail, close, None);
        self.outcome.status = status;
        self.outcome.error = Some(cause);
        self.send_out(close).await;
    }

    /// Sends the answer in `out`, then closes the connection's sending side if `close`.
    async fn send_out(&mut self, close: bool) {
        let client_timeout = self.opts().timeouts.client;
        if body::write_all(&mut self.client, &self.out, client_timeout)
            .await
            .is_ok()
        {
            self.outcome.bytes += self.out.len() as u64;
            // drover's own answer: its head ends at the first empty line.
            let head = self.out.windows(4).position(|w| w == b"\r\n\r\n");
            self.outcome.head_bytes += head.map_or(0, |at| at as u64 + 4);
        }
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
        if self.client.h2().is_some() {
            // An HTTP/2 stream ends on its own; the connection's other streams go on.
            return;
        }
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
