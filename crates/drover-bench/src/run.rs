//! The generator: closed loop (C connections, each sends its next request when the
//! previous answer arrives) and open loop (requests on a fixed schedule, latency from the
//! scheduled time, connections from a pool that grows up to a limit).
//!
//! Each generator thread runs its own current-thread tokio runtime; threads share
//! nothing but the start time and the request budget, and their histograms are merged
//! at the end.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::fmt;
use std::io::Write as _;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tokio::task::LocalSet;

use hdrhistogram::Histogram;

use crate::http::{build_request, Conn, Response};
use crate::human::fmt_us;
use crate::mix::Mix;
use crate::schedule::{Poisson, Schedule};
use crate::stats::{
    interval_reports, new_histogram, spectrum, ErrorKind, Outcome, PathReport, Percentiles, Report,
    Stats,
};

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Mode {
    /// Every connection sends its next request as soon as the previous one is answered.
    Closed,
    /// Requests at a fixed rate (requests/s) whatever the answers do.
    Open { rate: f64, reuse: Reuse },
}

/// Which idle keep-alive connection an open-loop request goes out on.
///
/// This matters only when the server balances per *connection* (Node's cluster module,
/// PM2, a shared listening socket): there, the client's choice of connection is the
/// balancing. A pool that reuses the connection that answered last steers each request
/// to the worker that just finished one, which is in effect least-loaded balancing done
/// by the client. Many independent clients (browsers, mobile apps) do no such thing: the
/// next request comes on whichever client's connection happens to send next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Reuse {
    /// An idle connection picked at random, as many independent clients behave.
    Random,
    /// The most recently used idle connection, as one client's pool behaves.
    Newest,
}

impl Reuse {
    /// The name on the command line (clap's, so it is spelled in one place).
    pub fn name(self) -> String {
        use clap::ValueEnum;
        self.to_possible_value()
            .map_or_else(String::new, |v| v.get_name().to_owned())
    }
}

/// The duration of a run given only a request count (`-n` without `-d`): it ends when
/// the count is reached, as ab's and loadtest's do; a day bounds a server that stopped
/// answering without a timeout.
pub const UNTIL_COUNT: Duration = Duration::from_secs(24 * 3600);

#[derive(Debug, Clone)]
pub struct Config {
    pub addr: SocketAddr,
    /// Value of the Host header.
    pub host: String,
    pub mix: Mix,
    pub mode: Mode,
    /// Closed loop: connections kept busy. Open loop: most connections opened.
    pub connections: usize,
    pub duration: Duration,
    /// Stop after this many requests in total (whichever comes first with `duration`).
    pub max_requests: Option<u64>,
    pub threads: usize,
    /// Per request; open loop counts it from the scheduled time.
    pub timeout: Duration,
    pub seed: u64,
    /// Extra request header lines, `Name: value`.
    pub headers: Vec<String>,
    /// Count responses per value of this response header (e.g. `x-worker`).
    pub count_header: Option<String>,
    /// Open loop: exponential gaps between due times (Poisson arrivals) instead of fixed.
    pub poisson: bool,
    /// Keep a live progress line on stderr (the caller checks that it is a terminal).
    pub progress: bool,
    /// An `https://` target: every connection starts with a TLS handshake.
    pub tls: Option<std::sync::Arc<crate::tls::TlsTarget>>,
    /// The method and body of every request (GET with none by default).
    pub payload: crate::http::Payload,
}

#[derive(Debug)]
pub enum RunError {
    Config(String),
    Runtime(std::io::Error),
    ThreadPanicked,
}

impl fmt::Display for RunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RunError::Config(s) => f.write_str(s),
            RunError::Runtime(e) => write!(f, "cannot start the runtime: {e}"),
            RunError::ThreadPanicked => f.write_str("a generator thread panicked"),
        }
    }
}

impl std::error::Error for RunError {}

/// Delay before the first request, so every thread's runtime is up when the clock starts.
const START_DELAY: Duration = Duration::from_millis(20);
/// Pause after a failed connect before a closed-loop connection tries again.
const CONNECT_BACKOFF: Duration = Duration::from_millis(10);
/// How often the progress line is redrawn.
const PROGRESS_EVERY: Duration = Duration::from_millis(250);

