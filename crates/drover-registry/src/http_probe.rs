//! The HTTP check's request and the reading of its answer, to its end when the
//! connection is to carry the next probe.
//!
//! Probes keep their connection (as Envoy's health checker does by default): a busy
//! single-threaded server (a Node worker doing CPU work) accepts about one new
//! connection per turn of its event loop, while it reads every connection it already
//! holds each turn. A probe on a new connection waited behind the listen queue, seconds
//! under another balancer's load, and endpoints went down one by one while the requests
//! on kept connections were answered; on a kept connection a probe waits as a request
//! does. Keeping it also spares the backend an accept and a `TIME_WAIT` per probe.
//!
//! Only what the status needs is read when the connection is not kept: the status line.
//! A kept connection's answer is read to its end by its framing (RFC 9112 §6.3), and
//! the connection is given up whenever that end is not certain: `Connection: close`,
//! HTTP/1.0, a body read until close, one longer than `MAX_BODY`, bytes after the end.

use crate::probe::ProbeError;
use std::io;
use std::net::SocketAddr;
use tokio::io::{AsyncRead, AsyncReadExt};

/// The longest response head a probe reads.
const MAX_HEAD: usize = 16 * 1024;

/// The longest body read so that its connection can carry the next probe; past it the
/// connection is closed instead. Health answers are a few bytes to a few KiB.
const MAX_BODY: usize = 64 * 1024;

/// Headers parsed per answer; an answer with more passes on its status line alone.
const MAX_HEADERS: usize = 32;

/// The request of one probe of `path`; `keep`: ask for the connection to stay open.
pub(crate) fn request(path: &str, host: SocketAddr, keep: bool) -> String {
    let close = if keep { "" } else { "Connection: close\r\n" };
    format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: drover-health\r\n{close}\r\n")
}

/// A probe's answer: its status, and whether its connection can carry the next probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Answer {
    pub status: u16,
    pub reusable: bool,
}

impl Answer {
    fn last(status: u16) -> Answer {
        Answer {
            status,
            reusable: false,
        }
    }
}

/// Reads one answer: the status line alone when `keep` is false, else the whole
/// response, so that the next probe's answer starts where this one ended.
pub(crate) async fn read_answer<S: AsyncRead + Unpin + ?Sized>(
    stream: &mut S,
    keep: bool,
) -> Result<Answer, ProbeError> {
    let mut reader = Reader {
        stream,
        buf: Vec::with_capacity(512),
        pos: 0,
    };
    loop {
        if !keep {
            if let Some(end) = reader.buf.iter().position(|&b| b == b'\n') {
                return parse_status_line(&reader.buf[..=end]).map(Answer::last);
            }
        }
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut response = httparse::Response::new(&mut headers);
        match response.parse(&reader.buf) {
            Ok(httparse::Status::Complete(head)) => {
                let status = response.code.ok_or(ProbeError::Malformed)?;
                let Some(body) = framing(&response) else {
                    return Ok(Answer::last(status));
                };
                reader.pos = head;
                let reusable = reader.skip_body(body).await && reader.pos == reader.buf.len();
                return Ok(Answer { status, reusable });
            }
            Ok(httparse::Status::Partial) if reader.buf.len() <= MAX_HEAD => {}
            // Too long, too many headers, or a header httparse refuses: the status line
            // still says what the check needs.
            _ => return status_line_of(&reader.buf).map(Answer::last),
        }
        match reader.fill().await {
            Ok(true) => {}
            // Cut before the head's end: a whole status line still counts.
            Ok(false) if reader.buf.contains(&b'\n') => {
                return status_line_of(&reader.buf).map(Answer::last)
            }
            Ok(false) => return Err(ProbeError::Closed),
            Err(e) => return Err(ProbeError::Io(e)),
        }
    }
}

/// How a kept connection's answer ends, or `None` when the connection cannot be kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Body {
    Length(usize),
    Chunked,
}

