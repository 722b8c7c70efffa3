//! The admin API's HTTP server (hyper, HTTP/1.1, one task per connection).

use crate::control::{Control, ControlError};
use crate::dashboard::{self, sampler::Sampler, AdminBody};
use crate::members::{self, Refusal};
use bytes::Bytes;
use drover_metrics::Format;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, ACCEPT, ALLOW, AUTHORIZATION, CONTENT_TYPE, WWW_AUTHENTICATE};
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// A client that has not sent its request head by then is cut off.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Request bodies are small JSON documents; a larger one is refused (413) unread.
const BODY_LIMIT: usize = 64 * 1024;
/// And must arrive within this long.
const BODY_TIMEOUT: Duration = Duration::from_secs(10);

/// A running admin listener; stops accepting when dropped.
#[derive(Debug)]
pub struct AdminServer {
    addr: SocketAddr,
    task: JoinHandle<()>,
    /// The dashboard's sampler, one per server, started with it.
    sampler: JoinHandle<()>,
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
    /// before it starts anything else). Refuses (`InvalidInput`, with the
    /// `drover_config::ExposureError`) a listener off loopback without a token: callers
    /// check the rule earlier to name their flag or key, this makes sure no path skips it.
    pub fn serve(
        listener: TcpListener,
        token: Option<String>,
        control: Arc<dyn Control>,
    ) -> io::Result<AdminServer> {
        let addr = listener.local_addr()?;
        drover_config::check_exposure(addr, token.as_deref())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let token: Arc<Option<String>> = Arc::new(token);
        let sampler = Arc::new(Sampler::default());
        let sampler_task = sampler.spawn(Arc::clone(&control));
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
                let (token, control, sampler) = (
                    Arc::clone(&token),
                    Arc::clone(&control),
                    Arc::clone(&sampler),
                );
                tokio::spawn(async move {
                    let service = service_fn(move |req| {
                        let (token, control, sampler) = (
                            Arc::clone(&token),
                            Arc::clone(&control),
                            Arc::clone(&sampler),
                        );
                        async move {
                            Ok::<_, std::convert::Infallible>(
                                route(req, token.as_deref(), control.as_ref(), &sampler).await,
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
        Ok(AdminServer {
            addr,
            task,
            sampler: sampler_task,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for AdminServer {
    fn drop(&mut self) {
        self.task.abort();
        self.sampler.abort();
    }
}

/// The dashboard's page and assets (no data in them: no token needed), then the token
/// rule for everything else: the event stream and `handle`'s API.
async fn route(
    req: Request<Incoming>,
    token: Option<&str>,
    control: &dyn Control,
    sampler: &Arc<Sampler>,
) -> Response<AdminBody> {
    if let Some(resp) = dashboard::asset(&req) {
        return resp;
    }
    if let Some(resp) = probe(&req, control) {
        return resp.map(BodyExt::boxed);
    }
    if let Some(resp) = unauthorized(&req, token) {
        return resp.map(BodyExt::boxed);
    }
    if req.uri().path() == "/v1/events" {
        if req.method() != Method::GET {
            return not_allowed("GET").map(BodyExt::boxed);
        }
        if req.uri().query().is_some_and(|q| !q.is_empty()) {
            return error(
                StatusCode::BAD_REQUEST,
                "/v1/events takes no query parameters",
            )
            .map(BodyExt::boxed);
        }
        return dashboard::events(sampler);
    }
    handle(req, control, sampler).await.map(BodyExt::boxed)
}

/// `GET /readyz` and `GET /livez` (see `probes`), in plain text, as probes read them;
/// `None` for any other path.
fn probe(req: &Request<Incoming>, control: &dyn Control) -> Option<Response<Full<Bytes>>> {
    let path = req.uri().path();
    if path != "/readyz" && path != "/livez" {
        return None;
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return Some(not_allowed("GET"));
    }
    let (status, text) = match path {
        "/livez" => match control.liveness() {
            Ok(()) => (StatusCode::OK, "ok\n".to_string()),
            Err(why) => (
                StatusCode::SERVICE_UNAVAILABLE,
                format!("not live: {why}\n"),
            ),
        },
        _ => match control.readiness() {
            Ok(()) => (StatusCode::OK, "ready\n".to_string()),
            Err(why) => (
                StatusCode::SERVICE_UNAVAILABLE,
                format!("not ready: {why}\n"),
            ),
        },
    };
    let mut resp = Response::new(Full::new(Bytes::from(text)));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    Some(resp)
}

/// With a token set, the request must carry `Authorization: Bearer TOKEN`: the 401 to
/// answer when it does not.
fn unauthorized(req: &Request<Incoming>, token: Option<&str>) -> Option<Response<Full<Bytes>>> {
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
            return Some(resp);
        }
    }
    None
}

async fn handle(
    req: Request<Incoming>,
    control: &dyn Control,
    sampler: &Sampler,
) -> Response<Full<Bytes>> {
    let query = match parse_query(req.uri().query()) {
        Ok(q) => q,
        Err(e) => return error(StatusCode::BAD_REQUEST, &e.to_string()),
    };
    if let Some(rest) = req.uri().path().strip_prefix("/v1/balancers/") {
        let rest = rest.to_string();
        if let Some((k, _)) = query.first() {
            return error(
                StatusCode::BAD_REQUEST,
                &format!("unknown query parameter {k:?}: the members API takes none"),
            );
        }
        return member_route(req, &rest, control).await;
    }
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
        "/metrics" => {
            if req.method() != Method::GET {
                return not_allowed("GET");
            }
            if let Some((k, _)) = query.first() {
                return error(
                    StatusCode::BAD_REQUEST,
                    &format!("unknown query parameter {k:?}: /metrics takes none"),
                );
            }
            let format = Format::from_accept(req.headers().get(ACCEPT).and_then(|v| v.to_str().ok()));
            let text = crate::metrics::render(format, &control.metrics(), &control.status());
            let mut resp = Response::new(Full::new(Bytes::from(text)));
            resp.headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static(format.content_type()));
            resp
        }
        "/v1/reload" => {
            if req.method() != Method::POST {
                return not_allowed("POST");
            }
            let mut params = match Params::take(query, "/v1/reload", &["app"]) {
                Ok(p) => p,
                Err(e) => return error(StatusCode::BAD_REQUEST, &e.to_string()),
            };
            let app = params.remove("app");
            let result = control.reload(app.clone()).await;
            note(sampler, "reload", app, &result);
            answer(result)
        }
        "/v1/scale" => {
            if req.method() != Method::POST {
                return not_allowed("POST");
            }
            let mut params = match Params::take(query, "/v1/scale", &["app", "workers"]) {
                Ok(p) => p,
                Err(e) => return error(StatusCode::BAD_REQUEST, &e.to_string()),
            };
            let workers = match params.remove("workers") {
                None => {
                    return error(
                        StatusCode::BAD_REQUEST,
                        "workers is missing: /v1/scale?workers=N",
                    )
                }
                Some(w) => match w.parse::<usize>() {
                    Ok(n) if w.bytes().all(|b| b.is_ascii_digit()) => n,
                    _ => {
                        return error(
                            StatusCode::BAD_REQUEST,
                            &format!("workers must be a whole number, not {w:?}"),
                        )
                    }
                },
            };
            let app = params.remove("app");
            let result = control.scale(app.clone(), workers).await;
            note(sampler, "scale", app, &result);
            answer(result)
        }
        other => error(
            StatusCode::NOT_FOUND,
            &format!(
                "no such endpoint {other:?}: try GET /v1/status, GET /v1/events, GET /metrics, POST /v1/reload, POST /v1/scale or /v1/balancers/NAME/members"
            ),
        ),
    }
}

/// `/v1/balancers/{balancer}/members[/{id}[/heartbeat]]`, `rest` being the path after
/// `/v1/balancers/`.
async fn member_route(
    req: Request<Incoming>,
    rest: &str,
    control: &dyn Control,
) -> Response<Full<Bytes>> {
    // A path keeps '+' literal (only a query turns it into a space).
    let segments: Vec<String> = match rest
        .split('/')
        .map(|s| percent_decode(&s.replace('+', "%2B")))
        .collect()
    {
        Ok(s) => s,
        Err(e) => return error(StatusCode::BAD_REQUEST, &e.to_string()),
    };
    let (balancer, id, heartbeat) = match segments.as_slice() {
        [b, m] if m == "members" => (b, None, false),
        [b, m, id] if m == "members" => (b, Some(id), false),
        [b, m, id, h] if m == "members" && h == "heartbeat" => (b, Some(id), true),
        _ => {
            return error(
                StatusCode::NOT_FOUND,
                "no such endpoint: use /v1/balancers/NAME/members, .../members/ID or .../members/ID/heartbeat",
            )
        }
    };
    let members = match control.members(balancer) {
        Ok(m) => m,
        Err(e) => return answer(Err(e)),
    };
    let method = req.method().clone();
    let result = match (id, heartbeat) {
        (None, _) => {
            if method != Method::GET {
                return not_allowed("GET");
            }
            return json(StatusCode::OK, &members::list(balancer, &members));
        }
        (Some(id), false) => match method {
            Method::PUT => match read_body(req).await {
                Ok(body) => members::register(&members, id, &body).await,
                Err(resp) => return resp,
            },
            Method::DELETE => members::drain(&members, id).await.map(|r| (false, r)),
            _ => return not_allowed("PUT, DELETE"),
        },
        (Some(id), true) => {
            if method != Method::PUT {
                return not_allowed("PUT");
            }
            match read_body(req).await {
                Ok(body) => members::heartbeat(&members, id, &body)
                    .await
                    .map(|r| (false, r)),
                Err(resp) => return resp,
            }
        }
    };
    match result {
        Ok((created, row)) => json(
            if created {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            },
            &row,
        ),
        Err(Refusal { status, message }) => error(
            StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            &message,
        ),
    }
}

/// A request body of at most `BODY_LIMIT` bytes, sent within `BODY_TIMEOUT`.
async fn read_body(req: Request<Incoming>) -> Result<Bytes, Response<Full<Bytes>>> {
    let too_large = || {
        error(
            StatusCode::PAYLOAD_TOO_LARGE,
            &format!("body larger than {BODY_LIMIT} bytes"),
        )
    };
    let declared = req
        .headers()
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > BODY_LIMIT as u64) {
        return Err(too_large());
    }
    let body = Limited::new(req.into_body(), BODY_LIMIT);
    match tokio::time::timeout(BODY_TIMEOUT, body.collect()).await {
        Err(_) => Err(error(
            StatusCode::REQUEST_TIMEOUT,
            &format!("body not sent within {BODY_TIMEOUT:?}"),
        )),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => Err(too_large()),
        Ok(Err(e)) => Err(error(
            StatusCode::BAD_REQUEST,
            &format!("cannot read the body: {e}"),
        )),
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
    }
}

/// Tells the dashboard what a reload or scale it was asked for did.
fn note(
    sampler: &Sampler,
    kind: &'static str,
    app: Option<String>,
    result: &Result<String, ControlError>,
) {
    let text = match result {
        Ok(msg) => msg.clone(),
        Err(e) => format!("failed: {e}"),
    };
    sampler.note(kind, app, text);
}

fn answer(result: Result<String, ControlError>) -> Response<Full<Bytes>> {
    match result {
        Ok(msg) => json(StatusCode::OK, &serde_json::json!({ "result": msg })),
        Err(ControlError::NotFound(msg)) => error(StatusCode::NOT_FOUND, &msg),
        Err(ControlError::Invalid(msg)) => error(StatusCode::BAD_REQUEST, &msg),
        Err(ControlError::Failed(msg)) => error(StatusCode::INTERNAL_SERVER_ERROR, &msg),
    }
}

/// A request's query parameters, each known to its endpoint, given once and not empty.
struct Params(Vec<(String, String)>);

impl Params {
    fn take(
        query: Vec<(String, String)>,
        path: &'static str,
        known: &'static [&'static str],
    ) -> Result<Params, QueryError> {
        let mut seen: Vec<(String, String)> = Vec::new();
        for (k, v) in query {
            if !known.contains(&k.as_str()) {
                return Err(QueryError::Unknown {
                    key: k,
                    path,
                    known,
                });
            }
            if v.is_empty() {
                return Err(QueryError::Empty { key: k });
            }
            if seen.iter().any(|(s, _)| *s == k) {
                return Err(QueryError::Repeated { key: k });
            }
            seen.push((k, v));
        }
        Ok(Params(seen))
    }

    fn remove(&mut self, key: &str) -> Option<String> {
        let at = self.0.iter().position(|(k, _)| k == key)?;
        Some(self.0.swap_remove(at).1)
    }
}

/// Why a request's query (or a path segment, for `percent_decode`) is refused (400).
#[derive(Debug, Clone, PartialEq, Eq)]
enum QueryError {
    /// A parameter the endpoint `path` does not take.
    Unknown {
        key: String,
        path: &'static str,
        known: &'static [&'static str],
    },
    /// `key=` with no value.
    Empty { key: String },
    /// The same parameter twice.
    Repeated { key: String },
    /// A '%' not followed by two hex digits.
    BadEscape { text: String },
    /// Decodes to bytes that are not UTF-8.
    NotUtf8 { text: String },
}

impl std::fmt::Display for QueryError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            QueryError::Unknown { key, path, known } => write!(
                f,
                "unknown query parameter {key:?}: {path} takes {}",
                known.join(", ")
            ),
            QueryError::Empty { key } => write!(f, "{key} must not be empty"),
            QueryError::Repeated { key } => write!(f, "{key} given more than once"),
            QueryError::BadEscape { text } => write!(f, "bad percent-escape in query {text:?}"),
            QueryError::NotUtf8 { text } => write!(f, "query {text:?} is not UTF-8"),
        }
    }
}

