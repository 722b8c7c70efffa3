//! Command-line interface.

use clap::{Args, Parser, Subcommand};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Parser)]
#[command(
    name = "drover",
    version,
    about = "Load balancer and process supervisor in one binary"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Balance HTTP/1.1 requests over backends.
    Proxy(Box<ProxyArgs>),
    /// Start every app and balancer a drover.toml describes.
    Up(UpArgs),
    /// Run N workers of a program behind a balancer: drover run -w 4 -- node app.js
    Run(Box<RunArgs>),
    /// Talk to a running drover through its admin API: status, reload, scale, members.
    Ctl(CtlArgs),
}

#[derive(Debug, Args)]
pub struct CtlArgs {
    /// The admin API of the drover to talk to ([admin] listen, or drover run --admin).
    #[arg(
        long,
        env = "DROVER_ADMIN",
        value_name = "ADDR",
        default_value = "127.0.0.1:9900"
    )]
    pub admin: SocketAddr,

    /// Bearer token, when the admin API requires one.
    #[arg(long, env = "DROVER_ADMIN_TOKEN", hide_env_values = true)]
    pub token: Option<String>,

    #[command(subcommand)]
    pub command: CtlCommand,
}

#[derive(Debug, Subcommand)]
pub enum CtlCommand {
    /// Apps, workers (pid, uptime, restarts, RSS, in-flight, state) and endpoints.
    Status {
        /// The raw JSON from GET /v1/status instead of tables.
        #[arg(long)]
        json: bool,
    },
    /// Rolling reload: replace every worker, one at a time, with no failed request.
    /// Under `drover up`, drover.toml is read again and its app settings apply, the
    /// worker count included.
    Reload {
        /// Only this app.
        #[arg(long, value_name = "NAME")]
        app: Option<String>,
    },
    /// Run this many workers of an app (like `pm2 scale`): new ones join once ready,
    /// retired ones finish their requests first. Under `drover up`, the next reload
    /// restores drover.toml's count.
    Scale {
        /// How many workers the app should run.
        workers: usize,
        /// The app; may be left out when only one runs.
        #[arg(long, value_name = "NAME")]
        app: Option<String>,
    },
    /// Backends that join and leave at runtime: list, add, heartbeat, drain, remove.
    Members {
        /// The balancer; may be left out when only one runs.
        #[arg(long, short, value_name = "NAME", global = true)]
        balancer: Option<String>,
        #[command(subcommand)]
        command: MembersCommand,
    },
}

#[derive(Debug, Subcommand)]
pub enum MembersCommand {
    /// Every member with its source (static, supervisor, admin, etcd), state and TTL left.
    List {
        /// The raw JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Register a member (or update it): it gets requests at once.
    Add {
        /// Its id (letters, digits, '.', '_', '-', ':').
        id: String,
        /// host:port it serves on.
        address: String,
        /// Removed unless a heartbeat comes within this long (e.g. 10s); default: none.
        #[arg(long, value_name = "DURATION")]
        ttl: Option<String>,
        /// Relative weight, 1..=1000.
        #[arg(long)]
        weight: Option<u32>,
        /// A label KEY=VALUE (repeat for more).
        #[arg(long, value_name = "KEY=VALUE")]
        meta: Vec<String>,
    },
    /// Keep a member with a TTL alive, optionally with its load (0..1).
    Heartbeat {
        id: String,
        #[arg(long)]
        load: Option<f64>,
    },
    /// Stop sending it new requests; it is removed once those in flight finish.
    Drain { id: String },
    /// Drain it and wait until it is gone.
    Remove {
        id: String,
        /// Give up waiting after this long (the drain goes on).
        #[arg(long, default_value = "60s", value_parser = duration)]
        timeout: Duration,
    },
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Worker processes ("auto": one per core). Each gets PORT and DROVER_WORKER_ID.
    #[arg(short, long, default_value = "auto")]
    pub workers: crate::config::Workers,

    /// Address to accept clients on.
    #[arg(short, long, value_name = "ADDR", default_value = "127.0.0.1:8000")]
    pub listen: SocketAddr,

    /// How requests are spread over the workers [default: p2c].
    #[arg(short, long)]
    pub strategy: Option<drover_balance::Strategy>,

    /// "proxy": each worker on its own port behind drover's balancer. "shared": the
    /// workers accept on one socket drover binds at --listen (LISTEN_FDS=1, fd 3); the
    /// kernel spreads connections, with no proxy hop and no per-worker health checks.
    #[arg(short, long, default_value = "proxy")]
    pub mode: drover_supervisor::Mode,

    /// Replace a worker (gracefully) once its RSS exceeds this, e.g. 512M or 2G.
    #[arg(long, value_name = "SIZE", value_parser = byte_size)]
    pub max_memory: Option<u64>,

    /// On reload, how long an old worker may take to finish its requests.
    #[arg(long, default_value = "30s", value_parser = duration)]
    pub drain_timeout: Duration,

    /// Admin API address for `drover ctl` ("off": none) [default: 127.0.0.1:9900, or
    /// none with a warning when another drover holds that port].
    #[arg(long, value_name = "ADDR")]
    pub admin: Option<AdminListen>,

    /// Bearer token the admin API requires; needed when --admin is not a loopback
    /// address. `drover ctl --token` (or the same variable) passes it.
    #[arg(
        long,
        value_name = "TOKEN",
        env = "DROVER_ADMIN_TOKEN",
        hide_env_values = true
    )]
    pub admin_token: Option<String>,

    /// Serving threads of the balancer ("auto": one per core).
    #[arg(short, long, default_value = "auto", value_parser = threads)]
    pub threads: usize,

    /// HTTP path a worker must answer (2xx/3xx) before it gets traffic, and keep
    /// answering to stay in it; without it an open port is enough.
    #[arg(long, value_name = "PATH")]
    pub health_path: Option<String>,

    #[command(flatten)]
    pub keys: KeyArgs,

    #[command(flatten)]
    pub limits: LimitArgs,

    /// The program and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// What `hash` and `sticky` pin requests by, the same for `proxy` and `run`.
