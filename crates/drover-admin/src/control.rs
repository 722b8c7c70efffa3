//! What the admin API and the dashboard ask of the process that runs them: the binary
//! implements `Control` over its supervisors and pools.

use crate::members::BalancerMembers;
use crate::probes::{NotLive, NotReady};
use crate::status::Status;
use drover_metrics::BalancerSnapshot;
use std::future::Future;
use std::pin::Pin;

/// What the API can see and do; the binary implements it over its supervisors and pools.
pub trait Control: Send + Sync + 'static {
    fn status(&self) -> Status;

    /// Rolling reload of every app, or of the one named; resolves when it is done, with
    /// a line saying what was reloaded.
    fn reload(
        &self,
        app: Option<String>,
    ) -> Pin<Box<dyn Future<Output = Result<String, ControlError>> + Send + '_>>;

    /// Runs `workers` workers of the app named (or of the only app), starting or
    /// retiring some; resolves when that is done, with a line saying what changed.
    fn scale(
        &self,
        app: Option<String>,
        workers: usize,
    ) -> Pin<Box<dyn Future<Output = Result<String, ControlError>> + Send + '_>>;

    /// The runtime members of the balancer named, and its pool.
    fn members(&self, balancer: &str) -> Result<BalancerMembers, ControlError>;

    /// Every balancer's counts and endpoints now, for `/metrics` and the dashboard.
    fn metrics(&self) -> Vec<BalancerSnapshot>;

    /// Whether drover serves (`GET /readyz`): by default, what `status` shows (see
    /// `probes::readiness`); the binary adds its drain.
    fn readiness(&self) -> Result<(), NotReady> {
        crate::probes::readiness(&self.status())
    }

    /// Whether drover still does its job (`GET /livez`; see `probes::liveness`).
    fn liveness(&self) -> Result<(), NotLive> {
        crate::probes::liveness(&self.status())
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ControlError {
    /// The request names something that does not exist (404).
    NotFound(String),
    /// The request asks for something that cannot be (400).
    Invalid(String),
    /// The action was tried and failed; what is running is said in the message (500).
    Failed(String),
}

impl std::fmt::Display for ControlError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ControlError::NotFound(m) | ControlError::Invalid(m) | ControlError::Failed(m) => {
                f.write_str(m)
            }
        }
    }
}
