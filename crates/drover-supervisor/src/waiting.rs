//! What a worker that answers nothing waits on, read from `/proc` (Linux): for workers
//! drover has no event loop to ping (every program but Node), the one sign that tells a
//! worker waiting on a slow database from one that deadlocked.
//!
//! Each thread's `/proc/PID/task/TID/syscall` names the system call it is blocked in and
//! its arguments. A thread blocked reading from, connecting to or polling a TCP
//! connection that its worker opened (to a database, a cache, an API: not one of its
//! own clients') waits on that dependency, which ends without drover. A deadlock waits
//! on a lock (`futex`), which nothing outside ends; a stopped process and one that spins
//! are not waiting. A sleep is not a dependency: a worker's helper (`sleep 1000 &` in its
//! wrapper) sleeps for ever. A thread of a process that serves, in one timed sleep for
//! the whole quiet spell, is counted apart (`sleeps_through`): that sleep ends.
//!
//! A thread blocked in `epoll_wait` (Go's netpoller, Java's NIO, Python's asyncio) waits
//! on every descriptor of its epoll set, which `/proc/PID/fdinfo` lists: idle
//! connections too (a database pool's), so one of them counts only while it awaits an
//! answer, having sent last (`tcp_diag`). A Go worker whose `/health` pinged a stalled
//! dependency was killed as deadlocked, and then the other.
//!
//! By hand rather than with a crate: two files per thread and one per descriptor; the
//! procfs crate reads neither `syscall` nor another process's memory.

use crate::listening::{self, ESTABLISHED, SYN_SENT};
use crate::tcp_diag;
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::os::unix::fs::FileExt;

/// The dependency (the address of a connection it opened) a thread of process group
/// `group` (a worker and what it started: gunicorn's master and its worker) is blocked
/// on; `None` when no thread is, or a process of the group is stopped. `serving_port`:
/// the port the worker serves on, whose connections are its clients', not dependencies.
pub(crate) fn waits_on(group: u32, serving_port: u16) -> Option<SocketAddr> {
    let members = listening::group_members(group);
    if members.iter().any(|&pid| crate::cpu::is_stopped(pid)) {
        return None;
    }
    let mut sockets = BTreeSet::new();
    // On an epoll set: they count only while awaiting an answer.
    let mut polled = BTreeSet::new();
    for &pid in &members {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            continue;
        };
        for task in tasks.flatten() {
            let Ok(text) = std::fs::read_to_string(task.path().join("syscall")) else {
                continue;
            };
            let Some(call) = Blocked::parse(&text) else {
                continue;
            };
            match call.waits_on() {
                On::Fds(fds) => sockets.extend(
                    fds.into_iter()
                        .filter_map(|fd| listening::fd_socket_inode(pid, fd)),
                ),
                On::PollList { at, count } => sockets.extend(
                    poll_fds(pid, at, count)
                        .into_iter()
                        .filter_map(|fd| listening::fd_socket_inode(pid, fd)),
                ),
                On::EpollSet(epoll) => polled.extend(
                    epoll_fds(pid, epoll)
                        .into_iter()
                        .filter_map(|fd| listening::fd_socket_inode(pid, fd)),
                ),
                On::Other => {}
            }
        }
    }
    if sockets.is_empty() && polled.is_empty() {
        return None;
    }
    let awaiting = if polled.is_empty() {
        BTreeSet::new()
    } else {
        tcp_diag::awaiting_answer()
    };
    listening::tcp_sockets()
        .into_iter()
        .find(|s| {
            (sockets.contains(&s.inode)
                || (polled.contains(&s.inode) && awaiting.contains(&s.inode)))
                && matches!(s.state, ESTABLISHED | SYN_SENT)
                && s.local.port() != serving_port
        })
        .map(|s| s.remote)
}

