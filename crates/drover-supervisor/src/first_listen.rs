//! Where an app's workers first served. `drover run` without `--listen` accepts clients
//! there: Node's cluster primary (and so PM2) binds the port a worker's `listen()`
//! names, and an app that says "listening on port 3000" is then reached at 3000.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use tokio::sync::watch;

/// Where the first of an app's workers to serve listened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FirstListen {
    /// Its `listen()` named this port (fixed in its code, or taken from its argv) at this
    /// address: `[::]` where it named none, the address Node's own primary binds for
    /// `listen(3000)`.
    Asked(SocketAddr),
    /// It listened on its `PORT`, or became ready with no `listen()` drover heard (a
    /// program that is not Node).
    OwnPort,
}

impl FirstListen {
    /// What a Node worker's `listen()` of port `asked` at `address` means, for a worker
    /// whose `PORT` is `own_port`.
    pub(crate) fn of_listen(asked: i64, address: Option<IpAddr>, own_port: u16) -> FirstListen {
        match u16::try_from(asked) {
            Ok(port) if port != 0 && port != own_port => FirstListen::Asked(SocketAddr::new(
                address.unwrap_or(IpAddr::V6(Ipv6Addr::UNSPECIFIED)),
                port,
            )),
            _ => FirstListen::OwnPort,
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
        let any = FirstListen::of_listen(3000, None, 41000);
        assert_eq!(any, FirstListen::Asked("[::]:3000".parse().unwrap()));
        let local = FirstListen::of_listen(3000, Some(Ipv4Addr::LOCALHOST.into()), 41000);
        assert_eq!(local, FirstListen::Asked("127.0.0.1:3000".parse().unwrap()));
        assert_eq!(
            FirstListen::of_listen(41000, None, 41000),
            FirstListen::OwnPort
        );
        assert_eq!(FirstListen::of_listen(0, None, 41000), FirstListen::OwnPort);
        assert_eq!(
            FirstListen::of_listen(70000, None, 41000),
            FirstListen::OwnPort
        );
        assert_eq!(
            FirstListen::of_listen(-1, None, 41000),
            FirstListen::OwnPort
        );
    }

    #[test]
    fn the_first_worker_to_serve_decides() {
        let cell = FirstListenCell::new();
        let seen = cell.subscribe();
        cell.note(FirstListen::OwnPort);
        cell.note(FirstListen::Asked("[::]:3000".parse().unwrap()));
        assert_eq!(*seen.borrow(), Some(FirstListen::OwnPort));
    }
}
