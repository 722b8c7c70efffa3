//! What to run: one app's command, worker count, readiness, health and restart policy.

use drover_registry::{CheckKind, HealthCheck, HealthCheckError};
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fmt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The most workers one app may run (also the config file's bound).
pub const MAX_WORKERS: usize = 1024;

/// Whether an app may run `workers` workers: the one rule for a spec, a reload and a
/// scale.
pub fn check_workers(workers: usize) -> Result<(), SpecError> {
    if (1..=MAX_WORKERS).contains(&workers) {
        Ok(())
    } else {
        Err(SpecError::InvalidWorkers { workers })
    }
}

/// How many worker processes an app runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workers {
    /// `workers = "auto"`: one per available CPU.
    Auto,
    /// `workers = N`, with N in 1..=MAX_WORKERS (1024).
    Count(usize),
}

impl std::str::FromStr for Workers {
    type Err = String;

    /// `auto` (or `max`, PM2's `-i max`) or a count in 1..=MAX_WORKERS, as on the command
    /// line (`drover run -w 4`) and in a file (`workers = "auto"`); on the command line
    /// also PM2's `-i 0` (one per core) and `-i -1` (all cores but one).
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "auto" || s == "max" {
            return Ok(Workers::Auto);
        }
        match s.parse::<i64>().ok().and_then(Workers::pm2_instances) {
            Some(workers) => Ok(workers),
            None => Err(format!(
                "invalid workers {s:?}: expected a number in 1..={MAX_WORKERS}, \"auto\" (or \
                 PM2's \"max\" or 0: one per core), or -N (PM2's: all cores but N)"
            )),
        }
    }
}

impl Workers {
    /// PM2's instance count (`-i N`, `instances: N`): N workers, 0 for one per core, and
    /// -N for all cores but N (at least one). `None` past MAX_WORKERS either way.
    pub fn pm2_instances(n: i64) -> Option<Workers> {
        let max = MAX_WORKERS as i64;
        match n {
            0 => Some(Workers::Auto),
            1.. if n <= max => Some(Workers::Count(n as usize)),
            ..0 if n > -max => {
                let cores = std::thread::available_parallelism().map_or(1, |c| c.get()) as i64;
                Some(Workers::Count((cores + n).max(1) as usize))
            }
            _ => None,
        }
    }
}

impl Workers {
    /// The concrete number of workers to run on this machine.
    pub fn resolve(self) -> usize {
        match self {
            Workers::Count(n) => n,
            Workers::Auto => std::thread::available_parallelism().map_or(1, |n| n.get()),
        }
    }
}

/// How long a background worker (`Mode::Background`, no port to probe) must run before it
/// counts as up: PM2's `min_uptime` default. One that exits sooner failed to start.
pub const BACKGROUND_SETTLE: Duration = Duration::from_secs(1);

/// The text that, anywhere inside one of a command's arguments, becomes the worker's
/// port at every start (`["python3", "-m", "http.server", "{port}"]`), for programs
/// that take their port as a flag rather than from `PORT`.
///
/// Only the arguments, not the program: the program is looked up once, before any
/// worker starts, so that one that cannot start fails at once; a name that changed per
/// worker could not be checked then. There is no escape (`{{port}}` becomes `{8123}`):
/// an argument that needs the literal text is rare, and a shell builds it
/// (`sh -c 'echo "{"port}'`), while an escape rule would be one more thing to learn.
pub const PORT_PLACEHOLDER: &str = "{port}";

/// Whether an argument of `command` (after the program) holds [`PORT_PLACEHOLDER`].
pub fn command_uses_port(command: &[String]) -> bool {
    command
        .iter()
        .skip(1)
        .any(|arg| arg.contains(PORT_PLACEHOLDER))
}

/// `command`'s arguments with every [`PORT_PLACEHOLDER`] replaced by `port`; the
/// program as it is.
pub fn command_with_port(command: &[String], port: u16) -> Vec<String> {
    let port = port.to_string();
    command
        .iter()
        .enumerate()
        .map(|(i, arg)| match i {
            0 => arg.clone(),
            _ => arg.replace(PORT_PLACEHOLDER, &port),
        })
        .collect()
}

/// Why an `AppSpec` cannot work; its `Display` names the field.
#[derive(Debug, Clone, PartialEq)]
pub enum SpecError {
    /// The name is empty or holds '/', a space or a newline.
    InvalidName { name: String },
    /// The command is empty or its program is "".
    NoProgram,
    /// A worker count outside `1..=MAX_WORKERS`.
    InvalidWorkers { workers: usize },
    /// `ready_timeout` is zero.
    ZeroReadyTimeout,
    /// A health check in shared mode, where no worker has a port of its own.
    HealthInSharedMode,
    /// A health check in background mode, where no worker serves a port.
    HealthInBackground,
    /// The health check is invalid.
    Health(HealthCheckError),
    /// A `{port}` in the command's arguments in shared mode, where no worker has a port
    /// of its own to put there.
    PortInSharedMode,
    /// A `{port}` in the command's arguments in background mode, where no worker serves
    /// a port.
    PortInBackground,
    /// `max_memory` is `Some(0)`.
    ZeroMaxMemory,
    /// The restart back-off is invalid.
    Restart(BackoffError),
    /// A gRPC health check of workers that do not speak HTTP/2 (`h2c` is off).
    GrpcCheckNeedsH2c,
    /// `wait_ready` for workers that cannot send drover a message: not Node (`program`),
    /// or in shared or background mode, which have no cluster channel.
    WaitReadyNeedsNode { program: String, mode: Mode },
    /// `increment_var` names no variable, or `PORT` where drover sets each worker's.
    IncrementVar { var: String, mode: Mode },
    /// `increment_var`'s starting value is not a whole number.
    IncrementVarValue { var: String, value: String },
    /// `instance_var` names no variable, or one drover sets itself.
    InstanceVar { var: String },
    /// `node --watch` (`option`) in a mode that serves clients: Node runs the app in a
    /// child process of its own, which would bind the app's port itself, past drover.
    NodeWatchMode { option: String },
    /// `worker_ports` in shared or background mode, where no worker has a port of its
    /// own.
    WorkerPortsMode { mode: Mode },
    /// `worker_ports` holds fewer ports than the workers need, one more for a reload.
    WorkerPortsTooFew { ports: PortRange, workers: usize },
}

impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SpecError::InvalidName { name } => write!(
                f,
                "name {name:?} must be non-empty without '/', spaces or newlines"
            ),
            SpecError::NoProgram => f.write_str("command must name a program"),
            SpecError::InvalidWorkers { workers } => {
                write!(f, "workers must be in 1..={MAX_WORKERS}, not {workers}")
            }
            SpecError::ZeroReadyTimeout => f.write_str("ready_timeout must be greater than 0"),
            SpecError::HealthInSharedMode => {
                f.write_str("health checks need a port per worker, which shared mode does not have")
            }
            SpecError::HealthInBackground => f.write_str(
                "health checks need a port per worker, and in background mode the workers serve none",
            ),
            SpecError::Health(e) => write!(f, "health: {e}"),
            SpecError::PortInSharedMode => write!(
                f,
                "command: {PORT_PLACEHOLDER} needs a port per worker, which shared mode does not have (each worker accepts on the socket drover gives it as fd 3)"
            ),
            SpecError::PortInBackground => write!(
                f,
                "command: {PORT_PLACEHOLDER} needs a port per worker, and in background mode the workers serve none"
            ),
            SpecError::ZeroMaxMemory => f.write_str("max_memory must be greater than 0"),
            SpecError::Restart(e) => write!(f, "restart: {e}"),
            SpecError::GrpcCheckNeedsH2c => f.write_str(
                "health: the gRPC health protocol is spoken over HTTP/2, and these workers are reached in HTTP/1.1 (put the app behind a balancer with backend_protocol = \"h2c\")",
            ),
            SpecError::IncrementVar { var, mode } if var == "PORT" => write!(
                f,
                "increment_var: in {mode} mode each worker's PORT is drover's own loopback port (workers that bind PORT, PORT+1… themselves run in background mode)"
            ),
            SpecError::IncrementVar { var, .. } => write!(
                f,
                "increment_var {var:?}: the name of an environment variable (such as PORT)"
            ),
            SpecError::IncrementVarValue { var, value } => write!(
                f,
                "increment_var {var:?}: its value {value:?} is not a whole number to count up from"
            ),
            SpecError::InstanceVar { var } => write!(
                f,
                "instance_var {var:?}: the name of an environment variable for the worker's number (such as INSTANCE_ID), not PORT or one of drover's"
            ),
            SpecError::WorkerPortsMode { mode } => write!(
                f,
                "worker_ports: in {mode} mode no worker has a port of its own"
            ),
            SpecError::WorkerPortsTooFew { ports, workers } => write!(
                f,
                "worker_ports {ports} holds {} port(s), and {workers} worker(s) need {} \
                 (one each, and one more for the replacement a reload starts beside them)",
                ports.len(),
                workers + 1
            ),
            SpecError::NodeWatchMode { option } => write!(
                f,
                "command: node {option} runs the app in a child process of its own, which drover cannot make its worker (it would bind the app's port itself, past drover); drover's own watch reloads the workers one at a time, with no failed request, when a file changes: drover run --watch -- node app.js (in a drover.toml, watch = true)"
            ),
            SpecError::WaitReadyNeedsNode { program, mode } => match mode {
                Mode::Shared | Mode::Background => write!(
                    f,
                    "wait_ready: a worker says it is ready with process.send('ready') over Node's cluster channel, which {mode} mode does not open"
                ),
                _ => write!(
                    f,
                    "wait_ready: a worker says it is ready with process.send('ready') over Node's IPC channel, and {program} is not Node (drop wait_ready, or give the app a health path)"
                ),
            },
        }
    }
}

impl std::error::Error for SpecError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SpecError::Health(e) => Some(e),
            SpecError::Restart(e) => Some(e),
            _ => None,
        }
    }
}

