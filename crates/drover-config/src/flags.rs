//! The command-line flags of `drover run` and `drover proxy`: the second way to fill
//! the model a drover.toml fills, with the same defaults and the same checks.

use crate::model::{self, BackendRef, Config};
use crate::plan::default_threads;
use clap::Args;
use drover_balance::Strategy;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Worker processes ("auto", or PM2's "max" or 0: one per core; PM2's -N: all cores
    /// but N). Each gets PORT and DROVER_WORKER_ID (-i: PM2's name) [default: auto; 1
    /// with --mode background].
    #[arg(
        short,
        long,
        visible_short_alias = 'i',
        visible_alias = "instances",
        allow_negative_numbers = true
    )]
    pub workers: Option<model::Workers>,

    /// The app's name, as `drover ctl status`, its output (`[NAME/0]`) and /metrics
    /// show it (PM2's --name).
    #[arg(short, long, default_value = "app", value_name = "NAME")]
    pub name: String,

    /// Address to accept clients on [default: for a Node app whose listen() names a
    /// port (app.listen(3000)), that port, bound as Node's cluster module binds it;
    /// otherwise 127.0.0.1:8000].
    #[arg(short, long, value_name = "ADDR", value_parser = crate::file::listen_addr)]
    pub listen: Option<SocketAddr>,

    /// How requests are spread over the workers [default: p2c].
    #[arg(short, long)]
    pub strategy: Option<drover_balance::Strategy>,

    /// "auto": as "proxy" while some requests cost far more than others; while they
    /// cost alike, drover hands client connections to the Node workers (least behind
    /// first), which then serve them with no proxy hop. "proxy": each worker on its own
    /// port behind drover's balancer, which places every request. "handoff": drover
    /// hands every new client connection to the Node worker least behind (other
    /// programs are proxied). "shared": each worker accepts on a socket of its own at
    /// --listen (LISTEN_FDS=1, fd 3), and drover places new connections by the
    /// workers' load, with no proxy hop and no per-worker health checks. "background":
    /// the workers serve no port (a queue consumer, a scheduler): no balancer, no PORT;
    /// each is restarted when it exits.
    #[arg(short, long, default_value_t)]
    pub mode: drover_supervisor::Mode,

    /// Replace a worker (gracefully) once its RSS exceeds this, e.g. 512M or 2G.
    #[arg(long, visible_alias = "max-memory-restart", value_name = "SIZE", value_parser = byte_size)]
    pub max_memory: Option<u64>,

    /// How long an old worker may take to finish its requests on a reload, and drover's
    /// clients on a stop (SIGTERM, SIGINT).
    #[arg(long, default_value = shown(app().drain_timeout), value_parser = drover_units::duration)]
    pub drain_timeout: Duration,

    /// On SIGTERM or SIGINT, how long drover still accepts clients, while /readyz says
    /// it is stopping, before it drains (HAProxy's `grace`): for a load balancer or
    /// Kubernetes in front, which takes drover out of rotation only some seconds later.
    #[arg(long, default_value = shown(balancer().shutdown_delay), value_parser = drover_units::duration)]
    pub shutdown_delay: Duration,

    /// A worker that joins workers that have served (a replacement, a scale-up, a
    /// reload's new ones) ramps its share up over this long (0s: off); at a fresh start
    /// none does [default: 10s].
    #[arg(long, value_name = "DURATION", value_parser = drover_units::duration)]
    pub slow_start: Option<Duration>,

    /// How long a worker has to exit after its SIGTERM before it gets SIGKILL (PM2's
    /// --kill-timeout, whose bare number is milliseconds, as PM2 reads it).
    #[arg(long, visible_alias = "kill-timeout", default_value = shown(app().stop_timeout), value_parser = pm2_millis)]
    pub stop_timeout: Duration,

    /// After this many restarts in a row that crashed (each before the worker was ready,
    /// or within 1 s of it: PM2's min_uptime), a worker is errored and not started again
    /// until a reload or a scale; once every worker is, drover exits 1, as pm2-runtime
    /// does, for a container's restart policy or systemd to act on. Default: restarted
    /// for as long as drover runs.
    #[arg(long, value_name = "N")]
    pub max_restarts: Option<u32>,

    /// How long a starting worker has to listen (and pass --health-path) before it is
    /// stopped and started again; each start in a row that ran out of it doubles the
    /// next one's, up to 16 times (a slow start is not a failed one).
    #[arg(long, default_value = shown(app().ready_timeout), value_parser = drover_units::duration)]
    pub ready_timeout: Duration,

    /// A Node worker gets clients once its app sends process.send('ready'), not as
    /// soon as it listens (PM2's --wait-ready); by --ready-timeout it gets them anyway.
    #[arg(long)]
    pub wait_ready: bool,

    /// For a Node app that listens on several ports (an API on 3000, and a metrics
    /// server on 9100 that starts first): the one drover balances, at --listen or at its
    /// own number; the workers share the others, as under Node's cluster module
    /// [default: the first it listens on]
    #[arg(long, value_name = "PORT", value_parser = clap::value_parser!(u16).range(1..))]
    pub app_port: Option<u16>,

    /// The loopback ports workers get their own from, LOW-HIGH (e.g. 24100-24199), for
    /// a host or firewall that allows only some; each worker's is one of these, or it
    /// does not start. It needs one per worker and one more for a reload
    /// [default: 20000-32000, less the kernel's ephemeral range]
    #[arg(long, value_name = "LOW-HIGH")]
    pub worker_ports: Option<drover_supervisor::PortRange>,

    /// Reload the app (rolling, one worker at a time) when a file below its working
    /// directory changes, as PM2's --watch restarts it; node_modules and dot names are
    /// left alone.
    #[arg(long)]
    pub watch: bool,

    /// Admin API address for `drover ctl` ("off": none) [default: 127.0.0.1:9900, or
    /// none with a warning when another drover holds that port].
    #[arg(long, value_name = "ADDR")]
    pub admin: Option<AdminListen>,

    #[command(flatten)]
    pub admin_token: AdminTokenArg,

    /// Serving threads of the balancer ("auto": one per core).
    #[arg(short, long, default_value = "auto", value_parser = threads)]
    pub threads: usize,

    /// HTTP path a worker must answer (2xx/3xx) before it gets traffic, and keep
    /// answering to stay in it; without it an open port is enough.
    #[arg(long, value_name = "PATH")]
    pub health_path: Option<String>,

    /// As --health-path, by the gRPC health protocol (grpc.health.v1.Health/Check) for
    /// SERVICE (none: the server as a whole); needs --backend-protocol h2c.
    #[arg(
        long,
        value_name = "SERVICE",
        num_args = 0..=1,
        default_missing_value = "",
        conflicts_with = "health_path"
    )]
    pub health_grpc: Option<String>,

    #[command(flatten)]
    pub health_timing: HealthTimingArgs,

    #[command(flatten)]
    pub keys: KeyArgs,

    #[command(flatten)]
    pub limits: LimitArgs,

    #[command(flatten)]
    pub timeouts: TimeoutArgs,

    #[command(flatten)]
    pub proxy_protocol: ProxyProtocolArg,

    #[command(flatten)]
    pub access_log: AccessLogArgs,

    #[command(flatten)]
    pub tls: TlsArgs,

    /// Serve cleartext HTTP/2 to clients that open with its preface (gRPC clients
    /// without TLS, curl --http2-prior-knowledge), HTTP/1.1 to the others (`h2c = true`).
    #[arg(long)]
    pub h2c: bool,

    /// Balance TCP connections, not HTTP requests: each goes to a worker at accept, its
    /// bytes unread (a Node worker takes it and serves it directly; another program's
    /// are relayed), for servers that end TLS themselves or speak a protocol of their
    /// own (`mode = "tcp"`). A Node app's server is told apart without it, where no
    /// --listen is given.
    #[arg(long)]
    pub tcp: bool,

    /// What requests go to the workers as: http1, or h2c for workers that speak HTTP/2
    /// in cleartext (gRPC servers): each request one stream, so the calls of one client
    /// connection spread over the workers [default: http1] (`backend_protocol`).
    #[arg(long, value_name = "PROTOCOL")]
    pub backend_protocol: Option<drover_proxy::BackendProtocol>,

    /// With a PM2 ecosystem file: each app's `env_NAME` on top of its `env` (PM2's
    /// --env).
    #[arg(long = "env", value_name = "NAME")]
    pub env_name: Option<String>,

    /// With a PM2 ecosystem file: run only these of its apps (PM2's --only).
    #[arg(long, value_name = "NAMES", value_delimiter = ',')]
    pub only: Vec<String>,

    /// The program and its arguments, after `--` or after drover's own flags (as
    /// `docker run` takes them: everything from the program on is the program's). A
    /// script named alone takes PM2's order: `drover run app.js -i 4 -- --port 3000`,
    /// drover's flags up to `--`, the app's after it. "{port}" in an argument becomes
    /// each worker's port (proxy mode). A PM2 ecosystem file named alone
    /// (ecosystem.config.js) runs the apps it describes, as `pm2 start` runs them.
    #[arg(required = true, trailing_var_arg = true, value_name = "CMD")]
    pub command: Vec<String>,

    /// PM2's own flags after a script named alone (`--kill-timeout 3000`, `--time`):
    /// not parsed here, but taken out of the line in PM2's order (crate::pm2_order).
    #[arg(skip)]
    pub pm2_flags: Vec<crate::pm2_order::Pm2Flag>,
}

/// The admin API's token, the same for `proxy` and `run`.
#[derive(Debug, Args)]
pub struct AdminTokenArg {
    /// Bearer token the admin API requires; needed when --admin is not a loopback
    /// address. `drover ctl --token` (or the same variable) passes it.
    #[arg(
        long = "admin-token",
        value_name = "TOKEN",
        env = "DROVER_ADMIN_TOKEN",
        hide_env_values = true
    )]
    pub token: Option<String>,
}

impl AdminTokenArg {
    /// The admin API at `listen` with this token, if the rule every way drover starts
    /// applies (`crate::check_exposure`) allows it.
    fn admin_at(&self, listen: SocketAddr) -> Result<model::AdminConfig, String> {
        crate::check_exposure(listen, self.token.as_deref()).map_err(|e| {
            format!("--admin {listen}: {e}; pass --admin-token TOKEN or set DROVER_ADMIN_TOKEN")
        })?;
        Ok(model::AdminConfig {
            listen,
            token: self.token.clone(),
        })
    }
}

/// Whom drover takes for a proxy in front (a PROXY protocol header, forwarding fields),
/// and whether it sends a header on; the same for `proxy` and `run`.
#[derive(Debug, Args)]
pub struct ProxyProtocolArg {
    /// Read a PROXY protocol header (v1 or v2) from these senders, comma-separated
    /// addresses or CIDR ranges (e.g. 10.0.0.0/8,127.0.0.1), and refuse connections from
    /// any other address: a balancer in front tells drover the client's address.
    #[arg(long, value_name = "ADDRS")]
    pub proxy_protocol_from: Option<model::TrustedSenders>,
    /// Start each backend connection with a PROXY protocol header naming the client:
    /// v1 (text) or v2 (binary), as HAProxy's send-proxy and send-proxy-v2. For backends
    /// that expect one (nginx `listen ... proxy_protocol`, HAProxy `accept-proxy`).
    #[arg(long, value_name = "VERSION")]
    pub send_proxy_protocol: Option<model::SendVersion>,
    /// Pass on X-Forwarded-Proto and X-Forwarded-Host as these senders write them
    /// (comma-separated addresses or CIDR ranges; 0.0.0.0/0,::/0 for everyone, as nginx
    /// passes them; none: nobody, drover writes its own for every client, as nginx's
    /// `$scheme`), and write drover's own for everyone else [default: loopback and
    /// private addresses, where a proxy in front is]
    #[arg(long, value_name = "ADDRS", value_parser = forwarded_senders)]
    pub forwarded_headers_from: Option<model::TrustedSenders>,
}

/// `--forwarded-headers-from`: addresses as `--proxy-protocol-from` takes them, or `none`
/// (`forwarded_headers = { trusted = [] }`): at the edge, no client's fields are passed.
fn forwarded_senders(s: &str) -> Result<model::TrustedSenders, String> {
    if s.trim() == "none" {
        return Ok(model::TrustedSenders::new(Vec::new()));
    }
    s.parse()
}

/// HTTPS on the listener, the same for `proxy` and `run` (`tls` in a drover.toml).
#[derive(Debug, Args)]
pub struct TlsArgs {
    /// Serve HTTPS with this certificate chain (PEM, the server's certificate first).
    /// Repeat it for several certificates, chosen by the client's SNI from their names;
    /// the first is the default. Each needs a --tls-key, in the same order.
    #[arg(long, value_name = "FILE")]
    pub tls_cert: Vec<PathBuf>,

    /// The private key (PEM) of the --tls-cert given in the same position.
    #[arg(long, value_name = "FILE")]
    pub tls_key: Vec<PathBuf>,

