//! Node's IPC channel, as its `json` serialization frames it: one JSON value per line,
//! and a passed descriptor (`SCM_RIGHTS`) travels with the line of its `NODE_HANDLE`
//! message.
//!
//! Node reads at most one handle per read because the kernel never merges a message
//! that carries descriptors with the next one; it still sends one handle at a time and
//! waits for `NODE_HANDLE_ACK`. [`crate::Session`] does the same, and a worker giving
//! a connection back to drover does so too: its descriptor arrives with the bytes of
//! its `NODE_HANDLE` line, and the next line with a handle waits for drover's ack.

use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags, UnixAddr};
use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
use serde_json::Value;
use std::collections::VecDeque;
use std::fmt;
use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use tokio::io::Interest;
use tokio::net::UnixStream;

/// A worker's messages are small; a longer line is not one of Node's and is skipped, so
/// no worker can make drover buffer without bound.
const MAX_LINE: usize = 1 << 20;

/// Why the channel to a worker ended.
#[derive(Debug)]
pub enum ChannelError {
    /// Reading or writing failed (the worker closed its end while we wrote, say).
    Io(io::Error),
}

impl fmt::Display for ChannelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ChannelError::Io(e) => write!(f, "IPC channel: {e}"),
        }
    }
}

impl std::error::Error for ChannelError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ChannelError::Io(e) => Some(e),
        }
    }
}

impl From<io::Error> for ChannelError {
    fn from(e: io::Error) -> Self {
        ChannelError::Io(e)
    }
}

/// Descriptors received and not yet claimed by their `NODE_HANDLE` line. A worker sends
/// one at a time and waits for the ack, so more than a few means it is not Node's
/// protocol: the excess is closed.
const MAX_DESCRIPTORS: usize = 8;

/// Bytes read from the channel at a time.
const READ_CHUNK: usize = 16 * 1024;

/// drover's end of one worker's channel.
pub(crate) struct Channel {
    stream: UnixStream,
    /// Bytes read and not yet returned as lines.
    pending: Vec<u8>,
    /// Inside a line longer than `MAX_LINE`: drop bytes up to its newline.
    skipping: bool,
    /// Descriptors that came with the bytes read, oldest first.
    descriptors: VecDeque<OwnedFd>,
}

/// One line read from the channel.
pub(crate) enum Line {
    Message(Vec<u8>),
    /// A line over `MAX_LINE`, dropped.
    TooLong,
}

impl Channel {
    pub(crate) fn new(stream: UnixStream) -> Channel {
        Channel {
            stream,
            pending: Vec::new(),
            skipping: false,
            descriptors: VecDeque::new(),
        }
    }

    /// The oldest descriptor received and not yet claimed: the one a `NODE_HANDLE` line
    /// just taken carries.
    pub(crate) fn take_descriptor(&mut self) -> Option<OwnedFd> {
        self.descriptors.pop_front()
    }

    /// The next complete line already read, if any.
    pub(crate) fn take_line(&mut self) -> Option<Line> {
        loop {
            match memchr_newline(&self.pending) {
                Some(end) => {
                    let rest = self.pending.split_off(end + 1);
                    let mut line = std::mem::replace(&mut self.pending, rest);
                    line.truncate(end);
                    if std::mem::take(&mut self.skipping) {
                        continue;
                    }
                    if line.len() > MAX_LINE {
                        return Some(Line::TooLong);
                    }
                    return Some(Line::Message(line));
                }
                None if self.pending.len() > MAX_LINE => {
                    self.pending.clear();
                    if !self.skipping {
                        self.skipping = true;
                        return Some(Line::TooLong);
                    }
                    return None;
                }
                None => return None,
            }
        }
    }