/// One supervised app: `workers` copies of `command`, each on its own loopback port.
/// Also the settings of a drover.toml `[[app]]` table and of `drover run`'s flags: each
/// field, its doc and its default are defined here once.
#[derive(Debug, Clone, PartialEq)]
pub struct AppSpec {
    /// Names the app in logs, output prefixes (`[name/ID]`) and `DROVER_APP`. A
    /// drover.toml's is unique and matches `[a-z0-9_-]+`; balancers refer to it as
    /// `app:NAME`.
    pub name: String,
    /// Program and arguments, run directly (no shell). Wrap in `["sh", "-c", ...]` for one.
    /// In proxy mode, each `{port}` in an argument becomes the worker's port (see
    /// [`PORT_PLACEHOLDER`]). Never empty, and the program is never "" (`validate`).
    pub command: Vec<String>,
    /// How many worker processes to run; default `Workers::Count(1)`. A running
    /// supervisor's spec holds the count `Auto` resolved to when it was applied.
    pub workers: Workers,
    /// Working directory; drover's own when `None`.
    pub cwd: Option<PathBuf>,
    /// Extra environment on top of drover's. `PORT`, `DROVER_WORKER_ID` and `DROVER_APP`
    /// are set after these and win: a worker must listen where drover looks.
    pub env: BTreeMap<String, String>,
    /// Readiness is "the port accepts TCP", plus one passing probe of this check when set.
    /// Once ready, the check runs every `interval`; `fall` failures in a row restart the
    /// worker (that is how a hung event loop is caught). `None` by default: the open
    /// port is enough, since drover runs programs that may not serve any health route
    /// (a drover.toml `health` table without `path` checks `/health`).
    pub health: Option<HealthCheck>,
    /// How long a fresh worker may take to become ready before it is killed and counted
    /// as a failed start; default 30s.
    pub ready_timeout: Duration,
    /// Grace between SIGTERM and SIGKILL when drover stops a worker; default 10s.
    pub stop_timeout: Duration,
    /// During a rolling reload or a memory restart, how long the old worker may take to
    /// finish its in-flight requests (it gets no new ones) before SIGTERM; default 30s.
    pub drain_timeout: Duration,
    /// Replace a worker (gracefully, like a reload) once its RSS exceeds this many bytes;
    /// `None` by default.
    pub max_memory: Option<u64>,
    /// PM2's `wait_ready`: a Node worker gets clients only once its app has sent
    /// `process.send('ready')` (its database connected, its caches warm), not as soon
    /// as it listens. One that has not by `ready_timeout` (or after 3 s, while no other
    /// worker of the app serves) gets them anyway, with a warning, as under PM2: a
    /// `wait_ready` the code never answers must not restart the app forever, nor hold
    /// back its only capacity. Default `false`.
    pub wait_ready: bool,
    /// PM2's `increment_var`: this environment variable is the app's value (from
    /// `env`, else drover's own environment, else 0) plus the worker's number, so
    /// fork-mode instances of one app bind `PORT`, `PORT+1`… Not `PORT` where drover
    /// gives each worker its own. Default `None`.
    pub increment_var: Option<String>,
    /// PM2's `instance_var`: one more environment variable that carries the worker's
    /// number, as NODE_APP_INSTANCE does (apps written for it read, say,
    /// `INSTANCE_ID`). Default `None`.
    pub instance_var: Option<String>,
    /// How clients reach the workers; default `Mode::Auto`.
    pub mode: Mode,
    /// The wait before restarting a worker that crashed.
    pub restart: Backoff,
    /// The workers speak cleartext HTTP/2 only (gRPC servers): each health probe is a
    /// stream on a connection of its own, as the balancer's requests are. No key sets
    /// it: the config turns it on for an app behind a balancer whose backend_protocol
    /// is "h2c" (`drover run --backend-protocol h2c`). Default `false`: HTTP/1.1.
    pub h2c: bool,
    /// PM2's `watch`: the app is reloaded (rolling) when these files change. Default
    /// `None`.
    pub watch: Option<crate::watch::WatchSpec>,
    /// The largest request head the HTTP balancer in front of the app reads (its
    /// `limits.max_header_bytes`). A Node worker's preload says so when the app's own
    /// server takes larger ones (`maxHeaderSize`, `--max-http-header-size`), which
    /// drover would refuse with a 431. No key sets it: the config does, for an app
    /// behind an HTTP balancer. Default `None`.
    pub head_limit: Option<usize>,
    /// The app's Node process reads the user's own `PORT` (usually none), not drover's:
    /// where a balancer's address follows the app's `listen()` (`drover run` of a Node
    /// app without `--listen`, an ecosystem file's cluster-mode app), an app written
    /// `listen(process.env.PORT || 3000)` then names 3000 and is served there, as under
    /// `node app.js` and PM2. drover still reaches each worker at its own port, which
    /// the worker gets as `DROVER_WORKER_PORT`, and as `PORT` in a script runner (`npm
    /// start`: what it starts may not be Node), whose Node child the preload gives the
    /// user's back. Default `false`: `PORT` is drover's.
    pub users_port: bool,
    /// For a Node app that listens on several ports (an API, and a metrics server that
    /// may start first): the one whose server drover balances, at the balancer's
    /// address; the workers share the others, as under Node's cluster module. `None`:
    /// the first it listens on. Set by `drover run --app-port` and `app_port` in an
    /// `[[app]]`.
    pub app_port: Option<u16>,
    /// The loopback ports workers get their own from (`drover run --worker-ports`,
    /// `worker_ports`), for a host or firewall that allows only some: each worker's
    /// is one of these, or it does not start. `None`: 20000-32000 less the kernel's
    /// ephemeral range.
    pub worker_ports: Option<PortRange>,
}

/// A range of ports, `LOW-HIGH` as written (`worker_ports`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortRange {
    pub low: u16,
    pub high: u16,
}

impl PortRange {
    /// How many ports it holds.
    pub fn len(&self) -> usize {
        usize::from(self.high - self.low) + 1
    }

    pub fn is_empty(&self) -> bool {
        false
    }

    pub fn contains(&self, port: u16) -> bool {
        (self.low..=self.high).contains(&port)
    }
}

impl fmt::Display for PortRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.low, self.high)
    }
}

impl std::str::FromStr for PortRange {
    type Err = String;

    fn from_str(s: &str) -> Result<PortRange, String> {
        let bad =
            || format!("{s:?}: expected LOW-HIGH, two ports from 1 to 65535 (e.g. 24100-24199)");
        let (low, high) = s.trim().split_once('-').ok_or_else(bad)?;
        let port = |p: &str| p.trim().parse::<u16>().ok().filter(|&p| p > 0);
        let (low, high) = (port(low).ok_or_else(bad)?, port(high).ok_or_else(bad)?);
        if low > high {
            return Err(format!("{s:?}: LOW is above HIGH"));
        }
        Ok(PortRange { low, high })
    }
}

/// How clients reach the workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// As `Proxy`, and while the app's requests cost alike, the balancer hands client
    /// connections to workers that take connections themselves (a Node app, through
    /// drover-node), which then serve them with no drover in between; while some
    /// requests cost far more than others, it places each request. The default.
    #[default]
    Auto,
    /// Each worker listens on its own loopback `PORT`; a balancer in front picks one per
    /// request and sees every worker's load and health.
    Proxy,
    /// As `Proxy` (each worker has its own loopback `PORT`), and the balancer hands each
    /// new client connection to a worker that takes connections itself (a Node app,
    /// through drover-node), which then serves it with no drover in between.
    Handoff,
    /// drover binds a listening socket per worker on one address (a `SO_REUSEPORT`
    /// group) and hands each worker its own as fd 3 (`LISTEN_FDS=1`, `LISTEN_PID`);
    /// drover places new connections by the workers' load (see `steer`), with no proxy
    /// hop. No per-worker health checks or request-level balancing: drover does not see
    /// the requests.
    Shared,
    /// The workers serve no port: a queue consumer, a scheduler, a bot, what PM2 runs as
    /// a plain process. No `PORT`, no Node cluster channel, no balancer may name the app;
    /// a worker is up once it has run for `BACKGROUND_SETTLE`, and is restarted when it
    /// exits or outgrows `max_memory`.
    Background,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Auto => "auto",
            Mode::Proxy => "proxy",
            Mode::Handoff => "handoff",
            Mode::Shared => "shared",
            Mode::Background => "background",
        }
    }
}

impl std::str::FromStr for Mode {
    type Err = ParseModeError;

