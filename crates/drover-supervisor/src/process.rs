//! One worker process: a free port, spawning, and stopping it with everything it
//! started (SIGTERM to its process group, then SIGKILL).
//!
//! Each worker leads a process group of its own, so whatever it starts (a shell
//! wrapper's server, a cluster-mode app's children, a grandchild that keeps the port)
//! shares its group, and drover stops the whole group, never the worker alone: a
//! survivor would keep the port and CPU. The group is also stopped when the worker
//! exits by itself, before its replacement starts.
//!
//! Workers die with drover: through the explicit stop on shutdown, `Drop` (SIGKILL to
//! the group, when a task holding a worker is dropped), and, when drover itself is
//! killed with SIGKILL (nothing of drover runs then), through the kernel, armed in each
//! worker before it execs (`die_with_drover`): Linux's parent-death signal for the
//! worker, and for what it started (the app below `sh -c` or `npm start`, which keeps
//! drover's shared listening socket) the worker's lifeline, a pipe whose only writer
//! is drover.
//!
//! Being in its own group, a worker does not get the terminal's Ctrl-C: SIGINT reaches
//! drover alone, which drains the balancers and then stops the workers' groups.

use crate::spec::{command_with_port, AppSpec, PortRange};
use command_fds::{CommandFdExt, FdMapping};
use nix::errno::Errno;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use socket2::{Domain, Protocol, Socket, Type};
use std::collections::BTreeSet;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::ops::RangeInclusive;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;
use tokio::process::{Child, Command};
use tokio::time::Instant;

/// Ports handed to live workers of every app in this process. The kernel only promises
/// that a port is free while we hold the listener; after we drop it, a second pick could
/// return the same port before the first worker binds it. Remembering our own picks rules
/// that out among drover's workers (other programs can still race us, rarely).
static RESERVED: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());

/// A loopback port picked for one worker, released when dropped.
///
/// Until `release_hold`, a socket bound to it with `SO_REUSEADDR` (never listening)
/// keeps it: the kernel then gives it to no other `bind(0)` and no outgoing
/// connection, while a bind with `SO_REUSEADDR` (drover's own listener for a Node
/// worker, libuv's, most servers') still succeeds and may listen. A Node worker's port
/// is bound only when its app calls `listen()`, seconds after the pick under a
/// TypeScript runner: without the hold, another program took it in that gap (CI saw
/// `EADDRINUSE` there).
#[derive(Debug)]
pub(crate) struct Port {
    port: u16,
    hold: Option<Socket>,
}

impl Port {
    /// A port for a worker: from `asked` (the user's `worker_ports`) when given, and
    /// none when every one of them is taken; else from `WORKER_PORTS`.
    pub(crate) fn pick(asked: Option<PortRange>) -> io::Result<Port> {
        if let Some(range) = asked {
            // Every port of it, from a random one on: a user's range is small, and
            // may be nearly full (one worker's port each, and a reload's).
            let start = fastrand::u16(range.low..=range.high);
            let ports = (start..=range.high).chain(range.low..start);
            for port in ports {
                if let Some(port) = Port::try_hold(port)? {
                    return Ok(port);
                }
            }
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!(
                    "no free port in worker_ports {range}: each is drover's (a worker's, \
                     or a reload's replacement's) or another program's"
                ),
            ));
        }
        match worker_ports() {
            Some(range) => Port::pick_in(range),
            None => Port::pick_ephemeral(),
        }
    }

    /// A random free port of `range` (outside the kernel's ephemeral range).
    fn pick_in(range: RangeInclusive<u16>) -> io::Result<Port> {
        for _ in 0..64 {
            if let Some(port) = Port::try_hold(fastrand::u16(range.clone()))? {
                return Ok(port);
            }
        }
        // A range crowded with other listeners: the kernel's pick still works.
        Port::pick_ephemeral()
    }

    /// `port`, held, when no socket is bound there: it is first bound without
    /// `SO_REUSEADDR`, which fails on any socket bound there (another drover's hold, a
    /// listener, a connection in `TIME_WAIT`), and marked reusable after, so the
    /// worker's own bind succeeds. `None` when it is taken (or one of ours).
    fn try_hold(port: u16) -> io::Result<Option<Port>> {
        if reserved().contains(&port) {
            return Ok(None);
        }
        let hold = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP))?;
        match hold.bind(&SocketAddr::from((Ipv4Addr::LOCALHOST, port)).into()) {
            Ok(()) => {}
            Err(e) if matches!(e.raw_os_error(), Some(libc::EADDRINUSE | libc::EACCES)) => {
                return Ok(None)
            }
            Err(e) => return Err(e),
        }
        hold.set_reuse_address(true)?;
        Ok(reserved().insert(port).then_some(Port {
            port,
            hold: Some(hold),
        }))
    }

    /// A port the kernel picks (`bind(0)`), from its ephemeral range.
    fn pick_ephemeral() -> io::Result<Port> {
        // A handful of tries: the kernel hands out ports in a wide range, so a repeat of
        // one of ours (released, its worker not yet bound) is rare, two in a row rarer.
        for _ in 0..16 {
            let hold = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP))?;
            hold.set_reuse_address(true)?;
            hold.bind(&SocketAddr::from((Ipv4Addr::LOCALHOST, 0)).into())?;
            let port = hold
                .local_addr()?
                .as_socket()
                .map(|addr| addr.port())
                .ok_or_else(|| io::Error::other("a TCP socket without an IP address"))?;
            if reserved().insert(port) {
                return Ok(Port {
                    port,
                    hold: Some(hold),
                });
            }
        }
        Err(io::Error::new(
            io::ErrorKind::AddrInUse,
            "no free loopback port",
        ))
    }

    /// Lets other sockets bind the port: for a program that binds it itself, which may
    /// not set `SO_REUSEADDR` (Python's plain `socketserver.TCPServer` does not).
    pub(crate) fn release_hold(&mut self) {
        self.hold = None;
    }

    pub(crate) fn get(&self) -> u16 {
        self.port
    }

    pub(crate) fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }
}

