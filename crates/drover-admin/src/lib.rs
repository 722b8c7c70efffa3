//! drover-admin: the control API that `drover ctl` talks to.
//!
//! A small HTTP/1.1 JSON API on its own listener, apart from the data plane:
//!
//! | request | answer |
//! |---|---|
//! | `GET /` | the live dashboard (HTML; its script, style and uPlot under `/ui/`); no token needed, it holds no data |
//! | `GET /readyz`, `GET /livez` | for an orchestrator's probes, no token: 200 `ready`, or 503 `not ready: WHY` (draining, an app with no serving worker, a balancer with no healthy endpoint); `/livez` 200, or 503 `not live: WHY` once every worker of an app is errored |
//! | `GET /v1/events` | server-sent events: the last 10 minutes per balancer, then a sample a second (see `dashboard`) |
//! | `GET /v1/status` | apps, workers (with restart counters) and their restart records, balancers with their endpoints (`Status`) |
//! | `GET /metrics` | Prometheus text (OpenMetrics when `Accept` asks): balancers, endpoints, workers |
//! | `POST /v1/reload[?app=NAME]` | rolling reload of every app (or one); answers when done |
//! | `POST /v1/scale?workers=N[&app=NAME]` | run N workers of an app |
//! | `GET /v1/balancers/B/members` | a balancer's members: source, state, TTL left |
//! | `PUT /v1/balancers/B/members/ID` | register (or update) a member: `{"address", "ttl", "weight", "meta"}` |
//! | `PUT /v1/balancers/B/members/ID/heartbeat` | keep it alive; optional `{"load": 0..1}` |
//! | `DELETE /v1/balancers/B/members/ID` | drain it: no new requests, then removed |
//!
//! When a token is set, every request but the dashboard's page and assets needs `Authorization: Bearer TOKEN`; off loopback
//! one is required (`drover_config::check_exposure`). The crate
//! knows nothing of supervisors or pools: the binary implements `Control` over them,
//! which keeps this crate's tests free of real workers.

mod client;
mod control;
pub mod dashboard;
mod members;
mod metrics;
pub mod probes;
mod server;
pub mod status;

pub use client::{request, AdminClientError, Reply};
pub use control::{Control, ControlError};
pub use hyper::Method;
pub use members::{BalancerMembers, MemberList, MemberRow};
pub use server::AdminServer;
pub use status::{
    restarts_log, wall_clock, AppStatus, BalancerStatus, EndpointRow, NoSuchApp, RestartRow,
    RouteRow, SharedPortRow, SourceRow, Status, WorkerRow,
};
