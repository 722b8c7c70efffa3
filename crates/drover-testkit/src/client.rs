//! Clients for tests: a keep-alive HTTP/1.1 client over one connection, a
//! raw byte exchange for malformed input, and a minimal WebSocket client.

use crate::http::{self, BodyKind, BufConn};
use crate::ws;
use std::io;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{timeout, Instant};

/// Default bound on one request/response so no test can hang forever.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// A response as the client read it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    /// Names as sent; values decoded lossily as UTF-8.
    pub headers: Vec<(String, String)>,
    /// The body, de-chunked.
    pub body: Vec<u8>,
    /// Trailer fields of a chunked body.
    pub trailers: Vec<(String, String)>,
}

impl Response {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// All values of header `name` (case-insensitive), in order.
    pub fn header_all(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
            .collect()
    }

    /// The body as text (lossy).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

fn to_text(headers: http::HeaderList) -> Vec<(String, String)> {
    headers
        .into_iter()
        .map(|(n, v)| (n, String::from_utf8_lossy(&v).into_owned()))
        .collect()
}

fn timed_out(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        format!("testkit client: {what} timed out"),
    )
}

/// An HTTP/1.1 client on one keep-alive connection. Requests are sent one at
/// a time; `write_raw` + `read_response` allow pipelining by hand.
pub struct HttpClient {
    conn: BufConn<TcpStream>,
    addr: SocketAddr,
    timeout: Duration,
}

impl HttpClient {
    pub async fn connect(addr: SocketAddr) -> io::Result<HttpClient> {
        let stream = timeout(DEFAULT_TIMEOUT, TcpStream::connect(addr))
            .await
            .map_err(|_| timed_out("connect"))??;
        stream.set_nodelay(true)?;
        Ok(HttpClient {
            conn: BufConn::new(stream),
            addr,
            timeout: DEFAULT_TIMEOUT,
        })
    }

    /// A client on a connection made elsewhere (e.g. from a chosen source address).
    pub fn from_stream(stream: TcpStream) -> io::Result<HttpClient> {
        stream.set_nodelay(true)?;
        Ok(HttpClient {
            addr: stream.peer_addr()?,
            conn: BufConn::new(stream),
            timeout: DEFAULT_TIMEOUT,
        })
    }

    /// Bound for each later request (default 10 s); exceeding it gives an
    /// `io::ErrorKind::TimedOut` error.
    pub fn set_timeout(&mut self, t: Duration) {
        self.timeout = t;
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The client's own address: what the peer sees as the remote end.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.conn.io.local_addr()
    }

    /// `GET path`; panics with the error on failure, for brevity in tests
    /// that expect success. Use `request` to observe failures.
    pub async fn get(&mut self, path: &str) -> Response {
        self.request("GET", path, &[], None)
            .await
            .unwrap_or_else(|e| panic!("GET {path} via {} failed: {e}", self.addr))
    }

    /// Sends one request and reads its response. `Host` is added unless
    /// given; `Content-Length` is added for a body unless the caller set
    /// `Content-Length` or `Transfer-Encoding`, in which case the body is
    /// sent verbatim (use [`crate::chunked_body`] to encode chunks).
    pub async fn request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&[u8]>,
    ) -> io::Result<Response> {
        let has = |name: &str| headers.iter().any(|(n, _)| n.eq_ignore_ascii_case(name));
        let mut head = format!("{method} {path} HTTP/1.1\r\n");
        if !has("host") {
            head.push_str(&format!("host: {}\r\n", self.addr));
        }
        for (name, value) in headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        if let Some(body) = body {
            if !has("content-length") && !has("transfer-encoding") {
                head.push_str(&format!("content-length: {}\r\n", body.len()));
            }
        }
        head.push_str("\r\n");
        let mut bytes = head.into_bytes();
        bytes.extend_from_slice(body.unwrap_or(&[]));
        self.write_raw(&bytes).await?;
        self.read_response(method.eq_ignore_ascii_case("HEAD"))
            .await
    }

    /// Writes bytes as they are (for pipelining and malformed requests).
    pub async fn write_raw(&mut self, bytes: &[u8]) -> io::Result<()> {
        timeout(self.timeout, self.conn.write_all(bytes))
            .await
            .map_err(|_| timed_out("write"))?
    }

    /// Reads the next final response; interim 1xx responses other than 101
    /// are skipped. `head_request` says the request was HEAD (no body).
    pub async fn read_response(&mut self, head_request: bool) -> io::Result<Response> {
        let limit = self.timeout;
        timeout(limit, read_response(&mut self.conn, head_request))
            .await
            .map_err(|_| timed_out("response"))?
    }
}

