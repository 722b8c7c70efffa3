//! `GET /readyz` and `GET /livez`: what an orchestrator probes (Kubernetes' readiness
//! and liveness probes, a load balancer's health check of drover itself). No token:
//! a probe carries none, and the answers hold no data, only whether drover serves.

use crate::status::Status;

/// Why drover is not ready for clients, in words that name no app or balancer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotReady {
    /// It is stopping: its listeners no longer accept (a SIGTERM's drain).
    Draining,
    /// An app has no worker that serves (starting, crash-looping, all hung).
    NoServingWorker,
    /// A balancer has no healthy endpoint to send a request to.
    NoHealthyEndpoint,
}

impl std::fmt::Display for NotReady {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            NotReady::Draining => "drover is stopping (draining)",
            NotReady::NoServingWorker => "an app has no serving worker",
            NotReady::NoHealthyEndpoint => "a balancer has no healthy endpoint",
        })
    }
}

/// Whether what `status` shows serves: every app has a worker that serves (ready or
/// busy), and every balancer a healthy endpoint. Before, the only probe was
/// `/v1/status`, which answered 200 while every worker crash-looped.
pub fn readiness(status: &Status) -> Result<(), NotReady> {
    let serves = |state: &str| matches!(state, "ready" | "busy");
    if status
        .apps
        .iter()
        .any(|app| !app.workers.iter().any(|w| serves(&w.state)))
    {
        return Err(NotReady::NoServingWorker);
    }
    if status
        .balancers
        .iter()
        .any(|b| !b.endpoints.iter().any(|e| e.healthy))
    {
        return Err(NotReady::NoHealthyEndpoint);
    }
    Ok(())
}
