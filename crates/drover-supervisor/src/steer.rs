//! Shared mode's connection placement: one listening socket per worker slot, all in
//! one `SO_REUSEPORT` group on the app's address, and a classic BPF program on the
//! group that picks the socket (so the worker) each new connection lands on.
//!
//! Why this shape: with one socket shared by every worker, whichever worker waits in
//! `accept` takes the next connection. That is load-aware at the moment of the accept
//! (a busy worker does not wait there), but not over a burst: the first worker woken
//! takes most of it (39/61 on two workers under `wrk -c50` keep-alive, 74.5 % in
//! bench/shared.sh), and drover has no say. With a socket per worker, the kernel asks the
//! group's program at each SYN for an index into the group (the sockets in the order
//! they joined it) and queues the connection on that socket; the worker then talks to
//! the client directly. drover never touches a request, it only re-writes the program
//! when the load it sees changes (a re-attach costs ~25 µs). Classic BPF needs no
//! privilege; eBPF (which could count connections itself) does.
//!
//! What the program does: it draws the kernel's per-packet random number and compares
//! it with cumulative thresholds, so slot `i` gets a share `w_i / Σw` of new
//! connections. A classic program has no memory, so within one sampling period the
//! placement is random; across periods drover corrects it (see `weights`), and between
//! periods `watch` leaves out a worker whose queue holds a connection for 1 ms.
//!
//! The price, measured (bench/shared.sh): placing a connection before a worker is free
//! loses to a queue every free worker pulls from when each request has a connection of
//! its own and costs vary (p99 1.2-1.4 x Node cluster's, where the single shared socket
//! gets 0.9 x); a connection placed behind a 10 ms request waits for it.
//!
//! Invariants:
//! - drover creates every slot's socket and keeps its own descriptor until it exits.
//!   A worker that dies or is reloaded therefore does not close it, and whatever sits
//!   in its accept queue waits for the next process of the slot, which inherits the
//!   same socket as fd 3. (Closing a listener resets its queued connections.)
//! - A socket never leaves the group while drover runs, so the group's indices stay
//!   the slot ids: the kernel fills a hole by moving its last socket into it, which
//!   would make every later program point at the wrong worker. A slot removed by a
//!   scale-down keeps its socket, steered to zero; a later scale-up reuses it.
//! - Only serving slots get new connections; a slot that is starting, backing off,
//!   retiring or stopped (SIGSTOP) gets none. When none serves, every live slot gets
//!   an equal share, so connections queue for the workers that come back.

use crate::cpu::{self, CpuMeter};
use nix::errno::Errno;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags};
use nix::sys::socket::{getsockopt, setsockopt, sockopt::AttachReusePortCbpf};
use nix::{getsockopt_impl, sockopt_impl};
use socket2::{Domain, Protocol, Socket, Type};
use std::io;
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often drover looks at the workers' load and re-weights the program while they
/// work. Each look reads two small `/proc` files and one `TCP_INFO` per worker (tens of
/// µs in all); a re-attach happens only when the weights changed. 25 ms sees a worker
/// saturate within a few of its requests.
pub(crate) const STEER_PERIOD: Duration = Duration::from_millis(25);

/// How often it looks while every worker is idle (no CPU to speak of, nothing queued,
/// nothing changed): 40 looks a second cost an idle drover ~1 % of a core, more than
/// the rest of it. A burst on an idle app is placed by the program of the last look
/// (even shares), and the next look comes within this period.
pub(crate) const STEER_IDLE_PERIOD: Duration = Duration::from_millis(250);

/// Below this share of busy time a worker counts as idle for `STEER_IDLE_PERIOD`.
const IDLE: f64 = 0.02;

/// Accept backlog of each slot's socket, as std's `TcpListener::bind` uses.
const BACKLOG: i32 = 1024;

/// A main thread busy (running or runnable) this share of the time is saturated: the
/// requests it holds already wait for it, so new connections should go elsewhere.
const SATURATED: f64 = 0.9;

/// A saturated worker's share relative to an unsaturated one. Not zero: if its
/// reading is wrong, it still sees traffic, and when every worker is saturated the
/// factor cancels out.
const SATURATED_FACTOR: f64 = 1.0 / 16.0;

/// Smoothing of the CPU readings (weight of the newest): one 25 ms reading of a
/// worker that paused for garbage collection should not move its share by much.
const BUSY_SMOOTHING: f64 = 0.5;

