//! One worker's side of the conversation: answer its `listen()`, then hand it the
//! connections that arrive on its loopback port.

use crate::channel::{Channel, ChannelError, Line};
use crate::message::{self, AddressType, FromWorker, ServerQuery};
use crate::relay::Relay;
use crate::shared_ports::{self, Joined, Place, SharedPorts, Taker};
use serde_json::Value;
use socket2::{Domain, Protocol, SockRef, Socket, Type};
use std::collections::VecDeque;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::UnixStream;
use tokio::sync::{broadcast, mpsc};

/// Connections accepted for a worker and not yet handed over. Past this many, drover
/// stops accepting for it and the rest wait in the kernel's backlog: a worker that
/// stopped reading its channel cannot make drover hold sockets without bound.
const MAX_WAITING: usize = 64;

/// Connections sent to a worker before it acknowledges them. Node's own primary sends
/// one at a time, so a worker takes up one connection per turn of its event loop; the
/// kernel never puts two descriptors in one read, and Node matches each with its line,
/// so more may go at once: libuv reads up to 32 times per turn.
const MAX_UNACKNOWLEDGED: usize = 32;

/// Node resends a handle whose delivery failed (`NODE_HANDLE_NACK`) this many times.
const MAX_RESENDS: u32 = 3;

/// libuv's errno values (negated errno), which the app's `listen()` raises.
const UV_EADDRINUSE: i32 = -98;
const UV_ENOTSUP: i32 = -95;
const UV_EINVAL: i32 = -22;

/// How a session ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Ended {
    /// The worker closed its end: it exited (or closed the channel on purpose).
    WorkerLeft,
}

/// What a session reports as it goes, for drover's log and status.
#[derive(Debug)]
pub enum SessionEvent {
    /// The app listens; it asked for port `asked` at `address` (`None`: any address, as
    /// `listen(3000)` asks) and is served on drover's loopback `port`; its server
    /// speaks `speaks`.
    Serving {
        asked: i64,
        address: Option<IpAddr>,
        port: u16,
        speaks: crate::Speaks,
        /// It listens on a Unix socket (`asked` is then -1), which its workers share.
        unix: bool,
        /// It keeps sessions every request of which must reach it (socket.io's, see
        /// `ServerQuery::keeps_sessions`): no client connection is handed to it.
        keeps_sessions: bool,
    },
    /// The app listens at `place` (a port after its first, or a Unix socket): the app's
    /// workers share it, as under Node's cluster module (see `SharedPorts`); `bound`:
    /// this worker was the first to listen there, and drover bound it.
    AlsoServing { place: Place, bound: bool },
    /// A `listen()` drover cannot serve, and why (the app's `listen()` got an error).
    Refused { reason: String },
    /// The app listened on "any port" (`listen(0)`) and got a TCP socket of its own, on
    /// `port`: drover leaves it to the app, and routes none of its clients there.
    OwnPort { port: u16 },
    /// A client connection the worker gave back, between two requests, when drover
    /// asked (`Inbox::give_back_connections`, `Inbox::reclaim`): drover serves it from
    /// here on.
    Returned(TcpStream),
    /// The worker now serves client connections drover handed it (`true`), or none any
    /// more (`false`); said when that changes, as drover's preload counts them.
    ServesClients(bool),
    /// The worker answered these requests on client connections drover handed it.
    Served(Box<crate::Served>),
    /// The app sent `process.send('ready')`, as an app run by PM2 with `wait_ready`
    /// does once it can take clients (its database connected, its caches warm).
    AppReady,
}

/// The server a worker's connections go to.
struct Served {
    /// Node's name for the server, which `newconn` carries.
    key: String,
    asked: i64,
    /// The address the app named, if it named one (where drover bound the app's
    /// socket, for an app that listens on its `PORT`).
    address: Option<IpAddr>,
    /// drover's listener on the worker's port, for an app that listens elsewhere; `None`
    /// when the app listens on its `PORT` itself (through a socket drover bound for it).
    listener: Option<tokio::net::TcpListener>,
}

/// A server on a port after the worker's first, shared with the app's other workers.
struct AlsoServed {
    place: Place,
    /// Node's name for the server, which `newconn` carries.
    key: String,
}

/// A connection sent and not yet acknowledged.
struct InFlight {
    /// The `newconn`'s own sequence number, which the worker's answer names.
    seq: u64,
    message: Value,
    socket: Waiting,
    resends: u32,
}

/// Connections the worker has and has not yet said it took: drover keeps its copy, as
/// Node's primary does, so that one the worker refuses (its server closed a moment
/// before, or at `maxConnections`) goes to another worker. Past this many unanswered,
/// the oldest copy is closed (a worker that never answers cannot make drover hold
/// sockets without bound).
const MAX_UNANSWERED: usize = 256;

/// A retiring worker takes no more shared-port connections, and is asked to leave this
/// long after the last one it took: Node's `server.close()` closes a connection with no
/// request read yet (it is idle), so one taken up a moment before would be reset.
const SHARED_GRACE: Duration = Duration::from_millis(200);

/// A connection for the worker, and whether it came through the `Inbox` (and so counts
/// in its `queued` until the worker takes it).
struct Waiting {
    socket: Socket,
    given: bool,
    /// A shared port's connection (`None`: the first port's).
    shared: Option<Place>,
}

/// What drover tells a session from outside.
enum ToSession {
    /// A client connection for the app's server (handoff).
    Connection(TcpStream),
    /// Ask the worker to close its servers and leave once its connections end (Node's
    /// `worker.disconnect()`), so the clients it serves directly see no reset.
    Disconnect,
    /// Ask drover's preload in the worker to give back its client connections.
    GiveBack,
    /// Ask drover's preload to give back its client connections and keep serving.
    Reclaim,
    /// Ask drover's preload whether the worker's event loop turns (`Pong`).
    Ping,
}

/// Gives a session's worker client connections directly (drover's handoff) and asks it
/// to leave; cheap to clone.
#[derive(Clone)]
pub struct Inbox {
    tx: mpsc::UnboundedSender<ToSession>,
    queued: Arc<AtomicUsize>,
    given: Arc<AtomicBool>,
    /// The worker listens on a port the app's workers share (`SharedPorts`).
    shares: Arc<AtomicBool>,
    /// When the worker last took up a connection given to it, or was given one with
    /// none waiting: milliseconds since `epoch`.
    progress_ms: Arc<AtomicU64>,
    epoch: Instant,
    /// drover's preload runs in the worker (it said so), so it can give connections back.
    preloaded: Arc<AtomicBool>,
    /// The preload said it gave back every connection it could.
    all_returned: Arc<AtomicBool>,
    /// When the preload last answered a ping: milliseconds since `epoch` (0: never).
    pong_ms: Arc<AtomicU64>,
    /// The pid the preload runs in, as it said (0: not said).
    app_pid: Arc<AtomicU32>,
    /// Client connections handed to the worker that it serves now: the preload's count,
    /// plus those it acknowledged since it last counted.
    clients: Arc<AtomicUsize>,
    /// The app asked whether it is the cluster's primary (`FromWorker::AskedPrimary`).
    asked_primary: Arc<AtomicBool>,
    /// The app ends itself on drover's SIGTERM (`FromWorker::HandlesStop`).
    handles_stop: Arc<AtomicBool>,
}

