//! What every way of starting checks before it starts anything, and `drover check` and
//! a reload with it: each balancer's plan, each app's settings, and each app's program
//! (found, and executable). The file's own rules ran when it loaded (`file`). Binding
//! the listen addresses is the caller's: only it knows whether a running drover holds
//! one ([`listen_addresses`] lists them).

use crate::file::Origins;
use crate::model::Config;
use crate::plan::BalancerPlan;
use drover_supervisor::listening::{listening_sockets, socket_inodes};
use drover_supervisor::AppSpec;
use std::net::SocketAddr;

/// A config's parts, ready to run.
#[derive(Debug)]
pub struct Prepared {
    /// One per `[[balancer]]`, in file order.
    pub plans: Vec<BalancerPlan>,
    /// One per `[[app]]`, in file order.
    pub specs: Vec<AppSpec>,
}

/// Plans every balancer and app of `cfg`, or every reason it cannot run (not just the
/// first: `drover check` lists them all), each named with its place in the file or the
/// flag it came from where that is known.
pub fn prepare(cfg: &Config, origins: &Origins) -> Result<Prepared, Vec<String>> {
    let mut errors = Vec::new();
    let mut plans = Vec::with_capacity(cfg.balancers.len());
    for (i, b) in cfg.balancers.iter().enumerate() {
        match BalancerPlan::from_config(b) {
            Ok(plan) => plans.push(plan),
            Err(e) => errors.push(match e.key(i) {
                Some(key) => origins.error(&key, e.to_string()),
                None => e.to_string(),
            }),
        }
        // Opened as the writer will: a missing directory or a file that cannot be
        // appended to fails the start, not the first request's line.
        if let Err(e) = b.access_log.check_path() {
            let key = format!("balancer[{i}].access_log.path");
            let message = format!(
                "balancer {:?}: cannot open {} for append: {e}",
                b.name, b.access_log.path
            );
            errors.push(origins.error(&key, message));
        }
    }
    if let Some(tls) = cfg.etcd.as_ref().and_then(|e| e.tls.as_ref()) {
        if let Err(e) = crate::plan::load_etcd_tls(tls) {
            errors.push(match e.key(0) {
                Some(key) => origins.error(&key, e.to_string()),
                None => e.to_string(),
            });
        }
    }
    if let Some(auth) = cfg.etcd.as_ref().and_then(|e| e.auth.as_ref()) {
        if let Err(e) = crate::plan::read_etcd_password(auth) {
            errors.push(origins.error("etcd.password_file", e.to_string()));
        }
    }
    let mut specs = Vec::with_capacity(cfg.apps.len());
    for (i, a) in cfg.apps.iter().enumerate() {
        let spec = a.spec.clone();
        if let Err(e) = spec.validate() {
            errors.push(format!("app {:?}: {e}", spec.name));
            continue;
        }
        // A program that cannot start would only restart forever behind a balancer
        // that never gets a worker.
        if let Err(e) = spec.resolve_program() {
            let key = format!("app[{i}].command");
            errors.push(origins.error(&key, format!("app {:?}: {e}", spec.name)));
            continue;
        }
        specs.push(spec);
    }
    if errors.is_empty() {
        Ok(Prepared { plans, specs })
    } else {
        Err(errors)
    }
}

/// An address drover itself binds for `cfg`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenAddress {
    /// The setting's key, as `Origins` knows it (`balancer[0].listen`).
    pub key: String,
    pub owner: Listener,
    pub addr: SocketAddr,
}

/// What listens at a [`ListenAddress`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listener {
    /// The balancer of this name.
    Balancer(String),
    /// The shared-mode app of this name (its workers accept there).
    App(String),
    AdminApi,
}

impl std::fmt::Display for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Listener::Balancer(name) => write!(f, "balancer {name:?}"),
            Listener::App(name) => write!(f, "app {name:?}"),
            Listener::AdminApi => f.write_str("admin API"),
        }
    }
}

/// Every address drover binds for `cfg`: each balancer's (that has one), each
/// shared-mode app's, and the admin API's.
pub fn listen_addresses(cfg: &Config) -> Vec<ListenAddress> {
    let balancers = cfg.balancers.iter().enumerate().filter_map(|(i, b)| {
        Some(ListenAddress {
            key: format!("balancer[{i}].listen"),
            owner: Listener::Balancer(b.name.clone()),
            addr: b.listen?,
        })
    });
    let apps = cfg.apps.iter().enumerate().filter_map(|(i, a)| {
        Some(ListenAddress {
            key: format!("app[{i}].listen"),
            owner: Listener::App(a.spec.name.clone()),
            addr: a.listen?,
        })
    });
    let admin = cfg.admin.iter().map(|a| ListenAddress {
        key: "admin.listen".into(),
        owner: Listener::AdminApi,
        addr: a.listen,
    });
    balancers.chain(apps).chain(admin).collect()
}

