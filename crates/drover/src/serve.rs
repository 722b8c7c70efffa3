//! Serving until a signal, and stopping cleanly.

use crate::control::Controller;
use crate::systemd;
use std::future::Future;
use std::pin::Pin;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;
use tokio::signal::unix::{signal, SignalKind};
use tracing::{info, warn};

/// Serves until SIGTERM or SIGINT, then drains: stop accepting, let in-flight requests
/// finish within the drain timeout, and return. Supervised apps are stopped after the
/// balancers have drained, so no request is cut off by its worker going away.
/// SIGHUP reloads (see `Controller::reload`); SIGUSR1 reopens every access log's file
/// (logrotate's `postrotate`). `late_start` (a balancer that starts once its app says
/// where) runs beside; its error stops drover the same way, and is returned. When
/// every worker of every app is errored (`--max-restarts`), drover stops the same way
/// and returns exit code 1, as `pm2-runtime` exits.
pub async fn serve_until_signal(
    control: Arc<Controller>,
    mut late_start: Option<LateStart>,
) -> Result<Option<ExitCode>, String> {
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
    let mut errored_look = tokio::time::interval(ERRORED_LOOK);
    let mut failed = None;
    let mut errored = false;
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
            _ = errored_look.tick() => {
                if let Some(names) = every_app_errored(&control) {
                    drover_spool::eprintln!(
                        "drover: every app's workers are errored (--max-restarts): {names}; stopping, to exit 1 so that what started drover (a container's restart policy, systemd) acts"
                    );
                    errored = true;
                    break "every app errored";
                }
            }
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
        None if errored => {}
        None => drover_spool::eprintln!("drover: {which} received, draining"),
    }
    control.begin_stop();
    let grace = control
        .balancers()
        .iter()
        .map(|b| b.shutdown_delay())
        .max()
        .unwrap_or_default();
    if !grace.is_zero() && failed.is_none() && !errored {
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
    // The apps stop once the drain is over, or sooner, once only streams and tunnels
    // are left: an app that ends its own WebSockets and event streams on SIGTERM
    // (Fastify's and socket.io's close(), NestJS's shutdown hooks) then gets the signal
    // a second in (see the worker's drain), where before it got it only after the whole
    // drain timeout, and then its clients were cut. In a task of its own: a stop of
    // workers once begun runs to its end.
    let (drain_over, mut over) = tokio::sync::watch::channel(false);
    let apps_stop = {
        let control = Arc::clone(&control);
        let balancers = balancers.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = only_streams_left(&control, &balancers) => {
                    drover_spool::eprintln!("drover: only streams (event streams, WebSockets) are left open; stopping the workers now, so that an app that handles SIGTERM can end them itself");
                }
                _ = over.changed() => {}
            }
            stop_apps(&control).await;
        })
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
    let _ = drain_over.send(true);
    // Every answered request's line is in its log's buffer now: write them all
    // before drover exits (a writer thread would be stopped mid-batch at exit).
    drover_proxy::access_log::flush_all();
    if let Err(e) = apps_stop.await {
        warn!("stopping the apps failed: {e}");
    }
    // The apps running now: a reload may have started some since (a stopped one
    // returns at once).
    stop_apps(&control).await;
    drover_spool::eprintln!("drover: stopped");
    match failed {
        Some(e) => Err(e),
        None if errored => Ok(Some(ExitCode::from(1))),
        None => Ok(None),
    }
}

/// How often drover looks whether every app is errored.
const ERRORED_LOOK: Duration = Duration::from_secs(1);

/// The apps' names, when there is one at least and every one is errored.
fn every_app_errored(control: &Controller) -> Option<String> {
    let apps = control.apps();
    let all = !apps.is_empty() && apps.iter().all(|app| app.is_errored());
    all.then(|| {
        apps.iter()
            .map(|app| app.name().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    })
}

/// How long a stop's drain runs before drover says what it waits on.
const DRAIN_SAID_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

/// Stops every app running now, side by side: one whose workers hold streams until
/// its drain timeout does not hold up another's stop.
async fn stop_apps(control: &Controller) {
    let stops: Vec<_> = control
        .apps()
        .into_iter()
        .map(|app| tokio::spawn(async move { app.shutdown().await }))
        .collect();
    for stop in stops {
        if let Err(e) = stop.await {
            warn!("stopping an app failed: {e}");
        }
    }
}

/// Resolves once drover's open client connections have been only streams and tunnels
/// for `STREAMS_SETTLE`: none is waiting in a balancer's queue or for its answer's head
/// from a worker. A stop closes a connection between two requests, and one waiting
/// for a request's head, at once; what stays open is an answer under way (an event
/// stream, a download) or a WebSocket.
async fn only_streams_left(
    control: &Controller,
    balancers: &[Arc<crate::balancers::RunningBalancer>],
) {
    let mut since: Option<tokio::time::Instant> = None;
    loop {
        tokio::time::sleep(STREAMS_POLL).await;
        let open = balancers.iter().any(|b| b.proxy.connections() > 0);
        let queued = balancers.iter().any(|b| b.proxy.queue_depth() > 0);
        let waiting = control
            .apps()
            .iter()
            .any(|app| app.pool().endpoints().iter().any(|e| e.pending() > 0));
        let now = tokio::time::Instant::now();
        since = (open && !queued && !waiting).then(|| since.unwrap_or(now));
        if since.is_some_and(|t| now - t >= STREAMS_SETTLE) {
            return;
        }
    }
}

/// How often a stop's drain looks whether only streams are left.
const STREAMS_POLL: Duration = Duration::from_millis(100);

/// How long only streams must be left before the workers are stopped: a response's
/// body is under way for a moment after its head.
const STREAMS_SETTLE: Duration = Duration::from_secs(1);

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
