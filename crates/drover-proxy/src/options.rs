//! What one balancer listener is configured with.

use crate::proxy_protocol::{SendVersion, TrustedSenders};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct ProxyOptions {
    /// Shown in logs and metrics.
    pub name: String,
    /// Where clients connect; `None`: nowhere, the balancer serves only what other
    /// listeners' routes send it (`Proxy::unbound`).
    pub listen: Option<SocketAddr>,
    /// Threads serving connections (each with its own event loop and listener socket).
    pub threads: usize,
    /// Extra attempts on another endpoint for a request that failed safely.
    pub retries: u32,
    pub timeouts: Timeouts,
    pub limits: Limits,
    pub queue: QueueOptions,
    pub hash_key: Option<HashKey>,
    /// Cookie that pins a client to an endpoint (strategy `sticky`).
    pub sticky_cookie: Option<String>,
    /// Idle keep-alive connections kept per endpoint and thread.
    ///
    /// 1024, not 64: each connection let go past the cap is a new one at the next
    /// peak, and a busy Node backend accepts about one per turn of its event loop.
    /// 300 keep-alive clients over 4 Node backends (75 requests in each) left 44 of
    /// 300 connections unpooled after every lull at 64, and a request on each of those
    /// waited seconds. Idle connections never outnumber the requests once in flight
    /// together, and those are within drover's descriptor budget (`descriptors`).
    pub max_idle_per_endpoint: usize,
    /// When client connections go to an endpoint that takes connections itself
    /// (`Pool::hand_off`: a Node worker under `drover run`), which then serves them with
    /// no drover in between.
    pub handoff: Handoff,
    /// A keep-alive connection's next request goes to the endpoint that answered its
    /// last one while that one has nothing pending, and so does the connection when it
    /// is handed over (`connection_affinity`): for workers that stand in for Node
    /// cluster's, which never move a connection, so an app that keeps a client's state
    /// in memory (a session) finds it. Off for `drover proxy`, which spreads one
    /// connection's requests as nginx and HAProxy do.
    pub connection_affinity: bool,
    /// Read a PROXY protocol header (v1 or v2) from these senders, and refuse every
    /// other connection (`proxy_protocol`); `None`: none is expected. Connections are
    /// then never handed to a worker, which would see the sender's address, not the
    /// client's.
    pub proxy_protocol: Option<TrustedSenders>,
    /// Write a PROXY protocol header naming the client first on every backend
    /// connection (`send_proxy_protocol`); `None`: none. Such a connection then carries
    /// one client's requests only: it is kept for that client's next request, never
    /// shared with another client.
    pub send_proxy_protocol: Option<SendVersion>,
    /// Whose `X-Forwarded-Proto` and `X-Forwarded-Host` go on as sent
    /// (`forwarded_headers`); `None`: a client on a loopback or private address's (see
    /// `ClientInfo::keeps_forwarded`). Everyone else's are replaced by drover's own.
    pub forwarded_headers_from: Option<TrustedSenders>,
    /// A line per answered request (`access_log`); off by default.
    pub access_log: crate::access_log::Settings,
    /// What the listener speaks: HTTP/1.1, or plain TCP relayed as it comes (`tcp.rs`).
    pub protocol: Protocol,
    /// Serve HTTPS with these certificates (`tls`), loaded and checked; `None`: plain
    /// HTTP. TLS connections are never handed to a worker.
    pub tls: Option<Arc<crate::tls::Certificates>>,
    /// Answer every request with a redirect to the same host and target over HTTPS on
    /// this port (`redirect_to_https`, the plain port 80 beside a TLS one), and proxy
    /// none; `None`: proxy as usual.
    pub redirect_to_https: Option<u16>,
    /// Offer HTTP/2 by ALPN on a TLS listener (`http2`, on by default): each stream is
    /// one request through the same admission, retries and pool (`http2/`).
    pub http2: bool,
    /// Take cleartext HTTP/2 with prior knowledge on a plain listener (`h2c`, off by
    /// default): a connection that opens with the HTTP/2 preface speaks it, any other
    /// HTTP/1.1.
    pub h2c: bool,
    /// Streams an HTTP/2 client may have open at once on one connection (its
    /// SETTINGS_MAX_CONCURRENT_STREAMS, `http2_max_streams`).
    pub http2_max_streams: u32,
    /// Speak TLS to every endpoint (`backend_tls`), verified as its settings say, loaded
    /// and checked; `None`: plain TCP. HTTP mode only.
    pub backend_tls: Option<Arc<crate::backend_tls::Connector>>,
    /// What requests go to the backends as (`backend_protocol`): HTTP/1.1 over a
    /// keep-alive pool (the default), or each one a stream on an HTTP/2 connection per
    /// backend and thread (`http2::backend`), cleartext (`h2c`) or over `backend_tls`.
    pub backend_protocol: BackendProtocol,
}

