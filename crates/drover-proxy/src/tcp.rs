//! TCP mode (`mode = "tcp"`): each client connection is placed once, at accept, on an
//! endpoint the balancer's strategy picks, and its bytes are relayed both ways unread.
//!
//! Placement uses the same `Admission` as HTTP requests, with one connection as the
//! unit: the pick is held for the connection's whole life and never settled, so an
//! endpoint's pending count is its open connections, and `least-conn` and `p2c` compare
//! those; a fixed `max_conns` caps them, with the same queue. `hash` hashes the client's
//! IP address. A connect that fails goes to another endpoint, up to `retries` times,
//! and counts against the endpoint's passive health as an HTTP connect failure does.
//! With `send_proxy_protocol`, each backend connection starts with a header naming the
//! client. With `proxy_protocol`, a connection is first read for the header another
//! balancer sends, as in HTTP mode (`proxy_protocol::read_client`), and the client it
//! names is the one hashed, named on to the backend and logged.
//!
//! With `backend_tls`, each backend connection is a TLS session, as HAProxy's `server …
//! ssl` in `mode tcp`: the client's bytes are relayed in the clear to drover and
//! encrypted towards the backend. A failed handshake counts as a failed connect, and
//! the connection goes to another endpoint.
//!
//! With `tls`, the listener ends the client's TLS (as HAProxy's `bind … ssl crt` in
//! `mode tcp`): the handshake comes first, after a PROXY header, within the header read
//! timeout, with the same certificates, SNI choice, tickets and reloads as an HTTPS
//! listener, and ALPN only as `tls.alpn` lists; what the session carries is relayed, to
//! a plain backend or over `backend_tls` again. The backend is offered by ALPN the
//! protocol the client agreed on, which its bytes speak (an HTTP/2 or gRPC server over
//! TLS takes only sessions that agreed on `h2`), and none when it agreed on none.
//!
//! The relay keeps both directions in one task, each reading only once its last bytes
//! were written (backpressure: a slow reader holds at most one buffer of the other
//! side's data in drover), with a buffer only while bytes flow (an idle connection
//! holds none). When one side finishes sending, its end is passed on as a half-close
//! (`shutdown(SHUT_WR)`) and the other direction goes on alone under the half-close
//! timeout; until then, the idle timeout cuts a connection that moved nothing either
//! way.
//!
//! With SNI routes (`routes/`), the connection's ClientHello is read first, within
//! the header read timeout, and its name picks the balancer that places and relays it
//! with its own settings, counts and access log; the hello's bytes go to the backend
//! first. On a TLS listener, the name the session was made for picks it. A connection
//! no route takes is closed, and counted on the listener's balancer
//! (`drover_tcp_sni_unrouted`).
//!
//! A reload applies to connections accepted after it; a connection keeps the settings
//! it was placed with until it ends, and shutdown waits for it up to the drain timeout.

