//! The validated configuration: what a drover.toml or the flags describe, with every
//! default filled in.

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

pub use drover_supervisor::{AppSpec, Mode, Workers};

pub use drover_balance::Strategy;

// ---------------------------------------------------------------------------------------
// Public, validated configuration
// ---------------------------------------------------------------------------------------

/// A complete, validated configuration file.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The admin/control endpoint (`[admin]`); `None` when the table is absent.
    pub admin: Option<AdminConfig>,
    /// How `dns:` backends are looked up (`[resolver]`); the system's servers by default.
    pub resolver: ResolverConfig,
    /// The etcd cluster `etcd:` backends are kept in (`[etcd]`).
    pub etcd: Option<EtcdConfig>,
    /// Supervised processes (`[[app]]`), in file order.
    pub apps: Vec<AppConfig>,
    /// Listeners and their backend pools (`[[balancer]]`), in file order.
    pub balancers: Vec<BalancerConfig>,
}

/// `[resolver]`: the name servers and the bounds on how long an answer is used. The
/// DNS source's own settings, so a default has one definition.
pub type ResolverConfig = drover_dns::ResolverSettings;

/// `[etcd]`: where the shared membership is kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdConfig {
    /// Client URLs, `http://HOST:PORT` or `https://HOST:PORT` (all of one kind), tried
    /// in turn.
    pub endpoints: Vec<String>,
    /// With `https://` endpoints: how etcd's certificate is verified and the client
    /// certificate shown to it (`[etcd] tls`, `--etcd-ca`, `--etcd-cert`,
    /// `--etcd-key`); the system's trust store and no client certificate by default.
    pub tls: Option<BackendTlsConfig>,
    /// For a cluster with authentication on (`[etcd] user`, `password_file`;
    /// `--etcd-user`, `--etcd-password-file`): none by default.
    pub auth: Option<EtcdAuthConfig>,
}

/// The etcd user drover logs in as, and the file that holds its password (never the
/// password itself: a drover.toml is often world-readable or committed). The file is
/// read at start, at each reload, and at each login; one trailing newline is not part
/// of the password.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdAuthConfig {
    pub user: String,
    pub password_file: std::path::PathBuf,
}

/// The most streams `http2_max_streams` may allow (flags and files alike): each open
/// stream may hold a request buffer and a backend connection.
pub const HTTP2_MAX_STREAMS_MAX: u32 = 10_000;

/// The most serving threads one balancer may have (flags and files alike).
pub const THREADS_MAX: usize = 1024;

/// `[admin]`: where the control API listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminConfig {
    /// Listen address; default `127.0.0.1:9900`.
    pub listen: SocketAddr,
    /// Bearer token required by the admin API. Always `Some` when `listen` is not a
    /// loopback address (the loader refuses such a config without one).
    pub token: Option<String>,
}

/// `[[app]]`: a command drover starts, health-checks and restarts.
#[derive(Debug, Clone, PartialEq)]
pub struct AppConfig {
    /// What the supervisor runs: every key of the table but `listen`, defaults
    /// included. Its restart back-off is the supervisor's; no key sets it.
    pub spec: AppSpec,
    /// Shared mode only, and required there: the address the workers serve clients on.
    /// drover binds it before any worker starts and gives the supervisor the socket.
    pub listen: Option<SocketAddr>,
}

/// `health`: an active health check, for an app's workers or a balancer's backends.
/// The checker's own settings, so each field and default has one definition.
pub use drover_registry::{CheckKind, HealthCheck, StatusRange};