#[derive(Debug, Args)]
pub struct KeyArgs {
    /// Key for --strategy hash: header:NAME, cookie:NAME, client-ip or path.
    #[arg(long, value_name = "KEY")]
    pub hash_key: Option<drover_proxy::HashKey>,

    /// Cookie name for --strategy sticky.
    #[arg(long, default_value = "drover_sticky")]
    pub sticky_cookie: String,
}

/// Per-backend limits and drover's queue, the same for `proxy` and `run`.
#[derive(Debug, Args)]
pub struct LimitArgs {
    /// Requests per backend before drover queues the rest: "auto" (a limit learned from
    /// latency, in force only while a backend's CPU is saturated), 0 (no limit) or N (at
    /// most N in flight).
    #[arg(long, default_value = "auto")]
    pub max_conns: crate::config::ConnLimit,

    /// Requests that may wait in drover's queue for a backend at its limit: "unlimited"
    /// (each waits up to the queue timeout) or N (more get a 503 at once; 0: never wait).
    #[arg(long, default_value = "unlimited")]
    pub queue_max: crate::config::QueueMax,

    /// How long a request may wait in the queue [default: the request timeout].
    #[arg(long, value_parser = duration)]
    pub queue_timeout: Option<Duration>,
}

#[derive(Debug, Args)]
pub struct UpArgs {
    /// The config to run.
    #[arg(short, long, value_name = "FILE", default_value = "drover.toml")]
    pub config: PathBuf,
}

fn duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e} (write durations like 500ms, 2s, 1m)"))
}

fn byte_size(s: &str) -> Result<u64, String> {
    match crate::config::parse_byte_size(s)? {
        0 => Err("must be greater than 0".into()),
        n => Ok(n),
    }
}

/// `--admin ADDR` or `--admin off`.
#[derive(Debug, Clone, Copy)]
pub struct AdminListen(pub Option<SocketAddr>);

impl std::str::FromStr for AdminListen {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if s == "off" {
            return Ok(AdminListen(None));
        }
        s.parse()
            .map(|a| AdminListen(Some(a)))
            .map_err(|_| format!("expected an address like 127.0.0.1:9900 or \"off\", got {s:?}"))
    }
}

fn threads(s: &str) -> Result<usize, String> {
    if s == "auto" {
        return Ok(crate::plan::default_threads());
    }
    match s.parse::<usize>() {
        Ok(n) if (1..=crate::config::THREADS_MAX).contains(&n) => Ok(n),
        _ => Err(format!(
            "expected a number from 1 to {} or \"auto\", got {s:?}",
            crate::config::THREADS_MAX
        )),
    }
}