impl std::error::Error for QueryError {}

/// `a=1&b=2` into pairs, percent-decoded. Hand-written: two keys do not justify a URL
/// crate, and anything odd is refused rather than guessed at.
fn parse_query(query: Option<&str>) -> Result<Vec<(String, String)>, QueryError> {
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

fn percent_decode(s: &str) -> Result<String, QueryError> {
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
                    .ok_or_else(|| QueryError::BadEscape {
                        text: s.to_string(),
                    })?;
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
    String::from_utf8(out).map_err(|_| QueryError::NotUtf8 {
        text: s.to_string(),
    })
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
        assert_eq!(
            parse_query(Some("app=%zz")),
            Err(QueryError::BadEscape { text: "%zz".into() })
        );
        assert_eq!(
            parse_query(Some("app=%zz")).unwrap_err().to_string(),
            "bad percent-escape in query \"%zz\""
        );
        assert_eq!(
            parse_query(Some("app=%ff")).unwrap_err().to_string(),
            "query \"%ff\" is not UTF-8"
        );
        assert!(parse_query(None).unwrap().is_empty());
    }

    #[test]
    fn params_are_known_single_and_not_empty() {
        let q = |s| parse_query(Some(s)).unwrap();
        let take = |s| Params::take(q(s), "/v1/scale", &["app", "workers"]).map(|_| ());
        assert!(take("app=a&workers=2").is_ok());
        assert_eq!(
            take("x=1").unwrap_err().to_string(),
            "unknown query parameter \"x\": /v1/scale takes app, workers"
        );
        assert_eq!(
            take("app=").unwrap_err().to_string(),
            "app must not be empty"
        );
        assert_eq!(
            take("app=a&app=b"),
            Err(QueryError::Repeated { key: "app".into() })
        );
        assert_eq!(
            take("app=a&app=b").unwrap_err().to_string(),
            "app given more than once"
        );
    }

    #[test]
    fn secrets_compare_whole() {
        assert!(same_secret(b"abc", b"abc"));
        assert!(!same_secret(b"abc", b"abd"));
        assert!(!same_secret(b"abc", b"abcd"));
    }
}