/// `[[balancer]]`: one listener and the pool it spreads requests over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BalancerConfig {
    /// Unique name: as written, or `"default"` for a lone unnamed balancer, or
    /// `"balancer-N"` (N = its index in the file) otherwise.
    pub name: String,
    /// Address the listener binds; `None`: no listener, the balancer serves only what
    /// other balancers' `routes` send it (the config refuses one no route names).
    pub listen: Option<SocketAddr>,
    /// How an endpoint is chosen; default `Strategy::P2c`.
    pub strategy: Strategy,
    /// The pool, in file order; never empty and without duplicates.
    pub backends: Vec<BackendRef>,
    /// Retries of a failed attempt on another endpoint, 0..=10; default 2.
    pub retries: u32,
    /// Concurrent requests per endpoint before drover queues the rest: `"auto"`
    /// (default, learned from latency), 0 (no limit) or a number. A backend's own
    /// `max_conns` overrides it.
    pub max_conns: ConnLimit,
    /// Waiting room for requests when every endpoint is at `max_conns`.
    pub queue: QueueConfig,
    /// Per-phase timeouts.
    pub timeouts: TimeoutConfig,
    /// Active health checking of backends; `None` = off (passive checks still apply).
    pub health: Option<HealthCheck>,
    /// Passive health: ejection of endpoints that keep failing.
    pub passive: PassiveConfig,
    /// Ramp-up period for an endpoint that just became healthy, `ZERO` = off; default 10s.
    pub slow_start: Duration,
    /// What to hash; `Some` exactly when `strategy == "hash"`.
    pub hash: Option<HashKey>,
    /// Sticky-session cookie; `Some` exactly when `strategy == "sticky"`.
    pub sticky: Option<StickyConfig>,
    /// Request-size limits.
    pub limits: LimitsConfig,
    /// How long to let in-flight requests finish on shutdown or reload; default 30s.
    pub drain_timeout: Duration,
    /// On SIGTERM or SIGINT, how long the listener still accepts, while `/readyz` says
    /// drover is stopping, before its drain begins (HAProxy's `grace`); default 0s. A
    /// load balancer or Kubernetes in front takes drover out of rotation some seconds
    /// after the stop begins, and sends new connections until then: a listener already
    /// closed refuses them.
    pub shutdown_delay: Duration,
    /// Worker threads for this listener, 1..=`THREADS_MAX`; `None` = drover decides.
    pub threads: Option<usize>,
    /// When client connections go to workers that serve them directly: set from the
    /// mode of the app behind it ("auto": `WhenEven`, "handoff": `Always`).
    pub handoff: drover_proxy::Handoff,
    /// A connection's requests stay on the worker that served its last one while it has
    /// nothing pending: set in front of one supervised app alone (`drover run`, an ecosystem file's
    /// app, `backends = ["app:NAME"]`), whose workers stand in for Node cluster's.
    pub connection_affinity: bool,
    /// `proxy_protocol = { trusted = [...] }`: every connection must come from one of
    /// these senders and start with a PROXY protocol header naming the client; `None`
    /// (default): no header is read.
    pub proxy_protocol: Option<TrustedSenders>,
    /// `send_proxy_protocol = "v1" | "v2"`: each backend connection starts with a PROXY
    /// protocol header naming the client (HAProxy's `send-proxy`, `send-proxy-v2`);
    /// `None` (default): none. Not for a balancer in front of an app.
    pub send_proxy_protocol: Option<SendVersion>,
    /// `forwarded_headers = { trusted = [...] }`: the senders whose `X-Forwarded-Proto`
    /// and `X-Forwarded-Host` go on as sent; `None` (default): loopback and private
    /// addresses (a proxy in front).
    pub forwarded_headers: Option<TrustedSenders>,
    /// `access_log`: a line per answered request; off by default. The library's own
    /// settings, so each default has one definition.
    pub access_log: AccessLogConfig,
    /// `mode`: HTTP (default) or TCP, where each connection is placed once and relayed
    /// unread; the settings that only HTTP has are refused then (`HTTP_ONLY`).
    pub mode: Protocol,
    /// `tls = { cert, key }` or `tls = { certs = [...] }`: serve HTTPS with these
    /// certificates (the files, read when the balancer starts and at each reload);
    /// `None` (default): plain HTTP.
    pub tls: Option<TlsConfig>,
    /// `redirect_to_https = PORT`: answer every request with a 308 to
    /// `https://HOST[:PORT]/TARGET` instead of proxying it (`backends = []` then);
    /// `None` (default): proxy.
    pub redirect_to_https: Option<u16>,
    /// `http2`: on a balancer with `tls`, offer HTTP/2 by ALPN (`h2`, then `http/1.1`);
    /// on by default, as in Caddy and Traefik (nginx's `http2 on`).
    pub http2: bool,
    /// `h2c`: on a plain balancer, serve cleartext HTTP/2 to clients that open with its
    /// preface (prior knowledge), HTTP/1.1 to the others; off by default.
    pub h2c: bool,
    /// `http2_max_streams`: the streams an HTTP/2 client may have open at once on one
    /// connection, 1..=`HTTP2_MAX_STREAMS_MAX`; only with HTTP/2 on (`tls` with `http2`,
    /// or `h2c`). Default 128, nginx's `http2_max_concurrent_streams`.
    pub http2_max_streams: u32,
    /// `routes = [...]`: the balancers that serve this listener's connections or
    /// requests, each picked by what its route matches. In TCP mode (`{ sni = [...],
    /// balancer = "NAME" }`) each connection's TLS ClientHello is read undecrypted and
    /// its server name picks (TLS passthrough); in HTTP mode (`{ host = [...],
    /// path_prefix = "/api", strip_prefix = true, balancer = "NAME" }`) each request's
    /// host and path do. What no route matches goes to this balancer's own backends;
    /// with none, a connection is closed and a request gets 404. Empty (default): no
    /// routes.
    pub routes: Vec<RouteConfig>,
    /// `backend_tls = { ca, server_name, cert, key, insecure_skip_verify }`: speak TLS
    /// to every backend, verifying its certificate (files read when the balancer
    /// starts and at each reload); `None` (default): plain TCP. HTTP mode only.
    pub backend_tls: Option<BackendTlsConfig>,
    /// `backend_protocol = "http1" | "h2c" | "h2"`: what requests go to the backends
    /// as: HTTP/1.1 (default), or each one a stream of an HTTP/2 connection per backend,
    /// in cleartext (`h2c`) or over `backend_tls` (`h2`). gRPC backends need one of the
    /// latter. Not for a balancer in front of an app.
    pub backend_protocol: drover_proxy::BackendProtocol,
}