async fn read_response(conn: &mut BufConn<TcpStream>, head_request: bool) -> io::Result<Response> {
    loop {
        let raw = conn.read_head().await?.ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "connection closed before a response",
            )
        })?;
        let head = http::parse_response_head(&raw)?;
        if (100..200).contains(&head.status) && head.status != 101 {
            continue;
        }
        let kind = http::response_body_kind(head.status, head_request, &head.headers)?;
        let (body, trailers) = if kind == BodyKind::UntilClose {
            (conn.read_to_end().await?, Vec::new())
        } else {
            conn.read_body(kind).await?
        };
        return Ok(Response {
            status: head.status,
            headers: to_text(head.headers),
            body,
            trailers: to_text(trailers),
        });
    }
}

/// Writes `bytes` to a new connection and returns everything read until
/// the peer closes or 2 s pass. Does not half-close, since some servers
/// treat a client FIN as an abort; a reset after data still returns it.
pub async fn raw_exchange(addr: SocketAddr, bytes: &[u8]) -> io::Result<Vec<u8>> {
    raw_exchange_timeout(addr, bytes, Duration::from_secs(2)).await
}

/// [`raw_exchange`] with a chosen overall deadline.
pub async fn raw_exchange_timeout(
    addr: SocketAddr,
    bytes: &[u8],
    limit: Duration,
) -> io::Result<Vec<u8>> {
    let deadline = Instant::now() + limit;
    let mut stream = tokio::time::timeout_at(deadline, TcpStream::connect(addr))
        .await
        .map_err(|_| timed_out("connect"))??;
    // A server may answer (and close) before we finish writing a large
    // request; what it sent is still what the test wants to see.
    let _ = tokio::time::timeout_at(deadline, stream.write_all(bytes)).await;
    let mut out = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Ok(Ok(0)) | Err(_) => return Ok(out),
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
            Ok(Err(e)) if out.is_empty() => return Err(e),
            Ok(Err(_)) => return Ok(out),
        }
    }
}

/// The status code of the first status line in `bytes`, if any.
pub fn parse_status(bytes: &[u8]) -> Option<u16> {
    let rest = bytes.strip_prefix(b"HTTP/1.")?;
    let code = rest.get(2..5)?;
    if rest.get(1) != Some(&b' ') || !code.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(code).ok()?.parse().ok()
}

/// A message received on a WebSocket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WsMessage {
    Text(String),
    Binary(Vec<u8>),
    Ping(Vec<u8>),
    Pong(Vec<u8>),
    /// The close code, when the frame carried one.
    Close(Option<u16>),
}

/// A minimal WebSocket client; frames it sends are masked (RFC 6455 5.3).
pub struct WsClient {
    conn: BufConn<TcpStream>,
    /// The 101 response (headers checked by tests, e.g. `x-backend`).
    pub handshake: Response,
    timeout: Duration,
}

/// Connects and performs the upgrade; fails unless the answer is a 101
/// with the right `Sec-WebSocket-Accept`.
pub async fn ws_connect(addr: SocketAddr, path: &str) -> io::Result<WsClient> {
    let mut client = HttpClient::connect(addr).await?;
    let key = ws::base64(&fastrand::u128(..).to_be_bytes());
    let resp = client
        .request(
            "GET",
            path,
            &[
                ("upgrade", "websocket"),
                ("connection", "Upgrade"),
                ("sec-websocket-version", "13"),
                ("sec-websocket-key", &key),
            ],
            None,
        )
        .await?;
    if resp.status != 101 {
        return Err(io::Error::other(format!(
            "websocket upgrade got status {} (body {:?})",
            resp.status,
            resp.text()
        )));
    }
    let expected = ws::accept_key(&key);
    if resp.header("sec-websocket-accept") != Some(expected.as_str()) {
        return Err(http::invalid("wrong Sec-WebSocket-Accept"));
    }
    Ok(WsClient {
        conn: client.conn,
        handshake: resp,
        timeout: client.timeout,
    })
}

impl WsClient {
    pub async fn send_text(&mut self, text: &str) -> io::Result<()> {
        self.send(ws::OP_TEXT, text.as_bytes()).await
    }

    pub async fn send_binary(&mut self, data: &[u8]) -> io::Result<()> {
        self.send(ws::OP_BINARY, data).await
    }

    pub async fn send_ping(&mut self, data: &[u8]) -> io::Result<()> {
        self.send(ws::OP_PING, data).await
    }

    /// Sends a close frame with `code` (the peer should echo it).
    pub async fn close(&mut self, code: u16) -> io::Result<()> {
        self.send(ws::OP_CLOSE, &code.to_be_bytes()).await
    }

