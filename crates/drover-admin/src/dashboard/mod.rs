//! The live dashboard: `GET /` (a page built into the binary, with its script, style
//! and uPlot under `/ui/`) and `GET /v1/events`, a server-sent-events stream of the
//! one sampler's history and samples (`sampler`).
//!
//! The page and its assets carry no data, so they are served without the token; the
//! stream carries data and keeps the token rule. EventSource cannot send an
//! `Authorization` header, so the page reads the stream with `fetch()` and a
//! ReadableStream reader and parses the frames itself: the token never goes into a URL
//! (where logs and history would keep it).

pub mod sampler;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Frame};
use hyper::header::{HeaderValue, CACHE_CONTROL, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use sampler::Sampler;
use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::{broadcast, mpsc};

/// What the admin server answers with: a whole body or a stream.
pub type AdminBody = BoxBody<Bytes, Infallible>;

const PAGE: &str = include_str!("../../assets/dashboard.html");
const APP_JS: &str = include_str!("../../assets/dashboard.js");
const APP_CSS: &str = include_str!("../../assets/dashboard.css");

/// Frames queued for one subscriber beyond the shared backlog.
const QUEUED: usize = 4;
/// A subscriber that takes no frame for this long is dropped.
const STALLED: Duration = Duration::from_secs(30);

/// The static files: path, content type, body.
const ASSETS: [(&str, &str, &str); 6] = [
    ("/", "text/html; charset=utf-8", PAGE),
    ("/ui/app.js", "text/javascript; charset=utf-8", APP_JS),
    ("/ui/app.css", "text/css; charset=utf-8", APP_CSS),
    (
        "/ui/uplot.js",
        "text/javascript; charset=utf-8",
        drover_ui::UPLOT_JS,
    ),
    (
        "/ui/uplot.css",
        "text/css; charset=utf-8",
        drover_ui::UPLOT_CSS,
    ),
    (
        "/ui/uplot-LICENSE",
        "text/plain; charset=utf-8",
        drover_ui::UPLOT_LICENSE,
    ),
];

/// The page's total size: the HTML, its script and style, and uPlot.
pub fn page_bytes() -> usize {
    ASSETS.iter().map(|(_, _, body)| body.len()).sum()
}

/// A static asset's answer, when `req` asks for one (no token needed: no data in it).
pub fn asset(req: &Request<hyper::body::Incoming>) -> Option<Response<AdminBody>> {
    let (_, content_type, body) = ASSETS.iter().find(|(p, _, _)| *p == req.uri().path())?;
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return None;
    }
    let mut resp = Response::new(full(Bytes::from_static(body.as_bytes())));
    let h = resp.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    // The page may load nothing and talk to nothing but this listener.
    h.insert(
        "content-security-policy",
        HeaderValue::from_static(
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; form-action 'none'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    h.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    h.insert("referrer-policy", HeaderValue::from_static("no-referrer"));
    Some(resp)
}

pub fn full(bytes: Bytes) -> AdminBody {
    Full::new(bytes).boxed()
}

/// `GET /v1/events` (the token already checked): the history, the newest sample, then
/// every sample and event as it comes.
pub fn events(sampler: &Arc<Sampler>) -> Response<AdminBody> {
    let (first, mut frames) = sampler.subscribe();
    let (tx, rx) = mpsc::channel(QUEUED);
    tokio::spawn(async move {
        loop {
            let frame = match frames.recv().await {
                Ok(f) => f,
                // It fell behind: it skips ahead, and is told so.
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    Bytes::from(format!(": skipped {n} frames\n\n"))
                }
                Err(broadcast::error::RecvError::Closed) => break,
            };
            match tokio::time::timeout(STALLED, tx.send(frame)).await {
                Ok(Ok(())) => {}
                // Gone, or not reading: either way it is let go.
                Ok(Err(_)) | Err(_) => break,
            }
        }
    });
    let mut resp = Response::new(
        SseBody {
            first: first.into(),
            rx,
        }
        .boxed(),
    );
    *resp.status_mut() = StatusCode::OK;
    let h = resp.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

/// A stream body: the frames queued at subscription, then what the forwarding task
/// passes on; it ends when that task lets go.
struct SseBody {
    first: VecDeque<Bytes>,
    rx: mpsc::Receiver<Bytes>,
}

impl Body for SseBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if let Some(b) = self.first.pop_front() {
            return Poll::Ready(Some(Ok(Frame::data(b))));
        }
        self.rx.poll_recv(cx).map(|f| f.map(|b| Ok(Frame::data(b))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_asks_nothing_of_other_hosts() {
        for (path, _, body) in ASSETS {
            let body = if path.starts_with("/ui/uplot") {
                // uPlot's licence banner names its project page; nothing else may.
                body.split_once('\n').map_or(body, |(_, rest)| rest)
            } else {
                body
            };
            if path != "/ui/uplot-LICENSE" {
                assert!(
                    !body.contains("http://") && !body.contains("https://"),
                    "{path} names another host"
                );
            }
        }
        assert!(PAGE.contains("/ui/app.js") && PAGE.contains("/ui/uplot.js"));
    }
}