    /// With --tcp: the protocols agreed by ALPN, in order of preference, e.g.
    /// h2,http/1.1 (HAProxy's `bind … ssl alpn`) [default: none].
    #[arg(
        long,
        value_name = "PROTO,...",
        value_delimiter = ',',
        requires = "tls_cert"
    )]
    pub tls_alpn: Vec<String>,

    /// The oldest TLS version a client may use: 1.2 or 1.3 (nginx's `ssl_protocols
    /// TLSv1.3`, HAProxy's `ssl-min-ver`) [default: 1.2]
    #[arg(long, value_name = "VERSION", requires = "tls_cert")]
    pub tls_min_version: Option<drover_proxy::tls::MinVersion>,

    /// Ask every client for a certificate signed by one of the CA certificates in
    /// this PEM file, and refuse the handshake of one that has none (nginx's
    /// `ssl_client_certificate` with `ssl_verify_client on`, HAProxy's `ca-file` with
    /// `verify required`).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,

    /// With --tls-client-ca: `optional` serves a client without a certificate too (its
    /// backend hears none), as nginx's `ssl_verify_client optional` [default: required]
    #[arg(long, value_name = "required|optional", requires = "tls_client_ca")]
    pub tls_verify_client: Option<drover_proxy::tls::VerifyClient>,
}

impl TlsArgs {
    /// `--tls-alpn` given without `--tcp`.
    fn alpn_without_tcp(&self) -> Result<(), String> {
        if self.tls_alpn.is_empty() {
            return Ok(());
        }
        Err("--tls-alpn applies to --tcp: an HTTP listener offers h2 and http/1.1 by ALPN as --http2 says".into())
    }

    /// The model's settings; `None` without --tls-cert.
    fn settings(&self) -> Result<Option<model::TlsConfig>, String> {
        if self.tls_cert.len() != self.tls_key.len() {
            return Err(format!(
                "--tls-key: {} key(s) for {} certificate(s): give one --tls-key per --tls-cert, in the same order",
                self.tls_key.len(),
                self.tls_cert.len()
            ));
        }
        if self.tls_cert.is_empty() {
            return Ok(None);
        }
        if let Some(why) = self
            .tls_alpn
            .iter()
            .find_map(|p| drover_proxy::tls::alpn_refusal(p))
        {
            return Err(format!("--tls-alpn: {why}"));
        }
        Ok(Some(model::TlsConfig {
            alpn: self.tls_alpn.clone(),
            min_version: self.tls_min_version.unwrap_or_default(),
            client_ca: self.tls_client_ca.clone(),
            verify_client: self.tls_verify_client.unwrap_or_default(),
            certs: self
                .tls_cert
                .iter()
                .zip(&self.tls_key)
                .map(|(cert, key)| model::TlsCertFiles {
                    cert: cert.clone(),
                    key: key.clone(),
                })
                .collect(),
        }))
    }
}

/// TLS to the backends, for `proxy` (`backend_tls` in a drover.toml).
#[derive(Debug, Args)]
pub struct BackendTlsArgs {
    /// Speak TLS to every backend, verifying its certificate against the system's trust
    /// store (or --backend-ca) for its IP address (or --backend-server-name).
    #[arg(long)]
    pub backend_tls: bool,

    /// Verify backends' certificates against the CA certificates in this PEM file
    /// instead of the system's (implies --backend-tls).
    #[arg(long, value_name = "FILE")]
    pub backend_ca: Option<PathBuf>,

    /// The name verified in each backend's certificate and sent as SNI (implies
    /// --backend-tls).
    #[arg(long, value_name = "NAME")]
    pub backend_server_name: Option<String>,

    /// A client certificate (PEM) shown to backends that ask for one, mTLS (implies
    /// --backend-tls).
    #[arg(long, value_name = "FILE")]
    pub backend_cert: Option<PathBuf>,

    /// The private key (PEM) of --backend-cert [default: in --backend-cert's file].
    #[arg(long, value_name = "FILE", requires = "backend_cert")]
    pub backend_key: Option<PathBuf>,

    /// Accept any certificate from the backends: encrypted, not authenticated
    /// (implies --backend-tls).
    #[arg(long, conflicts_with = "backend_ca")]
    pub backend_insecure_skip_verify: bool,

    /// What requests go to the backends as: http1, h2c (HTTP/2 in cleartext) or h2
    /// (HTTP/2 over --backend-tls); each request one stream, so gRPC calls spread
    /// [default: http1] (`backend_protocol`).
    #[arg(long, value_name = "PROTOCOL")]
    pub backend_protocol: Option<drover_proxy::BackendProtocol>,
}

impl BackendTlsArgs {
    /// The model's settings; `None` when no flag asks for TLS to backends.
    fn settings(&self) -> Result<Option<model::BackendTlsConfig>, String> {
        let asked = self.backend_tls
            || self.backend_ca.is_some()
            || self.backend_server_name.is_some()
            || self.backend_cert.is_some()
            || self.backend_insecure_skip_verify;
        if !asked {
            return Ok(None);
        }
        if let Some(name) = &self.backend_server_name {
            drover_proxy::backend_tls::server_name(name)
                .map_err(|e| format!("--backend-server-name: {e}"))?;
        }
        Ok(Some(model::BackendTlsConfig {
            ca: self.backend_ca.clone(),
            server_name: self.backend_server_name.clone(),
            client_cert: self.backend_cert.as_ref().map(|cert| model::TlsCertFiles {
                cert: cert.clone(),
                key: self.backend_key.clone().unwrap_or_else(|| cert.clone()),
            }),
            insecure_skip_verify: self.backend_insecure_skip_verify,
        }))
    }
}

/// `origins` with the TLS files of balancer 0 (`balancer[0].tls.certs[J].cert` and
/// `.key`) named by the flags that gave them.
pub fn with_tls_flags(mut origins: crate::Origins, b: &model::BalancerConfig) -> crate::Origins {
    for j in 0..b.tls.as_ref().map_or(0, |t| t.certs.len()) {
        origins = origins
            .with_flag(&format!("balancer[0].tls.certs[{j}].cert"), "--tls-cert")
            .with_flag(&format!("balancer[0].tls.certs[{j}].key"), "--tls-key");
    }
    if let Some(bt) = &b.backend_tls {
        origins = origins
            .with_flag("balancer[0].backend_tls", "--backend-tls")
            .with_flag("balancer[0].backend_tls.ca", "--backend-ca")
            .with_flag("balancer[0].backend_tls.cert", "--backend-cert")
            .with_flag(
                "balancer[0].backend_tls.server_name",
                "--backend-server-name",
            );
        let key_flag = match &bt.client_cert {
            Some(c) if c.key != c.cert => "--backend-key",
            _ => "--backend-cert",
        };
        origins = origins.with_flag("balancer[0].backend_tls.key", key_flag);
    }
    origins
}

/// What `hash` and `sticky` pin requests by, the same for `proxy` and `run`.
#[derive(Debug, Args)]
pub struct KeyArgs {
    /// Key for --strategy hash: header:NAME, cookie:NAME, client-ip or path.
    #[arg(long, value_name = "KEY")]
    pub hash_key: Option<drover_proxy::HashKey>,

    /// Cookie name for --strategy sticky.
    #[arg(long, default_value = model::DEFAULT_STICKY_COOKIE)]
    pub sticky_cookie: String,
}

/// The access log, the same for `proxy` and `run` (`access_log` in a drover.toml).
#[derive(Debug, Args)]
pub struct AccessLogArgs {
    /// A line per answered request: "combined" (Apache/nginx's, which GoAccess reads),
    /// "json" (JSON lines) or "off".
    #[arg(long, value_name = "FORMAT", default_value_t = balancer().access_log.format)]
    pub access_log: model::AccessLogFormat,

    /// Where the lines go: a file, opened for append and reopened on SIGUSR1, or "-"
    /// for stdout.
    #[arg(long, value_name = "PATH", default_value = balancer().access_log.path)]
    pub access_log_path: String,

    /// The fields of a JSON line, comma-separated [default: all]: time, client, method,
    /// target, protocol, status, bytes, duration_ms, upstream_ms, queue_ms, endpoint,
    /// retries, error, request_id, user_agent, referer.
    #[arg(long, value_name = "FIELDS", value_parser = field_list)]
    pub access_log_fields: Option<FieldList>,
}

/// `--access-log-fields a,b,c`: one value holding a list (clap would read a bare
/// `Vec` as the flag given several times).
#[derive(Debug, Clone)]
pub struct FieldList(pub Vec<model::AccessLogField>);

fn field_list(s: &str) -> Result<FieldList, String> {
    model::AccessLogField::parse_list(s).map(FieldList)
}

impl model::BalancerConfig {
    pub(crate) fn apply_access_log(&mut self, a: &AccessLogArgs) -> Result<(), String> {
        if a.access_log_fields.is_some() && a.access_log != model::AccessLogFormat::Json {
            return Err("--access-log-fields applies to --access-log json only".into());
        }
        self.access_log = model::AccessLogConfig {
            format: a.access_log,
            path: a.access_log_path.clone(),
            fields: match &a.access_log_fields {
                Some(list) => list.0.clone(),
                None => balancer().access_log.fields,
            },
        };
        Ok(())
    }
}

/// The timeouts of a balancer's exchanges (`timeouts` in a drover.toml), for `drover
/// proxy` and `drover run` alike.
#[derive(Args, Debug, Clone)]
pub struct TimeoutArgs {
    /// How long connecting to a backend may take. Long enough for one retransmitted
    /// SYN (1 s): a backend whose listen backlog overflowed drops the first one.
    #[arg(long, default_value = shown(balancer().timeouts.connect), value_parser = drover_units::duration)]
    pub connect_timeout: Duration,

    /// How long a client may take to send a request head (slow clients are cut off);
    /// the PROXY protocol header and TLS handshake count in it. With --tcp, only the
    /// PROXY header's (with --proxy-protocol-from).
    #[arg(long, default_value = shown(balancer().timeouts.header_read), value_parser = drover_units::duration)]
    pub header_timeout: Duration,

    /// How long a backend may take to start answering, and to send more of its
    /// answer, or "off": for as long as the client waits, as with the app alone
    /// [default: 30s; drover run: off]
    #[arg(
        long,
        value_name = "DURATION",
        allow_hyphen_values = true,
        value_parser = request_timeout
    )]
    pub request_timeout: Option<RequestTimeout>,

    /// Idle keep-alive connections are closed after this (--tcp: a connection that
    /// moved nothing either way).
    #[arg(long, default_value = shown(balancer().timeouts.idle), value_parser = drover_units::duration)]
    pub idle_timeout: Duration,

    /// --tcp: once one side has finished sending, the other way is cut after this long
    /// with nothing passing.
    #[arg(long, default_value = shown(balancer().timeouts.half_close), value_parser = drover_units::positive_duration)]
    pub half_close_timeout: Duration,

    /// A client mid-request that sends or reads nothing for this long is cut off
    /// (slow POST, slow read).
    #[arg(long, default_value = shown(balancer().timeouts.client), value_parser = drover_units::duration)]
    pub client_timeout: Duration,

    /// Grace for a request body: all of it must arrive by this plus one second per
    /// --body-min-rate bytes received, or the client gets 408.
    #[arg(
        long,
        default_value = shown(balancer().timeouts.body),
        allow_hyphen_values = true,
        value_parser = drover_units::positive_duration
    )]
    pub body_timeout: Duration,

    /// Bytes per second a request body must keep up past --body-timeout.
    #[arg(
        long,
        value_name = "BYTES_PER_SEC",
        default_value_t = balancer().timeouts.body_min_rate,
        allow_hyphen_values = true,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub body_min_rate: u32,
}

/// `--request-timeout`: a duration, or `None` for "off".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestTimeout(pub Option<Duration>);

fn request_timeout(s: &str) -> Result<RequestTimeout, String> {
    drover_units::timeout_or_off(s)
        .map(RequestTimeout)
        .map_err(|e| e.to_string())
}

impl TimeoutArgs {
    /// The timeouts, with `request` where no flag says otherwise: a drover.toml
    /// balancer's for `drover proxy`, "off" for `drover run`, where drover stands in
    /// for Node's cluster primary or PM2, which bound no answer's time.
    pub fn config(&self, request: Option<Duration>) -> crate::TimeoutConfig {
        crate::TimeoutConfig {
            connect: self.connect_timeout,
            header_read: self.header_timeout,
            request: self.request_timeout.map_or(request, |given| given.0),
            idle: self.idle_timeout,
            client: self.client_timeout,
            body: self.body_timeout,
            body_min_rate: self.body_min_rate,
            half_close: self.half_close_timeout,
        }
    }

    /// Each timeout flag, the `timeouts` key it sets, and whether it was given a value
    /// other than its default (a default cannot be told from the same value typed).
    fn given(&self) -> [(&'static str, &'static str, bool); 8] {
        let d = balancer().timeouts;
        [
            (
                "--connect-timeout",
                "timeouts.connect",
                self.connect_timeout != d.connect,
            ),
            (
                "--header-timeout",
                "timeouts.header_read",
                self.header_timeout != d.header_read,
            ),
            (
                "--request-timeout",
                "timeouts.request",
                self.request_timeout.is_some(),
            ),
            (
                "--idle-timeout",
                "timeouts.idle",
                self.idle_timeout != d.idle,
            ),
            (
                "--half-close-timeout",
                "timeouts.half_close",
                self.half_close_timeout != d.half_close,
            ),
            (
                "--client-timeout",
                "timeouts.client",
                self.client_timeout != d.client,
            ),
            (
                "--body-timeout",
                "timeouts.body",
                self.body_timeout != d.body,
            ),
            (
                "--body-min-rate",
                "timeouts.body_min_rate",
                self.body_min_rate != d.body_min_rate,
            ),
        ]
    }

