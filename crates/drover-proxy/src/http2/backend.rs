//! HTTP/2 to backends (`backend_protocol = "h2c"`, or `"h2"` over `backend_tls`).
//!
//! Each serving thread keeps one HTTP/2 connection per endpoint (`H2Backends`), and
//! every request is one stream on it: the balancer still picks an endpoint per request,
//! so the streams of one client connection (gRPC calls on one channel) spread over the
//! backends by load, where an L4 balancer pins them all to one.
//!
//! A stream is the request path's upstream (`Upstream::H2`, an `H2Exchange`): it takes
//! the HTTP/1.1 request drover wrote (head, then the body as framed) and gives back the
//! response as HTTP/1.1 (head, then the body chunked, with the HTTP/2 trailers as the
//! trailer section, where gRPC's status rides). So every phase after the pick (retries,
//! timeouts, limits, accounting, access log) is the one HTTP/1.1 backends have, and an
//! HTTP/2 client's stream meets its HEADERS, DATA and trailers again in
//! `http2::H2Client`, which decodes the chunks. The h2 crate does all framing.

use super::chunks::{chunk, last_chunk, poll_window, send_unsent, trailer_fields, MAX_DATA};
use crate::http1::chunked::ChunkedScanner;
use crate::upstream::Upstream;
use bytes::{Buf, Bytes, BytesMut};
use h2::client::{ResponseFuture, SendRequest};
use h2::{RecvStream, SendStream};
use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A stream's receive window: a response streams back at the pace drover's relay reads
/// it, and no more than this waits unread for a client that reads slowly.
const STREAM_WINDOW: u32 = 256 * 1024;

/// The connection's receive window: the largest HTTP/2 allows (2^31 - 1), so that only
/// each stream's own window holds its backend back. The streams of every client of a
/// serving thread share its one connection to a backend; with 4 MiB, 16 streams a slow
/// client left unread filled it, and every other call to that backend waited until
/// the slow client read again (gRPC seat #1). What waits unread stays bounded by the
/// streams open, each to `STREAM_WINDOW`.
const CONNECTION_WINDOW: u32 = (1 << 31) - 1;

/// Longest request head taken: drover wrote it within its own limits.
const MAX_HEAD: usize = 1024 * 1024;

/// Request header fields that are HTTP/1.1's connection management, which HTTP/2
/// forbids (RFC 9113 §8.2.2); `host` becomes `:authority`; `te` is sent as `trailers`.
const NOT_SENT: [&str; 7] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "upgrade",
    "host",
    "te",
];

/// How a balancer speaks to its backends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BackendProtocol {
    /// HTTP/1.1 over a keep-alive pool (the default).
    #[default]
    Http1,
    /// HTTP/2 in cleartext, with prior knowledge.
    H2c,
    /// HTTP/2 over TLS (`backend_tls`), agreed by ALPN.
    H2,
}

impl BackendProtocol {
    /// Whether requests go to the backends as HTTP/2 streams.
    pub fn is_http2(self) -> bool {
        self != BackendProtocol::Http1
    }

    /// The name drover.toml's `backend_protocol` writes.
    pub fn name(self) -> &'static str {
        match self {
            BackendProtocol::Http1 => "http1",
            BackendProtocol::H2c => "h2c",
            BackendProtocol::H2 => "h2",
        }
    }
}

impl std::fmt::Display for BackendProtocol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for BackendProtocol {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "http1" | "http/1.1" => Ok(BackendProtocol::Http1),
            "h2c" => Ok(BackendProtocol::H2c),
            "h2" => Ok(BackendProtocol::H2),
            _ => Err(format!(
                "invalid backend protocol {s:?}: expected \"http1\", \"h2c\" (HTTP/2 in cleartext) or \"h2\" (HTTP/2 over backend_tls)"
            )),
        }
    }
}