fn framing(response: &httparse::Response<'_, '_>) -> Option<Body> {
    let status = response.code?;
    // 1xx: another head follows (or the protocol changes); keep nothing so rare.
    if response.version != Some(1) || status < 200 {
        return None;
    }
    let mut length = None;
    let mut chunked = false;
    for h in response.headers.iter() {
        let value = std::str::from_utf8(h.value).ok()?.trim();
        if h.name.eq_ignore_ascii_case("connection")
            && value
                .split(',')
                .any(|t| t.trim().eq_ignore_ascii_case("close"))
        {
            return None;
        }
        if h.name.eq_ignore_ascii_case("transfer-encoding") {
            // Only a final `chunked` says where the body ends; anything else runs to close.
            chunked = value
                .rsplit(',')
                .next()
                .is_some_and(|t| t.trim().eq_ignore_ascii_case("chunked"));
            if !chunked {
                return None;
            }
        }
        if h.name.eq_ignore_ascii_case("content-length") {
            let n: usize = value
                .bytes()
                .all(|b| b.is_ascii_digit())
                .then(|| value.parse().ok())??;
            if length.is_some_and(|l| l != n) {
                return None;
            }
            length = Some(n);
        }
    }
    match (status, chunked, length) {
        (204 | 304, _, _) => Some(Body::Length(0)),
        // Both: a sign of smuggling; nothing after such an answer is trusted.
        (_, true, Some(_)) => None,
        (_, true, None) => Some(Body::Chunked),
        (_, false, Some(n)) if n <= MAX_BODY => Some(Body::Length(n)),
        // Too long, or read until close.
        _ => None,
    }
}

/// The bytes read so far, and how far the answer has been taken.
struct Reader<'a, S: ?Sized> {
    stream: &'a mut S,
    buf: Vec<u8>,
    pos: usize,
}

impl<S: AsyncRead + Unpin + ?Sized> Reader<'_, S> {
    /// Reads more; `false` at the end of the stream.
    async fn fill(&mut self) -> io::Result<bool> {
        let mut chunk = [0u8; 2048];
        let n = self.stream.read(&mut chunk).await?;
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(n > 0)
    }

    /// Reads until `n` bytes past `pos` are in; `false` when the stream ends first or
    /// the answer would pass `MAX_HEAD + MAX_BODY`.
    async fn want(&mut self, n: usize) -> bool {
        while self.buf.len() < self.pos + n {
            if self.buf.len() > MAX_HEAD + MAX_BODY || !matches!(self.fill().await, Ok(true)) {
                return false;
            }
        }
        true
    }

    /// Takes the body past `pos`; whether it ended where its framing says.
    async fn skip_body(&mut self, body: Body) -> bool {
        match body {
            Body::Length(n) => {
                let whole = self.want(n).await;
                self.pos += n;
                whole
            }
            Body::Chunked => self.skip_chunks().await,
        }
    }

    async fn skip_chunks(&mut self) -> bool {
        loop {
            let (line, size) = loop {
                match httparse::parse_chunk_size(&self.buf[self.pos..]) {
                    Ok(httparse::Status::Complete((line, size))) => break (line, size),
                    Ok(httparse::Status::Partial) => {
                        if !self.want(self.buf.len() - self.pos + 1).await {
                            return false;
                        }
                    }
                    Err(_) => return false,
                }
            };
            self.pos += line;
            if size == 0 {
                return self.skip_trailers().await;
            }
            let Some(data) = usize::try_from(size).ok().filter(|&s| s <= MAX_BODY) else {
                return false;
            };
            if !self.want(data + 2).await
                || &self.buf[self.pos + data..self.pos + data + 2] != b"\r\n"
            {
                return false;
            }
            self.pos += data + 2;
        }
    }

    /// The trailer section after the last chunk: lines up to an empty one.
    async fn skip_trailers(&mut self) -> bool {
        loop {
            let end = loop {
                if let Some(i) = self.buf[self.pos..].iter().position(|&b| b == b'\n') {
                    break self.pos + i;
                }
                if !self.want(self.buf.len() - self.pos + 1).await {
                    return false;
                }
            };
            let empty = end == self.pos || (end == self.pos + 1 && self.buf[self.pos] == b'\r');
            self.pos = end + 1;
            if empty {
                return true;
            }
        }
    }
}

/// The status of the first line of `buf`, which holds a `\n`.
fn status_line_of(buf: &[u8]) -> Result<u16, ProbeError> {
    match buf.iter().position(|&b| b == b'\n') {
        Some(end) => parse_status_line(&buf[..=end]),
        None => Err(ProbeError::Malformed),
    }
}