/// One of a balancer's `routes`: what it matches and the balancer it sends to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteConfig {
    /// TCP mode: server names, lowercase, without a trailing dot: exact, or `*.SUFFIX`
    /// for every name that ends in `.SUFFIX`. Never empty there; no name is in two
    /// routes. Empty in HTTP mode.
    pub sni: Vec<String>,
    /// HTTP mode: the hosts it takes, as `sni`'s names (an IP address too; IPv6 in
    /// brackets, as a `Host` field writes it); empty: any host.
    pub host: Vec<String>,
    /// HTTP mode: the path prefix it takes, by whole segments unless it ends in `/`;
    /// `/` (default) takes every path. No two routes take the same host and prefix.
    pub path_prefix: String,
    /// HTTP mode: the backend sees the path without `path_prefix` (never `/`).
    pub strip_prefix: bool,
    /// Another balancer of the same mode, one without routes of its own.
    pub balancer: String,
}

/// `mode = "http" | "tcp"`.
pub use drover_proxy::Protocol;

/// A balancer setting that only means something to HTTP: refused on a `mode = "tcp"`
/// balancer, by its key in a drover.toml or its `drover proxy` flag, with one message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpOnly {
    /// The key, under `[[balancer]]`.
    pub key: &'static str,
    /// The `drover proxy` flag that sets it, if one does.
    pub flag: Option<&'static str>,
    /// Why TCP mode has no use for it.
    pub why: &'static str,
}

/// Every setting a TCP balancer refuses. Strategies and hash keys are checked apart
/// (`Strategy` values, not keys): see `tcp_strategy_refusal`.
pub const HTTP_ONLY: &[HttpOnly] = &[
    HttpOnly {
        key: "timeouts.header_read",
        flag: Some("--header-timeout"),
        why: "there is no request head to read (timeouts.idle bounds a silent client); with proxy_protocol it bounds the PROXY header, with tls the handshake, with routes the TLS ClientHello",
    },
    HttpOnly {
        key: "timeouts.request",
        flag: Some("--request-timeout"),
        why: "there is no response to wait for (timeouts.idle bounds a silent backend)",
    },
    HttpOnly {
        key: "timeouts.client",
        flag: Some("--client-timeout"),
        why: "there is no request in flight (timeouts.idle bounds a silent client)",
    },
    HttpOnly {
        key: "timeouts.body",
        flag: Some("--body-timeout"),
        why: "there is no request body",
    },
    HttpOnly {
        key: "timeouts.body_min_rate",
        flag: Some("--body-min-rate"),
        why: "there is no request body",
    },
    HttpOnly {
        key: "limits.max_body_bytes",
        flag: Some("--max-body-bytes"),
        why: "TCP mode reads no HTTP request, so no request body to bound",
    },
    HttpOnly {
        key: "limits",
        flag: Some("--max-header-bytes"),
        why: "TCP mode reads no HTTP request head to bound",
    },
    HttpOnly {
        key: "health.path",
        flag: Some("--health-path"),
        why: "a TCP backend may not speak HTTP: use tcp = true (--health-tcp), a connect check",
    },
    HttpOnly {
        key: "health.grpc",
        flag: Some("--health-grpc"),
        why: "the gRPC health protocol is spoken over HTTP/2, and TCP mode speaks none: use tcp = true (--health-tcp), a connect check",
    },
    HttpOnly {
        key: "backend_protocol",
        flag: Some("--backend-protocol"),
        why: "TCP mode relays the client's bytes unread, whatever protocol they are",
    },
    HttpOnly {
        key: "redirect_to_https",
        flag: Some("--redirect-to-https"),
        why: "a redirect answers an HTTP request, which TCP mode does not read",
    },
    HttpOnly {
        key: "http2",
        flag: Some("--http2"),
        why: "HTTP/2 is read frame by frame, and TCP mode reads nothing",
    },
    HttpOnly {
        key: "h2c",
        flag: Some("--h2c"),
        why: "HTTP/2 is read frame by frame, and TCP mode reads nothing",
    },
    HttpOnly {
        key: "http2_max_streams",
        flag: Some("--http2-max-streams"),
        why: "HTTP/2 is read frame by frame, and TCP mode reads nothing",
    },
    HttpOnly {
        key: "forwarded_headers",
        flag: Some("--forwarded-headers-from"),
        why: "TCP mode reads no header and writes none",
    },
    HttpOnly {
        key: "max_conns",
        flag: Some("--max-conns"),
        why: "\"auto\" learns from request latency; give a number of connections per endpoint, or 0 (no limit)",
    },
];

