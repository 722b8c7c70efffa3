//! drover-registry: the live endpoint set of one backend pool, with health.
//!
//! - `Pool`: membership, swapped atomically (`arc-swap`); readers never lock, and
//!   endpoints that stay keep their load state across changes.
//! - `PassivePolicy`: ejection from what real requests see (connect failures, 5xx
//!   streaks), with exponential back-off. The proxy reports outcomes to it.
//! - `spawn_active_checks`: HTTP or TCP probes on a timer with rise/fall thresholds.
//! - `liveness`: a probe that gets no answer while requests complete is busy, not hung.
//! - `Members`: backends that join at runtime (admin API, SDK) with a TTL kept alive by
//!   heartbeats; `MemberStore` is the interface a shared store (etcd) implements too.
//! - `Handoffs`: endpoints that take client connections themselves (drover run's
//!   handoff mode), chosen by how far behind each one is.
//! - `local`: drover's own shortages (descriptors, memory, ports), which are no
//!   endpoint's fault, and a rate limit for warning about them.
//!
//! No hyper here: the HTTP health check speaks just enough HTTP/1.1 with `httparse`.

pub mod active;
pub mod grpc_health;
pub mod handoff;
mod http_probe;
pub mod liveness;
pub mod local;
pub mod members;
pub mod passive;
pub mod pool;
pub mod probe;
pub mod status;

pub use active::{
    probe, probe_sending, probe_with, spawn_active_checks, spawn_active_checks_sending,
    spawn_active_checks_with, ActiveChecks, CheckKind, CheckReport, HealthCheck, HealthCheckError,
    ProbeError, ProbeStream, Prober, Probing, WrapFuture, WrapProbe,
};
pub use handoff::{Handoffs, Occupancy, OwnWorker, TakesConnections};
pub use liveness::{Outcome, Progress};
pub use local::{is_local_shortage, WarnLimit};
pub use members::{
    MemberError, MemberErrorKind, MemberFuture, MemberState, MemberStore, MemberView, Members,
    Registered, Registration,
};
pub use passive::PassivePolicy;
pub use pool::{EndpointStatus, LimitReason, MembershipChange, Pool, PoolOptions, Source};
pub use status::StatusRange;
