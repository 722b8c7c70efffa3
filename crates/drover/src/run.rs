//! Starting balancers and stopping them cleanly.

use crate::control::Controller;
use crate::plan::BalancerPlan;
use drover_proxy::Proxy;
use drover_registry::{spawn_active_checks, ActiveChecks, Pool};
use drover_supervisor::Supervisor;
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

/// The pool a plan's fixed backends make up.
pub fn static_pool(plan: &BalancerPlan) -> Arc<Pool> {
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
    pool
}

/// Starts one balancer over `pool`. Must run inside the control runtime (health checks
/// live there). A supervised app's pool is checked by its supervisor, not here. The
/// error is the bind's: the caller knows where the address was configured.
pub fn start(plan: BalancerPlan, pool: Arc<Pool>) -> std::io::Result<Running> {
    let checks = plan
        .health
        .clone()
        .filter(|_| plan.app.is_none())
        .map(|check| spawn_active_checks(Arc::clone(&pool), check));
    let name = plan.proxy.name.clone();
    let proxy = Proxy::start(plan.proxy, pool, plan.strategy.build())?;
    let over = match &plan.app {
        Some(app) => format!("app {app:?}"),
        None => format!("{} backends", plan.backends.len()),
    };
    // Scripts and tests read this line to learn the port when listening on :0.
    eprintln!(
        "drover: balancer {name:?} listening on {} ({over}, strategy {})",
        proxy.local_addr(),
        plan.strategy
    );
    Ok(Running {
        proxy,
        _checks: checks,
        drain_timeout: plan.drain_timeout,
    })
}

/// Serves until SIGTERM or SIGINT, then drains: stop accepting, let in-flight requests
/// finish within the drain timeout, and return. Supervised apps are stopped after the
/// balancers have drained, so no request is cut off by its worker going away.
/// SIGHUP starts a rolling reload of the apps (see `Controller::reload_apps`).
pub async fn serve_until_signal(
    balancers: Vec<Running>,
    apps: Vec<Arc<Supervisor>>,
    control: Option<Arc<Controller>>,
) -> Result<(), String> {
    let mut term = signal(SignalKind::terminate()).map_err(|e| e.to_string())?;
    let mut int = signal(SignalKind::interrupt()).map_err(|e| e.to_string())?;
    let mut hup = signal(SignalKind::hangup()).map_err(|e| e.to_string())?;
    let which = loop {
        tokio::select! {
            _ = term.recv() => break "SIGTERM",
            _ = int.recv() => break "SIGINT",
            _ = hup.recv() => {
                let Some(control) = control.clone() else {
                    eprintln!("drover: SIGHUP: nothing to reload (no supervised apps)");
                    continue;
                };
                eprintln!("drover: SIGHUP received, reloading");
                // In its own task, so SIGTERM is still heard during a long reload.
                tokio::spawn(async move {
                    match control.reload_apps(None).await {
                        Ok(msg) => eprintln!("drover: {msg}"),
                        Err(e) => eprintln!("drover: reload failed: {e}"),
                    }
                });
            }
        }
    };
    info!("{which}: draining");
    eprintln!("drover: {which} received, draining");
    for b in &balancers {
        b.proxy.begin_shutdown();
    }
    for b in &balancers {
        if !b.proxy.drained(b.drain_timeout).await {
            warn!(
                balancer = %b.proxy.name(),
                open = b.proxy.active_connections(),
                "drain timeout reached; closing remaining connections"
            );
        }
    }
    for app in &apps {
        app.shutdown().await;
    }
    eprintln!("drover: stopped");
    Ok(())
}