/// What the live progress line shows, updated by every generator thread as answers come.
/// A mutex around one histogram is cheap next to a network round trip, and only exists
/// when the line is shown.
struct Progress {
    requests: AtomicU64,
    errors: AtomicU64,
    latency: Mutex<Histogram<u64>>,
}

impl Progress {
    fn new() -> Progress {
        Progress {
            requests: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            latency: Mutex::new(new_histogram()),
        }
    }

    /// One line: time, requests, the rate over the last redraw, errors, p99 so far.
    fn line(&self, elapsed: Duration, rate: f64) -> String {
        let p99 = {
            let h = self.latency.lock().unwrap_or_else(|e| e.into_inner());
            if h.is_empty() {
                "-".to_string()
            } else {
                fmt_us(h.value_at_quantile(0.99))
            }
        };
        format!(
            "{:>6.1}s  {} requests  {rate:.0} req/s  {} errors  p99 {p99}",
            elapsed.as_secs_f64(),
            self.requests.load(Ordering::Relaxed),
            self.errors.load(Ordering::Relaxed),
        )
    }
}

/// Redraws the progress line on stderr with `\r` until `done`, then clears it.
fn show_progress(progress: &Progress, start: Instant, done: &AtomicBool) {
    let mut last = (Instant::now(), 0u64);
    while !done.load(Ordering::Relaxed) {
        std::thread::sleep(PROGRESS_EVERY);
        let now = Instant::now();
        let requests = progress.requests.load(Ordering::Relaxed);
        let rate = (requests - last.1) as f64 / now.duration_since(last.0).as_secs_f64();
        last = (now, requests);
        let line = progress.line(now.saturating_duration_since(start), rate);
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r{line}\x1b[K");
        let _ = err.flush();
    }
    let _ = write!(std::io::stderr(), "\r\x1b[K");
}

/// Runs the load and returns the merged report. Blocks the calling thread (the generator
/// uses threads of its own, so this may be called from anywhere, even inside a runtime
/// via `spawn_blocking`).
pub fn run(cfg: &Config) -> Result<Report, RunError> {
    validate(cfg)?;
    let cfg = Arc::new(cfg.clone());
    let budget = Arc::new(AtomicU64::new(0));
    let start = Instant::now() + START_DELAY;
    let progress = cfg.progress.then(|| Arc::new(Progress::new()));
    let done = Arc::new(AtomicBool::new(false));
    let printer = match &progress {
        Some(p) => {
            let (p, done) = (Arc::clone(p), Arc::clone(&done));
            let h = std::thread::Builder::new()
                .name("bench-progress".into())
                .spawn(move || show_progress(&p, start, &done))
                .map_err(RunError::Runtime)?;
            Some(h)
        }
        None => None,
    };
    let mut handles = Vec::with_capacity(cfg.threads);
    for k in 0..cfg.threads {
        let cfg = Arc::clone(&cfg);
        let budget = Arc::clone(&budget);
        let progress = progress.clone();
        let h = std::thread::Builder::new()
            .name(format!("bench-{k}"))
            .spawn(move || thread_main(&cfg, k, start, &budget, progress))
            .map_err(RunError::Runtime)?;
        handles.push(h);
    }
    let mut total = Stats::new(cfg.mix.len(), cfg.count_header.as_deref());
    let mut end = start;
    let mut outcome = Ok(());
    for h in handles {
        match h.join() {
            Ok(Ok((stats, last))) => {
                total.merge(&stats);
                end = end.max(last);
            }
            Ok(Err(e)) => outcome = Err(e),
            Err(_) => outcome = Err(RunError::ThreadPanicked),
        }
    }
    done.store(true, Ordering::Relaxed);
    if let Some(h) = printer {
        let _ = h.join();
    }
    outcome?;
    let elapsed = end
        .saturating_duration_since(start)
        .max(Duration::from_micros(1));
    Ok(report(&cfg, total, elapsed))
}

fn validate(cfg: &Config) -> Result<(), RunError> {
    if cfg.threads == 0 {
        return Err(RunError::Config("--threads must be at least 1".into()));
    }
    if cfg.connections == 0 {
        return Err(RunError::Config("--connections must be at least 1".into()));
    }
    if let Mode::Open { rate, .. } = cfg.mode {
        if !(rate.is_finite() && rate > 0.0) {
            return Err(RunError::Config("--rate must be a positive number".into()));
        }
    }
    if cfg.duration.is_zero() {
        return Err(RunError::Config(
            "--duration must be more than 0 (e.g. 10s)".into(),
        ));
    }
    if cfg.max_requests == Some(0) {
        return Err(RunError::Config("--requests must be at least 1".into()));
    }
    if cfg.timeout.is_zero() {
        return Err(RunError::Config(
            "--timeout must be more than 0 (e.g. 10s)".into(),
        ));
    }
    if cfg.mix.is_empty() {
        return Err(RunError::Config("no request path".into()));
    }
    if let Some(h) = &cfg.count_header {
        if !valid_header_name(h) {
            return Err(RunError::Config(format!(
                "--count-header {h:?} is not a header name"
            )));
        }
    }
    Ok(())
}

/// An HTTP header name: one or more token characters (RFC 9110).
pub fn valid_header_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

fn report(cfg: &Config, s: Stats, elapsed: Duration) -> Report {
    let paths: BTreeMap<String, PathReport> = cfg
        .mix
        .entries()
        .iter()
        .zip(s.per_path.iter().zip(&s.per_path_failed))
        .map(|(e, (h, failed))| {
            (
                e.path.clone(),
                PathReport {
                    weight: e.weight,
                    requests: h.len(),
                    without_response: *failed,
                    latency_us: Percentiles::of(h),
                },
            )
        })
        .collect();
    let open = matches!(cfg.mode, Mode::Open { .. });
    let elapsed_s = elapsed.as_secs_f64();
    let scheduled = |from: f64, to: f64| -> Option<u64> {
        let Mode::Open { rate, .. } = cfg.mode else {
            return None;
        };
        let within = |t: f64| {
            let t = Duration::from_secs_f64(t.min(cfg.duration.as_secs_f64()));
            let n = Schedule::total_within(rate, t);
            cfg.max_requests.map_or(n, |m| n.min(m))
        };
        Some(within(to) - within(from))
    };
    let intervals = interval_reports(s.intervals, elapsed_s, scheduled);
    Report {
        mode: if open { "open" } else { "closed" },
        target: cfg.addr.to_string(),
        method: cfg.payload.method.clone(),
        mix: cfg.mix.to_string(),
        threads: cfg.threads,
        connections: cfg.connections,
        rate: match cfg.mode {
            Mode::Open { rate, .. } => Some(rate),
            Mode::Closed => None,
        },
        reuse: match cfg.mode {
            Mode::Open { reuse, .. } => Some(reuse.name()),
            Mode::Closed => None,
        },
        // A run to a count had no set duration: it took what it took.
        duration_s: if cfg.duration == UNTIL_COUNT && cfg.max_requests.is_some() {
            (elapsed_s * 1e4).round() / 1e4
        } else {
            cfg.duration.as_secs_f64()
        },
        elapsed_s: (elapsed_s * 1e4).round() / 1e4,
        requests: s.requests,
        ok: s.ok,
        rps: ((s.requests as f64 / elapsed_s) * 10.0).round() / 10.0,
        bytes: s.bytes,
        bytes_per_s: (s.bytes as f64 / elapsed_s).round(),
        latency_us: Percentiles::of(&s.latency),
        service_us: open.then(|| Percentiles::of(&s.service)),
        errors: s.errors,
        errors_total: s.errors.total(),
        conn_waits: s.conn_waits,
        connections_opened: s.connections_opened,
        tls: cfg.tls.is_some().then_some(s.tls),
        status: s.status.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
        paths,
        header_counts: s.header_counts,
        spectrum: spectrum(&s.latency),
        intervals,
        admin: None,
        slo: Vec::new(),
        histogram: Some(s.latency),
    }
}

/// Per-thread state shared by that thread's tasks.
struct Local {
    cfg: Arc<Config>,
    requests: Vec<Vec<u8>>,
    stats: RefCell<Stats>,
    start: Instant,
    deadline: Instant,
    budget: Arc<AtomicU64>,
    /// Time the last response (or error) was seen.
    last: Cell<Instant>,
    progress: Option<Arc<Progress>>,
}

impl Local {
    /// Claims one request from the global budget; false when it is spent.
    fn claim(&self) -> bool {
        match self.cfg.max_requests {
            None => true,
            Some(max) => self.budget.fetch_add(1, Ordering::Relaxed) < max,
        }
    }

    fn done_at(&self, t: Instant) {
        if t > self.last.get() {
            self.last.set(t);
        }
    }

    /// The second of the run `t` falls in.
    fn interval(&self, t: Instant) -> usize {
        t.saturating_duration_since(self.start).as_secs() as usize
    }

    /// A response for path `pi` arrived at `now`; `from` is when its latency counts from
    /// (send or scheduled time), `sent` when it was written.
    fn record(&self, now: Instant, pi: usize, resp: &Response, from: Instant, sent: Instant) {
        self.done_at(now);
        let latency_us = now.saturating_duration_since(from).as_micros() as u64;
        self.stats.borrow_mut().record(&Outcome {
            path: pi,
            status: resp.status,
            tag: resp.tag.as_deref(),
            latency_us,
            service_us: now.saturating_duration_since(sent).as_micros() as u64,
            bytes: resp.bytes,
            interval: self.interval(now),
        });
        if let Some(p) = &self.progress {
            p.requests.fetch_add(1, Ordering::Relaxed);
            if !(200..300).contains(&resp.status) {
                p.errors.fetch_add(1, Ordering::Relaxed);
            }
            let mut h = p.latency.lock().unwrap_or_else(|e| e.into_inner());
            h.saturating_record(latency_us.max(1));
        }
    }

    /// A request failed at `now` without a response.
    fn fail(&self, now: Instant, pi: usize, kind: ErrorKind) {
        self.done_at(now);
        self.stats.borrow_mut().error(pi, kind, self.interval(now));
        if let Some(p) = &self.progress {
            p.errors.fetch_add(1, Ordering::Relaxed);
        }
    }
}

fn thread_main(
    cfg: &Arc<Config>,
    k: usize,
    start: Instant,
    budget: &Arc<AtomicU64>,
    progress: Option<Arc<Progress>>,
) -> Result<(Stats, Instant), RunError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(RunError::Runtime)?;
    let requests = cfg
        .mix
        .entries()
        .iter()
        .map(|e| build_request(&e.path, &cfg.host, &cfg.headers, &cfg.payload))
        .collect();
    let local = Rc::new(Local {
        cfg: Arc::clone(cfg),
        requests,
        stats: RefCell::new(Stats::new(cfg.mix.len(), cfg.count_header.as_deref())),
        start,
        deadline: start + cfg.duration,
        budget: Arc::clone(budget),
        last: Cell::new(start),
        progress,
    });
    let set = LocalSet::new();
    let l2 = Rc::clone(&local);
    set.block_on(&rt, async move {
        tokio::time::sleep_until(start.into()).await;
        match l2.cfg.mode {
            Mode::Closed => closed_loop(l2, k).await,
            Mode::Open { rate, reuse } => open_loop(l2, k, rate, reuse).await,
        }
    });
    drop(set);
    let last = local.last.get();
    let stats = local.stats.replace(Stats::new(0, None));
    Ok((stats, last))
}

