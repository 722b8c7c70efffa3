//! Message bodies between two sockets: framed as they pass, buffered only up to a bound.
//!
//! A body is never held whole, but a bounded amount is read ahead of a slow receiver so
//! that a slow peer on one side does not hold the peer on the other side hostage: a
//! request body that fits `REQUEST_BUFFER` is read in full before any endpoint is picked
//! (`prefetch`), and a response is read up to `RESPONSE_BUFFER` ahead of the client, so
//! a response that fits frees its backend connection and concurrency slot at once,
//! whatever the client's pace (`relay`). nginx does the same with
//! `client_body_buffer_size` and `proxy_buffering`.

use crate::http1::chunked::{ChunkedError, ChunkedScanner};
use crate::http1::BodyKind;
use std::future::Future;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;

/// Bytes asked of the kernel per read while streaming a body.
const READ_CHUNK: usize = 16 * 1024;

/// A request body up to this size is read from the client before an endpoint is picked,
/// so a client that sends it slowly (slow POST) holds no backend while it does.
pub const REQUEST_BUFFER: usize = 64 * 1024;

/// Bytes of a response read from the backend ahead of a client that reads slowly.
pub const RESPONSE_BUFFER: usize = 64 * 1024;

#[derive(Debug)]
pub enum BodyError {
    /// The sending side closed or failed mid-body.
    Read,
    /// The sending side went quiet past its timeout.
    Timeout,
    /// A request body arrived slower than its minimum rate (`BodyPace`).
    TooSlow,
    /// The receiving side went away.
    Write,
    /// The receiving side took no bytes within its timeout (it stopped reading).
    Stalled,
    /// The sender's chunked framing was invalid.
    Framing(ChunkedError),
    /// The body passed its size limit (`Framer::limited`).
    TooLarge,
}

/// How fast a client must send a request body: all of it by `grace + received / rate`,
/// as Apache's `RequestReadTimeout body=GRACE,MinRate=RATE`. The client timeout alone
/// restarts at every byte, so a body trickling a byte every few seconds held its
/// connection forever; a body that keeps up with the rate (a slow mobile upload) is
/// never cut.
#[derive(Debug)]
pub struct BodyPace {
    deadline: Instant,
    bytes_per_sec: u32,
    /// Set while drover is not reading the body (queued for an endpoint, connecting, or
    /// waiting for the backend to take what it read): that time is not the client's.
    paused_since: Option<Instant>,
}

impl BodyPace {
    /// The body starts arriving now.
    pub fn start(grace: Duration, bytes_per_sec: u32) -> BodyPace {
        BodyPace {
            deadline: Instant::now() + grace,
            bytes_per_sec: bytes_per_sec.max(1),
            paused_since: None,
        }
    }

    /// `n` more bytes arrived: each earns `1 / rate` seconds more.
    fn received(&mut self, n: usize) {
        let nanos = n as u128 * 1_000_000_000 / u128::from(self.bytes_per_sec);
        let more = Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX));
        self.deadline = self.deadline.checked_add(more).unwrap_or(self.deadline);
    }

    /// drover stops reading the body for a while; the clock stops with it.
    pub fn pause(&mut self) {
        self.paused_since.get_or_insert_with(Instant::now);
    }

    /// drover reads the body again.
    pub fn resume(&mut self) {
        if let Some(since) = self.paused_since.take() {
            self.deadline += since.elapsed();
        }
    }
}

/// Which bytes of a stream belong to one body, and what is sent on for them.
#[derive(Debug)]
pub struct Framer {
    state: Frame,
    /// Body bytes (of a chunked body, its data) that may still pass; `u64::MAX`: no
    /// limit. Counted as they pass, for a body whose length nobody said beforehand.
    allowance: u64,
}

#[derive(Debug)]
enum Frame {
    Length(u64),
    Chunked {
        scanner: ChunkedScanner,
        dechunk: bool,
    },
    UntilClose,
    Done,
}

