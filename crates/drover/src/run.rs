//! Starting balancers and stopping them cleanly.

use crate::plan::BalancerPlan;
use drover_proxy::Proxy;
use drover_registry::{spawn_active_checks, ActiveChecks, Pool};
use std::sync::Arc;
use std::time::Duration;
use tokio::signal::unix::{signal, SignalKind};
use tracing::{info, warn};

/// A started balancer and what keeps it healthy.
pub struct Running {
    pub proxy: Proxy,
    _checks: Option<ActiveChecks>,
    drain_timeout: Duration,
}

/// Starts one balancer. Must run inside the control runtime (health checks live there).
pub fn start(plan: BalancerPlan) -> Result<Running, String> {
    let pool = Arc::new(Pool::new(
        plan.proxy.name.clone(),
        &plan.backends,
        plan.pool.clone(),
    ));
    for (addr, max) in &plan.max_conns {
        if let Some(ep) = pool.find(*addr) {
            ep.set_max_conns(*max);
        }
    }
    let checks = plan
        .health
        .clone()
        .map(|check| spawn_active_checks(Arc::clone(&pool), check));
    let listen = plan.proxy.listen;
    let name = plan.proxy.name.clone();
    let proxy = Proxy::start(plan.proxy, Arc::clone(&pool), plan.strategy.build())
        .map_err(|e| format!("balancer {name:?}: cannot listen on {listen}: {e}"))?;
    // Scripts and tests read this line to learn the port when listening on :0.
    eprintln!(
        "drover: balancer {name:?} listening on {} ({} backends, strategy {})",
        proxy.local_addr(),
        plan.backends.len(),
        plan.strategy
    );
    Ok(Running {
        proxy,
        _checks: checks,
        drain_timeout: plan.drain_timeout,
    })
}

/// Serves until SIGTERM or SIGINT, then drains: stop accepting, let in-flight requests
/// finish within the drain timeout, and return.
pub async fn serve_until_signal(balancers: Vec<Running>) -> Result<(), String> {
    let mut term = signal(SignalKind::terminate()).map_err(|e| e.to_string())?;
    let mut int = signal(SignalKind::interrupt()).map_err(|e| e.to_string())?;
    let which = tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    };
    info!("{which}: draining");
    eprintln!("drover: {which} received, draining");
    for b in &balancers {
        b.proxy.begin_shutdown();
    }
    for b in &balancers {
        if !b.proxy.drained(b.drain_timeout).await {
            warn!(
                balancer = b.proxy.name(),
                open = b.proxy.active_connections(),
                "drain timeout reached; closing remaining connections"
            );
        }
    }
    eprintln!("drover: stopped");
    Ok(())
}
