//! The ports a worker listens on after its first: a metrics server's `listen(9100)` next
//! to the app's `listen(3000)`, an admin page, a second API. Under Node's cluster module
//! (and PM2) every worker that asks for such a port shares one socket the primary bound,
//! and each new connection goes to one of them in turn. drover balances an app's first
//! port by load; the others it shares as Node does: bound once per app, each connection
//! handed unread (so any protocol works) to a worker that listens there, in turn among
//! those with the fewest such connections not yet taken up (Node's primary hands one to
//! each free worker in turn: a stalled worker gets no more than its share), and none
//! accepted while no worker listens (a reload's gap): those wait in the kernel's
//! backlog, as under Node.
//!
//! A Unix socket the app listens on (`listen('/run/app.sock')`, for nginx in front) is
//! shared the same way, first or not: Node's primary binds the path once and hands its
//! connections round the workers.

use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use std::collections::HashMap;
use std::fmt;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

/// Where a shared server listens.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Place {
    /// A port at the address the app named (`None`: every address, as `listen(9100)`
    /// asks).
    Port { address: Option<IpAddr>, port: u16 },
    /// A Unix socket at this path (absolute: the worker's own directory resolved it).
    Path(PathBuf),
}

impl fmt::Display for Place {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Place::Port {
                address: Some(ip),
                port,
            } => write!(f, "{}", SocketAddr::new(*ip, *port)),
            Place::Port {
                address: None,
                port,
            } => write!(f, "*:{port}"),
            Place::Path(path) => write!(f, "unix:{}", path.display()),
        }
    }
}

/// A worker's session that listens on a shared port: where its connections go.
#[derive(Clone)]
pub(crate) struct Taker {
    pub(crate) session: u64,
    pub(crate) to: mpsc::UnboundedSender<(Place, Socket)>,
    /// Connections sent to it and not yet taken up by its worker, as its session counts
    /// them (and one more for each sent since it last did).
    pub(crate) pending: Arc<AtomicUsize>,
}

/// The shared ports of one app; cheap to clone. Each port's socket stays bound while the
/// app runs (workers come and go on a reload), and closes with the last clone.
#[derive(Clone)]
pub struct SharedPorts {
    inner: Arc<Inner>,
}

struct Inner {
    ports: Mutex<HashMap<Place, Port>>,
    /// Every place bound so far, in order: what drover tells its user.
    bound: watch::Sender<Vec<Place>>,
}

impl Default for SharedPorts {
    fn default() -> SharedPorts {
        SharedPorts {
            inner: Arc::new(Inner {
                ports: Mutex::default(),
                bound: watch::Sender::new(Vec::new()),
            }),
        }
    }
}

/// Connections accepted just as the last worker there left (a reload's gap), kept for
/// the next one to listen; past this many, closed.
const MAX_PARKED: usize = 64;

/// A Unix socket whose file was removed or replaced (an app that unlinks its path before
/// each `listen()`, as is usual, does it in every worker) is bound again; the socket it
/// replaces is still accepted from this long, for clients that connected before.
const REPLACED_GRACE: Duration = Duration::from_secs(1);

struct Port {
    takers: Vec<Taker>,
    parked: Vec<Socket>,
    /// The taker the next connection goes to.
    next: usize,
    /// How many take connections: the accept loop waits while none do.
    count: watch::Sender<usize>,
    accept: JoinHandle<()>,
    /// A Unix socket's file as drover bound it (device, inode).
    file: Option<(u64, u64)>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        let ports = self.ports.get_mut().unwrap_or_else(|e| e.into_inner());
        for (place, port) in ports.iter() {
            port.accept.abort();
            // As Node's primary removes a Unix socket's file when it closes the server.
            if let (Place::Path(path), Some(file)) = (place, port.file) {
                if file_of(path) == Some(file) {
                    let _ = std::fs::remove_file(path);
                }
            }
        }
    }
}

/// Whether a join bound the port (the first worker to listen there) or found it bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Joined {
    Bound,
    AlreadyBound,
}

/// Numbers sessions apart, for `leave`.
static SESSIONS: AtomicU64 = AtomicU64::new(1);

pub(crate) fn next_session() -> u64 {
    SESSIONS.fetch_add(1, Relaxed)
}

impl SharedPorts {
    pub fn new() -> SharedPorts {
        SharedPorts::default()
    }

    /// The places bound now, each with how many workers listen there.
    pub fn ports(&self) -> Vec<(Place, usize)> {
        let ports = self.lock();
        let mut all: Vec<_> = ports
            .iter()
            .map(|(place, p)| (place.clone(), p.takers.len()))
            .collect();
        all.sort();
        all
    }