/// A worker with connections waiting that has taken up none for this long is stalled
/// (busy in one long task, stopped, or hung): new connections go elsewhere. A busy
/// worker's event loop turns every few milliseconds and takes up a burst in one turn.
const STALLED_AFTER: Duration = Duration::from_millis(100);

impl Inbox {
    /// Whether connections wait for the worker and it has taken up none of them for a
    /// while (see `STALLED_AFTER`).
    pub fn is_stalled(&self) -> bool {
        self.queued() > 0 && self.since_progress() > STALLED_AFTER
    }

    fn since_progress(&self) -> Duration {
        let now = self.epoch.elapsed().as_millis() as u64;
        Duration::from_millis(now.saturating_sub(self.progress_ms.load(Relaxed)))
    }

    fn note_progress(&self) {
        self.progress_ms
            .store(self.epoch.elapsed().as_millis() as u64, Relaxed);
    }

    /// Connections given and not yet taken up by the worker: it takes one only when its
    /// event loop runs, so this grows while the worker is busy.
    pub fn queued(&self) -> usize {
        self.queued.load(Relaxed)
    }

    /// Gives the worker `stream`; it is back when the session has ended.
    pub fn give(&self, stream: TcpStream) -> Result<(), TcpStream> {
        if self.queued.fetch_add(1, Relaxed) == 0 {
            // The stall clock starts with the first connection that waits.
            self.note_progress();
        }
        self.given.store(true, Relaxed);
        self.tx.send(ToSession::Connection(stream)).map_err(|back| {
            self.queued.fetch_sub(1, Relaxed);
            match back.0 {
                ToSession::Connection(stream) => stream,
                ToSession::Disconnect
                | ToSession::GiveBack
                | ToSession::Reclaim
                | ToSession::Ping => {
                    unreachable!("sent a connection")
                }
            }
        })
    }

    /// Whether the worker was ever given a connection this way.
    pub fn was_given(&self) -> bool {
        self.given.load(Relaxed)
    }

    /// Whether the worker listens on a port the app's workers share, whose clients it
    /// then serves directly.
    pub fn shares_ports(&self) -> bool {
        self.shares.load(Relaxed)
    }

    /// Asks the worker to close its servers and leave once its connections end.
    pub fn disconnect(&self) {
        let _ = self.tx.send(ToSession::Disconnect);
    }

    /// Whether the worker can give its client connections back (drover's preload runs
    /// in it).
    pub fn can_give_back(&self) -> bool {
        self.preloaded.load(Relaxed)
    }

    /// Asks the worker to give back its client connections, each between two requests
    /// (they arrive as `SessionEvent::Returned`); `all_given_back` says when it has.
    pub fn give_back_connections(&self) {
        let _ = self.tx.send(ToSession::GiveBack);
    }

    /// Client connections handed to the worker that it serves now; `None` when the
    /// worker cannot say (drover's preload does not run in it).
    pub fn clients(&self) -> Option<usize> {
        self.preloaded
            .load(Relaxed)
            .then(|| self.clients.load(Relaxed))
    }

    /// Whether the app asked Node's cluster module if it is the primary: an app that
    /// runs a primary of its own, which as drover's worker it is not.
    pub fn asked_primary(&self) -> bool {
        self.asked_primary.load(Relaxed)
    }

    /// Asks the worker to give back the client connections it serves, each between two
    /// requests (they arrive as `SessionEvent::Returned`), and to go on serving what
    /// drover sends it. Nothing happens without the preload.
    pub fn reclaim(&self) {
        if self.preloaded.load(Relaxed) {
            let _ = self.tx.send(ToSession::Reclaim);
        }
    }

    /// Whether the app ends itself on drover's SIGTERM, as its preload said: it listens
    /// for SIGTERM, or for SIGINT (PM2's signal, which the preload hands it).
    pub fn handles_stop(&self) -> bool {
        self.handles_stop.load(Relaxed)
    }

    /// The worker gave back every client connection it could.
    pub fn all_given_back(&self) -> bool {
        self.all_returned.load(Relaxed)
    }

    /// Whether drover's preload runs in the worker, so that its event loop answers a
    /// `ping`.
    pub fn answers_pings(&self) -> bool {
        self.preloaded.load(Relaxed)
    }

    /// Asks drover's preload in the worker to answer from its event loop; whether it
    /// did, `event_loop_answered_since` says. Nothing happens without the preload.
    pub fn ping(&self) {
        if self.preloaded.load(Relaxed) {
            let _ = self.tx.send(ToSession::Ping);
        }
    }

    /// Whether the worker's event loop answered a ping after `at`: it turns, so the
    /// worker waits (on a database, a timer, a slow service) rather than spins or is
    /// stopped.
    pub fn event_loop_answered_since(&self, at: Instant) -> bool {
        let at_ms = at.saturating_duration_since(self.epoch).as_millis() as u64;
        let pong = self.pong_ms.load(Relaxed);
        pong != 0 && pong >= at_ms
    }

    /// The process the app runs in, as drover's preload there said: the worker's own
    /// pid for `node app.js`, another below a runner (`npm start`, `tsx`, `sh -c`).
    /// `None` until it said (or without the preload).
    pub fn app_pid(&self) -> Option<u32> {
        Some(self.app_pid.load(Relaxed)).filter(|&p| p != 0)
    }
}

