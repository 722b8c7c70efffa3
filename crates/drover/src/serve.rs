//! Serving until a signal, and stopping cleanly.

use crate::control::Controller;
use drover_supervisor::Supervisor;
use std::sync::Arc;
use tokio::signal::unix::{signal, SignalKind};
use tracing::{info, warn};

/// Serves until SIGTERM or SIGINT, then drains: stop accepting, let in-flight requests
/// finish within the drain timeout, and return. Supervised apps are stopped after the
/// balancers have drained, so no request is cut off by its worker going away.
/// SIGHUP reloads (see `Controller::reload`); SIGUSR1 reopens every access log's file
/// (logrotate's `postrotate`).
pub async fn serve_until_signal(
    control: Arc<Controller>,
    apps: Vec<Arc<Supervisor>>,
) -> Result<(), String> {
    let mut term = signal(SignalKind::terminate()).map_err(|e| e.to_string())?;
    let mut int = signal(SignalKind::interrupt()).map_err(|e| e.to_string())?;
    let mut hup = signal(SignalKind::hangup()).map_err(|e| e.to_string())?;
    let mut usr1 = signal(SignalKind::user_defined1()).map_err(|e| e.to_string())?;
    let which = loop {
        tokio::select! {
            _ = term.recv() => break "SIGTERM",
            _ = int.recv() => break "SIGINT",
            _ = usr1.recv() => {
                info!("SIGUSR1: reopening the access logs");
                drover_proxy::access_log::reopen_all();
            }
            _ = hup.recv() => {
                let control = Arc::clone(&control);
                eprintln!("drover: SIGHUP received, reloading");
                // In its own task, so SIGTERM is still heard during a long reload.
                tokio::spawn(async move {
                    match control.reload(None).await {
                        Ok(msg) => eprintln!("drover: {msg}"),
                        Err(e) => eprintln!("drover: reload failed: {e}"),
                    }
                });
            }
        }
    };
    info!("{which}: draining");
    eprintln!("drover: {which} received, draining");
    let balancers = control.balancers();
    for b in &balancers {
        b.proxy.begin_shutdown();
    }
    for b in &balancers {
        if !b.proxy.drained(b.drain_timeout()).await {
            warn!(
                balancer = %b.proxy.name(),
                open = b.proxy.active_connections(),
                "drain timeout reached; closing remaining connections"
            );
        }
    }
    // Every answered request's line is in its log's buffer now: write them all
    // before drover exits (a writer thread would be stopped mid-batch at exit).
    drover_proxy::access_log::flush_all();
    for app in &apps {
        app.shutdown().await;
    }
    eprintln!("drover: stopped");
    Ok(())
}