    /// The first timeout flag given, if any.
    fn first_given(&self) -> Option<&'static str> {
        self.given().into_iter().find(|g| g.2).map(|g| g.0)
    }

    /// The first flag given that bounds an HTTP exchange only, by its `timeouts` key:
    /// a TCP balancer has none of these (the header read bounds its PROXY header or
    /// its TLS handshake, when it has one: `reads_first`).
    fn http_only_given(&self, reads_first: bool) -> Option<&'static str> {
        self.given()
            .into_iter()
            .filter(|g| match g.1 {
                "timeouts.header_read" => !reads_first,
                key => matches!(
                    key,
                    "timeouts.request"
                        | "timeouts.client"
                        | "timeouts.body"
                        | "timeouts.body_min_rate"
                ),
            })
            .find(|g| g.2)
            .map(|g| g.1)
    }

    /// `--half-close-timeout` given without `--tcp`.
    fn half_close_without_tcp(&self) -> Result<(), String> {
        if self.half_close_timeout != balancer().timeouts.half_close {
            return Err("--half-close-timeout applies to --tcp only".into());
        }
        Ok(())
    }
}

/// Per-backend limits and drover's queue, the same for `proxy` and `run`.
#[derive(Debug, Args)]
pub struct LimitArgs {
    /// Requests per backend before drover queues the rest: "auto" (a limit learned from
    /// latency, in force only while a backend's CPU is saturated), 0 (no limit) or N (at
    /// most N in flight).
    #[arg(long, default_value_t = balancer().max_conns)]
    pub max_conns: crate::ConnLimit,

    /// Requests that may wait in drover's queue for a backend at its limit: "unlimited"
    /// (each waits up to the queue timeout) or N (more get a 503 at once; 0: never wait).
    #[arg(long, default_value_t = balancer().queue.max)]
    pub queue_max: crate::QueueMax,

    /// How long a request may wait in the queue [default: the request timeout]; up to
    /// twice that while the queue drains towards it.
    #[arg(long, value_parser = drover_units::duration)]
    pub queue_timeout: Option<Duration>,

    /// The largest request head a client may send, its target included, e.g. 65536 or
    /// 64KiB: over it a 431 (a 414 for the target) [default: 16KiB, as Node's http
    /// server] (`limits.max_header_bytes` and `max_uri_bytes`).
    #[arg(long, value_name = "BYTES", value_parser = head_bytes)]
    pub max_header_bytes: Option<usize>,

    /// The largest request body a client may send, e.g. 10M: over it a 413, before the
    /// body is read when its length is given [default: no limit; 0: none]. drover then
    /// sees every request: `auto` hands no connection to the workers
    /// (`limits.max_body_bytes`).
    #[arg(long, value_name = "BYTES", value_parser = body_bytes)]
    pub max_body_bytes: Option<u64>,
}

/// `--max-body-bytes`: a size, as drover.toml's `limits.max_body_bytes`.
fn body_bytes(s: &str) -> Result<u64, String> {
    drover_units::byte_size(s).map_err(|e| e.to_string())
}

/// `--max-header-bytes`: a size within drover.toml's bounds for `limits.max_header_bytes`.
fn head_bytes(s: &str) -> Result<usize, String> {
    let n = drover_units::byte_size(s).map_err(|e| e.to_string())?;
    let (lo, hi) = model::HEAD_BYTES_RANGE;
    usize::try_from(n)
        .ok()
        .filter(|n| (lo..=hi).contains(n))
        .ok_or_else(|| format!("{n} bytes is out of range: expected {lo}..={hi} (1KiB to 1MiB)"))
}

/// A duration with its unit (`5s`), or a bare number of milliseconds, as PM2 reads its
/// `--kill-timeout 3000`.
fn pm2_millis(s: &str) -> Result<Duration, String> {
    match s.trim().parse::<u64>() {
        Ok(ms) => Ok(Duration::from_millis(ms)),
        Err(_) => drover_units::duration(s).map_err(|e| e.to_string()),
    }
}

pub(crate) fn byte_size(s: &str) -> Result<u64, String> {
    match drover_units::byte_size(s).map_err(|e| e.to_string())? {
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
        crate::file::listen_addr(s)
            .map(|a| AdminListen(Some(a)))
            .map_err(|e| format!("{e}, or \"off\""))
    }
}

fn threads(s: &str) -> Result<usize, String> {
    if s == "auto" {
        return Ok(default_threads());
    }
    match s.parse::<usize>() {
        Ok(n) if (1..=model::THREADS_MAX).contains(&n) => Ok(n),
        _ => Err(format!(
            "expected a number from 1 to {} or \"auto\", got {s:?}",
            model::THREADS_MAX
        )),
    }
}

#[derive(Debug, Args)]
pub struct ProxyArgs {
    /// Read balancers from this drover.toml instead of flags.
    #[arg(short, long, value_name = "FILE", conflicts_with_all = ["listen", "backend"])]
    pub config: Option<PathBuf>,

    /// Address to accept clients on.
    #[arg(short, long, value_name = "ADDR", required_unless_present = "config", value_parser = crate::file::listen_addr)]
    pub listen: Option<SocketAddr>,

    /// A backend (repeat for each): IP:PORT, dns:HOST:PORT (A/AAAA records, followed
    /// on their TTL), dns+srv:NAME (SRV records) or etcd:/PREFIX (with --etcd). May be
    /// left out with --admin: members then register at runtime (`drover ctl members
    /// add`, the SDK).
    #[arg(
        short,
        long = "backend",
        value_name = "BACKEND",
        required_unless_present_any = ["config", "admin", "redirect_to_https"]
    )]
    pub backend: Vec<String>,

    /// Answer every request with a redirect (308) to the same host and target over
    /// HTTPS on this port, and proxy none: the plain listener beside a TLS one.
    #[arg(
        long,
        value_name = "PORT",
        conflicts_with_all = ["backend", "tls_cert"],
        value_parser = clap::value_parser!(u16).range(1..)
    )]
    pub redirect_to_https: Option<u16>,

    /// Offer HTTP/2 by ALPN on a --tls-cert listener: on (the default) or off (`http2`
    /// in a drover.toml).
    #[arg(long, value_name = "on|off", value_parser = clap::builder::BoolishValueParser::new())]
    pub http2: Option<bool>,

    /// Serve cleartext HTTP/2 to clients that open with its preface (prior knowledge,
    /// curl --http2-prior-knowledge), HTTP/1.1 to the others (`h2c = true`).
    #[arg(long)]
    pub h2c: bool,

    /// Streams an HTTP/2 client may have open at once on one connection, 1 to 10000
    /// [default: 128] (`http2_max_streams`; with --tls-cert or --h2c).
    #[arg(
        long,
        value_name = "N",
        value_parser = clap::value_parser!(u32).range(1..=model::HTTP2_MAX_STREAMS_MAX as i64)
    )]
    pub http2_max_streams: Option<u32>,

    /// DNS server for dns: backends (repeat for more) [default: the system's, from
    /// /etc/resolv.conf].
    #[arg(long, value_name = "IP[:PORT]", conflicts_with = "config")]
    pub resolver: Vec<String>,

    /// etcd client URL for etcd: backends and for members registered here (repeat for
    /// more), e.g. http://127.0.0.1:2379, or https://10.0.0.5:2379 for etcd over TLS.
    #[arg(long, value_name = "URL", conflicts_with = "config")]
    pub etcd: Vec<String>,

    /// Verify etcd's certificate against the CA certificates in this PEM file instead
    /// of the system's (https:// --etcd URLs; etcdctl's --cacert).
    #[arg(long, value_name = "FILE", conflicts_with = "config")]
    pub etcd_ca: Option<PathBuf>,

    /// A client certificate (PEM) shown to etcd, for a cluster started with
    /// --client-cert-auth (https:// --etcd URLs; etcdctl's --cert).
    #[arg(long, value_name = "FILE", conflicts_with = "config")]
    pub etcd_cert: Option<PathBuf>,

    /// The private key (PEM) of --etcd-cert [default: in --etcd-cert's file].
    #[arg(long, value_name = "FILE", requires = "etcd_cert")]
    pub etcd_key: Option<PathBuf>,

    /// The etcd user drover logs in as, on a cluster with authentication on
    /// (etcdctl's --user); its password is in --etcd-password-file.
    #[arg(
        long,
        value_name = "NAME",
        conflicts_with = "config",
        requires = "etcd_password_file"
    )]
    pub etcd_user: Option<String>,

    /// A file that holds the password of --etcd-user (one trailing newline is not part
    /// of it), read at start, at each reload and at each login.
    #[arg(
        long,
        value_name = "FILE",
        conflicts_with = "config",
        requires = "etcd_user"
    )]
    pub etcd_password_file: Option<PathBuf>,

    /// The balancer's name, as the members API and `drover ctl` use it.
    #[arg(long, default_value = model::DEFAULT_BALANCER, conflicts_with = "config")]
    pub name: String,

    /// Admin API address (status, `drover ctl`, members joining at runtime), or "off";
    /// none unless given. With --config, the file's [admin] table says it.
    #[arg(long, value_name = "ADDR", conflicts_with = "config")]
    pub admin: Option<AdminListen>,

    #[command(flatten)]
    pub admin_token: AdminTokenArg,

    /// round-robin, weighted, least-conn, random, p2c, peak-ewma, hash or sticky.
    #[arg(short, long, default_value_t)]
    pub strategy: drover_balance::Strategy,

    /// Serving threads ("auto": one per core).
    #[arg(short, long, default_value = "auto", value_parser = threads)]
    pub threads: usize,

    /// Balance TCP connections instead of HTTP requests: each connection goes to a
    /// backend once, at accept, and its bytes are relayed both ways unread (`mode =
    /// "tcp"` in a drover.toml). A flag of its own, not `--mode tcp`: `drover run
    /// --mode` already names how a worker's connections are served.
    #[arg(long)]
    pub tcp: bool,

    /// Extra attempts on another backend for a request that failed safely.
    #[arg(long, default_value_t = balancer().retries, value_parser = clap::value_parser!(u32).range(0..=10))]
    pub retries: u32,

    #[command(flatten)]
    pub limits: LimitArgs,

    #[command(flatten)]
    pub proxy_protocol: ProxyProtocolArg,

    #[command(flatten)]
    pub access_log: AccessLogArgs,

    #[command(flatten)]
    pub tls: TlsArgs,

    #[command(flatten)]
    pub backend_tls: BackendTlsArgs,

    #[command(flatten)]
    pub timeouts: TimeoutArgs,

    /// Active HTTP health check path (e.g. /health).
    #[arg(long, value_name = "PATH", conflicts_with = "health_tcp")]
    pub health_path: Option<String>,

    /// Active health check by TCP connect.
    #[arg(long)]
    pub health_tcp: bool,

    /// With --health-tcp: bytes to write once connected (\r, \n, \t, \\ and \xHH
    /// escapes), e.g. "PING\r\n"; needs --health-receive.
    #[arg(long, value_name = "BYTES", requires = "health_receive", value_parser = escaped)]
    pub health_send: Option<Bytes>,

    /// With --health-tcp: what the answer must contain (same escapes), e.g. "+PONG"; a
    /// service that speaks first (SMTP, SSH) needs no --health-send.
    #[arg(long, value_name = "BYTES", requires = "health_tcp", value_parser = escaped)]
    pub health_receive: Option<Bytes>,

    /// Active health check by the gRPC health protocol (grpc.health.v1.Health/Check),
    /// for SERVICE (none: the server as a whole); needs --backend-protocol h2c or h2.
    #[arg(
        long,
        value_name = "SERVICE",
        num_args = 0..=1,
        default_missing_value = "",
        conflicts_with_all = ["health_path", "health_tcp"]
    )]
    pub health_grpc: Option<String>,

    #[command(flatten)]
    pub health_timing: HealthTimingArgs,

    /// A joining or returning backend's share ramps up over this long (0s: off).
    #[arg(long, default_value = shown(balancer().slow_start), value_parser = drover_units::duration)]
    pub slow_start: Duration,

    #[command(flatten)]
    pub keys: KeyArgs,

    /// On SIGTERM, how long in-flight requests may take to finish.
    #[arg(long, default_value = shown(balancer().drain_timeout), value_parser = drover_units::duration)]
    pub drain_timeout: Duration,

    /// On SIGTERM or SIGINT, how long drover still accepts clients, while /readyz says
    /// it is stopping, before it drains (HAProxy's `grace`): for a load balancer or
    /// Kubernetes in front, which takes drover out of rotation only some seconds later.
    #[arg(long, default_value = shown(balancer().shutdown_delay), value_parser = drover_units::duration)]
    pub shutdown_delay: Duration,
}

// Each flag's default is the model's (which reads the library's where it has one),
// shown by `--help` as written: one definition of each.