/// A connection that waits this long in a worker's accept queue means the worker is
/// blocked (its event loop is busy with a request): new connections go to the others
/// until its queue is empty again. The periodic look cannot see a 10 ms request; the
/// accept queue shows it within this delay, and a Node worker that is free accepts in
/// tens of µs.
const BLOCKED_AFTER: Duration = Duration::from_millis(1);

/// How soon the watcher looks again at a queue that has held a connection for `age`:
/// after `BLOCKED_AFTER` at first, then after an eighth of the age, at most
/// `STEER_PERIOD`. A worker busy with a 50 ms request is seen free within 6 ms of it;
/// one that never accepts (stopped, or an app listening elsewhere) costs 40 looks a
/// second, not the thousand that a look every millisecond took.
fn recheck_after(age: Duration) -> Duration {
    (age / 8).clamp(BLOCKED_AFTER, STEER_PERIOD)
}

/// The most connections one check moves out of one blocked worker's queue.
const MOVE_AT_ONCE: usize = 64;

/// How often the watcher (`Steering::watch`) wakes while no connection waits anywhere,
/// to notice that drover is stopping.
const WATCH_IDLE: u16 = 100;

/// A slot whose restart back-off is at least this long (it crash-loops) has what is
/// queued on its socket moved to the serving workers by drover (see
/// `Steering::rescue`) rather than left waiting for its next process. Shorter back-offs
/// (100 ms after a first crash) are waited out: the successor serves the queue itself.
pub(crate) const RESCUE_AFTER: Duration = Duration::from_secs(1);

/// How often `rescue` looks again whether another slot serves, while none does.
const RESCUE_POLL: Duration = Duration::from_millis(50);

/// Total of the weights in a program; a slot's share is `weight / WEIGHT_SCALE`.
/// Coarse on purpose: the program only changes (and is re-attached) when a share
/// moves by at least 1/1024.
const WEIGHT_SCALE: u32 = 1024;

/// The first listening socket of a shared-mode app, bound with `SO_REUSEPORT` so the
/// other workers' sockets can join its group. Bind it before anything starts, so a
/// taken address stops the start-up with nothing to undo.
#[derive(Debug)]
pub struct SharedListener {
    first: TcpListener,
    addr: SocketAddr,
}

impl SharedListener {
    /// Binds `addr` (port 0 picks a free one; the group then uses that port). Fails
    /// with `AddrInUse` when anything listens there already, a group of sockets like
    /// this one (a second drover on the same address) included.
    pub fn bind(addr: SocketAddr) -> io::Result<SharedListener> {
        let first = listener(addr, Join::No)?;
        let addr = first.local_addr()?;
        Ok(SharedListener { first, addr })
    }

    /// Where clients connect.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

/// Whether a new socket may join a group already on the address.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Join {
    /// The first socket: the address must be free. It binds without `SO_REUSEPORT`,
    /// so the kernel refuses the bind if anything is there (with it, the bind would
    /// join another drover's group), and sets it after, so later sockets can join.
    No,
    /// A later slot's socket, joining the group of the first.
    Yes,
}

/// A listening socket on `addr` in the `SO_REUSEPORT` group there. The kernel only
/// lets sockets of the same user join a group.
fn listener(addr: SocketAddr, join: Join) -> io::Result<TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    // As std's bind does: a restarted drover can bind while old connections linger in
    // TIME_WAIT.
    socket.set_reuse_address(true)?;
    if join == Join::Yes {
        socket.set_reuse_port(true)?;
    }
    socket.bind(&addr.into())?;
    socket.set_reuse_port(true)?;
    // A socket joins the group (and gets its index) when it listens.
    socket.listen(BACKLOG)?;
    Ok(socket.into())
}

/// What drover reads about one slot at each look.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct SlotLoad {
    /// It has a process that serves (ready or busy, not retiring, not stopped).
    pub serving: bool,
    /// Smoothed share of time its main thread was busy (see `cpu`).
    pub busy: f64,
    /// Connections waiting in its socket's accept queue.
    pub queue: u32,
    /// Connections placed on it: the ones its process holds (descriptors above the
    /// fewest it ever had) and the ones waiting in its accept queue.
    pub held: u32,
    /// A connection has waited in its accept queue for `BLOCKED_AFTER` and more.
    pub blocked: bool,
    /// Its process is stopped (SIGSTOP) with connections waiting.
    pub stopped: bool,
}