impl Drop for Port {
    fn drop(&mut self) {
        reserved().remove(&self.port);
    }
}

/// Where workers' ports come from: Nomad's dynamic port range, below Linux's default
/// ephemeral range (32768-60999). A port the kernel picks (`bind(0)`) is one that
/// every outgoing connection and every other program's `bind(0)` on the machine may
/// take as well, and a program that binds its port itself gets it only after drover
/// lets go of it (`Port::release_hold`): in that gap a test's other listener once took
/// a worker's port, and drover's readiness probe found that listener instead. Outside
/// the ephemeral range, only a program that names the port can take it.
const WORKER_PORTS: RangeInclusive<u16> = 20000..=32000;

/// `WORKER_PORTS`, less the machine's ephemeral range (`ip_local_port_range`), when
/// at least `MIN_WORKER_PORTS` are left: else `None`, and the kernel picks.
fn worker_ports() -> Option<RangeInclusive<u16>> {
    static RANGE: OnceLock<Option<RangeInclusive<u16>>> = OnceLock::new();
    RANGE
        .get_or_init(|| {
            let ephemeral = ephemeral_ports().unwrap_or(32768..=60999);
            ports_outside(&WORKER_PORTS, &ephemeral)
        })
        .clone()
}

/// Fewer free ports than this, and two drovers' picks would meet too often.
const MIN_WORKER_PORTS: u16 = 1000;

/// The larger part of `ours` outside `theirs`, if it has `MIN_WORKER_PORTS`.
fn ports_outside(
    ours: &RangeInclusive<u16>,
    theirs: &RangeInclusive<u16>,
) -> Option<RangeInclusive<u16>> {
    let below = *ours.start()..=(*ours.end()).min(theirs.start().saturating_sub(1));
    let above = (*ours.start()).max(theirs.end().saturating_add(1))..=*ours.end();
    let size = |r: &RangeInclusive<u16>| r.end().saturating_sub(*r.start());
    [below, above]
        .into_iter()
        .filter(|r| r.start() <= r.end() && size(r) >= MIN_WORKER_PORTS)
        .max_by_key(size)
}

/// The machine's ephemeral range, where `bind(0)` and outgoing connections take ports.
fn ephemeral_ports() -> Option<RangeInclusive<u16>> {
    let text = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    parse_port_range(&text)
}

/// `ip_local_port_range`: "LOW HIGH".
fn parse_port_range(text: &str) -> Option<RangeInclusive<u16>> {
    let mut words = text.split_whitespace().map(str::parse::<u16>);
    match (words.next(), words.next()) {
        (Some(Ok(low)), Some(Ok(high))) if low <= high => Some(low..=high),
        _ => None,
    }
}

fn reserved() -> std::sync::MutexGuard<'static, BTreeSet<u16>> {
    RESERVED.lock().unwrap_or_else(|e| e.into_inner())
}

/// The worker's descriptor for the Node cluster channel. 3, as the first free one:
/// shared mode's socket takes 3 too (`SHARED_SOCKET_FD`), and shared mode has no channel.
const NODE_CHANNEL_FD: i32 = 3;

/// Where a shared-mode worker finds its listening socket, as under systemd's socket
/// activation (`LISTEN_FDS=1`: the first descriptor after stdio).
const SHARED_SOCKET_FD: i32 = 3;