/// A duration as flags take it and `--help` shows it: `5s`, `1m`.
fn shown(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

/// A balancer with every setting at its default.
fn balancer() -> model::BalancerConfig {
    model::BalancerConfig::new("", SocketAddr::from(([127, 0, 0, 1], 0)), Vec::new())
}

/// An app with every setting at its default.
fn app() -> model::AppSpec {
    model::AppSpec::new("", Vec::new())
}

/// How often and how patiently backends (or workers) are checked, for `drover proxy`
/// and `drover run` alike: a worker killed as hung is told to raise `--fall` or
/// `--health-interval`, so both commands take them.
#[derive(Args, Debug, Clone, PartialEq)]
pub struct HealthTimingArgs {
    /// How often each backend (or worker) is probed.
    #[arg(long, default_value = shown(health().interval), value_parser = drover_units::duration)]
    pub health_interval: Duration,

    /// How long a probe may take before it counts as failed.
    #[arg(long, default_value = shown(health().timeout), value_parser = drover_units::duration)]
    pub health_timeout: Duration,

    /// Passing checks before a down backend is used again.
    #[arg(long, default_value_t = health().rise, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub rise: u32,

    /// Failing checks in a row (with no request completing meanwhile) before a backend
    /// is taken out, or a worker restarted.
    #[arg(long, default_value_t = health().fall, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub fall: u32,
}

impl HealthTimingArgs {
    /// A check with these timings (of the default kind, which the caller replaces).
    fn check(&self) -> model::HealthCheck {
        model::HealthCheck {
            interval: self.health_interval,
            timeout: self.health_timeout,
            rise: self.rise,
            fall: self.fall,
            ..health()
        }
    }

    /// The first of these flags given with a value other than its default: it needs a
    /// health check to time.
    fn first_changed(&self) -> Option<&'static str> {
        let d = health();
        [
            (self.health_interval != d.interval, "--health-interval"),
            (self.health_timeout != d.timeout, "--health-timeout"),
            (self.rise != d.rise, "--rise"),
            (self.fall != d.fall, "--fall"),
        ]
        .into_iter()
        .find_map(|(changed, flag)| changed.then_some(flag))
    }
}

/// A health check with every setting at its default.
fn health() -> model::HealthCheck {
    model::HealthCheck::default()
}

/// Flags that cannot run as given; the message names the flag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlagError(String);

impl std::fmt::Display for FlagError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for FlagError {}

impl model::BalancerConfig {
    /// `--strategy` with `--hash-key` and `--sticky-cookie`, checked together.
    pub(crate) fn apply_strategy(
        &mut self,
        strategy: Strategy,
        keys: &KeyArgs,
    ) -> Result<(), String> {
        if strategy == Strategy::Hash && keys.hash_key.is_none() {
            return Err(
                "--strategy hash needs --hash-key (header:NAME, cookie:NAME, client-ip or path)"
                    .into(),
            );
        }
        if keys.hash_key.is_some() && strategy != Strategy::Hash {
            return Err("--hash-key only applies to --strategy hash".into());
        }
        self.strategy = strategy;
        self.hash = keys.hash_key.clone();
        self.sticky = (strategy == Strategy::Sticky).then(|| model::StickyConfig {
            cookie: keys.sticky_cookie.clone(),
        });
        Ok(())
    }

    /// The `--max-conns`, `--queue-max`, `--queue-timeout` and `--max-header-bytes` flags.
    pub(crate) fn apply_limits(&mut self, a: &LimitArgs) {
        self.max_conns = a.max_conns;
        self.queue = model::QueueConfig {
            max: a.queue_max,
            timeout: a.queue_timeout,
        };
        if let Some(n) = a.max_header_bytes {
            // One number, as Node's --max-http-header-size: the target is part of the head.
            self.limits.max_header_bytes = n;
            self.limits.max_uri_bytes = n;
        }
        if let Some(n) = a.max_body_bytes {
            self.limits.max_body_bytes = (n > 0).then_some(n);
        }
    }
}

/// What `drover proxy` runs when given flags instead of a file: the same model a file
/// fills, so a setting has one default and one set of checks.
pub fn proxy_config(a: &ProxyArgs) -> Result<Config, FlagError> {
    proxy_config_text(a).map_err(FlagError)
}

fn proxy_config_text(a: &ProxyArgs) -> Result<Config, String> {
    let admin = match a.admin.and_then(|admin| admin.0) {
        Some(listen) => Some(a.admin_token.admin_at(listen)?),
        None => None,
    };
    let mut resolver = crate::ResolverConfig::default();
    if !a.resolver.is_empty() {
        let servers = a
            .resolver
            .iter()
            .map(|s| crate::nameserver(s).map_err(|e| format!("--resolver: {e}")))
            .collect::<Result<Vec<_>, _>>()?;
        resolver.nameservers = Some(servers);
    }
    for url in &a.etcd {
        crate::check_etcd_endpoint(url).map_err(|e| format!("--etcd: {e}"))?;
    }
    let tls_given = a.etcd_ca.is_some() || a.etcd_cert.is_some();
    let uses_tls = crate::etcd_endpoints_use_tls(&a.etcd, tls_given).map_err(|e| {
        if a.etcd.is_empty() {
            "--etcd-ca and --etcd-cert need --etcd https://HOST:PORT".to_string()
        } else {
            format!("--etcd: {e}")
        }
    })?;
    if a.etcd.is_empty() && a.etcd_user.is_some() {
        return Err(
            "--etcd-user and --etcd-password-file need --etcd URL, the cluster's client URL".into(),
        );
    }
    if a.etcd_user.as_deref() == Some("") {
        return Err("--etcd-user: empty user name".into());
    }
    let etcd = (!a.etcd.is_empty()).then(|| crate::EtcdConfig {
        endpoints: a.etcd.clone(),
        tls: uses_tls.then(|| model::BackendTlsConfig {
            ca: a.etcd_ca.clone(),
            client_cert: a.etcd_cert.as_ref().map(|cert| model::TlsCertFiles {
                cert: cert.clone(),
                key: a.etcd_key.clone().unwrap_or_else(|| cert.clone()),
            }),
            ..model::BackendTlsConfig::default()
        }),
        auth: a
            .etcd_user
            .as_ref()
            .zip(a.etcd_password_file.as_ref())
            .map(|(user, file)| model::EtcdAuthConfig {
                user: user.clone(),
                password_file: file.clone(),
            }),
    });
    Ok(crate::Config {
        admin,
        resolver,
        etcd,
        apps: Vec::new(),
        balancers: vec![proxy_balancer_text(a)?],
    })
}

/// The balancer the `proxy` flags describe, as a config entry so flags and files
/// share one validation and one translation.
pub fn proxy_balancer(a: &ProxyArgs) -> Result<model::BalancerConfig, FlagError> {
    proxy_balancer_text(a).map_err(FlagError)
}

fn proxy_balancer_text(a: &ProxyArgs) -> Result<model::BalancerConfig, String> {
    let listen = a.listen.ok_or("--listen is required without --config")?;
    let admin = a.admin.and_then(|admin| admin.0);
    if a.backend.is_empty() && admin.is_none() && a.redirect_to_https.is_none() {
        return Err(
            "at least one --backend is required (or --admin, for members that register at runtime)"
                .into(),
        );
    }
    if let Some(flag) = a.health_timing.first_changed() {
        if a.health_path.is_none() && !a.health_tcp && a.health_grpc.is_none() {
            return Err(format!("{flag} times the backends' active health checks, and none is asked for: add --health-path PATH (or --health-tcp, --health-grpc)"));
        }
    }
    if !crate::is_valid_name(&a.name) {
        return Err(format!("--name {:?}: {}", a.name, crate::NAME_RULE));
    }
    let mut backends = Vec::new();
    for b in &a.backend {
        let backend = crate::backend_from_flag(b, !a.etcd.is_empty())
            .map_err(|e| format!("--backend: {e}"))?;
        if backends.contains(&backend) {
            return Err(format!("--backend {b} is given twice"));
        }
        if matches!(backend, BackendRef::Etcd(_))
            && backends.iter().any(|o| matches!(o, BackendRef::Etcd(_)))
        {
            return Err(format!(
                "--backend {b}: one etcd: prefix per balancer (the members API writes to it)"
            ));
        }
        backends.push(backend);
    }
    let mut b = crate::BalancerConfig::new(a.name.clone(), listen, backends);
    if a.tcp {
        b.mode = model::Protocol::Tcp;
        refuse_http_only_flags(a)?;
        if let Some(why) = model::tcp_strategy_refusal(a.strategy, a.keys.hash_key.as_ref()) {
            return Err(format!("--tcp: {why}"));
        }
    } else {
        a.timeouts.half_close_without_tcp()?;
        a.tls.alpn_without_tcp()?;
    }
    b.apply_strategy(a.strategy, &a.keys)?;
    b.retries = a.retries;
    b.apply_limits(&a.limits);
    b.proxy_protocol = a.proxy_protocol.proxy_protocol_from.clone();
    b.send_proxy_protocol = a.proxy_protocol.send_proxy_protocol;
    b.forwarded_headers = a.proxy_protocol.forwarded_headers_from.clone();
    b.apply_access_log(&a.access_log)?;
    b.tls = a.tls.settings()?;
    b.backend_tls = a.backend_tls.settings()?;
    if let Some(protocol) = a.backend_tls.backend_protocol {
        let refusal = model::backend_protocol_refusal(
            protocol,
            b.backend_tls.is_some(),
            b.send_proxy_protocol.is_some(),
        );
        if let Some(why) = refusal {
            return Err(format!("--backend-protocol {protocol}: {why}"));
        }
        b.backend_protocol = protocol;
    }
    b.redirect_to_https = a.redirect_to_https;
    b.http2 = a.http2.unwrap_or(b.http2);
    if a.h2c {
        if b.tls.is_some() {
            return Err("--h2c is HTTP/2 in cleartext; with --tls-cert, HTTP/2 is offered by ALPN (--http2, on by default): drop --h2c".into());
        }
        if !b.http2 {
            return Err(
                "--h2c serves HTTP/2, which --http2 off turns off: drop one of them".into(),
            );
        }
        b.h2c = true;
    }
    if let Some(n) = a.http2_max_streams {
        if !(b.h2c || (b.tls.is_some() && b.http2)) {
            return Err("--http2-max-streams bounds HTTP/2 connections, which need --tls-cert (with --http2 on, the default) or --h2c".into());
        }
        b.http2_max_streams = n;
    }
    b.timeouts = a.timeouts.config(balancer().timeouts.request);
    if let Some(service) = &a.health_grpc {
        if !b.backend_protocol.is_http2() {
            return Err(format!("--health-grpc: {}", model::GRPC_CHECK_NEEDS_HTTP2));
        }
        b.health = Some(model::HealthCheck {
            kind: model::CheckKind::Grpc {
                service: service.as_str().into(),
            },
            ..a.health_timing.check()
        });
    }
    if a.health_tcp || a.health_path.is_some() {
        b.health = Some(model::HealthCheck {
            kind: match &a.health_path {
                Some(path) => model::CheckKind::Http {
                    path: path.clone(),
                    expect: model::StatusRange::default(),
                },
                None => match &a.health_receive {
                    Some(receive) => model::CheckKind::TcpExchange {
                        send: a
                            .health_send
                            .clone()
                            .map_or_else(Box::default, |b| b.0.into()),
                        receive: receive.0.clone().into(),
                    },
                    None => model::CheckKind::Tcp,
                },
            },
            ..a.health_timing.check()
        });
    }
    if a.tcp && b.max_conns == crate::ConnLimit::Auto {
        // "auto" learns from request latency, and is only --max-conns's default: a TCP
        // balancer has no cap unless given a number (a typed "auto" reads the same).
        b.max_conns = crate::ConnLimit::Fixed(0);
    }
    b.slow_start = a.slow_start;
    b.drain_timeout = a.drain_timeout;
    b.shutdown_delay = a.shutdown_delay;
    b.threads = Some(a.threads);
    Ok(b)
}

/// Bytes given on the command line with escapes (`--health-send`, `--health-receive`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bytes(pub Vec<u8>);

/// `\r`, `\n`, `\t`, `\\`, `\0` and `\xHH`: what a protocol's bytes need that a shell
/// argument cannot hold plainly. Anything else after a backslash is refused, not guessed.
fn escaped(s: &str) -> Result<Bytes, String> {
    let mut out = Vec::with_capacity(s.len());
    let mut bytes = s.bytes();
    while let Some(b) = bytes.next() {
        if b != b'\\' {
            out.push(b);
            continue;
        }
        out.push(match bytes.next() {
            Some(b'r') => b'\r',
            Some(b'n') => b'\n',
            Some(b't') => b'\t',
            Some(b'0') => 0,
            Some(b'\\') => b'\\',
            Some(b'x') => {
                let hex: Vec<u8> = bytes.by_ref().take(2).collect();
                std::str::from_utf8(&hex)
                    .ok()
                    .filter(|h| h.len() == 2)
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or_else(|| format!("invalid escape in {s:?}: \\x takes two hex digits"))?
            }
            other => {
                let shown = other.map_or("the end".to_string(), |c| format!("{:?}", c as char));
                return Err(format!(
                    "invalid escape in {s:?}: a backslash before {shown}; use \\r, \\n, \\t, \\0, \\\\ or \\xHH"
                ));
            }
        });
    }
    if out.is_empty() {
        return Err("empty: give the bytes, or leave the flag out".into());
    }
    Ok(Bytes(out))
}

/// `drover proxy --tcp` with a flag only HTTP has, given a value other than its default
/// (a flag's default cannot be told from the same value typed).
fn refuse_http_only_flags(a: &ProxyArgs) -> Result<(), String> {
    // With a PROXY header to read or a handshake to make, the header timeout bounds
    // that, as in HTTP mode.
    let reads_first = a.proxy_protocol.proxy_protocol_from.is_some() || !a.tls.tls_cert.is_empty();
    if let Some(key) = a.timeouts.http_only_given(reads_first) {
        return Err(model::HttpOnly::of(key).in_flags());
    }
    let given = [
        ("health.path", a.health_path.is_some()),
        ("health.grpc", a.health_grpc.is_some()),
        ("backend_protocol", a.backend_tls.backend_protocol.is_some()),
        ("redirect_to_https", a.redirect_to_https.is_some()),
        ("http2", a.http2.is_some()),
        ("h2c", a.h2c),
        ("http2_max_streams", a.http2_max_streams.is_some()),
        (
            "forwarded_headers",
            a.proxy_protocol.forwarded_headers_from.is_some(),
        ),
        ("limits.max_body_bytes", a.limits.max_body_bytes.is_some()),
        ("limits", a.limits.max_header_bytes.is_some()),
    ];
    if let Some((key, _)) = given.into_iter().find(|(_, given)| *given) {
        return Err(model::HttpOnly::of(key).in_flags());
    }
    let log = &a.access_log;
    match model::tcp_access_log_refusal(log.access_log, log.access_log_fields.is_some()) {
        Some(why) if log.access_log == model::AccessLogFormat::Combined => {
            Err(format!("--access-log combined: {why}"))
        }
        Some(why) => Err(format!("--access-log-fields: {why}")),
        None => Ok(()),
    }
}

