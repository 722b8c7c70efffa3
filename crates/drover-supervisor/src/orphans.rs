//! What workers leave behind when they end: drover as their parent of last resort.
//!
//! As a container's first process (`CMD ["drover", "run", ...]`: PID 1 in its PID
//! namespace), the kernel gives drover every process whose parent ends first: the app
//! below `npm start` once npm has exited on a stop, whatever an app started and left
//! behind. Each stays a zombie, holding its process id, until its new parent reaps it.
//! drover reaped only the workers it started, so every reload, restart and scale-down
//! left such zombies behind (2 per reload of `npm start` workers): a crash-looping app
//! would fill the container's process table within hours. As PID 1, drover reaps them,
//! as tini and `docker run --init` do.
//!
//! Elsewhere drover running apps is their subreaper (`PR_SET_CHILD_SUBREAPER`, as
//! systemd's user manager and tini -s are), for a program that daemonizes (`rackup -D`,
//! a `--daemon` flag, a double fork with `setsid`): the process that serves leaves the
//! worker's process group, which is what drover stops, and its parent exits. drover
//! took that for a crash and started another, which did the same: 34 daemons of
//! `rackup -D` ran, orphaned, after 30 s, and all of them after drover stopped, where
//! systemd stops them with their cgroup (Ruby seat). Re-parented to drover, they are
//! found by the worker id and app in their environment (`left_behind`) when the worker
//! ends, and stopped, and the log says the program daemonized.
//!
//! drover's own workers are reaped by tokio, which waits for each by its pid; reaping
//! one first would take its exit status away. So this reaps only the zombies that are
//! not workers drover started (`SPAWNED`), one pid at a time, never `waitpid(-1)`, and
//! only once they have been zombies for a second: a child that drover waits for
//! otherwise (`node -e` reading an ecosystem file) is reaped by its waiter at once.

use nix::sys::wait::{waitpid, WaitPidFlag};
use nix::unistd::Pid;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// The pids of the workers drover started and has not dropped. A spawn holds the lock
/// from the fork until its pid is in, so a scan never sees a worker that is not.
static SPAWNED: Mutex<BTreeSet<u32>> = Mutex::new(BTreeSet::new());

/// How often the reaper looks even without a SIGCHLD (signals of a burst of exits
/// merge into one).
const SCAN_EVERY: Duration = Duration::from_secs(1);

/// How long a zombie is left to a waiter of drover's own before the reaper takes it.
const LEFT_FOR: Duration = Duration::from_secs(1);

/// The set of spawned workers, locked (a panic while it was held leaves it usable: it
/// holds plain pids).
pub(crate) fn spawned() -> MutexGuard<'static, BTreeSet<u32>> {
    SPAWNED.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Forgets worker `pid`: it has been dropped, and tokio has reaped it or will.
pub(crate) fn forget(pid: u32) {
    spawned().remove(&pid);
}

/// Makes drover the parent of last resort of what its workers start, when it runs
/// apps (`runs_apps`), and then, or when drover is PID 1, starts reaping the zombies
/// re-parented to it, on every SIGCHLD and every second, for as long as the runtime
/// runs. Otherwise their parent is the system's init, which reaps them.
pub fn adopt_orphans(runs_apps: bool) {
    let subreaper = runs_apps
        && nix::sys::prctl::set_child_subreaper(true)
            .map_err(|e| {
                tracing::warn!(
                    "cannot become the subreaper of the workers' processes ({e}): a \
                     program that daemonizes is not found when its worker ends"
                )
            })
            .is_ok();
    if std::process::id() != 1 && !subreaper {
        return;
    }
    tokio::spawn(async {
        let mut exits = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child())
            .map_err(|e| {
                tracing::warn!("cannot watch for SIGCHLD ({e}); reaping every {SCAN_EVERY:?}")
            })
            .ok();
        let mut seen = BTreeMap::new();
        loop {
            let zombies = zombie_children(std::process::id());
            let reaped = reap(aged(&mut seen, zombies, Instant::now()));
            if reaped > 0 {
                tracing::debug!(reaped, "reaped processes re-parented to drover");
            }
            match exits.as_mut() {
                Some(exits) => {
                    let _ = tokio::time::timeout(SCAN_EVERY, exits.recv()).await;
                }
                None => tokio::time::sleep(SCAN_EVERY).await,
            }
        }
    });
}

/// A process a worker started that outlived it outside its process group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LeftBehind {
    pub pid: u32,
    /// Its command line, arguments joined by spaces (cut at `SHOWN_COMMAND` bytes).
    pub command: String,
}

/// How much of a left-behind process's command line the log shows.
const SHOWN_COMMAND: usize = 120;

/// The live processes re-parented to drover that worker `id` of `app` started (their
/// environment names both, as drover gave it to the worker), other than drover's own
/// workers. Empty when /proc cannot be read.
pub(crate) fn left_behind(app: &str, id: usize) -> Vec<LeftBehind> {
    let ours = std::process::id();
    let (app_var, id_var) = (
        format!("DROVER_APP={app}"),
        format!("DROVER_WORKER_ID={id}"),
    );
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let candidates: Vec<u32> = dir
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| live_child_of(pid, ours))
        .collect();
    let spawned = spawned();
    candidates
        .into_iter()
        .filter(|pid| !spawned.contains(pid))
        .filter(|pid| {
            let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ")) else {
                return false;
            };
            let vars = || environ.split(|&b| b == 0);
            vars().any(|v| v == app_var.as_bytes()) && vars().any(|v| v == id_var.as_bytes())
        })
        .map(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let mut command = String::from_utf8_lossy(&cmdline)
                .trim_end_matches('\0')
                .replace('\0', " ");
            if command.len() > SHOWN_COMMAND {
                let cut = (0..=SHOWN_COMMAND)
                    .rev()
                    .find(|&i| command.is_char_boundary(i))
                    .unwrap_or(0);
                command.truncate(cut);
                command.push_str("...");
            }
            LeftBehind { pid, command }
        })
        .collect()
}

