//! Hand-written HTTP/1.1 framing shared by the backend and the clients.
//!
//! The testkit deliberately avoids hyper: it must be able to see (and send)
//! exactly the bytes on the wire, including malformed ones, so that tests can
//! check what drover forwards byte for byte.

use bytes::{Buf, BytesMut};
use std::io;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Heads larger than this are refused; generous, since tests send oversize
/// headers on purpose to drover, never to the testkit directly.
pub(crate) const MAX_HEAD: usize = 256 * 1024;
const MAX_HEADERS: usize = 128;

/// A header list as seen on the wire: names as sent, values as raw bytes.
pub type HeaderList = Vec<(String, Vec<u8>)>;

/// One request head, as the backend received it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestHead {
    pub method: String,
    /// The request target exactly as sent (path plus query).
    pub target: String,
    /// Minor version: 1 for HTTP/1.1, 0 for HTTP/1.0.
    pub version: u8,
    pub headers: HeaderList,
    /// The raw head bytes: request line and header lines, with the final
    /// blank line.
    pub raw: Vec<u8>,
}

impl RequestHead {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        find_header(&self.headers, name)
    }

    /// The first value of header `name` as UTF-8 text (lossy).
    pub fn header_str(&self, name: &str) -> Option<String> {
        self.header(name)
            .map(|v| String::from_utf8_lossy(v).into_owned())
    }

    /// All values of header `name` (case-insensitive), in order.
    pub fn header_all(&self, name: &str) -> Vec<&[u8]> {
        self.headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_slice())
            .collect()
    }

    /// The path part of the target, without the query string.
    pub fn path(&self) -> &str {
        self.target.split('?').next().unwrap_or("")
    }
}

pub(crate) fn find_header<'a>(headers: &'a HeaderList, name: &str) -> Option<&'a [u8]> {
    headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_slice())
}

/// Does a comma-separated header value list contain `token`
/// (case-insensitive)? Used for `Connection` and `Transfer-Encoding`.
pub(crate) fn has_token(value: &[u8], token: &str) -> bool {
    value
        .split(|&b| b == b',')
        .any(|t| t.trim_ascii().eq_ignore_ascii_case(token.as_bytes()))
}

/// How a message body is delimited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BodyKind {
    None,
    Length(u64),
    Chunked,
    /// Response only: the body runs until the connection closes.
    UntilClose,
}

/// Request framing per RFC 9112 section 6: chunked wins over Content-Length.
pub(crate) fn request_body_kind(headers: &HeaderList) -> io::Result<BodyKind> {
    if let Some(te) = find_header(headers, "transfer-encoding") {
        if last_coding_is_chunked(te) {
            return Ok(BodyKind::Chunked);
        }
        return Err(invalid("request Transfer-Encoding without final chunked"));
    }
    match find_header(headers, "content-length") {
        Some(v) => Ok(BodyKind::Length(parse_length(v)?)),
        None => Ok(BodyKind::None),
    }
}

/// Response framing; `status` and whether the request was HEAD decide
/// whether a body can exist at all.
pub(crate) fn response_body_kind(
    status: u16,
    head_request: bool,
    headers: &HeaderList,
) -> io::Result<BodyKind> {
    if head_request || (100..200).contains(&status) || status == 204 || status == 304 {
        return Ok(BodyKind::None);
    }
    if let Some(te) = find_header(headers, "transfer-encoding") {
        if last_coding_is_chunked(te) {
            return Ok(BodyKind::Chunked);
        }
        return Ok(BodyKind::UntilClose);
    }
    match find_header(headers, "content-length") {
        Some(v) => Ok(BodyKind::Length(parse_length(v)?)),
        None => Ok(BodyKind::UntilClose),
    }
}

fn last_coding_is_chunked(te: &[u8]) -> bool {
    te.split(|&b| b == b',')
        .next_back()
        .is_some_and(|t| t.trim_ascii().eq_ignore_ascii_case(b"chunked"))
}

fn parse_length(v: &[u8]) -> io::Result<u64> {
    std::str::from_utf8(v)
        .ok()
        .map(str::trim)
        .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| invalid("bad Content-Length"))
}

pub(crate) fn invalid(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.to_string())
}

fn unexpected_eof(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::UnexpectedEof, format!("EOF in {what}"))
}

/// A stream with a read buffer, so that bytes read past one message (the
/// next pipelined request, the first WebSocket frame) are never lost.
pub(crate) struct BufConn<S> {
    pub io: S,
    pub buf: BytesMut,
}

