//! One worker process: a free port, spawning, and stopping it (SIGTERM, then SIGKILL).
//!
//! Children stay in drover's process group and die with drover: through `kill_on_drop`
//! and the explicit stop on shutdown, and, when drover itself is killed with SIGKILL
//! (nothing of drover runs then), through Linux's parent-death signal, set in each
//! child before it execs (`die_with_drover`).
//!
//! Staying in drover's process group means Ctrl-C at a terminal sends SIGINT to the
//! workers too, not only to drover. Workers that exit on it are not restarted as long as
//! drover begins `Supervisor::shutdown` within the back-off delay (100 ms by default),
//! since a slot checks for shutdown before every restart.

use crate::spec::AppSpec;
use command_fds::{CommandFdExt, FdMapping};
use std::collections::BTreeSet;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::process::{ExitStatus, Stdio};
use std::sync::Mutex;
use std::time::Duration;
use tokio::process::{Child, Command};

/// Ports handed to live workers of every app in this process. The kernel only promises
/// that a port is free while we hold the listener; after we drop it, a second pick could
/// return the same port before the first worker binds it. Remembering our own picks rules
/// that out among drover's workers (other programs can still race us, rarely).
static RESERVED: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());

/// A loopback port picked for one worker, released when dropped.
#[derive(Debug)]
pub(crate) struct Port(u16);

impl Port {
    pub(crate) fn pick() -> io::Result<Port> {
        // A handful of tries: the kernel hands out ports in a wide range, so a repeat of
        // one of ours is rare and two in a row rarer still.
        for _ in 0..16 {
            let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
                .local_addr()?
                .port();
            if reserved().insert(port) {
                return Ok(Port(port));
            }
        }
        Err(io::Error::new(
            io::ErrorKind::AddrInUse,
            "no free loopback port",
        ))
    }

    pub(crate) fn get(&self) -> u16 {
        self.0
    }

    pub(crate) fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.0))
    }
}

impl Drop for Port {
    fn drop(&mut self) {
        reserved().remove(&self.0);
    }
}

fn reserved() -> std::sync::MutexGuard<'static, BTreeSet<u16>> {
    RESERVED.lock().unwrap_or_else(|e| e.into_inner())
}

/// Where a new worker listens.
pub(crate) enum Listen<'a> {
    /// Its own loopback port, passed as `PORT`.
    Port(u16),
    /// drover's listening socket, passed as fd 3 the way systemd's socket activation
    /// does (`LISTEN_FDS=1`, `LISTEN_PID`, `LISTEN_FDNAMES`).
    Socket(&'a TcpListener),
}

/// Spawns worker `id` of `spec`, with both output pipes captured.
pub(crate) fn spawn(spec: &AppSpec, id: usize, listen: Listen<'_>) -> io::Result<Child> {
    let (program, args) = spec
        .command
        .split_first()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "empty command"))?;
    let mut cmd = match listen {
        Listen::Port(port) => {
            let mut cmd = Command::new(program);
            cmd.args(args).envs(&spec.env).env("PORT", port.to_string());
            cmd
        }
        Listen::Socket(socket) => {
            // LISTEN_PID must be the worker's own pid, which is only known after the
            // fork. A shell sets it to its `$$` and execs the program, which keeps that
            // pid; the alternative, setting it between fork and exec, needs unsafe code.
            let mut cmd = Command::new("/bin/sh");
            cmd.arg("-c")
                .arg(r#"LISTEN_PID=$$; export LISTEN_PID; exec "$@""#)
                .arg(program)
                .arg(program)
                .args(args)
                .envs(&spec.env)
                .env("LISTEN_FDS", "1")
                .env("LISTEN_FDNAMES", "http")
                .env_remove("PORT");
            let fd = socket.try_clone()?.into();
            cmd.fd_mappings(vec![FdMapping {
                parent_fd: fd,
                child_fd: 3,
            }])
            .map_err(|e| io::Error::other(e.to_string()))?;
            cmd
        }
    };
    cmd.env("DROVER_WORKER_ID", id.to_string())
        .env("DROVER_APP", &spec.name)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // If the task holding the child is dropped (runtime shutdown, panic), the child
        // gets SIGKILL instead of outliving drover.
        .kill_on_drop(true);
    if let Some(dir) = &spec.cwd {
        cmd.current_dir(dir);
    }
    die_with_drover(&mut cmd);
    cmd.spawn()
}

