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

/// A listening socket systemd passed (socket activation), with what it is.
pub struct Passed {
    pub socket: drover_config::preflight::PassedSocket,
    pub listener: std::net::TcpListener,
}

/// Takes the listening sockets systemd passed this process (`LISTEN_FDS`, for this
/// `LISTEN_PID`), each with its `FileDescriptorName=`; none when not socket-activated.
/// Each must be a TCP socket that listens: anything else is refused by its number
/// and name. Taken once; a second call finds none.
pub fn passed_listeners() -> Result<Vec<Passed>, String> {
    static TAKEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if TAKEN.swap(true, std::sync::atomic::Ordering::SeqCst) {
        return Ok(Vec::new());
    }
    // sd-notify checks LISTEN_PID against this process and marks each descriptor
    // close-on-exec, so workers never inherit them.
    let fds = sd_notify::listen_fds_with_names()
        .map_err(|e| format!("socket activation (LISTEN_FDS): {e}"))?;
    let mut passed = Vec::new();
    for (fd, name) in fds {
        let socket = adopt(fd);
        let what = |why: &str| format!("systemd passed descriptor {fd} ({name:?}): {why}");
        match socket.r#type() {
            Ok(socket2::Type::STREAM) => {}
            Ok(_) => {
                return Err(what(
                    "not a stream socket (drover takes ListenStream= only)",
                ))
            }
            Err(e) => return Err(what(&format!("not a socket: {e}"))),
        }
        let addr = socket
            .local_addr()
            .ok()
            .and_then(|a| a.as_socket())
            .ok_or_else(|| what("not an IPv4 or IPv6 socket"))?;
        if !socket.is_listener().map_err(|e| what(&e.to_string()))? {
            return Err(what("not listening"));
        }
        socket
            .set_nonblocking(true)
            .map_err(|e| what(&e.to_string()))?;
        passed.push(Passed {
            socket: drover_config::preflight::PassedSocket { name, addr },
            listener: socket.into(),
        });
    }
    Ok(passed)
}

/// Owns a descriptor systemd passed.
#[allow(unsafe_code)]
fn adopt(fd: std::os::fd::RawFd) -> socket2::Socket {
    use std::os::fd::FromRawFd;
    // SAFETY: sd_listen_fds(3)'s protocol gives this process descriptors 3 ..
    // 3 + LISTEN_FDS, open and owned by nobody else in it; `passed_listeners` takes
    // them once (TAKEN), so no two owners close the same descriptor.
    unsafe { socket2::Socket::from_raw_fd(fd) }
}