/// drover as the cluster primary of one worker.
pub struct Session {
    channel: Channel,
    /// The worker's loopback port (its `PORT`): where drover accepts the connections of
    /// the app's server, whatever port the app asked for.
    port: u16,
    /// The port whose server is the app's (`balancing`); `None`: its first.
    app_port: Option<u16>,
    seq: u64,
    served: Option<Served>,
    /// The servers on ports after the first, and the app's shared ports they join.
    also: Vec<AlsoServed>,
    shared_ports: SharedPorts,
    /// socket.io's cluster adapter messages to and from the app's other workers.
    relay: Relay,
    relay_in: broadcast::Receiver<(u64, Arc<Value>)>,
    /// This session among the takers of `shared_ports`.
    id: u64,
    to_me: mpsc::UnboundedSender<(Place, Socket)>,
    shared_in: mpsc::UnboundedReceiver<(Place, Socket)>,
    /// Shared-port connections here and not yet taken up by the worker, for
    /// `SharedPorts` to place the next one (`Taker::pending`).
    shared_pending: Arc<AtomicUsize>,
    waiting: VecDeque<Waiting>,
    /// Sent and not yet acknowledged, oldest first: the worker acknowledges in the
    /// order it receives them.
    in_flight: VecDeque<InFlight>,
    /// Acknowledged and not yet answered, oldest first, by `newconn` seq.
    unanswered: VecDeque<(u64, Waiting)>,
    /// When the worker was last handed a shared port's connection.
    shared_handed_at: Option<Instant>,
    said_unreadable: bool,
    inbox: Inbox,
    from_drover: mpsc::UnboundedReceiver<ToSession>,
    /// drover asked the worker to leave; the message goes once every connection given
    /// before has been handed over (after it, the worker would refuse them).
    disconnect: Ask,
    /// drover asked for the worker's connections back; as with `disconnect`, the
    /// message goes once every connection given before has been handed over.
    give_back: Ask,
    /// drover asked whether the event loop turns; the ping goes, as the asks above do,
    /// when no connection is on its way, so it never sits between a handle's message
    /// and its acknowledgement.
    ping_due: bool,
    /// drover asked for the worker's connections back while it stays (sent as the
    /// ping is); `reclaimed`: it did at least once, so returned handles are taken.
    reclaim_due: bool,
    reclaimed: bool,
}

/// A request of drover's to the worker that waits until the connections given before
/// it have been handed over.
#[derive(PartialEq, Eq, Clone, Copy)]
enum Ask {
    Unasked,
    Due,
    Sent,
}

impl Session {
    /// A session on drover's end of the channel; `port` is the worker's `PORT`;
    /// `shared_ports` are the app's, which every worker of it joins.
    pub fn new(
        channel: std::os::unix::net::UnixStream,
        port: u16,
        shared_ports: SharedPorts,
        relay: Relay,
    ) -> io::Result<Session> {
        channel.set_nonblocking(true)?;
        let (tx, from_drover) = mpsc::unbounded_channel();
        let (to_me, shared_in) = mpsc::unbounded_channel();
        Ok(Session {
            channel: Channel::new(UnixStream::from_std(channel)?),
            port,
            app_port: None,
            seq: 0,
            served: None,
            also: Vec::new(),
            shared_ports,
            relay_in: relay.subscribe(),
            relay,
            id: shared_ports::next_session(),
            to_me,
            shared_in,
            shared_pending: Arc::new(AtomicUsize::new(0)),
            waiting: VecDeque::new(),
            in_flight: VecDeque::new(),
            unanswered: VecDeque::new(),
            shared_handed_at: None,
            said_unreadable: false,
            inbox: Inbox {
                tx,
                queued: Arc::new(AtomicUsize::new(0)),
                given: Arc::new(AtomicBool::new(false)),
                shares: Arc::new(AtomicBool::new(false)),
                progress_ms: Arc::new(AtomicU64::new(0)),
                epoch: Instant::now(),
                preloaded: Arc::new(AtomicBool::new(false)),
                all_returned: Arc::new(AtomicBool::new(false)),
                pong_ms: Arc::new(AtomicU64::new(0)),
                app_pid: Arc::new(AtomicU32::new(0)),
                clients: Arc::new(AtomicUsize::new(0)),
                asked_primary: Arc::new(AtomicBool::new(false)),
                handles_stop: Arc::new(AtomicBool::new(false)),
            },
            from_drover,
            disconnect: Ask::Unasked,
            give_back: Ask::Unasked,
            ping_due: false,
            reclaim_due: false,
            reclaimed: false,
        })
    }

    /// The app's server is the one on `app_port` (`drover run --app-port`), not its
    /// first: an app may start a metrics server before its API, which listens once its
    /// database answers. A server on another port before it is shared by the workers,
    /// as any port after the first is.
    pub fn balancing(mut self, app_port: Option<u16>) -> Session {
        self.app_port = app_port;
        self
    }

    /// Where drover gives this worker client connections directly.
    pub fn inbox(&self) -> Inbox {
        self.inbox.clone()
    }

    /// Serves the worker until it leaves. `report` hears what the app's `listen()` got.
    pub async fn run(
        mut self,
        mut report: impl FnMut(SessionEvent),
    ) -> Result<Ended, ChannelError> {
        let ended = self.serve_worker(&mut report).await;
        // A shared port's connections not taken up go to the app's other workers.
        self.shared_ports.leave_all(self.id);
        self.shared_in.close();
        while let Ok((place, socket)) = self.shared_in.try_recv() {
            self.shared_ports.deliver(place, socket);
        }
        // The worker is gone (it exited, was killed, or closed its channel): client
        // connections given to it and not yet taken up go back to the balancer, whose
        // clients then see nothing of it. One sent and not acknowledged was not taken
        // up either: Node acknowledges a connection before it reads from it.
        let unserved = self
            .waiting
            .drain(..)
            .chain(self.in_flight.drain(..).map(|f| f.socket));
        for waiting in unserved.collect::<Vec<_>>() {
            self.taken(&waiting);
            if let Some(place) = waiting.shared {
                self.shared_ports.deliver(place, waiting.socket);
            } else if waiting.given {
                report(SessionEvent::Returned(TcpStream::from(waiting.socket)));
            }
        }
        ended
    }