    fn from_str(s: &str) -> Result<Mode, ParseModeError> {
        match s {
            "auto" => Ok(Mode::Auto),
            "proxy" => Ok(Mode::Proxy),
            "handoff" => Ok(Mode::Handoff),
            "shared" => Ok(Mode::Shared),
            "background" => Ok(Mode::Background),
            _ => Err(ParseModeError {
                given: s.to_string(),
            }),
        }
    }
}

/// A mode other than "auto", "proxy", "handoff", "shared" or "background".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseModeError {
    pub given: String,
}

impl fmt::Display for ParseModeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown mode {:?}: expected \"auto\", \"proxy\", \"handoff\", \"shared\" or \"background\"",
            self.given
        )
    }
}

impl std::error::Error for ParseModeError {}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl AppSpec {
    /// One worker of `command` with default timings and no health check.
    pub fn new(name: impl Into<String>, command: Vec<String>) -> AppSpec {
        AppSpec {
            name: name.into(),
            command,
            workers: Workers::Count(1),
            cwd: None,
            env: BTreeMap::new(),
            health: None,
            // Generous enough for a JVM or a big Node app; a worker that never listens is
            // still caught, just not instantly.
            ready_timeout: Duration::from_secs(30),
            // Docker's default: long enough to finish normal requests.
            stop_timeout: Duration::from_secs(10),
            drain_timeout: Duration::from_secs(30),
            max_memory: None,
            wait_ready: false,
            increment_var: None,
            instance_var: None,
            mode: Mode::Auto,
            restart: Backoff::default(),
            h2c: false,
            head_limit: None,
            watch: None,
            users_port: false,
            app_port: None,
            worker_ports: None,
        }
    }

    /// This spec with `workers` as the count it means on this machine: what a
    /// supervisor keeps, since its slots are a number and a reload compares numbers.
    pub(crate) fn resolved(mut self) -> AppSpec {
        self.workers = Workers::Count(self.workers.resolve());
        self.command = with_interpreter(&self.command, self.cwd.as_deref());
        self
    }

    /// Rejects settings that cannot work, naming the field, for the config layer.
    pub fn validate(&self) -> Result<(), SpecError> {
        if self.name.is_empty() || self.name.contains(['/', ' ', '\n']) {
            return Err(SpecError::InvalidName {
                name: self.name.clone(),
            });
        }
        if self.command.first().is_none_or(|p| p.is_empty()) {
            return Err(SpecError::NoProgram);
        }
        check_workers(self.workers.resolve())?;
        if self.ready_timeout.is_zero() {
            return Err(SpecError::ZeroReadyTimeout);
        }
        if let Some(check) = &self.health {
            match self.mode {
                Mode::Shared => return Err(SpecError::HealthInSharedMode),
                Mode::Background => return Err(SpecError::HealthInBackground),
                Mode::Auto | Mode::Proxy | Mode::Handoff => {}
            }
            check.validate().map_err(SpecError::Health)?;
            if matches!(check.kind, CheckKind::Grpc { .. }) && !self.h2c {
                return Err(SpecError::GrpcCheckNeedsH2c);
            }
        }
        if command_uses_port(&self.command) {
            match self.mode {
                Mode::Shared => return Err(SpecError::PortInSharedMode),
                Mode::Background => return Err(SpecError::PortInBackground),
                Mode::Auto | Mode::Proxy | Mode::Handoff => {}
            }
        }
        if self.max_memory == Some(0) {
            return Err(SpecError::ZeroMaxMemory);
        }
        if self.mode != Mode::Background {
            if let Some(option) = drover_node::watch_mode_option(&self.command) {
                return Err(SpecError::NodeWatchMode { option });
            }
        }
        if let Some(var) = &self.increment_var {
            let drovers_port = var == "PORT" && self.mode != Mode::Background;
            if drovers_port || var.is_empty() || var.contains(['=', '\0']) {
                return Err(SpecError::IncrementVar {
                    var: var.clone(),
                    mode: self.mode,
                });
            }
            self.increment_base()?;
        }
        if let Some(var) = &self.instance_var {
            let drovers = var == "PORT" || var.starts_with("DROVER_");
            if drovers || var.is_empty() || var.contains(['=', '\0']) {
                return Err(SpecError::InstanceVar { var: var.clone() });
            }
        }
        if let Some(ports) = self.worker_ports {
            if matches!(self.mode, Mode::Shared | Mode::Background) {
                return Err(SpecError::WorkerPortsMode { mode: self.mode });
            }
            let workers = self.workers.resolve();
            if ports.len() <= workers {
                return Err(SpecError::WorkerPortsTooFew { ports, workers });
            }
        }
        let no_channel = matches!(self.mode, Mode::Shared | Mode::Background);
        if self.wait_ready && (no_channel || !self.runs_in_node()) {
            return Err(SpecError::WaitReadyNeedsNode {
                program: self.program(),
                mode: self.mode,
            });
        }
        self.restart.validate().map_err(SpecError::Restart)
    }
}

impl AppSpec {
    /// `increment_var`'s starting value: the app's `env`, else drover's own, else 0.
    fn increment_base(&self) -> Result<i64, SpecError> {
        let Some(var) = &self.increment_var else {
            return Ok(0);
        };
        let value = match self.env.get(var) {
            Some(v) => v.clone(),
            None => std::env::var(var).unwrap_or_default(),
        };
        if value.trim().is_empty() {
            return Ok(0);
        }
        value
            .trim()
            .parse()
            .map_err(|_| SpecError::IncrementVarValue {
                var: var.clone(),
                value,
            })
    }

    /// `increment_var` and its value for worker `id`, as PM2 counts its instances.
    pub(crate) fn incremented(&self, id: usize) -> Option<(&str, String)> {
        let var = self.increment_var.as_deref()?;
        let base = self.increment_base().ok()?;
        Some((var, (base + id as i64).to_string()))
    }
}

/// Why an app's program cannot be started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProgramError {
    /// A name without a slash that no directory of `PATH` holds as an executable file.
    NotInPath { program: String, path: String },
    /// A path (absolute, or relative to the app's cwd) where no file is.
    NotFound { path: PathBuf },
    /// A file that is not a regular file with an execute bit, such as a directory or a
    /// script without `chmod +x`.
    NotExecutable { path: PathBuf },
}