/// What `drover run` runs, from its flags.
pub struct RunConfig {
    pub config: Config,
    /// Where the settings that can fail at start-up came from (the flags).
    pub origins: crate::Origins,
    /// `--admin` was given: the admin API must start. Otherwise it takes the default
    /// address if that is free (another drover may hold it).
    pub admin_asked: bool,
    /// The balancers that start once their app's first worker's `listen()` is heard,
    /// at the port it names if it names one (`drover_supervisor::FirstListen`); at
    /// their `listen` in `config` otherwise. `drover run` of a Node app without
    /// `--listen`, and every cluster-mode app of an ecosystem file.
    pub follow: Vec<FollowListen>,
    /// What the user should know of how drover read an ecosystem file: the keys it
    /// does not apply. One line each.
    pub notes: Vec<String>,
    /// The ecosystem file the apps came from, read again on a reload.
    pub ecosystem: Option<crate::ecosystem::Source>,
}

/// A balancer of `RunConfig::follow`.
#[derive(Debug, Clone, PartialEq)]
pub struct FollowListen {
    /// Its index in `config.balancers`.
    pub balancer: usize,
    /// Where its `listen` came from, for an error that cannot bind it.
    pub default_from: String,
    /// How the user serves the app's clients at another address (`-l ADDR`), where
    /// there is a way: an ecosystem file's app has none but its own `PORT`.
    pub elsewhere: Option<String>,
}

/// How many workers `drover run` starts when `-w` does not say: for an app that serves
/// clients, the `WEB_CONCURRENCY` of drover's environment (`platforms`), which Heroku,
/// Render and Dokku set from the machine's memory and gunicorn and throng read, else
/// one per core; one for a background app, as PM2 starts a plain process once (a
/// scheduler run twice does its jobs twice).
fn default_workers(mode: model::Mode, platforms: Option<&str>) -> Result<model::Workers, String> {
    if mode == model::Mode::Background {
        return Ok(model::Workers::Count(1));
    }
    match platforms.map(str::trim).filter(|n| !n.is_empty()) {
        None => Ok(model::Workers::Auto),
        Some(n) => match n.parse::<usize>() {
            Ok(n) if (1..=drover_supervisor::MAX_WORKERS).contains(&n) => {
                Ok(model::Workers::Count(n))
            }
            _ => Err(format!(
                "WEB_CONCURRENCY={n:?} in drover's environment is not a number of workers (1-{}), and drover run starts that many when -w does not say: set a number, unset it, or pass -w N",
                drover_supervisor::MAX_WORKERS
            )),
        },
    }
}

/// The first of `args`' flags that only a balancer uses, if any was given: a background
/// app has none.
fn balancer_flag(args: &RunArgs) -> Option<&'static str> {
    balancer_flag_but(args, None)
}

/// `balancer_flag`, leaving out `except`.
fn balancer_flag_but(args: &RunArgs, except: Option<&str>) -> Option<&'static str> {
    let l = &args.limits;
    let given = [
        (args.listen.is_some(), "--listen"),
        (args.strategy.is_some(), "--strategy"),
        (l.max_conns != crate::ConnLimit::Auto, "--max-conns"),
        (
            l.queue_max != model::QueueConfig::default().max,
            "--queue-max",
        ),
        (l.queue_timeout.is_some(), "--queue-timeout"),
        (l.max_header_bytes.is_some(), "--max-header-bytes"),
        (l.max_body_bytes.is_some(), "--max-body-bytes"),
        (args.keys.hash_key.is_some(), "--hash-key"),
        (
            args.proxy_protocol.proxy_protocol_from.is_some(),
            "--proxy-protocol-from",
        ),
        (
            args.proxy_protocol.forwarded_headers_from.is_some(),
            "--forwarded-headers-from",
        ),
        (args.health_path.is_some(), "--health-path"),
        (args.health_grpc.is_some(), "--health-grpc"),
        (args.app_port.is_some(), "--app-port"),
        (args.worker_ports.is_some(), "--worker-ports"),
        (args.slow_start.is_some(), "--slow-start"),
        (!args.tls.tls_cert.is_empty(), "--tls-cert"),
        (!args.tls.tls_key.is_empty(), "--tls-key"),
        (
            args.access_log.access_log != model::AccessLogFormat::Off,
            "--access-log",
        ),
        (args.h2c, "--h2c"),
        (args.backend_protocol.is_some(), "--backend-protocol"),
        (args.tcp, "--tcp"),
    ];
    given
        .into_iter()
        .find(|&(set, flag)| set && Some(flag) != except)
        .map(|(_, flag)| flag)
        .or_else(|| args.timeouts.first_given())
}

/// Where `drover run` accepts clients when no `--listen` says, nor `PORT`, nor the
/// app's own `listen()`.
pub const DEFAULT_RUN_LISTEN: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 8000);

/// Where `drover run` accepts clients, and what said so (for an error that cannot bind
/// it): `--listen`; else the `PORT` of drover's environment (`users_port`), on every
/// IPv4 address, as the platforms that set it (Heroku, Cloud Run, Render, Fly) route
/// clients to it and `node app.js` would listen there; else `DEFAULT_RUN_LISTEN`. A
/// Node app's own `listen()` may still name another port (see `FollowListen`).
fn run_listen(
    listen: Option<SocketAddr>,
    users_port: Option<&str>,
) -> Result<(SocketAddr, &'static str), String> {
    if let Some(listen) = listen {
        return Ok((listen, "--listen"));
    }
    match users_port.map(str::trim).filter(|p| !p.is_empty()) {
        None => Ok((DEFAULT_RUN_LISTEN, "--listen")),
        Some(port) => match port.parse::<u16>() {
            Ok(port) if port > 0 => Ok((
                SocketAddr::from((std::net::Ipv4Addr::UNSPECIFIED, port)),
                "PORT (drover's environment)",
            )),
            _ => Err(format!(
                "PORT={port:?} in drover's environment is not a port (1-65535), and clients would connect there: set a port, unset PORT, or pass -l ADDR"
            )),
        },
    }
}

/// `drover run -w N -- CMD`: one app and a balancer in front of it (or, in shared
/// mode, a socket per worker on the listen address).
pub fn run_config(args: &RunArgs) -> Result<RunConfig, FlagError> {
    run_config_text(args).map_err(FlagError)
}

fn run_config_text(args: &RunArgs) -> Result<RunConfig, String> {
    if let [file] = &args.command[..] {
        if crate::ecosystem::is_ecosystem_file(file) {
            return ecosystem_run_config(args, file);
        }
    }
    if args.env_name.is_some() || !args.only.is_empty() {
        let flag = if args.env_name.is_some() {
            "--env"
        } else {
            "--only"
        };
        return Err(format!("{flag} applies to a PM2 ecosystem file (drover run ecosystem.config.js {flag} NAME), and the command runs a program"));
    }
    if !crate::is_valid_name(&args.name) {
        return Err(format!("--name {:?}: {}", args.name, crate::NAME_RULE));
    }
    if let Some(flag) = args.health_timing.first_changed() {
        if args.health_path.is_none() && args.health_grpc.is_none() {
            return Err(format!("{flag} times the workers' health checks, and none is asked for: add --health-path PATH (or --health-grpc)"));
        }
    }
    let command =
        crate::pm2_order::command_string(&args.command).unwrap_or_else(|| args.command.clone());
    let background = args.mode == model::Mode::Background;
    let (listen, listen_from) = match background {
        // No clients: the app's env has PORT as written.
        true => (DEFAULT_RUN_LISTEN, "--listen"),
        false => run_listen(args.listen, std::env::var("PORT").ok().as_deref())?,
    };
    let mut app = model::AppConfig::new(&args.name, command);
    app.spec.workers = match args.workers {
        Some(workers) => workers,
        None => default_workers(args.mode, std::env::var("WEB_CONCURRENCY").ok().as_deref())?,
    };
    app.spec.mode = args.mode;
    app.spec.max_memory = args.max_memory;
    app.spec.drain_timeout = args.drain_timeout;
    app.spec.stop_timeout = args.stop_timeout;
    if args.max_restarts.is_some() {
        app.spec.restart.max_restarts = args.max_restarts;
    }
    app.spec.ready_timeout = args.ready_timeout;
    app.spec.wait_ready = args.wait_ready;
    app.spec.app_port = args.app_port;
    app.spec.worker_ports = args.worker_ports;
    if args.watch {
        app.spec.watch = Some(drover_supervisor::watch::WatchSpec::new(vec![".".into()]));
    }
    let notes = crate::ecosystem::apply_pm2_flags(&mut app, &args.pm2_flags)?;
    let command = app.spec.command.clone();
    let mut balancers = Vec::new();
    if args.proxy_protocol.send_proxy_protocol.is_some() {
        return Err("--send-proxy-protocol does not apply to drover run: drover checks and hands connections to its workers without a header, and a Node server reads none (use it with drover proxy, in front of backends that expect one)".into());
    }
    match args.mode {
        model::Mode::Background => {
            if let Some(flag) = balancer_flag(args) {
                return Err(format!("{flag} does not apply to --mode background: its workers serve no port, and drover runs no balancer for them"));
            }
            if drover_supervisor::command_uses_port(&command) {
                return Err("{port} in the command needs a port per worker, and in --mode background the workers serve none".into());
            }
        }
        model::Mode::Shared => {
            let l = &args.limits;
            if l.max_conns != crate::ConnLimit::Auto
                || l.queue_max != model::QueueConfig::default().max
                || l.queue_timeout.is_some()
                || l.max_header_bytes.is_some()
                || l.max_body_bytes.is_some()
                || args.keys.hash_key.is_some()
            {
                return Err("--max-conns, --queue-max, --queue-timeout, --max-header-bytes, --max-body-bytes and --hash-key do not apply to --mode shared: drover does not see the requests".into());
            }
            if args.strategy.is_some() {
                return Err("--strategy does not apply to --mode shared: drover places connections by the workers' load".into());
            }
            if args.app_port.is_some() {
                return Err("--app-port does not apply to --mode shared: each worker's first listen() serves the socket drover passes it".into());
            }
            if args.slow_start.is_some() {
                return Err("--slow-start does not apply to --mode shared: drover places connections by the workers' load, not by weights".into());
            }
            if args.proxy_protocol.proxy_protocol_from.is_some() {
                return Err("--proxy-protocol-from does not apply to --mode shared: the workers accept the connections themselves".into());
            }
            if args.proxy_protocol.forwarded_headers_from.is_some() {
                return Err("--forwarded-headers-from does not apply to --mode shared: the workers read their clients' requests themselves".into());
            }
            if args.health_path.is_some() || args.health_grpc.is_some() {
                let flag = if args.health_path.is_some() {
                    "--health-path"
                } else {
                    "--health-grpc"
                };
                return Err(format!(
                    "{flag} needs a port per worker, which --mode shared does not have"
                ));
            }
            if !args.tls.tls_cert.is_empty() || !args.tls.tls_key.is_empty() {
                return Err("--tls-cert and --tls-key do not apply to --mode shared: the workers accept the connections themselves".into());
            }
            if args.access_log.access_log != model::AccessLogFormat::Off {
                return Err("--access-log does not apply to --mode shared: drover does not see the requests".into());
            }
            if args.h2c || args.backend_protocol.is_some() {
                return Err("--h2c and --backend-protocol do not apply to --mode shared: the workers accept the connections themselves".into());
            }
            if drover_supervisor::command_uses_port(&command) {
                return Err("{port} in the command needs a port per worker, which --mode shared does not have: each worker accepts on the socket drover gives it as fd 3 (--listen)".into());
            }
            if args.tcp {
                return Err("--tcp does not apply to --mode shared: the workers accept the connections themselves, whatever they speak".into());
            }
            if let Some(flag) = args.timeouts.first_given() {
                return Err(format!(
                    "{flag} does not apply to --mode shared: drover does not see the requests"
                ));
            }
            app.listen = Some(listen);
        }
        model::Mode::Auto | model::Mode::Proxy | model::Mode::Handoff => {
            if let Some(path) = &args.health_path {
                app.spec.health = Some(model::HealthCheck {
                    kind: model::CheckKind::Http {
                        path: path.clone(),
                        expect: model::StatusRange::default(),
                    },
                    ..args.health_timing.check()
                });
            }
            if let Some(service) = &args.health_grpc {
                if args.backend_protocol != Some(drover_proxy::BackendProtocol::H2c) {
                    return Err("--health-grpc: the gRPC health protocol is spoken over HTTP/2: add --backend-protocol h2c (the workers are gRPC servers)".into());
                }
                app.spec.health = Some(model::HealthCheck {
                    kind: model::CheckKind::Grpc {
                        service: service.as_str().into(),
                    },
                    ..args.health_timing.check()
                });
            }
            // Workers that take only HTTP/2 are probed in it too.
            app.spec.h2c = args.backend_protocol == Some(drover_proxy::BackendProtocol::H2c);
            let mut balancer = model::BalancerConfig::new(
                model::DEFAULT_BALANCER,
                listen,
                vec![model::BackendRef::App(args.name.clone())],
            );
            balancer.apply_strategy(args.strategy.unwrap_or_default(), &args.keys)?;
            balancer.threads = Some(args.threads);
            match args.backend_protocol {
                Some(p @ drover_proxy::BackendProtocol::H2) => {
                    return Err(format!("--backend-protocol {p} is HTTP/2 over TLS, and drover reaches its workers over loopback in cleartext: use h2c"));
                }
                Some(p) => balancer.backend_protocol = p,
                None => {}
            }
            if args.backend_protocol.is_some() && args.mode == model::Mode::Handoff {
                return Err("--backend-protocol does not apply to --mode handoff: the workers take each client connection as it is, in the client's protocol".into());
            }
            if args.limits.max_body_bytes.is_some() && args.mode == model::Mode::Handoff {
                return Err("--max-body-bytes does not apply to --mode handoff: the workers read the requests of the connections handed to them, unseen by drover (use --mode auto or proxy)".into());
            }
            balancer.connection_affinity = true;
            balancer.apply_limits(&args.limits);
            balancer.handoff = balancer.handoff_for(&[args.mode]);
            if let Some(slow_start) = args.slow_start {
                balancer.slow_start = slow_start;
            }
            // One wait for both: a worker's requests on a reload, and the clients'
            // connections when drover stops (it was 30 s at a stop, whatever the flag said).
            balancer.drain_timeout = args.drain_timeout;
            balancer.shutdown_delay = args.shutdown_delay;
            balancer.timeouts = args.timeouts.config(None);
            balancer.proxy_protocol = args.proxy_protocol.proxy_protocol_from.clone();
            balancer.forwarded_headers = args.proxy_protocol.forwarded_headers_from.clone();
            balancer.apply_access_log(&args.access_log)?;
            balancer.tls = args.tls.settings()?;
            if args.h2c {
                if balancer.tls.is_some() {
                    return Err("--h2c is HTTP/2 in cleartext; with --tls-cert, HTTP/2 is offered by ALPN: drop --h2c".into());
                }
                balancer.h2c = true;
            }
            if args.tcp {
                if let Some(flag) = [
                    (args.health_path.is_some(), "--health-path"),
                    (args.health_grpc.is_some(), "--health-grpc"),
                ]
                .into_iter()
                .find_map(|(given, flag)| given.then_some(flag))
                {
                    return Err(format!("{flag} does not apply to --tcp: a TCP worker may not speak HTTP (drover checks that each worker listens)"));
                }
                let reads_first =
                    args.proxy_protocol.proxy_protocol_from.is_some() || balancer.tls.is_some();
                if let Some(key) = args.timeouts.http_only_given(reads_first) {
                    return Err(model::HttpOnly::of(key).in_flags());
                }
                balancer.serve_unread().map_err(|e| format!("--tcp: {e}"))?;
                if args.mode == model::Mode::Proxy {
                    // Every connection relayed through drover, none handed over.
                    balancer.handoff = drover_proxy::Handoff::Never;
                }
            } else {
                args.timeouts.half_close_without_tcp()?;
                args.tls.alpn_without_tcp()?;
                app.spec.head_limit = Some(balancer.limits.max_header_bytes);
            }
            balancers.push(balancer);
        }
    }
    // Node's cluster primary binds the port a worker's listen() names; so does drover
    // when nothing else says where clients connect. A program that is not Node, or one
    // a shell starts, has no listen() drover hears, and gets the default at once.
    let listen_follows_app = args.listen.is_none()
        && !matches!(args.mode, model::Mode::Shared | model::Mode::Background)
        && app.spec.runs_in_node();
    // And then the app reads the user's PORT, not drover's, as under PM2: its
    // `listen(process.env.PORT || 3000)` names 3000, where its clients connect.
    app.spec.users_port = listen_follows_app;
    let (admin, admin_asked) = run_admin(args)?;
    let cfg = Config {
        admin,
        resolver: model::ResolverConfig::default(),
        etcd: None,
        apps: vec![app],
        balancers,
    };
    let mut origins = crate::Origins::default()
        .with_flag("app[0].listen", listen_from)
        .with_flag("balancer[0].listen", listen_from)
        .with_flag("balancer[0].access_log.path", "--access-log-path")
        .with_flag("admin.listen", "--admin");
    if let Some(b) = cfg.balancers.first() {
        origins = with_tls_flags(origins, b);
    }
    let follow = listen_follows_app
        .then(|| FollowListen {
            balancer: 0,
            default_from: match listen_from {
                "--listen" => "the default; pass -l ADDR".into(),
                from => format!("{from}; pass -l ADDR"),
            },
            elsewhere: Some("-l ADDR".into()),
        })
        .into_iter()
        .collect();
    Ok(RunConfig {
        config: cfg,
        origins,
        admin_asked,
        follow,
        notes,
        ecosystem: None,
    })
}