/// One HTTP/2 connection to a backend: new streams are opened through `send`; `closed`
/// is set once the connection has ended (GOAWAY, an error, the backend gone).
#[derive(Clone)]
pub struct H2Conn {
    send: SendRequest<Bytes>,
    closed: Arc<AtomicBool>,
    /// Streams drover opened on it whose exchange is not over (see `has_room`).
    streams: Arc<AtomicUsize>,
}

impl H2Conn {
    /// The HTTP/2 handshake over a new connection to a backend; the connection's frames
    /// are then read and written by a task of its own on this thread.
    pub async fn handshake(io: Upstream) -> Result<H2Conn, h2::Error> {
        let (send, connection) = h2::client::Builder::new()
            .initial_window_size(STREAM_WINDOW)
            .initial_connection_window_size(CONNECTION_WINDOW)
            .max_header_list_size(MAX_HEAD as u32)
            // drover never accepts pushed streams.
            .enable_push(false)
            .handshake::<_, Bytes>(io)
            .await?;
        let closed = Arc::new(AtomicBool::new(false));
        let ended = Arc::clone(&closed);
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!("HTTP/2 connection to a backend ended: {e}");
            }
            ended.store(true, Relaxed);
        });
        Ok(H2Conn {
            send,
            closed,
            streams: Arc::default(),
        })
    }

    fn is_open(&self) -> bool {
        !self.closed.load(Relaxed)
    }

    /// Whether a new stream opens on it at once: fewer are open than the backend's
    /// SETTINGS_MAX_CONCURRENT_STREAMS allows (unlimited until its SETTINGS come).
    /// Past it, h2 holds a new stream until one ends: a backend that allows 5 (gRPC
    /// servers often cap them) had every call past 5 watches wait for one to end, and
    /// time out (gRPC seat #2).
    fn has_room(&self) -> bool {
        self.streams.load(Relaxed) < self.send.current_max_send_streams()
    }

    /// A new stream's exchange on this connection; `https` names the scheme sent.
    pub fn exchange(&self, https: bool, endpoint: SocketAddr) -> H2Exchange {
        self.streams.fetch_add(1, Relaxed);
        H2Exchange {
            _open: OpenStream(Arc::clone(&self.streams)),
            conn: self.send.clone(),
            https,
            endpoint,
            sending: Sending::Head(Vec::new()),
            receiving: Receiving::NotYet,
            out: Bytes::new(),
            is_head: false,
            refused: false,
        }
    }
}

/// One stream counted in its connection's `H2Conn::streams` until its exchange ends.
struct OpenStream(Arc<AtomicUsize>);

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
    }
}

struct Kept {
    conn: H2Conn,
    last_used: Instant,
}

/// One serving thread's HTTP/2 connections to its endpoints: one each, and more where
/// the backend's cap on concurrent streams is reached. The lock is never contended:
/// one thread uses it (tokio tasks must be `Send`).
#[derive(Default)]
pub struct H2Backends {
    conns: Mutex<HashMap<SocketAddr, Vec<Kept>>>,
    /// One connect at a time per endpoint: a burst of requests at a cold start waits
    /// for the first one's connection instead of opening one each.
    connecting: Mutex<HashMap<SocketAddr, Arc<tokio::sync::Mutex<()>>>>,
}

impl H2Backends {
    /// The gate a new connection to `addr` is opened behind: whoever holds it connects,
    /// the others find its connection once they get it.
    pub fn connect_gate(&self, addr: SocketAddr) -> Arc<tokio::sync::Mutex<()>> {
        let mut gates = self.connecting.lock().unwrap_or_else(|e| e.into_inner());
        Arc::clone(gates.entry(addr).or_default())
    }

    /// An open connection to `addr` with room for a new stream, if there is one.
    pub fn get(&self, addr: SocketAddr) -> Option<H2Conn> {
        let mut conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        let kept = conns.get_mut(&addr)?;
        kept.retain(|k| k.conn.is_open());
        let found = kept.iter_mut().find(|k| k.conn.has_room()).map(|k| {
            k.last_used = Instant::now();
            k.conn.clone()
        });
        if kept.is_empty() {
            conns.remove(&addr);
        }
        found
    }