// ---------------------------------------------------------------- closed loop

async fn closed_loop(l: Rc<Local>, k: usize) {
    let n = l.cfg.threads;
    let c = l.cfg.connections / n + usize::from(k < l.cfg.connections % n);
    let mut tasks = Vec::with_capacity(c);
    for i in 0..c {
        let id = (i * n + k) as u64;
        tasks.push(tokio::task::spawn_local(closed_conn(Rc::clone(&l), id)));
    }
    for t in tasks {
        let _ = t.await;
    }
}

async fn closed_conn(l: Rc<Local>, id: u64) {
    let mut rng = fastrand::Rng::with_seed(
        l.cfg
            .seed
            .wrapping_add(id.wrapping_mul(0x9E37_79B9_7F4A_7C15)),
    );
    let mut conn: Option<Conn> = None;
    while Instant::now() < l.deadline && l.claim() {
        let pi = l.cfg.mix.pick(&mut rng);
        let t0 = Instant::now();
        let deadline = t0 + l.cfg.timeout;
        if conn.is_none() {
            match tokio::time::timeout_at(
                deadline.into(),
                Conn::connect(l.cfg.addr, l.cfg.tls.as_deref()),
            )
            .await
            {
                Ok(Ok(c)) => {
                    l.stats.borrow_mut().opened(c.handshake());
                    conn = Some(c);
                }
                Ok(Err(_)) => {
                    l.fail(Instant::now(), pi, ErrorKind::Connect);
                    tokio::time::sleep(CONNECT_BACKOFF).await;
                    continue;
                }
                Err(_) => {
                    l.fail(Instant::now(), pi, ErrorKind::Timeout);
                    continue;
                }
            }
        }
        let Some(c) = conn.as_mut() else { continue };
        let sent = Instant::now();
        let r = tokio::time::timeout_at(
            deadline.into(),
            c.request(&l.requests[pi], l.cfg.count_header.as_deref()),
        )
        .await;
        let now = Instant::now();
        match r {
            Ok(Ok(resp)) => {
                l.record(now, pi, &resp, t0, sent);
                if !resp.keep_alive {
                    conn = None;
                }
            }
            Ok(Err(_)) => {
                l.fail(now, pi, ErrorKind::Io);
                conn = None;
            }
            Err(_) => {
                l.fail(now, pi, ErrorKind::Timeout);
                conn = None;
            }
        }
    }
}

