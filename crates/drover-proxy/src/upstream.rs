//! Keep-alive connections to endpoints, kept per serving thread, and new connections
//! to an endpoint with what their failure tells passive health (HTTP and TCP mode alike).
//! A connection is plain TCP, or TLS over it for a balancer with `backend_tls`
//! (`Upstream`); the pool holds either.

use crate::backend_tls::Connector;
use crate::error::ProxyError;
use drover_balance::{clock, Endpoint, Nanos, Pooled};
use drover_metrics::Cause;
use drover_registry::{is_local_shortage, Pool, WarnLimit};
use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

/// A connection to a backend: plain, or TLS (`backend_tls`); or one HTTP/2 stream on
/// a connection shared by the thread's requests to that backend (`backend_protocol`,
/// `http2::backend`). An enum as the client's side is (`conn/client.rs`): a plain
/// connection pays a branch per read or write, and the boxed state only where TLS or
/// HTTP/2 is spoken.
pub enum Upstream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
    H2(Box<crate::http2::backend::H2Exchange>),
}

impl Upstream {
    /// The TCP connection under it; `None` for an HTTP/2 stream, which has one of its own
    /// only in the connection's task.
    pub fn tcp(&self) -> Option<&TcpStream> {
        match self {
            Upstream::Plain(s) => Some(s),
            Upstream::Tls(s) => Some(s.get_ref().0),
            Upstream::H2(_) => None,
        }
    }
}

impl Upstream {
    /// Whether the backend never processed the request sent on it, whatever was
    /// written: an HTTP/2 stream it refused (`H2Exchange::never_processed`). An
    /// HTTP/1.1 connection cannot tell.
    pub fn never_processed(&self) -> bool {
        match self {
            Upstream::H2(s) => s.never_processed(),
            Upstream::Plain(_) | Upstream::Tls(_) => false,
        }
    }

    /// Why the TLS session failed, if it did. Under TLS 1.3 the client's handshake is
    /// done before the server has read the client's certificate: a server that wants
    /// one and got none (or one it does not take) says so with an alert in place of the
    /// response, which rustls keeps and tells here.
    pub fn tls_failure(&mut self) -> Option<crate::backend_tls::Failure> {
        match self {
            Upstream::Plain(_) | Upstream::H2(_) => None,
            Upstream::Tls(s) => s
                .get_mut()
                .1
                .process_new_packets()
                .err()
                .map(|e| crate::backend_tls::failure_of(&e)),
        }
    }
}

