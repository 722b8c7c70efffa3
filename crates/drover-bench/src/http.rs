//! A minimal HTTP/1.1 client connection: write a prebuilt request, read one response
//! (Content-Length, chunked, or until close) and keep the connection for the next one.

use std::io;
use std::net::SocketAddr;

use bytes::{Buf, BytesMut};
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;

use crate::tls::{Handshake, TlsTarget};

const MAX_HEADERS: usize = 64;
const READ_CHUNK: usize = 16 * 1024;

/// What every request of a run sends besides its path: the method, and a body (with
/// its `Content-Length`; `None`: no body and no length, as a GET).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Payload {
    pub method: String,
    pub body: Option<Vec<u8>>,
}

impl Default for Payload {
    fn default() -> Self {
        Payload {
            method: "GET".into(),
            body: None,
        }
    }
}

/// The request bytes for `method path` with the given host, extra header lines and
/// body. A `Host` or `User-Agent` among the header lines replaces drover bench's own, as
/// with ab's and wrk's `-H` (a second `Host` is a request every server refuses).
pub fn build_request(path: &str, host: &str, headers: &[String], payload: &Payload) -> Vec<u8> {
    let mut s = format!("{} {path} HTTP/1.1\r\n", payload.method);
    let has = |name: &str| {
        headers.iter().any(|h| {
            h.split_once(':')
                .is_some_and(|(n, _)| n.trim().eq_ignore_ascii_case(name))
        })
    };
    if !has("host") {
        s.push_str(&format!("Host: {host}\r\n"));
    }
    if !has("user-agent") {
        s.push_str("User-Agent: drover-bench\r\n");
    }
    for h in headers {
        s.push_str(h.trim());
        s.push_str("\r\n");
    }
    if let Some(body) = &payload.body {
        s.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    s.push_str("\r\n");
    let mut bytes = s.into_bytes();
    if let Some(body) = &payload.body {
        bytes.extend_from_slice(body);
    }
    bytes
}

/// Why a request got no response.
#[derive(Debug)]
pub enum ReqError {
    /// The peer closed the connection before a whole response arrived.
    Closed,
    Io(io::Error),
    /// The response could not be parsed.
    Parse(String),
}

impl From<io::Error> for ReqError {
    fn from(e: io::Error) -> Self {
        ReqError::Io(e)
    }
}

impl std::fmt::Display for ReqError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReqError::Closed => f.write_str("connection closed before the response was complete"),
            ReqError::Io(e) => write!(f, "{e}"),
            ReqError::Parse(e) => write!(f, "bad response: {e}"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    /// False when the server asked to close, or the body ran until close.
    pub keep_alive: bool,
    /// Value of the header the caller asked to capture (trimmed, lossy UTF-8), when the
    /// response had it.
    pub tag: Option<String>,
    /// Bytes read for this response, head and body.
    pub bytes: u64,
}

enum Body {
    None,
    Length(u64),
    Chunked,
    UntilClose,
}

/// A connection's bytes: plain TCP, or TLS over it (an `https://` target).
enum Stream {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

pub struct Conn {
    stream: Stream,
    buf: BytesMut,
    /// Bytes read since the current request was written.
    read: u64,
    /// How its TLS handshake went; `None` for plain HTTP.
    handshake: Option<Handshake>,
}

impl Conn {
    /// The local port, which tells connections apart (tests).
    #[cfg(test)]
    pub fn local_port(&self) -> u16 {
        let tcp = match &self.stream {
            Stream::Plain(s) => s,
            Stream::Tls(s) => s.get_ref().0,
        };
        tcp.local_addr().map_or(0, |a| a.port())
    }

    /// A connection to `addr`, with a TLS handshake first for an `https://` target.
    pub async fn connect(addr: SocketAddr, tls: Option<&TlsTarget>) -> io::Result<Conn> {
        let tcp = TcpStream::connect(addr).await?;
        tcp.set_nodelay(true)?;
        let (stream, handshake) = match tls {
            None => (Stream::Plain(tcp), None),
            Some(t) => {
                let (s, kind) = t.handshake(tcp).await?;
                (Stream::Tls(Box::new(s)), Some(kind))
            }
        };
        Ok(Conn {
            stream,
            buf: BytesMut::with_capacity(READ_CHUNK),
            read: 0,
            handshake,
        })
    }

    /// How the connection's TLS handshake went (`None`: plain HTTP).
    pub fn handshake(&self) -> Option<Handshake> {
        self.handshake
    }

    /// Sends `req` and reads its response, capturing the value of header `tag_header`
    /// when given. On error the connection must be dropped.
    pub async fn request(
        &mut self,
        req: &[u8],
        tag_header: Option<&str>,
    ) -> Result<Response, ReqError> {
        self.buf.clear();
        self.read = 0;
        self.stream.write_all(req).await?;
        // A response to HEAD has a head only, whatever its Content-Length says.
        self.read_response(tag_header, req.starts_with(b"HEAD "))
            .await
    }

    async fn fill(&mut self) -> Result<(), ReqError> {
        if self.buf.capacity() - self.buf.len() < 1024 {
            self.buf.reserve(READ_CHUNK);
        }
        let n = self.stream.read_buf(&mut self.buf).await?;
        if n == 0 {
            return Err(ReqError::Closed);
        }
        self.read += n as u64;
        Ok(())
    }

    async fn read_response(
        &mut self,
        tag_header: Option<&str>,
        head_only: bool,
    ) -> Result<Response, ReqError> {
        loop {
            let parsed = {
                let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
                let mut r = httparse::Response::new(&mut headers);
                match r.parse(&self.buf) {
                    Ok(httparse::Status::Complete(n)) => Some(head_info(&r, n, tag_header)?),
                    Ok(httparse::Status::Partial) => None,
                    Err(e) => return Err(ReqError::Parse(e.to_string())),
                }
            };
            let Some(Head {
                len: head_len,
                status,
                body,
                mut keep_alive,
                tag,
            }) = parsed
            else {
                self.fill().await?;
                continue;
            };
            self.buf.advance(head_len);
            if (100..200).contains(&status) && status != 101 {
                continue; // interim response; the real one follows
            }
            match if head_only { Body::None } else { body } {
                Body::None => {}
                Body::Length(n) => self.skip(n).await?,
                Body::Chunked => self.skip_chunked().await?,
                Body::UntilClose => {
                    loop {
                        self.buf.clear();
                        match self.fill().await {
                            Ok(()) => {}
                            Err(ReqError::Closed) => break,
                            Err(e) => return Err(e),
                        }
                    }
                    keep_alive = false;
                }
            }
            return Ok(Response {
                status,
                keep_alive,
                tag,
                bytes: self.read,
            });
        }
    }

    /// Consumes `n` bytes of body.
    async fn skip(&mut self, mut n: u64) -> Result<(), ReqError> {
        loop {
            let take = n.min(self.buf.len() as u64);
            self.buf.advance(take as usize);
            n -= take;
            if n == 0 {
                return Ok(());
            }
            self.fill().await?;
        }
    }

    async fn line(&mut self) -> Result<usize, ReqError> {
        loop {
            if let Some(p) = memchr::memmem::find(&self.buf, b"\r\n") {
                return Ok(p);
            }
            if self.buf.len() > 64 * 1024 {
                return Err(ReqError::Parse("chunk line too long".into()));
            }
            self.fill().await?;
        }
    }

    async fn skip_chunked(&mut self) -> Result<(), ReqError> {
        loop {
            let end = self.line().await?;
            let size = parse_chunk_size(&self.buf[..end])?;
            self.buf.advance(end + 2);
            if size == 0 {
                // Trailer lines up to an empty line.
                loop {
                    let end = self.line().await?;
                    self.buf.advance(end + 2);
                    if end == 0 {
                        return Ok(());
                    }
                }
            }
            self.skip(size + 2).await?;
        }
    }
}

/// What a parsed response head says about the rest of the response.
struct Head {
    len: usize,
    status: u16,
    body: Body,
    keep_alive: bool,
    tag: Option<String>,
}

fn head_info(
    r: &httparse::Response<'_, '_>,
    head_len: usize,
    tag_header: Option<&str>,
) -> Result<Head, ReqError> {
    let status = r.code.unwrap_or(0);
    let http10 = r.version == Some(0);
    let mut keep_alive = !http10;
    let mut length = None;
    let mut chunked = false;
    let mut tag = None;
    for h in r.headers.iter() {
        if tag_header.is_some_and(|t| h.name.eq_ignore_ascii_case(t)) {
            tag = Some(String::from_utf8_lossy(h.value.trim_ascii()).into_owned());
        }
        if h.name.eq_ignore_ascii_case("content-length") {
            let v = std::str::from_utf8(h.value)
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
                .ok_or_else(|| ReqError::Parse("bad content-length".into()))?;
            length = Some(v);
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = h
                .value
                .split(|&b| b == b',')
                .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"chunked"));
        } else if h.name.eq_ignore_ascii_case("connection") {
            for t in h.value.split(|&b| b == b',') {
                let t = t.trim_ascii();
                if t.eq_ignore_ascii_case(b"close") {
                    keep_alive = false;
                } else if t.eq_ignore_ascii_case(b"keep-alive") {
                    keep_alive = true;
                }
            }
        }
    }
    let body = if (100..200).contains(&status) || status == 204 || status == 304 {
        Body::None
    } else if chunked {
        Body::Chunked
    } else if let Some(n) = length {
        Body::Length(n)
    } else {
        Body::UntilClose
    };
    Ok(Head {
        len: head_len,
        status,
        body,
        keep_alive,
        tag,
    })
}