    /// Reads what the worker sent, and the descriptors that came with it. `Ok(false)`
    /// when it closed its end. Cancel-safe: bytes are kept only once read, so it can sit
    /// in a `select!`.
    pub(crate) async fn fill(&mut self) -> io::Result<bool> {
        let mut chunk = [0u8; READ_CHUNK];
        loop {
            self.stream.readable().await?;
            let mut space =
                [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_DESCRIPTORS))];
            let read = self.stream.try_io(Interest::READABLE, || {
                let mut control = RecvAncillaryBuffer::new(&mut space);
                let mut iov = [IoSliceMut::new(&mut chunk)];
                let msg = rustix::net::recvmsg(
                    &self.stream,
                    &mut iov,
                    &mut control,
                    RecvFlags::DONTWAIT | RecvFlags::CMSG_CLOEXEC,
                )?;
                let mut fds = Vec::new();
                for cmsg in control.drain() {
                    if let RecvAncillaryMessage::ScmRights(received) = cmsg {
                        fds.extend(received);
                    }
                }
                Ok((msg.bytes, fds))
            });
            match read {
                Ok((n, fds)) => {
                    for fd in fds {
                        if self.descriptors.len() < MAX_DESCRIPTORS {
                            self.descriptors.push_back(fd);
                        }
                    }
                    if n == 0 {
                        return Ok(false);
                    }
                    self.pending.extend_from_slice(&chunk[..n]);
                    return Ok(true);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Sends `message` as one line.
    pub(crate) async fn send(&self, message: &Value) -> io::Result<()> {
        self.send_line(&line_of(message), None).await
    }

    /// Sends `message` with `socket` attached.
    pub(crate) async fn send_with(
        &self,
        message: &Value,
        socket: BorrowedFd<'_>,
    ) -> io::Result<()> {
        self.send_line(&line_of(message), Some(socket)).await
    }

    async fn send_line(&self, line: &[u8], mut socket: Option<BorrowedFd<'_>>) -> io::Result<()> {
        let mut sent = 0;
        while sent < line.len() {
            self.stream.writable().await?;
            let rest = &line[sent..];
            let result = self.stream.try_io(Interest::WRITABLE, || {
                let fds;
                let rights;
                let cmsgs: &[ControlMessage] = match socket {
                    Some(fd) => {
                        fds = [fd.as_raw_fd()];
                        rights = [ControlMessage::ScmRights(&fds)];
                        &rights
                    }
                    None => &[],
                };
                sendmsg::<UnixAddr>(
                    self.stream.as_raw_fd(),
                    &[IoSlice::new(rest)],
                    cmsgs,
                    MsgFlags::MSG_NOSIGNAL | MsgFlags::MSG_DONTWAIT,
                    None,
                )
                .map_err(io::Error::from)
            });
            match result {
                Ok(n) => {
                    sent += n;
                    // The descriptor went with the first byte; the rest is plain data.
                    socket = None;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

fn line_of(message: &Value) -> Vec<u8> {
    let mut line = serde_json::to_vec(message).unwrap_or_default();
    line.push(b'\n');
    line
}

fn memchr_newline(bytes: &[u8]) -> Option<usize> {
    bytes.iter().position(|&b| b == b'\n')
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[tokio::test]
    async fn lines_split_and_join_across_reads_and_long_ones_are_dropped() {
        let (ours, mut theirs) = UnixStream::pair().unwrap();
        let mut channel = Channel::new(ours);
        theirs.write_all(b"{\"a\":1}\n{\"b\"").await.unwrap();
        theirs.write_all(b":2}\n").await.unwrap();
        let mut lines = Vec::new();
        while lines.len() < 2 {
            assert!(channel.fill().await.unwrap());
            while let Some(Line::Message(l)) = channel.take_line() {
                lines.push(l);
            }
        }
        assert_eq!(lines, vec![b"{\"a\":1}".to_vec(), b"{\"b\":2}".to_vec()]);

        let writer = tokio::spawn(async move {
            theirs.write_all(&vec![b'x'; MAX_LINE + 10]).await.unwrap();
            theirs.write_all(b"x\n\"after\"\n").await.unwrap();
            theirs
        });
        let mut too_long = 0;
        let next = 'found: loop {
            while let Some(line) = channel.take_line() {
                match line {
                    Line::TooLong => too_long += 1,
                    Line::Message(l) => break 'found l,
                }
            }
            assert!(channel.fill().await.unwrap());
        };
        assert_eq!(too_long, 1);
        assert_eq!(next, b"\"after\"".to_vec());
        drop(writer.await.unwrap());
        assert!(!channel.fill().await.unwrap(), "end of stream");
    }
}