    async fn serve_worker(
        &mut self,
        report: &mut impl FnMut(SessionEvent),
    ) -> Result<Ended, ChannelError> {
        loop {
            while let Some(line) = self.channel.take_line() {
                self.on_line(line, report).await?;
            }
            if !self.also.is_empty() {
                let pending = self.waiting.iter().filter(|w| w.shared.is_some()).count()
                    + self
                        .in_flight
                        .iter()
                        .filter(|f| f.socket.shared.is_some())
                        .count()
                    + self
                        .unanswered
                        .iter()
                        .filter(|(_, w)| w.shared.is_some())
                        .count();
                self.shared_pending.store(pending, Relaxed);
            }
            while self.in_flight.len() < MAX_UNACKNOWLEDGED {
                let Some(socket) = self.waiting.pop_front() else {
                    break;
                };
                self.hand_over(socket).await?;
            }
            let all_handed = self.in_flight.is_empty() && self.waiting.is_empty();
            if all_handed && self.give_back == Ask::Due {
                self.channel.send(&message::give_connections_back()).await?;
                self.give_back = Ask::Sent;
            }
            if all_handed && self.reclaim_due {
                self.channel.send(&message::reclaim_connections()).await?;
                self.reclaim_due = false;
                self.reclaimed = true;
            }
            if all_handed && self.ping_due {
                self.channel.send(&message::ping()).await?;
                self.ping_due = false;
            }
            // Shared-port connections taken up just before may still wait for their
            // first request to be read (see `SHARED_GRACE`).
            let shared_settles = self
                .shared_handed_at
                .map(|at| at + SHARED_GRACE)
                .filter(|&at| at > Instant::now());
            let shared_unanswered = self.unanswered.iter().any(|(_, w)| w.shared.is_some());
            if all_handed
                && self.disconnect == Ask::Due
                && shared_settles.is_none()
                && !shared_unanswered
            {
                let mut body = serde_json::Map::new();
                body.insert("act".into(), "disconnect".into());
                self.send(body).await?;
                self.disconnect = Ask::Sent;
            }
            let accepting = self.waiting.len() < MAX_WAITING;
            tokio::select! {
                more = self.channel.fill() => {
                    if !more? {
                        return Ok(Ended::WorkerLeft);
                    }
                }
                Some(order) = self.from_drover.recv() => match order {
                    ToSession::Connection(socket) => {
                        self.push(Waiting { socket: Socket::from(socket), given: true, shared: None })
                    }
                    ToSession::Disconnect => {
                        if self.disconnect == Ask::Unasked {
                            self.disconnect = Ask::Due;
                            // Its shared ports' new connections go to the other workers
                            // from now on, those waiting here too.
                            self.shared_ports.leave_all(self.id);
                            let (shared, kept) = std::mem::take(&mut self.waiting)
                                .into_iter()
                                .partition(|w| w.shared.is_some());
                            self.waiting = kept;
                            for w in shared {
                                self.push(w);
                            }
                        }
                    }
                    ToSession::GiveBack => {
                        if self.give_back == Ask::Unasked {
                            self.give_back = Ask::Due;
                        }
                    }
                    ToSession::Ping => self.ping_due = true,
                    ToSession::Reclaim => self.reclaim_due = true,
                },
                Some((place, socket)) = self.shared_in.recv() => {
                    self.push(Waiting { socket, given: false, shared: Some(place) })
                }
                relayed = self.relay_in.recv() => match relayed {
                    Ok((from, message)) if from != self.id => self.channel.send(&message).await?,
                    Ok(_) => {}
                    Err(broadcast::error::RecvError::Lagged(missed)) => tracing::warn!(
                        "a Node worker read its IPC channel too slowly and missed {missed} of \
                         socket.io's cluster adapter messages from the app's other workers"
                    ),
                    // The session holds a sender itself.
                    Err(broadcast::error::RecvError::Closed) => {}
                },
                _ = tokio::time::sleep_until(shared_settles.unwrap_or_else(Instant::now).into()),
                    if shared_settles.is_some() && self.disconnect == Ask::Due => {}
                accepted = accept(self.served.as_ref()), if accepting => {
                    match accepted {
                        Ok(socket) => self.push(Waiting { socket, given: false, shared: None }),
                        // The client gave up before we accepted, or drover is short
                        // of descriptors: the next accept decides.
                        Err(e) => tracing::debug!(error = %e, "accept for a Node worker"),
                    }
                }
            }
        }
    }

    async fn on_line(
        &mut self,
        line: Line,
        report: &mut impl FnMut(SessionEvent),
    ) -> Result<(), ChannelError> {
        let line = match line {
            Line::Message(line) => line,
            Line::TooLong => {
                tracing::warn!(
                    "a Node worker sent a message over 1 MiB on its IPC channel; skipped"
                );
                return Ok(());
            }
        };
        match message::parse(&line) {
            FromWorker::QueryServer(query) => self.answer(query, report).await?,
            FromWorker::HandleAck => {
                if let Some(done) = self.in_flight.pop_front() {
                    self.taken(&done.socket);
                    if done.socket.given {
                        // Counted at once, before the preload's next count says so: a
                        // worker that just took one is not free for the next.
                        let was = self.inbox.clients.fetch_add(1, Relaxed);
                        if was == 0 && self.inbox.preloaded.load(Relaxed) {
                            report(SessionEvent::ServesClients(true));
                        }
                    }
                    self.unanswered.push_back((done.seq, done.socket));
                    if self.unanswered.len() > MAX_UNANSWERED {
                        self.unanswered.pop_front();
                    }
                }
            }
            FromWorker::HandleNack => self.resend().await?,
            FromWorker::Handle { returned } => {
                // Claimed whether or not drover wants it: the next handle's descriptor
                // must not be matched with this line.
                let fd = self.channel.take_descriptor();
                let asked = self.give_back == Ask::Sent || self.reclaimed;
                match (fd, returned && asked) {
                    (Some(fd), true) => match client_connection(fd) {
                        Ok(stream) => report(SessionEvent::Returned(stream)),
                        Err(e) => tracing::warn!(
                            "a Node worker gave back a descriptor that is not a TCP connection ({e}); closed"
                        ),
                    },
                    (Some(_), false) => tracing::debug!(
                        "a Node worker sent the primary a handle drover does not take; closed"
                    ),
                    (None, _) => tracing::debug!("a Node worker's handle message came without a descriptor"),
                }
                self.channel.send(&message::handle_ack()).await?;
            }
            FromWorker::PreloadReady { pid } => {
                self.inbox.preloaded.store(true, Relaxed);
                if let Some(pid) = pid {
                    self.inbox.app_pid.store(pid, Relaxed);
                }
            }
            FromWorker::AllReturned => self.inbox.all_returned.store(true, Relaxed),
            FromWorker::AskedPrimary => self.inbox.asked_primary.store(true, Relaxed),
            FromWorker::HandlesStop(on) => self.inbox.handles_stop.store(on, Relaxed),
            FromWorker::Clients(n) => {
                let was = self.inbox.clients.swap(n, Relaxed);
                if (was == 0) != (n == 0) {
                    report(SessionEvent::ServesClients(n > 0));
                }
            }
            FromWorker::Served(served) => report(SessionEvent::Served(served)),
            FromWorker::Pong => {
                let now = self.inbox.epoch.elapsed().as_millis() as u64;
                self.inbox.pong_ms.store(now.max(1), Relaxed);
            }
            FromWorker::Close { key } => {
                if let Some(i) = self.also.iter().position(|a| a.key == key) {
                    // Its connections go to the app's other workers from now on.
                    let closed = self.also.swap_remove(i);
                    self.shared_ports.leave(&closed.place, self.id);
                }
                if self.served.as_ref().is_some_and(|s| s.key == key) {
                    // The app closed its server: refuse new connections, as its own
                    // closed port would, so the balancer fails over at once.
                    self.served = None;
                    let (dropped, kept) = std::mem::take(&mut self.waiting)
                        .into_iter()
                        .partition(|w| w.shared.is_none());
                    self.waiting = kept;
                    for dropped in dropped {
                        self.taken(&dropped);
                    }
                }
            }
            FromWorker::ExitedAfterDisconnect { seq } => {
                self.send(message::ack(seq)).await?;
            }
            FromWorker::ConnectionAnswer { seq, accepted } => {
                let Some(i) = self.unanswered.iter().position(|(s, _)| *s == seq) else {
                    return Ok(());
                };
                let (_, refused) = self.unanswered.remove(i).expect("found");
                if !accepted {
                    tracing::debug!(
                        "a Node worker refused a connection (server closed or at maxConnections)"
                    );
                    self.elsewhere(refused, report);
                }
            }
            FromWorker::Online | FromWorker::Listening { .. } | FromWorker::OtherInternal => {}
            // PM2's `wait_ready`: the app says it can take clients (`process.send('ready')`).
            FromWorker::App(Value::String(s)) if s == "ready" => report(SessionEvent::AppReady),
            FromWorker::App(value) => {
                if !self.relay.publish(self.id, &value) {
                    tracing::debug!(%value, "message from a Node worker");
                }
            }
            FromWorker::Unreadable => {
                if !std::mem::replace(&mut self.said_unreadable, true) {
                    tracing::warn!(
                        "a Node worker sent a line that is not JSON on its IPC channel; skipped"
                    );
                }
            }
        }
        Ok(())
    }

