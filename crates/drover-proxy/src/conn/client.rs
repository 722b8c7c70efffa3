//! The client's side of an exchange: plain TCP, TLS over it, or one HTTP/2 stream
//! (`http2::H2Client`, which reads a request body and takes a response as a socket
//! would: the response sink the relay writes into).
//!
//! An enum rather than a generic `Conn<S>`: one copy of the connection code instead of
//! two, and a plain connection pays one predictable branch per read or write. The TLS
//! stream is boxed: its rustls state is ~1 KiB, and a plain idle connection should not
//! carry room for it.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;

pub(crate) enum ClientStream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
    H2(Box<crate::http2::H2Client>),
}

impl ClientStream {
    /// The HTTP/2 stream this exchange answers, if it is one.
    pub(crate) fn h2(&self) -> Option<&crate::http2::H2Client> {
        match self {
            ClientStream::H2(s) => Some(s),
            _ => None,
        }
    }

    /// The TCP stream, for a handoff: `Err` gives a TLS stream back (its session keys
    /// are in this process: a worker could not read it).
    pub(crate) fn into_plain(self) -> Result<TcpStream, ClientStream> {
        match self {
            ClientStream::Plain(s) => Ok(s),
            tls => Err(tls),
        }
    }

    pub(crate) fn is_plain(&self) -> bool {
        matches!(self, ClientStream::Plain(_))
    }

    /// The address the client connected to (for a PROXY protocol header sent on).
    pub(crate) fn local_addr(&self) -> io::Result<std::net::SocketAddr> {
        match self {
            ClientStream::Plain(s) => s.local_addr(),
            ClientStream::Tls(s) => s.get_ref().0.local_addr(),
            ClientStream::H2(s) => Ok(s.local_addr()),
        }
    }

    /// Whether the client has closed its end, or its connection broke: asked while a
    /// long-lived exchange waits on a quiet backend, where no write would find out (as
    /// nginx asks before it gives up on an upstream for its client). A TCP or TLS
    /// client that half-closed has left too: HTTP/1.1 clients do not half-close to
    /// wait for an answer. An HTTP/2 stream says so by its reset, watched for on its own
    /// (`http2::serve_stream`).
    pub(crate) fn has_left(&self) -> bool {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        use std::os::fd::AsFd;
        let tcp = match self {
            ClientStream::Plain(s) => s,
            ClientStream::Tls(s) => s.get_ref().0,
            ClientStream::H2(_) => return false,
        };
        // Only POLLRDHUP (Linux's "the peer shut down its writing half", which nix does
        // not name) is asked for, so any event at all says the client left: that one,
        // or POLLHUP/POLLERR, which poll always reports. (nix's `revents` cannot show
        // a flag it does not name.)
        let rdhup = PollFlags::from_bits_retain(nix::libc::POLLRDHUP);
        let mut fds = [PollFd::new(tcp.as_fd(), rdhup)];
        matches!(poll(&mut fds, PollTimeout::ZERO), Ok(n) if n > 0)
    }

    /// How long ago the kernel last received data from the client, to the millisecond
    /// (`TCP_INFO`'s `last_data_recv`); `None` for an HTTP/2 stream or where the kernel
    /// will not say. For a connection's first request it says when the request came,
    /// however long the connection then waited in the listen backlog.
    pub(crate) fn data_received_ago(&self) -> Option<std::time::Duration> {
        let tcp = match self {
            ClientStream::Plain(s) => s,
            ClientStream::Tls(s) => s.get_ref().0,
            ClientStream::H2(_) => return None,
        };
        let times = nix::sys::socket::getsockopt(tcp, TcpTimes).ok()?;
        Some(std::time::Duration::from_millis(
            times.last_data_recv.into(),
        ))
    }

    /// Resolves when the client closes its end or its connection breaks, while an
    /// exchange waits for as long as its client stays: its backend connection then
    /// closes at once, as nginx closes its upstream's, so the app sees the client go
    /// (a long-poll's message kept for the next poll, not written to a departed one).
    /// It peeks, so nothing is taken. Bytes that arrive instead (a pipelined request,
    /// a TLS record) leave it to `has_left`, asked at each quiet interval; so does an
    /// HTTP/2 stream, whose reset is watched for on its own.
    pub(crate) async fn left(&self) {
        if !self.ends_before_more_bytes().await {
            std::future::pending().await
        }
    }

