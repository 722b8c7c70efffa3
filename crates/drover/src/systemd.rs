//! systemd's notify protocol for `drover up` and `drover run` under `Type=notify` (or
//! `notify-reload`): READY=1 once every listener is bound and every app's workers serve,
//! RELOADING=1 then READY=1 around a reload, STOPPING=1 when a stop begins, and WATCHDOG=1
//! from the control loop at half of `WatchdogSec=`, so a control loop that hangs is
//! restarted. Without `NOTIFY_SOCKET` (not under systemd) every call does nothing.
//! Workers never see the socket: the supervisor removes it from their environment.

use drover_supervisor::Supervisor;
use sd_notify::NotifyState;
use std::sync::Arc;
use std::time::Duration;
use tracing::warn;

/// How often readiness is looked at while the workers start.
const READY_POLL: Duration = Duration::from_millis(50);

fn send(states: &[NotifyState]) {
    if let Err(e) = sd_notify::notify(states) {
        warn!("cannot notify the service manager (NOTIFY_SOCKET): {e}");
    }
}

/// Waits until every worker of every app serves, then says READY=1. A worker that
/// never gets ready keeps drover "activating", and systemd's `TimeoutStartSec=` judges
/// that, as it would for any service.
pub async fn ready_when_serving(apps: Vec<Arc<Supervisor>>) {
    if std::env::var_os("NOTIFY_SOCKET").is_none() {
        return;
    }
    let mut tick = tokio::time::interval(READY_POLL);
    loop {
        tick.tick().await;
        let serving = apps
            .iter()
            .all(|app| app.status().iter().all(|w| w.state.is_serving()));
        if serving {
            break;
        }
    }
    send(&[NotifyState::Ready, NotifyState::Status("serving")]);
}

/// Before a reload: RELOADING=1 with the monotonic time `Type=notify-reload` asks for.
pub fn reloading() {
    match NotifyState::monotonic_usec_now() {
        Ok(now) => send(&[NotifyState::Reloading, now]),
        Err(_) => send(&[NotifyState::Reloading]),
    }
}

/// After a reload, applied or refused: serving again.
pub fn reloaded(outcome: &str) {
    send(&[NotifyState::Ready, NotifyState::Status(outcome)]);
}

pub fn stopping() {
    send(&[NotifyState::Stopping, NotifyState::Status("draining")]);
}

/// Half of `WatchdogSec=` when systemd asked for a watchdog (for this process), as
/// sd_watchdog_enabled(3) advises.
pub fn watchdog_interval() -> Option<Duration> {
    sd_notify::watchdog_enabled()
        .map(|limit| limit / 2)
        .filter(|every| !every.is_zero())
}

pub fn pet_watchdog() {
    send(&[NotifyState::Watchdog]);
}