/// A listening socket the service manager passed at start (systemd socket activation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PassedSocket {
    /// Its `FileDescriptorName=` (systemd's default is the socket unit's name).
    pub name: String,
    /// Where it is bound.
    pub addr: SocketAddr,
}

/// Why the passed sockets do not fit the config. Each one is refused: a socket no
/// listener serves would take connections that nobody answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PassedError {
    /// Neither its name nor its address is any listener's.
    Unused(PassedSocket),
    /// It fits a shared-mode app, whose workers each open their own socket.
    SharedApp { socket: PassedSocket, app: String },
    /// Two sockets fit one listener.
    Twice {
        owner: Listener,
        first: PassedSocket,
        second: PassedSocket,
    },
}

impl std::fmt::Display for PassedError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PassedError::Unused(s) => write!(
                f,
                "systemd passed a socket named {:?} on {}, but no balancer is named {:?} and no listen address is {}",
                s.name, s.addr, s.name, s.addr
            ),
            PassedError::SharedApp { socket, app } => write!(
                f,
                "systemd passed a socket named {:?} on {} for app {app:?}, whose workers each open their own socket there (shared mode); put a balancer in front of the app or leave the address out of the socket unit",
                socket.name, socket.addr
            ),
            PassedError::Twice {
                owner,
                first,
                second,
            } => write!(
                f,
                "systemd passed two sockets for {owner}: {:?} on {} and {:?} on {}",
                first.name, first.addr, second.name, second.addr
            ),
        }
    }
}

/// The name that gives a passed socket to the admin API.
pub const ADMIN_SOCKET_NAME: &str = "admin";

/// Which listener of `cfg` each passed socket serves, in the order passed: the balancer
/// named as the socket (its `FileDescriptorName=`), the admin API for `admin`, or else
/// the listener whose address the socket is bound to. Every error, not only the first.
pub fn assign_passed(
    cfg: &Config,
    passed: &[PassedSocket],
) -> Result<Vec<ListenAddress>, Vec<PassedError>> {
    let listeners = listen_addresses(cfg);
    let mut errors = Vec::new();
    let mut assigned: Vec<(ListenAddress, &PassedSocket)> = Vec::new();
    for socket in passed {
        let by_name = listeners.iter().find(|l| match &l.owner {
            Listener::Balancer(name) => *name == socket.name,
            Listener::AdminApi => socket.name == ADMIN_SOCKET_NAME,
            Listener::App(_) => false,
        });
        let Some(listener) = by_name.or_else(|| listeners.iter().find(|l| l.addr == socket.addr))
        else {
            errors.push(PassedError::Unused(socket.clone()));
            continue;
        };
        if let Listener::App(app) = &listener.owner {
            errors.push(PassedError::SharedApp {
                socket: socket.clone(),
                app: app.clone(),
            });
            continue;
        }
        if let Some((_, first)) = assigned.iter().find(|(l, _)| l.key == listener.key) {
            errors.push(PassedError::Twice {
                owner: listener.owner.clone(),
                first: (*first).clone(),
                second: socket.clone(),
            });
            continue;
        }
        assigned.push((listener.clone(), socket));
    }
    if errors.is_empty() {
        Ok(assigned.into_iter().map(|(l, _)| l).collect())
    } else {
        Err(errors)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONFIG: &str = r#"
[admin]
listen = "127.0.0.1:9900"

[[app]]
name = "shared"
command = ["node", "server.js"]
mode = "shared"
listen = "127.0.0.1:7000"

[[balancer]]
name = "web"
listen = "127.0.0.1:8000"
backends = ["127.0.0.1:1"]

[[balancer]]
name = "api"
listen = "127.0.0.1:8001"
backends = ["127.0.0.1:2"]
"#;

    fn socket(name: &str, addr: &str) -> PassedSocket {
        PassedSocket {
            name: name.into(),
            addr: addr.parse().unwrap(),
        }
    }

    fn keys(passed: &[PassedSocket]) -> Result<Vec<String>, Vec<PassedError>> {
        let cfg = crate::file::parse(CONFIG, "test.toml").unwrap();
        assign_passed(&cfg, passed).map(|ls| ls.into_iter().map(|l| l.key).collect())
    }

    #[test]
    fn a_socket_goes_by_its_name_then_by_its_address() {
        let passed = [
            // Named for a balancer, though bound elsewhere: the name wins.
            socket("api", "0.0.0.0:80"),
            socket(ADMIN_SOCKET_NAME, "127.0.0.1:1"),
            // systemd's default name (the unit's): found by address.
            socket("drover.socket", "127.0.0.1:8000"),
        ];
        assert_eq!(
            keys(&passed).unwrap(),
            ["balancer[1].listen", "admin.listen", "balancer[0].listen"]
        );
        assert_eq!(keys(&[]).unwrap(), Vec::<String>::new());
    }

    #[test]
    fn sockets_that_fit_no_listener_are_refused_all_at_once() {
        let errors = keys(&[
            socket("x", "127.0.0.1:1234"),
            socket("web", "127.0.0.1:8000"),
            socket("y", "127.0.0.1:8000"),
            socket("z", "127.0.0.1:7000"),
        ])
        .unwrap_err();
        let text: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
        assert_eq!(text.len(), 3, "{text:?}");
        assert!(
            text[0].contains("named \"x\" on 127.0.0.1:1234")
                && text[0].contains("no balancer is named \"x\""),
            "{text:?}"
        );
        assert!(
            text[1].contains("two sockets for balancer \"web\""),
            "{text:?}"
        );
        assert!(
            text[2].contains("app \"shared\"") && text[2].contains("shared mode"),
            "{text:?}"
        );
    }
}

/// A process that holds a listening TCP socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SocketHolder {
    pub pid: u32,
    /// Its name as the kernel keeps it (`/proc/PID/comm`: 15 bytes at most).
    pub name: String,
}

