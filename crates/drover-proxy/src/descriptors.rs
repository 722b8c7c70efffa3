//! File descriptors: the limit drover runs under, and how many client connections it
//! may hold within it.
//!
//! Each client connection is one descriptor and, while its request is at a backend,
//! one more for the backend connection. Past capacity drover must stop accepting before
//! the second kind runs out: a connection it cannot serve is better left in the
//! kernel's listen backlog (where Node's cluster module leaves it) than accepted and
//! failed with `503 local-resources`.

use nix::sys::resource::{getrlimit, setrlimit, Resource, RLIM_INFINITY};
use std::io;

/// Descriptors kept back from client connections for everything else drover holds:
/// listening sockets, the admin API, workers' pipes, log files, DNS and etcd clients.
/// At most half the limit, so a small limit still leaves room for clients.
const RESERVED: u64 = 128;

/// The descriptor limit drover runs under: (soft, hard).
pub fn limit() -> io::Result<(u64, u64)> {
    Ok(getrlimit(Resource::RLIMIT_NOFILE)?)
}

/// Raises the soft descriptor limit to the hard one, as Go's runtime and nginx's
/// `worker_rlimit_nofile` do: the soft default (often 1,024) is a compatibility limit
/// for `select()`, which drover does not use. Returns the soft limit now in force.
pub fn raise_soft_limit() -> io::Result<u64> {
    let (soft, hard) = limit()?;
    // An unlimited hard limit cannot be the soft one (Linux caps it at fs.nr_open).
    let target = if hard == RLIM_INFINITY {
        std::fs::read_to_string("/proc/sys/fs/nr_open")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(soft)
    } else {
        hard
    };
    if target <= soft {
        return Ok(soft);
    }
    setrlimit(Resource::RLIMIT_NOFILE, target, hard)?;
    Ok(target)
}

/// How many client connections drover may hold open under a soft limit of `soft`
/// descriptors: what is left after `RESERVED`, halved so each may have a backend
/// connection too.
pub fn client_budget(soft: u64) -> usize {
    let free = soft.saturating_sub(RESERVED).max(soft / 2);
    usize::try_from(free / 2).unwrap_or(usize::MAX).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_client_leaves_room_for_its_backend_connection_and_the_reserve() {
        assert_eq!(client_budget(20_000), (20_000 - 128) / 2);
        assert_eq!(client_budget(1024), (1024 - 128) / 2);
        // A small limit still admits clients: the reserve takes at most half.
        assert_eq!(client_budget(256), 64);
        assert_eq!(client_budget(64), 16);
        assert_eq!(client_budget(0), 1);
        assert!(client_budget(u64::MAX) > 1 << 40);
    }

    #[test]
    fn raising_keeps_the_soft_limit_within_the_hard_one() {
        let raised = raise_soft_limit().unwrap();
        let (soft, hard) = limit().unwrap();
        assert_eq!(raised, soft);
        assert!(soft <= hard);
    }
}
