//! Readiness (is the fresh worker serving yet?) and liveness (is it still?) probes,
//! both built on `drover_registry::probe`.

use drover_registry::{probe, CheckKind, HealthCheck, ProbeError};
use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::time::MissedTickBehavior;

/// How often a starting worker's port is tried. Connecting to a closed loopback port
/// fails at once, so this is the readiness latency, not a cost.
const READY_POLL: Duration = Duration::from_millis(50);

/// Bound on one readiness connect. Loopback connects answer at once; this only matters
/// for a worker whose accept queue is full or whose kernel is swamped.
const READY_CONNECT: Duration = Duration::from_millis(500);

/// A worker that did not become ready in time.
#[derive(Debug)]
pub struct NotReady {
    /// The time it had (`ready_timeout`).
    pub within: Duration,
    /// Why the last readiness attempt failed; `None` when none finished.
    pub last: Option<ProbeError>,
}

impl fmt::Display for NotReady {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.last {
            Some(e) => write!(f, "not ready within {:?} ({e})", self.within),
            None => write!(
                f,
                "not ready within {:?} (no attempt finished)",
                self.within
            ),
        }
    }
}

impl std::error::Error for NotReady {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.last.as_ref().map(|e| e as _)
    }
}

/// Waits until `addr` accepts TCP and, when `check` is set, one probe of it passes.
/// One pass is enough here (not `rise`): a worker that answers its health route is
/// ready, and a slow start just delays traffic. Fails after `within` with the last
/// reason, for the log.
pub(crate) async fn wait_ready(
    addr: SocketAddr,
    check: Option<&HealthCheck>,
    within: Duration,
) -> Result<(), NotReady> {
    let mut last = None;
    let attempts = async {
        loop {
            match ready_once(addr, check).await {
                Ok(()) => return,
                Err(e) => last = Some(e),
            }
            tokio::time::sleep(READY_POLL).await;
        }
    };
    match tokio::time::timeout(within, attempts).await {
        Ok(()) => Ok(()),
        Err(_) => Err(NotReady { within, last }),
    }
}

async fn ready_once(addr: SocketAddr, check: Option<&HealthCheck>) -> Result<(), ProbeError> {
    probe(addr, &CheckKind::Tcp, READY_CONNECT).await?;
    match check {
        Some(c) if c.kind != CheckKind::Tcp => probe(addr, &c.kind, c.timeout).await,
        _ => Ok(()),
    }
}

/// Probes a ready worker every `interval` and returns once `fall` probes in a row have
/// failed, with the last error. Never returns for a healthy worker; the caller races it
/// against the process exiting.
pub(crate) async fn until_unhealthy(addr: SocketAddr, check: &HealthCheck) -> String {
    let mut ticker = tokio::time::interval(check.interval.max(Duration::from_millis(1)));
    // A probe that hangs until its timeout delays the next one instead of bunching up.
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    // Readiness just passed a probe; the first tick of `interval` fires at once, skip it.
    ticker.tick().await;
    let mut failures = 0;
    loop {
        ticker.tick().await;
        match probe(addr, &check.kind, check.timeout).await {
            Ok(()) => failures = 0,
            Err(e) => {
                failures += 1;
                tracing::debug!(endpoint = %addr, failures, "worker health check failed: {e}");
                if failures >= check.fall.max(1) {
                    return format!("failed {failures} health checks in a row (last: {e})");
                }
            }
        }
    }
}

/// How long a shared-mode worker must stay alive to count as ready. drover cannot reach
/// one worker through a shared socket, so it cannot probe it; until the worker accepts,
/// connections wait in the kernel's accept queue (or go to the other workers), so a
/// short settle costs latency at worst, never a failed request.
pub(crate) const SHARED_SETTLE: Duration = Duration::from_millis(300);

/// Readiness for a worker of either mode: `addr` is its own port in proxy mode, `None`
/// in shared mode.
pub(crate) async fn wait_ready_at(
    addr: Option<SocketAddr>,
    check: Option<&HealthCheck>,
    within: Duration,
) -> Result<(), NotReady> {
    match addr {
        Some(addr) => wait_ready(addr, check, within).await,
        None => {
            tokio::time::sleep(SHARED_SETTLE.min(within)).await;
            Ok(())
        }
    }
}

/// `until_unhealthy` when there is something to check; never resolves otherwise.
pub(crate) async fn watch(addr: Option<SocketAddr>, check: Option<HealthCheck>) -> String {
    match (addr, check) {
        (Some(addr), Some(check)) => until_unhealthy(addr, &check).await,
        _ => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_ready_says_the_last_reason() {
        let within = Duration::from_secs(5);
        let none = NotReady { within, last: None };
        assert_eq!(
            none.to_string(),
            "not ready within 5s (no attempt finished)"
        );
        let refused = NotReady {
            within,
            last: Some(ProbeError::Refused),
        };
        assert_eq!(
            refused.to_string(),
            "not ready within 5s (connection refused)"
        );
        assert!(std::error::Error::source(&refused).is_some());
    }
}
