//! drover as a container's first process (`CMD ["drover", "run", ...]`: PID 1 in its
//! PID namespace). The kernel gives PID 1 every process whose parent ends first: the
//! app below `npm start` once npm has exited on a stop, whatever an app started and
//! left behind. Each stays a zombie, holding its process id, until its new parent
//! reaps it. drover reaped only the workers it started, so every reload, restart and
//! scale-down left such zombies behind (2 per reload of `npm start` workers): a
//! crash-looping app would fill the container's process table within hours. As PID 1,
//! drover reaps them, as tini and `docker run --init` do.
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

/// When drover is PID 1, starts reaping the zombies re-parented to it, on every
/// SIGCHLD and every second, for as long as the runtime runs. Elsewhere their
/// parent is the system's init, which reaps them: nothing to do.
pub fn reap_orphans_as_init() {
    if std::process::id() != 1 {
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
                tracing::debug!(reaped, "reaped processes re-parented to drover (PID 1)");
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
        .filter(|pid| {
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                return false;
            };
            // After the command name (in parentheses, may hold spaces): state, ppid.
            let Some((_, rest)) = stat.rsplit_once(')') else {
                return false;
            };
            let mut fields = rest.split_ascii_whitespace();
            let zombie = fields.next() == Some("Z");
            zombie && fields.next().and_then(|p| p.parse::<u32>().ok()) == Some(parent)
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