use crate::access_log::ConnectionRecord;
use crate::admission::Slot;
use crate::conn::ClientStream;
use crate::error::ProxyError;
use crate::options::{HashKey, Timeouts};
use crate::proxy_protocol;
use crate::routes::{Pick, Routes};
use crate::state::{BalancerState, ClientConnection, ThreadCell};
use crate::tls::{self, client_hello};
use crate::upstream;
use crate::upstream::Upstream;
use drover_balance::{clock, Endpoint, PickContext};
use drover_metrics::{BalancerStats, Cause, SniUnrouted};
use drover_registry::WarnLimit;
use std::io;
use std::net::{Shutdown, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tracing::{debug, warn};

/// What one connection adds to its endpoint's pending work: a unit, so pending work is
/// the count of open connections (a request's cost in ns makes no sense here).
const CONNECTION_COST: u64 = 1;

/// Bytes read at once from one side. Held only while bytes flow: a read that finds
/// nothing gives it back.
const RELAY_BUFFER: usize = 64 * 1024;

/// Bytes read at once from one side of a connection relayed to a TLS backend: one TLS
/// record's worth of plaintext.
const TLS_RELAY_BUFFER: usize = 16 * 1024;

/// Warnings about connections that no endpoint took (every TCP balancer shares it).
static UNSERVED_WARNINGS: WarnLimit = WarnLimit::new(Duration::from_secs(1));

/// Serves one accepted client connection in TCP mode.
pub(crate) async fn serve(
    mut client: TcpStream,
    peer: SocketAddr,
    cell: Arc<ThreadCell>,
    _counted: ClientConnection,
) {
    // The settings in force at accept stay this connection's until it ends.
    let thread = cell.load_full();
    let listener = &thread.shared;
    listener.active.fetch_add(1, Relaxed);
    let _active = Open(Arc::clone(&listener.active));
    let accepted = Instant::now();
    // Behind another balancer (`proxy_protocol`): the client is the one its header
    // names, read by the header read timeout as in HTTP mode. Client bytes that came
    // with the header are kept, to go to the backend first.
    let mut early = Vec::new();
    let mut peer = peer;
    if let Some(trusted) = &listener.opts.proxy_protocol {
        let deadline = Instant::now() + listener.opts.timeouts.header_read;
        let named = proxy_protocol::read_client(
            trusted,
            &listener.stats,
            &mut client,
            &mut early,
            peer,
            deadline,
        );
        match named.await {
            Some(named) => peer = named,
            None => return,
        }
    }
    // A TLS listener (`tls`) ends the client's TLS here, within the header read
    // timeout from accept (shared with the PROXY header, as in HTTP mode); what is
    // relayed is what the session carries.
    let mut client = match listener.tls.load_full() {
        Some(certs) => {
            let deadline = accepted + listener.opts.timeouts.header_read;
            let inside = tls::Inside::Bytes;
            // Boxed, as in HTTP mode: a handshake's state would size every connection's
            // future.
            match Box::pin(tls::handshake(&certs, client, &mut early, deadline, inside)).await {
                Ok(session) => {
                    listener.stats.record_tls_handshake();
                    ClientStream::Tls(Box::new(session))
                }
                Err(why) => {
                    listener.stats.record_tls_failure(why);
                    debug!(balancer = %listener.opts.name, %peer, reason = why.as_str(), "TLS handshake failed: closed");
                    return;
                }
            }
        }
        None => ClientStream::Plain(client),
    };
    // With routes, the balancer whose pool, settings and counts serve the connection
    // is the one its ClientHello's name picks (`routes/`). Passed through, the hello is
    // read undecrypted and its bytes go to the backend first, as the PROXY header's
    // followers do; on a TLS listener, the name is the session's.
    let routes = listener.routes.load_full();
    let shared = match routes.as_deref() {
        // HTTP routes are for HTTP listeners (the config's rule).
        None | Some(Routes::Http(_)) => Arc::clone(listener),
        Some(Routes::Sni(routes)) => {
            let name = match &mut client {
                ClientStream::Tls(session) => {
                    Ok(session.get_ref().1.server_name().map(str::to_owned))
                }
                ClientStream::Plain(tcp) => {
                    let deadline = accepted + listener.opts.timeouts.header_read;
                    client_hello::server_name(tcp, &mut early, deadline).await
                }
                // TCP mode reads no HTTP/2.
                ClientStream::H2(_) => Err(SniUnrouted::NotTls),
            };
            let picked = match &name {
                Ok(name) => match routes.pick(name.as_deref()) {
                    Pick::Route(target) => Ok(target.current.load_full()),
                    Pick::Listener => Ok(Arc::clone(listener)),
                    Pick::Nowhere => Err(SniUnrouted::NoRoute),
                },
                Err(why) => Err(*why),
            };
            match picked {
                Ok(shared) => shared,
                Err(why) => {
                    // Debug only: a scanner's garbage is no operator's concern, and
                    // the metric counts each.
                    listener.stats.record_sni_unrouted(why);
                    let name = name.ok().flatten();
                    debug!(balancer = %listener.opts.name, %peer, ?name, "tcp connection closed unrouted: {}", why.as_str());
                    return;
                }
            }
        }
    };
    // Counted open on the balancer that serves it too, so its drain waits for it.
    let _served = (!Arc::ptr_eq(&shared, listener)).then(|| {
        shared.active.fetch_add(1, Relaxed);
        Open(Arc::clone(&shared.active))
    });
    let shared = &*shared;
    // Where the client reached drover, for a PROXY protocol header to the backend.
    let local = client
        .local_addr()
        .or_else(|e| listener.opts.listen.ok_or(e));
    let local = local.unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
    // The protocol the client agreed on with drover by ALPN (`tls.alpn`), which its
    // bytes speak: offered on to a TLS backend.
    let alpn = match &client {
        ClientStream::Tls(session) => session.get_ref().1.alpn_protocol().map(<[u8]>::to_vec),
        _ => None,
    };
    let placed = place(shared, peer, local, alpn.as_deref()).await;
    let mut line = Line {
        accepted,
        client: peer,
        endpoint: None,
        relayed: Relayed::default(),
        queue: placed.queue,
        connect: None,
        retries: placed.retries,
        end: "unserved",
        error: None,
    };
    let (mut backend, slot) = match placed.outcome {
        Ok(connected) => connected,
        Err(cause) => {
            line.error = Some(cause.as_str());
            line.write(shared);
            return;
        }
    };
    shared.stats.record_tcp_connection();
    line.endpoint = Some(slot.pick().endpoint().addr());
    line.connect = placed.connect;
    let relayed = match pass_early(&mut backend, &early, &shared.opts.timeouts).await {
        Ok(()) => {
            shared.stats.record_tcp_bytes_in(early.len() as u64);
            let timeouts = &shared.opts.timeouts;
            let mut relayed = match (client, backend) {
                (ClientStream::Plain(client), Upstream::Plain(backend)) => {
                    relay(&client, &backend, timeouts, &shared.stats).await
                }
                // TLS on either side (`tls`, `backend_tls`); HTTP/2 is never spoken
                // in TCP mode.
                (client, backend) => relay_io(client, backend, timeouts, &shared.stats).await,
            };
            relayed.received += early.len() as u64;
            relayed
        }
        Err(e) => {
            debug!(%peer, "tcp relay, client to backend: {e}");
            Relayed {
                ended: Ended::Failed,
                ..Relayed::default()
            }
        }
    };
    debug!(%peer, endpoint = %slot.pick().endpoint().addr(), ended = ?relayed.ended, "tcp connection ended");
    line.end = relayed.ended.as_str();
    line.relayed = relayed;
    line.write(shared);
}

/// What a connection's access log line says, gathered as it goes.
struct Line {
    accepted: Instant,
    client: SocketAddr,
    endpoint: Option<SocketAddr>,
    relayed: Relayed,
    queue: Duration,
    connect: Option<Duration>,
    retries: u32,
    end: &'static str,
    error: Option<&'static str>,
}

impl Line {
    /// Hands the line to the balancer's access log, if it has one.
    fn write(&self, shared: &BalancerState) {
        let Some(log) = &shared.access_log else {
            return;
        };
        let client = self.client.ip().to_canonical().to_string();
        log.log_connection(&ConnectionRecord {
            time: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default(),
            client: &client,
            endpoint: self.endpoint,
            received: self.relayed.received,
            sent: self.relayed.sent,
            duration: self.accepted.elapsed(),
            queue: self.queue,
            connect: self.connect,
            retries: self.retries,
            end: self.end,
            error: self.error,
        });
    }
}

/// Writes the client's bytes that arrived with its PROXY header to `backend`, before
/// the relay reads more: bounded by the idle timeout, as any relayed write is.
async fn pass_early(
    backend: &mut (impl AsyncWrite + Unpin),
    early: &[u8],
    timeouts: &Timeouts,
) -> io::Result<()> {
    if early.is_empty() {
        return Ok(());
    }
    match tokio::time::timeout(timeouts.idle, backend.write_all(early)).await {
        Ok(written) => written,
        Err(_) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "the backend took nothing within the idle timeout",
        )),
    }
}

