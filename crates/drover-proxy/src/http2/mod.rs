//! HTTP/2 from clients: over TLS when ALPN agrees on `h2`, or cleartext with prior
//! knowledge (`h2c`). The h2 crate (hyper's own HTTP/2) does the framing, HPACK and
//! flow control; drover writes no frame itself.
//!
//! Each stream is one request through the same phases as an HTTP/1.1 request (see
//! `conn/mod.rs`): its head is read here (`request.rs`) into the head drover's HTTP/1.1
//! parser checks, then `Conn` decides, forwards over the backends' HTTP/1.1 keep-alive
//! pool and accounts exactly as for HTTP/1.1, with the stream (`stream.rs`) as its
//! client: the request body is read from it and the response written into it.
//!
//! Defences, each set on the h2 server below: a limit on concurrent streams (and a
//! stream task per permit, so a stream the client resets frees its place only once
//! its exchange is dropped), rapid reset (streams reset before they are accepted,
//! streams drover had to reset, and a connection whose streams the client mostly
//! resets while drover answers them end the connection with ENHANCE_YOUR_CALM), the size
//! of a header list after HPACK decoding (the limit of an HTTP/1.1 head), which also
//! bounds CONTINUATION frames, and a send buffer per stream so a client that does not
//! read holds a bounded amount of memory until the client timeout cuts it off.
//!
//! A reload or shutdown sends GOAWAY: streams under way finish, new ones go to a new
//! connection (with the new settings).

pub mod backend;
mod chunks;
mod request;
mod stream;

pub(crate) use stream::H2Client;

use crate::conn::{self, ClientStream};
use crate::http1::forward::ClientInfo;
use crate::state::ThreadCell;
use bytes::Bytes;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tracing::debug;

/// The connection preface of HTTP/2 (RFC 9113 §3.4): with prior knowledge, the first
/// bytes a client sends.
pub(crate) const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Streams reset by the client before drover accepted them, at once, before the
/// connection is closed with ENHANCE_YOUR_CALM (the rapid reset attack, CVE-2023-44487;
/// hyper's default).
const MAX_PENDING_ACCEPT_RESETS: usize = 20;

/// Streams the client reset while drover was still answering them (after they were
/// accepted: the h2 crate's limit above counts those reset before) beyond which, if
/// they are also most of the connection's streams, the connection is closed with
/// ENHANCE_YOUR_CALM. Each such stream may have cost a backend request: a client that
/// opens and cancels streams as fast as drover takes them is the rapid reset attack
/// at its most expensive. A browser that cancels a few requests as it navigates is
/// far from both bounds. Twice the streams a client may have open at once.
const CLIENT_RESETS_PER_STREAM: usize = 2;

/// Streams drover itself had to reset for a client's errors, over a connection's life,
/// before it closes the connection (the h2 crate's default, said here).
const MAX_LOCAL_ERROR_RESETS: usize = 1024;

/// Bytes of response a stream may queue for a client that does not read; beyond it the
/// relay waits (and the client timeout runs), as for HTTP/1.1's response buffer.
const MAX_SEND_BUFFER: usize = 64 * 1024;

/// The connection's receive window: what one client connection's request bodies may
/// hold in drover's memory at once, whatever its streams' windows (the bound against
/// window exhaustion).
const CONNECTION_WINDOW: u32 = 1024 * 1024;

/// A stream's receive window. drover opens it again as it takes each DATA frame (see
/// `stream.rs`), and h2 says so once half is taken: at 64 KiB (`body::REQUEST_BUFFER`), a 50
/// MB upload over TLS waited on window updates and took 1.5x nginx's time (0.20 s
/// against 0.13 s, medians of 6); memory stays bounded by `CONNECTION_WINDOW`.
const STREAM_WINDOW: u32 = 256 * 1024;

/// Whether `buf` is, as far as it goes, the HTTP/2 preface: `Some(true)` once all of it
/// is there, `None` while it could still be.
pub(crate) fn is_preface(buf: &[u8]) -> Option<bool> {
    let n = buf.len().min(PREFACE.len());
    if buf[..n] != PREFACE[..n] {
        Some(false)
    } else if n == PREFACE.len() {
        Some(true)
    } else {
        None
    }
}

/// An I/O whose first bytes were already read (the preface that told drover the
/// protocol): it gives them back first.
pub(crate) struct Rewound {
    read: Vec<u8>,
    at: usize,
    io: ClientStream,
}

impl Rewound {
    pub(crate) fn new(read: Vec<u8>, io: ClientStream) -> Rewound {
        Rewound { read, at: 0, io }
    }
}