/// A process of group `group` that holds a socket on the worker's `serving_port` (it
/// serves: not a helper beside it) with a thread that has been in one timed sleep since
/// `then` (a reading of `cpu::group_thread_times`): it ran not at all since, and is
/// blocked in `nanosleep` or `clock_nanosleep` (Python's, PHP's and Perl's `sleep`),
/// in `ppoll` or `poll` with a timeout, or in a `futex` wait with a timeout (Ruby's
/// `sleep` on a thread other than the main one, as Puma's; Java's `Thread.sleep`). A
/// handler that sleeps (`sleep 10` standing for a slow call, a back-off before a retry)
/// ends by itself; a deadlock waits on a lock with no timeout, and a loop that sleeps
/// and looks again runs between its sleeps. `None` when no such thread is found. Idle
/// pool threads wait with a timeout too (a JVM's, for a minute), so a deadlocked worker
/// may read as sleeping: the caller bounds how long a sleep spares a worker.
pub(crate) fn sleeps_through(
    group: u32,
    serving_port: u16,
    then: &std::collections::HashMap<u32, crate::cpu::ThreadTimes>,
) -> Option<u32> {
    let members = listening::group_members(group);
    // A stopped process's threads stay in whatever call they were in.
    if members.iter().any(|&pid| crate::cpu::is_stopped(pid)) {
        return None;
    }
    let serving: BTreeSet<u64> = listening::tcp_sockets()
        .into_iter()
        .filter(|s| s.local.port() == serving_port)
        .map(|s| s.inode)
        .collect();
    // The members found above: walking /proc for the group again found the same.
    let now = crate::cpu::thread_times(&members);
    members.into_iter().find(|&pid| {
        let serves = || !listening::socket_inodes(pid).is_disjoint(&serving);
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            return false;
        };
        let sleeps = tasks.flatten().any(|task| {
            let Some(tid) = task
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                return false;
            };
            let still =
                matches!((then.get(&tid), now.get(&tid)), (Some(a), Some(b)) if a.run == b.run);
            still
                && std::fs::read_to_string(task.path().join("syscall"))
                    .ok()
                    .and_then(|text| Blocked::parse(&text))
                    .is_some_and(|call| call.is_timed_sleep())
        });
        sleeps && serves()
    })
}

/// A system call a thread is blocked in, as `/proc/PID/task/TID/syscall` writes it: its
/// number and first arguments ("running" and "-1 …", a thread in user space, parse to
/// `None`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Blocked {
    number: u64,
    args: [u64; 4],
}

/// What a blocked call waits on.
#[derive(Debug, PartialEq, Eq)]
enum On {
    /// These descriptors.
    Fds(Vec<i32>),
    /// The descriptors of a `struct pollfd` list in the process's memory.
    PollList {
        at: u64,
        count: u64,
    },
    /// The descriptors registered with this epoll descriptor.
    EpollSet(i32),
    Other,
}

impl Blocked {
    fn parse(text: &str) -> Option<Blocked> {
        let mut fields = text.split_whitespace();
        let number = fields.next()?.parse().ok()?;
        let mut args = [0u64; 4];
        for a in &mut args {
            *a = u64::from_str_radix(fields.next()?.trim_start_matches("0x"), 16).ok()?;
        }
        Some(Blocked { number, args })
    }

    /// A sleep that ends by itself: `nanosleep`, `clock_nanosleep`, or `ppoll` and
    /// `poll` given a timeout (a `ppoll` timespec pointer, a `poll` timeout in ms that
    /// is neither 0 nor negative).
    fn is_timed_sleep(&self) -> bool {
        // FUTEX_WAIT and FUTEX_WAIT_BITSET, without the PRIVATE and CLOCK_REALTIME flags.
        const FUTEX_CMD_MASK: u64 = 0x7f;
        const FUTEX_WAITS: [u64; 2] = [0, 9];
        match self.number {
            n if calls::SLEEP.contains(&n) => true,
            n if calls::PPOLL == Some(n) => self.args[2] != 0,
            n if calls::PLAIN_POLL == Some(n) => (self.args[2] as i32) > 0,
            n if calls::FUTEX == Some(n) => {
                FUTEX_WAITS.contains(&(self.args[1] & FUTEX_CMD_MASK)) && self.args[3] != 0
            }
            _ => false,
        }
    }

