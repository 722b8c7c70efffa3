//! The client side, for `drover ctl`.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HOST};
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;
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

/// Sends one request (with `body` as JSON, if any) to the admin API at `addr` and
/// reads the whole answer, within `limit` in all.
pub async fn request(
    addr: SocketAddr,
    token: Option<&str>,
    method: Method,
    path: &str,
    body: Option<String>,
    limit: Duration,
) -> Result<Reply, String> {
    let exchange = async {
        let stream = TcpStream::connect(addr)
            .await
            .map_err(|e| format!("cannot reach drover's admin API at {addr}: {e}"))?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| format!("admin API at {addr}: {e}"))?;
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
            .map_err(|e| format!("bad request: {e}"))?;
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| format!("admin API at {addr}: {e}"))?;
        let status = resp.status().as_u16();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("admin API at {addr}: reading the answer: {e}"))?
            .to_bytes();
        Ok(Reply {
            status,
            body: String::from_utf8_lossy(&body).into_owned(),
        })
    };
    tokio::time::timeout(limit, exchange)
        .await
        .map_err(|_| format!("admin API at {addr} did not answer within {limit:?}"))?
}