/// Counts an open client connection of the listener until dropped (drain waits for 0).
struct Open(Arc<AtomicUsize>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
    }
}

/// Where a client connection went (or why nowhere), and what placing it took.
struct Placed {
    /// A connected endpoint (over TLS with `backend_tls`), with the slot that counts the
    /// connection against it; or the cause (counted) of a connection no endpoint took.
    outcome: Result<(Upstream, Slot), Cause>,
    /// Waited for a slot under `max_conns`, over every try.
    queue: Duration,
    /// The connect (and PROXY header sent) of the endpoint that took it.
    connect: Option<Duration>,
    retries: u32,
}

/// Places the client at `peer` on a connected endpoint (see the module docs).
async fn place(
    shared: &BalancerState,
    peer: SocketAddr,
    local: SocketAddr,
    alpn: Option<&[u8]>,
) -> Placed {
    // `backend_tls`, offering the client's protocol when it agreed on one.
    let offered = alpn.and_then(|p| shared.opts.backend_tls.as_deref().map(|c| c.offering(p)));
    let backend_tls = offered.as_deref().or(shared.opts.backend_tls.as_deref());
    let hash_key = match shared.opts.hash_key {
        // As the HTTP side names it (`ClientInfo`): an IPv4 client of a `[::]` listener too.
        Some(HashKey::ClientIp) => Some(peer.ip().to_canonical().to_string()),
        // The config refuses other keys in TCP mode: there is no request to read them from.
        _ => None,
    };
    let mut tried: Vec<Arc<Endpoint>> = Vec::new();
    let mut last_failure = None;
    let mut queue = Duration::ZERO;
    // Connects tried: the retries are all but the first.
    let mut attempts: u32 = 0;
    // Failures that spend a retry (`retries`): all but refused connects.
    let mut spent: u32 = 0;
    // When drover first ran short of descriptors for this connection.
    let mut short_since = None;
    let failure = loop {
        let ctx = PickContext {
            now: clock::now(),
            cost: CONNECTION_COST,
            guess: 0,
            route: 0,
            hash_key: hash_key.as_deref().map(str::as_bytes),
            pinned: None,
            exclude: &tried,
            previous: None,
            pooled: None,
        };
        let asked = Instant::now();
        let acquired = shared.admission.acquire(&ctx).await;
        queue += asked.elapsed();
        let slot = match acquired {
            Ok(slot) => slot,
            // Every endpoint was tried: report the last real failure, not "none healthy".
            Err(e) => break last_failure.unwrap_or(e),
        };
        let endpoint = Arc::clone(slot.pick().endpoint());
        let timeout = shared.opts.timeouts.connect;
        let connecting = Instant::now();
        attempts += 1;
        // `send_proxy_protocol`: the backend learns the client before its first byte;
        // `backend_tls`: the handshake, within the same connect timeout, and a failed
        // one held against the endpoint as a failed connect.
        let connected = upstream::connect_upstream(
            &endpoint,
            &shared.pool,
            &shared.stats,
            timeout,
            slot.pick().started(),
            shared
                .opts
                .send_proxy_protocol
                .map(|version| (version, peer, local)),
            backend_tls,
        )
        .await;
        match connected {
            Ok(stream) => {
                shared.pool.on_success(&endpoint, clock::now());
                return Placed {
                    outcome: Ok((stream, slot)),
                    queue,
                    connect: Some(connecting.elapsed()),
                    retries: attempts.saturating_sub(1),
                };
            }
            Err(ProxyError::LocalResources) => {
                // drover's own shortage: no retry spent, the endpoint stays a candidate
                // (as for an HTTP request; see `conn/exchange.rs`).
                let now = clock::now();
                let since = *short_since.get_or_insert(now);
                if now.saturating_sub(since) >= clock::nanos(timeout) {
                    break ProxyError::LocalResources;
                }
                drop(slot);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(e) => {
                // A refused connect spends no retry (as for an HTTP request; see
                // `conn/exchange.rs`): each endpoint is tried once.
                if e != ProxyError::ConnectRefused {
                    spent += 1;
                }
                if spent > shared.opts.retries {
                    break e;
                }
                shared.stats.record_retry(e.metric_cause());
                last_failure = Some(e);
                tried.push(endpoint);
            }
        }
    };
    shared.stats.record_tcp_unserved(failure.metric_cause());
    if let Some(held_back) = UNSERVED_WARNINGS.check_now() {
        warn!(balancer = %shared.opts.name, cause = failure.cause(), %peer, held_back, "tcp connection closed unserved: {failure}");
    }
    Placed {
        outcome: Err(failure.metric_cause()),
        queue,
        connect: None,
        retries: attempts.saturating_sub(1),
    }
}

/// How a relayed connection ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ended {
    /// Both sides finished sending, and every byte was passed on.
    Done,
    /// Nothing moved either way for the idle timeout.
    Idle,
    /// One side had finished, and nothing moved the other way for the half-close timeout.
    HalfClosed,
    /// A read or write failed (a reset, a peer that closed while the other still sent).
    Failed,
}