/// Why a gRPC health check needs HTTP/2 to the backends; the drover.toml key and the
/// flag say the same.
pub const GRPC_CHECK_NEEDS_HTTP2: &str = "the gRPC health protocol is spoken over HTTP/2: set backend_protocol = \"h2c\" (or \"h2\" with backend_tls; --backend-protocol)";

/// Why `backend_protocol` cannot go with the rest of a balancer's settings (its
/// `backend_tls`, its `send_proxy_protocol`), or `None` when it can; the drover.toml
/// key and the flag say the same.
pub fn backend_protocol_refusal(
    protocol: drover_proxy::BackendProtocol,
    backend_tls: bool,
    send_proxy_protocol: bool,
) -> Option<&'static str> {
    use drover_proxy::BackendProtocol::{H2c, H2};
    match (protocol, backend_tls) {
        (H2, false) => return Some("\"h2\" is HTTP/2 over TLS, and this balancer has no backend TLS (backend_tls, --backend-tls): add it, or use \"h2c\" for HTTP/2 in cleartext"),
        (H2c, true) => return Some("\"h2c\" is HTTP/2 in cleartext, and this balancer speaks TLS to its backends: use \"h2\" for HTTP/2 over TLS"),
        _ => {}
    }
    (protocol.is_http2() && send_proxy_protocol).then_some("a PROXY protocol header names one client, and an HTTP/2 connection carries many clients' requests: drop send_proxy_protocol or use \"http1\"")
}

impl HttpOnly {
    /// The entry for `key`; every caller names a key of `HTTP_ONLY`.
    pub fn of(key: &str) -> &'static HttpOnly {
        HTTP_ONLY
            .iter()
            .find(|h| h.key == key)
            .unwrap_or_else(|| panic!("{key} is not in HTTP_ONLY"))
    }

    /// The message under a key in a drover.toml.
    pub fn in_file(&self) -> String {
        format!(
            "{} does not apply to mode = \"tcp\": {}",
            self.key, self.why
        )
    }

    /// The message for a `drover proxy --tcp` flag.
    pub fn in_flags(&self) -> String {
        format!(
            "{} does not apply to --tcp: {}",
            self.flag.unwrap_or(self.key),
            self.why
        )
    }
}

/// Why a strategy (with its hash key) cannot place TCP connections, or `None` when it
/// can: a connection has no request to read a header, cookie or path from, and no
/// latency per request to rank by.
pub fn tcp_strategy_refusal(strategy: Strategy, hash: Option<&HashKey>) -> Option<String> {
    match (strategy, hash) {
        (Strategy::PeakEwma, _) => Some("strategy \"peak-ewma\" ranks endpoints by request latency, which TCP mode does not see: use least-conn or p2c (open connections), round-robin, weighted, random or hash on client-ip".into()),
        (Strategy::Sticky, _) => Some("strategy \"sticky\" pins clients by an HTTP cookie: in TCP mode use strategy = \"hash\" with key = \"client-ip\"".into()),
        (Strategy::Hash, Some(k)) if *k != HashKey::ClientIp => Some(format!("hash key {:?} is read from an HTTP request: in TCP mode only \"client-ip\" can be hashed", hash_key_name(k))),
        _ => None,
    }
}

