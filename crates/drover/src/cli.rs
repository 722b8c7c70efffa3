//! Command-line interface.

use clap::{Args, Parser, Subcommand};
use drover_config::flags::{ProxyArgs, RunArgs};
use drover_units::duration;
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

    /// How drover writes its stderr (its log, its messages and its workers' output):
    /// "text", or "json", one object a line with a timestamp, for log shippers.
    #[arg(
        long,
        global = true,
        value_enum,
        env = "DROVER_LOG_FORMAT",
        default_value_t = LogFormat::Text
    )]
    pub log_format: LogFormat,
}

/// `--log-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Lines for people: drover's prefixed `drover:`, a worker's `[app/ID]`.
    Text,
    /// One JSON object a line: `timestamp`, `level`, `message`, and a worker line's
    /// `app`, `worker` and `stream`.
    Json,
}

impl Cli {
    /// The command line, with `drover run`'s words after a script named alone read in
    /// PM2's order (drover_config::pm2_order). Exits as clap does on a usage error.
    pub fn from_args() -> Cli {
        let Some(argv) = std::env::args_os()
            .map(|a| a.into_string().ok())
            .collect::<Option<Vec<String>>>()
        else {
            // Not UTF-8: no rearranging; clap names the word it cannot read.
            return Cli::parse();
        };
        let cli = Cli::parse_from(&argv);
        let Command::Run(args) = &cli.command else {
            return cli;
        };
        let Some(pm2) = drover_config::pm2_order::rearranged(&argv, &args.command) else {
            return cli;
        };
        let (reason, stray) = match Cli::try_parse_from(&pm2.argv) {
            Ok(mut again) => match &mut again.command {
                Command::Run(args) if args.command == pm2.command => {
                    args.pm2_flags = pm2.pm2;
                    return again;
                }
                // A program's words that are not all drover's flags are its own.
                _ if !pm2.strict => return cli,
                // A word that no flag takes as its value became the program.
                Command::Run(args) => (
                    "no flag takes it as its value".to_string(),
                    args.command.first().cloned(),
                ),
                _ => unreachable!("the same subcommand parses as the same subcommand"),
            },
            Err(e) if !e.use_stderr() => e.exit(), // --help, --version
            Err(_) if !pm2.strict => return cli,
            Err(e) => {
                let text = e.render().to_string();
                let first = text.lines().next().unwrap_or_default();
                let reason = first.trim_start_matches("error: ").trim_end_matches('.');
                let stray = match e.get(clap::error::ContextKind::InvalidArg) {
                    Some(clap::error::ContextValue::String(arg)) => Some(arg.clone()),
                    _ => None,
                };
                (reason.to_string(), stray)
            }
        };
        eprintln!("error: {}", pm2.refused(&reason, stray.as_deref()));
        std::process::exit(2);
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Balance HTTP/1.1 requests over backends.
    Proxy(Box<ProxyArgs>),
    /// Start every app and balancer a drover.toml describes.
    Up(ConfigFileArgs),
    /// Check a drover.toml without starting anything, as `nginx -t` does: the file, its
    /// values, each app's program, and each listen address (free, or held by the drover
    /// that runs this file). Exits 0, or 1 with every error on stderr.
    Check(ConfigFileArgs),
    /// Run N workers of a program behind a balancer: drover run -w 4 -- node app.js
    /// (or PM2's order: drover run app.js -i 4)
    Run(Box<RunArgs>),
    /// Talk to a running drover through its admin API: status, reload, scale, members.
    Ctl(CtlArgs),
    /// Load-test an HTTP server: drover bench -c 50 -d 10s URL, --rate R for open loop;
    /// reports as text, --json or --html, checks --slo; `drover bench compare A B`.
    Bench(Box<drover_bench::cli::BenchCommand>),
}

#[derive(Debug, Args)]
pub struct CtlArgs {
    /// The admin API of the drover to talk to ([admin] listen, or drover run --admin):
    /// HOST:PORT, or http://HOST:PORT as the Node SDK takes DROVER_ADMIN [default: the
    /// [admin] listen of --config, or of ./drover.toml when there is one; else
    /// 127.0.0.1:9900]
    #[arg(long, env = "DROVER_ADMIN", value_name = "ADDR", value_parser = admin_addr)]
    pub admin: Option<SocketAddr>,

