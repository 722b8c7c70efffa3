//! The counters drover keeps for each balancer and each endpoint, and what each label
//! value means. Recording is a few relaxed atomic adds on the calling thread's stripe.

use crate::histogram::{Histogram, HistogramSnapshot};
use crate::stripe::Striped;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Response status classes, as labels: `code="2xx"` (as HAProxy's exporter does; one
/// series per class, not per code, keeps the count of series bounded).
pub const CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];

/// Requests a worker answered by itself on connections drover handed it, as the worker
/// reported them (`drover run`'s handoff: drover sees none of them pass).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServedByWorker {
    /// Responses by status class, as `CLASSES`.
    pub by_class: [u64; 5],
    /// Durations, from the request head to the response's end: (nanoseconds, count).
    pub durations: Vec<(u64, u64)>,
}

/// The class index of a status code; codes outside 100–599 count as 5xx.
#[inline]
pub fn class_of(status: u16) -> usize {
    match status {
        100..=599 => usize::from(status / 100 - 1),
        _ => 4,
    }
}

/// Why drover answered a request itself, or tried it again: the `drover-error` header's
/// values, which are also the `cause` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    NoHealthyEndpoint,
    QueueFull,
    QueueTimeout,
    ConnectFailed,
    LocalResources,
    BackendClosed,
    /// A worker drover runs ended by an error of its own (a failing exit, a crash) with
    /// the request in it; the request is not tried again, as it may be what ended it.
    BackendCrashed,
    BadResponse,
    BackendTimeout,
    /// The backend's health checks got no answer while the request waited on it (it is
    /// hung): a request that may go twice goes to another endpoint (a retry), and fails
    /// with this when it has no retry left.
    BackendHung,
    /// The TLS handshake with a backend failed (`backend_tls`): its certificate did not
    /// verify, it asked for a client certificate, or it does not speak TLS.
    BackendTls,
    /// No endpoint is available, and every worker drover runs for the pool ended by
    /// itself before it was ready (an app that fails at boot): the request is answered
    /// at once instead of waiting the queue timeout for a worker that may never come.
    WorkersNotStarting,
}

impl Cause {
    /// How many causes there are: the length of every array indexed by cause.
    pub const COUNT: usize = 12;

    pub const ALL: [Cause; Cause::COUNT] = [
        Cause::NoHealthyEndpoint,
        Cause::QueueFull,
        Cause::QueueTimeout,
        Cause::ConnectFailed,
        Cause::LocalResources,
        Cause::BackendClosed,
        Cause::BackendCrashed,
        Cause::BadResponse,
        Cause::BackendTimeout,
        Cause::BackendHung,
        Cause::BackendTls,
        Cause::WorkersNotStarting,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Cause::NoHealthyEndpoint => "no-healthy-endpoint",
            Cause::QueueFull => "queue-full",
            Cause::QueueTimeout => "queue-timeout",
            Cause::ConnectFailed => "connect-failed",
            Cause::LocalResources => "local-resources",
            Cause::BackendClosed => "backend-closed",
            Cause::BackendCrashed => "backend-crashed",
            Cause::BadResponse => "bad-response",
            Cause::BackendTimeout => "backend-timeout",
            Cause::BackendHung => "backend-hung",
            Cause::BackendTls => "backend-tls",
            Cause::WorkersNotStarting => "workers-not-starting",
        }
    }
}

/// Why an endpoint was ejected (passive health).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ejection {
    /// Connections to it failed.
    ConnectFailures,
    /// It answered with errors (5xx) in a row.
    ErrorResponses,
    /// Requests to it failed after connecting (closed, timed out, bad responses).
    RequestFailures,
}

impl Ejection {
    pub const ALL: [Ejection; 3] = [
        Ejection::ConnectFailures,
        Ejection::ErrorResponses,
        Ejection::RequestFailures,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Ejection::ConnectFailures => "connect-failures",
            Ejection::ErrorResponses => "error-responses",
            Ejection::RequestFailures => "request-failures",
        }
    }
}

/// What every request to a balancer adds to.
#[derive(Debug, Default)]
struct BalancerCounters {
    requests: AtomicU64,
    responses: [AtomicU64; 5],
    errors: [AtomicU64; Cause::COUNT],
    retries: [AtomicU64; Cause::COUNT],
    handoffs: AtomicU64,
    returned: AtomicU64,
    queue_abandoned: AtomicU64,
    /// TCP mode: connections relayed to an endpoint, and the bytes each way.
    tcp_connections: AtomicU64,
    tcp_bytes_in: AtomicU64,
    tcp_bytes_out: AtomicU64,
    /// TCP mode: connections closed unserved, by `Cause`.
    tcp_unserved: [AtomicU64; Cause::COUNT],
}