/// Makes the kernel SIGKILL the worker when drover dies, however drover dies.
///
/// The one `unsafe` block in drover. The need: "children die with drover" must hold
/// even for `kill -9 drover` (an OOM kill, a crashed container init), which no code in
/// drover survives to handle; without this, every worker of a killed drover keeps its
/// port and CPU until someone finds it. `PR_SET_PDEATHSIG` has to be set by the child
/// itself, between fork and exec, and std only offers that spot through `pre_exec`.
#[allow(unsafe_code)]
fn die_with_drover(cmd: &mut Command) {
    use nix::sys::prctl::set_pdeathsig;
    use nix::sys::signal::Signal;
    use nix::unistd::{getppid, Pid};
    let drover = Pid::this();
    // SAFETY: the closure runs in the forked child, where only async-signal-safe calls
    // are sound. It calls prctl(2) and getppid(2) through nix, which are plain syscalls,
    // and builds an io::Error from an errno, which does not allocate. It touches no lock
    // and no memory shared with other threads of drover.
    unsafe {
        cmd.pre_exec(move || {
            set_pdeathsig(Signal::SIGKILL).map_err(|e| io::Error::from_raw_os_error(e as i32))?;
            // drover may have died between fork and prctl, before the signal was armed.
            if getppid() != drover {
                return Err(io::Error::from_raw_os_error(
                    nix::errno::Errno::ESRCH as i32,
                ));
            }
            Ok(())
        });
    }
}

/// Stops `child`: SIGTERM, up to `grace` to exit, then SIGKILL. Always reaps it, so no
/// zombie is left. Returns how it ended (None if waiting failed, which tokio only
/// reports for a child that was already reaped).
pub(crate) async fn stop(child: &mut Child, grace: Duration) -> Option<ExitStatus> {
    if let Ok(Some(status)) = child.try_wait() {
        return Some(status);
    }
    // `id()` is Some until the child is reaped, and only we reap it, so the pid cannot
    // have been recycled for another process yet.
    let terminated = match child.id() {
        Some(pid) => send_term(pid).await,
        None => false,
    };
    if terminated {
        if let Ok(result) = tokio::time::timeout(grace, child.wait()).await {
            return result.ok();
        }
        tracing::warn!(
            pid = child.id(),
            "worker did not exit within {grace:?} of SIGTERM; sending SIGKILL"
        );
    }
    let _ = child.start_kill();
    child.wait().await.ok()
}

/// Sends SIGTERM by running `kill`: std and tokio only offer SIGKILL, and the `nix` or
/// `libc` route would need unsafe code or a new dependency for one call on a slow path.
async fn send_term(pid: u32) -> bool {
    let status = Command::new("kill")
        .arg("-TERM")
        .arg(pid.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .await;
    match status {
        Ok(s) if s.success() => true,
        Ok(s) => {
            tracing::debug!(pid, "kill -TERM failed: {s}");
            false
        }
        Err(e) => {
            tracing::warn!(
                pid,
                "cannot run kill(1) to send SIGTERM, using SIGKILL: {e}"
            );
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picked_ports_are_distinct_until_released() {
        let ports: Vec<Port> = (0..50).map(|_| Port::pick().unwrap()).collect();
        let distinct: BTreeSet<u16> = ports.iter().map(Port::get).collect();
        assert_eq!(distinct.len(), ports.len());
        let first = ports[0].get();
        drop(ports);
        assert!(!reserved().contains(&first));
    }
}