// ---------------------------------------------------------------- open loop

/// An open-loop connection idle this long is closed instead of reused. Servers close idle
/// keep-alive connections too (Node's default after 5 s), and a request written just as
/// the server closes fails; staying below the common timeouts avoids counting that race
/// as the server's error (undici uses 4 s for the same reason).
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(4);

struct Pool {
    /// Connections with the time they went idle, most recent last.
    idle: RefCell<Vec<(Conn, Instant)>>,
    reuse: Reuse,
    rng: RefCell<fastrand::Rng>,
}

impl Pool {
    fn new(max_conns: usize, reuse: Reuse, seed: u64) -> Pool {
        Pool {
            idle: RefCell::new(Vec::with_capacity(max_conns)),
            reuse,
            rng: RefCell::new(fastrand::Rng::with_seed(seed)),
        }
    }

    /// An idle connection chosen as `reuse` says, closing any it meets that idled too long.
    fn take_idle(&self, now: Instant) -> Option<Conn> {
        let mut idle = self.idle.borrow_mut();
        while !idle.is_empty() {
            let i = match self.reuse {
                Reuse::Newest => idle.len() - 1,
                Reuse::Random => self.rng.borrow_mut().usize(..idle.len()),
            };
            let (conn, since) = idle.swap_remove(i);
            if now.duration_since(since) < POOL_IDLE_TIMEOUT {
                return Some(conn);
            }
            if self.reuse == Reuse::Newest {
                // Most recent last: once the newest is stale, all are.
                idle.clear();
            }
        }
        None
    }