fn parse_chunk_size(line: &[u8]) -> Result<u64, ReqError> {
    let hex = line
        .split(|&b| b == b';')
        .next()
        .unwrap_or(&[])
        .trim_ascii();
    let s = std::str::from_utf8(hex).map_err(|_| ReqError::Parse("bad chunk size".into()))?;
    u64::from_str_radix(s, 16).map_err(|_| ReqError::Parse(format!("bad chunk size {s:?}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_bytes() {
        let get = Payload::default();
        let r = build_request("/x", "127.0.0.1:80", &["X-A: 1".to_string()], &get);
        assert_eq!(
            r,
            b"GET /x HTTP/1.1\r\nHost: 127.0.0.1:80\r\nUser-Agent: drover-bench\r\nX-A: 1\r\n\r\n"
        );
        let r = build_request("/", "h", &["user-agent: me".to_string()], &get);
        assert_eq!(r, b"GET / HTTP/1.1\r\nHost: h\r\nuser-agent: me\r\n\r\n");
        let r = build_request("/", "127.0.0.1:80", &["host: api.test".to_string()], &get);
        assert_eq!(
            r,
            b"GET / HTTP/1.1\r\nUser-Agent: drover-bench\r\nhost: api.test\r\n\r\n"
        );
        let post = Payload {
            method: "POST".into(),
            body: Some(b"a=1".to_vec()),
        };
        let r = build_request("/f", "h", &["Content-Type: text/plain".to_string()], &post);
        assert_eq!(
            r,
            b"POST /f HTTP/1.1\r\nHost: h\r\nUser-Agent: drover-bench\r\nContent-Type: text/plain\r\nContent-Length: 3\r\n\r\na=1"
        );
        let empty = Payload {
            method: "PUT".into(),
            body: Some(Vec::new()),
        };
        let r = build_request("/", "h", &[], &empty);
        assert!(r.ends_with(b"Content-Length: 0\r\n\r\n"), "{r:?}");
    }

    fn parse_head(raw: &[u8], tag_header: Option<&str>) -> Head {
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut r = httparse::Response::new(&mut headers);
        let httparse::Status::Complete(n) = r.parse(raw).unwrap() else {
            panic!("partial head");
        };
        head_info(&r, n, tag_header).unwrap()
    }

    #[test]
    fn captures_the_asked_header_case_insensitively() {
        let raw = b"HTTP/1.1 200 OK\r\nX-Worker:  3 \r\nContent-Length: 0\r\n\r\n";
        assert_eq!(parse_head(raw, Some("x-worker")).tag.as_deref(), Some("3"));
        assert_eq!(parse_head(raw, Some("X-WORKER")).tag.as_deref(), Some("3"));
        assert_eq!(parse_head(raw, Some("x-other")).tag, None);
        assert_eq!(parse_head(raw, None).tag, None);
        let h = parse_head(raw, Some("x-worker"));
        assert_eq!((h.status, h.keep_alive, h.len), (200, true, raw.len()));
    }

    #[test]
    fn chunk_sizes() {
        assert_eq!(parse_chunk_size(b"1a").unwrap(), 26);
        assert_eq!(parse_chunk_size(b"0;ext=1").unwrap(), 0);
        assert!(parse_chunk_size(b"zz").is_err());
    }
}
