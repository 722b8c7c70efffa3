//! One HTTP/2 stream as the client side of an exchange (`ClientStream::H2`): its request
//! body read as the HTTP/1.1 body the backend gets, and its response written the way
//! the HTTP/1.1 relay writes to a socket. This is the response sink of the exchange:
//! the relay, drover's error pages and redirects write a head (drover's own, already
//! checked and stripped by `http1::response`) and then body bytes; the sink turns the
//! head into a HEADERS frame and the bytes into DATA frames under the stream's flow
//! control.
//!
//! Shared with the stream's task (`Arc<Mutex<_>>`) so that it can watch for the
//! client's reset while the exchange runs, and drop the exchange at once: a stream the
//! client resets holds no backend and no slot (rapid reset, CVE-2023-44487). The lock
//! is only ever taken inside a poll, by one task: it is never contended.

use super::chunks::{
    chunk, poll_window, send_unsent, trailer_fields, CONNECTION_SPECIFIC, MAX_DATA,
};
use crate::http1::chunked::ChunkedScanner;
use bytes::{Buf, Bytes, BytesMut};
use h2::server::SendResponse;
use h2::{Reason, RecvStream, SendStream};
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{ready, Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The client side of one stream; see the module's doc.
#[derive(Clone)]
pub(crate) struct H2Client {
    shared: Arc<Mutex<StreamState>>,
    local: std::net::SocketAddr,
}

struct StreamState {
    body: RecvStream,
    /// The request has no length: its body goes to the backend chunked.
    chunked: bool,
    /// Body bytes (framed) read from the stream, not yet taken.
    pending: Bytes,
    body_ended: bool,
    /// A HEAD request: its response has no body, whatever its Content-Length says.
    is_head: bool,
    response: Response,
}

enum Response {
    /// Nothing sent yet; `head` collects drover's HTTP/1.1 head until its blank line.
    Head {
        respond: SendResponse<Bytes>,
        head: Vec<u8>,
    },
    /// Headers sent; `left` body bytes to come (`None`: until the exchange ends), or
    /// a chunked body (`dechunk`) decoded into DATA frames and its trailers.
    Body {
        send: SendStream<Bytes>,
        left: Option<u64>,
        dechunk: Option<Box<Dechunk>>,
    },
    /// The stream is ended (or reset): further bytes are discarded.
    Done,
}

/// A chunked response body on its way to an HTTP/2 client: the chunks' payload goes
/// out as DATA, the trailer section as a trailing HEADERS frame (gRPC's status rides
/// there).
struct Dechunk {
    scanner: ChunkedScanner,
    /// Payload decoded and not yet sent (the stream's window was short).
    unsent: BytesMut,
}

impl H2Client {
    pub(crate) fn new(
        body: RecvStream,
        respond: SendResponse<Bytes>,
        chunked: bool,
        is_head: bool,
        local: std::net::SocketAddr,
    ) -> H2Client {
        H2Client {
            shared: Arc::new(Mutex::new(StreamState {
                body,
                chunked,
                pending: Bytes::new(),
                body_ended: false,
                is_head,
                response: Response::Head {
                    respond,
                    head: Vec::new(),
                },
            })),
            local,
        }
    }

    fn state(&self) -> MutexGuard<'_, StreamState> {
        // Poisoned only by a panic in a poll of this stream's own task, which ends it.
        self.shared.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn local_addr(&self) -> std::net::SocketAddr {
        self.local
    }

    /// Ready when the client resets the stream (or the connection fails) before its
    /// response has ended.
    pub(crate) fn poll_client_reset(&self, cx: &mut Context<'_>) -> Poll<()> {
        let mut state = self.state();
        let reset = match &mut state.response {
            Response::Head { respond, .. } => respond.poll_reset(cx),
            Response::Body { send, .. } => send.poll_reset(cx),
            Response::Done => return Poll::Pending,
        };
        reset.map(|_| ())
    }

    /// The exchange is over: end the stream if its response is complete (a body
    /// without a length ends here), reset it if not (cut short, or never answered),
    /// so that a client never takes a partial body for a whole one.
    pub(crate) fn finish(&self, cut: bool) {
        let mut state = self.state();
        match std::mem::replace(&mut state.response, Response::Done) {
            Response::Head { mut respond, .. } => respond.send_reset(Reason::INTERNAL_ERROR),
            Response::Body {
                mut send,
                left,
                dechunk,
            } => {
                let unfinished =
                    dechunk.is_some_and(|d| !d.scanner.is_done() || !d.unsent.is_empty());
                if cut || unfinished || left.is_some_and(|n| n > 0) {
                    send.send_reset(Reason::INTERNAL_ERROR);
                } else {
                    let _ = send.send_data(Bytes::new(), true);
                }
            }
            Response::Done => {}
        }
    }
}

impl StreamState {
    /// Takes bytes of drover's head; once its blank line is in, sends the HEADERS.
    /// Returns how many bytes of `buf` belonged to the head.
    fn write_head(&mut self, buf: &[u8]) -> io::Result<usize> {
        let Response::Head { head, respond } = &mut self.response else {
            return Ok(0);
        };
        let before = head.len();
        head.extend_from_slice(buf);
        let Some(end) = memchr::memmem::find(head, b"\r\n\r\n") else {
            return Ok(buf.len());
        };
        let used = end + 4 - before;
        head.truncate(end + 4);
        let (response, length, chunked) = to_h2_head(head)?;
        let status = response.status();
        if status.is_informational() {
            // A 100 Continue (drover's own, or a backend's) says nothing HTTP/2's flow
            // control does not; any other 1xx (103 Early Hints) goes on as it came.
            if status != http::StatusCode::CONTINUE {
                respond
                    .send_informational(response)
                    .map_err(io::Error::other)?;
            }
            head.clear();
            return Ok(used);
        }
        let no_body = self.is_head
            || status == http::StatusCode::NO_CONTENT
            || status == http::StatusCode::NOT_MODIFIED
            || length == Some(0);
        let Response::Head { mut respond, .. } =
            std::mem::replace(&mut self.response, Response::Done)
        else {
            unreachable!("matched above");
        };
        let send = respond
            .send_response(response, no_body)
            .map_err(io::Error::other)?;
        if !no_body {
            let dechunk = (chunked && length.is_none()).then(|| {
                Box::new(Dechunk {
                    scanner: ChunkedScanner::keeping_trailers(),
                    unsent: BytesMut::new(),
                })
            });
            self.response = Response::Body {
                send,
                left: length,
                dechunk,
            };
        }
        Ok(used)
    }
}

/// drover's HTTP/1.1 response head as an HTTP/2 one, without the fields HTTP/2
/// forbids; its Content-Length, and whether its body is chunked.
fn to_h2_head(head: &[u8]) -> io::Result<(http::Response<()>, Option<u64>, bool)> {
    let mut slots = crate::http1::HeadSlots::new();
    let (result, parsed) = slots.response(head, usize::MAX);
    let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_owned());
    match result {
        Ok(httparse::Status::Complete(_)) => {}
        _ => return Err(bad("response head")),
    }
    let mut response = http::Response::new(());
    *response.status_mut() =
        http::StatusCode::from_u16(parsed.code.unwrap_or(502)).map_err(|_| bad("status"))?;
    let (mut length, mut chunked) = (None, false);
    let fields = response.headers_mut();
    for h in parsed.headers.iter() {
        if h.name.eq_ignore_ascii_case("transfer-encoding") {
            // `http1::response` let only a final `chunked` through.
            chunked = true;
        }
        if CONNECTION_SPECIFIC
            .iter()
            .any(|c| h.name.eq_ignore_ascii_case(c))
        {
            continue;
        }
        if h.name.eq_ignore_ascii_case("content-length") {
            length = crate::http1::headers::parse_content_length(h.value);
        }
        // Checked by `http1::response` before: a field that still does not fit HTTP/2's
        // rules is dropped rather than sent.
        if let (Ok(name), Ok(value)) = (
            http::HeaderName::from_bytes(h.name.as_bytes()),
            http::HeaderValue::from_bytes(h.value),
        ) {
            fields.append(name, value);
        }
    }
    Ok((response, length, chunked))
}