impl Ended {
    /// As an access log line says it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Ended::Done => "done",
            Ended::Idle => "idle",
            Ended::HalfClosed => "half-close",
            Ended::Failed => "failed",
        }
    }
}

/// How a relay ended, and the bytes it moved each way.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Relayed {
    pub ended: Ended,
    /// From the client to the backend.
    pub received: u64,
    /// From the backend to the client.
    pub sent: u64,
}

impl Default for Relayed {
    fn default() -> Relayed {
        Relayed {
            ended: Ended::Done,
            received: 0,
            sent: 0,
        }
    }
}

/// Relays bytes between `client` and `backend` until both directions are done, one
/// fails, or a timeout cuts it (see the module docs).
pub(crate) async fn relay(
    client: &TcpStream,
    backend: &TcpStream,
    timeouts: &Timeouts,
    stats: &BalancerStats,
) -> Relayed {
    let p = Progress::new(stats);
    let up = pipe(client, backend, &p.last, p.start, |n| p.received(n));
    let down = pipe(backend, client, &p.last, p.start, |n| p.sent(n));
    p.until_done(up, down, timeouts).await
}

/// As [`relay`], where a side is not a plain socket: a TLS session, the client's
/// (`tls`) or the backend's (`backend_tls`). Each direction reads into a buffer of its
/// own, a TLS record's worth, held for the connection's life (rustls buffers the
/// session's bytes anyway); an end passed on to a TLS side is TLS's close_notify, then
/// the socket's.
async fn relay_io(
    client: impl AsyncRead + AsyncWrite + Unpin,
    backend: impl AsyncRead + AsyncWrite + Unpin,
    timeouts: &Timeouts,
    stats: &BalancerStats,
) -> Relayed {
    let p = Progress::new(stats);
    let (mut client_read, mut client_write) = tokio::io::split(client);
    let (mut backend_read, mut backend_write) = tokio::io::split(backend);
    let up = pipe_io(
        &mut client_read,
        &mut backend_write,
        &p.last,
        p.start,
        |n| p.received(n),
    );
    let down = pipe_io(
        &mut backend_read,
        &mut client_write,
        &p.last,
        p.start,
        |n| p.sent(n),
    );
    p.until_done(up, down, timeouts).await
}