    /// Keeps `conn` among the connections to `addr`, for the streams that follow.
    pub fn keep(&self, addr: SocketAddr, conn: &H2Conn) {
        let mut conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        conns.entry(addr).or_default().push(Kept {
            conn: conn.clone(),
            last_used: Instant::now(),
        });
    }

    /// Lets go of connections unused for `idle` (their endpoints may be gone); streams
    /// still on them finish first.
    pub fn sweep(&self, idle: Duration) {
        let mut conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        for kept in conns.values_mut() {
            kept.retain(|k| k.conn.is_open() && k.last_used.elapsed() < idle);
        }
        conns.retain(|_, kept| !kept.is_empty());
        let mut gates = self.connecting.lock().unwrap_or_else(|e| e.into_inner());
        // A gate nobody waits at goes with its connections.
        gates.retain(|addr, gate| conns.contains_key(addr) || Arc::strong_count(gate) > 1);
    }
}

/// Active health checks of a balancer that speaks HTTP/2 to its backends: each probe
/// is a stream on a connection of its own (over TLS first, for `h2`), which speaks
/// the HTTP/1.1 the probe writes and reads, as a request's stream does. A backend that
/// serves only HTTP/2 answers no HTTP/1.1 probe.
pub struct H2Probe {
    /// The balancer's backend TLS, for `h2`; `None`: `h2c`.
    pub tls: Option<Arc<crate::backend_tls::Connector>>,
}

impl drover_registry::WrapProbe for H2Probe {
    fn wrap<'a>(
        &'a self,
        tcp: tokio::net::TcpStream,
        addr: SocketAddr,
        deadline: tokio::time::Instant,
    ) -> drover_registry::WrapFuture<'a> {
        Box::pin(async move {
            let io = match &self.tls {
                Some(tls) => {
                    let stream = tls
                        .handshake(tcp, addr, deadline)
                        .await
                        .map_err(|f| format!("{} ({f})", f.as_str()))?;
                    if stream.get_ref().1.alpn_protocol() != Some(b"h2") {
                        let why = crate::backend_tls::Failure::NoAlpn;
                        return Err(format!("{} ({why})", why.as_str()));
                    }
                    Upstream::Tls(Box::new(stream))
                }
                None => Upstream::Plain(tcp),
            };
            let conn = tokio::time::timeout_at(deadline, H2Conn::handshake(io))
                .await
                .map_err(|_| "HTTP/2 handshake timed out".to_owned())?
                .map_err(|e| format!("HTTP/2 handshake failed: {e}"))?;
            let stream = conn.exchange(self.tls.is_some(), addr);
            Ok(Box::new(stream) as Box<dyn drover_registry::ProbeStream>)
        })
    }

    /// A probe's "connection" is one stream: it ends with its answer.
    fn keeps_connection(&self) -> bool {
        false
    }
}

/// The request side of a stream.
enum Sending {
    /// Collecting drover's HTTP/1.1 request head.
    Head(Vec<u8>),
    /// The head is read; the stream opens once the connection can take it.
    Opening {
        request: Option<http::Request<()>>,
        body: RequestBody,
    },
    /// The body goes out as DATA.
    Body {
        stream: SendStream<Bytes>,
        body: RequestBody,
        unsent: BytesMut,
    },
    /// All sent.
    Done,
}