    fn waits_on(&self) -> On {
        let fd = || On::Fds(i32::try_from(self.args[0]).into_iter().collect());
        match self.number {
            n if calls::ON_FD.contains(&n) => fd(),
            n if calls::POLL.contains(&n) => On::PollList {
                at: self.args[0],
                count: self.args[1],
            },
            n if calls::EPOLL.contains(&n) => match i32::try_from(self.args[0]) {
                Ok(epoll) => On::EpollSet(epoll),
                Err(_) => On::Other,
            },
            _ => On::Other,
        }
    }
}

/// A poll list's descriptors: each `struct pollfd` is an `int` descriptor and two
/// `short`s, 8 bytes. Read from `/proc/PID/mem`, which a process's parent (and its
/// parent's, as drover is to a worker's children) may read; a long list is cut short.
fn poll_fds(pid: u32, at: u64, count: u64) -> Vec<i32> {
    let count = count.min(64) as usize;
    let mut list = vec![0u8; count * 8];
    let read = std::fs::File::open(format!("/proc/{pid}/mem"))
        .and_then(|mem| mem.read_exact_at(&mut list, at));
    if read.is_err() {
        return Vec::new();
    }
    list.chunks_exact(8)
        .filter_map(|entry| {
            let fd = i32::from_ne_bytes(entry[..4].try_into().ok()?);
            (fd >= 0).then_some(fd)
        })
        .collect()
}