impl fmt::Display for ProgramError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProgramError::NotInPath { program, path } => {
                write!(f, "program {program:?} not found in PATH ({path})")
            }
            ProgramError::NotFound { path } => {
                write!(f, "program {} not found", path.display())
            }
            ProgramError::NotExecutable { path } => {
                write!(f, "program {} is not executable", path.display())
            }
        }
    }
}

impl std::error::Error for ProgramError {}

/// glibc's `execvp` search path when `PATH` is unset.
const DEFAULT_PATH: &str = "/bin:/usr/bin";

impl AppSpec {
    /// The program the spawn runs: the command's first word, or a script's interpreter
    /// (`resolved`: `app.js` runs as `node app.js`); empty for an empty command.
    fn program(&self) -> String {
        let command = with_interpreter(&self.command, self.cwd.as_deref());
        command.into_iter().next().unwrap_or_default()
    }

    /// Whether the worker's program runs in Node: Node itself or a script runner by its
    /// name (`node`, `npm`), or a program whose `#!` line runs Node, found as the spawn
    /// will find it (`ts-node app.ts`, `next start -p 3000`, `react-router-serve`, from
    /// `node_modules/.bin` or PATH). Its app's `listen()` then asks drover where to listen.
    pub fn runs_in_node(&self) -> bool {
        let program = self.program();
        drover_node::is_node_program(&program)
            || self
                .resolve_program()
                .is_ok_and(|path| drover_node::starts_node(&path))
    }

    /// Whether the worker's program is a Node program that runs the app in a Node process
    /// below it: a package manager or tsx by its name, or a Node command that runs the
    /// command it is given (`nest start`, `cross-env NODE_ENV=production node app.js`),
    /// by its name and its `#!` line. drover's channel then goes past it to the app.
    pub fn runs_app_below(&self) -> bool {
        let program = self.program();
        drover_node::is_script_runner(&program)
            || (drover_node::is_node_wrapper_name(&program)
                && self
                    .resolve_program()
                    .is_ok_and(|path| drover_node::starts_node(&path)))
    }

    /// Finds the program the spawn will run, the way `execvp` does: a name with a slash
    /// is a path (a relative one from the app's `cwd`, where the worker starts); a bare
    /// name is searched in `PATH` (the app's own `env` PATH when it sets one, as std's
    /// spawn does). Checked once before any worker starts, so a program that can never
    /// start fails `drover up` at once instead of restarting forever.
    ///
    /// "Executable" means a regular file with an execute bit; a file whose bits exclude
    /// drover's user still fails at spawn, as a crash loop.
    pub fn resolve_program(&self) -> Result<PathBuf, ProgramError> {
        let program = self.program();
        let program = program.as_str();
        if program.contains('/') {
            let path = match &self.cwd {
                // Through components() to drop the "." of "./serve.sh" from the message.
                Some(cwd) => cwd.join(program).components().collect(),
                None => PathBuf::from(program),
            };
            return match executable(&path) {
                Some(true) => Ok(path),
                Some(false) => Err(ProgramError::NotExecutable { path }),
                None => Err(ProgramError::NotFound { path }),
            };
        }
        let search = self
            .env
            .get("PATH")
            .map(OsString::from)
            .or_else(|| std::env::var_os("PATH"))
            .unwrap_or_else(|| DEFAULT_PATH.into());
        let mut not_executable = None;
        for dir in std::env::split_paths(&search) {
            // An empty entry means the current directory, as for execvp.
            let dir = match (dir.as_os_str().is_empty(), &self.cwd) {
                (true, Some(cwd)) => cwd.clone(),
                (true, None) => PathBuf::from("."),
                (false, _) if dir.is_relative() => match &self.cwd {
                    Some(cwd) => cwd.join(dir),
                    None => dir,
                },
                (false, _) => dir,
            };
            let candidate = dir.join(program);
            match executable(&candidate) {
                Some(true) => return Ok(candidate),
                Some(false) if !candidate.is_dir() => {
                    not_executable.get_or_insert(candidate);
                }
                Some(false) => {}
                None => {}
            }
        }
        // execvp reports EACCES when it saw a match it could not run and nothing better.
        Err(match not_executable {
            Some(path) => ProgramError::NotExecutable { path },
            None => ProgramError::NotInPath {
                program: program.to_string(),
                path: search.to_string_lossy().into_owned(),
            },
        })
    }
}

/// The interpreter of a script by its extension: PM2's table (`lib/API/interpreter.json`),
/// with Python 3's name as Debian has it, and no TypeScript (which needs a runner:
/// `npx tsx app.ts`).
const INTERPRETERS: [(&str, &str); 8] = [
    ("js", "node"),
    ("cjs", "node"),
    ("mjs", "node"),
    ("py", "python3"),
    ("rb", "ruby"),
    ("sh", "bash"),
    ("php", "php"),
    ("pl", "perl"),
];

/// `command` with an interpreter in front when its program is a script that cannot run
/// by itself, as `pm2 start app.js` runs `node app.js`: a file (found from `cwd`) with an
/// extension of `INTERPRETERS`, either without an execute bit, or named without a
/// slash (exec would look for `app.js` in `PATH`, not here). Any other command is
/// returned as it is.
pub fn with_interpreter(command: &[String], cwd: Option<&Path>) -> Vec<String> {
    let Some(program) = command.first() else {
        return command.to_vec();
    };
    let path = match cwd {
        Some(cwd) => cwd.join(program),
        None => PathBuf::from(program),
    };
    let interpreter = path
        .extension()
        .and_then(|e| e.to_str())
        .and_then(|e| INTERPRETERS.iter().find(|(ext, _)| *ext == e))
        .map(|(_, interpreter)| *interpreter);
    match (interpreter, executable(&path)) {
        (Some(interpreter), Some(runs)) if path.is_file() && (!runs || !program.contains('/')) => {
            std::iter::once(interpreter.to_string())
                .chain(command.iter().cloned())
                .collect()
        }
        _ => command.to_vec(),
    }
}

/// `Some(true)`: a regular file with an execute bit; `Some(false)`: something else is
/// there; `None`: nothing is (or it cannot be looked at).
fn executable(path: &Path) -> Option<bool> {
    let meta = std::fs::metadata(path).ok()?;
    Some(meta.is_file() && meta.permissions().mode() & 0o111 != 0)
}

