//! One probe of an endpoint: a TCP connect (with bytes to send and bytes the answer must
//! contain, for a service that is not HTTP), or `GET path` and its status. Active checks
//! run it on a timer and the supervisor for a worker's liveness, each through a
//! `Prober`, whose HTTP checks keep their connection from one probe to the next; a
//! worker's readiness is a probe on a connection of its own.

use crate::status::StatusRange;
use std::fmt;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

/// A probe's connection once wrapped: TLS over TCP, for a balancer whose backends speak
/// TLS.
pub trait ProbeStream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> ProbeStream for T {}

/// What [`WrapProbe::wrap`] returns: the wrapped stream, or why it could not be.
pub type WrapFuture<'a> =
    Pin<Box<dyn Future<Output = Result<Box<dyn ProbeStream>, String>> + Send + 'a>>;

/// Turns each probe's new connection to `addr` into what the endpoint speaks, by
/// `deadline` (the probe's own): the TLS handshake of a balancer with `backend_tls`,
/// which lives in drover-proxy. Its error is the reason a failed probe reports.
pub trait WrapProbe: Send + Sync {
    fn wrap<'a>(&'a self, tcp: TcpStream, addr: SocketAddr, deadline: Instant) -> WrapFuture<'a>;

    /// Whether a wrapped connection can carry the next probe once one is answered (TLS
    /// can); one that carries a single exchange (an HTTP/2 stream) says no.
    fn keeps_connection(&self) -> bool {
        true
    }
}

/// How each probe's connection starts: `preamble` written first (a PROXY protocol
/// header), then `wrap` (TLS).
#[derive(Clone, Default)]
pub struct Probing {
    pub preamble: std::sync::Arc<[u8]>,
    pub wrap: Option<std::sync::Arc<dyn WrapProbe>>,
}

impl fmt::Debug for Probing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Probing")
            .field("preamble", &self.preamble.len())
            .field("wrap", &self.wrap.is_some())
            .finish()
    }
}

/// What a probe does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckKind {
    /// `GET path`; up when the status is in `expect`.
    Http {
        /// Request path, starting with `/`.
        path: String,
        /// Passing status codes; default 2xx and 3xx (`StatusRange::SUCCESS`).
        expect: StatusRange,
    },
    /// Up when a TCP connection opens.
    Tcp,
    /// Up when a TCP connection opens and, after `send` is written (nothing when empty:
    /// a service that speaks first, as SMTP or SSH do), what comes back contains
    /// `receive` within its first `MAX_ANSWER` bytes (HAProxy's `tcp-check send` and
    /// `expect string`). Boxed slices: a check sits in every app's spec.
    TcpExchange { send: Box<[u8]>, receive: Box<[u8]> },
    /// The gRPC health checking protocol: up when `grpc.health.v1.Health/Check` for
    /// `service` ("": the server as a whole) answers SERVING. Over HTTP/2 only: a
    /// balancer with `backend_protocol` h2c or h2, whose probes are streams.
    Grpc { service: Box<str> },
}

impl CheckKind {
    /// An HTTP check of `path` expecting 2xx/3xx. A missing leading `/` is added.
    pub fn http(path: impl Into<String>) -> Self {
        let mut path = path.into();
        if !path.starts_with('/') {
            path.insert(0, '/');
        }
        CheckKind::Http {
            path,
            expect: StatusRange::default(),
        }
    }
}

/// Why a probe failed; its `Display` is what the logs say.
#[derive(Debug)]
pub enum ProbeError {
    Timeout(Duration),
    Refused,
    Connect(io::Error),
    /// drover itself is out of descriptors, memory or ports (see `local`): the probe
    /// says nothing about the endpoint.
    LocalShortage(io::Error),
    Io(io::Error),
    /// The connection closed before a whole status line arrived.
    Closed,
    Malformed,
    Status(u16),
    /// The connection could not be wrapped: the TLS handshake failed, and why. Boxed
    /// behind a thin pointer, as `Unexpected`.
    Tls(Box<String>),
    /// A gRPC health check's call failed, or the service is not serving.
    Grpc(Box<crate::grpc_health::GrpcHealthError>),
    /// A TCP exchange's answer (its first bytes, lossy UTF-8) lacked what was expected.
    /// Boxed behind a thin pointer: the error sits in the supervisor's, which must stay
    /// small, and a wide one (`Box<str>`) made every `ProbeError` 8 bytes larger.
    Unexpected(Box<String>),
}