/// One balancer's counts. Shared by its serving threads; kept across reloads.
#[derive(Debug, Default)]
pub struct BalancerStats {
    counters: Striped<BalancerCounters>,
    /// From the request head to the response's end (an upgrade: to its 101).
    request_duration: Histogram,
    /// From the request head until it was bound to an endpoint.
    queue_wait: Histogram,
    /// Connections closed before any request for their PROXY protocol header, by
    /// `ProxyRefusal` (rare: plain atomics).
    proxy_refused: [AtomicU64; 2],
    /// Access log lines dropped because the log's buffer was full (not striped: a
    /// drop is rare, and only happens when the log is on).
    access_log_dropped: AtomicU64,
    /// TCP mode with SNI routes: connections closed unrouted, by `SniUnrouted` (plain
    /// atomics: a routed connection never touches them).
    sni_unrouted: [AtomicU64; 6],
    /// TLS handshakes completed (once per connection: plain atomics).
    tls_handshakes: AtomicU64,
    /// TLS handshakes failed, by `TlsFailure`.
    tls_failures: [AtomicU64; TlsFailure::ALL.len()],
    /// TLS handshakes with backends failed, by `BackendTlsFailure` (plain atomics: a
    /// failure is rare).
    backend_tls_failures: [AtomicU64; BackendTlsFailure::ALL.len()],
    /// HTTP/2 client connections, and the streams (requests) they carried: HTTP/1.1's
    /// requests are the rest (plain atomics: HTTP/2's path only touches them).
    http2_connections: AtomicU64,
    http2_streams: AtomicU64,
    /// HTTP/2 connections opened to backends (`backend_protocol` h2c or h2).
    backend_http2_connections: AtomicU64,
    /// The certificates the listener serves now, with their notAfter (set at start and
    /// at each reload).
    tls_certificates: std::sync::Mutex<Vec<CertificateExpiry>>,
}

/// One certificate a listener serves: its file and its notAfter (Unix seconds).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CertificateExpiry {
    pub cert: String,
    pub not_after: i64,
}

impl CertificateExpiry {
    /// How long before its notAfter a certificate is warned of: in the log and by
    /// `drover check` (at start and each reload), and on the dashboard.
    pub const WARNING: std::time::Duration = std::time::Duration::from_secs(14 * 24 * 60 * 60);

    /// Whether it expires within `WARNING` of `now` (Unix seconds), or already has.
    pub fn due(&self, now: i64) -> bool {
        self.not_after <= now.saturating_add(Self::WARNING.as_secs() as i64)
    }
}

/// Why a TLS handshake on a listener failed. Few and fixed, so a metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsFailure {
    /// No complete handshake within the header read timeout (a client that connects
    /// and sends nothing, or too slowly).
    Timeout,
    /// The first bytes are no TLS record: plain HTTP sent to an HTTPS port.
    NotTls,
    /// The client ended it with an alert: it refused the certificate (unknown CA, bad
    /// name) or found no protocol or cipher it shares.
    ClientAlert,
    /// The client closed or reset the connection mid-handshake.
    Closed,
    /// drover ended it: the client's messages were invalid, or nothing they offer is
    /// served (versions, ciphers, ALPN).
    Protocol,
    /// The listener asks for a client certificate (`client_ca`) and the client sent
    /// none, or one its CAs did not sign (or expired).
    ClientCert,
}

impl TlsFailure {
    pub const ALL: [TlsFailure; 6] = [
        TlsFailure::Timeout,
        TlsFailure::NotTls,
        TlsFailure::ClientAlert,
        TlsFailure::Closed,
        TlsFailure::Protocol,
        TlsFailure::ClientCert,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            TlsFailure::Timeout => "timeout",
            TlsFailure::NotTls => "not-tls",
            TlsFailure::ClientAlert => "client-alert",
            TlsFailure::Closed => "closed",
            TlsFailure::Protocol => "protocol",
            TlsFailure::ClientCert => "client-cert",
        }
    }
}

