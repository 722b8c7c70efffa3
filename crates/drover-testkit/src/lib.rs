//! Test-only support for drover's integration tests: real sockets on
//! 127.0.0.1:0, HTTP/1.1 written by hand (no hyper) so tests see the exact
//! bytes drover forwards.
//!
//! [`Backend`] routes by request path:
//!
//! | path | behaviour |
//! |---|---|
//! | `/` and anything unknown | 200, body = backend name |
//! | `/status/NNN` | status NNN (200..=999), body `status NNN\n` |
//! | `/delay/MS` | sleeps MS ms, then 200 with the name |
//! | `/stall-once/MS` | 200 with the name; the first one pauses the whole backend: no response on any connection leaves for MS ms (a GC pause), once per backend |
//! | `/echo` | 200 echoing the body; chunked (same chunks, trailers echoed) if the request was chunked |
//! | `/headers` | 200, body = the raw request head as received |
//! | `/load/X` | 200 with `endpoint-load-metrics: TEXT cpu_utilization=X, named_metrics.elu=X` |
//! | `/close` | reads the request, closes without answering |
//! | `/hang` | reads the request, never answers (until the peer closes or `stop()`) |
//! | `/health` | 200 `ok`; 503 after `set_health(false)`; no answer after `set_hang_health(true)` |
//! | `/big/N` | 200, N bytes ([`big_body`]) sent chunked in 16 KiB chunks |
//! | `/ws` | WebSocket echo (text, binary, ping → pong, close echoed) |
//!
//! Every response carries `x-backend: NAME`. `Expect: 100-continue` is
//! honoured, `Connection: close` and HTTP/1.0 close the connection.

mod backend;
mod client;
mod harness;
mod http;
pub mod netns;
mod ws;

pub use backend::{addrs, backends, big_body, raw_backend, Backend, BackendBuilder};
pub use client::{
    answered_by, parse_status, post_trickle, raw_exchange, raw_exchange_timeout, read_head,
    ws_connect, HttpClient, Response, WsClient, WsMessage,
};
pub use harness::{
    addr_after, addrs_after, free_port, spawn_backend_process, spawn_backend_process_on,
    spawn_ready_line, spawn_ready_line_within, testkit_backend_bin, wait_until, wait_until_async,
    ChildProcess, DroverProcess,
};
pub use http::{chunked_body, HeaderList, RequestHead};
pub use ws::accept_key as ws_accept_key;
pub use ws::encode_frame as ws_encode_frame;

/// The Python worker used by the supervisor and `drover run` tests (see the comment at
/// the top of `fixtures/py_worker.py` for what it answers and which variables it reads).
pub const PY_WORKER: &str = include_str!("../fixtures/py_worker.py");

/// Writes [`PY_WORKER`] into `dir` as `py_worker.py` and returns its path.
pub fn write_py_worker(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("py_worker.py");
    std::fs::write(&path, PY_WORKER).expect("write the Python test worker");
    path
}