impl<S: AsyncRead + AsyncWrite + Unpin> BufConn<S> {
    pub fn new(io: S) -> Self {
        BufConn {
            io,
            buf: BytesMut::with_capacity(8 * 1024),
        }
    }

    /// Reads more bytes into the buffer; returns 0 at EOF.
    async fn fill(&mut self) -> io::Result<usize> {
        self.buf.reserve(8 * 1024);
        self.io.read_buf(&mut self.buf).await
    }

    /// Reads one head (up to and including the blank line). `Ok(None)` when
    /// the peer closed cleanly before sending any byte of a new message.
    pub async fn read_head(&mut self) -> io::Result<Option<Vec<u8>>> {
        let mut searched = 0;
        loop {
            if let Some(pos) = memchr::memmem::find(&self.buf[searched..], b"\r\n\r\n") {
                let end = searched + pos + 4;
                return Ok(Some(self.buf.split_to(end).to_vec()));
            }
            // Re-scan the last 3 bytes: the terminator may straddle reads.
            searched = self.buf.len().saturating_sub(3);
            if self.buf.len() > MAX_HEAD {
                return Err(invalid("head too large"));
            }
            if self.fill().await? == 0 {
                return if self.buf.is_empty() {
                    Ok(None)
                } else {
                    Err(unexpected_eof("head"))
                };
            }
        }
    }

    /// Waits until at least one byte is buffered; false at EOF.
    pub async fn fill_some(&mut self) -> io::Result<bool> {
        while self.buf.is_empty() {
            if self.fill().await? == 0 {
                return Ok(false);
            }
        }
        Ok(true)
    }

    pub async fn read_exact_n(&mut self, n: usize) -> io::Result<Vec<u8>> {
        while self.buf.len() < n {
            if self.fill().await? == 0 {
                return Err(unexpected_eof("body"));
            }
        }
        Ok(self.buf.split_to(n).to_vec())
    }

    /// One CRLF-terminated line, without the CRLF.
    async fn read_line(&mut self) -> io::Result<Vec<u8>> {
        loop {
            if let Some(pos) = memchr::memmem::find(&self.buf, b"\r\n") {
                let line = self.buf.split_to(pos).to_vec();
                self.buf.advance(2);
                return Ok(line);
            }
            if self.buf.len() > MAX_HEAD {
                return Err(invalid("line too long"));
            }
            if self.fill().await? == 0 {
                return Err(unexpected_eof("chunked line"));
            }
        }
    }

    /// Decodes a chunked body: returns the decoded chunks (in the sizes the
    /// peer sent them) and the trailer fields.
    pub async fn read_chunked(&mut self) -> io::Result<(Vec<Vec<u8>>, HeaderList)> {
        let mut chunks = Vec::new();
        loop {
            let line = self.read_line().await?;
            // Chunk extensions (";name=value") are allowed and ignored.
            let size_part = line.split(|&b| b == b';').next().unwrap_or(&[]);
            let size_text = std::str::from_utf8(size_part.trim_ascii())
                .map_err(|_| invalid("chunk size not ASCII"))?;
            if size_text.is_empty() || !size_text.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(invalid("bad chunk size"));
            }
            let size =
                usize::from_str_radix(size_text, 16).map_err(|_| invalid("chunk too big"))?;
            if size == 0 {
                break;
            }
            let data = self.read_exact_n(size).await?;
            if self.read_line().await?.is_empty() {
                chunks.push(data);
            } else {
                return Err(invalid("chunk data not followed by CRLF"));
            }
        }
        let mut trailers = Vec::new();
        loop {
            let line = self.read_line().await?;
            if line.is_empty() {
                return Ok((chunks, trailers));
            }
            let colon = memchr::memchr(b':', &line).ok_or_else(|| invalid("bad trailer"))?;
            let name = String::from_utf8_lossy(line[..colon].trim_ascii()).into_owned();
            trailers.push((name, line[colon + 1..].trim_ascii().to_vec()));
        }
    }

    pub async fn read_to_end(&mut self) -> io::Result<Vec<u8>> {
        while self.fill().await? != 0 {}
        Ok(self.buf.split().to_vec())
    }

    /// Reads a body of the given kind; chunked bodies come back joined.
    pub async fn read_body(&mut self, kind: BodyKind) -> io::Result<(Vec<u8>, HeaderList)> {
        match kind {
            BodyKind::None => Ok((Vec::new(), Vec::new())),
            BodyKind::Length(n) => {
                let n = usize::try_from(n).map_err(|_| invalid("body too big"))?;
                Ok((self.read_exact_n(n).await?, Vec::new()))
            }
            BodyKind::Chunked => {
                let (chunks, trailers) = self.read_chunked().await?;
                Ok((chunks.concat(), trailers))
            }
            BodyKind::UntilClose => Ok((self.read_to_end().await?, Vec::new())),
        }
    }

    pub async fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.io.write_all(bytes).await?;
        self.io.flush().await
    }
}