    async fn send(&mut self, opcode: u8, payload: &[u8]) -> io::Result<()> {
        let mask = fastrand::u32(..).to_be_bytes();
        let frame = ws::encode_frame(true, opcode, payload, Some(mask));
        timeout(self.timeout, self.conn.write_all(&frame))
            .await
            .map_err(|_| timed_out("websocket send"))?
    }

    /// The next message; fragmented messages are joined. EOF is an
    /// `UnexpectedEof` error.
    pub async fn recv(&mut self) -> io::Result<WsMessage> {
        timeout(self.timeout, self.recv_inner())
            .await
            .map_err(|_| timed_out("websocket recv"))?
    }

    async fn recv_inner(&mut self) -> io::Result<WsMessage> {
        let mut data: Option<(u8, Vec<u8>)> = None;
        loop {
            let frame = ws::read_frame(&mut self.conn)
                .await?
                .ok_or_else(|| io::Error::new(io::ErrorKind::UnexpectedEof, "websocket closed"))?;
            match frame.opcode {
                ws::OP_PING => return Ok(WsMessage::Ping(frame.payload)),
                ws::OP_PONG => return Ok(WsMessage::Pong(frame.payload)),
                ws::OP_CLOSE => {
                    let code = frame
                        .payload
                        .get(..2)
                        .map(|c| u16::from_be_bytes([c[0], c[1]]));
                    return Ok(WsMessage::Close(code));
                }
                op => {
                    let (first_op, buf) = data.get_or_insert((op, Vec::new()));
                    buf.extend_from_slice(&frame.payload);
                    if frame.fin {
                        let first_op = *first_op;
                        let payload = std::mem::take(buf);
                        return Ok(if first_op == ws::OP_TEXT {
                            WsMessage::Text(
                                String::from_utf8(payload).map_err(|_| {
                                    http::invalid("websocket text frame is not UTF-8")
                                })?,
                            )
                        } else {
                            WsMessage::Binary(payload)
                        });
                    }
                }
            }
        }
    }
}

/// Reads from `s` until `\r\n\r\n` and returns everything read (head and what followed).
pub async fn read_head(s: &mut TcpStream) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut buf).await {
            Ok(n) if n > 0 => got.extend_from_slice(&buf[..n]),
            _ => break,
        }
    }
    got
}

/// Sends a POST /echo head for `len` bytes, then `first` bytes at once, then `chunk` bytes
/// every `every` until the body is sent or drover closes; returns everything drover answered.
pub async fn post_trickle(
    addr: SocketAddr,
    len: usize,
    first: usize,
    chunk: usize,
    every: Duration,
) -> Vec<u8> {
    let s = TcpStream::connect(addr).await.unwrap();
    let (mut rd, mut wr) = s.into_split();
    let head = format!("POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: {len}\r\n\r\n");
    wr.write_all(head.as_bytes()).await.unwrap();
    wr.write_all(&vec![b'x'; first]).await.unwrap();
    let sender = tokio::spawn(async move {
        let mut sent = first;
        while sent < len {
            tokio::time::sleep(every).await;
            let n = chunk.min(len - sent);
            if wr.write_all(&vec![b'x'; n]).await.is_err() {
                return;
            }
            sent += n;
        }
        // Keep the sending side open: the answer, not our close, ends the exchange.
        std::future::pending::<()>().await;
    });
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    // Until drover closes, or the whole echo is in.
    let echoed = |got: &[u8]| {
        got.windows(4)
            .position(|w| w == b"\r\n\r\n")
            .is_some_and(|head| got.len() - head - 4 >= len)
    };
    let read_all = async {
        while !echoed(&got) {
            match rd.read(&mut buf).await {
                Ok(n) if n > 0 => got.extend_from_slice(&buf[..n]),
                _ => break,
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(30), read_all).await;
    sender.abort();
    got
}

/// Sends `n` requests for `path` with `headers` on one keep-alive connection to `addr`,
/// each answered 200, and returns which backend answered each (its `x-backend`, as
/// testkit backends name themselves).
pub async fn answered_by(
    addr: SocketAddr,
    n: usize,
    path: &str,
    headers: &[(&str, &str)],
) -> Vec<String> {
    let mut c = HttpClient::connect(addr).await.unwrap();
    let mut seen = Vec::new();
    for _ in 0..n {
        let r = c.request("GET", path, headers, None).await.unwrap();
        assert_eq!(r.status, 200);
        seen.push(r.header("x-backend").unwrap().to_owned());
    }
    seen
}
