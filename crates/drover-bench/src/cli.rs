//! Command line of `drover bench`: the flags, and running them to an exit code.

use std::fmt;
use std::io::IsTerminal;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};

use crate::admin::{self, AdminError};
use crate::compare::{self, CompareError};
use crate::http::Payload;
use crate::mix::Mix;
use crate::run::{run, Config, Mode, Reuse, RunError};
use crate::slo::Slo;
use crate::tls::{TlsTarget, Trust};
use std::sync::Arc;

/// Exit code of a run that breached an `--slo`.
pub const EXIT_SLO_BREACHED: u8 = 3;

/// `drover bench URL` runs load; `drover bench compare A.json B.json` compares two runs.
#[derive(Debug, Clone, Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct BenchCommand {
    #[command(subcommand)]
    pub command: Option<BenchSubcommand>,

    #[command(flatten)]
    pub run: BenchArgs,
}

#[derive(Debug, Clone, Subcommand)]
pub enum BenchSubcommand {
    /// Differences between two --json runs that exceed their second-to-second noise
    Compare {
        /// The baseline run (a file written by --json)
        a: PathBuf,
        /// The run compared against it
        b: PathBuf,
    },
}

/// Load-generate HTTP/1.1 over keep-alive connections and report latency percentiles.
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// Target, e.g. http://127.0.0.1:8000, https://localhost:8443/path or
    /// 127.0.0.1:8000/path
    #[arg(required = true)]
    pub url: Option<String>,

    /// https: check the server's certificate against the CA certificates of this PEM file
    /// instead of the system's roots
    #[arg(long, value_name = "FILE", conflicts_with = "insecure")]
    pub cacert: Option<PathBuf>,

    /// https: accept any certificate and name (the handshake's signature is still
    /// checked), as curl's --insecure
    #[arg(long)]
    pub insecure: bool,

    /// https: a full handshake on every new connection, never a session resumed from an
    /// earlier one's ticket (browsers and the default resume)
    #[arg(long)]
    pub no_tls_resume: bool,

    /// Closed loop: connections kept busy. Open loop (--rate): most connections the pool
    /// opens [default: 50 closed, 512 open]
    #[arg(short, long)]
    pub connections: Option<usize>,

    /// How long to send, e.g. 10s, 500ms, 2m [default: 10s;
    /// with -n, until that many requests are answered, as ab and loadtest do]
    #[arg(short, long, value_parser = drover_units::duration)]
    pub duration: Option<Duration>,

    /// Open loop: send this many requests per second on a fixed schedule; latency counts
    /// from each request's scheduled time (--rps as in loadtest)
    #[arg(
        short,
        long,
        visible_alias = "rps",
        value_name = "REQ_PER_S",
        allow_negative_numbers = true
    )]
    pub rate: Option<f64>,

    /// Open loop: which idle keep-alive connection a request goes out on. `random` acts
    /// like many independent clients; `newest` (the connection that answered last) acts
    /// like one client's pool and, against servers that balance per connection (Node
    /// cluster, PM2, a shared socket), steers requests to the worker that just finished
    #[arg(long, value_enum, default_value_t = Reuse::Random)]
    pub reuse: Reuse,

    /// Open loop: Poisson arrivals (exponential gaps drawn from --seed, mean 1/rate)
    /// instead of a fixed interval between requests
    #[arg(long, requires = "rate")]
    pub poisson: bool,

    /// Stop after this many requests in total (as ab's and loadtest's -n)
    #[arg(short = 'n', long, value_name = "COUNT")]
    pub requests: Option<u64>,

    /// Generator threads, each with its own runtime
    #[arg(short, long, default_value_t = 1)]
    pub threads: usize,

    /// Request path (default: the URL's path, or /)
    #[arg(long, conflicts_with = "mix")]
    pub path: Option<String>,

    /// Weighted paths, picked at random per request: "90:/cheap,10:/expensive"
    #[arg(long)]
    pub mix: Option<String>,

    /// Per-request timeout (open loop: from the scheduled time)
    #[arg(long, default_value = "10s", value_parser = drover_units::duration)]
    pub timeout: Duration,

    /// Seed for the path choice
    #[arg(long, default_value_t = 1)]
    pub seed: u64,

    /// Extra request header, "Name: value" (repeatable)
    #[arg(short = 'H', long = "header")]
    pub headers: Vec<String>,

    /// Every request's method, e.g. POST or PUT (as loadtest's -m, curl's -X)
    #[arg(short, long, default_value = "GET")]
    pub method: String,

    /// Every request's body (as loadtest's -P); sent with its Content-Length. With
    /// neither --body nor --body-file, requests have no body
    #[arg(long, value_name = "TEXT", conflicts_with = "body_file")]
    pub body: Option<String>,

    /// Every request's body, read from this file (as ab's -p and loadtest's -p)
    #[arg(long, value_name = "FILE")]
    pub body_file: Option<PathBuf>,

    /// Content-Type of the body (as ab's and loadtest's -T); the same as
    /// -H 'Content-Type: TYPE'
    #[arg(short = 'T', long, value_name = "TYPE")]
    pub content_type: Option<String>,

    /// Count responses per value of this response header, e.g. x-worker to see how
    /// many requests each worker answered (at most 64 values; the rest count as "other")
    #[arg(long, value_name = "NAME")]
    pub count_header: Option<String>,

    /// Print the report as one JSON object on stdout, per-second samples included
    #[arg(long)]
    pub json: bool,

    /// Also write the report as one self-contained HTML page with charts
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,

    /// An objective the run must meet, e.g. 'p99<50ms', 'errors<0.1%', 'rps>1000'
    /// (metrics p50 p75 p90 p99 p999 max mean errors rps; repeatable); exit 3 if breached
    #[arg(long, value_name = "SLO")]
    pub slo: Vec<Slo>,

    /// The admin listener of the drover under test (HOST:PORT): read its /metrics before
    /// and after the run and report each endpoint's requests, queueing and backend time
    #[arg(long, value_name = "ADDR")]
    pub admin: Option<String>,

    /// Bearer token for --admin, when the admin API requires one
    #[arg(
        long,
        env = "DROVER_ADMIN_TOKEN",
        hide_env_values = true,
        requires = "admin"
    )]
    pub admin_token: Option<String>,
}