impl StreamState {
    /// A chunked body's bytes: decoded, and the payload sent as the window allows.
    /// Returns how many of `buf` were taken.
    fn write_chunked(&mut self, buf: &[u8], cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        let Response::Body {
            send,
            dechunk: Some(d),
            ..
        } = &mut self.response
        else {
            return Poll::Ready(Ok(buf.len()));
        };
        ready!(send_unsent(send, &mut d.unsent, cx))?;
        if d.scanner.is_done() {
            // Past the body's end: nothing more belongs to it.
            return Poll::Ready(Ok(buf.len()));
        }
        let take = buf.len().min(MAX_DATA);
        let unsent = &mut d.unsent;
        let used = d
            .scanner
            .scan(&buf[..take], |data| unsent.extend_from_slice(data))
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        // Sent now if the window is open; else by the next write or the flush.
        if let Poll::Ready(Err(e)) = send_unsent(send, unsent, cx) {
            return Poll::Ready(Err(e));
        }
        Poll::Ready(Ok(used))
    }

    /// A chunked body's flush: the payload out, then, once the body has ended, its
    /// trailers (or an empty DATA frame) end the stream.
    fn flush_chunked(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let Response::Body {
            send,
            dechunk: Some(d),
            ..
        } = &mut self.response
        else {
            return Poll::Ready(Ok(()));
        };
        ready!(send_unsent(send, &mut d.unsent, cx))?;
        if !d.scanner.is_done() {
            return Poll::Ready(Ok(()));
        }
        let trailers = trailer_fields(&d.scanner.take_trailers());
        let ended = if trailers.is_empty() {
            send.send_data(Bytes::new(), true)
        } else {
            send.send_trailers(trailers)
        };
        self.response = Response::Done;
        Poll::Ready(ended.map_err(io::Error::other))
    }
}

