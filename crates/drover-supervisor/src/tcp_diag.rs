//! Which TCP connections await an answer: they sent data more recently than they
//! received any, as the kernel's `tcp_info` tells (`ss -ti`'s `lastsnd` and `lastrcv`),
//! asked over a `NETLINK_SOCK_DIAG` socket, as `ss` asks.
//!
//! A runtime that waits on its connections through `epoll` (Go's netpoller, Java's NIO,
//! Python's asyncio) blocks in `epoll_wait` on every connection it holds, idle ones
//! (a database pool's) among them: the one it waits an answer on has sent last. By hand
//! rather than with a crate: one request and the two fields of each answer; the
//! netlink crates would bring a dozen crates for it.

use nix::sys::socket::{
    self, AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType,
};
use std::collections::BTreeSet;
use std::os::fd::AsRawFd;

const SOCK_DIAG_BY_FAMILY: u16 = 20;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_DUMP: u16 = 0x300;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
/// `inet_diag_req_v2.idiag_ext` bit for `INET_DIAG_INFO` (attribute 2): `tcp_info`.
const INET_DIAG_INFO: u16 = 2;
const TCP_ESTABLISHED: u32 = 1;
const NLMSG_HEADER: usize = 16;
/// `struct inet_diag_msg`: family, state, timer, retrans, the 48-byte socket id,
/// expires, rqueue, wqueue, uid, inode.
const DIAG_MSG: usize = 72;
const DIAG_MSG_INODE: usize = 68;
/// `struct tcp_info`'s `tcpi_last_data_sent` and `tcpi_last_data_recv`: ms ago.
const LAST_DATA_SENT: usize = 44;
const LAST_DATA_RECV: usize = 52;
/// `tcpi_bytes_received` (u64) and `tcpi_data_segs_out` (u32), since Linux 4.1 and 4.6.
const BYTES_RECEIVED: usize = 128;
const DATA_SEGS_OUT: usize = 156;

/// The inodes of the established TCP connections of this network namespace that sent
/// data after the last they received (the same millisecond counts as answered), or
/// sent some and never received any (a request sent as the connection opened, within
/// its millisecond). Empty when the kernel cannot be asked.
pub(crate) fn awaiting_answer() -> BTreeSet<u64> {
    let mut found = BTreeSet::new();
    for family in [libc::AF_INET as u8, libc::AF_INET6 as u8] {
        let _ = dump(family, &mut found);
    }
    found
}

fn dump(family: u8, found: &mut BTreeSet<u64>) -> nix::Result<()> {
    let fd = socket::socket(
        AddressFamily::Netlink,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        SockProtocol::NetlinkSockDiag,
    )?;
    socket::sendto(
        fd.as_raw_fd(),
        &request(family),
        &NetlinkAddr::new(0, 0),
        MsgFlags::empty(),
    )?;
    let mut buf = vec![0u8; 32 * 1024];
    loop {
        let n = socket::recv(fd.as_raw_fd(), &mut buf, MsgFlags::empty())?;
        if n == 0 || read_answers(&buf[..n], found) {
            return Ok(());
        }
    }
}

/// A dump request for `family`'s established TCP sockets, with their `tcp_info`.
fn request(family: u8) -> Vec<u8> {
    let mut msg = Vec::with_capacity(NLMSG_HEADER + 56);
    msg.extend_from_slice(&((NLMSG_HEADER + 56) as u32).to_ne_bytes());
    msg.extend_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    msg.extend_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
    msg.extend_from_slice(&1u32.to_ne_bytes()); // sequence
    msg.extend_from_slice(&0u32.to_ne_bytes()); // port: the kernel's
    msg.push(family);
    msg.push(libc::IPPROTO_TCP as u8);
    msg.push(1 << (INET_DIAG_INFO - 1));
    msg.push(0);
    msg.extend_from_slice(&(1u32 << TCP_ESTABLISHED).to_ne_bytes());
    msg.extend_from_slice(&[0u8; 48]); // any socket id
    msg
}