impl AsyncRead for Upstream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Upstream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Upstream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
            Upstream::H2(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Upstream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Upstream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Upstream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
            Upstream::H2(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Upstream::Plain(s) => Pin::new(s).poll_flush(cx),
            Upstream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
            Upstream::H2(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Upstream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Upstream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
            Upstream::H2(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Upstream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Upstream::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
            Upstream::H2(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Upstream::Plain(s) => s.is_write_vectored(),
            Upstream::Tls(s) => s.is_write_vectored(),
            Upstream::H2(_) => false,
        }
    }
}

/// An idle backend connection whose backend did not say how long it keeps it is reused
/// for at most this long, whatever the idle timeout: Node's HTTP server closes a
/// keep-alive connection idle for 5 s (its `keepAliveTimeout`), and a request written
/// into a connection the backend is closing fails with nothing received. Such a request
/// goes again on a new connection (`Conn::attempt`), but only when it is safe to send
/// twice: staying below the common timeouts keeps a POST from meeting the race at all.
const REUSE_MAX_IDLE: Duration = Duration::from_secs(4);

/// A backend that says how long it keeps an idle connection (`Keep-Alive: timeout=N`,
/// which Node sends with every keep-alive response) has it reused until this much
/// before then, for the same race (undici, Node's `fetch`, takes such a hint less a
/// margin too: its `keepAliveTimeoutThreshold`).
///
/// Why not always 4 s: a connection dropped while idle is a new one the next time, and
/// a Node worker busy with CPU work accepts new connections a few per turn of its event
/// loop and serves the connections it already has first. After 12 s without traffic,
/// drover's 47 requests went out on new connections to two Node backends that keep
/// theirs for 300 s, sat unread for up to 2 s, and the run's p99 was 2.3 s; nginx,
/// whose connections were still open, had 0.5 s.
const KEEP_ALIVE_MARGIN: Duration = Duration::from_secs(1);

struct Idle {
    stream: Upstream,
    /// When it is no longer reused.
    until: Instant,
}

/// Idle backend connections of one serving thread. Each thread has its own, so the lock
/// is never contended; it exists only because tokio tasks must be `Send`.
pub struct Upstreams {
    idle: Mutex<HashMap<SocketAddr, Vec<Idle>>>,
    max_idle: usize,
    idle_timeout: Duration,
}

impl Upstreams {
    pub fn new(max_idle: usize, idle_timeout: Duration) -> Self {
        Upstreams {
            idle: Mutex::new(HashMap::new()),
            max_idle,
            idle_timeout,
        }
    }

    /// The most recently used live idle connection to `addr`, if any. A connection the
    /// backend closed while idle shows as readable (EOF) and is dropped here, before a
    /// request is written into it; checking costs no syscall when nothing arrived.
    pub fn checkout(&self, addr: SocketAddr) -> Option<Upstream> {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let conns = idle.get_mut(&addr)?;
        let now = Instant::now();
        while let Some(c) = conns.pop() {
            if now >= c.until {
                continue;
            }
            if c.stream.tcp().is_some_and(is_open) {
                return Some(c.stream);
            }
        }
        None
    }

    /// Whether an idle connection to `addr` is kept and not yet past its reuse time (a
    /// guess, without the syscall `checkout` makes: the backend may have closed it).
    fn has_idle(&self, addr: SocketAddr) -> bool {
        let idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        idle.get(&addr)
            .and_then(|conns| conns.last())
            .is_some_and(|c| Instant::now() < c.until)
    }

    /// Keeps `stream` for reuse. `keep_alive_timeout` is what its backend said of how
    /// long it keeps an idle connection (seconds), if it did.
    pub fn checkin(&self, addr: SocketAddr, stream: Upstream, keep_alive_timeout: Option<u32>) {
        let reuse_for = match keep_alive_timeout {
            Some(secs) => Duration::from_secs(secs.into()).saturating_sub(KEEP_ALIVE_MARGIN),
            None => REUSE_MAX_IDLE,
        }
        .min(self.idle_timeout);
        if reuse_for.is_zero() {
            return;
        }
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let conns = idle.entry(addr).or_default();
        if conns.len() >= self.max_idle {
            conns.remove(0);
        }
        conns.push(Idle {
            stream,
            until: Instant::now() + reuse_for,
        });
    }

    /// Drops idle connections past the idle timeout, and the lists of endpoints that
    /// are gone.
    pub fn sweep(&self) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        idle.retain(|_, conns| {
            let now = Instant::now();
            conns.retain(|c| now < c.until);
            !conns.is_empty()
        });
    }
}

impl Pooled for Upstreams {
    fn has_idle(&self, endpoint: &Endpoint) -> bool {
        Upstreams::has_idle(self, endpoint.addr())
    }
}

/// Whether an idle backend connection is still open: one the backend closed shows as
/// readable (EOF), as does one it wrote to unasked. Costs no syscall when nothing
/// arrived. Under TLS the bytes read here are lost to the session, which is why any
/// byte at all means the connection is not reused: an idle TLS connection's only
/// traffic is a close_notify before the FIN.
pub fn is_open(stream: &TcpStream) -> bool {
    let mut probe = [0u8; 1];
    matches!(stream.try_read(&mut probe), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
}

/// Opens a connection to an endpoint by `deadline`.
async fn connect_by(addr: SocketAddr, deadline: tokio::time::Instant) -> io::Result<TcpStream> {
    let stream = tokio::time::timeout_at(deadline, TcpStream::connect(addr))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "connect timed out"))??;
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// Warnings about connects that failed (the endpoint's fault, as far as drover can tell).
static CONNECT_FAILURES: WarnLimit = WarnLimit::new(Duration::from_secs(1));

/// Warnings about drover's own shortages on connect, shared by every connection.
static CONNECT_SHORTAGE: WarnLimit = WarnLimit::new(Duration::from_secs(1));

/// A new connection to `endpoint` by `deadline`, bound to it since `bound` (for the
/// connect histogram). A failure is held against the endpoint's passive health in
/// `pool`, unless it was drover's own shortage (`ProxyError::LocalResources`).
async fn connect_endpoint_by(
    endpoint: &Arc<Endpoint>,
    pool: &Pool,
    deadline: tokio::time::Instant,
    bound: Nanos,
) -> Result<TcpStream, ProxyError> {
    let addr = endpoint.addr();
    match connect_by(addr, deadline).await {
        Ok(stream) => {
            endpoint
                .stats()
                .record_connect(clock::now().saturating_sub(bound));
            Ok(stream)
        }
        Err(e) if is_local_shortage(&e) => {
            // drover's own shortage: the endpoint is not to blame.
            if let Some(held_back) = CONNECT_SHORTAGE.check_now() {
                tracing::warn!(endpoint = %addr, error = %e, held_back, "cannot connect, drover is out of resources; not counted against the endpoint");
            }
            Err(ProxyError::LocalResources)
        }
        Err(e) => {
            endpoint.stats().record_failure(Cause::ConnectFailed);
            // Refused: nothing listens. Timed out: the backend's listen backlog
            // overflowed and dropped the SYN, so it is busy, and the last endpoint
            // that still answers must stay in rotation.
            let ejected = if e.kind() == io::ErrorKind::TimedOut {
                pool.on_connect_timeout(endpoint, clock::now())
            } else {
                pool.on_connect_failure(endpoint, clock::now())
            };
            // Each ejection is logged where it happens; a failure that hits every
            // request at once is told once a second, with the count it stands for.
            if let Some(held_back) = CONNECT_FAILURES.check_now() {
                tracing::warn!(endpoint = %addr, error = %e, ejected_for = ?ejected, held_back, "connect failed");
            }
            Err(match e.kind() {
                io::ErrorKind::ConnectionRefused
                | io::ErrorKind::HostUnreachable
                | io::ErrorKind::NetworkUnreachable => ProxyError::ConnectRefused,
                _ => ProxyError::ConnectFailed,
            })
        }
    }
}

/// Starts a new backend connection with a PROXY protocol header naming `client`, who
/// reached drover at `local` (`send_proxy_protocol`). A header that cannot be written
/// counts as a failed connect: nothing of the client's reached the backend.
pub async fn send_proxy_header(
    stream: &mut TcpStream,
    endpoint: &Endpoint,
    version: crate::proxy_protocol::SendVersion,
    client: SocketAddr,
    local: SocketAddr,
) -> Result<(), ProxyError> {
    use tokio::io::AsyncWriteExt;
    let header = crate::proxy_protocol::header(version, client, local);
    stream.write_all(&header).await.map_err(|e| {
        tracing::debug!(endpoint = %endpoint.addr(), "cannot send the PROXY protocol header: {e}");
        endpoint.stats().record_failure(Cause::ConnectFailed);
        ProxyError::ConnectFailed
    })
}

/// Warnings about TLS handshakes with backends that failed.
static TLS_FAILURES: WarnLimit = WarnLimit::new(Duration::from_secs(1));

/// A new HTTP connection to `endpoint`: connected, with the PROXY protocol header
/// `header` written first when there is one, then the TLS handshake when `tls` is given,
/// all within `timeout` (the connect timeout). A handshake that fails counts against
/// the endpoint's passive health as a failed connect does: the endpoint cannot be used.
pub async fn connect_upstream(
    endpoint: &Arc<Endpoint>,
    pool: &Pool,
    stats: &drover_metrics::BalancerStats,
    timeout: Duration,
    bound: Nanos,
    header: Option<(crate::proxy_protocol::SendVersion, SocketAddr, SocketAddr)>,
    tls: Option<&Connector>,
) -> Result<Upstream, ProxyError> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut tcp = connect_endpoint_by(endpoint, pool, deadline, bound).await?;
    if let Some((version, client, local)) = header {
        send_proxy_header(&mut tcp, endpoint, version, client, local).await?;
    }
    let Some(tls) = tls else {
        return Ok(Upstream::Plain(tcp));
    };
    match tls.handshake(tcp, endpoint.addr(), deadline).await {
        Ok(stream) => Ok(Upstream::Tls(Box::new(stream))),
        Err(why) => Err(tls_failed(endpoint, pool, stats, why)),
    }
}

/// A TLS session with `endpoint` that failed, held against it as a failed connect (it
/// cannot be used), counted by its reason, logged once a second at most.
pub fn tls_failed(
    endpoint: &Arc<Endpoint>,
    pool: &Pool,
    stats: &drover_metrics::BalancerStats,
    why: crate::backend_tls::Failure,
) -> ProxyError {
    stats.record_backend_tls_failure(why);
    endpoint.stats().record_failure(Cause::BackendTls);
    let ejected = pool.on_connect_failure(endpoint, clock::now());
    if let Some(held_back) = TLS_FAILURES.check_now() {
        tracing::warn!(endpoint = %endpoint.addr(), reason = why.as_str(), ejected_for = ?ejected, held_back, "TLS with the backend failed: {why}");
    }
    ProxyError::BackendTls(why)
}