/// The channel's descriptor below a script runner (`npm start`, `tsx app.ts`), which
/// must reach the app through the runner's own Node process (and a shell, for npm). Node marks its
/// descriptors close-on-exec at start-up (libuv's `uv_disable_stdio_inheritance`):
/// 0 to 15 always, then on up to the first one not open. Past a gap, 100 is left alone
/// and so inherited by what npm starts; 3 would not be.
const RUNNER_CHANNEL_FD: i32 = 100;

/// The worker's end of its lifeline (`die_with_drover`): past the gap as well, so a
/// Node runner does not close it on its app's exec either.
const LIFELINE_FD: i32 = 101;

/// drover's Node preload (drover-node's preload.cjs): it makes a script runner's app
/// (`npm start`, `tsx app.ts`) drover's cluster worker, and lets any Node worker give its client
/// connections back when drover retires it. Written into a directory private to its
/// user, and again whenever it is gone (a temp cleaner): every new Node worker loads
/// it, and a missing one would stop them all from starting.
fn node_preload() -> io::Result<PathBuf> {
    static WRITTEN: OnceLock<PathBuf> = OnceLock::new();
    // This drover's own version of it, over whatever an older drover left there; then
    // as long as it is there.
    if let Some(path) = WRITTEN.get().filter(|p| p.is_file()) {
        return Ok(path.clone());
    }
    let mut failed = Vec::new();
    for dir in preload_dirs() {
        match drover_node::write_preload(&dir) {
            Ok(path) => {
                let _ = WRITTEN.set(path.clone());
                return Ok(path);
            }
            Err(e) => failed.push(format!("{}: {e}", dir.display())),
        }
    }
    Err(io::Error::other(format!(
        "drover's Node preload could not be written ({}), so a Node worker cannot give its \
         connections back on a reload (those in flight fail) nor be served at the port its \
         listen() names; give drover a writable TMPDIR or XDG_RUNTIME_DIR",
        failed.join("; ")
    )))
}

/// Where the preload may go, in order: the user's runtime directory, the temporary
/// one, and `/dev/shm`, which a container whose root filesystem (and `/tmp`) is
/// read-only (Kubernetes' `readOnlyRootFilesystem`) still has writable. Before, such a
/// container's Node workers ran without the preload, and each reload failed requests.
fn preload_dirs() -> Vec<PathBuf> {
    let uid = nix::unistd::Uid::effective();
    let mut dirs = Vec::new();
    if let Some(runtime) = std::env::var_os("XDG_RUNTIME_DIR") {
        dirs.push(PathBuf::from(runtime).join("drover"));
    }
    dirs.push(std::env::temp_dir().join(format!("drover-{uid}")));
    dirs.push(PathBuf::from(format!("/dev/shm/drover-{uid}")));
    dirs
}

/// Where a new worker listens.
pub(crate) enum Listen<'a> {
    /// Its own loopback port, passed as `PORT`, and the Unix sockets drover holds for
    /// the app's workers to share (`drover_node::unix_sockets_env`).
    Port(u16, Vec<std::path::PathBuf>),
    /// The slot's listening socket (shared mode, see `steer`), passed as fd 3 the way
    /// systemd's socket activation does (`LISTEN_FDS=1`, `LISTEN_PID`,
    /// `LISTEN_FDNAMES`).
    Socket(&'a TcpListener),
    /// Nothing to serve (background mode): no `PORT`, no channel.
    Nothing,
}

/// The `NODE_OPTIONS` a worker of `spec` starts with before drover adds its preload: the
/// app's own, or drover's.
fn node_options(spec: &AppSpec) -> Option<String> {
    spec.env
        .get("NODE_OPTIONS")
        .cloned()
        .or_else(|| std::env::var("NODE_OPTIONS").ok())
}

/// Workers started with Node's inspector so far, in every app: each gets the port after
/// the last one's (`drover_node::with_inspector_port`).
static INSPECTORS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// Workers started with a cluster channel so far, in every app (any program gets one;
/// Node takes it up): a Node worker's `cluster.worker.id` is its number, from 1, as
/// Node's primary numbers each fork (the slot's 0 was falsy in `cluster.worker.id ||
/// ...`, and a restart kept its id). The worker's slot is `DROVER_WORKER_ID` (PM2's
/// `NODE_APP_INSTANCE`).
static CLUSTER_WORKERS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// PM2's name for a worker's number (`DROVER_WORKER_ID`).
const PM2_INSTANCE_VAR: &str = "NODE_APP_INSTANCE";