    /// Resolves once the client has gone, for a request that waits in drover's queue:
    /// at once when it closes or resets its connection; when bytes came before its end
    /// (a pipelined request, a TLS close_notify), at the next look (`has_left`), every
    /// `look_every`. An HTTP/2 stream never resolves here: its reset is watched for on
    /// its own.
    pub(crate) async fn gone(&self, look_every: std::time::Duration) {
        if self.ends_before_more_bytes().await {
            return;
        }
        loop {
            tokio::time::sleep(look_every).await;
            if self.has_left() {
                return;
            }
        }
    }

    /// Waits for the client's next bytes or its end, taking nothing: `true` for an end
    /// (a close or a broken connection), `false` when bytes came first. Never resolves
    /// for an HTTP/2 stream.
    async fn ends_before_more_bytes(&self) -> bool {
        let tcp = match self {
            ClientStream::Plain(s) => s,
            ClientStream::Tls(s) => s.get_ref().0,
            ClientStream::H2(_) => return std::future::pending().await,
        };
        !matches!(tcp.peek(&mut [0u8; 1]).await, Ok(1..))
    }

    /// Waits for the first bytes of the next request and reads them into `buf`.
    /// `Ok(0)`: the client closed.
    ///
    /// A plain connection waits for readiness before it takes a buffer, so an idle
    /// keep-alive connection holds none; the buffer it was handed back is dropped if the
    /// readiness was stale. A TLS one reads at once: rustls may hold decrypted bytes
    /// (a pipelined request) that no readiness of the socket would announce.
    pub(crate) async fn read_first(&mut self, buf: &mut Vec<u8>) -> io::Result<usize> {
        match self {
            ClientStream::Plain(s) => loop {
                s.readable().await?;
                buf.reserve(4096);
                match s.try_read_buf(buf) {
                    Ok(n) => return Ok(n),
                    // Readiness left over from the last read: nothing came after all, so
                    // give the buffer back before waiting again (this kept 4 KiB on every
                    // idle connection).
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => *buf = Vec::new(),
                    Err(e) => return Err(e),
                }
            },
            ClientStream::Tls(s) => {
                buf.reserve(4096);
                s.read_buf(buf).await
            }
            ClientStream::H2(s) => {
                buf.reserve(4096);
                s.read_buf(buf).await
            }
        }
    }
}

impl AsyncRead for ClientStream {
    #[inline]
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ClientStream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            ClientStream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
            ClientStream::H2(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for ClientStream {
    #[inline]
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            ClientStream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            ClientStream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
            ClientStream::H2(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    #[inline]
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            ClientStream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            ClientStream::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
            ClientStream::H2(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    #[inline]
    fn is_write_vectored(&self) -> bool {
        match self {
            ClientStream::Plain(s) => s.is_write_vectored(),
            ClientStream::Tls(s) => s.is_write_vectored(),
            ClientStream::H2(s) => s.is_write_vectored(),
        }
    }

    #[inline]
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ClientStream::Plain(s) => Pin::new(s).poll_flush(cx),
            ClientStream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
            ClientStream::H2(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    #[inline]
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ClientStream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            ClientStream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
            ClientStream::H2(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// The start of Linux's `struct tcp_info`, up to its times. Only this prefix is asked
/// for, so the kernel (which copies `min(asked, its size)`) fills all of it on every
/// version since 2.6: nix checks that it did.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TcpTimesInfo {
    state_and_flags: [u8; 8],
    /// rto, ato, snd_mss, rcv_mss, unacked, sacked, lost, retrans, fackets.
    counters: [u32; 9],
    last_data_sent: u32,
    last_ack_sent: u32,
    /// Milliseconds since the last data segment came from the peer.
    last_data_recv: u32,
}

// `getsockopt(TCP_INFO)` through nix's own macro for socket options nix lacks: nix
// writes and checks the call (the only unsafe part), and `TcpTimesInfo` is plain
// integers, valid for any bytes the kernel writes.
use nix::{getsockopt_impl, libc, sockopt_impl};
sockopt_impl!(
    /// `TCP_INFO`, cut to `TcpTimesInfo`.
    TcpTimes,
    GetOnly,
    libc::SOL_TCP,
    libc::TCP_INFO,
    TcpTimesInfo
);
