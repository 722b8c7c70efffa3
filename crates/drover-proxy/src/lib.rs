//! drover-proxy: the data plane.
//!
//! HTTP/1.1 and HTTP/2 from clients to a pool of endpoints: keep-alive on both sides, streamed
//! bodies, Upgrade tunnels, forwarding headers, retries that never repeat an unsafe
//! request, per-endpoint limits with a late-binding queue, and strict parsing so that
//! nothing ambiguous reaches a backend.
//!
//! Where each part of a request's life happens:
//!
//! | what | where |
//! |---|---|
//! | accepting, threads, reload, shutdown | `server.rs` |
//! | a client connection, keep-alive, reading a request | `conn/mod.rs` |
//! | the PROXY protocol header a balancer in front sends | `proxy_protocol.rs` |
//! | TLS: certificates, SNI, the handshake | `tls/` (the client's stream, plain or TLS: `conn/client.rs`) |
//! | HTTP/2 from clients: the connection, its defences, each stream as an exchange | `http2/` |
//! | parsing a request head | `http1/request.rs` (an HTTP/2 stream's head first: `http2/request.rs`) |
//! | the head sent to a backend, forwarding headers | `http1/forward.rs` |
//! | balancing keys and the cost class | `http1/keys.rs` |
//! | drover's own error pages | `http1/error_page.rs` |
//! | admission: the pick, limits, the queue | `admission.rs` |
//! | deciding, retries, the request's metrics | `conn/exchange.rs` |
//! | one try: connect or reuse, send, the response head | `conn/attempt.rs` |
//! | relaying bodies, chunked framing, body rates | `body.rs`, `http1/chunked.rs` |
//! | latency, cost and passive health from an answer | `conn/account.rs` |
//! | idle backend connections, plain or TLS | `upstream.rs` |
//! | TLS to backends: verification, SNI, client certificates | `backend_tls.rs` |
//! | handing a connection to a worker | `handoff.rs` |
//! | TCP mode: a connection placed at accept and relayed both ways | `tcp.rs` |
//! | Routes: TCP by the SNI of a ClientHello read undecrypted, HTTP by host and path | `routes/`, `tls/client_hello.rs` |
//! | the access log: a line per answered request, its buffer and writer | `access_log.rs` (lines made in `conn/exchange.rs`) |

pub mod access_log;
mod admission;
pub mod backend_tls;
mod body;
mod conn;
pub mod descriptors;
mod engine_io;
pub mod error;
#[doc(hidden)]
pub mod fuzzing;
mod handoff;
pub mod http1;
mod http2;
pub mod options;
pub mod orca;
pub mod proxy_protocol;
mod request_id;
pub mod routes;
mod server;
mod state;
mod tcp;
pub mod tls;
mod upstream;

pub use error::ProxyError;
pub use http2::backend::H2Probe;
pub use options::{
    BackendProtocol, Handoff, HashKey, Limits, ParseHashKeyError, Protocol, ProxyOptions,
    QueueOptions, Timeouts, DEFAULT_REQUEST_TIMEOUT,
};
pub use server::{listener, Proxy, ReconfigureError};