pub use crate::http2::backend::BackendProtocol;

/// What a balancer's clients speak (`mode` in drover.toml, `drover proxy --tcp`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Protocol {
    /// Requests are read, placed one by one and answered (the default).
    #[default]
    Http,
    /// Each connection is placed once, at accept, and its bytes relayed both ways
    /// unread.
    Tcp,
}

impl Protocol {
    /// The name drover.toml's `mode` key writes.
    pub fn name(self) -> &'static str {
        match self {
            Protocol::Http => "http",
            Protocol::Tcp => "tcp",
        }
    }
}

impl std::fmt::Display for Protocol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Protocol {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "http" => Ok(Protocol::Http),
            "tcp" => Ok(Protocol::Tcp),
            _ => Err(format!("invalid mode {s:?}: expected \"http\" or \"tcp\"")),
        }
    }
}

/// When a balancer hands client connections to the workers that take them (see
/// `ProxyOptions::handoff`). A connection that none can take is served here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Handoff {
    /// Every request is placed here (`drover proxy`, `drover run --mode proxy`).
    #[default]
    Never,
    /// Each new connection, at accept, and a proxied one between requests
    /// (`--mode handoff`).
    Always,
    /// A proxied keep-alive connection between two requests, while the app's requests
    /// cost alike (`CostSpread`); every new connection's first request is placed here
    /// (`drover run`'s default, `auto`).
    WhenEven,
}

