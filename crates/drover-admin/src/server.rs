//! The admin API's HTTP server (hyper, HTTP/1.1, one task per connection).

use crate::status::Status;
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, ALLOW, AUTHORIZATION, CONTENT_TYPE, WWW_AUTHENTICATE};
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// A client that has not sent its request head by then is cut off.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// What the API can see and do; the binary implements it over its supervisors and pools.
pub trait Control: Send + Sync + 'static {
    fn status(&self) -> Status;

    /// Rolling reload of every app, or of the one named; resolves when it is done, with
    /// a line saying what was reloaded.
    fn reload(
        &self,
        app: Option<String>,
    ) -> Pin<Box<dyn Future<Output = Result<String, ControlError>> + Send + '_>>;
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ControlError {
    /// The request names something that does not exist (404).
    NotFound(String),
    /// The action was tried and failed; what is running is said in the message (500).
    Failed(String),
}

/// A running admin listener; stops accepting when dropped.
#[derive(Debug)]
pub struct AdminServer {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl AdminServer {
    /// Listens on `addr` on the current tokio runtime. With `token`, every request must
    /// carry `Authorization: Bearer TOKEN`.
    pub async fn bind(
        addr: SocketAddr,
        token: Option<String>,
        control: Arc<dyn Control>,
    ) -> io::Result<AdminServer> {
        AdminServer::serve(TcpListener::bind(addr).await?, token, control)
    }

    /// Like `bind`, on a listener bound earlier (so a caller can fail on a taken port
    /// before it starts anything else).
    pub fn serve(
        listener: TcpListener,
        token: Option<String>,
        control: Arc<dyn Control>,
    ) -> io::Result<AdminServer> {
        let addr = listener.local_addr()?;
        let token: Arc<Option<String>> = Arc::new(token);
        let task = tokio::spawn(async move {
            loop {
                let (stream, peer) = match listener.accept().await {
                    Ok(s) => s,
                    Err(e) => {
                        // EMFILE and friends: back off instead of spinning.
                        tracing::warn!("admin API accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let (token, control) = (Arc::clone(&token), Arc::clone(&control));
                tokio::spawn(async move {
                    let service = service_fn(move |req| {
                        let (token, control) = (Arc::clone(&token), Arc::clone(&control));
                        async move {
                            Ok::<_, std::convert::Infallible>(
                                handle(req, token.as_deref(), control.as_ref()).await,
                            )
                        }
                    });
                    let conn = hyper::server::conn::http1::Builder::new()
                        .timer(TokioTimer::new())
                        .header_read_timeout(HEADER_TIMEOUT)
                        .serve_connection(TokioIo::new(stream), service);
                    if let Err(e) = conn.await {
                        tracing::debug!(%peer, "admin API connection ended: {e}");
                    }
                });
            }
        });
        Ok(AdminServer { addr, task })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for AdminServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn handle(
    req: Request<Incoming>,
    token: Option<&str>,
    control: &dyn Control,
) -> Response<Full<Bytes>> {
    if let Some(token) = token {
        let given = req
            .headers()
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if !given.is_some_and(|g| same_secret(g.as_bytes(), token.as_bytes())) {
            let mut resp = error(
                StatusCode::UNAUTHORIZED,
                "missing or wrong token: send Authorization: Bearer TOKEN",
            );
            resp.headers_mut()
                .insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            return resp;
        }
    }
    let query = match parse_query(req.uri().query()) {
        Ok(q) => q,
        Err(e) => return error(StatusCode::BAD_REQUEST, &e),
    };
    match req.uri().path() {
        "/v1/status" => {
            if req.method() != Method::GET {
                return not_allowed("GET");
            }
            if let Some((k, _)) = query.first() {
                return error(
                    StatusCode::BAD_REQUEST,
                    &format!("unknown query parameter {k:?}: /v1/status takes none"),
                );
            }
            json(StatusCode::OK, &control.status())
        }
        "/v1/reload" => {
            if req.method() != Method::POST {
                return not_allowed("POST");
            }
            let mut app = None;
            for (k, v) in query {
                match k.as_str() {
                    "app" if v.is_empty() => {
                        return error(StatusCode::BAD_REQUEST, "app must not be empty")
                    }
                    "app" if app.is_some() => {
                        return error(StatusCode::BAD_REQUEST, "app given more than once")
                    }
                    "app" => app = Some(v),
                    _ => {
                        return error(
                            StatusCode::BAD_REQUEST,
                            &format!("unknown query parameter {k:?}: /v1/reload takes app"),
                        )
                    }
                }
            }
            match control.reload(app).await {
                Ok(msg) => json(StatusCode::OK, &serde_json::json!({ "result": msg })),
                Err(ControlError::NotFound(msg)) => error(StatusCode::NOT_FOUND, &msg),
                Err(ControlError::Failed(msg)) => error(StatusCode::INTERNAL_SERVER_ERROR, &msg),
            }
        }
        other => error(
            StatusCode::NOT_FOUND,
            &format!("no such endpoint {other:?}: try GET /v1/status or POST /v1/reload"),
        ),
    }
}

/// `a=1&b=2` into pairs, percent-decoded. Hand-written: two keys do not justify a URL
/// crate, and anything odd is refused rather than guessed at.
fn parse_query(query: Option<&str>) -> Result<Vec<(String, String)>, String> {
    let Some(query) = query.filter(|q| !q.is_empty()) else {
        return Ok(Vec::new());
    };
    query
        .split('&')
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            Ok((percent_decode(k)?, percent_decode(v)?))
        })
        .collect()
}

fn percent_decode(s: &str) -> Result<String, String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = bytes
                    .get(i + 1..i + 3)
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or_else(|| format!("bad percent-escape in query {s:?}"))?;
                out.push(hex);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).map_err(|_| format!("query {s:?} is not UTF-8"))
}

/// Compares without stopping at the first difference, so response timing does not tell
/// an attacker how much of a guessed token was right.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn json<T: serde::Serialize>(status: StatusCode, value: &T) -> Response<Full<Bytes>> {
    let mut body = serde_json::to_vec(value).unwrap_or_else(|e| {
        format!("{{\"error\":\"cannot encode the answer: {e}\"}}").into_bytes()
    });
    body.push(b'\n');
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

fn error(status: StatusCode, msg: &str) -> Response<Full<Bytes>> {
    json(status, &serde_json::json!({ "error": msg }))
}

fn not_allowed(allow: &'static str) -> Response<Full<Bytes>> {
    let mut resp = error(
        StatusCode::METHOD_NOT_ALLOWED,
        &format!("method not allowed: use {allow}"),
    );
    resp.headers_mut()
        .insert(ALLOW, HeaderValue::from_static(allow));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_decode_and_bad_escapes_are_refused() {
        assert_eq!(
            parse_query(Some("app=my%2Dapp&x=a+b")).unwrap(),
            vec![
                ("app".to_string(), "my-app".to_string()),
                ("x".to_string(), "a b".to_string())
            ]
        );
        assert!(parse_query(Some("app=%zz"))
            .unwrap_err()
            .contains("percent"));
        assert!(parse_query(Some("app=%ff")).unwrap_err().contains("UTF-8"));
        assert!(parse_query(None).unwrap().is_empty());
    }

    #[test]
    fn secrets_compare_whole() {
        assert!(same_secret(b"abc", b"abc"));
        assert!(!same_secret(b"abc", b"abd"));
        assert!(!same_secret(b"abc", b"abcd"));
    }
}