/// Spawns worker `id` of `spec`, with both output pipes captured, as the leader of a new
/// process group.
pub(crate) fn spawn(spec: &AppSpec, id: usize, listen: Listen<'_>) -> io::Result<Worker> {
    // Substituted at every spawn, so a restart or a reload (a fresh port each time)
    // gets its own port in the arguments too. Shared mode keeps the command as it is:
    // validation refuses a `{port}` there, as there is none to put.
    let command = match listen {
        Listen::Port(port, _) => command_with_port(&spec.command, port),
        Listen::Socket(_) | Listen::Nothing => spec.command.clone(),
    };
    // N workers of `node --inspect app.js` would all ask for one inspector port.
    let command = drover_node::with_inspector_port(&command, || {
        INSPECTORS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1
    })
    .unwrap_or(command);
    let (program, args) = command
        .split_first()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "empty command"))?;
    let mut node_channel = None;
    // What the worker inherits at fixed numbers (a channel, a socket, its lifeline).
    let mut fds = Vec::new();
    let mut cmd = match listen {
        Listen::Port(port, _) if drover_node::is_other_js_runtime(program) => {
            let mut cmd = Command::new(program);
            cmd.args(args)
                .env_remove("LISTEN_FDS")
                .env_remove("LISTEN_PID")
                .env_remove("LISTEN_FDNAMES")
                .envs(&spec.env)
                .env("PORT", port.to_string());
            cmd
        }
        Listen::Port(port, unix_sockets) => {
            let mut cmd = Command::new(program);
            cmd.args(args)
                // drover's own sockets, if systemd passed it any, are close-on-exec:
                // the worker must not think it was given them. (A shared-mode worker
                // gets its own below.)
                .env_remove("LISTEN_FDS")
                .env_remove("LISTEN_PID")
                .env_remove("LISTEN_FDNAMES")
                .envs(&spec.env);
            // A Node program becomes a cluster worker of drover's (drover-node): its
            // listen() on any port is served at PORT. Other programs ignore the channel.
            let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
            let existing = node_options(spec);
            let users_port = spec.users_port.then(|| {
                spec.env
                    .get("PORT")
                    .cloned()
                    .or_else(|| std::env::var("PORT").ok())
            });
            let cluster_id = CLUSTER_WORKERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
            let (env, channel_fd) = if spec.runs_app_below() {
                let preload = node_preload()?;
                let mut env = drover_node::runner_env(
                    cluster_id,
                    RUNNER_CHANNEL_FD,
                    &preload,
                    existing.as_deref(),
                );
                // What the runner starts may not be Node, and needs drover's PORT; the
                // preload gives the app's Node process the user's back.
                env.extend(drover_node::port_env(port, users_port.as_ref()));
                cmd.env("PORT", port.to_string());
                (env, RUNNER_CHANNEL_FD)
            } else {
                // Without the preload the worker runs as well; it just cannot give
                // its connections back on a reload (they close between requests).
                let preload = node_preload()
                    .map_err(|e| tracing::warn!("{e}; Node workers start without it"))
                    .ok();
                let mut env = drover_node::channel_env(
                    cluster_id,
                    NODE_CHANNEL_FD,
                    preload.as_deref(),
                    existing.as_deref(),
                );
                // The user's PORT stays as it is (and `node --env-file`'s can still set
                // it) for a Node app whose listen() says where clients connect; any
                // other program listens on drover's. Without the preload nothing would
                // give a `listen(process.env.PORT)` drover's port.
                let node = spec.runs_in_node() && preload.is_some();
                let users_port = users_port.filter(|_| node);
                env.extend(drover_node::port_env(port, users_port.as_ref()));
                if users_port.is_none() {
                    cmd.env("PORT", port.to_string());
                }
                (env, NODE_CHANNEL_FD)
            };
            cmd.envs(env)
                .envs(drover_node::unix_sockets_env(&unix_sockets))
                .envs(drover_node::head_limit_env(spec.head_limit))
                .envs(drover_node::app_port_env(spec.app_port));
            fds.push(FdMapping {
                parent_fd: theirs.into(),
                child_fd: channel_fd,
            });
            node_channel = Some(ours);
            cmd
        }
        Listen::Nothing => {
            let mut cmd = Command::new(program);
            cmd.args(args)
                .env_remove("LISTEN_FDS")
                .env_remove("LISTEN_PID")
                .env_remove("LISTEN_FDNAMES")
                .envs(&spec.env);
            // No channel, but the preload still lets drover's SIGTERM reach an app that
            // stops on SIGINT only (PM2's signal).
            if spec.runs_in_node() {
                match node_preload() {
                    Ok(preload) => {
                        cmd.envs(drover_node::preload_env(
                            &preload,
                            node_options(spec).as_deref(),
                        ));
                    }
                    Err(e) => tracing::warn!("{e}; Node workers start without it"),
                }
            }
            cmd
        }
        Listen::Socket(socket) => {
            // LISTEN_PID must be the worker's own pid, which is only known after the
            // fork. A shell sets it to its `$$` and execs the program, which keeps that
            // pid; the alternative, setting it between fork and exec, needs unsafe code.
            let mut cmd = Command::new("/bin/sh");
            cmd.arg("-c")
                .arg(r#"LISTEN_PID=$$; export LISTEN_PID; exec "$@""#)
                .arg(program)
                .arg(program)
                .args(args)
                .envs(&spec.env)
                .env("LISTEN_FDS", "1")
                .env("LISTEN_FDNAMES", "http")
                .env_remove("PORT");
            fds.push(FdMapping {
                parent_fd: socket.try_clone()?.into(),
                child_fd: SHARED_SOCKET_FD,
            });
            // A Node app serves the socket from its first listen(), whatever port that
            // names (drover-node's preload): it runs as written. Below a script runner
            // the socket goes past the runner as the channel does in the other modes.
            if spec.runs_in_node() {
                match node_preload() {
                    Ok(preload) => {
                        let below = spec.runs_app_below();
                        let app_fd = if below {
                            RUNNER_CHANNEL_FD
                        } else {
                            SHARED_SOCKET_FD
                        };
                        if below {
                            fds.push(FdMapping {
                                parent_fd: socket.try_clone()?.into(),
                                child_fd: RUNNER_CHANNEL_FD,
                            });
                        }
                        cmd.envs(drover_node::shared_socket_env(
                            app_fd,
                            &preload,
                            node_options(spec).as_deref(),
                        ));
                    }
                    Err(e) => tracing::warn!("{e}; Node workers start without it"),
                }
            }
            cmd
        }
    };
    cmd.env("DROVER_WORKER_ID", id.to_string())
        .env("DROVER_APP", &spec.name);
    // PM2 numbers an app's instances the same way (0..N-1, the same number again after
    // a restart or a reload) in NODE_APP_INSTANCE, and apps written for it read that:
    // only instance 0 runs the scheduled jobs, say. Unset, such an app runs them in no
    // worker or in every one. A value the app's own `env` gives wins.
    if !spec.env.contains_key(PM2_INSTANCE_VAR) {
        cmd.env(PM2_INSTANCE_VAR, id.to_string());
    }
    // PM2's `instance_var`: the same number under the name the app reads.
    if let Some(var) = spec.instance_var.as_deref() {
        if !spec.env.contains_key(var) {
            cmd.env(var, id.to_string());
        }
    }
    // PM2's `increment_var` (`validate` keeps it off drover's own PORT).
    if let Some((var, value)) = spec.incremented(id) {
        cmd.env(var, value);
    }
    cmd
        // systemd's channel to drover (`Type=notify`, the watchdog) is drover's alone: a
        // worker that speaks the protocol too would report readiness, or pet the
        // watchdog, for a drover that may be hung.
        .env_remove("NOTIFY_SOCKET")
        .env_remove("WATCHDOG_USEC")
        .env_remove("WATCHDOG_PID")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // If the task holding the child is dropped (runtime shutdown, panic), the child
        // gets SIGKILL instead of outliving drover (`Worker`'s drop does the group).
        .kill_on_drop(true)
        // Its own group, led by it (pgid = its pid): see the module comment.
        .process_group(0);
    if let Some(dir) = &spec.cwd {
        cmd.current_dir(dir);
    }
    // The worker reads, drover writes (never: only its end closing counts).
    let (worker_end, lifeline) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    fds.push(FdMapping {
        parent_fd: worker_end,
        child_fd: LIFELINE_FD,
    });
    cmd.fd_mappings(fds)
        .map_err(|e| io::Error::other(e.to_string()))?;
    // After `fd_mappings`, whose hook (run first) puts the lifeline at its number.
    die_with_drover(&mut cmd);
    // Named before drover, as PID 1, could take it for an orphan to reap.
    let mut spawned = crate::orphans::spawned();
    let child = cmd.spawn()?;
    spawned.extend(child.id());
    drop(spawned);
    let group = child.id().map(|pid| Pid::from_raw(pid as i32));
    // `cmd`, and with it the worker's end of the channel, is dropped on return: the
    // worker then holds the only copy, so its exit is the channel's end.
    Ok(Worker {
        child,
        group,
        stopped: false,
        termed_at: None,
        node_channel,
        app: spec.name.clone(),
        id,
        late_hint: None,
        _lifeline: lifeline,
    })
}