/// How long a run sends when neither -d nor -n says.
const DEFAULT_DURATION: Duration = Duration::from_secs(10);

/// A target URL's parts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// `host:port`, the port filled in from the scheme when the URL has none.
    pub authority: String,
    pub path: String,
    /// `https://`.
    pub tls: bool,
}

impl Target {
    /// The host alone (a name, an IPv4 address, or an IPv6 one in brackets).
    pub fn host(&self) -> &str {
        self.authority
            .rsplit_once(':')
            .map_or(self.authority.as_str(), |(h, _)| h)
    }
}

/// Splits `http://host:port/path` (or `https://`, or no scheme: http) into its parts.
pub fn split_url(url: &str) -> Result<Target, String> {
    let (rest, tls) = if let Some(r) = url.strip_prefix("http://") {
        (r, false)
    } else if let Some(r) = url.strip_prefix("https://") {
        (r, true)
    } else if url.contains("://") {
        return Err(format!("unsupported scheme in {url:?}"));
    } else {
        (url, false)
    };
    let default_port = if tls { 443 } else { 80 };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    if authority.is_empty() {
        return Err(format!("no host in {url:?}"));
    }
    let authority = if authority
        .rsplit_once(':')
        .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
        || authority.ends_with(']') && !authority.contains("]:")
    {
        if authority.ends_with(']') {
            format!("{authority}:{default_port}")
        } else {
            authority.to_string()
        }
    } else {
        format!("{authority}:{default_port}")
    };
    Ok(Target {
        authority,
        path: path.to_string(),
        tls,
    })
}