/// Exponential back-off between restarts.
///
/// A worker that exits (or is killed for failing readiness or health) less than
/// `min_uptime` after it became ready counts as a crash; each crash in a row multiplies
/// the delay by `factor` up to `max`. A worker that served longer than `min_uptime`
/// resets the streak: one crash after a day of service should not wait 30 s.
#[derive(Debug, Clone, PartialEq)]
pub struct Backoff {
    pub initial: Duration,
    pub max: Duration,
    pub factor: f64,
    pub min_uptime: Duration,
    /// After this many crashes in a row the worker is reported as crash-looping (status
    /// and a warn log). It keeps being restarted at the back-off pace.
    pub crash_loop_after: u32,
    /// After this many restarts in a row that crashed (PM2's `max_restarts`), the
    /// worker is `errored` and not started again until a reload or a scale; when every
    /// worker of every app is, drover exits 1 (as `pm2-runtime` does), for a container's
    /// restart policy or systemd to act on. `None` (the default): restarted for as long
    /// as drover runs, which never takes capacity away by itself.
    pub max_restarts: Option<u32>,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(30),
            factor: 2.0,
            min_uptime: Duration::from_secs(1),
            crash_loop_after: 5,
            max_restarts: None,
        }
    }
}

impl Backoff {
    /// The wait before the next start after `crashes` crashes in a row (0 after a worker
    /// that lived long enough, which waits `initial` like the first crash).
    pub fn delay(&self, crashes: u32) -> Duration {
        let exp = crashes.saturating_sub(1).min(64) as i32;
        let secs = self.initial.as_secs_f64() * self.factor.max(1.0).powi(exp);
        // `secs` can overflow to infinity for big streaks; clamp before converting.
        if !secs.is_finite() || secs >= self.max.as_secs_f64() {
            self.max.max(self.initial)
        } else {
            Duration::from_secs_f64(secs)
        }
    }

    pub fn validate(&self) -> Result<(), BackoffError> {
        if !self.factor.is_finite() || self.factor < 1.0 {
            return Err(BackoffError::FactorBelowOne {
                factor: self.factor,
            });
        }
        if self.max < self.initial {
            return Err(BackoffError::MaxBelowInitial);
        }
        if self.crash_loop_after == 0 {
            return Err(BackoffError::ZeroCrashLoopAfter);
        }
        Ok(())
    }
}

/// Why a `Backoff` cannot work; its `Display` names the field.
#[derive(Debug, Clone, PartialEq)]
pub enum BackoffError {
    /// `factor` is below 1 or not finite.
    FactorBelowOne { factor: f64 },
    /// `max` is less than `initial`.
    MaxBelowInitial,
    /// `crash_loop_after` is zero.
    ZeroCrashLoopAfter,
}

impl fmt::Display for BackoffError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BackoffError::FactorBelowOne { factor } => {
                write!(f, "factor {factor} must be at least 1")
            }
            BackoffError::MaxBelowInitial => f.write_str("max must not be less than initial"),
            BackoffError::ZeroCrashLoopAfter => f.write_str("crash_loop_after must be at least 1"),
        }
    }
}