/// Linux's fcntl(2) command naming the signal an async descriptor sends (in
/// <fcntl.h> since Linux 2.2; the libc crate leaves it out for glibc).
const F_SETSIG: libc::c_int = 10;

/// Makes the kernel SIGKILL the worker, and every process of its group, when drover
/// dies, however drover dies.
///
/// `unsafe`, for a need: "children die with drover" must hold even for `kill -9
/// drover` (an OOM kill, a crashed container init), which no code in drover survives
/// to handle; without this, every worker of a killed drover keeps its port and CPU
/// until someone finds it, and a shared-mode app below a shell or a runner keeps
/// drover's own listening address: the next drover cannot bind it.
///
/// Two signals, as each reaches what the other cannot:
/// - `PR_SET_PDEATHSIG` reaches the worker alone (a fork clears it).
/// - The lifeline reaches its whole group: the read end of a pipe whose only writer
///   is drover, at `LIFELINE_FD`, in async mode (`O_ASYNC`) with the group as owner
///   and SIGKILL as its signal (`F_SETSIG`). When drover is gone, so is the last
///   writer, and the kernel signals the owner (pipe_release's `kill_fasync`). drover
///   holds its end until the group is stopped (`Worker::_lifeline`), so its own stops
///   never fire it early.
///
/// Both have to be set by the child itself, between fork and exec (the group's id is
/// the child's pid), and std only offers that spot through `pre_exec`.
#[allow(unsafe_code)]
fn die_with_drover(cmd: &mut Command) {
    use nix::sys::prctl::set_pdeathsig;
    use nix::sys::signal::Signal;
    use nix::unistd::{getppid, Pid};
    let drover = Pid::this();
    // SAFETY: the closure runs in the forked child, where only async-signal-safe calls
    // are sound. It calls prctl(2), getppid(2), getpid(2) and fcntl(2), plain syscalls
    // (the first two through nix), on a descriptor `fd_mappings` has put in place, and
    // builds an io::Error from an errno, which does not allocate. It touches no lock
    // and no memory shared with other threads of drover.
    unsafe {
        cmd.pre_exec(move || {
            set_pdeathsig(Signal::SIGKILL).map_err(|e| io::Error::from_raw_os_error(e as i32))?;
            let group = -libc::getpid();
            for (command, arg) in [
                (libc::F_SETOWN, group),
                (F_SETSIG, libc::SIGKILL),
                (libc::F_SETFL, libc::O_ASYNC),
            ] {
                if libc::fcntl(LIFELINE_FD, command, arg) == -1 {
                    return Err(io::Error::last_os_error());
                }
            }
            // drover may have died between fork and prctl, before the signal was armed.
            if getppid() != drover {
                return Err(io::Error::from_raw_os_error(
                    nix::errno::Errno::ESRCH as i32,
                ));
            }
            Ok(())
        });
    }
}

