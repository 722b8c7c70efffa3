//! Where HTTP/1.1's chunked framing meets HTTP/2's frames, both ways (a client's stream
//! in `stream.rs`, a backend's in `backend.rs`): DATA sent as a stream's window allows,
//! payload framed as chunks, and a trailer section as HTTP/2 trailers and back.

use bytes::{Bytes, BytesMut};
use h2::SendStream;
use std::io;
use std::task::{ready, Context, Poll};

/// Largest DATA payload asked of a stream's window at once.
pub(crate) const MAX_DATA: usize = 64 * 1024;

/// Fields HTTP/2 forbids (RFC 9113 §8.2.2): HTTP/1.1's connection management.
pub(crate) const CONNECTION_SPECIFIC: [&str; 6] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "upgrade",
    "te",
];

/// `data` as one chunk of a chunked body.
pub(crate) fn chunk(data: &[u8]) -> Bytes {
    let mut framed = BytesMut::with_capacity(data.len() + 12);
    framed.extend_from_slice(format!("{:x}\r\n", data.len()).as_bytes());
    framed.extend_from_slice(data);
    framed.extend_from_slice(b"\r\n");
    framed.freeze()
}

/// A chunked body's trailer lines (`Name: value\r\n`, checked by the chunked scanner
/// and `http1`'s rules) as HTTP/2 trailers, without the fields HTTP/2 forbids there.
pub(crate) fn trailer_fields(lines: &[u8]) -> http::HeaderMap {
    let mut fields = http::HeaderMap::new();
    let mut section = Vec::with_capacity(lines.len() + 2);
    section.extend_from_slice(lines);
    section.extend_from_slice(b"\r\n");
    let mut slots = [httparse::EMPTY_HEADER; crate::http1::HEADER_SLOTS];
    if let Ok(httparse::Status::Complete((_, parsed))) =
        httparse::parse_headers(&section, &mut slots)
    {
        for h in parsed {
            let forbidden = CONNECTION_SPECIFIC
                .iter()
                .chain(&["content-length", "host", "trailer"])
                .any(|c| h.name.eq_ignore_ascii_case(c));
            if forbidden {
                continue;
            }
            if let (Ok(name), Ok(value)) = (
                http::HeaderName::from_bytes(h.name.as_bytes()),
                http::HeaderValue::from_bytes(h.value),
            ) {
                fields.append(name, value);
            }
        }
    }
    fields
}

/// The last chunk of a chunked body, with `trailers` as its trailer section: fields
/// whose value a line break or NUL would split are left out (h2 refuses them anyway).
pub(crate) fn last_chunk(trailers: &http::HeaderMap) -> Bytes {
    let mut out = BytesMut::from(&b"0\r\n"[..]);
    for (name, value) in trailers {
        let value = value.as_bytes();
        if value.iter().any(|&b| matches!(b, b'\r' | b'\n' | 0)) {
            continue;
        }
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out.freeze()
}

/// Sends what `unsent` holds as DATA, as the stream's window allows: `Ready` once all
/// of it is out.
pub(crate) fn send_unsent(
    send: &mut SendStream<Bytes>,
    unsent: &mut BytesMut,
    cx: &mut Context<'_>,
) -> Poll<io::Result<()>> {
    while !unsent.is_empty() {
        let n = ready!(poll_window(send, unsent.len().min(MAX_DATA), cx))?;
        send.send_data(unsent.split_to(n).freeze(), false)
            .map_err(io::Error::other)?;
    }
    Poll::Ready(Ok(()))
}

/// Up to `want` bytes of the stream's window, once some is open.
pub(crate) fn poll_window(
    send: &mut SendStream<Bytes>,
    want: usize,
    cx: &mut Context<'_>,
) -> Poll<io::Result<usize>> {
    send.reserve_capacity(want);
    loop {
        let granted = send.capacity();
        if granted > 0 {
            return Poll::Ready(Ok(granted.min(want)));
        }
        match ready!(send.poll_capacity(cx)) {
            Some(Ok(_)) => {}
            Some(Err(e)) => return Poll::Ready(Err(io::Error::other(e))),
            None => return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into())),
        }
    }
}