impl Sending {
    /// Body bytes as drover framed them: sent as DATA as the window allows.
    fn poll_body(&mut self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let Sending::Body {
            stream,
            body,
            unsent,
        } = self
        else {
            // Past the body: nothing more belongs to it.
            return Poll::Ready(Ok(buf.len()));
        };
        ready!(send_unsent(stream, unsent, cx))?;
        match body {
            RequestBody::None | RequestBody::Length(0) => Poll::Ready(Ok(buf.len())),
            RequestBody::Length(left) => {
                let want = buf
                    .len()
                    .min(MAX_DATA)
                    .min(usize::try_from(*left).unwrap_or(usize::MAX));
                let n = ready!(poll_window(stream, want, cx))?;
                *left -= n as u64;
                let end = *left == 0;
                stream
                    .send_data(Bytes::copy_from_slice(&buf[..n]), end)
                    .map_err(io::Error::other)?;
                if end {
                    *self = Sending::Done;
                }
                Poll::Ready(Ok(n))
            }
            RequestBody::Chunked(scanner) => {
                let take = buf.len().min(MAX_DATA);
                let used = scanner
                    .scan(&buf[..take], |data| unsent.extend_from_slice(data))
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                if let Poll::Ready(Err(e)) = self.poll_flush_body(cx) {
                    return Poll::Ready(Err(e));
                }
                Poll::Ready(Ok(used))
            }
        }
    }

    /// Sends what was decoded of a chunked body; once it has ended, its trailers (or
    /// an empty DATA frame) end the stream.
    fn poll_flush_body(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let Sending::Body {
            stream,
            body: RequestBody::Chunked(scanner),
            unsent,
        } = self
        else {
            return Poll::Ready(Ok(()));
        };
        ready!(send_unsent(stream, unsent, cx))?;
        if !scanner.is_done() {
            return Poll::Ready(Ok(()));
        }
        let trailers = trailer_fields(&scanner.take_trailers());
        let ended = if trailers.is_empty() {
            stream.send_data(Bytes::new(), true)
        } else {
            stream.send_trailers(trailers)
        };
        *self = Sending::Done;
        Poll::Ready(ended.map_err(io::Error::other))
    }
}

/// How the request's body is framed in what drover writes.
enum RequestBody {
    None,
    Length(u64),
    /// Decoded; the trailer section becomes HTTP/2 trailers.
    Chunked(ChunkedScanner),
}

/// The response side of a stream.
enum Receiving {
    NotYet,
    Head(ResponseFuture),
    /// DATA passed on as it comes (`chunked`: as chunks, the trailers last).
    Body {
        body: RecvStream,
        chunked: bool,
    },
    Done,
}

/// One request as one HTTP/2 stream; see the module's doc.
pub struct H2Exchange {
    /// Counts it among its connection's streams while it lasts (dropped with it).
    _open: OpenStream,
    conn: SendRequest<Bytes>,
    https: bool,
    endpoint: SocketAddr,
    sending: Sending,
    receiving: Receiving,
    /// Response bytes (HTTP/1.1) not yet read.
    out: Bytes,
    /// A HEAD request: its response has no body, whatever its length says.
    is_head: bool,
    /// The backend never processed this request (see `never_processed`).
    refused: bool,
}

/// Whether a stream's error says the backend never processed it (RFC 9113 §8.7):
/// refused with `REFUSED_STREAM`, or above the last stream id of a graceful GOAWAY
/// (a server shutting down, as a deploy stops it). Any other error (a broken
/// connection, a GOAWAY with an error, which h2 gives every stream) says nothing.
fn is_refusal(e: &h2::Error) -> bool {
    e.is_remote()
        && ((e.is_reset() && e.reason() == Some(h2::Reason::REFUSED_STREAM))
            || (e.is_go_away() && e.reason() == Some(h2::Reason::NO_ERROR)))
}

fn invalid(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_owned())
}

/// The request body's half of a stream, taken out of its `H2Exchange` once the stream
/// is open (`H2Exchange::take_body`), so that the body can be sent while the response
/// is read: a gRPC stream runs both ways at once (`conn/attempt.rs`'s duplex). Takes
/// the body as drover frames it, as the exchange does.
pub struct H2Body(Sending);

impl AsyncWrite for H2Body {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().0.poll_body(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().0.poll_flush_body(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.poll_flush(cx)
    }
}

impl H2Exchange {
    /// The body's half of an open stream whose body is still to come; `None` before
    /// the head has opened the stream, or when there is no body to send.
    pub fn take_body(&mut self) -> Option<H2Body> {
        match self.sending {
            Sending::Body { .. } => {
                Some(H2Body(std::mem::replace(&mut self.sending, Sending::Done)))
            }
            _ => None,
        }
    }