impl Default for ProxyOptions {
    fn default() -> Self {
        ProxyOptions {
            name: "default".into(),
            listen: Some(SocketAddr::from(([127, 0, 0, 1], 0))),
            threads: 1,
            retries: 2,
            timeouts: Timeouts::default(),
            limits: Limits::default(),
            queue: QueueOptions::default(),
            hash_key: None,
            sticky_cookie: None,
            max_idle_per_endpoint: 1024,
            handoff: Handoff::Never,
            connection_affinity: false,
            proxy_protocol: None,
            send_proxy_protocol: None,
            forwarded_headers_from: None,
            access_log: crate::access_log::Settings::default(),
            protocol: Protocol::Http,
            tls: None,
            redirect_to_https: None,
            http2: true,
            h2c: false,
            // nginx's `http2_max_concurrent_streams` default.
            http2_max_streams: 128,
            backend_tls: None,
            backend_protocol: BackendProtocol::Http1,
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// Opening a connection to an endpoint.
    pub connect: Duration,
    /// A client has this long to send a whole request head once it starts (slow clients).
    /// The PROXY protocol header and the TLS handshake come within it; in TCP mode it
    /// bounds the PROXY header and, with SNI routes, the ClientHello (together).
    pub header_read: Duration,
    /// Longest wait for a backend's response head, and between reads of any body.
    /// `None` ("off"): a quiet backend is waited on for as long as the client stays,
    /// as with the app alone (Node's cluster module and PM2 bound no answer's time);
    /// `drover run`'s default, where the supervisor, not a timeout, finds a hung
    /// worker. A long-poll of 45 s, or a report that takes minutes, got a 504 at 30 s.
    pub request: Option<Duration>,
    /// Keep-alive connections (client and backend side) idle longer than this are closed.
    pub idle: Duration,
    /// A client in the middle of a request that sends nothing (of its body) or reads
    /// nothing (of its response) for this long is cut off (slow POST, slow read). Only
    /// what does not fit drover's buffers ties a backend to such a client meanwhile.
    pub client: Duration,
    /// With `body_min_rate`: a request body must have arrived in full by `body +
    /// bytes received / body_min_rate` (Apache's `RequestReadTimeout body=20,MinRate=500`),
    /// however often it sends a byte. Time drover spends not reading it (queued for an
    /// endpoint, or held up by the backend) does not count.
    pub body: Duration,
    /// Bytes per second a request body must keep up past its `body` grace.
    pub body_min_rate: u32,
    /// TCP mode: once one side of a relayed connection has finished sending, the other
    /// direction is cut after this long with nothing passing (HAProxy's
    /// `timeout client-fin`); `idle` applies until then.
    pub half_close: Duration,
}

impl Timeouts {
    /// How long an exchange waits on a backend that sends nothing before it acts: the
    /// request timeout; for one that waits for as long as its client stays (a
    /// long-lived one, such as an event stream or a gRPC call, or any one with the
    /// request timeout off), how often it asks whether the client has gone. That is at
    /// most the client timeout, so a request timeout raised for slow reports does not
    /// keep a departed subscriber's connections for as long.
    pub fn quiet_backend(&self, long_lived: bool) -> Duration {
        match self.request {
            Some(request) if long_lived => request.min(self.client),
            Some(request) => request,
            None => self.client,
        }
    }

    /// Whether an exchange waits on a quiet backend for as long as its client stays,
    /// rather than failing with a 504 after the request timeout.
    pub fn waits_while_client_stays(&self, long_lived: bool) -> bool {
        long_lived || self.request.is_none()
    }

    /// How long writing to a backend that reads nothing may take: the request timeout,
    /// or with it off the client timeout (a backend that stopped reading a body is
    /// stuck whether or not its answers may take long).
    pub fn backend_write(&self) -> Duration {
        self.request.unwrap_or(self.client)
    }
}

/// The request timeout of `drover proxy` and of a drover.toml's balancers (nginx's
/// `proxy_read_timeout` is 60 s, HAProxy's examples' `timeout server` 30–50 s); also
/// how long a request may wait in drover's queue when the request timeout is off.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            // One retransmitted SYN (at 1 s) must fit: a busy backend whose listen backlog
            // overflowed drops the first, and a 1 s timeout turned that into an ejection.
            connect: Duration::from_secs(5),
            header_read: Duration::from_secs(10),
            request: Some(DEFAULT_REQUEST_TIMEOUT),
            idle: Duration::from_secs(60),
            client: Duration::from_secs(30),
            // 500 B/s: a slow mobile upload (1 KiB/s) that makes progress is never cut;
            // a body trickling bytes to hold a connection open is, after 20 s or so.
            body: Duration::from_secs(20),
            body_min_rate: 500,
            // A peer that half-closed usually waits for the rest of an answer that is
            // already on its way; one that never comes should not hold two descriptors
            // for the whole idle timeout.
            half_close: Duration::from_secs(30),
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_header_bytes: usize,
    pub max_uri_bytes: usize,
    pub max_headers: usize,
    /// The largest request body a client may send, `None`: no bound (HAProxy's and
    /// Node's default; nginx's `client_max_body_size` is 1 MiB, which refuses the uploads
    /// an app served under Node or PM2). Over it, a 413.
    pub max_body_bytes: Option<u64>,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            // Node's http server refuses a head over 16 KiB, and HAProxy's buffer is as
            // large. The target has no bound of its own in either: a URL that an app
            // served under Node or PM2 is not refused here (nginx's 8 KiB is stricter).
            max_header_bytes: 16 * 1024,
            max_uri_bytes: 16 * 1024,
            max_headers: crate::http1::FIELDS_NODE_KEEPS,
            max_body_bytes: None,
        }
    }
}

