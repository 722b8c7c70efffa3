//! A worker that is not Node and listens on a fixed port of its own instead of its
//! `PORT`: Sinatra's `set :port, 4567`, Puma's default 9292, Go's
//! `ListenAndServe(":8080")`, a `-p 3000` written into the command. drover cannot move
//! such a listen as its preload moves a Node app's. But the first copy binds the port
//! and serves there, and PM2 keeps that copy running (its other copies fail to bind).
//! drover does the same and sends its clients there: the app runs as written, on one
//! worker, and the log says how to run more. Before, drover stopped the one copy that
//! served at its ready timeout, for not listening on its `PORT`, again and again.

use crate::listening;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// How long a worker must listen on the same one port, and not on its `PORT`, before
/// drover takes it as where the worker serves: an app may open a helper port (metrics,
/// a debugger) a moment before its `PORT`.
const STEADY: Duration = Duration::from_secs(1);

/// How often a starting worker's listening sockets are looked at: /proc/net/tcp lists
/// every connection of the machine, so not more often.
const LOOK_EVERY: Duration = Duration::from_millis(500);

/// What a starting worker's readiness wait looks at besides its `PORT`.
pub(crate) struct FixedPortLook {
    /// The worker's process group (it leads its own): the program may be below a
    /// runner (`bundle exec`, `sh -c`).
    pub group: u32,
    pub own_port: u16,
    /// Its Node session, if it has one: once drover's preload speaks there, the app's
    /// `listen()` is drover's to place, and no port is adopted.
    pub node: Option<drover_node::Inbox>,
    /// Where it serves, once adopted; shared with its `Proc`.
    pub found: Arc<OnceLock<SocketAddr>>,
}

impl FixedPortLook {
    /// Resolves with where the worker listens, once that is one port other than its
    /// `PORT`, the same for `STEADY`, and noted in `found`; never for a Node app that
    /// drover's preload serves.
    pub(crate) async fn adopted(&self) -> SocketAddr {
        let mut seen: Option<(SocketAddr, Instant)> = None;
        loop {
            tokio::time::sleep(LOOK_EVERY).await;
            if self.node.as_ref().is_some_and(|n| n.can_give_back()) {
                return std::future::pending().await;
            }
            let (group, own_port) = (self.group, self.own_port);
            let now = tokio::task::spawn_blocking(move || elsewhere(group, own_port))
                .await
                .ok()
                .flatten();
            seen = match (now, seen) {
                (Some(at), Some((was, since))) if at == was => {
                    if since.elapsed() >= STEADY {
                        let at = *self.found.get_or_init(|| at);
                        return at;
                    }
                    Some((was, since))
                }
                (Some(at), _) => Some((at, Instant::now())),
                (None, _) => None,
            };
        }
    }
}

/// Where process group `group` listens, when that is one port and not `own_port`
/// (see `one_port`).
fn elsewhere(group: u32, own_port: u16) -> Option<SocketAddr> {
    one_port(listening::group_listening_addrs(group), own_port)
}

/// The one port of `at`, unless it is `own_port`: several ports, or its `PORT` among
/// them, leave the choice to the app's `PORT`.
fn one_port(mut at: Vec<SocketAddr>, own_port: u16) -> Option<SocketAddr> {
    // IPv4 first: a server on both 0.0.0.0:X and [::]:X is on one port.
    at.sort_by_key(|a| (a.port(), a.is_ipv6()));
    at.dedup_by_key(|a| a.port());
    match at.as_slice() {
        [one] if one.port() != own_port => Some(reachable(*one)),
        _ => None,
    }
}

/// Where drover connects to a listener bound at `at`: loopback for the unspecified
/// address (`0.0.0.0`, `[::]`), which drover cannot connect to by that name.
fn reachable(at: SocketAddr) -> SocketAddr {
    let ip = match at.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    SocketAddr::new(ip, at.port())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unspecified_address_is_reached_on_loopback() {
        assert_eq!(
            reachable("0.0.0.0:9292".parse().unwrap()),
            "127.0.0.1:9292".parse().unwrap()
        );
        assert_eq!(
            reachable("[::]:9292".parse().unwrap()),
            "[::1]:9292".parse().unwrap()
        );
        assert_eq!(
            reachable("127.0.0.2:80".parse().unwrap()),
            "127.0.0.2:80".parse().unwrap()
        );
    }

    #[test]
    fn one_port_other_than_its_own_is_adopted() {
        let a = |s: &str| -> SocketAddr { s.parse().unwrap() };
        assert_eq!(
            one_port(vec![a("[::]:4567"), a("0.0.0.0:4567")], 20001),
            Some(a("127.0.0.1:4567"))
        );
        assert_eq!(one_port(vec![a("127.0.0.1:20001")], 20001), None);
        assert_eq!(
            one_port(vec![a("127.0.0.1:4567"), a("127.0.0.1:20001")], 20001),
            None
        );
        assert_eq!(
            one_port(vec![a("127.0.0.1:4567"), a("127.0.0.1:9090")], 20001),
            None
        );
        assert_eq!(one_port(vec![], 20001), None);
    }
}