impl Framer {
    /// `dechunk` decodes a chunked body into a close-delimited one (for HTTP/1.0 clients).
    pub fn new(kind: BodyKind, dechunk: bool) -> Self {
        let state = match kind {
            BodyKind::None | BodyKind::Length(0) => Frame::Done,
            BodyKind::Length(n) => Frame::Length(n),
            BodyKind::Chunked => Frame::Chunked {
                scanner: ChunkedScanner::default(),
                dechunk,
            },
            BodyKind::UntilClose => Frame::UntilClose,
        };
        Framer {
            state,
            allowance: u64::MAX,
        }
    }

    /// At most `max` body bytes may pass; past them, `BodyError::TooLarge`.
    pub fn limited(mut self, max: Option<u64>) -> Self {
        self.allowance = max.unwrap_or(u64::MAX);
        self
    }

    /// Whether the whole body has passed.
    pub fn is_done(&self) -> bool {
        matches!(self.state, Frame::Done)
    }

    /// Moves the body bytes at the front of `input` to `out`; bytes after the body stay.
    fn take(&mut self, input: &mut Vec<u8>, out: &mut Vec<u8>) -> Result<(), BodyError> {
        let passed = match &mut self.state {
            Frame::Done => 0,
            Frame::Length(left) => {
                let take = (*left).min(input.len() as u64) as usize;
                out.extend_from_slice(&input[..take]);
                input.drain(..take);
                *left -= take as u64;
                if *left == 0 {
                    self.state = Frame::Done;
                }
                take
            }
            Frame::Chunked { scanner, dechunk } => {
                let mut data = 0;
                let used = if *dechunk {
                    scanner.scan(input, |d| {
                        data += d.len();
                        out.extend_from_slice(d);
                    })
                } else {
                    let used = scanner.scan(input, |d| data += d.len());
                    if let Ok(used) = used {
                        out.extend_from_slice(&input[..used]);
                    }
                    used
                }
                .map_err(BodyError::Framing)?;
                input.drain(..used);
                if scanner.is_done() {
                    self.state = Frame::Done;
                }
                data
            }
            Frame::UntilClose => {
                let n = input.len();
                out.append(input);
                n
            }
        };
        self.allowance = self
            .allowance
            .checked_sub(passed as u64)
            .ok_or(BodyError::TooLarge)?;
        Ok(())
    }

    /// The sender closed: the end of a close-delimited body, an error for any other.
    fn on_close(&mut self) -> Result<(), BodyError> {
        match self.state {
            Frame::UntilClose => {
                self.state = Frame::Done;
                Ok(())
            }
            Frame::Done => Ok(()),
            _ => Err(BodyError::Read),
        }
    }
}

/// Reads more bytes into `buf`; 0 means the peer closed.
pub async fn read_some<R: AsyncRead + Unpin>(
    src: &mut R,
    buf: &mut Vec<u8>,
    timeout: Duration,
) -> Result<usize, BodyError> {
    reserve(buf);
    match tokio::time::timeout(timeout, src.read_buf(buf)).await {
        Ok(Ok(n)) => Ok(n),
        Ok(Err(_)) => Err(BodyError::Read),
        Err(_) => Err(BodyError::Timeout),
    }
}

/// `read_some` of a request body, which must also keep to `pace`.
async fn read_paced<R: AsyncRead + Unpin>(
    src: &mut R,
    buf: &mut Vec<u8>,
    timeout: Duration,
    pace: &mut BodyPace,
) -> Result<usize, BodyError> {
    let quiet_until = Instant::now() + timeout;
    let too_slow = pace.deadline < quiet_until;
    reserve(buf);
    match tokio::time::timeout_at(quiet_until.min(pace.deadline), src.read_buf(buf)).await {
        Ok(Ok(n)) => {
            pace.received(n);
            Ok(n)
        }
        Ok(Err(_)) => Err(BodyError::Read),
        Err(_) if too_slow => Err(BodyError::TooSlow),
        Err(_) => Err(BodyError::Timeout),
    }
}