#[derive(Debug, Args)]
pub struct ProxyArgs {
    /// Read balancers from this drover.toml instead of flags.
    #[arg(short, long, value_name = "FILE", conflicts_with_all = ["listen", "backend"])]
    pub config: Option<PathBuf>,

    /// Address to accept clients on.
    #[arg(short, long, value_name = "ADDR", required_unless_present = "config")]
    pub listen: Option<SocketAddr>,

    /// A backend (repeat for each): IP:PORT, dns:HOST:PORT (A/AAAA records, followed
    /// on their TTL), dns+srv:NAME (SRV records) or etcd:/PREFIX (with --etcd). May be
    /// left out with --admin: members then register at runtime (`drover ctl members
    /// add`, the SDK).
    #[arg(
        short,
        long = "backend",
        value_name = "BACKEND",
        required_unless_present_any = ["config", "admin"]
    )]
    pub backend: Vec<String>,

    /// DNS server for dns: backends (repeat for more) [default: the system's, from
    /// /etc/resolv.conf].
    #[arg(long, value_name = "IP[:PORT]", conflicts_with = "config")]
    pub resolver: Vec<String>,

    /// etcd client URL for etcd: backends and for members registered here (repeat for
    /// more), e.g. http://127.0.0.1:2379.
    #[arg(long, value_name = "URL", conflicts_with = "config")]
    pub etcd: Vec<String>,

    /// The balancer's name, as the members API and `drover ctl` use it.
    #[arg(long, default_value = "default", conflicts_with = "config")]
    pub name: String,

    /// Admin API address (status, `drover ctl`, members joining at runtime); none unless
    /// given. With --config, the file's [admin] table says it.
    #[arg(long, value_name = "ADDR", conflicts_with = "config")]
    pub admin: Option<SocketAddr>,

    /// Bearer token the admin API requires; needed when --admin is not a loopback
    /// address.
    #[arg(
        long,
        value_name = "TOKEN",
        env = "DROVER_ADMIN_TOKEN",
        hide_env_values = true
    )]
    pub admin_token: Option<String>,

    /// round-robin, weighted, least-conn, random, p2c, peak-ewma, hash or sticky.
    #[arg(short, long, default_value = "p2c")]
    pub strategy: drover_balance::Strategy,

    /// Serving threads ("auto": one per core).
    #[arg(short, long, default_value = "auto", value_parser = threads)]
    pub threads: usize,

    /// Extra attempts on another backend for a request that failed safely.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(0..=10))]
    pub retries: u32,

    #[command(flatten)]
    pub limits: LimitArgs,

    /// How long connecting to a backend may take. Long enough for one retransmitted
    /// SYN (1 s): a backend whose listen backlog overflowed drops the first one.
    #[arg(long, default_value = "5s", value_parser = duration)]
    pub connect_timeout: Duration,

    /// How long a client may take to send a request head (slow clients are cut off).
    #[arg(long, default_value = "10s", value_parser = duration)]
    pub header_timeout: Duration,

    /// How long a backend may take to start answering.
    #[arg(long, default_value = "30s", value_parser = duration)]
    pub request_timeout: Duration,

    /// Idle keep-alive connections are closed after this.
    #[arg(long, default_value = "60s", value_parser = duration)]
    pub idle_timeout: Duration,

    /// A client mid-request that sends or reads nothing for this long is cut off
    /// (slow POST, slow read).
    #[arg(long, default_value = "30s", value_parser = duration)]
    pub client_timeout: Duration,

    /// Active HTTP health check path (e.g. /health).
    #[arg(long, value_name = "PATH", conflicts_with = "health_tcp")]
    pub health_path: Option<String>,

    /// Active health check by TCP connect.
    #[arg(long)]
    pub health_tcp: bool,

    #[arg(long, default_value = "2s", value_parser = duration)]
    pub health_interval: Duration,

    #[arg(long, default_value = "1s", value_parser = duration)]
    pub health_timeout: Duration,

    /// Passing checks before a down backend is used again.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub rise: u32,

    /// Failing checks before a backend is taken out.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub fall: u32,

    /// A joining or returning backend's share ramps up over this long (0s: off).
    #[arg(long, default_value = "10s", value_parser = duration)]
    pub slow_start: Duration,

    #[command(flatten)]
    pub keys: KeyArgs,

    /// On SIGTERM, how long in-flight requests may take to finish.
    #[arg(long, default_value = "30s", value_parser = duration)]
    pub drain_timeout: Duration,
}
