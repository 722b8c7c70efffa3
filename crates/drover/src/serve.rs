//! Serving until a signal, and stopping cleanly.

use crate::control::Controller;
use crate::systemd;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::signal::unix::{signal, SignalKind};
use tracing::{info, warn};

/// Serves until SIGTERM or SIGINT, then drains: stop accepting, let in-flight requests
/// finish within the drain timeout, and return. Supervised apps are stopped after the
/// balancers have drained, so no request is cut off by its worker going away.
/// SIGHUP reloads (see `Controller::reload`); SIGUSR1 reopens every access log's file
/// (logrotate's `postrotate`). `late_start` (a balancer that starts once its app says
/// where) runs beside; its error stops drover the same way, and is returned.
pub async fn serve_until_signal(
    control: Arc<Controller>,
    mut late_start: Option<LateStart>,
) -> Result<(), String> {
    let mut term = signal(SignalKind::terminate()).map_err(|e| e.to_string())?;
    let mut int = signal(SignalKind::interrupt()).map_err(|e| e.to_string())?;
    let mut hup = signal(SignalKind::hangup()).map_err(|e| e.to_string())?;
    // Every listener is bound by now; systemd hears READY=1 once the workers serve.
    let ready = tokio::spawn(systemd::ready_when_serving(control.apps()));
    // Petted from this loop, the one that hears signals: if it hangs, systemd restarts
    // drover. Without a watchdog the timer never fires.
    let watchdog_every = systemd::watchdog_interval();
    let mut watchdog = tokio::time::interval(watchdog_every.unwrap_or(Duration::from_secs(3600)));
    let mut usr1 = signal(SignalKind::user_defined1()).map_err(|e| e.to_string())?;
    let mut failed = None;
    let which = loop {
        tokio::select! {
            _ = term.recv() => break "SIGTERM",
            _ = int.recv() => break "SIGINT",
            started = async { late_start.as_mut().expect("polled only while some").await }, if late_start.is_some() => {
                late_start = None;
                if let Err(e) = started {
                    failed = Some(e);
                    break "a failed start";
                }
            }
            _ = watchdog.tick(), if watchdog_every.is_some() => systemd::pet_watchdog(),
            _ = usr1.recv() => {
                info!("SIGUSR1: reopening the access logs");
                drover_proxy::access_log::reopen_all();
            }
            _ = hup.recv() => {
                let control = Arc::clone(&control);
                drover_spool::eprintln!("drover: SIGHUP received, reloading");
                // In its own task, so SIGTERM is still heard during a long reload.
                tokio::spawn(async move {
                    match control.reload(None).await {
                        Ok(msg) => drover_spool::eprintln!("drover: {msg}"),
                        Err(e) => drover_spool::eprintln!("drover: reload failed: {e}"),
                    }
                });
            }
        }
    };
    ready.abort();
    systemd::stopping();
    info!("{which}: draining");
    match &failed {
        Some(_) => {
            drover_spool::eprintln!(
                "drover: a balancer could not start or serve its app (below); draining"
            )
        }
        None => drover_spool::eprintln!("drover: {which} received, draining"),
    }
    control.begin_stop();
    let grace = control
        .balancers()
        .iter()
        .map(|b| b.shutdown_delay())
        .max()
        .unwrap_or_default();
    if !grace.is_zero() && failed.is_none() {
        drover_spool::eprintln!(
            "drover: still accepting for {grace:?} (--shutdown-delay) while /readyz says draining; send the signal again to drain now"
        );
        tokio::select! {
            () = tokio::time::sleep(grace) => {}
            _ = term.recv() => drover_spool::eprintln!("drover: SIGTERM again: draining now"),
            _ = int.recv() => drover_spool::eprintln!("drover: SIGINT again: draining now"),
        }
    }
    // Read again: a reload during the delay may have changed them.
    let balancers = control.balancers();
    for b in &balancers {
        b.proxy.begin_shutdown();
    }
    // Said once, a second into a drain that waits on clients: a stop that sat silent
    // for its whole drain timeout looked hung (framework seat).
    let waiting = async {
        tokio::time::sleep(DRAIN_SAID_AFTER).await;
        let open: usize = balancers.iter().map(|b| b.proxy.connections()).sum();
        if open > 0 {
            let most = balancers
                .iter()
                .map(|b| b.drain_timeout())
                .max()
                .unwrap_or_default();
            drover_spool::eprintln!(
                "drover: waiting up to {most:?} for {open} open client connection(s) (requests in flight, event streams, WebSockets); send the signal again (a second Ctrl-C) to close them now"
            );
        }
        std::future::pending::<()>().await
    };
    let drain = async {
        for b in &balancers {
            if !b.proxy.drained(b.drain_timeout()).await {
                warn!(
                    balancer = %b.proxy.name(),
                    open = b.proxy.connections(),
                    "drain timeout reached; closing remaining connections"
                );
            }
        }
    };
    // A second signal stops the wait, as a second Ctrl-C does for npm or docker
    // compose: an event stream or a watch never ends by itself, and a user who pressed
    // Ctrl-C twice does not want to wait out the drain timeout for one.
    tokio::select! {
        () = drain => {}
        () = waiting => {}
        _ = term.recv() => drover_spool::eprintln!("drover: SIGTERM again: closing the remaining connections now"),
        _ = int.recv() => drover_spool::eprintln!("drover: SIGINT again: closing the remaining connections now"),
    }
    // Every answered request's line is in its log's buffer now: write them all
    // before drover exits (a writer thread would be stopped mid-batch at exit).
    drover_proxy::access_log::flush_all();
    // The apps running now: a reload may have started some since.
    for app in &control.apps() {
        app.shutdown().await;
    }
    drover_spool::eprintln!("drover: stopped");
    match failed {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// How long a stop's drain runs before drover says what it waits on.
const DRAIN_SAID_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

/// A start that waits on something the apps say (`follow::where_the_app_listens`).
pub type LateStart = Pin<Box<dyn Future<Output = Result<(), String>>>>;

/// The late starts of `starts` side by side: done when all are, failed at the first
/// error. Hand-written (a dozen lines) rather than taking the `futures` crate for its
/// `try_join_all`: it has no other use here.
pub fn all(mut starts: Vec<LateStart>) -> LateStart {
    Box::pin(std::future::poll_fn(move |cx| {
        let mut i = 0;
        while i < starts.len() {
            match starts[i].as_mut().poll(cx) {
                std::task::Poll::Ready(Err(e)) => return std::task::Poll::Ready(Err(e)),
                std::task::Poll::Ready(Ok(())) => drop(starts.swap_remove(i)),
                std::task::Poll::Pending => i += 1,
            }
        }
        if starts.is_empty() {
            std::task::Poll::Ready(Ok(()))
        } else {
            std::task::Poll::Pending
        }
    }))
}