    async fn answer(
        &mut self,
        query: ServerQuery,
        report: &mut impl FnMut(SessionEvent),
    ) -> Result<(), ChannelError> {
        match query.address_type {
            AddressType::Tcp4 | AddressType::Tcp6 if query.port != 0 => {
                self.serve(query, report).await
            }
            // A listen on "any port" is the app's own business (a test server, a debug
            // endpoint): it gets a socket of its own, as a bind would give it.
            AddressType::Tcp4 | AddressType::Tcp6 | AddressType::Udp4 | AddressType::Udp6 => {
                match bind_for(&query) {
                    Ok(socket) => {
                        let body = message::answer(&query, 0);
                        let line = message::with_handle(self.next(body));
                        self.channel.send_with(&line, socket.as_fd()).await?;
                        let tcp =
                            matches!(query.address_type, AddressType::Tcp4 | AddressType::Tcp6);
                        let bound = socket.local_addr().ok().and_then(|a| a.as_socket());
                        if let (true, Some(bound)) = (tcp, bound) {
                            report(SessionEvent::OwnPort { port: bound.port() });
                        }
                        Ok(())
                    }
                    Err(e) => {
                        let reason = format!("bind {}: {e}", describe(&query));
                        self.refuse(&query, errno_of(&e), reason, report).await
                    }
                }
            }
            AddressType::Pipe => {
                let Some(path) = unix_path(&query) else {
                    let reason = format!(
                        "listen({:?}): not an absolute Unix socket path (Node's cluster \
                         module resolves the app's own in the worker's directory)",
                        query.address.as_deref().unwrap_or("")
                    );
                    return self.refuse(&query, UV_EINVAL, reason, report).await;
                };
                self.serve_unix(query, path, report).await
            }
            AddressType::Fd => {
                let reason = "listen({ fd }) asks for an inherited socket; under `drover run` the \
                     app must listen on a port (any port: drover routes it), or run with \
                     --mode shared, which passes its socket as fd 3"
                    .to_string();
                self.refuse(&query, UV_ENOTSUP, reason, report).await
            }
        }
    }

    /// The app's server: its connections arrive on the worker's loopback port.
    async fn serve(
        &mut self,
        query: ServerQuery,
        report: &mut impl FnMut(SessionEvent),
    ) -> Result<(), ChannelError> {
        if query.probe {
            // Not the app's server (see `ServerQuery::probe`): told "listening", and
            // nothing is bound, so that nothing (a readiness check at the worker's
            // port) takes it for one. The server that follows is the app's.
            return self.send(message::listening_without_socket(&query)).await;
        }
        let not_the_apps = self.served.is_none()
            && self
                .app_port
                .is_some_and(|port| i64::from(port) != query.port);
        if let Some(served) = &self.served {
            if query.port == served.asked && loopback_twins(served.address, asked_ip(&query)) {
                // `localhost` names both loopbacks where /etc/hosts says so (Debian's
                // does), and Fastify listens at every address of its host, `localhost`
                // by default: the second is the same server to drover, which reaches
                // the worker at its loopback port and serves clients at both.
                tracing::debug!(
                    port = query.port,
                    "the app also listens at the other loopback"
                );
                return self.send(message::listening_without_socket(&query)).await;
            }
        }
        if self.served.is_some() || not_the_apps {
            let Ok(port) = u16::try_from(query.port) else {
                let reason = format!("listen() on port {}: not a port", query.port);
                return self.refuse(&query, UV_EINVAL, reason, report).await;
            };
            let place = Place::Port {
                address: asked_ip(&query),
                port,
            };
            return self.also_serve(query, place, report).await;
        }
        if query.port == i64::from(self.port) {
            // The app reads PORT: it gets a socket bound there, as its own bind would
            // give it, and accepts from the kernel with nothing of drover in between.
            // Connections can still be handed to it (`newconn` names this server too).
            // drover reaches the worker at 127.0.0.1:PORT, and nothing else should: the
            // port is the worker's, private, and clients come through drover's listen
            // address. So an app that names any address (`listen(PORT)`, `0.0.0.0`,
            // `::`) or the IPv6 loopback (`localhost` resolves to ::1 first on Debian)
            // is served at the IPv4 loopback. Bound as asked, every worker's port was
            // open to the network past drover (a Next.js app under `drover run -l`),
            // and at ::1 drover would never reach it.
            let at = match asked_ip(&query) {
                Some(ip) if !ip.is_unspecified() && !ip.is_loopback() => query.clone(),
                _ => ServerQuery {
                    address: Some(Ipv4Addr::LOCALHOST.to_string()),
                    address_type: AddressType::Tcp4,
                    ..query.clone()
                },
            };
            let socket = match bind_for(&at) {
                Ok(socket) => socket,
                Err(e) => {
                    let reason = format!("bind {}: {e}", describe(&at));
                    return self.refuse(&query, errno_of(&e), reason, report).await;
                }
            };
            self.served = Some(Served {
                key: query.key.clone(),
                asked: query.port,
                address: asked_ip(&at),
                listener: None,
            });
            report(SessionEvent::Serving {
                asked: query.port,
                address: asked_ip(&query),
                port: self.port,
                speaks: query.speaks,
                unix: false,
                keeps_sessions: query.keeps_sessions,
            });
            let body = message::answer(&query, 0);
            let line = message::with_handle(self.next(body));
            return Ok(self.channel.send_with(&line, socket.as_fd()).await?);
        }
        // Any other port: the worker cannot have it (every worker asks for the same
        // one), so it is told "listening there" and given each connection that arrives
        // at its PORT, where drover accepts them.
        if let Err(reason) = self.serve_at_loopback(&query, false, report) {
            return self.refuse(&query, UV_EADDRINUSE, reason, report).await;
        }
        let body = message::listening_without_socket(&query);
        self.send(body).await
    }