    /// Puts a connection back. `Newest` keeps the vector ordered by idle time, so it
    /// appends; `Random` picks by index and does not care.
    fn put_idle(&self, conn: Conn, now: Instant) {
        self.idle.borrow_mut().push((conn, now));
    }
}

async fn open_loop(l: Rc<Local>, k: usize, rate: f64, reuse: Reuse) {
    let n = l.cfg.threads;
    let max_conns = l.cfg.connections / n + usize::from(k < l.cfg.connections % n);
    if max_conns == 0 {
        return;
    }
    let sched = Schedule::new(rate, n, k);
    let mut count = sched.count_within(l.cfg.duration, l.cfg.max_requests);
    // Poisson: each thread draws its own stream at rate / n (a sum of independent Poisson
    // streams is one), seeded apart from the path choice.
    let poisson = l.cfg.poisson.then(|| {
        Poisson::new(
            rate / n as f64,
            l.cfg.seed.wrapping_add(k as u64) ^ 0x9e37_79b9,
        )
    });
    if poisson.is_some() && l.cfg.max_requests.is_none() {
        count = u64::MAX; // the stream ends at the duration, however many it drew
    }
    let duration = l.cfg.duration;
    let pool_seed = l.cfg.seed.wrapping_add(k as u64).rotate_left(32);
    let pool = Rc::new(Pool::new(max_conns, reuse, pool_seed));
    // tokio's timer wheel has a 1 ms tick, which would make every request up to 1 ms
    // late (and, since latency counts from the due time, add that to every figure).
    // A plain thread sleeping with nanosleep (~50 µs slack) paces the sends instead and
    // hands each due time to the runtime.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Instant>();
    let start = l.start;
    let ticker = std::thread::Builder::new()
        .name(format!("bench-tick-{k}"))
        .spawn(move || {
            let mut poisson = poisson;
            for j in 0..count {
                let due = match poisson.as_mut() {
                    Some(p) => match p.next_due(duration) {
                        Some(d) => start + d,
                        None => return,
                    },
                    None => start + sched.due(j),
                };
                let now = Instant::now();
                if due > now {
                    std::thread::sleep(due - now);
                }
                if tx.send(due).is_err() {
                    return;
                }
            }
        });
    if ticker.is_err() {
        return;
    }
    // One sender per connection the thread may use, taking due requests in order. A
    // request that finds them all busy waits in `waiting`, not in a task and timer of
    // its own: past capacity (a stalled server, or a rate drover bench cannot reach)
    // those pile up by the hundred thousand, and ending them one timer at a time made a
    // 2 s run last 20 s.
    let waiting = Rc::new(Waiting::default());
    let senders: Vec<_> = (0..max_conns)
        .map(|_| {
            tokio::task::spawn_local(open_sender(
                Rc::clone(&l),
                Rc::clone(&pool),
                Rc::clone(&waiting),
            ))
        })
        .collect();
    let mut rng = fastrand::Rng::with_seed(l.cfg.seed.wrapping_add(k as u64));
    while let Some(due) = rx.recv().await {
        let pi = l.cfg.mix.pick(&mut rng);
        if waiting.idle.get() == 0 {
            l.stats.borrow_mut().conn_waits += 1;
        }
        waiting.due.borrow_mut().push_back((due, pi));
        waiting.wake.notify_one();
    }
    waiting.closed.set(true);
    waiting.wake.notify_waiters();
    for sender in senders {
        let _ = sender.await;
    }
}

