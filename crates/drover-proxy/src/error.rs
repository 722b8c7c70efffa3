//! Why a request could not be proxied, and what the client is told.

use drover_metrics::Cause;
use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyError {
    /// No endpoint is healthy.
    NoEndpoint,
    /// Every endpoint is at its limit and the queue is full.
    QueueFull,
    /// Every endpoint stayed at its limit for the whole queue timeout.
    QueueTimeout,
    /// No endpoint accepted a connection.
    ConnectFailed,
    /// The endpoint refused the connection, or its host is unreachable: answered at
    /// once, and nothing of the request was sent. Told to clients as `ConnectFailed`.
    ConnectRefused,
    /// drover itself ran out of descriptors, memory or local ports connecting to a
    /// backend; no backend is to blame (see `drover_registry::local`).
    LocalResources,
    /// The backend closed or reset the connection before a complete response head.
    BackendClosed,
    /// A worker drover runs ended by an error of its own with the request in it (see
    /// `drover_balance::worker_life`): not sent again, as it may be what ended it.
    BackendCrashed,
    /// The backend's response could not be passed on safely.
    BadResponse(&'static str),
    /// The backend did not answer within the request timeout.
    Timeout,
    /// The backend's health checks got no answer while the request waited on it
    /// (`Endpoint::set_hung`), and the request could not go to another endpoint.
    BackendHung,
    /// The TLS handshake with the backend failed (`backend_tls`), and why.
    BackendTls(crate::backend_tls::Failure),
    /// No endpoint is available, and each worker drover runs for the pool ended by
    /// itself before it was ready, at its last start (`Pool::members_failing`).
    WorkersNotStarting,
}

impl ProxyError {
    pub fn status(self) -> u16 {
        match self {
            ProxyError::NoEndpoint
            | ProxyError::QueueFull
            | ProxyError::QueueTimeout
            | ProxyError::LocalResources
            | ProxyError::WorkersNotStarting => 503,
            ProxyError::ConnectFailed
            | ProxyError::ConnectRefused
            | ProxyError::BackendClosed
            | ProxyError::BackendCrashed
            | ProxyError::BadResponse(_)
            | ProxyError::BackendTls(_) => 502,
            ProxyError::Timeout | ProxyError::BackendHung => 504,
        }
    }

    /// Seconds a client is told to wait before trying again (`Retry-After`): drover's own
    /// 503s say the service is busy or briefly without a backend, not that it is gone.
    pub fn retry_after(self) -> Option<u32> {
        (self.status() == 503).then_some(1)
    }

    /// The same cause, as metrics count it (`drover_errors_total{cause}`).
    pub fn metric_cause(self) -> Cause {
        match self {
            ProxyError::NoEndpoint => Cause::NoHealthyEndpoint,
            ProxyError::QueueFull => Cause::QueueFull,
            ProxyError::QueueTimeout => Cause::QueueTimeout,
            ProxyError::ConnectFailed | ProxyError::ConnectRefused => Cause::ConnectFailed,
            ProxyError::LocalResources => Cause::LocalResources,
            ProxyError::BackendClosed => Cause::BackendClosed,
            ProxyError::BackendCrashed => Cause::BackendCrashed,
            ProxyError::BadResponse(_) => Cause::BadResponse,
            ProxyError::Timeout => Cause::BackendTimeout,
            ProxyError::BackendHung => Cause::BackendHung,
            ProxyError::BackendTls(_) => Cause::BackendTls,
            ProxyError::WorkersNotStarting => Cause::WorkersNotStarting,
        }
    }

    /// The `drover-error` header value: a stable token for scripts and dashboards.
    pub fn cause(self) -> &'static str {
        match self {
            ProxyError::NoEndpoint => "no-healthy-endpoint",
            ProxyError::QueueFull => "queue-full",
            ProxyError::QueueTimeout => "queue-timeout",
            ProxyError::ConnectFailed | ProxyError::ConnectRefused => "connect-failed",
            ProxyError::LocalResources => "local-resources",
            ProxyError::BackendClosed => "backend-closed",
            ProxyError::BackendCrashed => "backend-crashed",
            ProxyError::BadResponse(_) => "bad-response",
            ProxyError::Timeout => "backend-timeout",
            ProxyError::BackendHung => "backend-hung",
            ProxyError::BackendTls(_) => "backend-tls",
            ProxyError::WorkersNotStarting => "workers-not-starting",
        }
    }
}

impl fmt::Display for ProxyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProxyError::NoEndpoint => f.write_str("no healthy endpoint"),
            ProxyError::QueueFull => f.write_str("every endpoint is busy and the queue is full"),
            ProxyError::QueueTimeout => {
                f.write_str("every endpoint stayed busy for the whole queue timeout")
            }
            ProxyError::ConnectFailed | ProxyError::ConnectRefused => {
                f.write_str("could not connect to any endpoint")
            }
            ProxyError::LocalResources => f.write_str(
                "drover is out of file descriptors, memory or local ports; no backend is at fault",
            ),
            ProxyError::BackendClosed => {
                f.write_str("the backend closed the connection before responding")
            }
            ProxyError::BackendCrashed => f.write_str(
                "the worker failed (it exited with an error or crashed) while serving the \
                 request; it is not sent to another, as it may be what ended the worker",
            ),
            ProxyError::BadResponse(why) => write!(f, "invalid response from the backend: {why}"),
            ProxyError::Timeout => f.write_str(
                "the backend did not respond within the request timeout (--request-timeout, \
                 or timeouts = { request = \"...\" } in drover.toml; \"off\" waits as long as \
                 the client stays, as drover run does)",
            ),
            ProxyError::BackendHung => f.write_str(
                "the backend stopped answering (its health checks get no answer) \
                 while the request waited on it",
            ),
            ProxyError::BackendTls(why) => {
                write!(f, "TLS to the backend failed: {why} ({})", why.as_str())
            }
            ProxyError::WorkersNotStarting => f.write_str(
                "the app's workers exit before they are ready (drover's output says why); \
                 drover keeps starting them, and serves as soon as one is",
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_error_is_counted_under_its_header_cause() {
        for e in [
            ProxyError::NoEndpoint,
            ProxyError::QueueFull,
            ProxyError::QueueTimeout,
            ProxyError::ConnectFailed,
            ProxyError::ConnectRefused,
            ProxyError::LocalResources,
            ProxyError::BackendClosed,
            ProxyError::BackendCrashed,
            ProxyError::BadResponse("x"),
            ProxyError::Timeout,
            ProxyError::BackendHung,
            ProxyError::BackendTls(crate::backend_tls::Failure::UnknownIssuer),
            ProxyError::WorkersNotStarting,
        ] {
            assert_eq!(e.metric_cause().as_str(), e.cause());
        }
    }
}