/// Why a TLS handshake with a backend failed (`backend_tls`). Few and fixed, so a metric
/// label: `as_str` is the reason in metrics, logs and health reports, `Display` the
/// sentence a client's 502 carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendTlsFailure {
    /// Its certificate is signed by no CA trusted here (self-signed included).
    UnknownIssuer,
    /// Its certificate expired (or is not valid yet).
    Expired,
    /// Its certificate is for another name.
    WrongName,
    /// Its certificate did not verify for another reason (revoked, bad encoding...).
    BadCertificate,
    /// It asked for a client certificate and none is configured.
    ClientCertRequired,
    /// It refused the client certificate drover showed.
    ClientCertRefused,
    /// It answered with something that is not TLS (plain HTTP).
    NotTls,
    /// It closed the connection mid-handshake.
    Closed,
    /// The handshake did not finish within the connect timeout.
    Timeout,
    /// Any other handshake failure (no common protocol or cipher, an alert).
    Protocol,
    /// It agreed to no application protocol drover offered by ALPN: `h2`, for a
    /// balancer with `backend_protocol = "h2"`.
    NoAlpn,
}

impl BackendTlsFailure {
    pub const ALL: [BackendTlsFailure; 11] = [
        BackendTlsFailure::UnknownIssuer,
        BackendTlsFailure::Expired,
        BackendTlsFailure::WrongName,
        BackendTlsFailure::BadCertificate,
        BackendTlsFailure::ClientCertRequired,
        BackendTlsFailure::ClientCertRefused,
        BackendTlsFailure::NotTls,
        BackendTlsFailure::Closed,
        BackendTlsFailure::Timeout,
        BackendTlsFailure::Protocol,
        BackendTlsFailure::NoAlpn,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            BackendTlsFailure::UnknownIssuer => "unknown-issuer",
            BackendTlsFailure::Expired => "expired",
            BackendTlsFailure::WrongName => "wrong-name",
            BackendTlsFailure::BadCertificate => "bad-certificate",
            BackendTlsFailure::ClientCertRequired => "client-cert-required",
            BackendTlsFailure::ClientCertRefused => "client-cert-refused",
            BackendTlsFailure::NotTls => "not-tls",
            BackendTlsFailure::Closed => "closed",
            BackendTlsFailure::Timeout => "timeout",
            BackendTlsFailure::Protocol => "protocol",
            BackendTlsFailure::NoAlpn => "no-alpn",
        }
    }
}

impl std::fmt::Display for BackendTlsFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BackendTlsFailure::UnknownIssuer => "the backend's certificate is not signed by a trusted CA (self-signed, or another CA's)",
            BackendTlsFailure::Expired => "the backend's certificate has expired or is not valid yet",
            BackendTlsFailure::WrongName => "the backend's certificate is for another name",
            BackendTlsFailure::BadCertificate => "the backend's certificate is not valid (a self-signed one must say basicConstraints CA:FALSE, which `openssl req -x509` leaves out: a CA certificate is not a server's)",
            BackendTlsFailure::ClientCertRequired => "the backend requires a client certificate and none is configured",
            BackendTlsFailure::ClientCertRefused => "the backend refused drover's client certificate",
            BackendTlsFailure::NotTls => "the backend does not speak TLS",
            BackendTlsFailure::Closed => "the backend closed the connection during the TLS handshake",
            BackendTlsFailure::Timeout => "the TLS handshake with the backend did not finish within the connect timeout",
            BackendTlsFailure::Protocol => "the TLS handshake with the backend failed",
            BackendTlsFailure::NoAlpn => "the backend agreed to no protocol drover offered by ALPN (h2, for backend_protocol = \"h2\")",
        })
    }
}

/// Why a connection to a TCP listener with SNI routes was closed before any balancer
/// took it. Few and fixed, so a metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SniUnrouted {
    /// The ClientHello's name (or its lack of one) matches no route, and the listener's
    /// own balancer has no backends to take it.
    NoRoute,
    /// The first bytes are no TLS handshake record.
    NotTls,
    /// A TLS record, but no ClientHello that parses (or one rustls refuses: see
    /// `tls::client_hello`).
    BadHello,
    /// No whole ClientHello within the bytes drover reads before it places a connection.
    TooLarge,
    /// No whole ClientHello within the header read timeout.
    Timeout,
    /// The client closed or reset the connection before its ClientHello was whole.
    Closed,
}