/// Reads one datagram of answers into `found`; `true` once the dump is done.
fn read_answers(mut buf: &[u8], found: &mut BTreeSet<u64>) -> bool {
    while buf.len() >= NLMSG_HEADER {
        let len = u32_at(buf, 0) as usize;
        let kind = u16::from_ne_bytes([buf[4], buf[5]]);
        if len < NLMSG_HEADER || len > buf.len() {
            return true;
        }
        match kind {
            NLMSG_DONE | NLMSG_ERROR => return true,
            SOCK_DIAG_BY_FAMILY => {
                if let Some(inode) = awaits(&buf[NLMSG_HEADER..len]) {
                    found.insert(inode);
                }
            }
            _ => {}
        }
        buf = &buf[align4(len).min(buf.len())..];
    }
    false
}

/// The inode of the socket an `inet_diag_msg` (with its attributes) describes, when it
/// sent data after the last it received.
fn awaits(msg: &[u8]) -> Option<u64> {
    let inode = u64::from(u32_at(msg, DIAG_MSG_INODE));
    let mut attrs = msg.get(DIAG_MSG..)?;
    while attrs.len() >= 4 {
        let len = usize::from(u16::from_ne_bytes([attrs[0], attrs[1]]));
        let kind = u16::from_ne_bytes([attrs[2], attrs[3]]);
        if len < 4 || len > attrs.len() {
            return None;
        }
        if kind == INET_DIAG_INFO {
            let info = &attrs[4..len];
            let (sent, received) = (
                info.get(LAST_DATA_SENT..LAST_DATA_SENT + 4)?,
                info.get(LAST_DATA_RECV..LAST_DATA_RECV + 4)?,
            );
            let ms_ago = |b: &[u8]| u32_at(b, 0);
            let never_answered = info
                .get(BYTES_RECEIVED..BYTES_RECEIVED + 8)
                .zip(info.get(DATA_SEGS_OUT..DATA_SEGS_OUT + 4))
                .is_some_and(|(received, sent)| received == [0; 8] && u32_at(sent, 0) > 0);
            return (never_answered || ms_ago(sent) < ms_ago(received)).then_some(inode);
        }
        attrs = &attrs[align4(len).min(attrs.len())..];
    }
    None
}

fn u32_at(buf: &[u8], at: usize) -> u32 {
    buf.get(at..at + 4)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u32::from_ne_bytes)
}

fn align4(n: usize) -> usize {
    (n + 3) & !3
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::unix::fs::MetadataExt;

    fn inode_of(s: &std::net::TcpStream) -> u64 {
        let path = format!("/proc/self/fd/{}", s.as_raw_fd());
        std::fs::metadata(path).unwrap().ino()
    }

    #[test]
    fn a_connection_that_sent_last_awaits_its_answer_and_one_answered_does_not() {
        let server = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = std::net::TcpStream::connect(server.local_addr().unwrap()).unwrap();
        let (mut peer, _) = server.accept().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        client.write_all(b"question").unwrap();
        let mut got = [0u8; 8];
        peer.read_exact(&mut got).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let waiting = awaiting_answer();
        assert!(waiting.contains(&inode_of(&client)), "{waiting:?}");
        // The peer received last: it owes the answer, it awaits none.
        assert!(!waiting.contains(&inode_of(&peer)));
        peer.write_all(b"answer").unwrap();
        client.read_exact(&mut got[..6]).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let waiting = awaiting_answer();
        assert!(!waiting.contains(&inode_of(&client)), "{waiting:?}");
        // A request sent as the connection opens, within its millisecond.
        let mut asking = std::net::TcpStream::connect(server.local_addr().unwrap()).unwrap();
        asking.write_all(b"question").unwrap();
        let (_asked, _) = server.accept().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let waiting = awaiting_answer();
        assert!(waiting.contains(&inode_of(&asking)), "{waiting:?}");
    }
}
