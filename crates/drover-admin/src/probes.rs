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

/// Why drover is not live: it gave up on an app, and will not mend it by itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotLive {
    /// Every worker of an app is errored (past `max_restarts`): drover starts none of
    /// them again until a reload, a scale or its own restart.
    AppErrored,
}

impl std::fmt::Display for NotLive {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            NotLive::AppErrored => {
                "every worker of an app is errored (past max_restarts): drover starts them \
                 no more"
            }
        })
    }
}

/// Whether drover still does its job for every app. An app whose every worker is
/// errored stays down for good: `/readyz` said "not ready" forever while `/livez`
/// said "ok", so an orchestrator neither sent drover traffic nor restarted it (ops
/// seat); systemd's `Restart=` and Kubernetes restart what says it is not live. (When
/// every app is errored, drover exits 1 itself.) One errored worker beside others
/// that serve is not this: the app serves, with less.
pub fn liveness(status: &Status) -> Result<(), NotLive> {
    let errored = |app: &crate::status::AppStatus| {
        !app.workers.is_empty() && app.workers.iter().all(|w| w.state == "errored")
    };
    if status.apps.iter().any(errored) {
        return Err(NotLive::AppErrored);
    }
    Ok(())
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