impl SniUnrouted {
    pub const ALL: [SniUnrouted; 6] = [
        SniUnrouted::NoRoute,
        SniUnrouted::NotTls,
        SniUnrouted::BadHello,
        SniUnrouted::TooLarge,
        SniUnrouted::Timeout,
        SniUnrouted::Closed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            SniUnrouted::NoRoute => "no-route",
            SniUnrouted::NotTls => "not-tls",
            SniUnrouted::BadHello => "bad-hello",
            SniUnrouted::TooLarge => "too-large",
            SniUnrouted::Timeout => "timeout",
            SniUnrouted::Closed => "closed",
        }
    }
}

/// Why a connection to a listener that takes the PROXY protocol was closed unserved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyRefusal {
    /// It came from an address outside the trusted senders: a header from it could
    /// name any client.
    Untrusted,
    /// A trusted sender sent no valid header (in time).
    BadHeader,
}

impl ProxyRefusal {
    pub const ALL: [ProxyRefusal; 2] = [ProxyRefusal::Untrusted, ProxyRefusal::BadHeader];

    pub fn as_str(self) -> &'static str {
        match self {
            ProxyRefusal::Untrusted => "untrusted-sender",
            ProxyRefusal::BadHeader => "bad-header",
        }
    }
}

impl BalancerStats {
    /// A request that was answered by a backend (or ended mid-way by either side).
    #[inline]
    pub fn record_response(&self, status: u16, duration_ns: u64) {
        let c = self.counters.local();
        c.requests.fetch_add(1, Relaxed);
        c.responses[class_of(status)].fetch_add(1, Relaxed);
        self.request_duration.record(duration_ns);
    }

    /// Requests a worker answered on client connections drover handed it (`drover
    /// run`'s handoff), as it reported them: responses by status class, and durations
    /// as (nanoseconds, count).
    pub fn record_served_by_worker(&self, served: &ServedByWorker) {
        let c = self.counters.local();
        c.requests.fetch_add(served.by_class.iter().sum(), Relaxed);
        for (total, &n) in c.responses.iter().zip(&served.by_class) {
            total.fetch_add(n, Relaxed);
        }
        for &(ns, n) in &served.durations {
            self.request_duration.record_n(ns, n);
        }
    }

    /// A request drover answered itself with an error (`status` is its 502/503/504).
    pub fn record_error(&self, cause: Cause, status: u16, duration_ns: u64) {
        let c = self.counters.local();
        c.errors[cause as usize].fetch_add(1, Relaxed);
        self.record_response(status, duration_ns);
    }

    /// A request drover refused before it could be proxied (a bad head or body: 400,
    /// 408, 413, 431): counted, with no duration.
    pub fn record_refusal(&self, status: u16) {
        let c = self.counters.local();
        c.requests.fetch_add(1, Relaxed);
        c.responses[class_of(status)].fetch_add(1, Relaxed);
    }

    pub fn record_retry(&self, cause: Cause) {
        self.counters.local().retries[cause as usize].fetch_add(1, Relaxed);
    }

    /// A client connection handed to a worker that serves it directly (`drover run`):
    /// its requests are the worker's, and none of them is counted here.
    pub fn record_handoff(&self) {
        self.counters.local().handoffs.fetch_add(1, Relaxed);
    }

    /// A client connection a retiring worker gave back, served here from now on.
    pub fn record_returned(&self) {
        self.counters.local().returned.fetch_add(1, Relaxed);
    }

    /// A request whose client left while it waited in the queue: never sent to a
    /// backend, and not answered (nginx logs such a request as 499, HAProxy as `CQ`).
    pub fn record_queue_abandoned(&self) {
        self.counters.local().queue_abandoned.fetch_add(1, Relaxed);
    }

    /// A connection closed unserved for its PROXY protocol header (or its lack of one).
    pub fn record_proxy_refusal(&self, why: ProxyRefusal) {
        self.proxy_refused[why as usize].fetch_add(1, Relaxed);
    }

    /// An access log line dropped: the log's in-memory buffer was full (its writer
    /// fell behind), and the request path never waits for it.
    pub fn record_access_log_dropped(&self) {
        self.access_log_dropped.fetch_add(1, Relaxed);
    }

    /// How long a request waited before it was bound to an endpoint.
    #[inline]
    pub fn record_queue_wait(&self, ns: u64) {
        self.queue_wait.record(ns);
    }

    /// TCP mode: a client connection now relayed to an endpoint.
    pub fn record_tcp_connection(&self) {
        self.counters.local().tcp_connections.fetch_add(1, Relaxed);
    }

