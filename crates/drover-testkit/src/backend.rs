//! A scriptable HTTP/1.1 backend: the request path picks the behaviour, so
//! one backend serves every scenario (see the crate docs for the routes).

use crate::http::{self, BodyKind, BufConn, HeaderList, RequestHead};
use crate::ws;
use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// How many request heads the log keeps (oldest dropped first).
const HEAD_LOG_CAP: usize = 1000;
/// Chunk size for `/big/N`.
const BIG_CHUNK: usize = 16 * 1024;

/// A running backend. Dropping it aborts the listener and every connection.
pub struct Backend {
    addr: SocketAddr,
    shared: Arc<BackendState>,
    tasks: Arc<Tasks>,
}

/// Options for a backend before it binds; see [`Backend::named`].
#[derive(Clone, Debug, Default)]
pub struct BackendBuilder {
    name: Option<String>,
}

struct BackendState {
    name: String,
    healthy: AtomicBool,
    hang_health: AtomicBool,
    /// Utilisation reported on every response (`endpoint-load-metrics`), if set.
    load_report: Mutex<Option<f64>>,
    hits: AtomicU64,
    connections: AtomicU64,
    open_connections: AtomicU64,
    in_flight: AtomicU64,
    max_in_flight: AtomicU64,
    by_path: Mutex<HashMap<String, u64>>,
    heads: Mutex<VecDeque<RequestHead>>,
    /// Set by the first `/stall-once/MS`: no response leaves before this time.
    paused_until: Mutex<Option<tokio::time::Instant>>,
}

/// Every task the backend spawned, so `stop()` can kill them all at once.
#[derive(Default)]
struct Tasks {
    accept: Mutex<Option<JoinHandle<()>>>,
    conns: Mutex<Vec<JoinHandle<()>>>,
}

/// A poisoned lock only means another test thread panicked; the data is
/// still fine for counting, so never propagate the poison.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl BackendBuilder {
    /// Binds 127.0.0.1:0.
    pub async fn start(self) -> Backend {
        let addr: SocketAddr = ([127, 0, 0, 1], 0).into();
        self.start_on(addr)
            .await
            .unwrap_or_else(|e| panic!("testkit backend: cannot bind 127.0.0.1:0: {e}"))
    }

    /// Binds a given address, e.g. the one of a backend that was stopped.
    pub async fn start_on(self, addr: SocketAddr) -> io::Result<Backend> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(BackendState {
            name: self.name.unwrap_or_else(|| addr.to_string()),
            healthy: AtomicBool::new(true),
            hang_health: AtomicBool::new(false),
            load_report: Mutex::new(None),
            hits: AtomicU64::new(0),
            connections: AtomicU64::new(0),
            open_connections: AtomicU64::new(0),
            in_flight: AtomicU64::new(0),
            max_in_flight: AtomicU64::new(0),
            by_path: Mutex::new(HashMap::new()),
            heads: Mutex::new(VecDeque::new()),
            paused_until: Mutex::new(None),
        });
        let tasks = Arc::new(Tasks::default());
        let accept = tokio::spawn(accept_loop(listener, shared.clone(), tasks.clone()));
        *lock(&tasks.accept) = Some(accept);
        Ok(Backend {
            addr,
            shared,
            tasks,
        })
    }
}

impl Backend {
    /// Starts an unnamed backend on 127.0.0.1:0 (its name is its address).
    pub async fn start() -> Backend {
        BackendBuilder::default().start().await
    }

    /// Starts an unnamed backend on `addr` (to come back on the same port).
    pub async fn start_on(addr: SocketAddr) -> io::Result<Backend> {
        BackendBuilder::default().start_on(addr).await
    }

