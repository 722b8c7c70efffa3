//! drover-proxy: the data plane.
//!
//! HTTP/1.1 from clients to a pool of endpoints: keep-alive on both sides, streamed
//! bodies, Upgrade tunnels, forwarding headers, retries that never repeat an unsafe
//! request, per-endpoint limits with a late-binding queue, and strict parsing so that
//! nothing ambiguous reaches a backend.

mod admission;
mod body;
mod conn;
pub mod descriptors;
pub mod error;
#[doc(hidden)]
pub mod fuzzing;
mod handoff;
pub mod http1;
pub mod options;
pub mod orca;
mod request_id;
mod server;
mod state;
mod upstream;

pub use error::ProxyError;
pub use options::{
    Handoff, HashKey, Limits, ParseHashKeyError, ProxyOptions, QueueOptions, Timeouts,
};
pub use server::{Proxy, ReconfigureError};