fn reserve(buf: &mut Vec<u8>) {
    if buf.capacity() - buf.len() < READ_CHUNK / 4 {
        buf.reserve(READ_CHUNK);
    }
}

/// Writes all of `buf`, and flushes: a TLS stream may hold what it took in its own
/// buffer (a no-op on TCP). The whole must be done within `timeout`.
pub async fn write_all<W: AsyncWrite + Unpin>(
    dst: &mut W,
    buf: &[u8],
    timeout: Duration,
) -> Result<(), BodyError> {
    let written = async {
        dst.write_all(buf).await?;
        dst.flush().await
    };
    match tokio::time::timeout(timeout, written).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(_)) => Err(BodyError::Write),
        // `write_all` in one timeout: a peer reading a few bytes a minute is as stalled as
        // one reading none. Callers only write heads and buffered tails this way.
        Err(_) => Err(BodyError::Stalled),
    }
}

/// Reads body bytes from `src` (after those already in `pending`) into `out` until the
/// body is complete or `out` holds `cap` bytes, at `pace` or faster. Returns whether it
/// is complete.
pub async fn prefetch<R: AsyncRead + Unpin>(
    framer: &mut Framer,
    src: &mut R,
    pending: &mut Vec<u8>,
    out: &mut Vec<u8>,
    cap: usize,
    read_timeout: Duration,
    pace: &mut BodyPace,
) -> Result<bool, BodyError> {
    loop {
        framer.take(pending, out)?;
        if framer.is_done() || out.len() >= cap {
            return Ok(framer.is_done());
        }
        if read_paced(src, pending, read_timeout, pace).await? == 0 {
            framer.on_close()?;
        }
    }
}

/// How a relay ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Relayed {
    /// The whole body was read from the source; `out` holds what the receiver has not
    /// taken yet (empty when `finish` was asked).
    Complete,
    /// `early` fired before the body was all read or written: the receiver (a backend
    /// answering before the request body ended) has something to say.
    Interrupted,
}

/// Where a relay reads and writes, and how long each side may stall.
pub struct Ends<'a, R, W> {
    pub src: &'a mut R,
    /// Bytes read from `src` but not yet framed: bytes after the body stay here.
    pub pending: &'a mut Vec<u8>,
    pub dst: &'a mut W,
    /// Bytes for `dst` (a head, already framed body bytes) not yet written.
    pub out: &'a mut Vec<u8>,
    /// Longest quiet spell of `src` while more body is awaited.
    pub read_timeout: Duration,
    /// Longest spell in which `dst` takes no bytes while some are waiting for it.
    pub write_timeout: Duration,
    /// The minimum rate `src` must keep (a client sending a request body).
    pub pace: Option<&'a mut BodyPace>,
}