impl SocketHolder {
    /// Whether it holds sockets for socket activation: systemd itself (the system's, or
    /// a user's manager), or `systemd-socket-activate`, which plays its part by hand.
    /// drover is handed such a socket when it starts, so it is not "in use".
    pub fn is_socket_activation(&self) -> bool {
        // `comm` keeps 15 bytes: "systemd-socket-activate" reads "systemd-socket-".
        self.name == "systemd" || self.name.starts_with("systemd-socket-")
    }
}

/// `, by NAME (pid N)` after a bind error `e` that says `addr` is in use, naming the
/// process that holds it, as `drover check` does; empty for any other error, or when
/// the holder cannot be seen. `drover up` said only "Address already in use", and a
/// process its last run left behind (a daemon a worker started, alive after `kill
/// -9` of drover) had to be found by hand (ops seat).
pub fn held_by(addr: SocketAddr, e: &std::io::Error) -> String {
    if e.kind() != std::io::ErrorKind::AddrInUse {
        return String::new();
    }
    listening_holder(addr).map_or_else(String::new, |h| format!(", by {} (pid {})", h.name, h.pid))
}

/// The process whose listening TCP socket takes `addr`'s connections (the same address
/// and port, or a wildcard address on the port), as /proc tells: the socket's inode
/// from /proc/net/tcp and tcp6, then the process with a descriptor on it. `None` when
/// nothing listens there, or when the holder's descriptors cannot be read (another
/// user's process, without root: systemd's, when `drover check` runs unprivileged).
pub fn listening_holder(addr: SocketAddr) -> Option<SocketHolder> {
    let inodes: Vec<u64> = listening_sockets()
        .into_iter()
        .filter(|s| {
            s.addr.port() == addr.port()
                && (s.addr.ip().to_canonical() == addr.ip().to_canonical()
                    || s.addr.ip().is_unspecified()
                    || addr.ip().is_unspecified())
        })
        .map(|s| s.inode)
        .collect();
    if inodes.is_empty() {
        return None;
    }
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let held = socket_inodes(pid);
        if inodes.iter().any(|i| held.contains(i)) {
            let name = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
            return Some(SocketHolder {
                pid,
                name: name.trim_end().to_string(),
            });
        }
    }
    None
}

#[cfg(test)]
mod holder_tests {
    use super::*;

    #[test]
    fn a_listener_of_this_process_is_found_by_its_address_and_by_the_wildcard() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let me = listening_holder(addr).expect("this process listens there");
        assert_eq!(me.pid, std::process::id());
        assert!(!me.is_socket_activation(), "{me:?}");
        let any = SocketAddr::from(([0, 0, 0, 0], addr.port()));
        assert_eq!(listening_holder(any).map(|h| h.pid), Some(me.pid));
        drop(l);
        assert_eq!(listening_holder(addr), None, "nothing listens there now");
        let v6 = std::net::TcpListener::bind("[::1]:0");
        if let Ok(v6) = v6 {
            let addr = v6.local_addr().unwrap();
            assert_eq!(listening_holder(addr).map(|h| h.pid), Some(me.pid));
        }
    }

    #[test]
    fn the_socket_activators_by_name() {
        let holder = |name: &str| SocketHolder {
            pid: 1,
            name: name.into(),
        };
        assert!(holder("systemd").is_socket_activation());
        assert!(holder("systemd-socket-").is_socket_activation());
        assert!(!holder("systemd-resolve").is_socket_activation());
        assert!(!holder("nginx").is_socket_activation());
    }
}
