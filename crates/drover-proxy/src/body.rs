//! Streaming message bodies from one socket to another without holding them whole.

use crate::http1::chunked::{ChunkedError, ChunkedScanner};
use crate::http1::BodyKind;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Bytes asked of the kernel per read while streaming a body.
const READ_CHUNK: usize = 16 * 1024;

#[derive(Debug)]
pub enum BodyError {
    /// The sending side closed or failed mid-body.
    Read,
    /// The sending side went quiet past the read timeout.
    Timeout,
    /// The receiving side went away.
    Write,
    /// The sender's chunked framing was invalid.
    Framing(ChunkedError),
}

/// Reads more bytes into `buf`; 0 means the peer closed.
pub async fn read_some<R: AsyncRead + Unpin>(
    src: &mut R,
    buf: &mut Vec<u8>,
    timeout: Duration,
) -> Result<usize, BodyError> {
    if buf.capacity() - buf.len() < READ_CHUNK / 4 {
        buf.reserve(READ_CHUNK);
    }
    match tokio::time::timeout(timeout, src.read_buf(buf)).await {
        Ok(Ok(n)) => Ok(n),
        Ok(Err(_)) => Err(BodyError::Read),
        Err(_) => Err(BodyError::Timeout),
    }
}

/// Writes `out` (a head, usually) followed by a body of `kind` from `src`, where
/// `pending` holds body bytes already read. Bytes after the body stay in `pending`.
/// `dechunk` decodes a chunked body into a close-delimited one.
pub async fn forward<R, W>(
    kind: BodyKind,
    dechunk: bool,
    src: &mut R,
    pending: &mut Vec<u8>,
    dst: &mut W,
    out: &mut Vec<u8>,
    read_timeout: Duration,
) -> Result<(), BodyError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let result = match kind {
        BodyKind::None => flush(dst, out).await,
        BodyKind::Length(n) => forward_length(n, src, pending, dst, out, read_timeout).await,
        BodyKind::Chunked => forward_chunked(dechunk, src, pending, dst, out, read_timeout).await,
        BodyKind::UntilClose => forward_until_close(src, pending, dst, out, read_timeout).await,
    };
    out.clear();
    result
}

async fn flush<W: AsyncWrite + Unpin>(dst: &mut W, out: &mut Vec<u8>) -> Result<(), BodyError> {
    if !out.is_empty() {
        dst.write_all(out).await.map_err(|_| BodyError::Write)?;
        out.clear();
    }
    Ok(())
}

async fn forward_length<R, W>(
    len: u64,
    src: &mut R,
    pending: &mut Vec<u8>,
    dst: &mut W,
    out: &mut Vec<u8>,
    read_timeout: Duration,
) -> Result<(), BodyError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut left = len;
    loop {
        let take = (left.min(pending.len() as u64)) as usize;
        // The first bytes go out with the head in one write; later ones straight from
        // the read buffer.
        if out.is_empty() {
            dst.write_all(&pending[..take])
                .await
                .map_err(|_| BodyError::Write)?;
        } else {
            out.extend_from_slice(&pending[..take]);
            flush(dst, out).await?;
        }
        pending.drain(..take);
        left -= take as u64;
        if left == 0 {
            return Ok(());
        }
        if read_some(src, pending, read_timeout).await? == 0 {
            return Err(BodyError::Read);
        }
    }
}

async fn forward_chunked<R, W>(
    dechunk: bool,
    src: &mut R,
    pending: &mut Vec<u8>,
    dst: &mut W,
    out: &mut Vec<u8>,
    read_timeout: Duration,
) -> Result<(), BodyError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut scanner = ChunkedScanner::default();
    loop {
        let used = if dechunk {
            scanner.scan(pending, |data| out.extend_from_slice(data))
        } else {
            scanner.scan(pending, |_| {})
        }
        .map_err(BodyError::Framing)?;
        if !dechunk {
            out.extend_from_slice(&pending[..used]);
        }
        pending.drain(..used);
        flush(dst, out).await?;
        if scanner.is_done() {
            return Ok(());
        }
        if read_some(src, pending, read_timeout).await? == 0 {
            return Err(BodyError::Read);
        }
    }
}

async fn forward_until_close<R, W>(
    src: &mut R,
    pending: &mut Vec<u8>,
    dst: &mut W,
    out: &mut Vec<u8>,
    read_timeout: Duration,
) -> Result<(), BodyError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    loop {
        out.extend_from_slice(pending);
        pending.clear();
        flush(dst, out).await?;
        if read_some(src, pending, read_timeout).await? == 0 {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn run(
        kind: BodyKind,
        dechunk: bool,
        first: &[u8],
        rest: &[u8],
    ) -> (Result<(), BodyError>, Vec<u8>, Vec<u8>) {
        let mut src = rest;
        let mut pending = first.to_vec();
        let mut dst = Vec::new();
        let mut out = b"HEAD|".to_vec();
        let r = forward(
            kind,
            dechunk,
            &mut src,
            &mut pending,
            &mut dst,
            &mut out,
            Duration::from_secs(1),
        )
        .await;
        (r, dst, pending)
    }

    #[tokio::test]
    async fn length_body_leaves_the_next_request() {
        let (r, dst, pending) = run(BodyKind::Length(8), false, b"hello", b" woGET /").await;
        assert!(r.is_ok());
        assert_eq!(dst, b"HEAD|hello wo");
        assert_eq!(pending, b"GET /");
    }

    #[tokio::test]
    async fn short_length_body_is_an_error() {
        let (r, _, _) = run(BodyKind::Length(8), false, b"hi", b"").await;
        assert!(matches!(r, Err(BodyError::Read)));
    }

    #[tokio::test]
    async fn chunked_verbatim_and_decoded() {
        let body = b"3\r\nabc\r\n0\r\n\r\nNEXT";
        let (r, dst, pending) = run(BodyKind::Chunked, false, &body[..5], &body[5..]).await;
        assert!(r.is_ok());
        assert_eq!(dst, b"HEAD|3\r\nabc\r\n0\r\n\r\n");
        assert_eq!(pending, b"NEXT");
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
}