/// Relays a body from `src` to `dst`, reading up to `cap` bytes ahead of `dst`.
///
/// Returns once the whole body is read from `src` (with `finish`, once `dst` has taken
/// it all too), or when `early` completes first. `written` counts bytes `dst` took, so
/// a caller can tell whether anything reached it before an error.
pub async fn relay<R, W>(
    framer: &mut Framer,
    ends: Ends<'_, R, W>,
    cap: usize,
    finish: bool,
    early: impl Future<Output = ()>,
    written: &mut u64,
) -> Result<Relayed, BodyError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let Ends {
        src,
        pending,
        dst,
        out,
        read_timeout,
        write_timeout,
        mut pace,
    } = ends;
    tokio::pin!(early);
    let mut read_deadline = Instant::now() + read_timeout;
    let mut write_deadline = Instant::now() + write_timeout;
    // What `dst` took may wait in its own buffer (TLS) until flushed: once `out` is
    // empty, before waiting on `src` alone, and before the relay is finished. On TCP the
    // flush is ready at once.
    let mut unflushed = false;
    loop {
        framer.take(pending, out)?;
        let complete = framer.is_done();
        if complete && (!finish || (out.is_empty() && !unflushed)) {
            return Ok(Relayed::Complete);
        }
        let can_read = !complete && out.len() < cap;
        let can_write = !out.is_empty();
        let must_flush = unflushed && !can_write;
        // A side's clock runs only while it is awaited.
        if !can_read {
            read_deadline = Instant::now() + read_timeout;
        }
        // The pace's clock, too: while the receiver holds the relay up, the sender
        // cannot be slow.
        let pace_deadline = match pace.as_deref_mut() {
            Some(p) if can_read => {
                p.resume();
                Some(p.deadline)
            }
            Some(p) => {
                p.pause();
                None
            }
            None => None,
        };
        if !can_write && !must_flush {
            write_deadline = Instant::now() + write_timeout;
        }
        if can_read {
            reserve(pending);
        }
        tokio::select! {
            biased;
            // The receiver spoke up: it may answer before taking the rest (an early 413).
            _ = &mut early => return Ok(Relayed::Interrupted),
            w = write_or_flush(dst, out), if can_write || must_flush => match w {
                Ok(Some(0)) | Err(_) => return Err(BodyError::Write),
                Ok(Some(n)) => {
                    out.drain(..n);
                    *written += n as u64;
                    unflushed = true;
                    write_deadline = Instant::now() + write_timeout;
                }
                Ok(None) => unflushed = false,
            },
            r = src.read_buf(pending), if can_read => match r {
                Ok(0) => framer.on_close()?,
                Ok(n) => {
                    read_deadline = Instant::now() + read_timeout;
                    if let Some(p) = pace.as_deref_mut() {
                        p.received(n);
                    }
                }
                Err(_) => return Err(BodyError::Read),
            },
            _ = tokio::time::sleep_until(write_deadline), if can_write || must_flush => {
                return Err(BodyError::Stalled)
            }
            _ = tokio::time::sleep_until(read_deadline), if can_read => {
                return Err(BodyError::Timeout)
            }
            _ = sleep_until_some(pace_deadline) => return Err(BodyError::TooSlow),
        }
    }
}

/// Writes some of `out` (`Some`: how much), or flushes when it is empty (`None`).
async fn write_or_flush<W: AsyncWrite + Unpin>(
    dst: &mut W,
    out: &[u8],
) -> std::io::Result<Option<usize>> {
    if out.is_empty() {
        dst.flush().await.map(|()| None)
    } else {
        dst.write(out).await.map(Some)
    }
}

