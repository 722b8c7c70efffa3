//! Keep-alive connections to endpoints, kept per serving thread, and new connections
//! to an endpoint with what their failure tells passive health (HTTP and TCP mode alike).

use crate::error::ProxyError;
use drover_balance::{clock, Endpoint, Nanos};
use drover_metrics::Cause;
use drover_registry::{is_local_shortage, Pool, WarnLimit};
use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::net::TcpStream;

/// An idle backend connection is reused for at most this long, whatever the idle
/// timeout: Node's HTTP server closes a keep-alive connection idle for 5 s (its
/// `keepAliveTimeout`), and a request written into a connection the backend is closing
/// fails with nothing received. Such a request goes again on a new connection
/// (`Conn::attempt`), but only when it is safe to send twice: staying below the common
/// timeouts keeps a POST from meeting the race at all.
const REUSE_MAX_IDLE: Duration = Duration::from_secs(4);

struct Idle {
    stream: TcpStream,
    since: Instant,
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
            idle_timeout: idle_timeout.min(REUSE_MAX_IDLE),
        }
    }

    /// The most recently used live idle connection to `addr`, if any. A connection the
    /// backend closed while idle shows as readable (EOF) and is dropped here, before a
    /// request is written into it; checking costs no syscall when nothing arrived.
    pub fn checkout(&self, addr: SocketAddr) -> Option<TcpStream> {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let conns = idle.get_mut(&addr)?;
        while let Some(c) = conns.pop() {
            if c.since.elapsed() >= self.idle_timeout {
                continue;
            }
            if is_open(&c.stream) {
                return Some(c.stream);
            }
        }
        None
    }

    pub fn checkin(&self, addr: SocketAddr, stream: TcpStream) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let conns = idle.entry(addr).or_default();
        if conns.len() >= self.max_idle {
            conns.remove(0);
        }
        conns.push(Idle {
            stream,
            since: Instant::now(),
        });
    }

    /// Drops idle connections past the idle timeout, and the lists of endpoints that
    /// are gone.
    pub fn sweep(&self) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        idle.retain(|_, conns| {
            conns.retain(|c| c.since.elapsed() < self.idle_timeout);
            !conns.is_empty()
        });
    }
}

/// Whether an idle backend connection is still open: one the backend closed shows as
/// readable (EOF), as does one it wrote to unasked. Costs no syscall when nothing
/// arrived.
pub fn is_open(stream: &TcpStream) -> bool {
    let mut probe = [0u8; 1];
    matches!(stream.try_read(&mut probe), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
}

/// Opens a connection to an endpoint within `timeout`.
pub async fn connect(addr: SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
    let stream = tokio::time::timeout(timeout, TcpStream::connect(addr))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "connect timed out"))??;
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// Warnings about connects that failed (the endpoint's fault, as far as drover can tell).
static CONNECT_FAILURES: WarnLimit = WarnLimit::new(Duration::from_secs(1));

/// Warnings about drover's own shortages on connect, shared by every connection.
static CONNECT_SHORTAGE: WarnLimit = WarnLimit::new(Duration::from_secs(1));

/// A new connection to `endpoint`, bound to it since `bound` (for the connect
/// histogram). A failure is held against the endpoint's passive health in `pool`,
/// unless it was drover's own shortage (`ProxyError::LocalResources`).
pub async fn connect_endpoint(
    endpoint: &Arc<Endpoint>,
    pool: &Pool,
    timeout: Duration,
    bound: Nanos,
) -> Result<TcpStream, ProxyError> {
    let addr = endpoint.addr();
    match connect(addr, timeout).await {
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
            Err(ProxyError::ConnectFailed)
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