impl fmt::Display for ProbeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProbeError::Timeout(d) => write!(f, "timeout after {d:?}"),
            ProbeError::Refused => f.write_str("connection refused"),
            ProbeError::Connect(e) => write!(f, "connect failed: {e}"),
            ProbeError::LocalShortage(e) => write!(f, "drover is short of resources: {e}"),
            ProbeError::Io(e) => write!(f, "i/o error: {e}"),
            ProbeError::Closed => f.write_str("connection closed before status line"),
            ProbeError::Malformed => f.write_str("malformed status line"),
            ProbeError::Status(s) => write!(f, "status {s}"),
            ProbeError::Tls(why) => write!(f, "TLS handshake failed: {why}"),
            ProbeError::Unexpected(got) => write!(f, "unexpected answer {got:?}"),
            ProbeError::Grpc(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for ProbeError {}

/// How much of a TCP exchange's answer is searched for the expected bytes.
const MAX_ANSWER: usize = 4096;

/// One probe of `addr`, bounded by `timeout` as a whole, on a connection of its own.
/// Public so the supervisor can use it for worker readiness.
pub async fn probe(
    addr: SocketAddr,
    kind: &CheckKind,
    timeout: Duration,
) -> Result<(), ProbeError> {
    probe_sending(addr, &[], kind, timeout).await
}

/// [`probe`], writing `preamble` first once connected (a PROXY protocol header).
pub async fn probe_sending(
    addr: SocketAddr,
    preamble: &[u8],
    kind: &CheckKind,
    timeout: Duration,
) -> Result<(), ProbeError> {
    let probing = Probing {
        preamble: preamble.into(),
        wrap: None,
    };
    probe_with(addr, &probing, kind, timeout).await
}

/// [`probe`], starting each connection as `probing` says.
pub async fn probe_with(
    addr: SocketAddr,
    probing: &Probing,
    kind: &CheckKind,
    timeout: Duration,
) -> Result<(), ProbeError> {
    bounded(timeout, probe_unbounded(addr, probing, kind, timeout, None)).await
}

/// One endpoint's probes in turn. An HTTP check keeps its connection for the next
/// probe when the answer allows it (see `http_probe`), so a busy server answers the
/// probe as it answers requests, not after its listen queue. Other checks open a
/// connection each: a TCP check is about the connect.
#[derive(Default)]
pub struct Prober {
    kept: Option<Box<dyn ProbeStream>>,
}

impl fmt::Debug for Prober {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Prober")
            .field("kept", &self.kept.is_some())
            .finish()
    }
}

impl Prober {
    /// One probe of `addr`, bounded by `timeout` as a whole. A probe that times out
    /// gives its connection up: a late answer must not be read as the next one's.
    pub async fn probe(
        &mut self,
        addr: SocketAddr,
        probing: &Probing,
        kind: &CheckKind,
        timeout: Duration,
    ) -> Result<(), ProbeError> {
        let reuse = matches!(kind, CheckKind::Http { .. })
            && probing.wrap.as_ref().is_none_or(|w| w.keeps_connection());
        let kept = reuse.then_some(&mut self.kept);
        bounded(timeout, probe_unbounded(addr, probing, kind, timeout, kept)).await
    }
}

async fn bounded(
    timeout: Duration,
    probe: impl Future<Output = Result<(), ProbeError>>,
) -> Result<(), ProbeError> {
    match tokio::time::timeout(timeout, probe).await {
        Ok(result) => result,
        Err(_) => Err(ProbeError::Timeout(timeout)),
    }
}

/// A new connection to `addr`, started as `probing` says, by `deadline`.
async fn connect(
    addr: SocketAddr,
    probing: &Probing,
    deadline: Instant,
) -> Result<Box<dyn ProbeStream>, ProbeError> {
    let mut tcp = TcpStream::connect(addr).await.map_err(|e| match e.kind() {
        io::ErrorKind::ConnectionRefused => ProbeError::Refused,
        _ if crate::local::is_local_shortage(&e) => ProbeError::LocalShortage(e),
        _ => ProbeError::Connect(e),
    })?;
    if !probing.preamble.is_empty() {
        tcp.write_all(&probing.preamble)
            .await
            .map_err(ProbeError::Io)?;
    }
    match &probing.wrap {
        Some(wrap) => wrap
            .wrap(tcp, addr, deadline)
            .await
            .map_err(|why| ProbeError::Tls(Box::new(why))),
        None => Ok(Box::new(tcp)),
    }
}