/// A worker process and the process group it leads.
#[derive(Debug)]
pub(crate) struct Worker {
    pub(crate) child: Child,
    /// Its group id (its pid). `None` only if the spawn returned no pid, which tokio
    /// does not do for a process it has not reaped.
    group: Option<Pid>,
    /// `stop` has run: the group was seen empty, so `Drop` must not signal its id.
    stopped: bool,
    /// When its group got SIGTERM before `stop` (`term_early`): `stop` sends no second
    /// one, and its grace counts from then.
    termed_at: Option<Instant>,
    /// drover's end of the Node cluster channel (proxy mode), until `worker.rs` takes it.
    pub(crate) node_channel: Option<std::os::unix::net::UnixStream>,
    /// Its app and slot, as its environment names them (`orphans::left_behind`).
    app: String,
    id: usize,
    /// What the SIGKILL warning adds on why it may have stayed (`set_late_hint`).
    late_hint: Option<&'static str>,
    /// The only writer of the group's lifeline (`die_with_drover`). Dropped with the
    /// worker, after the group is stopped or SIGKILLed.
    _lifeline: std::os::fd::OwnedFd,
}

/// How often `stop` looks whether the group is empty once the worker has exited.
const GROUP_POLL: Duration = Duration::from_millis(20);

/// How long `stop` waits for the group to disappear after SIGKILL, which nothing can
/// ignore; only a process stuck in the kernel (uninterruptible I/O) outlasts it.
const KILL_WAIT: Duration = Duration::from_secs(2);

impl Worker {
    pub(crate) fn pid(&self) -> Option<u32> {
        self.group.map(|p| p.as_raw() as u32)
    }

    /// What the warning that it did not exit within its grace adds: why it may have
    /// stayed, and what to do.
    pub(crate) fn set_late_hint(&mut self, hint: &'static str) {
        self.late_hint = Some(hint);
    }

    /// Stops the worker and everything in its group: SIGTERM to the group, up to
    /// `grace` for all of it to exit, then SIGKILL to whatever is left. Also for a
    /// worker that already exited by itself: what it started may still run (and hold
    /// its port). Reaps the worker, so no zombie is left. Returns how the worker ended
    /// (None if waiting failed, which tokio only reports for a child already reaped).
    pub(crate) async fn stop(&mut self, grace: Duration) -> Option<ExitStatus> {
        self.end(Some(grace)).await
    }

