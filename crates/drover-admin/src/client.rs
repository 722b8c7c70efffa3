//! The client side, for `drover ctl`.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HOST};
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;
use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::net::TcpStream;

/// An answer from the admin API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub status: u16,
    pub body: String,
}

impl Reply {
    /// The `error` field of a JSON error answer, or the raw body.
    pub fn error_message(&self) -> String {
        serde_json::from_str::<serde_json::Value>(&self.body)
            .ok()
            .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(str::to_string))
            .unwrap_or_else(|| self.body.trim().to_string())
    }
}

/// Why `request` got no answer. An answer with an error status is a `Reply`, not this.
#[derive(Debug)]
pub enum AdminClientError {
    /// Nothing accepted a connection at `addr` (drover is not running there, or a
    /// firewall is in the way).
    Unreachable { addr: SocketAddr, source: io::Error },
    /// The connection opened but HTTP failed: the handshake, or sending the request
    /// and reading the answer's head.
    Protocol {
        addr: SocketAddr,
        source: hyper::Error,
    },
    /// The request could not be built (a method or path that is not valid HTTP).
    BadRequest(hyper::http::Error),
    /// The answer's body could not be read to its end.
    ReadingAnswer {
        addr: SocketAddr,
        source: hyper::Error,
    },
    /// The whole exchange took longer than `limit`.
    Timeout { addr: SocketAddr, limit: Duration },
}

impl fmt::Display for AdminClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AdminClientError::Unreachable { addr, source } => {
                write!(f, "cannot reach drover's admin API at {addr}: {source}")
            }
            AdminClientError::Protocol { addr, source } => {
                write!(f, "admin API at {addr}: {source}")
            }
            AdminClientError::BadRequest(e) => write!(f, "bad request: {e}"),
            AdminClientError::ReadingAnswer { addr, source } => {
                write!(f, "admin API at {addr}: reading the answer: {source}")
            }
            AdminClientError::Timeout { addr, limit } => {
                write!(f, "admin API at {addr} did not answer within {limit:?}")
            }
        }
    }
}

impl std::error::Error for AdminClientError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            AdminClientError::Unreachable { source, .. } => Some(source),
            AdminClientError::Protocol { source, .. }
            | AdminClientError::ReadingAnswer { source, .. } => Some(source),
            AdminClientError::BadRequest(e) => Some(e),
            AdminClientError::Timeout { .. } => None,
        }
    }
}

/// Sends one request (with `body` as JSON, if any) to the admin API at `addr` and
/// reads the whole answer, within `limit` in all.
pub async fn request(
    addr: SocketAddr,
    token: Option<&str>,
    method: Method,
    path: &str,
    body: Option<String>,
    limit: Duration,
) -> Result<Reply, AdminClientError> {
    let exchange = async {
        let stream = TcpStream::connect(addr)
            .await
            .map_err(|source| AdminClientError::Unreachable { addr, source })?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|source| AdminClientError::Protocol { addr, source })?;
        tokio::spawn(conn);
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header(HOST, addr.to_string());
        if let Some(token) = token {
            req = req.header(AUTHORIZATION, format!("Bearer {token}"));
        }
        if body.is_some() {
            req = req.header(CONTENT_TYPE, "application/json");
        }
        let req = req
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(AdminClientError::BadRequest)?;
        let resp = sender
            .send_request(req)
            .await
            .map_err(|source| AdminClientError::Protocol { addr, source })?;
        let status = resp.status().as_u16();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|source| AdminClientError::ReadingAnswer { addr, source })?
            .to_bytes();
        Ok(Reply {
            status,
            body: String::from_utf8_lossy(&body).into_owned(),
        })
    };
    tokio::time::timeout(limit, exchange)
        .await
        .map_err(|_| AdminClientError::Timeout { addr, limit })?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn nothing_listening_is_unreachable() {
        // Bound then dropped: nothing listens there now.
        let addr = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let err = request(
            addr,
            None,
            Method::GET,
            "/v1/status",
            None,
            Duration::from_secs(5),
        )
        .await
        .unwrap_err();
        assert!(
            matches!(err, AdminClientError::Unreachable { .. }),
            "{err:?}"
        );
        assert!(std::error::Error::source(&err).is_some());
        assert!(
            err.to_string()
                .starts_with(&format!("cannot reach drover's admin API at {addr}: ")),
            "{err}"
        );
    }

    #[tokio::test]
    async fn a_silent_server_times_out() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let limit = Duration::from_millis(100);
        let err = request(addr, None, Method::GET, "/v1/status", None, limit)
            .await
            .unwrap_err();
        assert!(matches!(err, AdminClientError::Timeout { .. }), "{err:?}");
        assert_eq!(
            err.to_string(),
            format!("admin API at {addr} did not answer within 100ms")
        );
        drop(listener);
    }
}