/// One probe. `kept`: an HTTP check's connection slot, taken for this probe and filled
/// again only when the answer leaves the connection fit for the next one.
async fn probe_unbounded(
    addr: SocketAddr,
    probing: &Probing,
    kind: &CheckKind,
    timeout: Duration,
    kept: Option<&mut Option<Box<dyn ProbeStream>>>,
) -> Result<(), ProbeError> {
    let deadline = Instant::now() + timeout;
    let (path, expect) = match kind {
        CheckKind::Http { path, expect } => (path, expect),
        CheckKind::Tcp => return connect(addr, probing, deadline).await.map(drop),
        CheckKind::TcpExchange { send, receive } => {
            let mut stream = connect(addr, probing, deadline).await?;
            return exchange(&mut stream, send, receive).await;
        }
        CheckKind::Grpc { service } => {
            let mut stream = connect(addr, probing, deadline).await?;
            return grpc_check(&mut stream, service, addr).await;
        }
    };
    let keep = kept.is_some();
    let request = crate::http_probe::request(path, addr, keep);
    let (mut reused, slot) = match kept {
        Some(slot) => (slot.take().and_then(still_open), Some(slot)),
        None => (None, None),
    };
    let answer = loop {
        let (mut stream, was_reused) = match reused.take() {
            Some(stream) => (stream, true),
            None => (connect(addr, probing, deadline).await?, false),
        };
        let asked = match stream.write_all(request.as_bytes()).await {
            Ok(()) => crate::http_probe::read_answer(&mut stream, keep).await,
            Err(e) => Err(ProbeError::Io(e)),
        };
        match asked {
            // The backend closed the kept connection as the probe went out (its idle
            // timeout): ask again on a new one, as a pooled request would.
            Err(ProbeError::Closed | ProbeError::Io(_)) if was_reused => continue,
            Err(e) => return Err(e),
            Ok(answer) => {
                if let Some(slot) = slot {
                    *slot = answer.reusable.then_some(stream);
                }
                break answer;
            }
        }
    };
    if expect.contains(answer.status) {
        Ok(())
    } else {
        Err(ProbeError::Status(answer.status))
    }
}

/// Whether a kept connection is still open and silent: the backend closes an idle one
/// after its keep-alive timeout (Node's: 5 s), and says nothing unasked on a live one.
/// The connection back when it is.
fn still_open(mut stream: Box<dyn ProbeStream>) -> Option<Box<dyn ProbeStream>> {
    let mut byte = [0u8; 1];
    let mut buf = tokio::io::ReadBuf::new(&mut byte);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    let silent = Pin::new(&mut *stream)
        .poll_read(&mut cx, &mut buf)
        .is_pending();
    silent.then_some(stream)
}

/// One call of the gRPC health service, its answer read to the stream's end (a few
/// hundred bytes; `MAX_ANSWER` at most).
async fn grpc_check<S: AsyncRead + AsyncWrite + Unpin + ?Sized>(
    stream: &mut S,
    service: &str,
    addr: SocketAddr,
) -> Result<(), ProbeError> {
    let request = crate::grpc_health::request(service, &addr.to_string());
    stream.write_all(&request).await.map_err(ProbeError::Io)?;
    stream.flush().await.map_err(ProbeError::Io)?;
    let mut answer = Vec::with_capacity(256);
    let mut chunk = [0u8; 512];
    while answer.len() < MAX_ANSWER {
        let n = stream.read(&mut chunk).await.map_err(ProbeError::Io)?;
        if n == 0 {
            break;
        }
        answer.extend_from_slice(&chunk[..n]);
    }
    if answer.is_empty() {
        return Err(ProbeError::Closed);
    }
    match crate::grpc_health::verdict(&answer) {
        Ok(()) => Ok(()),
        Err(Ok(status)) => Err(ProbeError::Status(status)),
        Err(Err(e)) => Err(ProbeError::Grpc(Box::new(e))),
    }
}

/// Writes `send`, then reads until the answer contains `receive`, ends, or passes
/// `MAX_ANSWER` bytes.
async fn exchange<S: AsyncRead + AsyncWrite + Unpin + ?Sized>(
    stream: &mut S,
    send: &[u8],
    receive: &[u8],
) -> Result<(), ProbeError> {
    stream.write_all(send).await.map_err(ProbeError::Io)?;
    let mut answer = Vec::with_capacity(256);
    let mut chunk = [0u8; 512];
    loop {
        if contains(&answer, receive) {
            return Ok(());
        }
        let n = if answer.len() < MAX_ANSWER {
            stream.read(&mut chunk).await.map_err(ProbeError::Io)?
        } else {
            0
        };
        if n == 0 {
            let shown = &answer[..answer.len().min(64)];
            return Err(ProbeError::Unexpected(Box::new(
                String::from_utf8_lossy(shown).into_owned(),
            )));
        }
        answer.extend_from_slice(&chunk[..n]);
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    needle.is_empty() || haystack.windows(needle.len()).any(|w| w == needle)
}