impl AsyncRead for H2Client {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let mut guard = self.state();
        let state = &mut *guard;
        loop {
            if !state.pending.is_empty() {
                let n = state.pending.len().min(buf.remaining());
                buf.put_slice(&state.pending[..n]);
                state.pending.advance(n);
                return Poll::Ready(Ok(()));
            }
            if state.body_ended {
                return Poll::Ready(Ok(()));
            }
            match ready!(state.body.poll_data(cx)) {
                Some(Ok(data)) => {
                    // At most one DATA frame waits here: the window opens as drover
                    // reads, so a backend that reads slowly slows the client.
                    let _ = state.body.flow_control().release_capacity(data.len());
                    if data.is_empty() {
                        continue;
                    }
                    state.pending = if state.chunked { chunk(&data) } else { data };
                }
                // A reset, or a Content-Length the DATA frames disagree with (h2 checks
                // it and resets the stream): the body failed.
                Some(Err(e)) => return Poll::Ready(Err(io::Error::other(e))),
                None if state.chunked => {
                    // The last chunk, with the request's trailers (gRPC sends none,
                    // but HTTP/2 allows them) as its trailer section.
                    let trailers = match ready!(state.body.poll_trailers(cx)) {
                        Ok(t) => t.unwrap_or_default(),
                        Err(e) => return Poll::Ready(Err(io::Error::other(e))),
                    };
                    state.body_ended = true;
                    state.pending = super::chunks::last_chunk(&trailers);
                }
                None => state.body_ended = true,
            }
        }
    }
}

impl AsyncWrite for H2Client {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let mut state = self.state();
        if matches!(state.response, Response::Head { .. }) {
            return Poll::Ready(state.write_head(buf));
        }
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        if matches!(
            state.response,
            Response::Body {
                dechunk: Some(_),
                ..
            }
        ) {
            return state.write_chunked(buf, cx);
        }
        let Response::Body { send, left, .. } = &mut state.response else {
            // Ended: a body the head said it has none of (HEAD, 204), or after a reset.
            return Poll::Ready(Ok(buf.len()));
        };
        let want = buf.len().min(MAX_DATA);
        let want = left.map_or(want, |l| want.min(usize::try_from(l).unwrap_or(usize::MAX)));
        if want == 0 {
            // More bytes than the Content-Length said: never sent.
            return Poll::Ready(Ok(buf.len()));
        }
        let n = ready!(poll_window(send, want, cx))?;
        let end = left.is_some_and(|l| l == n as u64);
        if let Err(e) = send.send_data(Bytes::copy_from_slice(&buf[..n]), end) {
            return Poll::Ready(Err(io::Error::other(e)));
        }
        if let Some(l) = left {
            *l -= n as u64;
        }
        if end {
            state.response = Response::Done;
        }
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // The connection's task writes the frames out; a chunked body's decoded payload
        // and trailers are handed to it here.
        self.state().flush_chunked(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.finish(false);
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_specific_fields_never_reach_an_http2_client() {
        let head = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\nKeep-Alive: timeout=5\r\nTransfer-Encoding: gzip\r\nUpgrade: h2c\r\nProxy-Connection: x\r\nTE: trailers\r\nSet-Cookie: a=1\r\nSet-Cookie: b=2\r\nX-A: b\r\n\r\n";
        let (response, length, chunked) = to_h2_head(head).unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!((length, chunked), (Some(2), true));
        let mut names: Vec<&str> = response.headers().keys().map(|n| n.as_str()).collect();
        names.sort_unstable();
        assert_eq!(names, ["content-length", "set-cookie", "x-a"]);
        assert_eq!(response.headers().get_all("set-cookie").iter().count(), 2);
    }

    #[test]
    fn trailers_keep_what_http2_allows() {
        let t = trailer_fields(
            b"grpc-status: 0\r\ngrpc-message: ok\r\nConnection: x\r\nContent-Length: 3\r\n",
        );
        let mut names: Vec<&str> = t.keys().map(|n| n.as_str()).collect();
        names.sort_unstable();
        assert_eq!(names, ["grpc-message", "grpc-status"]);
        assert!(trailer_fields(b"").is_empty());
    }

    #[test]
    fn a_head_without_a_length_runs_until_the_exchange_ends() {
        let (response, length, chunked) = to_h2_head(b"HTTP/1.1 502 Bad Gateway\r\n\r\n").unwrap();
        assert_eq!(
            (response.status().as_u16(), length, chunked),
            (502, None, false)
        );
        assert!(to_h2_head(b"HTTP/1.1 200 OK\r\n").is_err(), "incomplete");
    }
}