    /// drover accepts the connections of the app's first server at the worker's PORT
    /// (its balancer's and health checks') and hands them over; `Err`: why it cannot.
    fn serve_at_loopback(
        &mut self,
        query: &ServerQuery,
        unix: bool,
        report: &mut impl FnMut(SessionEvent),
    ) -> Result<(), String> {
        let listener = loopback_listener(self.port)
            .map_err(|e| format!("drover could not listen on 127.0.0.1:{}: {e}", self.port))?;
        self.served = Some(Served {
            key: query.key.clone(),
            asked: query.port,
            address: asked_ip(query),
            listener: Some(listener),
        });
        report(SessionEvent::Serving {
            asked: query.port,
            address: asked_ip(query),
            port: self.port,
            speaks: query.speaks,
            unix,
            keeps_sessions: query.keeps_sessions,
        });
        Ok(())
    }

    /// A Unix socket (`listen('/run/app.sock')`): bound once for the app and shared by
    /// its workers, as Node's primary shares it. As the worker's first server it is
    /// also served at the worker's PORT, as a fixed port is, so that drover's health
    /// checks reach it, and its balancer where the user gives one an address (`-l`).
    async fn serve_unix(
        &mut self,
        query: ServerQuery,
        path: PathBuf,
        report: &mut impl FnMut(SessionEvent),
    ) -> Result<(), ChannelError> {
        let place = Place::Path(path);
        // With `app_port` named, the app's server is on that port.
        if self.served.is_some() || self.app_port.is_some() {
            return self.also_serve(query, place, report).await;
        }
        // The path first: where drover cannot bind it, the worker serves nowhere, and no
        // first listen is noted.
        let bound = match self.join_shared(&query, place.clone()) {
            Ok(joined) => joined == Joined::Bound,
            Err(e) => {
                let reason = self.not_shared(&query, &place, &e);
                return self.refuse(&query, errno_of(&e), reason, report).await;
            }
        };
        if let Err(reason) = self.serve_at_loopback(&query, true, report) {
            self.also.retain(|a| a.place != place);
            self.shared_ports.leave(&place, self.id);
            return self.refuse(&query, UV_EADDRINUSE, reason, report).await;
        }
        report(SessionEvent::AlsoServing { place, bound });
        self.send(message::listening_without_socket(&query)).await
    }

    /// A port after the first: bound once for the app and shared by its workers.
    async fn also_serve(
        &mut self,
        query: ServerQuery,
        place: Place,
        report: &mut impl FnMut(SessionEvent),
    ) -> Result<(), ChannelError> {
        match self.join_shared(&query, place.clone()) {
            Ok(joined) => {
                report(SessionEvent::AlsoServing {
                    place,
                    bound: joined == Joined::Bound,
                });
                self.send(message::listening_without_socket(&query)).await
            }
            Err(e) => {
                let reason = self.not_shared(&query, &place, &e);
                self.refuse(&query, errno_of(&e), reason, report).await
            }
        }
    }

    /// Why `place` could not be shared: the reason the app's `listen()` gets an error.
    fn not_shared(&self, query: &ServerQuery, place: &Place, e: &io::Error) -> String {
        let (asked, what) = match place {
            Place::Path(path) => (format!("listen({})", path.display()), "a Unix socket"),
            Place::Port { .. } => (format!("listen() on {}", describe(query)), "such a port"),
        };
        let after = match &self.served {
            Some(first) if first.asked > 0 => format!(" after port {}", first.asked),
            Some(_) => " after its first server".to_string(),
            None => String::new(),
        };
        format!(
            "{asked}{after}: drover binds {what} once, for all of the app's workers to share, \
             and could not: {e}"
        )
    }

    /// The worker's server `query` takes `place`'s connections from now on, with the
    /// app's other workers there.
    fn join_shared(&mut self, query: &ServerQuery, place: Place) -> io::Result<Joined> {
        let taker = Taker {
            session: self.id,
            to: self.to_me.clone(),
            pending: Arc::clone(&self.shared_pending),
        };
        let joined = self.shared_ports.join(place.clone(), taker)?;
        self.inbox.shares.store(true, Relaxed);
        self.also.retain(|a| a.place != place);
        self.also.push(AlsoServed {
            place,
            key: query.key.clone(),
        });
        Ok(joined)
    }

    async fn refuse(
        &mut self,
        query: &ServerQuery,
        errno: i32,
        reason: String,
        report: &mut impl FnMut(SessionEvent),
    ) -> Result<(), ChannelError> {
        report(SessionEvent::Refused { reason });
        self.send(message::answer(query, errno)).await
    }

    /// A connection waits for the worker; without a server (closed meanwhile) it is
    /// closed, as a closed port would refuse it.
    fn push(&mut self, waiting: Waiting) {
        match waiting.shared {
            None if self.served.is_some() => self.waiting.push_back(waiting),
            None => self.taken(&waiting),
            Some(ref place)
                if self.disconnect == Ask::Unasked
                    && self.also.iter().any(|a| a.place == *place) =>
            {
                self.waiting.push_back(waiting)
            }
            // Closed here meanwhile, or the worker retires: another worker of the app
            // may serve it.
            Some(place) => self.shared_ports.deliver(place, waiting.socket),
        }
    }

    /// A connection the worker refused: a shared port's goes to another worker that
    /// listens there, one the balancer handed over back to it (as when a worker is
    /// gone); the balancer's own connection to the worker closes, and it retries.
    fn elsewhere(&self, refused: Waiting, report: &mut impl FnMut(SessionEvent)) {
        if let Some(place) = refused.shared {
            self.shared_ports.deliver(place, refused.socket);
        } else if refused.given {
            let _ = self
                .inbox
                .clients
                .fetch_update(Relaxed, Relaxed, |n| n.checked_sub(1));
            report(SessionEvent::Returned(TcpStream::from(refused.socket)));
        }
    }

    /// `waiting` left the queue (taken up by the worker, or dropped).
    fn taken(&self, waiting: &Waiting) {
        if waiting.given {
            self.inbox.note_progress();
            self.inbox.queued.fetch_sub(1, Relaxed);
        }
    }

    async fn hand_over(&mut self, socket: Waiting) -> Result<(), ChannelError> {
        let key = match &socket.shared {
            None => self.served.as_ref().map(|s| s.key.clone()),
            Some(place) => self
                .also
                .iter()
                .find(|a| a.place == *place)
                .map(|a| a.key.clone()),
        };
        let Some(key) = key else {
            self.taken(&socket);
            if let Some(place) = socket.shared {
                self.shared_ports.deliver(place, socket.socket);
            }
            return Ok(());
        };
        let body = message::new_connection(&key);
        let message = message::with_handle(self.next(body));
        if let Err(e) = self
            .channel
            .send_with(&message, socket.socket.as_fd())
            .await
        {
            // The worker is gone (killed a moment before drover read the end of its
            // channel): the connection waits again, and `run` sends it where those the
            // worker never took up go.
            self.waiting.push_front(socket);
            return Err(e.into());
        }
        if socket.shared.is_some() {
            self.shared_handed_at = Some(Instant::now());
        }
        self.in_flight.push_back(InFlight {
            seq: self.seq,
            message,
            socket,
            resends: 0,
        });
        Ok(())
    }