    /// TCP mode: bytes relayed from a client to its endpoint.
    #[inline]
    pub fn record_tcp_bytes_in(&self, n: u64) {
        self.counters.local().tcp_bytes_in.fetch_add(n, Relaxed);
    }

    /// TCP mode: bytes relayed from an endpoint to its client.
    #[inline]
    pub fn record_tcp_bytes_out(&self, n: u64) {
        self.counters.local().tcp_bytes_out.fetch_add(n, Relaxed);
    }

    /// TCP mode: a client connection closed before any endpoint took it, for `cause`
    /// (no endpoint, the queue, every connect failed).
    pub fn record_tcp_unserved(&self, cause: Cause) {
        self.counters.local().tcp_unserved[cause as usize].fetch_add(1, Relaxed);
    }

    /// TCP mode with SNI routes: a client connection closed before any balancer took it.
    pub fn record_sni_unrouted(&self, why: SniUnrouted) {
        self.sni_unrouted[why as usize].fetch_add(1, Relaxed);
    }

    /// A client connection's TLS handshake completed.
    pub fn record_tls_handshake(&self) {
        self.tls_handshakes.fetch_add(1, Relaxed);
    }

    /// A client connection began speaking HTTP/2.
    pub fn record_http2_connection(&self) {
        self.http2_connections.fetch_add(1, Relaxed);
    }

    /// An HTTP/2 connection to a backend was opened (its handshake sent).
    pub fn record_backend_http2_connection(&self) {
        self.backend_http2_connections.fetch_add(1, Relaxed);
    }

    /// An HTTP/2 stream (one request) was accepted.
    pub fn record_http2_stream(&self) {
        self.http2_streams.fetch_add(1, Relaxed);
    }

    /// A client connection closed for its failed TLS handshake.
    pub fn record_tls_failure(&self, why: TlsFailure) {
        self.tls_failures[why as usize].fetch_add(1, Relaxed);
    }

    /// A TLS handshake with a backend failed (`backend_tls`).
    pub fn record_backend_tls_failure(&self, why: BackendTlsFailure) {
        self.backend_tls_failures[why as usize].fetch_add(1, Relaxed);
    }

    /// The certificates served from now on (none: the listener is plain).
    pub fn set_tls_certificates(&self, certs: Vec<CertificateExpiry>) {
        *self
            .tls_certificates
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = certs;
    }

    pub fn snapshot(&self) -> BalancerCounts {
        let mut s = BalancerCounts::default();
        for c in self.counters.all() {
            s.requests += c.requests.load(Relaxed);
            add(&mut s.responses, &c.responses);
            add(&mut s.errors, &c.errors);
            add(&mut s.retries, &c.retries);
            s.handoffs += c.handoffs.load(Relaxed);
            s.returned += c.returned.load(Relaxed);
            s.queue_abandoned += c.queue_abandoned.load(Relaxed);
            s.tcp_connections += c.tcp_connections.load(Relaxed);
            s.tcp_bytes_in += c.tcp_bytes_in.load(Relaxed);
            s.tcp_bytes_out += c.tcp_bytes_out.load(Relaxed);
            add(&mut s.tcp_unserved, &c.tcp_unserved);
        }
        add(&mut s.proxy_refused, &self.proxy_refused);
        s.access_log_dropped = self.access_log_dropped.load(Relaxed);
        add(&mut s.sni_unrouted, &self.sni_unrouted);
        s.tls_handshakes = self.tls_handshakes.load(Relaxed);
        add(&mut s.tls_failures, &self.tls_failures);
        add(&mut s.backend_tls_failures, &self.backend_tls_failures);
        s.http2_connections = self.http2_connections.load(Relaxed);
        s.http2_streams = self.http2_streams.load(Relaxed);
        s.backend_http2_connections = self.backend_http2_connections.load(Relaxed);
        s.tls_certificates = self
            .tls_certificates
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        s.request_duration = self.request_duration.snapshot();
        s.queue_wait = self.queue_wait.snapshot();
        s
    }
}

/// What each request to an endpoint adds to.
#[derive(Debug, Default)]
struct EndpointCounters {
    responses: [AtomicU64; 5],
    failures: [AtomicU64; Cause::COUNT],
    /// Reads of what it sent on upgraded connections (WebSocket frames).
    tunnel_reads: AtomicU64,
}