/// Why a TCP balancer cannot have this access log, or `None` when it can: its lines
/// are JSON, one per connection, with fixed fields (`access_log::TCP_FIELDS`).
pub fn tcp_access_log_refusal(format: AccessLogFormat, fields_given: bool) -> Option<String> {
    if format == AccessLogFormat::Combined {
        return Some("format \"combined\" is a line per HTTP request (method, target, status), which TCP mode does not read: use format = \"json\", a line per connection".into());
    }
    if fields_given {
        return Some(format!(
            "a TCP balancer's lines have fixed fields ({}): leave fields out",
            drover_proxy::access_log::TCP_FIELDS
        ));
    }
    None
}

/// A hash key as written in a drover.toml.
fn hash_key_name(k: &HashKey) -> String {
    match k {
        HashKey::Header(h) => format!("header:{h}"),
        HashKey::Cookie(c) => format!("cookie:{c}"),
        HashKey::ClientIp => "client-ip".into(),
        HashKey::Path => "path".into(),
    }
}

/// `tls`: the certificate files, the library's own type.
pub use drover_proxy::tls::{CertFiles as TlsCertFiles, Settings as TlsConfig};

/// `backend_tls`: the library's own settings.
pub use drover_proxy::backend_tls::Settings as BackendTlsConfig;

/// `access_log = { format, path, fields }`.
pub use drover_proxy::access_log::{
    Field as AccessLogField, Format as AccessLogFormat, Settings as AccessLogConfig,
};

impl BalancerConfig {
    /// A balancer with every optional setting at its default, for configs built from
    /// command-line flags rather than a file.
    pub fn new(name: impl Into<String>, listen: SocketAddr, backends: Vec<BackendRef>) -> Self {
        BalancerConfig {
            name: name.into(),
            listen: Some(listen),
            strategy: Strategy::default(),
            backends,
            retries: drover_proxy::ProxyOptions::default().retries,
            max_conns: ConnLimit::Auto,
            queue: QueueConfig::default(),
            timeouts: TimeoutConfig::default(),
            health: None,
            passive: PassiveConfig::default(),
            slow_start: SLOW_START,
            hash: None,
            sticky: None,
            limits: LimitsConfig::default(),
            drain_timeout: DRAIN_TIMEOUT,
            shutdown_delay: Duration::ZERO,
            threads: None,
            handoff: drover_proxy::Handoff::Never,
            connection_affinity: false,
            proxy_protocol: None,
            send_proxy_protocol: None,
            forwarded_headers: None,
            access_log: AccessLogConfig::default(),
            mode: Protocol::Http,
            tls: None,
            redirect_to_https: None,
            routes: Vec::new(),
            http2: drover_proxy::ProxyOptions::default().http2,
            h2c: drover_proxy::ProxyOptions::default().h2c,
            http2_max_streams: drover_proxy::ProxyOptions::default().http2_max_streams,
            backend_tls: None,
            backend_protocol: drover_proxy::ProxyOptions::default().backend_protocol,
        }
    }