    /// SIGTERM to the group now, ahead of `stop`, which then waits for what is left of
    /// its grace and sends no second one: an app's handler may not run twice well.
    pub(crate) fn term_early(&mut self) {
        if let (Some(group), None) = (self.group, self.termed_at) {
            signal_group(group, Signal::SIGTERM);
            self.termed_at = Some(Instant::now());
        }
    }

    /// `stop` without the SIGTERM: SIGKILL to the group at once. For a hung worker,
    /// which could act on a SIGTERM no more than it answers requests.
    pub(crate) async fn kill(&mut self) -> Option<ExitStatus> {
        self.end(None).await
    }

    async fn end(&mut self, grace: Option<Duration>) -> Option<ExitStatus> {
        let Some(group) = self.group else {
            let _ = self.child.start_kill();
            return self.child.wait().await.ok();
        };
        let exited = matches!(self.child.try_wait(), Ok(Some(_)));
        if exited && !group_alive(group) {
            self.stopped = true;
            let status = self.child.wait().await.ok();
            self.stop_left_behind(grace.unwrap_or(Duration::ZERO)).await;
            return status;
        }
        let mut clean = false;
        if let Some(grace) = grace {
            let deadline = match self.termed_at {
                Some(at) => at + grace,
                None => {
                    signal_group(group, Signal::SIGTERM);
                    Instant::now() + grace
                }
            };
            let status = tokio::time::timeout_at(deadline, self.child.wait()).await;
            clean = status.is_ok() && wait_group_gone(group, deadline).await;
            if !clean {
                tracing::warn!(
                    app = %self.app,
                    worker = self.id,
                    pid = group.as_raw(),
                    "worker {}/{} (pid {}) or a process it started did not exit within \
                     {grace:?} of SIGTERM; sending SIGKILL to its process group{}",
                    self.app,
                    self.id,
                    group.as_raw(),
                    self.late_hint.map(|h| format!(" ({h})")).unwrap_or_default(),
                );
            }
        }
        if !clean {
            signal_group(group, Signal::SIGKILL);
            clean = wait_group_gone(group, Instant::now() + KILL_WAIT).await;
        }
        // The worker itself is reaped here at the latest; it got SIGKILL with its group.
        let _ = self.child.start_kill();
        let status = self.child.wait().await.ok();
        if clean || wait_group_gone(group, Instant::now() + KILL_WAIT).await {
            self.stopped = true;
        } else {
            tracing::warn!(
                app = %self.app,
                worker = self.id,
                pid = group.as_raw(),
                "processes of worker {}/{}'s group (pid {}) are still running after SIGKILL",
                self.app,
                self.id,
                group.as_raw(),
            );
        }
        self.stop_left_behind(grace.unwrap_or(Duration::ZERO)).await;
        status
    }

    /// Stops what the worker started outside its group, re-parented to drover (a
    /// daemon: see `orphans`), and says so.
    async fn stop_left_behind(&self, grace: Duration) {
        let left = crate::orphans::stop_left_behind(&self.app, self.id, grace).await;
        for l in left {
            tracing::warn!(
                app = %self.app,
                worker = self.id,
                "worker {}/{} left process {} ({}) running outside its process group, \
                 which drover stops: the program daemonized (rackup -D, a --daemon or \
                 --detach flag, a fork with setsid), so drover cannot supervise what \
                 serves; stopped it. Run the program in the foreground, as under systemd \
                 or PM2",
                self.app,
                self.id,
                l.pid,
                l.command,
            );
        }
    }
}

impl Drop for Worker {
    /// A worker dropped without `stop` (its task was cancelled, the runtime is going
    /// away): SIGKILL to the group, so nothing of it is left behind; `kill_on_drop`
    /// kills and reaps the worker itself.
    fn drop(&mut self) {
        if let Some(pid) = self.pid() {
            crate::orphans::forget(pid);
        }
        if let (Some(group), false) = (self.group, self.stopped) {
            // While the worker is unreaped or its group has members, the id cannot
            // belong to anyone else.
            if matches!(self.child.try_wait(), Ok(None)) || group_alive(group) {
                signal_group(group, Signal::SIGKILL);
            }
        }
    }
}

/// Signals every process of `group`. Safe with respect to pid reuse as long as the
/// group has a member: Linux does not hand out a pid that is in use as a group id.
fn signal_group(group: Pid, signal: Signal) {
    match killpg(group, signal) {
        Ok(()) | Err(Errno::ESRCH) => {}
        Err(e) => tracing::warn!(
            pid = group.as_raw(),
            "cannot send {signal} to process group: {e}"
        ),
    }
}