/// Parses a request head (as returned by `read_head`).
pub(crate) fn parse_request_head(raw: Vec<u8>) -> io::Result<RequestHead> {
    let mut storage = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut storage);
    match req.parse(&raw) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) => return Err(invalid("partial request head")),
        Err(e) => return Err(invalid(&format!("bad request head: {e}"))),
    }
    let head = RequestHead {
        method: req.method.unwrap_or("").to_string(),
        target: req.path.unwrap_or("").to_string(),
        version: req.version.unwrap_or(1),
        headers: collect_headers(req.headers),
        raw: Vec::new(),
    };
    Ok(RequestHead { raw, ..head })
}

/// A parsed response head: status and headers.
pub(crate) struct ResponseHead {
    pub status: u16,
    pub headers: HeaderList,
}

pub(crate) fn parse_response_head(raw: &[u8]) -> io::Result<ResponseHead> {
    let mut storage = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut storage);
    match resp.parse(raw) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) => return Err(invalid("partial response head")),
        Err(e) => return Err(invalid(&format!("bad response head: {e}"))),
    }
    Ok(ResponseHead {
        status: resp.code.unwrap_or(0),
        headers: collect_headers(resp.headers),
    })
}

fn collect_headers(headers: &[httparse::Header<'_>]) -> HeaderList {
    headers
        .iter()
        .map(|h| (h.name.to_string(), h.value.to_vec()))
        .collect()
}

/// Encodes `chunks` as a chunked body (with the terminating zero chunk and
/// no trailers), for tests that send chunked requests by hand.
pub fn chunked_body(chunks: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::new();
    for chunk in chunks.iter().filter(|c| !c.is_empty()) {
        out.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
        out.extend_from_slice(chunk);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"0\r\n\r\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn conn_with(input: &[u8]) -> BufConn<tokio::io::DuplexStream> {
        let (mut a, b) = tokio::io::duplex(1 << 16);
        a.write_all(input).await.unwrap();
        drop(a);
        BufConn::new(b)
    }

    #[tokio::test]
    async fn chunked_with_extensions_and_trailers() {
        let mut c = conn_with(
            b"3;ext=1\r\nabc\r\n10\r\n0123456789abcdef\r\n0\r\nX-T: 1\r\nY: two \r\n\r\nNEXT",
        )
        .await;
        let (chunks, trailers) = c.read_chunked().await.unwrap();
        assert_eq!(chunks, vec![b"abc".to_vec(), b"0123456789abcdef".to_vec()]);
        assert_eq!(
            trailers,
            vec![("X-T".into(), b"1".to_vec()), ("Y".into(), b"two".to_vec())]
        );
        assert_eq!(&c.buf[..], b"NEXT");
    }

    #[tokio::test]
    async fn bad_chunk_size_is_an_error() {
        let mut c = conn_with(b"zz\r\nabc\r\n0\r\n\r\n").await;
        assert!(c.read_chunked().await.is_err());
    }

    #[tokio::test]
    async fn head_split_across_reads_and_clean_eof() {
        let mut c = conn_with(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await;
        let raw = c.read_head().await.unwrap().unwrap();
        let head = parse_request_head(raw).unwrap();
        assert_eq!(head.method, "GET");
        assert_eq!(head.header_str("host").as_deref(), Some("x"));
        assert!(c.read_head().await.unwrap().is_none());
    }

    #[test]
    fn framing_rules() {
        let te = vec![("Transfer-Encoding".into(), b"gzip, chunked".to_vec())];
        assert_eq!(request_body_kind(&te).unwrap(), BodyKind::Chunked);
        let cl = vec![("content-length".into(), b" 12 ".to_vec())];
        assert_eq!(request_body_kind(&cl).unwrap(), BodyKind::Length(12));
        assert!(request_body_kind(&vec![("content-length".into(), b"-1".to_vec())]).is_err());
        assert_eq!(response_body_kind(204, false, &cl).unwrap(), BodyKind::None);
        assert_eq!(response_body_kind(200, true, &cl).unwrap(), BodyKind::None);
        assert_eq!(
            response_body_kind(200, false, &vec![]).unwrap(),
            BodyKind::UntilClose
        );
        assert_eq!(
            chunked_body(&[b"ab", b"", b"c"]),
            b"2\r\nab\r\n1\r\nc\r\n0\r\n\r\n"
        );
    }
}
