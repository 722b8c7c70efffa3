//! What one balancer and its endpoints look like at one moment: the counts plus the
//! live gauges (in flight, limits, estimates) that only the pool knows. The admin API
//! renders it as Prometheus text and streams it to the dashboard as JSON.

use crate::stats::{BalancerCounts, EndpointCounts};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BalancerSnapshot {
    pub name: String,
    pub counts: BalancerCounts,
    /// Requests waiting in drover's queue now.
    pub queue_depth: u64,
    /// Open client connections now.
    pub connections: u64,
    pub endpoints: Vec<EndpointSnapshot>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EndpointSnapshot {
    /// `host:port`, as the pool has it: the `endpoint` label.
    pub address: String,
    pub counts: EndpointCounts,
    pub in_flight: u64,
    /// The concurrency cap in force (learned or configured); 0 = none.
    pub limit: u64,
    /// Why `limit` is what it is: "max-conns", "saturated", "not-saturated",
    /// "mostly-waits", "serves-clients", "probation" or "off"
    /// (see `drover_registry::LimitReason`).
    #[serde(default)]
    pub limit_reason: String,
    /// Requests awaiting their answer that later ones overtook: they wait rather than
    /// work, and a learned limit does not count them.
    #[serde(default)]
    pub waiting: u64,
    /// The balancer's latency estimate (peak EWMA), seconds.
    pub latency_estimate_seconds: f64,
    /// Utilisation the backend reported or was measured at (1.0 = saturated).
    pub reported_load: f64,
    pub weight: u64,
    /// Active health checks pass.
    pub healthy: bool,
    /// Healthy and not ejected: the balancer may pick it.
    pub available: bool,
    /// socket.io sessions the balancer keeps on the endpoint (pinned by their handshake's
    /// answer, and used within the pin's idle time).
    #[serde(default)]
    pub sessions: u64,
}