/// Each live slot's weight, summing to `WEIGHT_SCALE` (one entry per live slot).
///
/// A serving slot's share starts equal, is cut to `SATURATED_FACTOR` while its main
/// thread is saturated, and divided by `1 + queue` when connections wait in its accept
/// queue (it is not accepting: stalled, or slower than it is sent). Then evenness:
/// drover cannot count the connections the program placed, but it sees the ones each
/// worker holds; it gives new connections to the slots below their share of what is
/// held plus what is about to come ("water-filling"), so a random streak in one period
/// is made up in the next.
pub(crate) fn weights(loads: &[SlotLoad]) -> Vec<u32> {
    let serving: Vec<usize> = (0..loads.len())
        .filter(|&i| loads[i].serving && !loads[i].stopped)
        .collect();
    if serving.is_empty() {
        // Nobody serves: spread evenly so queued connections wait for each slot's next
        // process rather than all for one.
        return normalize(&vec![1.0; loads.len()]);
    }
    // Blocked workers get nothing while one is not; if all are, the flag says nothing.
    let free = serving.iter().any(|&i| !loads[i].blocked);
    let mut share = vec![0.0; loads.len()];
    for &i in &serving {
        let l = &loads[i];
        if l.blocked && free {
            continue;
        }
        let mut f = 1.0;
        if l.busy >= SATURATED {
            f *= SATURATED_FACTOR;
        }
        f /= 1.0 + f64::from(l.queue);
        share[i] = f;
    }
    let total: f64 = share.iter().sum();
    share.iter_mut().for_each(|s| *s /= total);

    let held: f64 = serving.iter().map(|&i| f64::from(loads[i].held)).sum();
    // What is about to come: a few per worker, or a quarter of what is held, so the
    // shares move smoothly rather than all to one slot.
    let coming = (4.0 * serving.len() as f64).max(held / 4.0);
    let mut deficit = vec![0.0; loads.len()];
    for &i in &serving {
        deficit[i] = (share[i] * (held + coming) - f64::from(loads[i].held)).max(0.0);
    }
    let total_deficit: f64 = deficit.iter().sum();
    if total_deficit <= 0.0 {
        return normalize(&share);
    }
    // `held` is read from each worker's open descriptors, which also count what the app
    // opened after it began to serve: a worker read as holding more than it does got
    // no new connection for as long as another was behind, and one of three workers of
    // a test's app answered none of its requests for 15 s on a loaded machine. So each
    // serving slot keeps `FILL_FLOOR` of its load share.
    let mixed: Vec<f64> = (0..loads.len())
        .map(|i| (1.0 - FILL_FLOOR) * deficit[i] / total_deficit + FILL_FLOOR * share[i])
        .collect();
    normalize(&mixed)
}

/// The part of each serving slot's load share that water-filling leaves it (see
/// `weights`).
const FILL_FLOOR: f64 = 1.0 / 8.0;

/// Scales `w` (not all zero) to integers summing to `WEIGHT_SCALE`.
fn normalize(w: &[f64]) -> Vec<u32> {
    let total: f64 = w.iter().sum();
    let mut out: Vec<u32> = w
        .iter()
        .map(|x| (x / total * f64::from(WEIGHT_SCALE)).floor() as u32)
        .collect();
    // Rounding leftovers go to the largest weight, so the sum is exact.
    let rest = WEIGHT_SCALE - out.iter().sum::<u32>();
    if let Some(max) = (0..w.len()).max_by(|&a, &b| w[a].total_cmp(&w[b])) {
        out[max] += rest;
    }
    out
}

// Classic BPF instructions (linux/filter.h).
const BPF_LD_W_ABS: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
const BPF_JMP_JGE_K: u16 = (libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K) as u16;
const BPF_RET_K: u16 = (libc::BPF_RET | libc::BPF_K) as u16;
/// `SKF_AD_OFF + SKF_AD_RANDOM`: loading this "offset" gives a fresh random u32.
const LOAD_RANDOM: u32 = (libc::SKF_AD_OFF + libc::SKF_AD_RANDOM) as u32;