impl BenchArgs {
    /// Turns the arguments into a run configuration (resolves the host).
    pub fn to_config(&self) -> Result<Config, String> {
        let url = self.url.as_deref().ok_or("no target URL")?;
        let target = split_url(url)?;
        let tls = if target.tls {
            let trust = match (&self.cacert, self.insecure) {
                (_, true) => Trust::Insecure,
                (Some(file), false) => Trust::CaFile(file.clone()),
                (None, false) => Trust::System,
            };
            Some(Arc::new(TlsTarget::new(
                target.host(),
                &trust,
                !self.no_tls_resume,
            )?))
        } else {
            if let Some(flag) = [
                (self.cacert.is_some(), "--cacert"),
                (self.insecure, "--insecure"),
                (self.no_tls_resume, "--no-tls-resume"),
            ]
            .iter()
            .find_map(|(given, flag)| given.then_some(flag))
            {
                return Err(format!(
                    "{flag} is for https:// targets; {url:?} is plain HTTP"
                ));
            }
            None
        };
        let Target {
            authority,
            path: url_path,
            ..
        } = target;
        let addr: SocketAddr = authority
            .to_socket_addrs()
            .map_err(|e| format!("cannot resolve {authority}: {e}"))?
            .next()
            .ok_or_else(|| format!("{authority} resolves to no address"))?;
        let mix = match (&self.mix, &self.path) {
            (Some(m), _) => Mix::parse(m),
            (None, Some(p)) => Mix::single(p),
            (None, None) => Mix::single(&url_path),
        }
        .map_err(|e| e.to_string())?;
        if let Some(h) = &self.count_header {
            if !crate::run::valid_header_name(h) {
                return Err(format!("--count-header {h:?} is not a header name"));
            }
        }
        for h in &self.headers {
            if !h.contains(':') || h.contains(['\r', '\n']) {
                return Err(format!("bad header {h:?}; expected \"Name: value\""));
            }
        }
        let payload = self.payload()?;
        let mut headers = self.headers.clone();
        if let Some(t) = &self.content_type {
            if t.is_empty() || t.contains(['\r', '\n']) {
                return Err(format!("bad --content-type {t:?}"));
            }
            headers.push(format!("Content-Type: {t}"));
        }
        let mode = match self.rate {
            Some(rate) if rate.is_finite() && rate > 0.0 => Mode::Open {
                rate,
                reuse: self.reuse,
            },
            Some(_) => return Err("--rate (--rps) must be a positive number".into()),
            None => Mode::Closed,
        };
        let connections = self.connections.unwrap_or(match mode {
            Mode::Closed => 50,
            Mode::Open { .. } => 512,
        });
        Ok(Config {
            addr,
            host: authority,
            mix,
            mode,
            connections,
            duration: match (self.duration, self.requests) {
                (Some(duration), _) => duration,
                (None, Some(_)) => crate::run::UNTIL_COUNT,
                (None, None) => DEFAULT_DURATION,
            },
            max_requests: self.requests,
            threads: self.threads,
            timeout: self.timeout,
            seed: self.seed,
            headers,
            count_header: self.count_header.clone(),
            poisson: self.poisson,
            progress: false,
            tls,
            payload,
        })
    }

    /// The method and body every request sends, checked.
    fn payload(&self) -> Result<Payload, String> {
        let method = self.method.as_str();
        // A token (RFC 9110 §5.6.2), as a server parses it.
        let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
        if method.is_empty() || !method.chars().all(token) {
            return Err(format!(
                "bad --method {method:?}: a method is a token such as GET or POST"
            ));
        }
        let body = match (&self.body, &self.body_file) {
            (Some(text), _) => Some(text.clone().into_bytes()),
            (None, Some(path)) => Some(
                std::fs::read(path)
                    .map_err(|e| format!("--body-file: cannot read {}: {e}", path.display()))?,
            ),
            (None, None) => None,
        };
        let has = |name: &str| {
            self.headers.iter().any(|h| {
                h.split_once(':')
                    .is_some_and(|(n, _)| n.trim().eq_ignore_ascii_case(name))
            })
        };
        if has("content-length") || has("transfer-encoding") {
            return Err(
                "drover bench frames each request itself (Content-Length from --body or --body-file); \
                 leave Content-Length and Transfer-Encoding out of -H"
                    .into(),
            );
        }
        if self.content_type.is_some() && has("content-type") {
            return Err("--content-type and -H 'Content-Type: ...' both given; keep one".into());
        }
        Ok(Payload {
            method: method.to_string(),
            body,
        })
    }
}