    /// The Unix sockets bound now.
    pub fn unix_sockets(&self) -> Vec<PathBuf> {
        let ports = self.lock();
        ports
            .keys()
            .filter_map(|place| match place {
                Place::Path(path) => Some(path.clone()),
                Place::Port { .. } => None,
            })
            .collect()
    }

    /// Every place bound so far, in order; changes as workers bind more. Ends with the
    /// last clone of this.
    pub fn bound(&self) -> watch::Receiver<Vec<Place>> {
        self.inner.bound.subscribe()
    }

    /// `taker` listens at `place` from now on; binds it if no worker did before. Must
    /// run inside a tokio runtime (the accept loop is a task).
    pub(crate) fn join(&self, place: Place, taker: Taker) -> io::Result<Joined> {
        let mut ports = self.lock();
        if let Some(port) = ports.get_mut(&place) {
            if let (Place::Path(path), Some(file)) = (&place, port.file) {
                if file_of(path) != Some(file) {
                    // Removed (or replaced) since drover bound it: bound again, where
                    // clients now look for it.
                    let (listener, file) = bind(&place)?;
                    let accept = tokio::spawn(accept_loop(
                        Arc::downgrade(&self.inner),
                        place.clone(),
                        listener,
                        port.count.subscribe(),
                    ));
                    let replaced = std::mem::replace(&mut port.accept, accept);
                    port.file = file;
                    tokio::spawn(async move {
                        tokio::time::sleep(REPLACED_GRACE).await;
                        replaced.abort();
                    });
                }
            }
            if !port.takers.iter().any(|t| t.session == taker.session) {
                for stream in std::mem::take(&mut port.parked) {
                    if let Err(back) = taker.to.send((place.clone(), stream)) {
                        port.parked.push(back.0 .1);
                    }
                }
                port.takers.push(taker);
                port.count.send_replace(port.takers.len());
            }
            return Ok(Joined::AlreadyBound);
        }
        let (listener, file) = bind(&place)?;
        let (count, counted) = watch::channel(1);
        let accept = tokio::spawn(accept_loop(
            Arc::downgrade(&self.inner),
            place.clone(),
            listener,
            counted,
        ));
        ports.insert(
            place.clone(),
            Port {
                takers: vec![taker],
                parked: Vec::new(),
                next: 0,
                count,
                accept,
                file,
            },
        );
        self.inner.bound.send_modify(|bound| bound.push(place));
        Ok(Joined::Bound)
    }

    /// The session no longer listens at `place` (its server closed).
    pub(crate) fn leave(&self, place: &Place, session: u64) {
        if let Some(port) = self.lock().get_mut(place) {
            port.takers.retain(|t| t.session != session);
            port.count.send_replace(port.takers.len());
        }
    }

    /// The session listens nowhere any more (its worker left).
    pub(crate) fn leave_all(&self, session: u64) {
        for port in self.lock().values_mut() {
            port.takers.retain(|t| t.session != session);
            port.count.send_replace(port.takers.len());
        }
    }