    /// A builder for a backend whose name (body of `/`, `x-backend` header)
    /// is `name`: `Backend::named("b1").start().await`.
    pub fn named(name: &str) -> BackendBuilder {
        BackendBuilder {
            name: Some(name.to_string()),
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// Requests received (heads fully read), `/health` included.
    pub fn hits(&self) -> u64 {
        self.shared.hits.load(Ordering::SeqCst)
    }

    /// Requests received other than `/health`: what a load-spread test
    /// wants when health checks run in the background.
    pub fn hits_except_health(&self) -> u64 {
        self.hits() - self.hits_for("/health")
    }

    /// Requests whose path (target without the query string) is `path`.
    pub fn hits_for(&self, path: &str) -> u64 {
        lock(&self.shared.by_path).get(path).copied().unwrap_or(0)
    }

    /// TCP connections accepted since start.
    pub fn connections(&self) -> u64 {
        self.shared.connections.load(Ordering::SeqCst)
    }

    /// TCP connections open right now.
    pub fn open_connections(&self) -> u64 {
        self.shared.open_connections.load(Ordering::SeqCst)
    }

    /// Requests read but not yet fully answered (hanging ones included).
    pub fn in_flight(&self) -> u64 {
        self.shared.in_flight.load(Ordering::SeqCst)
    }

    /// The highest `in_flight` seen since start or `reset_stats`: lets a
    /// test check that the balancer never exceeded a concurrency limit.
    pub fn max_in_flight(&self) -> u64 {
        self.shared.max_in_flight.load(Ordering::SeqCst)
    }

    /// The most recent request head.
    pub fn last_request_head(&self) -> Option<RequestHead> {
        lock(&self.shared.heads).back().cloned()
    }

    /// Recent request heads, oldest first (the last 1000).
    pub fn request_heads(&self) -> Vec<RequestHead> {
        lock(&self.shared.heads).iter().cloned().collect()
    }

    /// Zeroes the hit counters and clears the head log (not `connections`).
    pub fn reset_stats(&self) {
        self.shared.hits.store(0, Ordering::SeqCst);
        let now = self.shared.in_flight.load(Ordering::SeqCst);
        self.shared.max_in_flight.store(now, Ordering::SeqCst);
        lock(&self.shared.by_path).clear();
        lock(&self.shared.heads).clear();
    }

    /// `false` makes `/health` answer 503.
    pub fn set_health(&self, healthy: bool) {
        self.shared.healthy.store(healthy, Ordering::SeqCst);
    }

    /// Reports this utilisation in an `endpoint-load-metrics` header on every
    /// response (`None` stops reporting), like a backend using drover's SDK.
    pub fn set_load_report(&self, load: Option<f64>) {
        *lock(&self.shared.load_report) = load;
    }

    /// `true` makes `/health` never answer (a hung worker).
    pub fn set_hang_health(&self, hang: bool) {
        self.shared.hang_health.store(hang, Ordering::SeqCst);
    }

    /// Stops like a crashed process: closes the listener and drops every
    /// open connection at once. When it returns the port is free again.
    pub async fn stop(&self) {
        let accept = lock(&self.tasks.accept).take();
        if let Some(accept) = accept {
            accept.abort();
            // Awaiting guarantees the listener is dropped before we return.
            let _ = accept.await;
        }
        let conns = std::mem::take(&mut *lock(&self.tasks.conns));
        for c in &conns {
            c.abort();
        }
        for c in conns {
            let _ = c.await;
        }
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        if let Some(accept) = lock(&self.tasks.accept).take() {
            accept.abort();
        }
        for c in lock(&self.tasks.conns).drain(..) {
            c.abort();
        }
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<BackendState>, tasks: Arc<Tasks>) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            // EMFILE and friends: back off instead of spinning.
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        shared.connections.fetch_add(1, Ordering::SeqCst);
        let task = tokio::spawn(serve_conn(stream, shared.clone()));
        let mut conns = lock(&tasks.conns);
        conns.retain(|t| !t.is_finished());
        conns.push(task);
    }
}

/// Decrements the open-connection gauge however the task ends (abort too).
struct OpenGuard(Arc<BackendState>);

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.open_connections.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Counts one request in flight until dropped (also when the task is
/// aborted by `stop()` mid-request).
struct InFlight<'a>(&'a BackendState);

impl<'a> InFlight<'a> {
    fn begin(shared: &'a BackendState) -> Self {
        let now = shared.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        shared.max_in_flight.fetch_max(now, Ordering::SeqCst);
        InFlight(shared)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// What a route decided to do with the connection after reading a request.
enum Action {
    Respond(Reply),
    /// Close without answering.
    Close,
    /// Never answer; hold the socket until the peer closes or `stop()`.
    Hang,
    WebSocket {
        accept: String,
    },
    Big(usize),
}

struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: Body,
}

enum Body {
    Fixed(Vec<u8>),
    Chunked(Vec<Vec<u8>>, HeaderList),
}

impl Reply {
    fn text(status: u16, body: impl Into<Vec<u8>>) -> Reply {
        Reply {
            status,
            headers: vec![("content-type".into(), "text/plain".into())],
            body: Body::Fixed(body.into()),
        }
    }
}

async fn serve_conn(stream: TcpStream, shared: Arc<BackendState>) {
    shared.open_connections.fetch_add(1, Ordering::SeqCst);
    let _guard = OpenGuard(shared.clone());
    let _ = stream.set_nodelay(true);
    let mut conn = BufConn::new(stream);
    // Any I/O error just ends the connection: the peer went away.
    let _ = serve_requests(&mut conn, &shared).await;
}

async fn serve_requests(conn: &mut BufConn<TcpStream>, shared: &BackendState) -> io::Result<()> {
    while let Some(raw) = conn.read_head().await? {
        let head = match http::parse_request_head(raw) {
            Ok(h) => h,
            Err(_) => return bad_request(conn, shared, "bad request head").await,
        };
        let kind = match http::request_body_kind(&head.headers) {
            Ok(k) => k,
            Err(_) => return bad_request(conn, shared, "bad body framing").await,
        };
        if kind != BodyKind::None
            && head
                .header("expect")
                .is_some_and(|v| v.eq_ignore_ascii_case(b"100-continue"))
        {
            conn.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").await?;
        }
        let (chunks, trailers) = match kind {
            BodyKind::Chunked => conn.read_chunked().await?,
            other => (vec![conn.read_body(other).await?.0], Vec::new()),
        };
        shared.record(&head);
        let _in_flight = InFlight::begin(shared);
        let keep_alive = wants_keep_alive(&head);
        let is_head = head.method.eq_ignore_ascii_case("HEAD");
        let action = route(&head, kind, chunks, trailers, shared).await;
        shared.wait_out_pause().await;
        match action {
            Action::Respond(reply) => {
                write_reply(conn, shared, reply, is_head, keep_alive).await?;
            }
            Action::Big(n) => write_big(conn, shared, n, is_head, keep_alive).await?,
            Action::Close => return conn.io.shutdown().await,
            Action::Hang => return hang(conn).await,
            Action::WebSocket { accept } => return websocket_echo(conn, shared, &accept).await,
        }
        if !keep_alive {
            return conn.io.shutdown().await;
        }
    }
    Ok(())
}

impl BackendState {
    /// Holds a response back while the backend is paused (`/stall-once/MS`), like a
    /// process stopped for a garbage collection.
    async fn wait_out_pause(&self) {
        let until = *lock(&self.paused_until);
        if let Some(until) = until {
            tokio::time::sleep_until(until).await;
        }
    }