/// Sleeps until `deadline`, or forever without one.
async fn sleep_until_some(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::pending;

    const T: Duration = Duration::from_secs(1);

    async fn run(
        kind: BodyKind,
        dechunk: bool,
        first: &[u8],
        rest: &[u8],
    ) -> (Result<Relayed, BodyError>, Vec<u8>, Vec<u8>) {
        run_framed(Framer::new(kind, dechunk), first, rest).await
    }

    /// `framer`'s body relayed from `first` and then `rest` to a destination after a
    /// head: how it ended, what the destination got, and what was left after the body.
    async fn run_framed(
        mut framer: Framer,
        first: &[u8],
        rest: &[u8],
    ) -> (Result<Relayed, BodyError>, Vec<u8>, Vec<u8>) {
        let mut src = rest;
        let mut pending_bytes = first.to_vec();
        let mut dst = Vec::new();
        let mut out = b"HEAD|".to_vec();
        let mut written = 0;
        let ends = Ends {
            src: &mut src,
            pending: &mut pending_bytes,
            dst: &mut dst,
            out: &mut out,
            read_timeout: T,
            write_timeout: T,
            pace: None,
        };
        let r = relay(&mut framer, ends, 1 << 20, true, pending(), &mut written).await;
        assert_eq!(written, dst.len() as u64);
        (r, dst, pending_bytes)
    }

    async fn limited(kind: BodyKind, max: u64, body: &[u8]) -> Result<Relayed, BodyError> {
        let framer = Framer::new(kind, false).limited(Some(max));
        run_framed(framer, b"", body).await.0
    }

    #[tokio::test]
    async fn a_body_up_to_its_limit_passes_and_one_byte_more_does_not() {
        // A chunked body's data is counted, not its framing.
        let chunked = b"5\r\nhello\r\n3\r\nabc\r\n0\r\n\r\n";
        assert_eq!(
            limited(BodyKind::Chunked, 8, chunked).await.unwrap(),
            Relayed::Complete
        );
        assert!(matches!(
            limited(BodyKind::Chunked, 7, chunked).await,
            Err(BodyError::TooLarge)
        ));
        assert_eq!(
            limited(BodyKind::Length(8), 8, b"12345678").await.unwrap(),
            Relayed::Complete
        );
        assert!(matches!(
            limited(BodyKind::UntilClose, 7, b"12345678").await,
            Err(BodyError::TooLarge)
        ));
    }

    #[tokio::test]
    async fn length_body_leaves_the_next_request() {
        let (r, dst, rest) = run(BodyKind::Length(8), false, b"hello", b" woGET /").await;
        assert_eq!(r.unwrap(), Relayed::Complete);
        assert_eq!(dst, b"HEAD|hello wo");
        assert_eq!(rest, b"GET /");
    }

    #[tokio::test]
    async fn short_length_body_is_an_error() {
        let (r, _, _) = run(BodyKind::Length(8), false, b"hi", b"").await;
        assert!(matches!(r, Err(BodyError::Read)));
    }

    #[tokio::test]
    async fn chunked_verbatim_and_decoded() {
        let body = b"3\r\nabc\r\n0\r\n\r\nNEXT";
        let (r, dst, rest) = run(BodyKind::Chunked, false, &body[..5], &body[5..]).await;
        assert!(r.is_ok());
        assert_eq!(dst, b"HEAD|3\r\nabc\r\n0\r\n\r\n");
        assert_eq!(rest, b"NEXT");
        let (r, dst, _) = run(BodyKind::Chunked, true, body, b"").await;
        assert!(r.is_ok());
        assert_eq!(dst, b"HEAD|abc");
        let (r, _, _) = run(BodyKind::Chunked, false, b"zz\r\n", b"").await;
        assert!(matches!(r, Err(BodyError::Framing(_))));
    }

    #[tokio::test]
    async fn until_close() {
        let (r, dst, _) = run(BodyKind::UntilClose, false, b"ab", b"cd").await;
        assert!(r.is_ok());
        assert_eq!(dst, b"HEAD|abcd");
    }

    #[tokio::test]
    async fn prefetch_stops_at_the_cap_or_the_end() {
        let mut framer = Framer::new(BodyKind::Length(10), false);
        let (mut pend, mut out) = (b"0123".to_vec(), Vec::new());
        let mut src: &[u8] = b"456789NEXT";
        let mut pace = BodyPace::start(T, 500);
        let done = prefetch(&mut framer, &mut src, &mut pend, &mut out, 4, T, &mut pace).await;
        assert!(!done.unwrap());
        assert_eq!(out, b"0123");
        let done = prefetch(&mut framer, &mut src, &mut pend, &mut out, 64, T, &mut pace).await;
        assert!(done.unwrap());
        assert_eq!(out, b"0123456789");
        assert_eq!(pend, b"NEXT");
    }

    /// Relays a 4000-byte body from a sender that hands it over 64 bytes at a time to a
    /// receiver that takes 16 bytes and then nothing more.
    async fn to_a_stalled_receiver(cap: usize) -> (Result<Relayed, BodyError>, u64, usize) {
        let (mut src, mut feed) = tokio::io::duplex(64);
        tokio::spawn(async move { feed.write_all(&[b'x'; 4000]).await });
        let (mut dst, _stalled) = tokio::io::duplex(16);
        let (mut pend, mut out) = (Vec::new(), Vec::new());
        let mut framer = Framer::new(BodyKind::Length(4000), false);
        let mut written = 0;
        let ends = Ends {
            src: &mut src,
            pending: &mut pend,
            dst: &mut dst,
            out: &mut out,
            read_timeout: T,
            write_timeout: T,
            pace: None,
        };
        let r = relay(&mut framer, ends, cap, false, pending(), &mut written).await;
        (r, written, out.len())
    }

    /// The relay reads a body that fits its buffer in full and returns with the rest in
    /// `out`, so the sender is released whatever the receiver does.
    #[tokio::test(start_paused = true)]
    async fn a_stalled_receiver_does_not_hold_the_sender_when_the_body_fits() {
        let (r, written, unsent) = to_a_stalled_receiver(1 << 16).await;
        assert_eq!(r.unwrap(), Relayed::Complete);
        assert_eq!(written + unsent as u64, 4000);
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_receiver_is_cut_off_when_the_body_does_not_fit() {
        let (r, written, _) = to_a_stalled_receiver(100).await;
        assert!(matches!(r, Err(BodyError::Stalled)), "{r:?}");
        assert_eq!(written, 16);
    }

    /// Sends `total` bytes, `chunk` at a time, one chunk every `every`.
    fn trickle(total: usize, chunk: usize, every: Duration) -> tokio::io::DuplexStream {
        let (src, mut feed) = tokio::io::duplex(1 << 16);
        tokio::spawn(async move {
            let mut sent = 0;
            while sent < total {
                tokio::time::sleep(every).await;
                let n = chunk.min(total - sent);
                if feed.write_all(&vec![b'x'; n]).await.is_err() {
                    return;
                }
                sent += n;
            }
            std::future::pending::<()>().await;
        });
        src
    }

    async fn prefetch_paced(
        src: &mut tokio::io::DuplexStream,
        len: u64,
    ) -> Result<bool, BodyError> {
        let mut framer = Framer::new(BodyKind::Length(len), false);
        let (mut pend, mut out) = (Vec::new(), Vec::new());
        // 20 s of grace and 500 B/s; the client timeout (30 s) alone would never cut.
        let mut pace = BodyPace::start(Duration::from_secs(20), 500);
        let idle = Duration::from_secs(30);
        prefetch(
            &mut framer,
            src,
            &mut pend,
            &mut out,
            1 << 20,
            idle,
            &mut pace,
        )
        .await
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_below_the_minimum_rate_is_cut_and_one_above_it_is_not() {
        // A byte every 4 s: never quiet for the client timeout, far below 500 B/s.
        let mut src = trickle(100, 1, Duration::from_secs(4));
        assert!(matches!(
            prefetch_paced(&mut src, 100).await,
            Err(BodyError::TooSlow)
        ));
        // 1 KiB/s for 60 s (a slow mobile upload): past the grace, and never cut.
        let mut src = trickle(60 * 1024, 1024, Duration::from_secs(1));
        assert!(prefetch_paced(&mut src, 60 * 1024).await.unwrap());
    }

    #[tokio::test(start_paused = true)]
    async fn a_paused_pace_does_not_count_against_the_sender() {
        let mut pace = BodyPace::start(Duration::from_secs(1), 500);
        let before = pace.deadline;
        pace.pause();
        tokio::time::sleep(Duration::from_secs(10)).await;
        pace.resume();
        assert_eq!(pace.deadline, before + Duration::from_secs(10));
        pace.received(1000);
        assert_eq!(pace.deadline, before + Duration::from_secs(12));
    }

    #[tokio::test]
    async fn early_interrupts_an_unfinished_body() {
        let (mut src, _keep) = tokio::io::duplex(16);
        let (mut pend, mut out, mut dst) = (Vec::new(), Vec::new(), Vec::new());
        let mut framer = Framer::new(BodyKind::Length(100), false);
        let mut written = 0;
        let ends = Ends {
            src: &mut src,
            pending: &mut pend,
            dst: &mut dst,
            out: &mut out,
            read_timeout: T,
            write_timeout: T,
            pace: None,
        };
        let r = relay(&mut framer, ends, 64, true, async {}, &mut written).await;
        assert_eq!(r.unwrap(), Relayed::Interrupted);
    }
}