/// The descriptors registered with epoll descriptor `epoll` of process `pid`: the
/// `tfd:` lines of its `/proc/PID/fdinfo` entry; a long set is cut short.
fn epoll_fds(pid: u32, epoll: i32) -> Vec<i32> {
    let Ok(info) = std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{epoll}")) else {
        return Vec::new();
    };
    info.lines()
        .filter_map(|line| {
            line.strip_prefix("tfd:")?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .take(1024)
        .collect()
}

/// System call numbers of the architectures drover builds for.
mod calls {
    /// read, readv, recvfrom, recvmsg, connect, recvmmsg: the first argument is the
    /// descriptor.
    #[cfg(target_arch = "x86_64")]
    pub const ON_FD: [u64; 6] = [0, 19, 45, 47, 42, 299];
    /// poll, ppoll: a `struct pollfd` list and its length.
    #[cfg(target_arch = "x86_64")]
    pub const POLL: [u64; 2] = [7, 271];
    /// epoll_wait, epoll_pwait, epoll_pwait2: the epoll descriptor first.
    #[cfg(target_arch = "x86_64")]
    pub const EPOLL: [u64; 3] = [232, 281, 441];

    /// nanosleep, clock_nanosleep.
    #[cfg(target_arch = "x86_64")]
    pub const SLEEP: [u64; 2] = [35, 230];
    /// ppoll (its third argument the timeout's address), and poll (the timeout in ms).
    #[cfg(target_arch = "x86_64")]
    pub const PPOLL: Option<u64> = Some(271);
    #[cfg(target_arch = "x86_64")]
    pub const PLAIN_POLL: Option<u64> = Some(7);
    /// futex: a wait with a timeout (its fourth argument) is a timed sleep.
    #[cfg(target_arch = "x86_64")]
    pub const FUTEX: Option<u64> = Some(202);

    #[cfg(target_arch = "aarch64")]
    pub const SLEEP: [u64; 2] = [101, 115];
    #[cfg(target_arch = "aarch64")]
    pub const PPOLL: Option<u64> = Some(73);
    #[cfg(target_arch = "aarch64")]
    pub const PLAIN_POLL: Option<u64> = None;
    #[cfg(target_arch = "aarch64")]
    pub const FUTEX: Option<u64> = Some(98);

    #[cfg(target_arch = "aarch64")]
    pub const ON_FD: [u64; 6] = [63, 65, 207, 212, 203, 243];
    #[cfg(target_arch = "aarch64")]
    pub const POLL: [u64; 1] = [73];
    #[cfg(target_arch = "aarch64")]
    pub const EPOLL: [u64; 2] = [22, 441];

    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    pub const ON_FD: [u64; 0] = [];
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    pub const POLL: [u64; 0] = [];
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    pub const EPOLL: [u64; 0] = [];
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    pub const SLEEP: [u64; 0] = [];
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    pub const PPOLL: Option<u64> = None;
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    pub const PLAIN_POLL: Option<u64> = None;
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    pub const FUTEX: Option<u64> = None;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::time::Duration;

    #[test]
    fn parses_a_blocked_call_and_not_a_running_thread() {
        let b = Blocked::parse("45 0x4 0x7f00 0x40 0x0 0x0 0x0 0x7ffe 0x7f34\n").unwrap();
        assert_eq!((b.number, b.args), (45, [4, 0x7f00, 0x40, 0]));
        assert_eq!(Blocked::parse("running\n"), None);
        assert_eq!(Blocked::parse("-1 0x7ffe 0x7f34\n"), None);
    }

    /// A child of this test that blocks as `script` says, and is killed when dropped.
    struct Blocking(std::process::Child);

    impl Drop for Blocking {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    fn python(script: &str) -> Option<Blocking> {
        use std::os::unix::process::CommandExt;
        let child = std::process::Command::new("python3")
            .args(["-c", script])
            .process_group(0)
            .spawn()
            .ok()?;
        Some(Blocking(child))
    }

    fn settle(pid: u32, want: impl Fn(Option<SocketAddr>) -> bool) -> Option<SocketAddr> {
        let mut last = None;
        for _ in 0..100 {
            last = waits_on(pid, 1);
            if want(last) {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        last
    }

    #[test]
    fn a_read_or_poll_on_a_connection_it_opened_waits_on_that_dependency_and_a_lock_or_sleep_on_nothing(
    ) {
        let dependency = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let at = dependency.local_addr().unwrap();
        // Blocking recv (recvfrom), then a recv with a timeout (poll first).
        for (how, script) in [
            ("read", format!("import socket\ns = socket.create_connection(('127.0.0.1', {}))\ns.recv(1)\n", at.port())),
            ("poll", format!("import socket\ns = socket.create_connection(('127.0.0.1', {}))\ns.settimeout(60)\ns.recv(1)\n", at.port())),
        ] {
            let Some(child) = python(&script) else {
                return; // no python3 here
            };
            let (mut peer, from) = dependency.accept().unwrap();
            let pid = child.0.id();
            let seen = settle(pid, |w| w.is_some());
            assert_eq!(seen, Some(at), "{how}");
            // A connection on the port it serves is a client's, not a dependency.
            assert_eq!(waits_on(pid, from.port()), None, "{how}");
            nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGSTOP,
            )
            .unwrap();
            assert_eq!(settle(pid, |w| w.is_none()), None, "{how}: stopped");
            drop(child);
            let _ = peer.write_all(b"x");
            let _ = peer.read(&mut [0u8; 1]);
        }
        // On an epoll set (as Go's netpoller and asyncio wait): a connection that sent a
        // request and awaits the answer is a dependency; one answered (idle, a pool's)
        // is not.
        let epoll = |ask: &str| {
            format!(
                "import selectors, socket\ns = socket.create_connection(('127.0.0.1', {}))\n{ask}\
                 sel = selectors.EpollSelector()\nsel.register(s, selectors.EVENT_READ)\n\
                 while True:\n    sel.select()\n    s.recv(100)\n",
                at.port()
            )
        };
        let Some(child) = python(&epoll("s.sendall(b'q')\n")) else {
            return;
        };
        let (mut peer, _) = dependency.accept().unwrap();
        let pid = child.0.id();
        assert_eq!(settle(pid, |w| w.is_some()), Some(at), "epoll, awaiting");
        peer.write_all(b"answer").unwrap();
        assert_eq!(settle(pid, |w| w.is_none()), None, "epoll, answered");
        drop(child);
        let Some(child) = python(&epoll("")) else {
            return;
        };
        let (_peer, _) = dependency.accept().unwrap();
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(waits_on(child.0.id(), 1), None, "epoll, idle");
        drop(child);
        let Some(sleeping) = python("import time\ntime.sleep(60)\n") else {
            return;
        };
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(
            waits_on(sleeping.0.id(), 1),
            None,
            "a sleep is not a dependency"
        );
        let Some(locked) =
            python("import threading\nl = threading.Lock()\nl.acquire()\nl.acquire()\n")
        else {
            return;
        };
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(
            waits_on(locked.0.id(), 1),
            None,
            "a deadlock waits on nothing"
        );
    }
}
