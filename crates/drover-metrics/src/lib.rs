//! drover-metrics: what the data plane counts and how it is read.
//!
//! Serving threads record into striped atomics (`stripe`) — counters and latency
//! histograms (`histogram`) per balancer and per endpoint (`stats`). Readers take
//! snapshots (`snapshot`) that add up across stripes, and render them as Prometheus or
//! OpenMetrics text (`exposition`, `render`). Nothing here does I/O.

pub mod exposition;
pub mod histogram;
pub mod render;
pub mod snapshot;
pub mod stats;
pub mod stripe;

pub use exposition::{Exposition, Format};
pub use histogram::{Histogram, HistogramSnapshot};
pub use snapshot::{BalancerSnapshot, EndpointSnapshot};
pub use stats::{
    BackendTlsFailure, BalancerCounts, BalancerStats, Cause, CertificateExpiry, Ejection,
    EndpointCounts, EndpointStats, ProxyRefusal, ServedByWorker, SniUnrouted, TlsFailure,
};