/// Whether `pid` is alive (not a zombie) and `parent`'s child, from /proc.
fn live_child_of(pid: u32, parent: u32) -> bool {
    crate::cpu::Stat::of(pid).is_some_and(|s| s.state != 'Z' && s.parent == parent)
}

/// Stops what worker `id` of `app` left behind (`left_behind`): SIGTERM, up to `grace`
/// for each to exit, then SIGKILL, and reaps each (they are drover's children). Returns
/// what it found.
pub(crate) async fn stop_left_behind(app: &str, id: usize, grace: Duration) -> Vec<LeftBehind> {
    use nix::sys::signal::{kill, Signal};
    let left = left_behind(app, id);
    if left.is_empty() {
        return left;
    }
    let pids: Vec<Pid> = left.iter().map(|l| Pid::from_raw(l.pid as i32)).collect();
    // Each is drover's unreaped child until reaped below: its pid is not reused meanwhile.
    for &pid in &pids {
        let _ = kill(pid, Signal::SIGTERM);
    }
    let mut running = reap_exited(pids);
    let deadline = tokio::time::Instant::now() + grace;
    while !running.is_empty() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(REAP_POLL).await;
        running = reap_exited(running);
    }
    for &pid in &running {
        let _ = kill(pid, Signal::SIGKILL);
    }
    let deadline = tokio::time::Instant::now() + KILLED_WAIT;
    while !running.is_empty() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(REAP_POLL).await;
        running = reap_exited(running);
    }
    left
}

/// How often `stop_left_behind` looks whether what it signalled has exited.
const REAP_POLL: Duration = Duration::from_millis(20);

/// How long `stop_left_behind` waits for SIGKILLed processes to be reapable.
const KILLED_WAIT: Duration = Duration::from_secs(2);

/// Reaps each of `pids` that has exited; the ones still running. (One already reaped,
/// by the reaper's scan, is gone too.)
fn reap_exited(pids: Vec<Pid>) -> Vec<Pid> {
    pids.into_iter()
        .filter(
            |&pid| matches!(waitpid(pid, Some(WaitPidFlag::WNOHANG)), Ok(s) if s.pid().is_none()),
        )
        .collect()
}

/// Of `zombies`, the ones `seen` (when each was first seen) has known for `LEFT_FOR`;
/// `seen` keeps the others.
fn aged(seen: &mut BTreeMap<u32, Instant>, zombies: Vec<u32>, now: Instant) -> Vec<u32> {
    seen.retain(|pid, _| zombies.contains(pid));
    zombies
        .into_iter()
        .filter(|pid| now.duration_since(*seen.entry(*pid).or_insert(now)) >= LEFT_FOR)
        .collect()
}

/// Reaps each of `zombies` that is not one of drover's workers; how many.
fn reap(zombies: Vec<u32>) -> usize {
    let spawned = spawned();
    zombies
        .into_iter()
        .filter(|pid| !spawned.contains(pid))
        .filter(|&pid| {
            let pid = Pid::from_raw(pid as i32);
            matches!(waitpid(pid, Some(WaitPidFlag::WNOHANG)), Ok(s) if s.pid() == Some(pid))
        })
        .count()
}

/// The zombies whose parent is `parent`, from /proc (none when it cannot be read).
fn zombie_children(parent: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| {
            crate::cpu::Stat::of(pid).is_some_and(|s| s.state == 'Z' && s.parent == parent)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_zombie_child_is_found_and_a_spawned_one_is_left_to_its_waiter() {
        let mut left = std::process::Command::new("true").spawn().unwrap();
        let mut spawned_one = std::process::Command::new("true").spawn().unwrap();
        spawned().insert(spawned_one.id());
        let ours = std::process::id();
        let both_zombies = || {
            let z = zombie_children(ours);
            z.contains(&left.id()) && z.contains(&spawned_one.id())
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !both_zombies() {
            assert!(std::time::Instant::now() < deadline, "no zombies seen");
            std::thread::sleep(Duration::from_millis(10));
        }
        // Only these two: other tests' children are their own to wait for.
        let ids = [left.id(), spawned_one.id()];
        let zombies = zombie_children(ours)
            .into_iter()
            .filter(|p| ids.contains(p));
        assert_eq!(reap(zombies.collect()), 1);
        assert!(!zombie_children(ours).contains(&left.id()));
        // A zombie is left to a waiter for a second.
        let mut seen = BTreeMap::new();
        let t0 = Instant::now();
        assert!(aged(&mut seen, vec![7, 8], t0).is_empty());
        assert_eq!(aged(&mut seen, vec![8, 9], t0 + LEFT_FOR), [8]);
        assert_eq!(seen.keys().copied().collect::<Vec<_>>(), [8, 9]);
        // The spawned one is still its waiter's to reap.
        assert!(spawned_one.wait().unwrap().success());
        forget(spawned_one.id());
        // `left` was reaped here: its own waiter finds nothing to wait for.
        assert!(left.wait().is_err());
    }
}