    async fn resend(&mut self) -> Result<(), ChannelError> {
        let Some(mut in_flight) = self.in_flight.pop_front() else {
            return Ok(());
        };
        if in_flight.resends == MAX_RESENDS {
            tracing::warn!(
                "a connection did not reach its Node worker after {MAX_RESENDS} tries; closed"
            );
            self.taken(&in_flight.socket);
            return Ok(());
        }
        in_flight.resends += 1;
        let sent = self
            .channel
            .send_with(&in_flight.message, in_flight.socket.socket.as_fd())
            .await;
        // Kept either way: one not sent goes where those never taken up go (`run`).
        self.in_flight.push_back(in_flight);
        sent?;
        Ok(())
    }

    fn next(&mut self, body: serde_json::Map<String, Value>) -> Value {
        self.seq += 1;
        message::cluster(self.seq, body)
    }

    async fn send(&mut self, body: serde_json::Map<String, Value>) -> Result<(), ChannelError> {
        let message = self.next(body);
        Ok(self.channel.send(&message).await?)
    }
}

/// A descriptor a worker gave back, checked to be a connected TCP socket before drover
/// serves it as a client connection.
fn client_connection(fd: std::os::fd::OwnedFd) -> io::Result<TcpStream> {
    let socket = Socket::from(fd);
    if socket.r#type()? != Type::STREAM {
        return Err(io::Error::other("not a stream socket"));
    }
    match socket.local_addr()?.as_socket() {
        Some(_) => {}
        None => return Err(io::Error::other("not an IP socket")),
    }
    socket.peer_addr()?;
    socket.set_nonblocking(true)?;
    Ok(TcpStream::from(socket))
}

/// The next connection for `served`; never ready while the app has no server.
async fn accept(served: Option<&Served>) -> io::Result<Socket> {
    let Some(served) = served else {
        return std::future::pending().await;
    };
    let Some(listener) = &served.listener else {
        return std::future::pending().await;
    };
    let (socket, _) = listener.accept().await?;
    // The socket only passes through drover: out of the reactor, as a plain descriptor.
    Ok(Socket::from(socket.into_std()?))
}

/// drover's listener on the worker's loopback port, where its balancer and health
/// checks connect.
fn loopback_listener(port: u16) -> io::Result<tokio::net::TcpListener> {
    let socket = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP))?;
    // The previous worker on this port may have left connections in TIME_WAIT.
    socket.set_reuse_address(true)?;
    socket.bind(&SocketAddr::from((Ipv4Addr::LOCALHOST, port)).into())?;
    // Node's default backlog.
    socket.listen(511)?;
    socket.set_nonblocking(true)?;
    tokio::net::TcpListener::from_std(TcpListener::from(socket))
}

/// A socket bound as the worker asked (not listening: the worker's `listen()` does that,
/// as with a socket from Node's own primary).
fn bind_for(query: &ServerQuery) -> io::Result<Socket> {
    let udp = matches!(query.address_type, AddressType::Udp4 | AddressType::Udp6);
    let ipv6 = matches!(query.address_type, AddressType::Tcp6 | AddressType::Udp6);
    let ip = match query.address.as_deref().map(str::parse::<IpAddr>) {
        Some(Ok(ip)) => ip,
        Some(Err(_)) => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not an IP address",
            ))
        }
        None if ipv6 => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
        None => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
    };
    let port = u16::try_from(query.port)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "port out of range"))?;
    let addr = SocketAddr::new(ip, port);
    let (kind, protocol) = if udp {
        (Type::DGRAM, Protocol::UDP)
    } else {
        (Type::STREAM, Protocol::TCP)
    };
    let socket = Socket::new(Domain::for_address(addr), kind, Some(protocol))?;
    socket.set_reuse_address(true)?;
    if udp && port != 0 {
        // Every worker binds the same port, as they share one socket under Node's
        // primary; the kernel spreads the datagrams.
        SockRef::from(&socket).set_reuse_port(true)?;
    }
    socket.bind(&addr.into())?;
    // As libuv makes its own: a worker's libuv takes a received socket as it is, and
    // its accept loop runs until EAGAIN, which a blocking socket never returns (Node 18
    // then hangs in accept after the first connection).
    socket.set_nonblocking(true)?;
    Ok(socket)
}

/// The address the app named, as an IP (Node looks a host name up before it asks);
/// `None` for any address, or for one that is not an IP.
fn asked_ip(query: &ServerQuery) -> Option<IpAddr> {
    query.address.as_deref().and_then(|a| a.parse().ok())
}

/// Whether two addresses a worker listened at on one port are both loopback, as
/// `localhost`'s two are. Either may be the one drover bound in place of the other
/// (the app asked for `::1` on its `PORT`), so Fastify, which listens next at each
/// address of `localhost` but the one its server reports, may ask for the same again.
fn loopback_twins(first: Option<IpAddr>, second: Option<IpAddr>) -> bool {
    first.is_some_and(|a| a.is_loopback()) && second.is_some_and(|b| b.is_loopback())
}

/// Where a Unix socket `listen()` asks to be: an absolute path, as Node's cluster module
/// sends it (`path.resolve` in the worker, which also makes a Linux abstract name, a
/// leading NUL, a path in the worker's directory, under Node's primary as here).
fn unix_path(query: &ServerQuery) -> Option<PathBuf> {
    Some(PathBuf::from(query.address.as_deref()?)).filter(|p| p.is_absolute())
}

fn describe(query: &ServerQuery) -> String {
    format!(
        "{}:{}",
        query.address.as_deref().unwrap_or("(any)"),
        query.port
    )
}