/// A relayed connection's progress: bytes each way, counted for the balancer and for
/// the connection's line, and when bytes last moved.
struct Progress<'a> {
    stats: &'a BalancerStats,
    // Atomics only to be `Sync` (the task is spawned): one thread touches them.
    received: AtomicU64,
    sent: AtomicU64,
    start: Instant,
    /// Nanoseconds since `start` of the last bytes moved (or end passed on) either way.
    last: AtomicU64,
}

impl<'a> Progress<'a> {
    fn new(stats: &'a BalancerStats) -> Self {
        Progress {
            stats,
            received: AtomicU64::new(0),
            sent: AtomicU64::new(0),
            start: Instant::now(),
            last: AtomicU64::new(0),
        }
    }

    /// Runs the two directions to their end (`relay_until_done`), and says how it went.
    async fn until_done(
        &self,
        up: impl std::future::Future<Output = io::Result<()>>,
        down: impl std::future::Future<Output = io::Result<()>>,
        timeouts: &Timeouts,
    ) -> Relayed {
        let ended = relay_until_done(up, down, &self.last, self.start, timeouts).await;
        Relayed {
            ended,
            received: self.received.load(Relaxed),
            sent: self.sent.load(Relaxed),
        }
    }

    fn received(&self, n: u64) {
        self.stats.record_tcp_bytes_in(n);
        self.received.fetch_add(n, Relaxed);
    }

    fn sent(&self, n: u64) {
        self.stats.record_tcp_bytes_out(n);
        self.sent.fetch_add(n, Relaxed);
    }
}