    /// Whether the backend never processed the request, so that it may go again, to
    /// any endpoint, whatever its method: the stream could not be opened (the
    /// connection had ended, or was going away), or the backend refused it.
    pub fn never_processed(&self) -> bool {
        self.refused
    }

    /// Takes head bytes; returns how many of `buf` belong to the head.
    fn take_head(&mut self, buf: &[u8]) -> io::Result<usize> {
        let Sending::Head(head) = &mut self.sending else {
            return Ok(0);
        };
        let before = head.len();
        head.extend_from_slice(buf);
        let Some(end) = memchr::memmem::find(head, b"\r\n\r\n") else {
            if head.len() > MAX_HEAD {
                return Err(invalid("request head too large"));
            }
            return Ok(buf.len());
        };
        head.truncate(end + 4);
        let (request, body) = to_h2_request(head, self.https, self.endpoint)?;
        self.is_head = request.method() == http::Method::HEAD;
        self.sending = Sending::Opening {
            request: Some(request),
            body,
        };
        Ok(end + 4 - before)
    }

    /// Opens the stream once the connection can take it, and sends the HEADERS.
    fn poll_open(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let Sending::Opening { request, body } = &mut self.sending else {
            return Poll::Ready(Ok(()));
        };
        // Nothing is sent before the HEADERS: a failure here never reached the backend.
        if let Err(e) = ready!(self.conn.poll_ready(cx)) {
            self.refused = true;
            return Poll::Ready(Err(io::Error::other(e)));
        }
        let request = request
            .take()
            .ok_or_else(|| invalid("stream opened twice"))?;
        let end = matches!(body, RequestBody::None | RequestBody::Length(0));
        let (response, stream) = match self.conn.send_request(request, end) {
            Ok(sent) => sent,
            Err(e) => {
                self.refused = true;
                return Poll::Ready(Err(io::Error::other(e)));
            }
        };
        self.receiving = Receiving::Head(response);
        let body = std::mem::replace(body, RequestBody::None);
        self.sending = if end {
            Sending::Done
        } else {
            Sending::Body {
                stream,
                body,
                unsent: BytesMut::new(),
            }
        };
        Poll::Ready(Ok(()))
    }