fn insn(code: u16, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

/// The program for `weights` (index = group index): `A = random`, then for each slot
/// with a weight, "below its cumulative threshold: return its index". Comparisons are
/// unsigned, so the random u32 falls in slot `i` with probability `w_i / Σw`.
pub(crate) fn program(weights: &[u32]) -> Vec<libc::sock_filter> {
    let live: Vec<(usize, u32)> = weights
        .iter()
        .copied()
        .enumerate()
        .filter(|&(_, w)| w > 0)
        .collect();
    let total: u64 = live.iter().map(|&(_, w)| u64::from(w)).sum();
    let Some((&(last, _), rest)) = live.split_last() else {
        return vec![insn(BPF_RET_K, 0, 0, 0)];
    };
    if rest.is_empty() {
        return vec![insn(BPF_RET_K, 0, 0, last as u32)];
    }
    let mut prog = vec![insn(BPF_LD_W_ABS, 0, 0, LOAD_RANDOM)];
    let mut cumulative = 0u64;
    for &(i, w) in rest {
        cumulative += u64::from(w);
        let threshold = ((cumulative << 32) / total) as u32;
        // A >= threshold: skip the return below.
        prog.push(insn(BPF_JMP_JGE_K, 1, 0, threshold));
        prog.push(insn(BPF_RET_K, 0, 0, i as u32));
    }
    prog.push(insn(BPF_RET_K, 0, 0, last as u32));
    prog
}

/// Puts `prog` on the group of `socket` (the program belongs to the group, not to
/// the socket it is set through).
fn attach(socket: &TcpListener, prog: &[libc::sock_filter]) -> io::Result<()> {
    let fprog = libc::sock_fprog {
        len: prog.len() as u16,
        // The kernel copies the program during the call and never writes through this.
        filter: prog.as_ptr().cast_mut(),
    };
    setsockopt(socket, AttachReusePortCbpf, &fprog).map_err(io::Error::from)
}

/// The slots' sockets and what drover last saw of their workers.
#[derive(Debug)]
pub(crate) struct Steering {
    addr: SocketAddr,
    inner: Mutex<Inner>,
    /// Every slot's socket, for readability (a connection waits): see `watch`.
    epoll: Epoll,
    /// `watch` returns.
    stop: AtomicBool,
    /// Where relays of moved connections run (see `check_queues`); none outside a
    /// runtime (unit tests), and then none is moved.
    runtime: Option<tokio::runtime::Handle>,
}

#[derive(Debug)]
struct Inner {
    /// By slot id = group index; never shrinks (see the module comment).
    sockets: Vec<TcpListener>,
    views: Vec<View>,
    /// The weights of the program now attached.
    attached: Option<Vec<u32>>,
    /// What the last look saw, with `blocked` kept up to date by `watch`.
    loads: Vec<SlotLoad>,
    /// Per socket: since when a connection waits in its queue, as far as `watch` knows
    /// (its readability is not watched meanwhile).
    waiting: Vec<Option<Instant>>,
    /// Per socket: `watch` found it blocked.
    blocked: Vec<bool>,
}

/// What drover remembers of one slot's process between looks.
#[derive(Debug, Default)]
struct View {
    pid: Option<u32>,
    meter: CpuMeter,
    busy: f64,
    /// The fewest descriptors the process had: what it holds without connections.
    base_fds: Option<u64>,
}

/// One slot as the supervisor sees it, for `Steering::look`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SlotState {
    pub pid: Option<u32>,
    /// Ready or busy and not retiring.
    pub serving: bool,
}