    /// Sends `stream` to the next worker that listens at `place`; kept for the next to
    /// listen there while none does.
    pub(crate) fn deliver(&self, place: Place, stream: Socket) {
        self.inner.deliver(place, stream)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Place, Port>> {
        self.inner.lock()
    }
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Place, Port>> {
        self.ports.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn deliver(&self, place: Place, mut stream: Socket) {
        let mut ports = self.lock();
        let Some(port) = ports.get_mut(&place) else {
            return;
        };
        // The fewest pending first, in turn among equals (Node's primary goes round its
        // free workers); a taker whose session ended (its worker left between a join
        // and now) is dropped and the next one tried.
        while !port.takers.is_empty() {
            let n = port.takers.len();
            let i = (0..n)
                .map(|k| (port.next + k) % n)
                .min_by_key(|&i| port.takers[i].pending.load(Relaxed))
                .expect("takers is not empty");
            match port.takers[i].to.send((place.clone(), stream)) {
                Ok(()) => {
                    port.takers[i].pending.fetch_add(1, Relaxed);
                    port.next = i + 1;
                    return;
                }
                Err(back) => {
                    stream = back.0 .1;
                    port.takers.remove(i);
                    port.count.send_replace(port.takers.len());
                }
            }
        }
        if port.parked.len() < MAX_PARKED {
            port.parked.push(stream);
        }
    }
}

async fn accept_loop(
    inner: Weak<Inner>,
    place: Place,
    listener: Listener,
    mut counted: watch::Receiver<usize>,
) {
    loop {
        // Nobody listens (between an old worker and its replacement): clients wait in
        // the backlog, not in drover.
        if counted.wait_for(|&n| n > 0).await.is_err() {
            return;
        }
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            // The last worker left while this waited: leave new clients in the backlog.
            _ = counted.wait_for(|&n| n == 0) => continue,
        };
        let stream = match accepted {
            Ok(stream) => stream,
            Err(e) => {
                // A client gone before its accept, or drover short of descriptors: the
                // next accept decides, after a pause that lets descriptors free up.
                tracing::debug!(error = %e, %place, "accept on a shared port");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let Some(inner) = inner.upgrade() else {
            return;
        };
        inner.deliver(place.clone(), stream);
    }
}

/// A shared place's listening socket.
enum Listener {
    Tcp(tokio::net::TcpListener),
    Unix(tokio::net::UnixListener),
}

impl Listener {
    /// The next connection, out of the reactor: it only passes through drover.
    async fn accept(&self) -> io::Result<Socket> {
        match self {
            Listener::Tcp(l) => Ok(Socket::from(l.accept().await?.0.into_std()?)),
            Listener::Unix(l) => Ok(Socket::from(l.accept().await?.0.into_std()?)),
        }
    }
}

/// A listening socket at `place`, and a Unix socket's file (device, inode). Every
/// address is both IPv6 and IPv4 where the host has IPv6, as Node's `listen(port)`
/// binds `::` and falls back to `0.0.0.0`. A path that exists is refused
/// (`EADDRINUSE`), as Node's `listen(path)` refuses it: the app removes a stale one.
fn bind(place: &Place) -> io::Result<(Listener, Option<(u64, u64)>)> {
    let (ip, port) = match place {
        Place::Port { address, port } => (*address, *port),
        Place::Path(path) => {
            let socket = Socket::new(Domain::UNIX, Type::STREAM, None)?;
            // A path longer than a socket address holds: the error Node's own bind gives.
            let addr = SockAddr::unix(path).map_err(|_| {
                io::Error::from_raw_os_error(nix::errno::Errno::ENAMETOOLONG as i32)
            })?;
            socket.bind(&addr)?;
            socket.listen(511)?;
            socket.set_nonblocking(true)?;
            let listener = tokio::net::UnixListener::from_std(socket.into())?;
            return Ok((Listener::Unix(listener), file_of(path)));
        }
    };
    let socket = match ip {
        Some(ip) => listening(SocketAddr::new(ip, port), false)?,
        None => listening(
            SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), port),
            true,
        )
        .or_else(|_| {
            listening(
                SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port),
                false,
            )
        })?,
    };
    let listener = tokio::net::TcpListener::from_std(std::net::TcpListener::from(socket))?;
    Ok((Listener::Tcp(listener), None))
}

