//! Listening TCP sockets as /proc tells (Linux): which there are, and which a process
//! holds a descriptor on.
//!
//! By hand rather than with the procfs crate: two files and one directory, where procfs
//! would bring a dozen crates to the binary for this.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};

/// One listening socket of this network namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Listening {
    pub addr: SocketAddr,
    pub inode: u64,
}

/// One TCP socket of this network namespace, as /proc/net/tcp lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TcpSocket {
    pub local: SocketAddr,
    pub remote: SocketAddr,
    /// The kernel's state number (`include/net/tcp_states.h`): see the constants below.
    pub state: u8,
    pub inode: u64,
}

pub(crate) const ESTABLISHED: u8 = 0x01;
pub(crate) const SYN_SENT: u8 = 0x02;
const LISTEN: u8 = 0x0A;

/// Every TCP socket of this network namespace, from /proc/net/tcp and tcp6; empty where
/// /proc is not there. For rare looks, not a poll: the files list every connection.
pub(crate) fn tcp_sockets() -> Vec<TcpSocket> {
    let mut found = Vec::new();
    for file in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(file) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // sl local_address rem_address st tx:rx tr:tm retrnsmt uid timeout inode
            let (Some(local), Some(remote), Some(state), Some(inode)) =
                (fields.get(1), fields.get(2), fields.get(3), fields.get(9))
            else {
                continue;
            };
            if let (Some(local), Some(remote), Ok(state), Ok(inode)) = (
                proc_net_addr(local),
                proc_net_addr(remote),
                u8::from_str_radix(state, 16),
                inode.parse(),
            ) {
                found.push(TcpSocket {
                    local,
                    remote,
                    state,
                    inode,
                });
            }
        }
    }
    found
}

/// Every listening TCP socket of this network namespace (see `tcp_sockets`).
pub fn listening_sockets() -> Vec<Listening> {
    tcp_sockets()
        .into_iter()
        .filter(|s| s.state == LISTEN)
        .map(|s| Listening {
            addr: s.local,
            inode: s.inode,
        })
        .collect()
}

/// The inodes of the sockets process `pid` has descriptors on; empty when its
/// descriptors cannot be read (gone, or another user's without root).
pub fn socket_inodes(pid: u32) -> BTreeSet<u64> {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return BTreeSet::new();
    };
    fds.flatten()
        .filter_map(|fd| socket_inode(&fd.path()))
        .collect()
}

/// The inode of the socket a descriptor's link in /proc/PID/fd names, if it is one.
fn socket_inode(fd_link: &std::path::Path) -> Option<u64> {
    let link = std::fs::read_link(fd_link).ok()?;
    link.to_str()?
        .strip_prefix("socket:[")?
        .strip_suffix(']')?
        .parse()
        .ok()
}

/// The inodes of the sockets held by any process of process group `group`: a worker
/// and whatever it started (a runner's app, `npm start`'s node), which each worker's own
/// group holds. Walks /proc: for rare looks.
pub fn group_socket_inodes(group: u32) -> BTreeSet<u64> {
    group_members(group)
        .into_iter()
        .flat_map(socket_inodes)
        .collect()
}

/// Where the processes of process group `group` listen on TCP: a worker and whatever it
/// started. Walks /proc: for rare looks.
pub(crate) fn group_listening_addrs(group: u32) -> Vec<SocketAddr> {
    let held = group_socket_inodes(group);
    if held.is_empty() {
        return Vec::new();
    }
    listening_sockets()
        .into_iter()
        .filter(|s| held.contains(&s.inode))
        .map(|s| s.addr)
        .collect()
}

/// Whether any process of process group `group` listens on a TCP port. Walks /proc:
/// for rare looks.
pub(crate) fn group_listens(group: u32) -> bool {
    !group_listening_addrs(group).is_empty()
}

/// The processes of process group `group`. Walks /proc: for rare looks.
pub(crate) fn group_members(group: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| crate::cpu::process_group(pid) == Some(group))
        .collect()
}

/// The inode of the socket behind descriptor `fd` of process `pid`, if it is one.
pub(crate) fn fd_socket_inode(pid: u32, fd: i32) -> Option<u64> {
    socket_inode(std::path::Path::new(&format!("/proc/{pid}/fd/{fd}")))
}

/// An address as /proc/net/tcp writes it: the address's 32-bit words in hex, each as
/// the machine's byte order reads it, a colon, the port in hex.
fn proc_net_addr(text: &str) -> Option<SocketAddr> {
    let (ip, port) = text.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let mut bytes = Vec::with_capacity(16);
    for i in (0..ip.len()).step_by(8) {
        let word = u32::from_str_radix(ip.get(i..i + 8)?, 16).ok()?;
        bytes.extend_from_slice(&word.to_ne_bytes());
    }
    let ip = match bytes.len() {
        4 => IpAddr::from(<[u8; 4]>::try_from(bytes).ok()?),
        16 => IpAddr::from(<[u8; 16]>::try_from(bytes).ok()?),
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_holds_the_socket_it_listens_on() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let mine = socket_inodes(std::process::id());
        let it = listening_sockets()
            .into_iter()
            .find(|s| s.addr == addr)
            .expect("listed");
        assert!(mine.contains(&it.inode), "{it:?} not among {mine:?}");
        let group = crate::cpu::process_group(std::process::id()).unwrap();
        assert!(group_socket_inodes(group).contains(&it.inode));
        drop(l);
        assert!(!listening_sockets().iter().any(|s| s.addr == addr));
        assert!(socket_inodes(u32::MAX).is_empty());
    }
}