    /// Bearer token, when the admin API requires one [default: the file's [admin] token,
    /// when its address is the one used]
    #[arg(long, env = "DROVER_ADMIN_TOKEN", hide_env_values = true)]
    pub token: Option<String>,

    /// The drover.toml whose [admin] listen (and token) to use, as drover up -c FILE
    /// reads it.
    #[arg(short, long, value_name = "FILE", global = true)]
    pub config: Option<PathBuf>,

    #[command(subcommand)]
    pub command: CtlCommand,
}

#[derive(Debug, Subcommand)]
pub enum CtlCommand {
    /// Apps, workers (pid, uptime, restarts and the last one's reason, RSS, in-flight,
    /// state) and endpoints.
    Status {
        /// The raw JSON from GET /v1/status instead of tables.
        #[arg(long)]
        json: bool,
    },
    /// Why workers restarted, oldest first: per restart its time, app/worker, pid,
    /// reason (exit, signal, health, memory, reload, scale, start-failed, lost), exit
    /// code or signal, uptime and RSS, then its last stderr lines.
    Restarts {
        /// Only this app.
        #[arg(long, value_name = "NAME")]
        app: Option<String>,
        /// The records as JSON instead of a log.
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
        /// How many workers the app should run; or the app, then how many (`drover ctl
        /// scale api 4`, PM2's order).
        #[arg(value_name = "[APP] WORKERS", num_args = 1..=2, required = true)]
        target: Vec<String>,
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
pub struct ConfigFileArgs {
    /// The config file.
    #[arg(short, long, value_name = "FILE", default_value = "drover.toml")]
    pub config: PathBuf,
}

/// The admin API's address from `--admin`/`DROVER_ADMIN`: `HOST:PORT`, or
/// `http://HOST:PORT` (with or without a trailing `/`), the form the Node SDK reads from
/// the same variable, so one setting serves both.
fn admin_addr(s: &str) -> Result<SocketAddr, String> {
    use std::net::ToSocketAddrs;
    let bare = match s.split_once("://") {
        Some((scheme, rest)) if scheme.eq_ignore_ascii_case("http") => rest.trim_end_matches('/'),
        Some((scheme, _)) => {
            return Err(format!(
                "{s:?}: the admin API speaks http://, not {scheme}://"
            ))
        }
        None => s,
    };
    if bare.contains('/') {
        return Err(format!(
            "{s:?}: expected HOST:PORT or http://HOST:PORT, with no path"
        ));
    }
    bare.to_socket_addrs()
        .ok()
        .and_then(|mut addrs| addrs.next())
        .ok_or_else(|| {
            format!("{s:?}: expected HOST:PORT or http://HOST:PORT, e.g. 127.0.0.1:9900")
        })
}

#[cfg(test)]
mod tests {
    use super::admin_addr;

    #[test]
    fn the_admin_address_may_be_a_url() {
        let local = "127.0.0.1:9900".parse().unwrap();
        for given in [
            "127.0.0.1:9900",
            "http://127.0.0.1:9900",
            "HTTP://127.0.0.1:9900/",
        ] {
            assert_eq!(admin_addr(given), Ok(local), "{given}");
        }
        assert_eq!(admin_addr("[::1]:9900"), Ok("[::1]:9900".parse().unwrap()));
        for bad in [
            "https://127.0.0.1:9900",
            "http://127.0.0.1:9900/v1",
            "9900",
            "",
        ] {
            let e = admin_addr(bad).unwrap_err();
            assert!(e.contains(&format!("{bad:?}")), "{bad}: {e}");
        }
    }
}