/// One endpoint's counts. Lives with the endpoint, so it survives membership changes
/// and reloads as the endpoint's load state does.
#[derive(Debug, Default)]
pub struct EndpointStats {
    counters: Striped<EndpointCounters>,
    /// From binding to the endpoint to the response's end.
    request_duration: Histogram,
    /// From binding to the endpoint to its response head: the backend's time (with the
    /// connect, if a new connection was needed).
    response_head: Histogram,
    /// New connections only.
    connect: Histogram,
    /// How long the requests it served waited in drover's queue first.
    queue_wait: Histogram,
    // Rare events: plain atomics.
    ejections: [AtomicU64; 3],
    checks_passed: AtomicU64,
    checks_failed: AtomicU64,
}

impl EndpointStats {
    #[inline]
    pub fn record_queue_wait(&self, ns: u64) {
        self.queue_wait.record(ns);
    }

    #[inline]
    pub fn record_connect(&self, ns: u64) {
        self.connect.record(ns);
    }

    #[inline]
    pub fn record_response_head(&self, status: u16, ns: u64) {
        self.counters.local().responses[class_of(status)].fetch_add(1, Relaxed);
        self.response_head.record(ns);
    }

    #[inline]
    pub fn record_request_duration(&self, ns: u64) {
        self.request_duration.record(ns);
    }

    /// Requests it answered on client connections handed to it (see
    /// `BalancerStats::record_served_by_worker`): they count as its responses, so a
    /// worker busy with them shows progress to the liveness checks too.
    pub fn record_served_by_worker(&self, served: &ServedByWorker) {
        let c = self.counters.local();
        for (total, &n) in c.responses.iter().zip(&served.by_class) {
            total.fetch_add(n, Relaxed);
        }
        for &(ns, n) in &served.durations {
            self.request_duration.record_n(ns, n);
        }
    }

    /// Response heads it has sent so far, of every status: the cheapest sign that it
    /// is making progress (health checks read it to tell busy from hung).
    pub fn responses_total(&self) -> u64 {
        self.counters
            .all()
            .map(|c| c.responses.iter().map(|n| n.load(Relaxed)).sum::<u64>())
            .sum()
    }

    /// It sent bytes on an upgraded connection (a WebSocket's frames), counted once per
    /// read: its event loop turns. A socket.io worker's events are never requests
    /// drover sees answered, so without this a worker whose handler blocked its loop
    /// for seconds at a time, turning only between them, showed no sign of life.
    #[inline]
    pub fn record_tunnel_read(&self) {
        self.counters.local().tunnel_reads.fetch_add(1, Relaxed);
    }

    /// Response heads it has sent, and reads of what it sent on upgraded connections:
    /// the cheapest signs that it makes progress (health checks read them to tell busy
    /// from hung).
    pub fn signs_of_life(&self) -> u64 {
        self.responses_total()
            + self
                .counters
                .all()
                .map(|c| c.tunnel_reads.load(Relaxed))
                .sum::<u64>()
    }

    /// A request to it failed for `cause` (one of the backend's causes).
    pub fn record_failure(&self, cause: Cause) {
        self.counters.local().failures[cause as usize].fetch_add(1, Relaxed);
    }

    pub fn record_ejection(&self, why: Ejection) {
        self.ejections[why as usize].fetch_add(1, Relaxed);
    }

    pub fn record_check(&self, passed: bool) {
        if passed {
            self.checks_passed.fetch_add(1, Relaxed);
        } else {
            self.checks_failed.fetch_add(1, Relaxed);
        }
    }

    pub fn snapshot(&self) -> EndpointCounts {
        let mut s = EndpointCounts::default();
        for c in self.counters.all() {
            add(&mut s.responses, &c.responses);
            add(&mut s.failures, &c.failures);
        }
        add(&mut s.ejections, &self.ejections);
        s.checks_passed = self.checks_passed.load(Relaxed);
        s.checks_failed = self.checks_failed.load(Relaxed);
        s.request_duration = self.request_duration.snapshot();
        s.response_head = self.response_head.snapshot();
        s.connect = self.connect.snapshot();
        s.queue_wait = self.queue_wait.snapshot();
        s
    }
}

fn add<const N: usize>(into: &mut [u64; N], from: &[AtomicU64; N]) {
    for (total, count) in into.iter_mut().zip(from) {
        *total += count.load(Relaxed);
    }
}