/// `drover run`'s admin API: `--admin`, or the default address (then `false`: it need
/// not start when another drover holds it).
fn run_admin(args: &RunArgs) -> Result<(Option<model::AdminConfig>, bool), String> {
    let (admin, admin_asked) = match args.admin {
        Some(a) => (a.0, true),
        None => (
            Some(
                model::DEFAULT_ADMIN_LISTEN
                    .parse()
                    .expect("the default admin address parses"),
            ),
            false,
        ),
    };
    // The rule `drover up` applies to [admin], before any worker starts.
    let admin = match admin {
        Some(listen) => Some(args.admin_token.admin_at(listen)?),
        None => None,
    };
    Ok((admin, admin_asked))
}

/// The first of `args`' flags that an ecosystem file's apps take from the file, if any
/// was given. `-i` is not one: it sets every app's instances, as under PM2; nor
/// `--worker-ports`, which PM2 has no key for: every cluster-mode app's workers take
/// their ports in its range.
fn ecosystem_flag(args: &RunArgs) -> Option<&'static str> {
    let app = app();
    let given = [
        (args.name != "app", "--name"),
        (args.mode != drover_supervisor::Mode::default(), "--mode"),
        (args.max_memory.is_some(), "--max-memory"),
        (args.drain_timeout != app.drain_timeout, "--drain-timeout"),
        (args.stop_timeout != app.stop_timeout, "--stop-timeout"),
        (args.max_restarts.is_some(), "--max-restarts"),
        (args.ready_timeout != app.ready_timeout, "--ready-timeout"),
        (args.wait_ready, "--wait-ready"),
        (args.watch, "--watch"),
        (
            args.proxy_protocol.send_proxy_protocol.is_some(),
            "--send-proxy-protocol",
        ),
    ];
    balancer_flag_but(args, Some("--worker-ports")).or_else(|| {
        given
            .into_iter()
            .find(|(set, _)| *set)
            .map(|(_, flag)| flag)
    })
}

/// `drover run ecosystem.config.js`: the apps of a PM2 ecosystem file, each cluster-mode
/// app behind a balancer of its own name where its workers listen.
fn ecosystem_run_config(args: &RunArgs, file: &str) -> Result<RunConfig, String> {
    if let Some(flag) = ecosystem_flag(args) {
        return Err(format!("{flag} does not apply to an ecosystem file: drover takes each app's settings from {file}, as PM2 does"));
    }
    if let Some(flag) = args.pm2_flags.first() {
        return Err(format!(
            "{}: with an ecosystem file, give it in the file{}, as drover takes each app's settings from {file}",
            flag.written,
            match flag.key {
                "" => String::new(),
                key => format!(" (`{key}`)"),
            }
        ));
    }
    let source = crate::ecosystem::Source {
        file: file.into(),
        base: crate::ecosystem::base_dir(),
        options: crate::ecosystem::Options {
            env: args.env_name.clone(),
            only: args.only.clone(),
            instances: args.workers,
            worker_ports: args.worker_ports,
        },
        threads: args.threads,
    };
    let (apps, notes) = source.read()?;
    let (balancers, follow) = ecosystem_balancers(&apps, args.threads);
    let (admin, admin_asked) = run_admin(args)?;
    Ok(RunConfig {
        config: Config {
            admin,
            resolver: model::ResolverConfig::default(),
            etcd: None,
            apps: apps.into_iter().map(|a| a.app).collect(),
            balancers,
        },
        origins: crate::Origins::default().with_flag("admin.listen", "--admin"),
        admin_asked,
        follow,
        notes,
        ecosystem: Some(source),
    })
}