    /// Makes this, the balancer in front of a Node app whose server does not speak
    /// HTTP (it ends TLS itself, or speaks a protocol of its own), a TCP one that hands
    /// each connection to a worker at accept, unread, as Node's cluster module hands
    /// every connection; one that no worker can take then is relayed unread. `Err`:
    /// the HTTP setting given for it, with why TCP mode has no use for it.
    pub fn serve_unread(&mut self) -> Result<(), String> {
        let (t, dt) = (&self.timeouts, TimeoutConfig::default());
        let health = self.health.as_ref().map(|h| &h.kind);
        let given = [
            // With a handshake to make, it bounds that, as in HTTP mode.
            (
                "timeouts.header_read",
                t.header_read != dt.header_read && self.tls.is_none(),
            ),
            // Off (`drover run`'s default) bounds nothing that TCP mode would lack.
            (
                "timeouts.request",
                t.request.is_some() && t.request != dt.request,
            ),
            ("timeouts.client", t.client != dt.client),
            ("timeouts.body", t.body != dt.body),
            (
                "timeouts.body_min_rate",
                t.body_min_rate != dt.body_min_rate,
            ),
            (
                "health.path",
                matches!(health, Some(CheckKind::Http { .. })),
            ),
            (
                "health.grpc",
                matches!(health, Some(CheckKind::Grpc { .. })),
            ),
            (
                "backend_protocol",
                self.backend_protocol != drover_proxy::ProxyOptions::default().backend_protocol,
            ),
            ("redirect_to_https", self.redirect_to_https.is_some()),
            ("h2c", self.h2c),
            ("forwarded_headers", self.forwarded_headers.is_some()),
            (
                "limits.max_body_bytes",
                self.limits.max_body_bytes.is_some(),
            ),
            ("limits", self.limits != LimitsConfig::default()),
        ];
        if let Some((key, _)) = given.into_iter().find(|(_, given)| *given) {
            let entry = HttpOnly::of(key);
            return Err(format!(
                "{}: {}",
                entry.flag.unwrap_or(entry.key),
                entry.why
            ));
        }
        if let Some(why) = tcp_strategy_refusal(self.strategy, self.hash.as_ref()) {
            return Err(why);
        }
        if let Some(why) = tcp_access_log_refusal(self.access_log.format, false) {
            return Err(why);
        }
        self.mode = Protocol::Tcp;
        if self.max_conns == ConnLimit::Auto {
            // "auto" learns from request latency, which TCP mode does not see.
            self.max_conns = ConnLimit::Fixed(0);
        }
        self.http2 = false;
        self.handoff = drover_proxy::Handoff::Always;
        Ok(())
    }
}

impl AppConfig {
    /// An app with every optional setting at its default, for configs built from
    /// command-line flags rather than a file.
    pub fn new(name: impl Into<String>, command: Vec<String>) -> Self {
        AppConfig {
            spec: AppSpec::new(name, command),
            listen: None,
        }
    }
}

/// One entry of a balancer's `backends`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackendRef {
    /// A fixed address: `"127.0.0.1:9001"` or `{ address = "...", weight, max_conns }`.
    Addr {
        /// The backend's address.
        addr: SocketAddr,
        /// Relative weight for weighted strategies, 1..=1000; default 1.
        weight: u32,
        /// Per-endpoint concurrency cap overriding the balancer's `max_conns`.
        max_conns: Option<u32>,
    },
    /// `"app:NAME"`: every worker of the `[[app]]` called NAME (guaranteed to exist).
    App(String),
    /// `"dns:HOST:PORT"` (A and AAAA records) or `"dns+srv:NAME"` (SRV records),
    /// looked up again when the answer's TTL lapses.
    Dns(drover_dns::DnsTarget),
    /// `"etcd:/PREFIX"`: the members under `PREFIX/members/` in the `[etcd]` cluster.
    Etcd(String),
}

/// `hash.key`: the request property the `hash` strategy hashes.
pub use drover_proxy::proxy_protocol::{SendVersion, TrustedSenders};
pub use drover_proxy::HashKey;

/// `sticky`: the cookie that pins a client to an endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StickyConfig {
    /// Cookie name; default `"drover_sticky"`.
    pub cookie: String,
}

/// `queue`: requests wait here while every endpoint is at `max_conns`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueConfig {
    /// Most requests waiting at once; default unlimited.
    pub max: QueueMax,
    /// Longest a request waits before getting a 503; `None` (default) = the request
    /// timeout, or 30s where that is off.
    pub timeout: Option<Duration>,
}

impl Default for QueueConfig {
    fn default() -> Self {
        QueueConfig {
            max: QueueMax::Unlimited,
            timeout: None,
        }
    }
}

/// `timeouts`: limits on each phase of a proxied request. All are non-zero.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimeoutConfig {
    /// Connecting to a backend; default 5s (one retransmitted SYN must fit).
    pub connect: Duration,
    /// Receiving a client's request head; default 10s.
    pub header_read: Duration,
    /// The longest wait for a backend's response head, and between reads of any body;
    /// `None` ("off"): for as long as the client waits. Default 30s; `drover run` and
    /// PM2 ecosystem files: off, as under Node's cluster module and PM2.
    pub request: Option<Duration>,
    /// An idle keep-alive connection, client or backend side; default 60s.
    pub idle: Duration,
    /// A client mid-request sending or reading nothing; default 30s.
    pub client: Duration,
    /// Grace for a request body, which must arrive by `body + received /
    /// body_min_rate`; default 20s.
    pub body: Duration,
    /// Bytes per second a request body must keep up past its grace; default 500.
    pub body_min_rate: u32,
    /// TCP mode: once one side finished sending, how long the other way may move
    /// nothing before the connection is cut; default 30s.
    pub half_close: Duration,
}