/// Waits until `group` has no live member, or `deadline`; true if it has none.
async fn wait_group_gone(group: Pid, deadline: Instant) -> bool {
    loop {
        if !group_alive(group) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(GROUP_POLL).await;
    }
}

/// Whether any process of `group` still runs. Zombies do not count: they are dead,
/// hold no port, and a member that was reparented is reaped by init, not by us (in a
/// container init may never reap it).
fn group_alive(group: Pid) -> bool {
    match killpg(group, None) {
        Err(Errno::ESRCH) => false,
        // The group has members; only /proc tells whether any of them is not a zombie.
        _ => live_member_in_proc(group.as_raw()).unwrap_or(true),
    }
}

/// Looks through /proc for a process of group `pgid` that is not a zombie. `None` when
/// /proc cannot be read.
fn live_member_in_proc(pgid: i32) -> Option<bool> {
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        // A process may exit between read_dir and the read: then it is not alive.
        let Some(stat) = crate::cpu::Stat::of(pid) else {
            continue;
        };
        if i32::try_from(stat.group) == Ok(pgid) && stat.state != 'Z' {
            return Some(true);
        }
    }
    Some(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picked_ports_are_distinct_until_released() {
        let ports: Vec<Port> = (0..50).map(|_| Port::pick(None).unwrap()).collect();
        let distinct: BTreeSet<u16> = ports.iter().map(Port::get).collect();
        assert_eq!(distinct.len(), ports.len());
        let first = ports[0].get();
        drop(ports);
        assert!(!reserved().contains(&first));
    }

    #[test]
    fn workers_ports_come_from_outside_the_ephemeral_range() {
        let range = worker_ports().expect("this machine's ephemeral range leaves room");
        let ephemeral = ephemeral_ports().unwrap();
        let ports: Vec<Port> = (0..20).map(|_| Port::pick(None).unwrap()).collect();
        for port in &ports {
            assert!(
                range.contains(&port.get()),
                "{} not in {range:?}",
                port.get()
            );
            assert!(
                !ephemeral.contains(&port.get()),
                "{} is ephemeral",
                port.get()
            );
        }
        // A port in use (a listener, here) is never picked.
        let listeners: Vec<TcpListener> = ports
            .iter()
            .map(|p| TcpListener::bind(p.addr()).unwrap())
            .collect();
        drop(ports);
        let taken: BTreeSet<u16> = listeners
            .iter()
            .map(|l| l.local_addr().unwrap().port())
            .collect();
        for _ in 0..200 {
            let port = Port::pick(None).unwrap();
            assert!(!taken.contains(&port.get()), "picked {} in use", port.get());
        }
    }

    #[test]
    fn worker_ports_leave_out_the_ephemeral_range() {
        assert_eq!(
            ports_outside(&(20000..=32000), &(32768..=60999)),
            Some(20000..=32000)
        );
        assert_eq!(
            ports_outside(&(20000..=32000), &(30000..=60999)),
            Some(20000..=29999)
        );
        assert_eq!(
            ports_outside(&(20000..=32000), &(10000..=25000)),
            Some(25001..=32000)
        );
        assert_eq!(ports_outside(&(20000..=32000), &(1024..=65535)), None);
        assert_eq!(ports_outside(&(20000..=32000), &(20500..=31500)), None);
        assert_eq!(parse_port_range("32768\t60999\n"), Some(32768..=60999));
        assert_eq!(parse_port_range("60999 32768"), None);
        assert_eq!(parse_port_range("x"), None);
    }

    #[test]
    fn a_held_port_is_free_only_to_a_listener_that_reuses_addresses() {
        // On a port of the machine's, which any other process may take between two of
        // these steps (CI saw the last bind refused once): three ports, one must pass.
        let tries: Vec<Result<(), String>> = (0..3).map(|_| held_port_round()).collect();
        assert!(tries.iter().any(Result::is_ok), "{tries:?}");
    }

    fn held_port_round() -> Result<(), String> {
        let mut port = Port::pick(None).unwrap();
        let addr = port.addr();
        // A plain bind (as a program that sets no SO_REUSEADDR) is refused while held.
        // (Rust's TcpListener::bind sets SO_REUSEADDR, so a raw socket.)
        let plain = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP)).unwrap();
        match plain.bind(&addr.into()) {
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => {}
            other => return Err(format!("a held port is not free: {other:?}")),
        }
        // drover's listener for a Node worker, and libuv's own, reuse addresses.
        let reusing = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP)).unwrap();
        reusing.set_reuse_address(true).unwrap();
        reusing
            .bind(&addr.into())
            .map_err(|e| format!("reusing: {e}"))?;
        reusing.listen(8).unwrap();
        drop(reusing);
        port.release_hold();
        plain
            .bind(&addr.into())
            .map_err(|e| format!("a released port is free: {e}"))
    }
}