fn errno_of(e: &io::Error) -> i32 {
    e.raw_os_error().map_or(UV_EADDRINUSE, |n| -n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags, UnixAddr};
    use std::io::{BufRead, BufReader, IoSlice, Read, Write};
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixStream as StdUnix;

    #[test]
    fn a_unix_socket_is_where_nodes_cluster_module_resolved_it() {
        let query = |address: &str| ServerQuery {
            seq: 1,
            address: Some(address.to_string()),
            port: -1,
            address_type: AddressType::Pipe,
            key: String::new(),
            data: Value::Null,
            speaks: crate::Speaks::Http,
            probe: false,
            keeps_sessions: false,
        };
        let at = |address| unix_path(&query(address));
        assert_eq!(at("/run/app.sock"), Some("/run/app.sock".into()));
        assert_eq!(at("app.sock"), None);
    }

    /// The worker's end: sends a line with `fd` alongside, as Node does.
    fn send_with(worker: &StdUnix, line: &str, fd: Option<std::os::fd::RawFd>) {
        let fds = fd.map(|fd| [fd]);
        let rights = fds.as_ref().map(|fds| [ControlMessage::ScmRights(fds)]);
        let cmsgs: &[ControlMessage] = rights.as_ref().map_or(&[], |r| r);
        let data = format!("{line}\n");
        sendmsg::<UnixAddr>(
            worker.as_raw_fd(),
            &[IoSlice::new(data.as_bytes())],
            cmsgs,
            MsgFlags::empty(),
            None,
        )
        .unwrap();
    }

    fn next_line(reader: &mut BufReader<StdUnix>) -> Value {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        serde_json::from_str(&line).unwrap()
    }

    /// A session on one end of a socketpair, run in a task; the test is the worker on
    /// the other end. Connections it gives back arrive on `events`.
    struct Started {
        worker: StdUnix,
        /// The worker's end of the channel again, for reading what drover sends it.
        reader: BufReader<StdUnix>,
        inbox: Inbox,
        events: mpsc::UnboundedReceiver<TcpStream>,
        task: tokio::task::JoinHandle<Result<Ended, ChannelError>>,
    }

    fn start() -> Started {
        let (ours, worker) = StdUnix::pair().unwrap();
        let session = Session::new(ours, 1, SharedPorts::new(), Relay::default()).unwrap();
        let inbox = session.inbox();
        let (events_tx, events) = mpsc::unbounded_channel();
        let task = tokio::spawn(session.run(move |e| {
            if let SessionEvent::Returned(stream) = e {
                events_tx.send(stream).unwrap();
            }
        }));
        Started {
            reader: BufReader::new(worker.try_clone().unwrap()),
            worker,
            inbox,
            events,
            task,
        }
    }

    /// A connected TCP pair: the client's end and the server's.
    fn tcp_pair() -> (TcpStream, TcpStream) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server_side, _) = listener.accept().unwrap();
        (client, server_side)
    }

    /// The app listens on 3000: drover serves it at its port and hands connections over.
    fn listens_on_3000(worker: &StdUnix, reader: &mut BufReader<StdUnix>) {
        send_with(
            worker,
            r#"{"cmd":"NODE_CLUSTER","act":"queryServer","index":0,"data":null,"address":null,"port":3000,"addressType":4,"backlog":511,"seq":1}"#,
            None,
        );
        assert_eq!(next_line(reader)["errno"], 0);
    }

    const RETURNED: &str =
        r#"{"cmd":"NODE_HANDLE","type":"net.Native","msg":{"cmd":"NODE_DROVER","act":"return"}}"#;

    // Multi-threaded: the test plays the worker with blocking reads.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn connections_come_back_only_when_asked_and_only_tcp_ones() {
        let Started {
            worker,
            mut reader,
            inbox,
            mut events,
            task,
        } = start();
        let (client, server_side) = tcp_pair();

        assert!(!inbox.can_give_back());
        assert_eq!(inbox.app_pid(), None);
        send_with(
            &worker,
            r#"{"cmd":"NODE_DROVER","act":"ready","pid":4242}"#,
            None,
        );
        // Unasked, a connection is not taken: closed, and acked so Node sends on.
        send_with(&worker, RETURNED, Some(server_side.as_raw_fd()));
        assert_eq!(next_line(&mut reader)["cmd"], "NODE_HANDLE_ACK");
        assert!(inbox.can_give_back());
        assert_eq!(
            inbox.app_pid(),
            Some(4242),
            "the process the preload runs in"
        );

        inbox.give_back_connections();
        assert_eq!(
            next_line(&mut reader),
            serde_json::json!({"cmd": "NODE_DROVER", "act": "return"})
        );
        // Not a TCP socket: refused, acked.
        let (pipe_r, _pipe_w) = nix::unistd::pipe().unwrap();
        send_with(&worker, RETURNED, Some(pipe_r.as_raw_fd()));
        assert_eq!(next_line(&mut reader)["cmd"], "NODE_HANDLE_ACK");
        // The app's own handle to its primary is not drover's to serve.
        let other = r#"{"cmd":"NODE_HANDLE","type":"net.Socket","msg":{"hi":1}}"#;
        send_with(&worker, other, Some(server_side.as_raw_fd()));
        assert_eq!(next_line(&mut reader)["cmd"], "NODE_HANDLE_ACK");
        // A line that claims a handle and carries none takes no later one's.
        send_with(&worker, RETURNED, None);
        assert_eq!(next_line(&mut reader)["cmd"], "NODE_HANDLE_ACK");
        send_with(&worker, RETURNED, Some(server_side.as_raw_fd()));
        assert_eq!(next_line(&mut reader)["cmd"], "NODE_HANDLE_ACK");
        drop(server_side);
        let mut returned = events.recv().await.unwrap();
        assert!(events.try_recv().is_err(), "only the asked-for TCP one");
        // It is the client's connection: what one end writes, the other reads.
        (&client).write_all(b"ping").unwrap();
        let mut got = [0u8; 4];
        returned.set_nonblocking(false).unwrap();
        returned.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"ping");

        assert!(!inbox.all_given_back());
        send_with(&worker, r#"{"cmd":"NODE_DROVER","act":"returned"}"#, None);
        drop(reader);
        drop(worker);
        task.await.unwrap().unwrap();
        assert!(inbox.all_given_back());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn connections_the_worker_never_took_up_go_back_when_it_dies() {
        let Started {
            worker,
            mut reader,
            inbox,
            mut events,
            task,
        } = start();
        listens_on_3000(&worker, &mut reader);
        let (_client, server_side) = tcp_pair();
        inbox.give(server_side).unwrap();
        // Sent (a newconn with the socket), never acknowledged: then the worker dies.
        assert_eq!(next_line(&mut reader)["msg"]["act"], "newconn");
        drop(reader);
        drop(worker);
        task.await.unwrap().unwrap();
        assert!(events.recv().await.is_some(), "the connection came back");
        assert_eq!(inbox.queued(), 0);
    }

    /// A worker killed a moment before (drover has not read the end of its channel yet)
    /// cannot be sent a connection: the send fails, and the connection is not lost with
    /// it. It goes back, as one the worker never took up.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_connection_that_could_not_be_sent_to_the_worker_goes_back() {
        let Started {
            worker,
            mut reader,
            inbox,
            mut events,
            task,
        } = start();
        listens_on_3000(&worker, &mut reader);
        // Nothing sent to the worker arrives from now on; its end is still open.
        worker.shutdown(std::net::Shutdown::Read).unwrap();
        let (client, server_side) = tcp_pair();
        inbox.give(server_side).unwrap();
        let ended = task.await.unwrap();
        assert!(ended.is_err(), "the send failed: {ended:?}");
        let mut returned = events.recv().await.expect("the connection came back");
        (&client).write_all(b"ping").unwrap();
        let mut got = [0u8; 4];
        returned.set_nonblocking(false).unwrap();
        returned.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"ping");
        assert_eq!(inbox.queued(), 0);
        drop(worker);
    }
}
