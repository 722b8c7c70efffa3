//! Where an app's workers first served. `drover run` without `--listen` accepts clients
//! there: Node's cluster primary (and so PM2) binds the port a worker's `listen()`
//! names, and an app that says "listening on port 3000" is then reached at 3000.

use drover_node::Speaks;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use tokio::sync::watch;

/// Where the first of an app's workers to serve listened, and what its server speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FirstListen {
    /// `Some`: its `listen()` named this port (fixed in its code, or taken from its
    /// argv) at this address: `[::]` where it named none, the address Node's own primary
    /// binds for `listen(3000)`. `None`: it listened on its `PORT`, or became ready with
    /// no `listen()` drover heard (a program that is not Node).
    pub asked: Option<SocketAddr>,
    /// What its server speaks: HTTP for a program that is not Node (drover cannot tell).
    pub speaks: Speaks,
    /// It listened on a Unix socket, which drover binds once and its workers share
    /// (`drover_node::SharedPorts`), as Node's primary binds it.
    pub unix: bool,
}

impl FirstListen {
    /// Where it listened, in words: "port 3000", or "its PORT".
    pub(crate) fn port_in_words(&self) -> String {
        match self.asked {
            Some(at) => format!("port {}", at.port()),
            None => "its PORT".to_string(),
        }
    }

    /// What a Node worker's `listen()` of port `asked` at `address` means, for a worker
    /// whose `PORT` is `own_port`.
    pub(crate) fn of_listen(
        asked: i64,
        address: Option<IpAddr>,
        own_port: u16,
        speaks: Speaks,
        unix: bool,
    ) -> FirstListen {
        let asked = match u16::try_from(asked) {
            Ok(port) if port != 0 && port != own_port => Some(SocketAddr::new(
                address.unwrap_or(IpAddr::V6(Ipv6Addr::UNSPECIFIED)),
                port,
            )),
            _ => None,
        };
        FirstListen {
            asked,
            speaks,
            unix,
        }
    }

    /// A worker ready with no `listen()` drover heard.
    pub fn own_port() -> FirstListen {
        FirstListen {
            asked: None,
            speaks: Speaks::Http,
            unix: false,
        }
    }
}

/// An app's `FirstListen`: set once, by the first worker to serve; later ones change
/// nothing.
pub(crate) struct FirstListenCell(watch::Sender<Option<FirstListen>>);

impl FirstListenCell {
    pub(crate) fn new() -> FirstListenCell {
        FirstListenCell(watch::channel(None).0)
    }

    /// Notes `seen` unless a worker was heard from before.
    pub(crate) fn note(&self, seen: FirstListen) {
        self.0.send_if_modified(|first| {
            if first.is_some() {
                return false;
            }
            *first = Some(seen);
            true
        });
    }

    /// The first listen, when `seen` names another port than it did: new code (a
    /// reload) that moved the app's port, where drover's balancer stays.
    pub(crate) fn moved(&self, seen: &FirstListen) -> Option<FirstListen> {
        let first = (*self.0.borrow())?;
        (first.asked.map(|a| a.port()) != seen.asked.map(|a| a.port())).then_some(first)
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<Option<FirstListen>> {
        self.0.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    #[test]
    fn a_fixed_port_is_asked_for_and_port_names_the_workers_own() {
        let asked =
            |port, address| FirstListen::of_listen(port, address, 41000, Speaks::Http, false).asked;
        assert_eq!(asked(3000, None), Some("[::]:3000".parse().unwrap()));
        let local = asked(3000, Some(Ipv4Addr::LOCALHOST.into()));
        assert_eq!(local, Some("127.0.0.1:3000".parse().unwrap()));
        for own in [41000, 0, 70000, -1] {
            assert_eq!(asked(own, None), None, "{own}");
        }
        let tls = FirstListen::of_listen(3000, None, 41000, Speaks::Tls, false);
        assert_eq!(tls.speaks, Speaks::Tls);
    }

    #[test]
    fn the_first_worker_to_serve_decides() {
        let cell = FirstListenCell::new();
        let seen = cell.subscribe();
        cell.note(FirstListen::own_port());
        cell.note(FirstListen::of_listen(
            3000,
            None,
            41000,
            Speaks::Tcp,
            false,
        ));
        assert_eq!(*seen.borrow(), Some(FirstListen::own_port()));
    }
}