/// The file at `path` (device, inode), if there is one.
fn file_of(path: &Path) -> Option<(u64, u64)> {
    std::fs::symlink_metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

fn listening(addr: SocketAddr, dual_stack: bool) -> io::Result<Socket> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    if dual_stack {
        socket.set_only_v6(false)?;
    }
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())?;
    // Node's default backlog.
    socket.listen(511)?;
    socket.set_nonblocking(true)?;
    Ok(socket)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use tokio::io::AsyncWriteExt;

    fn taker(session: u64) -> (Taker, mpsc::UnboundedReceiver<(Place, Socket)>) {
        let (to, from) = mpsc::unbounded_channel();
        let pending = Arc::new(AtomicUsize::new(0));
        (
            Taker {
                session,
                to,
                pending,
            },
            from,
        )
    }

    fn free_port() -> u16 {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    async fn connect(port: u16) -> tokio::net::TcpStream {
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn connections_go_to_the_workers_that_listen_in_turn_and_wait_while_none_does() {
        let ports = SharedPorts::new();
        let port = free_port();
        let place = Place::Port {
            address: Some(IpAddr::V4(Ipv4Addr::LOCALHOST)),
            port,
        };
        let (a, mut to_a) = taker(1);
        let (b, mut to_b) = taker(2);
        assert_eq!(ports.join(place.clone(), a.clone()).unwrap(), Joined::Bound);
        assert_eq!(ports.join(place.clone(), b).unwrap(), Joined::AlreadyBound);
        assert_eq!(ports.join(place.clone(), a).unwrap(), Joined::AlreadyBound);
        assert_eq!(ports.ports(), vec![(place.clone(), 2)]);
        assert_eq!(*ports.bound().borrow(), vec![place.clone()]);
        let mut clients = Vec::new();
        for _ in 0..4 {
            clients.push(connect(port).await);
        }
        let mut got = [0, 0];
        for _ in 0..4 {
            tokio::select! {
                Some((at, _)) = to_a.recv() => { assert_eq!(at, place); got[0] += 1 }
                Some((at, _)) = to_b.recv() => { assert_eq!(at, place); got[1] += 1 }
            }
        }
        assert_eq!(got, [2, 2]);

        // A worker with connections not taken up (busy, stalled) gets none while
        // another has fewer.
        let (c, mut to_c) = taker(3);
        c.pending.store(5, Relaxed);
        ports.join(place.clone(), c.clone()).unwrap();
        let mut more = Vec::new();
        for _ in 0..4 {
            more.push(connect(port).await);
        }
        for _ in 0..4 {
            tokio::select! {
                Some(_) = to_a.recv() => {}
                Some(_) = to_b.recv() => {}
            }
        }
        assert!(to_c.try_recv().is_err());
        ports.leave(&place, 3);

        // Nobody listens: the connection waits in the backlog, then goes to the worker
        // that joins.
        ports.leave(&place, 1);
        ports.leave_all(2);
        let mut waiting = connect(port).await;
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        assert!(to_a.try_recv().is_err() && to_b.try_recv().is_err());
        let (c, mut to_c) = taker(3);
        assert_eq!(ports.join(place.clone(), c).unwrap(), Joined::AlreadyBound);
        let (_, served) = to_c.recv().await.unwrap();
        waiting.write_all(b"hi").await.unwrap();
        served.set_nonblocking(false).unwrap();
        let mut served = std::net::TcpStream::from(served);
        let mut buf = [0; 2];
        served.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"hi");
    }

    #[tokio::test]
    async fn a_taker_that_is_gone_is_skipped_and_a_taken_port_is_an_error() {
        let ports = SharedPorts::new();
        let port = free_port();
        let place = Place::Port {
            address: Some(IpAddr::V4(Ipv4Addr::LOCALHOST)),
            port,
        };
        let (gone, to_gone) = taker(1);
        let (here, mut to_here) = taker(2);
        ports.join(place.clone(), gone).unwrap();
        ports.join(place.clone(), here).unwrap();
        drop(to_gone);
        let _client = connect(port).await;
        let _client2 = connect(port).await;
        assert!(to_here.recv().await.is_some());
        assert!(to_here.recv().await.is_some());
        assert_eq!(ports.ports(), vec![(place.clone(), 1)]);

        let other = SharedPorts::new();
        let err = other
            .join(place.clone(), taker(3).0)
            .expect_err("port is taken");
        assert_eq!(err.kind(), io::ErrorKind::AddrInUse);

        // The last clone gone, the port is free again.
        drop(ports);
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert_eq!(
            other.join(place.clone(), taker(4).0).unwrap(),
            Joined::Bound
        );
    }

    #[tokio::test]
    async fn a_unix_socket_is_shared_bound_again_when_removed_and_removed_at_the_end() {
        use std::os::unix::fs::FileTypeExt;
        let dir = std::env::temp_dir().join(format!("drover-shared-unix-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("app.sock");
        let _ = std::fs::remove_file(&path);
        let place = Place::Path(path.clone());
        assert_eq!(place.to_string(), format!("unix:{}", path.display()));
        let ports = SharedPorts::new();
        let (a, mut to_a) = taker(1);
        assert_eq!(ports.join(place.clone(), a).unwrap(), Joined::Bound);
        assert!(std::fs::metadata(&path).unwrap().file_type().is_socket());
        assert_eq!(ports.unix_sockets(), vec![path.clone()]);
        let mut client = tokio::net::UnixStream::connect(&path).await.unwrap();
        let (at, served) = to_a.recv().await.unwrap();
        assert_eq!(at, place);
        client.write_all(b"hi").await.unwrap();
        served.set_nonblocking(false).unwrap();
        let mut served = std::os::unix::net::UnixStream::from(std::os::fd::OwnedFd::from(served));
        let mut buf = [0; 2];
        served.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"hi");

        // A worker removed the file (its guard against a stale one): the next to join
        // binds the path again, and clients reach it there.
        std::fs::remove_file(&path).unwrap();
        let (b, mut to_b) = taker(2);
        assert_eq!(ports.join(place.clone(), b).unwrap(), Joined::AlreadyBound);
        assert!(std::fs::metadata(&path).unwrap().file_type().is_socket());
        for _ in 0..2 {
            let _client = tokio::net::UnixStream::connect(&path).await.unwrap();
            tokio::select! {
                Some(_) = to_a.recv() => {}
                Some(_) = to_b.recv() => {}
            }
        }

        // A file that is there already is refused, as Node's listen(path) refuses it,
        // and left as it was.
        let taken = dir.join("taken.sock");
        std::fs::write(&taken, "mine").unwrap();
        let err = ports
            .join(Place::Path(taken.clone()), taker(3).0)
            .expect_err("a file is there");
        assert_eq!(err.kind(), io::ErrorKind::AddrInUse);
        assert_eq!(std::fs::read_to_string(&taken).unwrap(), "mine");
        let long = Place::Path(dir.join("x".repeat(120)));
        let err = ports.join(long, taker(4).0).expect_err("too long");
        assert_eq!(
            err.raw_os_error(),
            Some(nix::errno::Errno::ENAMETOOLONG as i32)
        );

        // The last clone gone, the socket's file goes too.
        drop(ports);
        assert!(!path.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