/// Runs both directions until both are done, one fails, or a timeout cuts the
/// connection: the idle timeout while both flow, the half-close timeout once one is
/// done, each from the last bytes moved (`last`, nanoseconds since `start`).
async fn relay_until_done(
    up: impl std::future::Future<Output = io::Result<()>>,
    down: impl std::future::Future<Output = io::Result<()>>,
    last: &AtomicU64,
    start: Instant,
    timeouts: &Timeouts,
) -> Ended {
    tokio::pin!(up, down);
    let (mut up_done, mut down_done) = (false, false);
    loop {
        let limit = if up_done || down_done {
            timeouts.half_close
        } else {
            timeouts.idle
        };
        let deadline = start + Duration::from_nanos(last.load(Relaxed)) + limit;
        if Instant::now() >= deadline {
            return if up_done || down_done {
                Ended::HalfClosed
            } else {
                Ended::Idle
            };
        }
        tokio::select! {
            r = &mut up, if !up_done => match r {
                Ok(()) => up_done = true,
                Err(e) => {
                    debug!("tcp relay, client to backend: {e}");
                    return Ended::Failed;
                }
            },
            r = &mut down, if !down_done => match r {
                Ok(()) => down_done = true,
                Err(e) => {
                    debug!("tcp relay, backend to client: {e}");
                    return Ended::Failed;
                }
            },
            // The deadline is looked at again: bytes may have moved meanwhile.
            () = tokio::time::sleep_until(deadline) => {}
        }
        if up_done && down_done {
            return Ended::Done;
        }
    }
}

/// [`pipe`] for streams that are not plain sockets (a TLS session): reads into one
/// buffer of `TLS_RELAY_BUFFER`, writes it all, and passes the end on with `shutdown`.
async fn pipe_io(
    from: &mut (impl AsyncRead + Unpin),
    to: &mut (impl AsyncWrite + Unpin),
    last: &AtomicU64,
    start: Instant,
    count: impl Fn(u64),
) -> io::Result<()> {
    let moved = || last.store(start.elapsed().as_nanos() as u64, Relaxed);
    let mut buf = vec![0u8; TLS_RELAY_BUFFER];
    loop {
        let n = from.read(&mut buf).await?;
        if n == 0 {
            moved();
            return to.shutdown().await;
        }
        to.write_all(&buf[..n]).await?;
        to.flush().await?;
        count(n as u64);
        moved();
    }
}

/// Relays an upgraded HTTP connection (a WebSocket) both ways until both directions
/// end or one fails; no timeout cuts it (an idle WebSocket stays, as under Node's
/// cluster module). `from_backend` is told of each read of the backend's bytes, a sign
/// that the backend lives (see `EndpointStats::record_tunnel_read`). Plain sockets on
/// both sides hold no buffer while idle, where `copy_bidirectional` held 8 KiB each
/// way for the connection's life. Returns the bytes sent to the client.
pub(crate) async fn tunnel(
    client: &mut ClientStream,
    backend: &mut Upstream,
    from_backend: impl Fn() + Sync,
) -> u64 {
    let (start, last) = (Instant::now(), AtomicU64::new(0));
    let to_client = AtomicU64::new(0);
    let sent = |n| {
        to_client.fetch_add(n, Relaxed);
        from_backend();
    };
    match (client, backend) {
        (ClientStream::Plain(client), Upstream::Plain(backend)) => {
            let up = pipe(client, backend, &last, start, |_| {});
            let down = pipe(backend, client, &last, start, sent);
            let _ = tokio::try_join!(up, down);
        }
        (client, backend) => {
            let mut backend = Told {
                inner: backend,
                read: &from_backend,
            };
            if let Ok((_, n)) = tokio::io::copy_bidirectional(client, &mut backend).await {
                to_client.fetch_add(n, Relaxed);
            }
        }
    }
    to_client.into_inner()
}

/// A stream whose reads of bytes are told to `read`.
struct Told<'a, S> {
    inner: &'a mut S,
    read: &'a (dyn Fn() + Sync),
}

impl<S: AsyncRead + Unpin> AsyncRead for Told<'_, S> {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = std::pin::Pin::new(&mut *this.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            (this.read)();
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Told<'_, S> {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<io::Result<usize>> {
        std::pin::Pin::new(&mut *self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::pin::Pin::new(&mut *self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::pin::Pin::new(&mut *self.get_mut().inner).poll_shutdown(cx)
    }
}