    /// The next response bytes as HTTP/1.1 into `self.out`; `Ready` with nothing in it
    /// at the end.
    fn poll_response(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        loop {
            match &mut self.receiving {
                Receiving::NotYet => {
                    // The request is not sent yet (read before the flush): send it.
                    ready!(self.poll_open(cx))?;
                    if matches!(self.receiving, Receiving::NotYet) {
                        return Poll::Pending;
                    }
                }
                Receiving::Head(response) => {
                    let response = match ready!(Pin::new(response).poll(cx)) {
                        Ok(response) => response,
                        Err(e) => {
                            self.refused |= is_refusal(&e);
                            return Poll::Ready(Err(io::Error::other(e)));
                        }
                    };
                    let (parts, body) = response.into_parts();
                    let no_body = self.is_head
                        || body.is_end_stream()
                        || matches!(parts.status.as_u16(), 204 | 304);
                    let (head, chunked) = to_h1_head(&parts, no_body);
                    self.out = head;
                    self.receiving = if no_body {
                        Receiving::Done
                    } else {
                        Receiving::Body { body, chunked }
                    };
                    return Poll::Ready(Ok(()));
                }
                Receiving::Body { body, chunked } => match ready!(body.poll_data(cx)) {
                    Some(Ok(data)) => {
                        let _ = body.flow_control().release_capacity(data.len());
                        if data.is_empty() {
                            continue;
                        }
                        self.out = if *chunked { chunk(&data) } else { data };
                        return Poll::Ready(Ok(()));
                    }
                    Some(Err(e)) => return Poll::Ready(Err(io::Error::other(e))),
                    None if *chunked => {
                        let trailers = ready!(body.poll_trailers(cx))
                            .map_err(io::Error::other)?
                            .unwrap_or_default();
                        self.out = last_chunk(&trailers);
                        self.receiving = Receiving::Done;
                        return Poll::Ready(Ok(()));
                    }
                    None => self.receiving = Receiving::Done,
                },
                Receiving::Done => return Poll::Ready(Ok(())),
            }
        }
    }
}

use std::future::Future;

impl AsyncRead for H2Exchange {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.out.is_empty() {
            ready!(this.poll_response(cx))?;
        }
        let n = this.out.len().min(buf.remaining());
        buf.put_slice(&this.out[..n]);
        this.out.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for H2Exchange {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if matches!(this.sending, Sending::Head(_)) {
            return Poll::Ready(this.take_head(buf));
        }
        ready!(this.poll_open(cx))?;
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        this.sending.poll_body(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // The connection's task writes the frames out; the stream opens here once its
        // head is whole, and a chunked body's decoded payload and trailers go here.
        let this = self.get_mut();
        if matches!(this.sending, Sending::Head(_)) {
            return Poll::Ready(Ok(()));
        }
        ready!(this.poll_open(cx))?;
        this.sending.poll_flush_body(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.poll_flush(cx)
    }
}

/// drover's HTTP/1.1 request head (already checked and rewritten for the backend) as
/// an HTTP/2 request, and how its body is framed. `Host` becomes `:authority` (the
/// endpoint's address when there is none, as from an HTTP/1.0 client).
fn to_h2_request(
    head: &[u8],
    https: bool,
    endpoint: SocketAddr,
) -> io::Result<(http::Request<()>, RequestBody)> {
    let mut slots = crate::http1::HeadSlots::new();
    let (result, parsed) = slots.request(head, usize::MAX);
    match result {
        Ok(httparse::Status::Complete(_)) => {}
        _ => return Err(invalid("request head")),
    }
    let method = http::Method::from_bytes(parsed.method.unwrap_or("GET").as_bytes())
        .map_err(|_| invalid("method"))?;
    let target = parsed.path.unwrap_or("/");
    let host = parsed
        .headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("host"))
        .and_then(|h| std::str::from_utf8(h.value).ok())
        .filter(|h| !h.is_empty() && http::uri::Authority::try_from(*h).is_ok());
    let endpoint_name = endpoint.to_string();
    let authority = host.unwrap_or(&endpoint_name);
    let scheme = if https { "https" } else { "http" };
    let uri = if target.starts_with('/') {
        http::Uri::try_from(format!("{scheme}://{authority}{target}"))
    } else if target == "*" {
        // OPTIONS *: an empty path, as HTTP/2 has no asterisk form.
        http::Uri::try_from(format!("{scheme}://{authority}"))
    } else {
        http::Uri::try_from(target)
    }
    .map_err(|_| invalid("request target"))?;
    let mut request = http::Request::new(());
    *request.method_mut() = method;
    *request.uri_mut() = uri;
    let mut body = RequestBody::None;
    let fields = request.headers_mut();
    for h in parsed.headers.iter() {
        if h.name.eq_ignore_ascii_case("content-length") {
            body = RequestBody::Length(
                crate::http1::headers::parse_content_length(h.value)
                    .ok_or_else(|| invalid("content-length"))?,
            );
        }
        if h.name.eq_ignore_ascii_case("transfer-encoding") {
            body = RequestBody::Chunked(ChunkedScanner::keeping_trailers());
        }
        if NOT_SENT.iter().any(|n| h.name.eq_ignore_ascii_case(n)) {
            continue;
        }
        let name =
            http::HeaderName::from_bytes(h.name.as_bytes()).map_err(|_| invalid("field name"))?;
        let value = http::HeaderValue::from_bytes(h.value).map_err(|_| invalid("field value"))?;
        fields.append(name, value);
    }
    // drover takes trailers (and passes them on): gRPC servers expect to be told.
    fields.insert(http::header::TE, http::HeaderValue::from_static("trailers"));
    Ok((request, body))
}

/// A backend's HTTP/2 response head as HTTP/1.1, and whether its body goes chunked:
/// a body with no length, or with trailers to come, is chunked; `no_body` says it has
/// none (HEAD, 204, 304, or the HEADERS ended the stream).
fn to_h1_head(parts: &http::response::Parts, no_body: bool) -> (Bytes, bool) {
    let status = parts.status;
    let mut out = BytesMut::with_capacity(256);
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.extend_from_slice(b" ");
    out.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\n");
    let has_length = parts.headers.contains_key(http::header::CONTENT_LENGTH);
    for (name, value) in &parts.headers {
        if NOT_SENT[..5].contains(&name.as_str()) {
            continue;
        }
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    let chunked = !no_body && !has_length;
    if chunked {
        out.extend_from_slice(b"transfer-encoding: chunked\r\n");
    } else if no_body && !has_length && !matches!(status.as_u16(), 204 | 304) {
        out.extend_from_slice(b"content-length: 0\r\n");
    }
    out.extend_from_slice(b"\r\n");
    (out.freeze(), chunked)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint() -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], 9001))
    }

    #[test]
    fn a_request_head_becomes_an_http2_request() {
        let head = b"POST /svc.Greeter/Hello?x=1 HTTP/1.1\r\nHost: api.test:8443\r\nContent-Type: application/grpc\r\nTE: trailers\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\nX-Forwarded-For: 10.0.0.1\r\n\r\n";
        let (req, body) = to_h2_request(head, false, endpoint()).unwrap();
        assert_eq!(req.method(), http::Method::POST);
        assert_eq!(req.uri(), "http://api.test:8443/svc.Greeter/Hello?x=1");
        assert!(matches!(body, RequestBody::Chunked(_)));
        let mut names: Vec<&str> = req.headers().keys().map(|n| n.as_str()).collect();
        names.sort_unstable();
        assert_eq!(names, ["content-type", "te", "x-forwarded-for"]);
        assert_eq!(req.headers()["te"], "trailers");
    }

    #[test]
    fn without_a_host_the_endpoint_is_the_authority() {
        let (req, body) = to_h2_request(
            b"GET / HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
            true,
            endpoint(),
        )
        .unwrap();
        assert_eq!(req.uri(), "https://127.0.0.1:9001/");
        assert!(matches!(body, RequestBody::Length(0)));
        assert!(to_h2_request(
            b"GET / HTTP/1.1\r\nContent-Length: x\r\n\r\n",
            false,
            endpoint()
        )
        .is_err());
    }

    #[test]
    fn a_response_without_a_length_goes_chunked() {
        let response = |status: u16, length: Option<&str>| {
            let mut b = http::Response::builder()
                .status(status)
                .header("grpc-encoding", "identity");
            if let Some(l) = length {
                b = b.header("content-length", l);
            }
            b.body(()).unwrap().into_parts().0
        };
        let (head, chunked) = to_h1_head(&response(200, None), false);
        assert!(chunked);
        assert_eq!(
            &head[..],
            b"HTTP/1.1 200 OK\r\ngrpc-encoding: identity\r\ntransfer-encoding: chunked\r\n\r\n"
        );
        let (head, chunked) = to_h1_head(&response(200, Some("5")), false);
        assert!(!chunked && !head.windows(8).any(|w| w == b"transfer"));
        let (head, chunked) = to_h1_head(&response(200, None), true);
        assert!(!chunked && head.ends_with(b"content-length: 0\r\n\r\n"));
        let (head, _) = to_h1_head(&response(204, None), true);
        assert!(!head.windows(14).any(|w| w == b"content-length"));
    }

    #[test]
    fn backend_protocols_by_name() {
        for p in [
            BackendProtocol::Http1,
            BackendProtocol::H2c,
            BackendProtocol::H2,
        ] {
            assert_eq!(p.name().parse::<BackendProtocol>(), Ok(p));
        }
        assert!("h3".parse::<BackendProtocol>().unwrap_err().contains("h2c"));
    }
}