/// Due requests no sender has taken yet, oldest first.
#[derive(Default)]
struct Waiting {
    due: RefCell<std::collections::VecDeque<(Instant, usize)>>,
    /// Senders waiting for a request.
    idle: Cell<usize>,
    wake: Notify,
    /// The schedule has ended: a sender that finds `due` empty stops.
    closed: Cell<bool>,
}

async fn open_sender(l: Rc<Local>, pool: Rc<Pool>, waiting: Rc<Waiting>) {
    loop {
        let next = waiting.due.borrow_mut().pop_front();
        match next {
            Some((due, pi)) => {
                let now = Instant::now();
                if now >= due + l.cfg.timeout {
                    // Its whole timeout passed before a connection was free.
                    l.fail(now, pi, ErrorKind::Unsent);
                    continue;
                }
                open_request(&l, &pool, due, pi).await;
            }
            None if waiting.closed.get() => return,
            None => {
                waiting.idle.set(waiting.idle.get() + 1);
                waiting.wake.notified().await;
                waiting.idle.set(waiting.idle.get() - 1);
            }
        }
    }
}

enum Failure {
    Connect,
    Io,
    Timeout,
}

async fn open_request(l: &Local, pool: &Pool, due: Instant, pi: usize) {
    let deadline = due + l.cfg.timeout;
    let work = async {
        let idle = pool.take_idle(Instant::now());
        let mut conn = match idle {
            Some(c) => c,
            None => {
                let c = Conn::connect(l.cfg.addr, l.cfg.tls.as_deref())
                    .await
                    .map_err(|_| Failure::Connect)?;
                l.stats.borrow_mut().opened(c.handshake());
                c
            }
        };
        let sent = Instant::now();
        let resp = conn
            .request(&l.requests[pi], l.cfg.count_header.as_deref())
            .await
            .map_err(|_| Failure::Io)?;
        if resp.keep_alive {
            pool.put_idle(conn, Instant::now());
        }
        Ok::<_, Failure>((resp, sent))
    };
    let r = match tokio::time::timeout_at(deadline.into(), work).await {
        Ok(r) => r,
        Err(_) => Err(Failure::Timeout),
    };
    let now = Instant::now();
    // Latency counts from `due`, the scheduled send time, not from `sent`: time spent
    // waiting for a connection, or behind a stalled server, is latency the client sees.
    match r {
        Ok((resp, sent)) => l.record(now, pi, &resp, due, sent),
        Err(Failure::Connect) => l.fail(now, pi, ErrorKind::Connect),
        Err(Failure::Io) => l.fail(now, pi, ErrorKind::Io),
        Err(Failure::Timeout) => l.fail(now, pi, ErrorKind::Timeout),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Three idle connections, the oldest stale, pushed oldest first.
    async fn pool_with_three(reuse: Reuse, addr: SocketAddr, now: Instant) -> Pool {
        let pool = Pool::new(4, reuse, 7);
        let stale = now - POOL_IDLE_TIMEOUT - Duration::from_millis(1);
        let fresh = now - Duration::from_millis(100);
        for since in [stale, fresh, fresh] {
            let c = Conn::connect(addr, None).await.unwrap();
            pool.put_idle(c, since);
        }
        pool
    }

    /// Runs `body` with the address of a listener that accepts (into its backlog) and
    /// never answers: enough for a pool that only opens and hands out connections.
    fn with_listener<F: std::future::Future<Output = ()>>(body: impl FnOnce(SocketAddr) -> F) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(body(addr));
    }

    #[test]
    fn pool_hands_out_fresh_connections_and_closes_stale_ones() {
        with_listener(|addr| async move {
            for reuse in [Reuse::Newest, Reuse::Random] {
                let now = Instant::now();
                let pool = pool_with_three(reuse, addr, now).await;
                assert!(pool.take_idle(now).is_some(), "{reuse:?}");
                assert!(pool.take_idle(now).is_some(), "{reuse:?}");
                // Only the stale one is left: it is closed, not handed out.
                assert!(pool.take_idle(now).is_none(), "{reuse:?}");
                assert!(pool.idle.borrow().is_empty(), "{reuse:?}");
            }
        });
    }

    /// `newest` keeps going back to the connection that answered last; `random` spreads
    /// over all idle ones (the point of the option: see `Reuse`).
    #[test]
    fn newest_reuses_one_connection_random_spreads_over_all() {
        with_listener(|addr| async move {
            for (reuse, want_distinct) in [(Reuse::Newest, 1), (Reuse::Random, 4)] {
                let pool = Pool::new(4, reuse, 7);
                for _ in 0..4 {
                    pool.put_idle(Conn::connect(addr, None).await.unwrap(), Instant::now());
                }
                let mut seen = std::collections::HashSet::new();
                for _ in 0..200 {
                    let c = pool.take_idle(Instant::now()).unwrap();
                    seen.insert(c.local_port());
                    pool.put_idle(c, Instant::now());
                }
                assert_eq!(seen.len(), want_distinct, "{reuse:?}");
            }
        });
    }
}