impl Default for TimeoutConfig {
    /// The proxy's own defaults: one definition of each.
    fn default() -> Self {
        let t = drover_proxy::Timeouts::default();
        TimeoutConfig {
            connect: t.connect,
            header_read: t.header_read,
            request: t.request,
            idle: t.idle,
            client: t.client,
            body: t.body,
            body_min_rate: t.body_min_rate,
            half_close: t.half_close,
        }
    }
}

/// `passive`: ejection of endpoints whose real traffic keeps failing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PassiveConfig {
    /// Consecutive failures (5xx or connect errors) that eject an endpoint, 0 = off;
    /// default 5.
    pub failures: u32,
    /// First ejection period, doubled on each repeat ejection; default 2s.
    pub ejection: Duration,
    /// Cap on the ejection period, never below `ejection`; default 60s.
    pub max_ejection: Duration,
}

impl Default for PassiveConfig {
    /// The ejection policy's own defaults: one definition of each.
    fn default() -> Self {
        let p = drover_registry::PassivePolicy::default();
        PassiveConfig {
            failures: p.consecutive_5xx,
            ejection: p.base_ejection,
            max_ejection: p.max_ejection,
        }
    }
}

/// The bounds of `limits.max_header_bytes` and `--max-header-bytes`.
pub const HEAD_BYTES_RANGE: (usize, usize) = (1024, 1_048_576);

/// `limits`: bounds on what a client may send; requests over them get 4xx.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitsConfig {
    /// Whole request head, 1024..=1048576 bytes; default 16384.
    pub max_header_bytes: usize,
    /// Request target, 256..=1048576 bytes; default 16384.
    pub max_uri_bytes: usize,
    /// Number of header fields, 1..=10000; default 2000.
    pub max_headers: usize,
    /// The largest request body, in bytes; `None` (default, or 0 as nginx's
    /// `client_max_body_size 0`): no bound.
    pub max_body_bytes: Option<u64>,
}

impl Default for LimitsConfig {
    /// The parser's own limits: one definition of each.
    fn default() -> Self {
        let l = drover_proxy::Limits::default();
        LimitsConfig {
            max_header_bytes: l.max_header_bytes,
            max_uri_bytes: l.max_uri_bytes,
            max_headers: l.max_headers,
            max_body_bytes: l.max_body_bytes,
        }
    }
}

pub const DEFAULT_ADMIN_LISTEN: &str = "127.0.0.1:9900";
/// The name of a lone unnamed balancer, of `drover proxy`'s and of `drover run`'s.
pub const DEFAULT_BALANCER: &str = "default";
/// A joining or returning endpoint's share ramps up over this long: long enough for a
/// JIT or a cold cache to warm, short enough that a scale-up helps within seconds. The
/// pool's own default is off (a bare pool ramps nothing); the product's is this.
pub const SLOW_START: Duration = Duration::from_secs(10);
/// How long in-flight requests may take to finish on shutdown or reload.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);
pub const DEFAULT_STICKY_COOKIE: &str = "drover_sticky";

impl BalancerConfig {
    /// Whether this balancer hands client connections to the workers of the apps
    /// behind it, by their modes: "handoff" always, "auto" while requests cost alike,
    /// else never. Never with `hash` or `sticky` either: those place each request by its
    /// key (a cookie, a header), and a connection handed to a worker would carry
    /// requests whose key names another. Nor when it speaks HTTP/2 to them (gRPC): a
    /// client's connection, handed as it is, would pin every call on it to one worker,
    /// which per-stream placement is there to avoid. Nor with `limits.max_body_bytes`:
    /// a limit must hold for every request, and a handed connection's requests go to
    /// its worker unseen.
    pub fn handoff_for(&self, modes: &[Mode]) -> drover_proxy::Handoff {
        if matches!(self.strategy, Strategy::Hash | Strategy::Sticky)
            || self.backend_protocol.is_http2()
            || self.limits.max_body_bytes.is_some()
        {
            drover_proxy::Handoff::Never
        } else if modes.contains(&Mode::Handoff) {
            drover_proxy::Handoff::Always
        } else if modes.contains(&Mode::Auto) {
            drover_proxy::Handoff::WhenEven
        } else {
            drover_proxy::Handoff::Never
        }
    }
}

#[cfg(test)]
mod handoff_tests {
    use super::*;
    use drover_proxy::Handoff;