/// Why `drover bench` failed.
#[derive(Debug)]
pub enum BenchError {
    /// The flags do not make a run.
    Usage(String),
    Run(RunError),
    Admin(AdminError),
    Compare(CompareError),
    Write {
        path: PathBuf,
        error: std::io::Error,
    },
    /// The target never answered.
    NoResponse(SocketAddr),
    /// An `https://` target's TLS handshake failed before the run.
    Tls {
        target: String,
        error: String,
    },
    /// An `https://` target took no connection before the run.
    Connect {
        target: String,
        error: String,
    },
}

impl fmt::Display for BenchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BenchError::Usage(s) => f.write_str(s),
            BenchError::Run(e) => write!(f, "{e}"),
            BenchError::Admin(e) => write!(f, "{e}"),
            BenchError::Compare(e) => write!(f, "{e}"),
            BenchError::Write { path, error } => {
                write!(f, "cannot write {}: {error}", path.display())
            }
            BenchError::NoResponse(addr) => write!(f, "no response at all from {addr}"),
            BenchError::Connect { target, error } => {
                write!(f, "cannot connect to {target}: {error}")
            }
            BenchError::Tls { target, error } => {
                write!(f, "TLS handshake with {target} failed: {error}")?;
                if error.contains("CaUsedAsEndEntity") {
                    // webpki's name for it; curl and OpenSSL take such a certificate.
                    f.write_str(
                        " (the server's certificate is a CA certificate, basicConstraints CA:TRUE, as `openssl req -x509` makes one by default: make it with -addext basicConstraints=critical,CA:FALSE, or sign it with a CA of its own and pass that as --cacert; --insecure skips the check)",
                    )?;
                } else if error.contains("certificate") {
                    f.write_str(
                        " (--cacert FILE names the CA that signed it; --insecure skips the check)",
                    )?;
                }
                Ok(())
            }
        }
    }
}

impl std::error::Error for BenchError {}

impl BenchError {
    /// 2 for input that cannot work (flags, files), 1 for a run that went wrong.
    pub fn exit_code(&self) -> u8 {
        match self {
            BenchError::Usage(_) | BenchError::Compare(_) => 2,
            BenchError::Run(RunError::Config(_)) => 2,
            _ => 1,
        }
    }
}

