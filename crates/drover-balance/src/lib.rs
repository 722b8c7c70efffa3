//! drover-balance: which endpoint gets the next request.
//!
//! Pure selection: no I/O, no async, no hyper. Endpoint load state lives in atomics on
//! `Endpoint`; a `Balancer` reads it from an `EndpointSet` snapshot and returns a `Pick`,
//! an RAII handle that holds the in-flight slot until the request is done.

pub mod clock;
pub mod cost;
pub mod endpoint;
pub mod hashing;
pub mod idle_turns;
pub mod pick;
pub mod set;
pub mod spread;
pub mod strategy;
pub mod worker_life;

pub use clock::Nanos;
pub use cost::CostTable;
pub use endpoint::{Endpoint, WorkArrives};
pub use pick::{NoPick, Pick, PickContext, Pooled};
pub use set::EndpointSet;
pub use spread::CostSpread;
pub use strategy::Strategy;
pub use worker_life::WorkerLife;

/// Chooses an endpoint for one request. Strategies keep their own state behind `&self`
/// (atomics or a short lock) so one balancer serves every connection.
pub trait Balancer: Send + Sync + std::fmt::Debug {
    fn pick(&self, set: &EndpointSet, ctx: &PickContext<'_>) -> Result<Pick, NoPick>;
}