    fn balancer(strategy: Strategy, protocol: drover_proxy::BackendProtocol) -> BalancerConfig {
        let mut b = BalancerConfig::new("b", "127.0.0.1:80".parse().unwrap(), Vec::new());
        b.strategy = strategy;
        b.backend_protocol = protocol;
        b
    }

    #[test]
    fn modes_key_strategies_http2_and_a_body_limit_decide_the_handoff() {
        use drover_proxy::BackendProtocol::{H2c, Http1};
        let p2c = balancer(Strategy::P2c, Http1);
        assert_eq!(p2c.handoff_for(&[Mode::Auto]), Handoff::WhenEven);
        assert_eq!(
            balancer(Strategy::LeastConn, Http1).handoff_for(&[Mode::Proxy, Mode::Handoff]),
            Handoff::Always
        );
        assert_eq!(p2c.handoff_for(&[Mode::Proxy]), Handoff::Never);
        assert_eq!(p2c.handoff_for(&[]), Handoff::Never);
        for keyed in [Strategy::Hash, Strategy::Sticky] {
            let b = balancer(keyed, Http1);
            assert_eq!(b.handoff_for(&[Mode::Auto]), Handoff::Never);
            assert_eq!(b.handoff_for(&[Mode::Handoff]), Handoff::Never);
        }
        // gRPC workers: every call placed on its own.
        assert_eq!(
            balancer(Strategy::P2c, H2c).handoff_for(&[Mode::Auto]),
            Handoff::Never
        );
        let mut limited = p2c.clone();
        limited.limits.max_body_bytes = Some(1 << 20);
        assert_eq!(limited.handoff_for(&[Mode::Auto]), Handoff::Never);
    }
}

/// How many requests may wait in drover's queue at once.
///
/// Unlimited by default, as HAProxy's `maxqueue 0`: past capacity every request waits its
/// turn, as it would inside Node's cluster module or PM2, and only one that waited the
/// whole queue timeout gets a 503. Waiting is bounded anyway: each waiter is an open
/// client connection, which the descriptor limit bounds, and holds only its parsed head.
/// A number sheds load at that depth instead (0: never wait, a 503 at once).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueMax {
    Unlimited,
    At(usize),
}

impl QueueMax {
    /// The bound as the proxy takes it.
    pub fn as_usize(self) -> usize {
        match self {
            QueueMax::Unlimited => usize::MAX,
            QueueMax::At(n) => n,
        }
    }

    pub(crate) fn parse_count(n: i64) -> Result<Self, String> {
        match usize::try_from(n) {
            Ok(n) if n <= 1_000_000 => Ok(QueueMax::At(n)),
            _ => Err(format!(
                "{n} is out of range: expected \"unlimited\" or 0..=1000000 (0: never queue)"
            )),
        }
    }
}

/// As a flag or file value is written: `unlimited` or the number, so a default shown in
/// `--help` reads back as itself.
impl fmt::Display for QueueMax {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QueueMax::Unlimited => f.write_str("unlimited"),
            QueueMax::At(n) => write!(f, "{n}"),
        }
    }
}

impl std::str::FromStr for QueueMax {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if s == "unlimited" {
            return Ok(QueueMax::Unlimited);
        }
        match s.parse::<i64>() {
            Ok(n) => QueueMax::parse_count(n),
            Err(_) => Err(format!(
                "invalid queue max {s:?}: expected \"unlimited\" or a number up to 1000000 (0: never queue)"
            )),
        }
    }
}

/// Requests in flight per endpoint before drover queues the rest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnLimit {
    /// Learned per endpoint from latency: about one at a time for a backend that serves
    /// one at a time, more for one that runs requests in parallel.
    Auto,
    /// A fixed cap; 0 means no cap at all.
    Fixed(u32),
}

/// As a flag or file value is written: `auto` or the number.
impl fmt::Display for ConnLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConnLimit::Auto => f.write_str("auto"),
            ConnLimit::Fixed(n) => write!(f, "{n}"),
        }
    }
}

impl std::str::FromStr for ConnLimit {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if s == "auto" {
            return Ok(ConnLimit::Auto);
        }
        match s.parse::<u32>() {
            Ok(n) if n <= 1_000_000 => Ok(ConnLimit::Fixed(n)),
            _ => Err(format!(
                "invalid max_conns {s:?}: expected \"auto\", 0 (no limit) or a number up to 1000000"
            )),
        }
    }
}