/// The balancers of an ecosystem file's `apps`: each cluster-mode app behind one of its
/// own name, started where its workers' `listen()` says (`follow`, by index into the
/// balancers), with `threads` serving threads. At start, and for an app a reload adds.
pub fn ecosystem_balancers(
    apps: &[crate::ecosystem::EcosystemApp],
    threads: usize,
) -> (Vec<model::BalancerConfig>, Vec<FollowListen>) {
    let mut balancers = Vec::new();
    let mut follow = Vec::new();
    for eco in apps {
        let Some(clients) = &eco.clients else {
            continue;
        };
        let name = &eco.app.spec.name;
        let mut balancer = model::BalancerConfig::new(
            name.clone(),
            clients.default_listen,
            vec![model::BackendRef::App(name.clone())],
        );
        balancer.threads = Some(threads);
        // PM2 bounds no answer's time: nor does drover in its place.
        balancer.timeouts.request = None;
        balancer.connection_affinity = true;
        balancer.handoff = balancer.handoff_for(&[eco.app.spec.mode]);
        follow.push(FollowListen {
            balancer: balancers.len(),
            default_from: clients.default_from.clone(),
            elsewhere: None,
        });
        balancers.push(balancer);
    }
    (balancers, follow)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Proxy {
        #[command(flatten)]
        args: ProxyArgs,
    }

    #[derive(Parser)]
    struct Run {
        #[command(flatten)]
        args: RunArgs,
    }

    fn proxy(extra: &[&str]) -> Result<model::BalancerConfig, FlagError> {
        let mut argv = vec!["proxy", "-l", "127.0.0.1:0", "-b", "127.0.0.1:1"];
        argv.extend_from_slice(extra);
        proxy_balancer(&Proxy::try_parse_from(argv).unwrap().args)
    }

    #[test]
    fn web_concurrency_is_the_default_worker_count_of_an_app_that_serves() {
        use model::{Mode, Workers};
        assert_eq!(default_workers(Mode::Auto, None), Ok(Workers::Auto));
        assert_eq!(default_workers(Mode::Auto, Some(" ")), Ok(Workers::Auto));
        assert_eq!(
            default_workers(Mode::Auto, Some("3")),
            Ok(Workers::Count(3))
        );
        assert_eq!(
            default_workers(Mode::Background, Some("3")),
            Ok(Workers::Count(1))
        );
        for bad in ["0", "lots", "-2", "100000"] {
            let e = default_workers(Mode::Auto, Some(bad)).unwrap_err();
            assert!(e.contains("WEB_CONCURRENCY") && e.contains(bad), "{e}");
        }
    }

    #[test]
    fn without_listen_clients_connect_at_the_port_drovers_environment_names() {
        let at = |listen: Option<&str>, port: Option<&str>| {
            run_listen(listen.map(|l| l.parse().unwrap()), port)
                .map(|(a, from)| (a.to_string(), from))
        };
        assert_eq!(at(None, None).unwrap().0, "127.0.0.1:8000");
        assert_eq!(at(None, Some(" ")).unwrap().0, "127.0.0.1:8000");
        assert_eq!(
            at(None, Some("8080")).unwrap(),
            ("0.0.0.0:8080".into(), "PORT (drover's environment)")
        );
        // -l wins.
        assert_eq!(
            at(Some("127.0.0.1:9000"), Some("8080")).unwrap(),
            ("127.0.0.1:9000".into(), "--listen")
        );
        for bad in ["http", "0", "70000", "-1"] {
            let e = at(None, Some(bad)).unwrap_err();
            assert!(
                e.contains(&format!("PORT={bad:?}")) && e.contains("-l ADDR"),
                "{e}"
            );
        }
    }

    #[test]
    fn admin_off_is_no_admin_api_for_proxy_as_for_run() {
        let config = |argv: &[&str]| proxy_config(&Proxy::try_parse_from(argv).unwrap().args);
        let off = config(&[
            "proxy",
            "-l",
            "127.0.0.1:0",
            "-b",
            "127.0.0.1:1",
            "--admin",
            "off",
        ]);
        assert_eq!(off.unwrap().admin, None);
        let at = config(&["proxy", "-l", "127.0.0.1:0", "--admin", "127.0.0.1:0"]);
        assert!(at.unwrap().admin.is_some());
        // Off, it takes no members at runtime: a backend is needed.
        let none = config(&["proxy", "-l", "127.0.0.1:0", "--admin", "off"]).unwrap_err();
        assert!(
            none.to_string().contains("at least one --backend"),
            "{none}"
        );
        let bad = Proxy::try_parse_from(["proxy", "-l", "127.0.0.1:0", "--admin", "of"]);
        assert!(bad.is_err_and(|e| e.to_string().contains("or \"off\"")));
    }

    #[test]
    fn tcp_flag_gives_what_mode_tcp_in_a_file_gives() {
        let mut flags = proxy(&["--tcp", "--half-close-timeout", "3s"]).unwrap();
        let file = crate::parse(
            "[[balancer]]\nlisten = \"127.0.0.1:0\"\nbackends = [\"127.0.0.1:1\"]\nmode = \"tcp\"\ntimeouts = { half_close = \"3s\" }\n",
            "drover.toml",
        )
        .unwrap();
        flags.threads = None;
        assert_eq!(flags, file.balancers[0]);
        assert_eq!(flags.max_conns, crate::ConnLimit::Fixed(0));
        let hashed = proxy(&["--tcp", "-s", "hash", "--hash-key", "client-ip"]).unwrap();
        assert_eq!(hashed.hash, Some(model::HashKey::ClientIp));
    }

    #[test]
    fn max_header_bytes_bounds_the_head_and_its_target_as_the_files_limits() {
        let flags = proxy(&["--max-header-bytes", "64KiB"]).unwrap();
        let file = crate::parse(
            "[[balancer]]\nlisten = \"127.0.0.1:0\"\nbackends = [\"127.0.0.1:1\"]\n\
             limits = { max_header_bytes = 65536, max_uri_bytes = 65536 }\n",
            "drover.toml",
        )
        .unwrap();
        assert_eq!(flags.limits, file.balancers[0].limits);
        let r = Run::try_parse_from(["run", "--max-header-bytes", "32768", "--", "node", "a.js"])
            .unwrap()
            .args;
        let limits = &run_config(&r).unwrap().config.balancers[0].limits;
        assert_eq!(
            (limits.max_header_bytes, limits.max_uri_bytes),
            (32768, 32768)
        );
        assert_eq!(
            limits.max_headers,
            model::LimitsConfig::default().max_headers
        );
    }

    #[test]
    fn a_tcp_check_sends_and_expects_escaped_bytes() {
        let b = proxy(&[
            "--tcp",
            "--health-tcp",
            "--health-send",
            "PING\\r\\n",
            "--health-receive",
            "+PONG",
        ])
        .unwrap();
        let file = crate::parse(
            "[[balancer]]\nlisten = \"127.0.0.1:0\"\nbackends = [\"127.0.0.1:1\"]\nmode = \"tcp\"\nhealth = { tcp = true, send = \"PING\\r\\n\", receive = \"+PONG\" }\n",
            "drover.toml",
        )
        .unwrap();
        assert_eq!(b.health, file.balancers[0].health);
        assert_eq!(
            b.health.unwrap().kind,
            model::CheckKind::TcpExchange {
                send: b"PING\r\n".as_slice().into(),
                receive: b"+PONG".as_slice().into()
            }
        );
        assert_eq!(escaped("a\\x00\\t\\\\").unwrap().0, b"a\0\t\\");
        for (bad, says) in [
            ("a\\q", "a backslash before 'q'"),
            ("a\\", "a backslash before the end"),
            ("\\x4", "\\x takes two hex digits"),
            ("\\xzz", "\\x takes two hex digits"),
            ("", "empty"),
        ] {
            let e = escaped(bad).unwrap_err();
            assert!(e.contains(says), "{bad:?}: {e}");
        }
    }

    #[test]
    fn tcp_flag_refuses_http_only_flags_naming_them() {
        let cases: &[(&[&str], &str)] = &[
            (
                &["--header-timeout", "1s"],
                "--header-timeout does not apply to --tcp",
            ),
            (
                &["--request-timeout", "1s"],
                "--request-timeout does not apply to --tcp",
            ),
            (
                &["--client-timeout", "1s"],
                "--client-timeout does not apply to --tcp",
            ),
            (
                &["--body-timeout", "1s"],
                "--body-timeout does not apply to --tcp",
            ),
            (
                &["--body-min-rate", "1"],
                "--body-min-rate does not apply to --tcp",
            ),
            (
                &["--health-path", "/h"],
                "--health-path does not apply to --tcp",
            ),
            (
                &["--max-header-bytes", "64KiB"],
                "--max-header-bytes does not apply to --tcp",
            ),
            (
                &["--access-log", "combined"],
                "--access-log combined: format \"combined\" is a line per HTTP request",
            ),
            (
                &["--access-log", "json", "--access-log-fields", "status"],
                "--access-log-fields: a TCP balancer's lines have fixed fields",
            ),
            (&["-s", "peak-ewma"], "--tcp: strategy \"peak-ewma\""),
            (&["-s", "sticky"], "--tcp: strategy \"sticky\""),
            (&["-s", "hash", "--hash-key", "path"], "only \"client-ip\""),
        ];
        for (extra, message) in cases {
            let mut argv = vec!["--tcp"];
            argv.extend_from_slice(extra);
            let e = proxy(&argv).unwrap_err().to_string();
            assert!(e.contains(message), "{extra:?}: {e}");
        }
        let e = proxy(&["--half-close-timeout", "1s"])
            .unwrap_err()
            .to_string();
        assert_eq!(e, "--half-close-timeout applies to --tcp only");
        // Behind another balancer, the header timeout bounds the PROXY header's read.
        let behind = proxy(&[
            "--tcp",
            "--proxy-protocol-from",
            "10.0.0.0/8",
            "--header-timeout",
            "2s",
        ])
        .unwrap();
        assert_eq!(behind.proxy_protocol, Some("10.0.0.0/8".parse().unwrap()));
        assert_eq!(behind.timeouts.header_read, Duration::from_secs(2));
        let logged = proxy(&["--tcp", "--access-log", "json"]).unwrap();
        assert_eq!(logged.access_log.format, model::AccessLogFormat::Json);
        // Whose forwarding fields go on as sent: an HTTP balancer's setting.
        let cloudflare = proxy(&["--forwarded-headers-from", "173.245.48.0/20,::/0"]).unwrap();
        assert_eq!(
            cloudflare.forwarded_headers,
            Some("173.245.48.0/20,::/0".parse().unwrap())
        );
        assert_eq!(proxy(&[]).unwrap().forwarded_headers, None);
        let edge = proxy(&["--forwarded-headers-from", "none"]).unwrap();
        assert_eq!(
            edge.forwarded_headers,
            Some(model::TrustedSenders::new(Vec::new()))
        );
        let argv = ["proxy", "-l", "127.0.0.1:0", "-b", "127.0.0.1:1"];
        let none = [&argv[..], &["--proxy-protocol-from", "none"]].concat();
        assert!(
            Proxy::try_parse_from(none).is_err(),
            "the PROXY protocol needs a sender"
        );
    }

    /// Each default has one definition, in the library where it has one: `drover proxy`
    /// and `drover run` flags, a drover.toml that leaves a setting out, and the parts
    /// that run them must all end up with it.
    #[test]
    fn flags_files_and_the_library_agree_on_every_default() {
        let a = Proxy::try_parse_from(["proxy", "-l", "127.0.0.1:0", "-b", "127.0.0.1:1"])
            .unwrap()
            .args;
        let mut flags = proxy_balancer(&a).unwrap();
        let file = crate::parse(
            "[[balancer]]\nlisten = \"127.0.0.1:0\"\nbackends = [\"127.0.0.1:1\"]\n",
            "drover.toml",
        )
        .unwrap();
        // --threads auto is the file's "drover decides", resolved.
        assert_eq!(flags.threads, Some(default_threads()));
        flags.threads = None;
        assert_eq!(flags, file.balancers[0]);
        // A proxy spreads one connection's requests, as nginx and HAProxy do.
        assert!(!flags.connection_affinity);

        let r = Run::try_parse_from(["run", "-l", "127.0.0.1:8000", "--", "node", "app.js"])
            .unwrap()
            .args;
        let run = run_config(&r).unwrap().config;
        let file = crate::parse(
            "[[app]]\nname = \"app\"\ncommand = [\"node\", \"app.js\"]\nworkers = \"auto\"\n\
             [[balancer]]\nlisten = \"127.0.0.1:8000\"\nbackends = [\"app:app\"]\n",
            "drover.toml",
        )
        .unwrap();
        assert_eq!(run.apps, file.apps);
        let mut balancer = run.balancers[0].clone();
        balancer.threads = None;
        // But for the request timeout: off, as under Node's cluster module and PM2,
        // which bound no answer's time; a drover.toml's balancer, as nginx's, has one.
        assert_eq!(balancer.timeouts.request, None);
        assert_eq!(
            file.balancers[0].timeouts.request,
            Some(drover_proxy::DEFAULT_REQUEST_TIMEOUT)
        );
        balancer.timeouts.request = file.balancers[0].timeouts.request;
        assert_eq!(balancer, file.balancers[0]);
        // In front of the workers, as Node's cluster module, a connection stays on one.
        assert!(balancer.connection_affinity);
        let timed = |flag: &str| {
            let r = Run::try_parse_from(["run", "--request-timeout", flag, "--", "x"])
                .unwrap()
                .args;
            run_config(&r).unwrap().config.balancers[0].timeouts.request
        };
        assert_eq!(timed("45s"), Some(Duration::from_secs(45)));
        assert_eq!(timed("off"), None);

        // The model's defaults are the library's.
        let plan = crate::plan::BalancerPlan::from_config(&file.balancers[0]).unwrap();
        let proxy = drover_proxy::ProxyOptions::default();
        assert_eq!(plan.proxy.retries, proxy.retries);
        assert_eq!(
            format!("{:?}", plan.proxy.timeouts),
            format!("{:?}", proxy.timeouts)
        );
        assert_eq!(
            format!("{:?}", plan.proxy.limits),
            format!("{:?}", proxy.limits)
        );
        let passive = drover_registry::PassivePolicy {
            slow_start: model::SLOW_START,
            ..drover_registry::PassivePolicy::default()
        };
        assert_eq!(plan.pool.passive, passive);
        // `drover run`'s app, and so the file's, is the library's spec, but for
        // `-w auto` and the head limit of the balancer in front.
        let library = drover_supervisor::AppSpec::new("app", vec!["node".into(), "app.js".into()]);
        assert_eq!(
            run.apps[0].spec,
            drover_supervisor::AppSpec {
                workers: model::Workers::Auto,
                head_limit: Some(proxy.limits.max_header_bytes),
                ..library
            }
        );
        // A background app starts once unless -w says otherwise.
        let workers = |argv: &[&str]| {
            let r = Run::try_parse_from(argv).unwrap().args;
            run_config(&r).unwrap().config.apps[0].spec.workers
        };
        assert_eq!(
            workers(&["run", "--mode", "background", "--", "node", "cron.js"]),
            model::Workers::Count(1)
        );
        assert_eq!(
            workers(&[
                "run",
                "--mode",
                "background",
                "-w",
                "3",
                "--",
                "node",
                "consumer.js"
            ]),
            model::Workers::Count(3)
        );
        let r = Run::try_parse_from(["run", "--health-path", "/health", "--", "x"])
            .unwrap()
            .args;
        let check = run_config(&r).unwrap().config.apps[0].spec.health.clone();
        assert_eq!(check, Some(drover_registry::HealthCheck::http("/health")));
    }

    #[test]
    fn run_and_proxy_take_the_checks_timings_and_refuse_them_without_a_check() {
        // The hung worker's restart record tells the user to raise --fall or
        // --health-interval: `drover run` takes them (it refused them as unknown).
        let argv = [
            "run",
            "--health-path",
            "/health",
            "--health-interval",
            "3s",
            "--health-timeout",
            "2s",
            "--fall",
            "5",
            "--rise",
            "2",
            "--",
            "x",
        ];
        let r = Run::try_parse_from(argv).unwrap().args;
        let check = run_config(&r).unwrap().config.apps[0].spec.health.clone();
        assert_eq!(
            check,
            Some(drover_registry::HealthCheck {
                interval: Duration::from_secs(3),
                timeout: Duration::from_secs(2),
                fall: 5,
                rise: 2,
                ..drover_registry::HealthCheck::http("/health")
            })
        );
        // Timings of no check are a mistake, named, not ignored.
        let r = Run::try_parse_from(["run", "--fall", "5", "--", "x"])
            .unwrap()
            .args;
        let Err(e) = run_config(&r) else {
            panic!("--fall without a check was taken")
        };
        let e = e.to_string();
        assert!(
            e.starts_with("--fall times the workers' health checks") && e.contains("--health-path"),
            "{e}"
        );
        let p = Proxy::try_parse_from([
            "proxy",
            "-l",
            "127.0.0.1:0",
            "-b",
            "127.0.0.1:1",
            "--health-interval",
            "1s",
        ])
        .unwrap()
        .args;
        let e = proxy_config(&p).unwrap_err().to_string();
        assert!(
            e.starts_with("--health-interval times the backends'"),
            "{e}"
        );
        // The defaults, given as such, change nothing.
        let r = Run::try_parse_from(["run", "--fall", "3", "--", "x"])
            .unwrap()
            .args;
        assert!(run_config(&r).unwrap().config.apps[0].spec.health.is_none());
    }

    #[test]
    fn a_node_app_without_listen_is_served_where_its_listen_asks() {
        // Where the balancer follows the app, the app reads the user's PORT: its
        // fallback (`PORT || 3000`) is the port it names.
        let follows = |argv: &[&str]| {
            let r = Run::try_parse_from(argv).unwrap().args;
            let run = run_config(&r).unwrap();
            let follows = !run.follow.is_empty();
            assert_eq!(run.config.apps[0].spec.users_port, follows, "{argv:?}");
            follows
        };
        assert!(follows(&["run", "--", "node", "app.js"]));
        assert!(follows(&["run", "--", "/usr/bin/nodejs", "app.js"]));
        assert!(follows(&["run", "--", "npm", "start"]));
        assert!(!follows(&[
            "run",
            "-l",
            "127.0.0.1:3000",
            "--",
            "node",
            "app.js"
        ]));
        assert!(!follows(&[
            "run", "--mode", "shared", "--", "node", "app.js"
        ]));
        // No listen() drover hears: the default, at once.
        assert!(!follows(&["run", "--", "python3", "app.py"]));
        assert!(!follows(&["run", "--", "sh", "-c", "node app.js"]));
    }

    #[test]
    fn the_command_follows_drovers_flags_with_or_without_a_double_dash() {
        let command = |argv: &[&str]| Run::try_parse_from(argv).unwrap().args.command;
        assert_eq!(
            command(&["run", "-w", "2", "--", "node", "app.js"]),
            ["node", "app.js"]
        );
        // As `docker run` takes it: from the program on, every word is the program's.
        assert_eq!(
            command(&["run", "-w", "2", "node", "app.js", "-w", "5", "--x"]),
            ["node", "app.js", "-w", "5", "--x"]
        );
        let r = Run::try_parse_from(["run", "-w", "2", "node", "app.js", "-w", "5"]).unwrap();
        assert_eq!(r.args.workers, Some(model::Workers::Count(2)));
        // A mistyped flag of drover's is still an error, not a program.
        assert!(Run::try_parse_from(["run", "--wrokers", "2", "node", "app.js"]).is_err());
        assert!(Run::try_parse_from(["run", "-w", "2"]).is_err());
    }

    #[test]
    fn run_takes_slow_start_for_its_balancer_and_refuses_it_where_none_runs() {
        let slow_start = |argv: &[&str]| {
            let r = Run::try_parse_from(argv).unwrap();
            run_config(&r.args).map(|c| c.config.balancers[0].slow_start)
        };
        assert_eq!(
            slow_start(&["run", "--", "node", "app.js"]).unwrap(),
            model::SLOW_START
        );
        assert_eq!(
            slow_start(&["run", "--slow-start", "30s", "--", "node", "app.js"]).unwrap(),
            Duration::from_secs(30)
        );
        assert_eq!(
            slow_start(&["run", "--slow-start", "0s", "--", "node", "app.js"]).unwrap(),
            Duration::ZERO
        );
        let Err(e) = Run::try_parse_from(["run", "--slow-start", "soon", "--", "node", "app.js"])
        else {
            panic!("--slow-start soon is refused")
        };
        let e = e.to_string();
        assert!(e.contains("--slow-start"), "{e}");
        for mode in ["shared", "background"] {
            let r = Run::try_parse_from([
                "run",
                "--mode",
                mode,
                "--slow-start",
                "5s",
                "--",
                "node",
                "app.js",
            ])
            .unwrap();
            let Err(e) = run_config(&r.args) else {
                panic!("--slow-start with --mode {mode} is refused")
            };
            let e = e.to_string();
            assert!(
                e.starts_with(&format!("--slow-start does not apply to --mode {mode}")),
                "{e}"
            );
        }
    }

    #[test]
    fn pm2s_name_and_memory_flags_are_drover_runs() {
        let r = Run::try_parse_from(["run", "--name", "api", "--max-memory-restart", "300M", "x"])
            .unwrap();
        let cfg = run_config(&r.args).unwrap();
        assert_eq!(cfg.config.apps[0].spec.name, "api");
        assert_eq!(cfg.config.apps[0].spec.max_memory, Some(300 << 20));
        assert_eq!(
            cfg.config.balancers[0].backends,
            [model::BackendRef::App("api".into())]
        );
        let r = Run::try_parse_from(["run", "--name", "My API", "x"]).unwrap();
        let Err(e) = run_config(&r.args) else {
            panic!("a name with a space and capitals is refused")
        };
        let e = e.to_string();
        assert!(e.starts_with("--name \"My API\": names are"), "{e}");
    }

    #[test]
    fn access_log_flags_fill_the_model() {
        let r = Run::try_parse_from([
            "run",
            "--access-log",
            "json",
            "--access-log-path",
            "/tmp/a.log",
            "--access-log-fields",
            "status,time",
            "--",
            "x",
        ])
        .unwrap()
        .args;
        let log = run_config(&r).unwrap().config.balancers[0]
            .access_log
            .clone();
        assert_eq!(log.format, model::AccessLogFormat::Json);
        assert_eq!(log.path, "/tmp/a.log");
        assert_eq!(
            log.fields,
            vec![model::AccessLogField::Time, model::AccessLogField::Status]
        );
        let r = Run::try_parse_from(["run", "--access-log-fields", "status", "--", "x"])
            .unwrap()
            .args;
        let e = run_config(&r).err().unwrap().to_string();
        assert!(e.contains("applies to --access-log json only"), "{e}");
        assert!(Run::try_parse_from(["run", "--access-log", "xml", "--", "x"]).is_err());
        assert!(
            Run::try_parse_from(["run", "--access-log-fields", "status,nope", "--", "x"]).is_err()
        );
    }

    #[test]
    fn backend_tls_flags_fill_the_model_and_refuse_what_cannot_work() {
        let parse = |args: &[&str]| {
            let mut all = vec!["proxy", "-l", "127.0.0.1:80", "-b", "127.0.0.1:1"];
            all.extend_from_slice(args);
            Proxy::try_parse_from(all).map(|p| p.args)
        };
        assert_eq!(
            proxy_balancer(&parse(&[]).unwrap()).unwrap().backend_tls,
            None
        );
        let b = proxy_balancer(&parse(&["--backend-tls"]).unwrap()).unwrap();
        assert_eq!(b.backend_tls, Some(model::BackendTlsConfig::default()));
        let b = proxy_balancer(
            &parse(&[
                "--backend-ca",
                "ca.pem",
                "--backend-server-name",
                "api.internal",
                "--backend-cert",
                "c.pem",
            ])
            .unwrap(),
        )
        .unwrap();
        assert_eq!(
            b.backend_tls,
            Some(model::BackendTlsConfig {
                ca: Some("ca.pem".into()),
                server_name: Some("api.internal".into()),
                client_cert: Some(model::TlsCertFiles {
                    cert: "c.pem".into(),
                    key: "c.pem".into(),
                }),
                insecure_skip_verify: false,
            })
        );
        let origins = with_tls_flags(crate::Origins::default(), &b);
        assert_eq!(
            origins.error("balancer[0].backend_tls.key", "bad"),
            "--backend-cert: bad"
        );
        assert_eq!(
            origins.error("balancer[0].backend_tls", "bad"),
            "--backend-tls: bad"
        );

        let e = proxy_balancer(&parse(&["--backend-server-name", "a b"]).unwrap())
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("--backend-server-name: \"a b\" is not a DNS name"),
            "{e}"
        );
        // clap refuses an empty path itself.
        assert!(parse(&["--backend-ca", ""]).is_err());
        let b = proxy_balancer(&parse(&["--tcp", "--backend-tls"]).unwrap()).unwrap();
        assert!(b.backend_tls.is_some());
        // A key needs its certificate; skipping verification reads no CA.
        assert!(parse(&["--backend-key", "k.pem"]).is_err());
        assert!(parse(&["--backend-ca", "ca.pem", "--backend-insecure-skip-verify"]).is_err());
    }

    #[test]
    fn tls_alpn_is_for_tcp_listeners_and_checks_each_name() {
        let parse = |args: &[&str]| {
            let mut all = vec!["proxy", "-l", "127.0.0.1:80", "-b", "127.0.0.1:1"];
            all.extend_from_slice(args);
            Proxy::try_parse_from(all).map(|p| p.args)
        };
        let tls = ["--tls-cert", "a.pem", "--tls-key", "a.key"];
        let tcp = |more: &[&'static str]| [&["--tcp"][..], &tls[..], more].concat();
        let b = proxy_balancer(&parse(&tcp(&["--tls-alpn", "h2,http/1.1"])).unwrap()).unwrap();
        assert_eq!(b.tls.unwrap().alpn, ["h2", "http/1.1"]);
        let e = proxy_balancer(&parse(&tcp(&["--tls-alpn", "h2,my proto"])).unwrap())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--tls-alpn") && e.contains("visible ASCII"),
            "{e}"
        );
        let http = [&tls[..], &["--tls-alpn", "h2"]].concat();
        let e = proxy_balancer(&parse(&http).unwrap())
            .unwrap_err()
            .to_string();
        assert!(e.contains("--tls-alpn applies to --tcp"), "{e}");
        // Without a certificate there is no TLS to agree on anything.
        let e = parse(&["--tcp", "--tls-alpn", "h2"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("--tls-cert"), "{e}");
    }

    #[test]
    fn http2_and_h2c_flags() {
        let parse = |args: &[&str]| {
            let mut all = vec!["proxy", "-l", "127.0.0.1:80", "-b", "127.0.0.1:1"];
            all.extend_from_slice(args);
            Proxy::try_parse_from(all).map(|p| p.args)
        };
        let b = proxy_balancer(&parse(&[]).unwrap()).unwrap();
        assert!(b.http2 && !b.h2c, "the model's defaults");
        let b = proxy_balancer(&parse(&["--http2", "off"]).unwrap()).unwrap();
        assert!(!b.http2);
        let b = proxy_balancer(&parse(&["--h2c"]).unwrap()).unwrap();
        assert!(b.http2 && b.h2c);
        let b = proxy_balancer(&parse(&["--h2c", "--http2-max-streams", "16"]).unwrap()).unwrap();
        assert_eq!(b.http2_max_streams, 16);
        let e = parse(&["--h2c", "--http2-max-streams", "0"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("--http2-max-streams") && e.contains("0"), "{e}");
        let e = proxy_balancer(&parse(&["--http2-max-streams", "16"]).unwrap())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--http2-max-streams") && e.contains("--h2c"),
            "{e}"
        );
        let e = parse(&["--http2", "maybe"]).unwrap_err().to_string();
        assert!(e.contains("--http2") && e.contains("maybe"), "{e}");
        let tls = ["--tls-cert", "a.pem", "--tls-key", "a.key", "--h2c"];
        let e = proxy_balancer(&parse(&tls).unwrap())
            .unwrap_err()
            .to_string();
        assert!(e.contains("--h2c") && e.contains("ALPN"), "{e}");
        let e = proxy_balancer(&parse(&["--h2c", "--http2", "off"]).unwrap())
            .unwrap_err()
            .to_string();
        assert!(e.contains("--http2 off"), "{e}");
        let e = proxy_balancer(&parse(&["--tcp", "--h2c"]).unwrap())
            .unwrap_err()
            .to_string();
        assert!(e.contains("--h2c does not apply to --tcp"), "{e}");
    }

    #[test]
    fn redirect_to_https_stands_alone() {
        let parse = |args: &[&str]| {
            let mut all = vec!["proxy", "-l", "127.0.0.1:80"];
            all.extend_from_slice(args);
            Proxy::try_parse_from(all).map(|p| p.args)
        };
        let a = parse(&["--redirect-to-https", "443"]).unwrap();
        assert_eq!(proxy_balancer(&a).unwrap().redirect_to_https, Some(443));
        assert!(parse(&["--redirect-to-https", "443", "-b", "127.0.0.1:1"]).is_err());
        assert!(parse(&["--redirect-to-https", "443", "--tls-cert", "a.pem"]).is_err());
        assert!(parse(&["--redirect-to-https", "0"]).is_err());
        assert!(
            parse(&[]).is_err(),
            "a backend or --redirect-to-https is needed"
        );
    }

    #[test]
    fn tls_flags_pair_certs_and_keys_in_order() {
        let a = Proxy::try_parse_from([
            "proxy",
            "-l",
            "127.0.0.1:0",
            "-b",
            "127.0.0.1:1",
            "--tls-cert",
            "a.pem",
            "--tls-key",
            "a.key",
            "--tls-cert",
            "b.pem",
            "--tls-key",
            "b.key",
        ])
        .unwrap()
        .args;
        let b = proxy_balancer(&a).unwrap();
        let certs = &b.tls.as_ref().unwrap().certs;
        assert_eq!(certs.len(), 2);
        assert_eq!(
            (certs[1].cert.to_str(), certs[1].key.to_str()),
            (Some("b.pem"), Some("b.key"))
        );
        // Where a file's error points: the flag that named it.
        let origins = with_tls_flags(crate::Origins::default(), &b);
        assert_eq!(
            origins.error("balancer[0].tls.certs[1].key", "bad"),
            "--tls-key: bad"
        );
        let a = Proxy::try_parse_from([
            "proxy",
            "-l",
            "127.0.0.1:0",
            "-b",
            "127.0.0.1:1",
            "--tls-cert",
            "a.pem",
        ])
        .unwrap()
        .args;
        let e = proxy_balancer(&a).unwrap_err().to_string();
        assert!(
            e.contains("--tls-key: 0 key(s) for 1 certificate(s)"),
            "{e}"
        );
        let r = Run::try_parse_from([
            "run",
            "--mode",
            "shared",
            "--tls-cert",
            "a.pem",
            "--tls-key",
            "a.key",
            "--",
            "x",
        ])
        .unwrap()
        .args;
        let e = run_config(&r).err().unwrap().to_string();
        assert!(e.contains("do not apply to --mode shared"), "{e}");
        let r = Run::try_parse_from([
            "run",
            "--tls-cert",
            "a.pem",
            "--tls-key",
            "a.key",
            "--",
            "x",
        ])
        .unwrap()
        .args;
        let run = run_config(&r).unwrap();
        assert!(run.config.balancers[0].tls.is_some());
        assert_eq!(
            run.origins.error("balancer[0].tls.certs[0].cert", "bad"),
            "--tls-cert: bad"
        );
    }
}