impl AsyncRead for Rewound {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if this.at < this.read.len() {
            let n = (this.read.len() - this.at).min(buf.remaining());
            buf.put_slice(&this.read[this.at..this.at + n]);
            this.at += n;
            if this.at == this.read.len() {
                this.read = Vec::new();
                this.at = 0;
            }
            return std::task::Poll::Ready(Ok(()));
        }
        std::pin::Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Rewound {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// Serves an HTTP/2 connection until the client leaves, it idles out, or a GOAWAY
/// (shutdown, reload) has let its streams finish. `io` gives back what was read of it.
pub(crate) async fn serve(io: Rewound, cell: Arc<ThreadCell>, info: ClientInfo, deadline: Instant) {
    let thread = cell.load_full();
    let shared = Arc::clone(&thread.shared);
    let local = match io.io.local_addr() {
        Ok(local) => local,
        Err(_) => return,
    };
    let opts = &shared.opts;
    let max_client_resets = CLIENT_RESETS_PER_STREAM * opts.http2_max_streams as usize;
    let mut builder = h2::server::Builder::new();
    builder
        .max_concurrent_streams(opts.http2_max_streams)
        .max_header_list_size(u32::try_from(opts.limits.max_header_bytes).unwrap_or(u32::MAX))
        .max_pending_accept_reset_streams(MAX_PENDING_ACCEPT_RESETS)
        .max_local_error_reset_streams(Some(MAX_LOCAL_ERROR_RESETS))
        .max_send_buffer_size(MAX_SEND_BUFFER)
        .initial_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW);
    let handshake = builder.handshake::<_, Bytes>(io);
    let mut connection = match tokio::time::timeout_at(deadline, handshake).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            debug!(client = %info.ip, "HTTP/2 handshake failed: {e}");
            return;
        }
        Err(_) => {
            debug!(client = %info.ip, "HTTP/2 preface not received within the header read timeout");
            return;
        }
    };
    shared.stats.record_http2_connection();
    let mut shutdown = shared.shutdown.clone();
    let mut retired = shared.retired.subscribe();
    let streams = Arc::new(Semaphore::new(opts.http2_max_streams as usize));
    let (mut accepted, resets) = (0usize, Arc::new(AtomicUsize::new(0)));
    let idle = opts.timeouts.idle;
    let idle_timer = tokio::time::sleep(idle);
    tokio::pin!(idle_timer);
    // A shutdown or reload that came between the accept and now has been seen already.
    let mut closing = *shutdown.borrow() || *retired.borrow();
    if closing {
        connection.graceful_shutdown();
    }
    drop(thread);
    loop {
        tokio::select! {
            next = connection.accept() => match next {
                Some(Ok((req, respond))) => {
                    idle_timer.as_mut().reset(Instant::now() + idle);
                    accepted += 1;
                    let reset = resets.load(Relaxed);
                    if reset > max_client_resets && reset * 2 > accepted {
                        debug!(client = %info.ip, reset, accepted, "HTTP/2 streams reset by the client, mostly: closed (rapid reset)");
                        connection.abrupt_shutdown(h2::Reason::ENHANCE_YOUR_CALM);
                        closing = true;
                        continue;
                    }
                    // h2 holds the client to MAX_CONCURRENT_STREAMS; the permits hold
                    // drover to it as well, counting a reset stream until its task ends.
                    let Ok(permit) = Arc::clone(&streams).try_acquire_owned() else {
                        let mut respond = respond;
                        respond.send_reset(h2::Reason::REFUSED_STREAM);
                        continue;
                    };
                    let (cell, info) = (Arc::clone(&cell), info.clone());
                    let resets = Arc::clone(&resets);
                    tokio::spawn(async move {
                        if serve_stream(req, respond, cell, info, local).await == Served::ResetByClient {
                            resets.fetch_add(1, Relaxed);
                        }
                        drop(permit);
                    });
                }
                Some(Err(e)) => {
                    debug!(client = %info.ip, "HTTP/2 connection failed: {e}");
                    break;
                }
                None => break,
            },
            _ = shutdown.changed(), if !closing => {
                closing = true;
                connection.graceful_shutdown();
            }
            _ = retired.changed(), if !closing => {
                closing = true;
                connection.graceful_shutdown();
            }
            () = &mut idle_timer, if !closing => {
                if connection.has_streams() {
                    idle_timer.as_mut().reset(Instant::now() + idle);
                } else {
                    closing = true;
                    connection.graceful_shutdown();
                }
            }
        }
    }
}

/// How a stream's exchange ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Served {
    Done,
    /// The client reset the stream before its answer was complete.
    ResetByClient,
}

/// One stream: its head read, then one exchange with the stream as its client; the
/// exchange is dropped as soon as the client resets the stream.
async fn serve_stream(
    req: http::Request<h2::RecvStream>,
    respond: h2::server::SendResponse<Bytes>,
    cell: Arc<ThreadCell>,
    info: ClientInfo,
    local: std::net::SocketAddr,
) -> Served {
    let (parts, body) = req.into_parts();
    let end_stream = body.is_end_stream();
    let mut head = Vec::new();
    let read = request::write_head(&parts, end_stream, &mut head);
    let chunked = request::body_is_chunked(&parts, end_stream);
    let client = H2Client::new(
        body,
        respond,
        chunked,
        parts.method == http::Method::HEAD,
        local,
    );
    let watch = client.clone();
    let exchange = conn::serve_stream(ClientStream::H2(Box::new(client)), cell, info, head, read);
    tokio::pin!(exchange);
    let reset = std::future::poll_fn(|cx| watch.poll_client_reset(cx));
    tokio::select! {
        () = &mut exchange => Served::Done,
        () = reset => {
            debug!("HTTP/2 stream reset by the client: its exchange is dropped");
            Served::ResetByClient
        }
    }
}