/// Copies `from` to `to` until `from` ends, then passes the end on (`to`'s write side
/// is shut down). Reads only once the last read was written in full.
async fn pipe(
    from: &TcpStream,
    to: &TcpStream,
    last: &AtomicU64,
    start: Instant,
    count: impl Fn(u64),
) -> io::Result<()> {
    let moved = || last.store(start.elapsed().as_nanos() as u64, Relaxed);
    let mut buf: Vec<u8> = Vec::new();
    loop {
        from.readable().await?;
        if buf.capacity() == 0 {
            // Not zeroed: `try_read_buf` fills the spare capacity, and zeroing 64 KiB on
            // every wake-up was most of what a short connection's relay cost.
            buf = Vec::with_capacity(RELAY_BUFFER);
        }
        let n = match from.try_read_buf(&mut buf) {
            Ok(0) => {
                moved();
                return socket2::SockRef::from(to).shutdown(Shutdown::Write);
            }
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                // Nothing after all: an idle connection holds no buffer.
                buf = Vec::new();
                continue;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        let mut written = 0;
        while written < n {
            to.writable().await?;
            match to.try_write(&buf[written..n]) {
                Ok(k) => written += k,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                    ) => {}
                Err(e) => return Err(e),
            }
        }
        buf.clear();
        count(n as u64);
        moved();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// A connected pair of sockets: (the end drover holds, the peer's end).
    async fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let (a, b) = tokio::join!(TcpStream::connect(addr), l.accept());
        (b.unwrap().0, a.unwrap())
    }

    fn timeouts(idle: Duration, half_close: Duration) -> Timeouts {
        Timeouts {
            idle,
            half_close,
            ..Timeouts::default()
        }
    }

    #[tokio::test]
    async fn bytes_pass_both_ways_and_a_half_close_is_passed_on() {
        let (client_side, mut client) = pair().await;
        let (backend_side, mut backend) = pair().await;
        let stats = BalancerStats::default();
        let t = timeouts(Duration::from_secs(30), Duration::from_secs(30));
        let relay = relay(&client_side, &backend_side, &t, &stats);
        let peers = async {
            client.write_all(b"ping").await.unwrap();
            // The client is done sending; the backend sees the end after the bytes.
            client.shutdown().await.unwrap();
            let mut got = Vec::new();
            backend.read_to_end(&mut got).await.unwrap();
            assert_eq!(got, b"ping");
            // The other direction still flows after the client's half-close.
            backend.write_all(&vec![7u8; 300_000]).await.unwrap();
            backend.shutdown().await.unwrap();
            let mut answer = Vec::new();
            client.read_to_end(&mut answer).await.unwrap();
            assert_eq!(answer.len(), 300_000);
        };
        let (relayed, ()) = tokio::join!(relay, peers);
        let ended = relayed.ended;
        assert_eq!(ended, Ended::Done);
        let counts = stats.snapshot();
        assert_eq!((counts.tcp_bytes_in, counts.tcp_bytes_out), (4, 300_000));
        assert_eq!((relayed.received, relayed.sent), (4, 300_000));
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_that_moves_nothing_is_cut_at_the_idle_timeout() {
        let (client_side, mut client) = pair().await;
        let (backend_side, mut backend) = pair().await;
        let stats = BalancerStats::default();
        let t = timeouts(Duration::from_secs(60), Duration::from_secs(5));
        let relay = relay(&client_side, &backend_side, &t, &stats);
        let peers = async {
            client.write_all(b"x").await.unwrap();
            let mut one = [0u8; 1];
            backend.read_exact(&mut one).await.unwrap();
        };
        let (relayed, ()) = tokio::join!(relay, peers);
        let ended = relayed.ended;
        assert_eq!(ended, Ended::Idle);
    }

    #[tokio::test(start_paused = true)]
    async fn after_a_half_close_the_other_way_is_cut_at_the_half_close_timeout() {
        let (client_side, mut client) = pair().await;
        let (backend_side, _backend) = pair().await;
        let stats = BalancerStats::default();
        let t = timeouts(Duration::from_secs(60), Duration::from_secs(5));
        let started = Instant::now();
        let relay = relay(&client_side, &backend_side, &t, &stats);
        let peers = async {
            client.shutdown().await.unwrap();
        };
        let (relayed, ()) = tokio::join!(relay, peers);
        let ended = relayed.ended;
        assert_eq!(ended, Ended::HalfClosed);
        // Cut by the half-close timeout, not the idle one (virtual time).
        assert!(started.elapsed() < Duration::from_secs(60));
    }
}