/// Requests wait here while every endpoint is at `max_conns` (late binding).
#[derive(Debug, Clone, Copy)]
pub struct QueueOptions {
    /// Most requests waiting at once (`usize::MAX`: no bound but the timeout).
    pub max: usize,
    pub timeout: Duration,
}

impl Default for QueueOptions {
    fn default() -> Self {
        QueueOptions {
            max: usize::MAX,
            timeout: Duration::from_secs(5),
        }
    }
}

/// What `hash` balances on, written `header:NAME`, `cookie:NAME`, `client-ip` or
/// `path` in flags and config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HashKey {
    /// A request header; the name is kept lowercase.
    Header(String),
    Cookie(String),
    ClientIp,
    /// The request path, without the query.
    Path,
}

impl std::str::FromStr for HashKey {
    type Err = ParseHashKeyError;

    fn from_str(s: &str) -> Result<Self, ParseHashKeyError> {
        let named = |kind: &'static str, name: &str| {
            if crate::http1::headers::is_token(name) {
                Ok(name.to_owned())
            } else {
                Err(ParseHashKeyError::InvalidName {
                    key: s.to_owned(),
                    kind,
                    name: name.to_owned(),
                })
            }
        };
        if let Some(h) = s.strip_prefix("header:") {
            // Header names are case-insensitive; lowercase once here so lookups needn't.
            named("header", h).map(|h| HashKey::Header(h.to_ascii_lowercase()))
        } else if let Some(c) = s.strip_prefix("cookie:") {
            named("cookie", c).map(HashKey::Cookie)
        } else if s == "client-ip" {
            Ok(HashKey::ClientIp)
        } else if s == "path" {
            Ok(HashKey::Path)
        } else {
            Err(ParseHashKeyError::Unknown { key: s.to_owned() })
        }
    }
}

/// Why a string is not a `HashKey`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParseHashKeyError {
    /// `header:NAME` or `cookie:NAME` (`kind`) with a `name` that is not an HTTP token.
    InvalidName {
        key: String,
        kind: &'static str,
        name: String,
    },
    /// None of the known forms.
    Unknown { key: String },
}

impl std::fmt::Display for ParseHashKeyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ParseHashKeyError::InvalidName { key, kind, name } => write!(
                f,
                "invalid hash key {key:?}: {name:?} is not a valid {kind} name"
            ),
            ParseHashKeyError::Unknown { key } => write!(
                f,
                "invalid hash key {key:?}: expected \"header:NAME\", \"cookie:NAME\", \"client-ip\" or \"path\""
            ),
        }
    }
}

impl std::error::Error for ParseHashKeyError {}

#[cfg(test)]
mod tests {
    use super::{HashKey, ParseHashKeyError};

    #[test]
    fn hash_keys_parse() {
        assert_eq!(
            "header:X-User".parse(),
            Ok(HashKey::Header("x-user".into()))
        );
        assert_eq!("cookie:sid".parse(), Ok(HashKey::Cookie("sid".into())));
        assert_eq!("client-ip".parse(), Ok(HashKey::ClientIp));
        assert_eq!("path".parse(), Ok(HashKey::Path));
        for bad in ["header:", "cookie", "ip", "header:a b", "", "cookie:a;b"] {
            assert!(bad.parse::<HashKey>().is_err(), "{bad}");
        }
        assert_eq!(
            "header:a b".parse::<HashKey>().unwrap_err().to_string(),
            "invalid hash key \"header:a b\": \"a b\" is not a valid header name"
        );
        assert_eq!(
            "ip".parse::<HashKey>(),
            Err(ParseHashKeyError::Unknown { key: "ip".into() })
        );
        assert_eq!(
            "ip".parse::<HashKey>().unwrap_err().to_string(),
            "invalid hash key \"ip\": expected \"header:NAME\", \"cookie:NAME\", \"client-ip\" or \"path\""
        );
    }
}