impl Steering {
    pub(crate) fn new(listener: SharedListener) -> io::Result<Steering> {
        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?;
        epoll.add(&listener.first, readable(0))?;
        let steering = Steering {
            addr: listener.addr,
            inner: Mutex::new(Inner {
                sockets: vec![listener.first],
                views: vec![View::default()],
                attached: None,
                loads: Vec::new(),
                waiting: vec![None],
                blocked: vec![false],
            }),
            epoll,
            stop: AtomicBool::new(false),
            runtime: tokio::runtime::Handle::try_current().ok(),
        };
        Ok(steering)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Slot `id`'s socket (a new descriptor of it, for a worker), creating the sockets
    /// up to `id` if the app grew. New sockets join the group at the end, so their
    /// index is their slot id. Until the next look, a new slot gets nothing: the
    /// program attached does not name it.
    pub(crate) fn socket(&self, id: usize) -> io::Result<TcpListener> {
        let mut inner = self.lock();
        while inner.sockets.len() <= id {
            let socket = listener(self.addr, Join::Yes)?;
            self.epoll.add(&socket, readable(inner.sockets.len()))?;
            inner.sockets.push(socket);
            inner.views.push(View::default());
            inner.waiting.push(None);
            inner.blocked.push(false);
        }
        inner.sockets[id].try_clone()
    }

    /// Where drover itself connects to reach the group: its address, with loopback for
    /// an unspecified IP (`0.0.0.0`, `::`).
    fn connect_addr(&self) -> SocketAddr {
        let mut addr = self.addr;
        if addr.ip().is_unspecified() {
            addr.set_ip(match addr {
                SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
                SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
            });
        }
        addr
    }

    /// Moves the connections queued on slot `id`'s socket, whose worker is not
    /// running, to the workers that serve: accepts each and relays it to the group's
    /// address, where the program places it on a serving slot (never this one, which it
    /// does not name). One hop, for these connections only. Runs until dropped (the
    /// slot's next process starts).
    ///
    /// `others_serve` says whether another slot serves now. While none does, the
    /// program names every slot, this one included, so a relayed connection could come
    /// back here: drover leaves the queue alone then.
    pub(crate) async fn rescue(&self, id: usize, others_serve: impl Fn() -> bool) {
        let result: io::Result<()> = async {
            let socket = self.socket(id)?;
            // Non-blocking is a flag of the socket, shared with every descriptor of it:
            // the slot's next process gets it back as drover created it.
            let _restore = Blocking(socket.try_clone()?);
            socket.set_nonblocking(true)?;
            let socket = tokio::net::TcpListener::from_std(socket)?;
            let target = self.connect_addr();
            loop {
                if !others_serve() {
                    tokio::time::sleep(RESCUE_POLL).await;
                    continue;
                }
                let accepted = tokio::time::timeout(RESCUE_POLL, socket.accept()).await;
                let Ok(accepted) = accepted else {
                    continue;
                };
                let (client, _) = accepted?;
                tokio::spawn(relay(client, target));
            }
        }
        .await;
        if let Err(e) = result {
            tracing::warn!(
                worker = id,
                "shared mode: cannot move the connections queued for a worker that is down: {e}"
            );
            std::future::pending::<()>().await;
        }
    }

    /// Connections waiting in slot `id`'s accept queue; `None` if it cannot be read.
    pub(crate) fn queued(&self, id: usize) -> Option<u32> {
        accept_queue(self.lock().sockets.get(id)?).ok()
    }

    /// Reads every live slot's load and re-attaches the program if the weights
    /// changed. `slots` are the live slots, by id. Answers whether anything is going
    /// on (a worker uses CPU, connections wait, the weights moved): if not, the next
    /// look can wait `STEER_IDLE_PERIOD`.
    pub(crate) fn look(&self, slots: &[SlotState]) -> io::Result<bool> {
        let mut inner = self.lock();
        let live = slots.len().min(inner.sockets.len());
        let mut loads = Vec::with_capacity(live);
        for (id, slot) in slots.iter().take(live).enumerate() {
            let queue = accept_queue(&inner.sockets[id]).unwrap_or(0);
            let blocked = inner.blocked[id];
            let view = &mut inner.views[id];
            if view.pid != slot.pid {
                *view = View {
                    pid: slot.pid,
                    ..View::default()
                };
            }
            let mut load = SlotLoad {
                queue,
                blocked,
                ..SlotLoad::default()
            };
            if let (Some(pid), true) = (slot.pid, slot.serving) {
                if let Some(busy) = view.meter.sample(pid) {
                    view.busy = BUSY_SMOOTHING * busy + (1.0 - BUSY_SMOOTHING) * view.busy;
                }
                if let Some(fds) = open_fds(pid) {
                    let base = view.base_fds.map_or(fds, |b| b.min(fds));
                    view.base_fds = Some(base);
                    let accepted = u32::try_from(fds - base).unwrap_or(u32::MAX);
                    load.held = accepted.saturating_add(load.queue);
                }
                load.busy = view.busy;
                load.serving = true;
                // A stopped process accepts nothing until SIGCONT. Only worth a read
                // when connections wait for it.
                load.stopped = load.queue > 0 && cpu::is_stopped(pid);
            }
            loads.push(load);
        }
        if loads.is_empty() {
            return Ok(false);
        }
        let active = loads.iter().any(|l| l.busy >= IDLE || l.queue > 0);
        inner.loads = loads;
        Ok(inner.reweight()? || active)
    }

    /// Watches the slots' accept queues until `stop`: a worker whose queue holds a
    /// connection for `BLOCKED_AFTER` is blocked, and the program leaves it out until
    /// its queue is empty again. This is what places connections by load at the scale
    /// of one request: the periodic look sees CPU over 25 ms, which a 10 ms request
    /// hides. Costs one wake-up of this thread per new connection (no accept, no
    /// handoff), plus one check a millisecond while a connection waits. Runs on a
    /// thread of its own, so the async runtime never waits for it.
    pub(crate) fn watch(&self) {
        let mut events = [EpollEvent::empty(); 64];
        while !self.stop.load(Ordering::Relaxed) {
            let timeout = self
                .lock()
                .waiting
                .iter()
                .flatten()
                .map(|since| recheck_after(since.elapsed()))
                .min()
                .map_or(WATCH_IDLE, |after| after.as_millis() as u16);
            let n = match self.epoll.wait(&mut events, timeout) {
                Ok(n) => n,
                Err(Errno::EINTR) => continue,
                Err(e) => {
                    tracing::warn!("shared mode: cannot watch the workers' accept queues: {e}");
                    return;
                }
            };
            if let Err(e) = self.check_queues(&events[..n]) {
                tracing::warn!("shared mode: cannot re-weight the workers' sockets: {e}");
            }
        }
    }

    /// `watch`'s turn: notes the sockets that became readable, and decides about the
    /// ones that have had a connection waiting for `BLOCKED_AFTER`.
    fn check_queues(&self, ready: &[EpollEvent]) -> io::Result<()> {
        let mut inner = self.lock();
        let now = Instant::now();
        for event in ready {
            let id = event.data() as usize;
            if id < inner.sockets.len() && inner.waiting[id].is_none() {
                inner.waiting[id] = Some(now);
                // Level-triggered: it stays readable while the connection waits.
                self.epoll
                    .modify(&inner.sockets[id], &mut EpollEvent::empty())?;
            }
        }
        let mut changed = false;
        for id in 0..inner.sockets.len() {
            let Some(since) = inner.waiting[id] else {
                continue;
            };
            if now.duration_since(since) < BLOCKED_AFTER {
                continue;
            }
            let blocked = accept_queue(&inner.sockets[id])? > 0;
            changed |= blocked != inner.blocked[id];
            inner.blocked[id] = blocked;
            if let Some(load) = inner.loads.get_mut(id) {
                load.blocked = blocked;
            }
            if !blocked {
                inner.waiting[id] = None;
                self.epoll.modify(&inner.sockets[id], &mut readable(id))?;
            }
        }
        if changed {
            inner.reweight()?;
        }
        // A stopped worker (SIGSTOP, a debugger) holds its queue until it is continued.
        // While another worker is free, drover moves what waits there to the free ones,
        // one hop for these connections only. Only stopped ones: a worker that is
        // merely blocked (in a request, or waiting for a core on a busy machine, which
        // looks the same from here) accepts soon, and a moved keep-alive connection
        // keeps its hop for its whole life; moving those cost 17 % of wrk -c50's
        // throughput on a loaded machine.
        let free = inner
            .loads
            .iter()
            .any(|l| l.serving && !l.blocked && !l.stopped);
        if let (true, Some(runtime)) = (free, &self.runtime) {
            let target = self.connect_addr();
            for id in 0..inner.loads.len().min(inner.sockets.len()) {
                let load = inner.loads[id];
                let stopped = inner.views[id].pid.is_some_and(cpu::is_stopped);
                if !(load.serving && load.blocked && stopped && non_blocking(&inner.sockets[id])) {
                    continue;
                }
                for _ in 0..MOVE_AT_ONCE {
                    let Ok((client, _)) = inner.sockets[id].accept() else {
                        break; // WouldBlock: the worker took the rest, or none is left
                    };
                    if client.set_nonblocking(true).is_err() {
                        continue;
                    }
                    let _guard = runtime.enter();
                    if let Ok(client) = tokio::net::TcpStream::from_std(client) {
                        runtime.spawn(relay(client, target));
                    }
                }
            }
        }
        Ok(())
    }

    /// Makes `watch` return (within `WATCH_IDLE`).
    pub(crate) fn stop_watching(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Carries `client`, taken from a worker's queue, to the group's address, where the
/// program places it on a worker that serves. A failure here is the client's or the
/// worker's, seen by the client as a closed connection, as it would be without drover.
async fn relay(mut client: tokio::net::TcpStream, target: SocketAddr) {
    if let Ok(mut upstream) = tokio::net::TcpStream::connect(target).await {
        let _ = upstream.set_nodelay(true);
        let _ = client.set_nodelay(true);
        let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
    }
}

/// Whether `socket` accepts without blocking. Its workers set that (Node, Go and the
/// Python examples do); drover only moves connections out of such a socket, since an
/// accept that loses the race for the last one must not block its watcher.
fn non_blocking(socket: &TcpListener) -> bool {
    nix::fcntl::fcntl(socket, nix::fcntl::FcntlArg::F_GETFL)
        .is_ok_and(|flags| flags & libc::O_NONBLOCK != 0)
}

/// Interest in socket `id` having a connection to accept.
fn readable(id: usize) -> EpollEvent {
    EpollEvent::new(EpollFlags::EPOLLIN, id as u64)
}

impl Inner {
    /// Attaches the program for `loads` if its weights changed; true if they did.
    fn reweight(&mut self) -> io::Result<bool> {
        if self.loads.is_empty() {
            return Ok(false);
        }
        let w = weights(&self.loads);
        if self.attached.as_ref() == Some(&w) {
            return Ok(false);
        }
        attach(&self.sockets[0], &program(&w))?;
        tracing::trace!(weights = ?w, loads = ?self.loads, "shared mode: re-weighted");
        self.attached = Some(w);
        Ok(true)
    }
}

/// Puts its socket back in blocking mode when dropped.
struct Blocking(TcpListener);

impl Drop for Blocking {
    fn drop(&mut self) {
        let _ = self.0.set_nonblocking(false);
    }
}

/// How many descriptors `pid` has open: the size Linux (6.2 and later) reports for
/// `/proc/PID/fd`, else a count of its entries.
fn open_fds(pid: u32) -> Option<u64> {
    let dir = format!("/proc/{pid}/fd");
    let size = std::fs::metadata(&dir).ok()?.len();
    if size > 0 {
        return Some(size);
    }
    Some(std::fs::read_dir(&dir).ok()?.count() as u64)
}

/// The start of Linux's `struct tcp_info`, as far as a listening socket's fields go.
/// Only this prefix is asked for, so the kernel (which copies `min(asked, its size)`)
/// fills all of it on every version since 2.6: nix checks that it did.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ListenInfo {
    state_and_flags: [u8; 8],
    rto: u32,
    ato: u32,
    snd_mss: u32,
    rcv_mss: u32,
    /// For a socket in LISTEN: the connections waiting in its accept queue.
    unacked: u32,
    /// For a socket in LISTEN: its backlog.
    sacked: u32,
}

// `getsockopt(TCP_INFO)` through nix's own macro for socket options nix lacks: nix
// writes and checks the call (the only unsafe part), and `ListenInfo` is plain
// integers, valid for any bytes the kernel writes. Why not `/proc/net/tcp`, which
// needs no such call: reading it walks the kernel's whole connection hash table, 1.7-2
// ms per read here, 2.5 % of a core at this period for an idle app; this is ~1 µs.
sockopt_impl!(
    /// `TCP_INFO`, cut to `ListenInfo`.
    TcpListenInfo,
    GetOnly,
    libc::SOL_TCP,
    libc::TCP_INFO,
    ListenInfo
);

/// Connections waiting in `socket`'s accept queue.
fn accept_queue(socket: &TcpListener) -> io::Result<u32> {
    Ok(getsockopt(socket, TcpListenInfo)?.unacked)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpStream;

    #[test]
    fn a_queue_held_longer_is_looked_at_less_often() {
        let ms = Duration::from_millis;
        assert_eq!(recheck_after(ms(0)), BLOCKED_AFTER);
        assert_eq!(recheck_after(ms(40)), ms(5));
        assert_eq!(recheck_after(Duration::from_secs(60)), STEER_PERIOD);
        // The watcher's epoll timeout is in ms: every value fits.
        assert!(STEER_PERIOD.as_millis() <= u16::MAX as u128);
    }

    fn idle(n: usize) -> Vec<SlotLoad> {
        vec![
            SlotLoad {
                serving: true,
                ..SlotLoad::default()
            };
            n
        ]
    }

    #[test]
    fn equal_load_gets_equal_weights() {
        assert_eq!(weights(&idle(2)), vec![512, 512]);
        let w = weights(&idle(3));
        assert_eq!(w.iter().sum::<u32>(), WEIGHT_SCALE);
        assert!(w.iter().all(|&x| (341..=342).contains(&x)), "{w:?}");
    }

    #[test]
    fn saturated_stalled_and_absent_workers_get_less_or_nothing() {
        let mut l = idle(2);
        l[0].busy = 1.0;
        let w = weights(&l);
        assert!(w[0] * 10 < w[1], "saturated: {w:?}");
        let mut l = idle(2);
        l[1].queue = 30;
        let w = weights(&l);
        assert!(w[1] * 10 < w[0], "queue: {w:?}");
        let mut l = idle(3);
        l[2].serving = false;
        assert_eq!(weights(&l)[2], 0);
        // All saturated: the factor cancels.
        let mut l = idle(2);
        l.iter_mut().for_each(|s| s.busy = 1.0);
        assert_eq!(weights(&l), vec![512, 512]);
        // Nobody serves: even over every live slot.
        assert_eq!(weights(&[SlotLoad::default(); 2]), vec![512, 512]);
    }

    #[test]
    fn a_blocked_worker_gets_nothing_while_another_is_free() {
        let mut l = idle(3);
        l[1].blocked = true;
        let w = weights(&l);
        assert_eq!(w[1], 0, "{w:?}");
        assert_eq!(w[0] + w[2], WEIGHT_SCALE);
        l.iter_mut().for_each(|s| s.blocked = true);
        assert!(weights(&l).iter().all(|&x| x > 300), "all blocked: even");
    }

    #[test]
    fn the_slot_behind_gets_the_new_connections() {
        let mut l = idle(2);
        l[0].held = 30;
        l[1].held = 20;
        let w = weights(&l);
        assert!(w[1] > 2 * w[0], "{w:?}");
        l[1].held = 30;
        assert_eq!(weights(&l), vec![512, 512]);
    }

    #[test]
    fn programs_return_valid_indices() {
        assert_eq!(program(&[0, 1024])[0].k, 1);
        assert_eq!(program(&[0, 1024]).len(), 1);
        let p = program(&[512, 0, 512]);
        assert_eq!(p.len(), 4);
        assert_eq!(p[1].k, 1 << 31);
        assert_eq!((p[2].k, p[3].k), (0, 2));
    }

    #[test]
    fn a_second_group_on_the_same_address_is_refused() {
        let first = SharedListener::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = first.local_addr();
        let steering = Steering::new(first).unwrap();
        steering.socket(2).unwrap();
        let again = SharedListener::bind(addr).unwrap_err();
        assert_eq!(again.kind(), io::ErrorKind::AddrInUse);
        // A plain listener there is refused too, and the other way round.
        assert!(TcpListener::bind(addr).is_err());
        let taken = TcpListener::bind("127.0.0.1:0").unwrap();
        let err = SharedListener::bind(taken.local_addr().unwrap()).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AddrInUse);
    }

    /// The kernel honours the steered index, and a connection queued on a socket
    /// whose only other holder closed it is still there for the next one.
    #[test]
    fn a_steered_group_places_connections_and_reports_queues() {
        let first = SharedListener::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = first.local_addr();
        let steering = Steering::new(first).unwrap();
        let _one = steering.socket(1).unwrap();
        attach(&steering.lock().sockets[0], &program(&[0, 1024])).unwrap();
        let clients: Vec<TcpStream> = (0..5).map(|_| TcpStream::connect(addr).unwrap()).collect();
        let queued = |id| {
            // The handshake completes in the kernel, just after connect returns.
            for _ in 0..100 {
                if steering.queued(1) == Some(5) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            steering.queued(id).unwrap()
        };
        assert_eq!(queued(1), 5);
        assert_eq!(queued(0), 0);
        // A worker's descriptor closing does not drop the queue: drover holds one.
        let worker = steering.socket(1).unwrap();
        drop(worker);
        let (mut conn, _) = steering.socket(1).unwrap().accept().unwrap();
        let mut c = &clients[0];
        c.write_all(b"x").unwrap();
        let mut b = [0u8; 1];
        conn.read_exact(&mut b).unwrap();
        assert_eq!(steering.queued(1), Some(4));
    }
}