/// Runs `drover bench` and returns its exit code: 0, 3 when an `--slo` was breached,
/// or [`BenchError::exit_code`] after printing the error.
pub fn main_with(cmd: &BenchCommand) -> ExitCode {
    let result = match &cmd.command {
        Some(BenchSubcommand::Compare { a, b }) => compare_files(a, b).map(|()| 0),
        None => bench(&cmd.run),
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("drover bench: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

/// One handshake with an `https://` target before the run: a certificate it cannot
/// check fails the run with the reason, not with every request counted as a connect
/// error.
fn check_tls(addr: SocketAddr, target: &str, tls: &TlsTarget) -> Result<(), BenchError> {
    let fail = |error: std::io::Error| BenchError::Tls {
        target: target.to_owned(),
        error: error.to_string(),
    };
    let unreachable = |error: std::io::Error| BenchError::Connect {
        target: target.to_owned(),
        error: error.to_string(),
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| BenchError::Run(RunError::Runtime(e)))?;
    rt.block_on(async {
        let tcp = tokio::time::timeout(TLS_CHECK_TIMEOUT, tokio::net::TcpStream::connect(addr))
            .await
            .map_err(|_| unreachable(std::io::ErrorKind::TimedOut.into()))?
            .map_err(unreachable)?;
        tokio::time::timeout(TLS_CHECK_TIMEOUT, tls.handshake(tcp))
            .await
            .map_err(|_| fail(std::io::ErrorKind::TimedOut.into()))?
            .map_err(fail)
            .map(drop)
    })
}

/// How long the handshake before a run may take.
const TLS_CHECK_TIMEOUT: Duration = Duration::from_secs(10);

/// One load run: prints the report (and writes `--html`), returns 0 or
/// [`EXIT_SLO_BREACHED`].
pub fn bench(args: &BenchArgs) -> Result<u8, BenchError> {
    let mut cfg = args.to_config().map_err(BenchError::Usage)?;
    cfg.progress = std::io::stderr().is_terminal();
    if let Some(tls) = &cfg.tls {
        check_tls(cfg.addr, &cfg.host, tls)?;
    }
    let admin = match &args.admin {
        Some(a) => {
            let authority = admin::admin_authority(a).map_err(BenchError::Admin)?;
            // A drover that cannot be read fails the run before it starts, not after.
            let before = admin::scrape(&authority, args.admin_token.as_deref())
                .map_err(BenchError::Admin)?;
            Some((authority, before))
        }
        None => None,
    };
    let mut report = run(&cfg).map_err(BenchError::Run)?;
    if let Some((authority, before)) = admin {
        match admin::scrape(&authority, args.admin_token.as_deref()) {
            Ok(after) => report.admin = Some(admin::diff(&authority, &before, &after)),
            Err(e) => eprintln!("drover bench: after the run: {e}"),
        }
    }
    report.slo = args.slo.iter().map(|s| report.judge(s)).collect();
    if args.json {
        println!("{}", report.to_json());
    } else {
        print!("{}", report.render_text());
    }
    if let Some(path) = &args.html {
        std::fs::write(path, crate::html::render(&report)).map_err(|error| BenchError::Write {
            path: path.clone(),
            error,
        })?;
    }
    if report.requests == 0 {
        return Err(BenchError::NoResponse(cfg.addr));
    }
    if report.slo.iter().any(|v| !v.met) {
        if args.json {
            // The verdicts are in the JSON; say it on stderr too, for whoever reads logs.
            for v in report.slo.iter().filter(|v| !v.met) {
                eprintln!("{v}");
            }
        }
        return Ok(EXIT_SLO_BREACHED);
    }
    Ok(0)
}

/// `drover bench compare A B`.
pub fn compare_files(a: &Path, b: &Path) -> Result<(), BenchError> {
    let ra = compare::load(a).map_err(BenchError::Compare)?;
    let rb = compare::load(b).map_err(BenchError::Compare)?;
    let c = compare::compare(&ra, &rb).map_err(BenchError::Compare)?;
    print!("{}", c.render_text(a, b));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(extra: &[&str]) -> BenchArgs {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: BenchArgs,
        }
        let argv = ["drover-bench"].iter().chain(extra).chain(&["127.0.0.1:9"]);
        <Cli as clap::Parser>::try_parse_from(argv).unwrap().args
    }

    #[test]
    fn reuse_option() {
        let mode = |extra: &[&str]| args(extra).to_config().unwrap().mode;
        let open = |reuse| Mode::Open { rate: 100.0, reuse };
        assert_eq!(mode(&["--rate", "100"]), open(Reuse::Random));
        assert_eq!(
            mode(&["--rate", "100", "--reuse", "newest"]),
            open(Reuse::Newest)
        );
        #[derive(clap::Parser, Debug)]
        struct Cli {
            #[command(flatten)]
            _args: BenchArgs,
        }
        let err = <Cli as clap::Parser>::try_parse_from(["x", "--reuse", "oldest", "127.0.0.1:9"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("--reuse") && err.contains("oldest"), "{err}");
    }

    #[test]
    fn a_count_without_a_duration_runs_until_it_is_reached() {
        let run = |extra: &[&str]| {
            let cfg = args(extra).to_config().unwrap();
            (cfg.duration, cfg.max_requests)
        };
        assert_eq!(run(&[]), (DEFAULT_DURATION, None));
        assert_eq!(run(&["-n", "1000"]), (crate::run::UNTIL_COUNT, Some(1000)));
        // loadtest's -n 1000000 --rps 10000: the schedule, not 10 s, decides.
        assert_eq!(
            run(&["--rate", "9000", "-n", "1000000"]),
            (crate::run::UNTIL_COUNT, Some(1_000_000))
        );
        // Both: whichever comes first.
        assert_eq!(
            run(&["-n", "1000", "-d", "2s"]),
            (Duration::from_secs(2), Some(1000))
        );
    }

    #[test]
    fn count_header_option() {
        let cfg = args(&["--count-header", "x-worker"]).to_config().unwrap();
        assert_eq!(cfg.count_header.as_deref(), Some("x-worker"));
        assert_eq!(args(&[]).to_config().unwrap().count_header, None);
        for bad in ["", "x worker", "x-worker:", "é"] {
            let err = args(&["--count-header", bad]).to_config().unwrap_err();
            assert!(err.contains("--count-header"), "{bad:?}: {err}");
        }
    }

    #[test]
    fn urls() {
        let t = |url: &str| {
            let t = split_url(url).unwrap();
            (t.authority, t.path, t.tls)
        };
        assert_eq!(
            t("http://127.0.0.1:8000"),
            ("127.0.0.1:8000".into(), "/".into(), false)
        );
        assert_eq!(
            t("127.0.0.1:8000/a/b?c"),
            ("127.0.0.1:8000".into(), "/a/b?c".into(), false)
        );
        assert_eq!(
            t("http://localhost/x"),
            ("localhost:80".into(), "/x".into(), false)
        );
        assert_eq!(
            t("http://[::1]:9000/"),
            ("[::1]:9000".into(), "/".into(), false)
        );
        assert_eq!(
            t("https://shop.example/x"),
            ("shop.example:443".into(), "/x".into(), true)
        );
        assert_eq!(t("https://[::1]/"), ("[::1]:443".into(), "/".into(), true));
        assert_eq!(split_url("https://[::1]:8443/").unwrap().host(), "[::1]");
        assert_eq!(
            split_url("https://localhost:8443").unwrap().host(),
            "localhost"
        );
        assert!(split_url("ftp://x").is_err());
        assert!(split_url("http:///x").is_err());
    }

    #[test]
    fn methods_and_bodies() {
        let p = |extra: &[&str]| args(extra).to_config().map(|c| (c.payload, c.headers));
        assert_eq!(p(&[]).unwrap().0, Payload::default());
        let (payload, headers) = p(&["-m", "POST", "--body", "a=1", "-T", "text/plain"]).unwrap();
        assert_eq!(
            payload,
            Payload {
                method: "POST".into(),
                body: Some(b"a=1".to_vec())
            }
        );
        assert_eq!(headers, ["Content-Type: text/plain"]);
        let file = std::env::temp_dir().join(format!("drover-bench-body-{}", std::process::id()));
        std::fs::write(&file, b"\x00\x01binary").unwrap();
        let (payload, _) = p(&["--method", "PUT", "--body-file", file.to_str().unwrap()]).unwrap();
        assert_eq!(payload.body.as_deref(), Some(&b"\x00\x01binary"[..]));
        let _ = std::fs::remove_file(&file);
        for (bad, want) in [
            (&["-m", "GE T"][..], "--method"),
            (&["-m", ""], "--method"),
            (&["--body-file", "/nonexistent/body"], "/nonexistent/body"),
            (
                &["--body", "x", "-H", "Content-Length: 1"],
                "Content-Length",
            ),
            (&["-H", "Transfer-Encoding: chunked"], "Transfer-Encoding"),
            (&["-T", "a/b", "-H", "content-type: c/d"], "--content-type"),
        ] {
            let e = p(bad).unwrap_err();
            assert!(e.contains(want), "{bad:?}: {e}");
        }
    }

    #[test]
    fn tls_flags_need_an_https_target() {
        for flag in [
            &["--insecure"][..],
            &["--no-tls-resume"],
            &["--cacert", "/etc/hosts"],
        ] {
            let e = args(flag).to_config().unwrap_err();
            assert!(e.contains(flag[0]) && e.contains("https://"), "{e}");
        }
    }
}