    fn record(&self, head: &RequestHead) {
        self.hits.fetch_add(1, Ordering::SeqCst);
        *lock(&self.by_path)
            .entry(head.path().to_string())
            .or_insert(0) += 1;
        let mut heads = lock(&self.heads);
        if heads.len() == HEAD_LOG_CAP {
            heads.pop_front();
        }
        heads.push_back(head.clone());
    }
}

fn wants_keep_alive(head: &RequestHead) -> bool {
    let conn = head.header("connection").unwrap_or(b"");
    if head.version == 0 {
        http::has_token(conn, "keep-alive")
    } else {
        !http::has_token(conn, "close")
    }
}

async fn route(
    head: &RequestHead,
    kind: BodyKind,
    chunks: Vec<Vec<u8>>,
    trailers: HeaderList,
    shared: &BackendState,
) -> Action {
    let path = head.path();
    let (first, rest) = match path.trim_start_matches('/').split_once('/') {
        Some((a, b)) => (a, Some(b)),
        None => (path.trim_start_matches('/'), None),
    };
    match (first, rest) {
        ("status", Some(code)) => match code.parse::<u16>() {
            Ok(code) if (200..=999).contains(&code) => {
                Action::Respond(Reply::text(code, format!("status {code}\n")))
            }
            _ => Action::Respond(Reply::text(400, "bad status code\n")),
        },
        ("delay", Some(ms)) => match ms.parse::<u64>() {
            Ok(ms) => {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                Action::Respond(Reply::text(200, shared.name.clone()))
            }
            Err(_) => Action::Respond(Reply::text(400, "bad delay\n")),
        },
        ("stall-once", Some(ms)) => match ms.parse::<u64>() {
            Ok(ms) => {
                let mut paused = lock(&shared.paused_until);
                if paused.is_none() {
                    *paused = Some(tokio::time::Instant::now() + Duration::from_millis(ms));
                }
                Action::Respond(Reply::text(200, shared.name.clone()))
            }
            Err(_) => Action::Respond(Reply::text(400, "bad stall\n")),
        },
        ("echo", None) => {
            let body = if kind == BodyKind::Chunked {
                Body::Chunked(chunks, trailers)
            } else {
                Body::Fixed(chunks.concat())
            };
            let mut reply = Reply::text(200, Vec::new());
            reply.body = body;
            Action::Respond(reply)
        }
        ("headers", None) => Action::Respond(Reply::text(200, head.raw.clone())),
        ("load", Some(x)) => {
            let mut reply = Reply::text(200, shared.name.clone());
            reply.headers.push((
                "endpoint-load-metrics".into(),
                format!("TEXT cpu_utilization={x}, named_metrics.elu={x}"),
            ));
            Action::Respond(reply)
        }
        ("close", None) => Action::Close,
        ("hang", None) => Action::Hang,
        ("health", None) => {
            if shared.hang_health.load(Ordering::SeqCst) {
                Action::Hang
            } else if shared.healthy.load(Ordering::SeqCst) {
                Action::Respond(Reply::text(200, "ok"))
            } else {
                Action::Respond(Reply::text(503, "unhealthy"))
            }
        }
        ("big", Some(n)) => match n.parse::<usize>() {
            Ok(n) => Action::Big(n),
            Err(_) => Action::Respond(Reply::text(400, "bad size\n")),
        },
        ("ws", None) => match websocket_accept(head) {
            Ok(accept) => Action::WebSocket { accept },
            Err(why) => Action::Respond(Reply::text(400, why)),
        },
        _ => Action::Respond(Reply::text(200, shared.name.clone())),
    }
}

/// `n` backends named b0, b1, …, started.
pub async fn backends(n: usize) -> Vec<Backend> {
    let mut v = Vec::new();
    for i in 0..n {
        v.push(Backend::named(&format!("b{i}")).start().await);
    }
    v
}

/// The addresses of `backends`, in order.
pub fn addrs(backends: &[Backend]) -> Vec<SocketAddr> {
    backends.iter().map(Backend::addr).collect()
}

/// The bytes of `/big/N`'s body: byte `i` is `b'a' + i % 26`, so a test can
/// check content and order, not only length.
pub fn big_body(n: usize) -> Vec<u8> {
    big_slice(0, n)
}

fn big_slice(from: usize, to: usize) -> Vec<u8> {
    (from..to).map(|i| b'a' + (i % 26) as u8).collect()
}

fn head_lines(status: u16, shared: &BackendState, keep_alive: bool) -> String {
    let mut out = format!(
        "HTTP/1.1 {status} {}\r\nx-backend: {}\r\n",
        reason(status),
        shared.name
    );
    if let Some(load) = *lock(&shared.load_report) {
        out.push_str(&format!(
            "endpoint-load-metrics: TEXT cpu_utilization={load}\r\n"
        ));
    }
    if !keep_alive {
        out.push_str("connection: close\r\n");
    }
    out
}

async fn write_reply(
    conn: &mut BufConn<TcpStream>,
    shared: &BackendState,
    reply: Reply,
    is_head: bool,
    keep_alive: bool,
) -> io::Result<()> {
    let mut out = head_lines(reply.status, shared, keep_alive);
    for (name, value) in &reply.headers {
        out.push_str(&format!("{name}: {value}\r\n"));
    }
    let no_body = reply.status == 204 || reply.status == 304;
    let mut bytes = Vec::new();
    match reply.body {
        Body::Fixed(body) => {
            if !no_body {
                out.push_str(&format!("content-length: {}\r\n", body.len()));
            }
            out.push_str("\r\n");
            bytes.extend_from_slice(out.as_bytes());
            if !is_head && !no_body {
                bytes.extend_from_slice(&body);
            }
        }
        Body::Chunked(chunks, trailers) => {
            out.push_str("transfer-encoding: chunked\r\n\r\n");
            bytes.extend_from_slice(out.as_bytes());
            if !is_head {
                let refs: Vec<&[u8]> = chunks.iter().map(Vec::as_slice).collect();
                let mut body = http::chunked_body(&refs);
                // Re-open the final "\r\n" to insert trailers before it.
                body.truncate(body.len() - 2);
                for (name, value) in trailers {
                    body.extend_from_slice(name.as_bytes());
                    body.extend_from_slice(b": ");
                    body.extend_from_slice(&value);
                    body.extend_from_slice(b"\r\n");
                }
                body.extend_from_slice(b"\r\n");
                bytes.extend_from_slice(&body);
            }
        }
    }
    conn.write_all(&bytes).await
}

/// Streams `/big/N` chunk by chunk so the proxy sees a real stream.
async fn write_big(
    conn: &mut BufConn<TcpStream>,
    shared: &BackendState,
    n: usize,
    is_head: bool,
    keep_alive: bool,
) -> io::Result<()> {
    let mut head = head_lines(200, shared, keep_alive);
    head.push_str("content-type: application/octet-stream\r\ntransfer-encoding: chunked\r\n\r\n");
    conn.write_all(head.as_bytes()).await?;
    if is_head {
        return Ok(());
    }
    let mut sent = 0;
    while sent < n {
        let end = (sent + BIG_CHUNK).min(n);
        let mut chunk = format!("{:x}\r\n", end - sent).into_bytes();
        chunk.extend_from_slice(&big_slice(sent, end));
        chunk.extend_from_slice(b"\r\n");
        conn.write_all(&chunk).await?;
        sent = end;
    }
    conn.write_all(b"0\r\n\r\n").await
}

async fn bad_request(
    conn: &mut BufConn<TcpStream>,
    shared: &BackendState,
    why: &str,
) -> io::Result<()> {
    let reply = Reply::text(400, format!("{why}\n"));
    write_reply(conn, shared, reply, false, false).await?;
    conn.io.shutdown().await
}

/// Holds the socket open without answering; returns when the peer closes
/// so that a test that gives up does not leak the task until `stop()`.
async fn hang(conn: &mut BufConn<TcpStream>) -> io::Result<()> {
    let mut sink = [0u8; 4096];
    while conn.io.read(&mut sink).await? != 0 {}
    Ok(())
}

fn websocket_accept(head: &RequestHead) -> Result<String, &'static str> {
    if !head
        .header("upgrade")
        .is_some_and(|v| http::has_token(v, "websocket"))
    {
        return Err("missing Upgrade: websocket\n");
    }
    if !head
        .header("connection")
        .is_some_and(|v| http::has_token(v, "upgrade"))
    {
        return Err("missing Connection: upgrade\n");
    }
    if head.header("sec-websocket-version") != Some(b"13".as_slice()) {
        return Err("Sec-WebSocket-Version must be 13\n");
    }
    let key = head
        .header_str("sec-websocket-key")
        .ok_or("missing Sec-WebSocket-Key\n")?;
    Ok(ws::accept_key(&key))
}

/// Echoes every data frame back unmasked, answers pings, and closes after
/// echoing a close frame, as RFC 6455 section 5.5.1 asks.
async fn websocket_echo(
    conn: &mut BufConn<TcpStream>,
    shared: &BackendState,
    accept: &str,
) -> io::Result<()> {
    let head = format!(
        "HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: Upgrade\r\n\
         sec-websocket-accept: {accept}\r\nx-backend: {}\r\n\r\n",
        shared.name
    );
    conn.write_all(head.as_bytes()).await?;
    while let Some(frame) = ws::read_frame(conn).await? {
        match frame.opcode {
            ws::OP_TEXT | ws::OP_BINARY | ws::OP_CONTINUATION => {
                let out = ws::encode_frame(frame.fin, frame.opcode, &frame.payload, None);
                conn.write_all(&out).await?;
            }
            ws::OP_PING => {
                let out = ws::encode_frame(true, ws::OP_PONG, &frame.payload, None);
                conn.write_all(&out).await?;
            }
            ws::OP_CLOSE => {
                let out = ws::encode_frame(true, ws::OP_CLOSE, &frame.payload, None);
                conn.write_all(&out).await?;
                return conn.io.shutdown().await;
            }
            _ => {}
        }
    }
    Ok(())
}

fn reason(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        101 => "Switching Protocols",
        200 => "OK",
        201 => "Created",
        204 => "No Content",
        301 => "Moved Permanently",
        302 => "Found",
        304 => "Not Modified",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        408 => "Request Timeout",
        413 => "Content Too Large",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Status",
    }
}

/// A backend that answers each request head by writing `parts` in turn (each after its
/// pause), then closes. Returns its address and how many requests it got.
pub async fn raw_backend(parts: Vec<(Duration, Vec<u8>)>) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let hits = Arc::new(AtomicUsize::new(0));
    let counter = hits.clone();
    let parts = Arc::new(parts);
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let (counter, parts) = (counter.clone(), parts.clone());
            tokio::spawn(async move {
                let mut seen = Vec::new();
                let mut buf = [0u8; 4096];
                while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(n) if n > 0 => seen.extend_from_slice(&buf[..n]),
                        _ => return,
                    }
                }
                counter.fetch_add(1, Ordering::Relaxed);
                for (pause, bytes) in parts.iter() {
                    tokio::time::sleep(*pause).await;
                    if s.write_all(bytes).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, hits)
}