/// A balancer's counts at one moment (arrays indexed as `CLASSES` and `Cause::ALL`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BalancerCounts {
    pub requests: u64,
    pub responses: [u64; 5],
    pub errors: [u64; Cause::COUNT],
    pub retries: [u64; Cause::COUNT],
    /// Client connections handed to a worker (`drover run`).
    #[serde(default)]
    pub handoffs: u64,
    /// Client connections a retiring worker gave back.
    #[serde(default)]
    pub returned: u64,
    /// Requests whose client left while they waited in the queue.
    #[serde(default)]
    pub queue_abandoned: u64,
    /// Connections closed for their PROXY protocol header, by `ProxyRefusal`.
    #[serde(default)]
    pub proxy_refused: [u64; 2],
    /// Access log lines dropped for a full buffer.
    #[serde(default)]
    pub access_log_dropped: u64,
    /// TCP mode: connections relayed to an endpoint.
    #[serde(default)]
    pub tcp_connections: u64,
    /// TCP mode: bytes from clients to endpoints.
    #[serde(default)]
    pub tcp_bytes_in: u64,
    /// TCP mode: bytes from endpoints to clients.
    #[serde(default)]
    pub tcp_bytes_out: u64,
    /// TCP mode: connections closed unserved, by `Cause::ALL`.
    #[serde(default)]
    pub tcp_unserved: [u64; Cause::COUNT],
    /// TCP mode with SNI routes: connections closed unrouted, by `SniUnrouted::ALL`.
    #[serde(default)]
    pub sni_unrouted: [u64; 6],
    /// TLS handshakes completed.
    #[serde(default)]
    pub tls_handshakes: u64,
    /// TLS handshakes failed, by `TlsFailure`.
    #[serde(default)]
    pub tls_failures: [u64; TlsFailure::ALL.len()],
    /// TLS handshakes with backends failed, by `BackendTlsFailure::ALL`.
    #[serde(default)]
    pub backend_tls_failures: [u64; BackendTlsFailure::ALL.len()],
    /// The certificates served now (empty on a plain listener).
    #[serde(default)]
    pub tls_certificates: Vec<CertificateExpiry>,
    /// HTTP/2 client connections.
    #[serde(default)]
    pub http2_connections: u64,
    /// HTTP/2 streams: requests that came over HTTP/2 (the rest of `requests` came
    /// over HTTP/1.x).
    #[serde(default)]
    pub http2_streams: u64,
    /// HTTP/2 connections opened to backends.
    #[serde(default)]
    pub backend_http2_connections: u64,
    pub request_duration: HistogramSnapshot,
    pub queue_wait: HistogramSnapshot,
}

/// An endpoint's counts at one moment (arrays indexed as `CLASSES`, `Cause::ALL` and
/// `Ejection::ALL`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EndpointCounts {
    pub responses: [u64; 5],
    pub failures: [u64; Cause::COUNT],
    pub ejections: [u64; 3],
    pub checks_passed: u64,
    pub checks_failed: u64,
    pub request_duration: HistogramSnapshot,
    pub response_head: HistogramSnapshot,
    pub connect: HistogramSnapshot,
    pub queue_wait: HistogramSnapshot,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_and_causes_index_their_labels() {
        assert_eq!(CLASSES[class_of(101)], "1xx");
        assert_eq!(CLASSES[class_of(204)], "2xx");
        assert_eq!(CLASSES[class_of(503)], "5xx");
        assert_eq!(CLASSES[class_of(42)], "5xx");
        for (i, c) in Cause::ALL.iter().enumerate() {
            assert_eq!(*c as usize, i);
        }
        for (i, e) in Ejection::ALL.iter().enumerate() {
            assert_eq!(*e as usize, i);
        }
    }

    #[test]
    fn a_balancer_counts_responses_errors_and_retries() {
        let b = BalancerStats::default();
        b.record_response(200, 1_000_000);
        b.record_response(404, 1_000_000);
        b.record_error(Cause::QueueFull, 503, 10_000);
        b.record_retry(Cause::ConnectFailed);
        let s = b.snapshot();
        assert_eq!(s.requests, 3);
        assert_eq!(s.responses, [0, 1, 0, 1, 1]);
        assert_eq!(s.errors[Cause::QueueFull as usize], 1);
        assert_eq!(s.retries[Cause::ConnectFailed as usize], 1);
        assert_eq!(s.request_duration.count(), 3);
    }
}