impl std::error::Error for BackoffError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workers_parse_as_counts_or_one_per_core() {
        assert_eq!("4".parse(), Ok(Workers::Count(4)));
        assert_eq!("auto".parse(), Ok(Workers::Auto));
        assert_eq!("max".parse(), Ok(Workers::Auto));
        // PM2's -i 0 and -i -N.
        assert_eq!("0".parse(), Ok(Workers::Auto));
        let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
        assert_eq!("-1".parse(), Ok(Workers::Count((cores - 1).max(1))));
        assert_eq!("-64".parse(), Ok(Workers::Count(1)));
        for bad in ["1025", "-1024", "all", "", "1.5"] {
            let e = bad.parse::<Workers>().unwrap_err();
            assert!(e.contains("expected a number in 1..=1024"), "{bad}: {e}");
        }
    }

    #[test]
    fn wait_ready_needs_a_node_worker_with_a_cluster_channel() {
        let spec = |command: &[&str], mode: Mode| AppSpec {
            wait_ready: true,
            mode,
            ..AppSpec::new("api", command.iter().map(|w| w.to_string()).collect())
        };
        assert_eq!(spec(&["node", "app.js"], Mode::Auto).validate(), Ok(()));
        assert_eq!(spec(&["npm", "start"], Mode::Proxy).validate(), Ok(()));
        for (command, mode) in [
            (&["python3", "app.py"][..], Mode::Auto),
            (&["node", "app.js"][..], Mode::Background),
            (&["node", "app.js"][..], Mode::Shared),
        ] {
            let e = spec(command, mode).validate().unwrap_err();
            assert!(
                matches!(e, SpecError::WaitReadyNeedsNode { .. }),
                "{command:?} {mode}: {e}"
            );
        }
    }

    #[test]
    fn instance_var_names_a_variable_of_the_apps_own() {
        let spec = |var: &str| AppSpec {
            instance_var: Some(var.to_string()),
            ..AppSpec::new("api", vec!["node".into(), "api.js".into()])
        };
        assert_eq!(spec("INSTANCE_ID").validate(), Ok(()));
        for bad in ["", "PORT", "DROVER_WORKER_ID", "A=B"] {
            let e = spec(bad).validate().unwrap_err();
            assert!(
                matches!(e, SpecError::InstanceVar { .. })
                    && e.to_string().contains("instance_var"),
                "{bad:?}: {e}"
            );
        }
    }

    #[test]
    fn increment_var_counts_up_from_the_apps_value_as_pm2_does() {
        let spec = |var: &str, mode: Mode, port: Option<&str>| {
            let mut s = AppSpec {
                increment_var: Some(var.to_string()),
                mode,
                ..AppSpec::new("api", vec!["node".into(), "api.js".into()])
            };
            if let Some(p) = port {
                s.env.insert(var.to_string(), p.to_string());
            }
            s
        };
        let s = spec("PORT", Mode::Background, Some("4100"));
        assert_eq!(s.validate(), Ok(()));
        assert_eq!(s.incremented(0), Some(("PORT", "4100".to_string())));
        assert_eq!(s.incremented(3), Some(("PORT", "4103".to_string())));
        let s = spec("DROVER_TEST_UNSET_VAR", Mode::Auto, None);
        assert_eq!(
            s.incremented(2),
            Some(("DROVER_TEST_UNSET_VAR", "2".to_string()))
        );
        for (s, needle) in [
            (
                spec("PORT", Mode::Auto, Some("4100")),
                "each worker's PORT is drover's own",
            ),
            (
                spec("PORT", Mode::Background, Some("http")),
                "its value \"http\" is not a whole number",
            ),
            (
                spec("", Mode::Background, None),
                "the name of an environment variable",
            ),
        ] {
            let e = s.validate().unwrap_err().to_string();
            assert!(e.contains(needle), "{e}");
        }
    }

    #[test]
    fn backoff_grows_and_caps() {
        let b = Backoff::default();
        let ms = |n| b.delay(n).as_millis();
        assert_eq!(
            [ms(0), ms(1), ms(2), ms(3), ms(4)],
            [100, 100, 200, 400, 800]
        );
        assert_eq!(b.delay(9), Duration::from_millis(25_600));
        assert_eq!(b.delay(10), Duration::from_secs(30));
        assert_eq!(b.delay(u32::MAX), Duration::from_secs(30));
    }

    #[test]
    fn a_script_named_as_the_program_gets_its_interpreter_as_under_pm2() {
        let dir = std::env::temp_dir().join(format!("drover-interp-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("src")).unwrap();
        let write = |name: &str, mode: u32| {
            let path = dir.join(name);
            std::fs::write(&path, "x\n").unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        };
        write("app.js", 0o644);
        write("src/server.mjs", 0o644);
        write("app.py", 0o644);
        write("run.sh", 0o755);
        write("app.ts", 0o644);
        std::fs::create_dir_all(dir.join("dir.js")).unwrap();
        let cmd = |words: &[&str]| -> Vec<String> {
            let words: Vec<String> = words.iter().map(|w| w.to_string()).collect();
            with_interpreter(&words, Some(&dir))
        };
        assert_eq!(cmd(&["app.js", "3000"]), ["node", "app.js", "3000"]);
        assert_eq!(cmd(&["./src/server.mjs"]), ["node", "./src/server.mjs"]);
        assert_eq!(cmd(&["app.py"]), ["python3", "app.py"]);
        // Named without a slash, exec would search PATH for it.
        assert_eq!(cmd(&["run.sh"]), ["bash", "run.sh"]);
        // Executable and named as a path: its own #! line runs it.
        assert_eq!(cmd(&["./run.sh"]), ["./run.sh"]);
        // Left as they are: no interpreter known, no such file, a directory, a program.
        assert_eq!(cmd(&["app.ts"]), ["app.ts"]);
        assert_eq!(cmd(&["missing.js"]), ["missing.js"]);
        assert_eq!(cmd(&["dir.js"]), ["dir.js"]);
        assert_eq!(cmd(&["node", "app.js"]), ["node", "app.js"]);
        let mut spec = AppSpec::new("web", vec!["app.js".into()]);
        spec.cwd = Some(dir.clone());
        assert_eq!(spec.resolved().command, ["node", "app.js"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_program_runs_in_node_by_its_name_or_its_first_line_found_as_spawned() {
        let dir = std::env::temp_dir().join(format!("drover-node-spec-{}", std::process::id()));
        let bin = dir.join("node_modules/.bin");
        std::fs::create_dir_all(&bin).unwrap();
        for (name, head) in [
            ("ts-node", "#!/usr/bin/env node\n"),
            ("serve", "#!/bin/sh\n"),
            ("cross-env", "#!/usr/bin/env node\n"),
            // python-dotenv's command, by the name of dotenv-cli's.
            ("dotenv", "#!/usr/bin/python3\n"),
        ] {
            std::fs::write(bin.join(name), head).unwrap();
            std::fs::set_permissions(bin.join(name), std::fs::Permissions::from_mode(0o755))
                .unwrap();
        }
        let spec = |cmd: &[&str]| {
            let mut s = AppSpec::new("web", cmd.iter().map(|w| w.to_string()).collect());
            s.cwd = Some(dir.clone());
            s.env
                .insert("PATH".into(), "node_modules/.bin:/usr/bin:/bin".into());
            s
        };
        // By its path from the app's directory, and by its name on the app's PATH.
        assert!(spec(&["./node_modules/.bin/ts-node", "app.ts"]).runs_in_node());
        assert!(spec(&["ts-node", "app.ts"]).runs_in_node());
        assert!(!spec(&["./node_modules/.bin/serve"]).runs_in_node());
        assert!(!spec(&["serve"]).runs_in_node());
        assert!(!spec(&["./missing"]).runs_in_node());
        // By name, whether or not it is installed; a script by its interpreter.
        assert!(spec(&["node", "app.js"]).runs_in_node());
        assert!(spec(&["npm", "start"]).runs_in_node());
        std::fs::write(dir.join("app.js"), "").unwrap();
        assert!(spec(&["app.js"]).runs_in_node());
        assert!(!spec(&["sh", "-c", "node app.js"]).runs_in_node());
        // Which of them run the app in a Node process below them: drover's channel goes
        // past them to it.
        assert!(spec(&["npm", "start"]).runs_app_below());
        assert!(spec(&["cross-env", "NODE_ENV=production", "node", "app.js"]).runs_app_below());
        assert!(!spec(&["dotenv", "run", "python3", "app.py"]).runs_app_below());
        assert!(!spec(&["dotenv", "run", "python3", "app.py"]).runs_in_node());
        assert!(!spec(&["ts-node", "app.ts"]).runs_app_below());
        assert!(!spec(&["node", "app.js"]).runs_app_below());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn programs_resolve_like_execvp() {
        let dir = std::env::temp_dir().join(format!("drover-spec-{}", std::process::id()));
        let bin = dir.join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        let write = |path: &Path, mode: u32| {
            std::fs::write(path, "#!/bin/sh\n").unwrap();
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
        };
        write(&bin.join("serve"), 0o755);
        write(&bin.join("plain"), 0o644);
        let spec = |cmd: &str| {
            let mut s = AppSpec::new("web", vec![cmd.into()]);
            s.cwd = Some(dir.clone());
            // The app's own PATH is searched, and a relative entry is from its cwd.
            s.env.insert("PATH".into(), "/nonexistent:bin".into());
            s
        };
        assert_eq!(spec("serve").resolve_program(), Ok(dir.join("bin/serve")));
        assert_eq!(
            spec("./bin/serve").resolve_program(),
            Ok(dir.join("bin/serve"))
        );
        assert_eq!(
            spec("plain").resolve_program(),
            Err(ProgramError::NotExecutable {
                path: dir.join("bin/plain")
            })
        );
        assert!(matches!(
            spec("missing").resolve_program(),
            Err(ProgramError::NotInPath { .. })
        ));
        assert_eq!(
            spec("bin").resolve_program().unwrap_err().to_string(),
            "program \"bin\" not found in PATH (/nonexistent:bin)"
        );
        assert_eq!(
            spec("./bin").resolve_program(),
            Err(ProgramError::NotExecutable {
                path: dir.join("bin")
            })
        );
        assert_eq!(
            spec("/nonexistent/x").resolve_program(),
            Err(ProgramError::NotFound {
                path: "/nonexistent/x".into()
            })
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn port_placeholders_become_the_port_in_arguments_only() {
        let cmd: Vec<String> = [
            "{port}",
            "-p",
            "{port}",
            "--bind=127.0.0.1:{port}",
            "{{port}}",
            "{PORT}",
            "port",
        ]
        .map(String::from)
        .to_vec();
        assert!(command_uses_port(&cmd));
        assert_eq!(
            command_with_port(&cmd, 8123),
            [
                "{port}",
                "-p",
                "8123",
                "--bind=127.0.0.1:8123",
                "{8123}",
                "{PORT}",
                "port"
            ]
        );
        // Twice in one argument: both.
        assert_eq!(
            command_with_port(&["sh".into(), "-c".into(), "a {port} b {port}".into()], 1),
            ["sh", "-c", "a 1 b 1"]
        );
        assert!(!command_uses_port(&["{port}".into(), "x".into()]));
        assert!(!command_uses_port(&[]));
        assert_eq!(command_with_port(&[], 1), Vec::<String>::new());
    }

    #[test]
    fn validation_names_the_field() {
        let ok = AppSpec::new("pi", vec!["node".into(), "app.js".into()]);
        assert!(ok.validate().is_ok());
        let empty = AppSpec::new("pi", vec![]);
        assert_eq!(empty.validate(), Err(SpecError::NoProgram));
        assert_eq!(
            empty.validate().unwrap_err().to_string(),
            "command must name a program"
        );
        let zero = AppSpec {
            workers: Workers::Count(0),
            ..ok.clone()
        };
        assert_eq!(
            zero.validate(),
            Err(SpecError::InvalidWorkers { workers: 0 })
        );
        assert_eq!(
            zero.validate().unwrap_err().to_string(),
            "workers must be in 1..=1024, not 0"
        );
        // A gRPC check is an HTTP/2 call: workers reached in HTTP/1.1 cannot take it.
        let mut grpc = ok.clone();
        grpc.health = Some(HealthCheck {
            kind: CheckKind::Grpc { service: "".into() },
            ..HealthCheck::default()
        });
        assert_eq!(grpc.validate(), Err(SpecError::GrpcCheckNeedsH2c));
        assert!(grpc
            .validate()
            .unwrap_err()
            .to_string()
            .contains("backend_protocol = \"h2c\""));
        grpc.h2c = true;
        assert!(grpc.validate().is_ok());
        let slash = AppSpec::new("a/b", vec!["x".into()]);
        assert!(matches!(
            slash.validate(),
            Err(SpecError::InvalidName { .. })
        ));
        assert!(slash.validate().unwrap_err().to_string().contains("name"));
        let mut bad = ok.clone();
        bad.restart.factor = 0.5;
        assert_eq!(
            bad.validate(),
            Err(SpecError::Restart(BackoffError::FactorBelowOne {
                factor: 0.5
            }))
        );
        assert_eq!(
            bad.validate().unwrap_err().to_string(),
            "restart: factor 0.5 must be at least 1"
        );
        let mut bad = ok;
        bad.health = Some(HealthCheck {
            fall: 0,
            ..HealthCheck::default()
        });
        assert_eq!(
            bad.validate(),
            Err(SpecError::Health(HealthCheckError::ZeroRiseOrFall))
        );
        assert_eq!(
            bad.validate().unwrap_err().to_string(),
            "health: rise and fall must be at least 1"
        );
        let mut shared = AppSpec::new("s", vec!["app".into(), "--bind=127.0.0.1:{port}".into()]);
        shared.mode = Mode::Shared;
        assert_eq!(shared.validate(), Err(SpecError::PortInSharedMode));
        assert_eq!(
            shared.validate().unwrap_err().to_string(),
            "command: {port} needs a port per worker, which shared mode does not have (each worker accepts on the socket drover gives it as fd 3)"
        );
        // The program is never substituted, so a `{port}` there is no shared-mode error.
        shared.command = vec!["{port}".into(), "--port".into(), "8000".into()];
        assert_eq!(shared.validate(), Ok(()));
        shared.mode = Mode::Proxy;
        shared.command = vec!["app".into(), "{port}".into()];
        assert_eq!(shared.validate(), Ok(()));
        // Background workers serve no port: none to put there, none to check.
        shared.mode = Mode::Background;
        assert_eq!(shared.validate(), Err(SpecError::PortInBackground));
        shared.command = vec!["app".into()];
        assert_eq!(shared.validate(), Ok(()));
        shared.health = Some(HealthCheck::default());
        assert_eq!(shared.validate(), Err(SpecError::HealthInBackground));

        // Node's watch mode serves past drover; a background worker serves nothing.
        let mut watch = AppSpec::new("w", ["node", "--watch", "app.js"].map(String::from).into());
        for mode in [Mode::Auto, Mode::Proxy, Mode::Handoff, Mode::Shared] {
            watch.mode = mode;
            let option = "--watch".to_string();
            assert_eq!(watch.validate(), Err(SpecError::NodeWatchMode { option }));
        }
        watch.mode = Mode::Background;
        assert_eq!(watch.validate(), Ok(()));
        assert_eq!(
            "pool".parse::<Mode>().unwrap_err().to_string(),
            "unknown mode \"pool\": expected \"auto\", \"proxy\", \"handoff\", \"shared\" or \"background\""
        );
    }
}