/// Parses one status line ending in `\n`. With no room for headers, httparse stops after
/// the status line and reports `Partial`; the code is filled in by then.
fn parse_status_line(line: &[u8]) -> Result<u16, ProbeError> {
    let mut response = httparse::Response::new(&mut []);
    match response.parse(line) {
        Ok(_) => response.code.ok_or(ProbeError::Malformed),
        Err(_) => Err(ProbeError::Malformed),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn answer(bytes: &[u8], keep: bool) -> Result<Answer, ProbeError> {
        let mut stream = bytes;
        read_answer(&mut stream, keep).await
    }

    fn kept(status: u16) -> Answer {
        Answer {
            status,
            reusable: true,
        }
    }

    #[tokio::test]
    async fn an_answer_is_read_to_its_end_by_its_framing() {
        let length = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
        assert_eq!(answer(length, true).await.unwrap(), kept(200));
        let chunked = b"HTTP/1.1 503 Busy\r\nTransfer-Encoding: chunked\r\n\r\n2;x=y\r\nok\r\n0\r\nT: 1\r\n\r\n";
        assert_eq!(answer(chunked, true).await.unwrap(), kept(503));
        let empty = b"HTTP/1.1 204 No Content\r\n\r\n";
        assert_eq!(answer(empty, true).await.unwrap(), kept(204));
    }

    #[tokio::test]
    async fn a_connection_whose_end_is_not_certain_is_not_kept() {
        for bytes in [
            &b"HTTP/1.1 200 OK\r\nConnection: keep-alive, close\r\nContent-Length: 0\r\n\r\n"[..],
            b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n",
            b"HTTP/1.1 200 OK\r\n\r\nuntil close",
            b"HTTP/1.1 200 OK\r\nContent-Length: 99999999\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok",
            b"HTTP/1.1 200 OK\r\nContent-Length: +2\r\n\r\nok",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 2\r\n\r\n0\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nxx",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nokX0\r\n\r\n",
            // Cut short, or followed by bytes nobody asked for.
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nok",
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 200 OK\r\n",
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
        ] {
            let got = answer(bytes, true).await.unwrap();
            assert!(!got.reusable, "{}", String::from_utf8_lossy(bytes));
        }
    }

    #[tokio::test]
    async fn the_status_line_decides_when_the_rest_does_not_parse() {
        let cut = b"HTTP/1.1 200 OK\r\nContent-Le";
        assert_eq!(answer(cut, true).await.unwrap().status, 200);
        let bad_header = b"HTTP/1.1 200 OK\r\nBad Header\r\n\r\n";
        assert_eq!(answer(bad_header, true).await.unwrap().status, 200);
        let many = format!("HTTP/1.1 500 X\r\n{}\r\n", "A: b\r\n".repeat(40));
        assert_eq!(answer(many.as_bytes(), true).await.unwrap().status, 500);
        assert!(matches!(
            answer(b"garbage\r\n\r\n", true).await,
            Err(ProbeError::Malformed)
        ));
        assert!(matches!(
            answer(b"HTTP/1.1 2", true).await,
            Err(ProbeError::Closed)
        ));
        assert!(matches!(answer(b"", true).await, Err(ProbeError::Closed)));
        // Not kept: the status line is enough, whatever follows.
        assert_eq!(
            answer(b"HTTP/1.1 200 OK\r\n", false).await.unwrap(),
            Answer::last(200)
        );
    }

    #[test]
    fn status_line_parsing() {
        assert_eq!(parse_status_line(b"HTTP/1.1 200 OK\r\n").unwrap(), 200);
        assert_eq!(parse_status_line(b"HTTP/1.0 503 Busy\n").unwrap(), 503);
        assert_eq!(parse_status_line(b"HTTP/1.1 204\r\n").unwrap(), 204);
        assert!(matches!(
            parse_status_line(b"garbage\r\n"),
            Err(ProbeError::Malformed)
        ));
        assert!(matches!(
            parse_status_line(b"HTTP/1.1 2x0 OK\r\n"),
            Err(ProbeError::Malformed)
        ));
        assert!(matches!(
            parse_status_line(b"SSH-2.0-OpenSSH\r\n"),
            Err(ProbeError::Malformed)
        ));
    }
}
