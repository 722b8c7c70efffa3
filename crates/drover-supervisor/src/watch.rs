//! PM2's `watch`: the app is reloaded when its files change (`pm2 start app.js --watch`,
//! `watch: true` in an ecosystem file). PM2 restarts the app; drover reloads it rolling,
//! one worker at a time, so a saved file costs no client a request.
//!
//! The files are watched with Linux's inotify (nix), one watch per directory, added
//! again as directories appear. By hand rather than with the `notify` crate: one kernel
//! interface, a few dozen lines, and no thread of its own: the kernel queues the events
//! and drover reads the nonblocking descriptor every `POLL` (registering it with tokio's
//! reactor would take `unsafe`, for no gain at this pace).

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};
use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How often the queued events are read.
const POLL: Duration = Duration::from_millis(100);

/// What to watch, and how long to wait after a change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchSpec {
    /// Files and directories (directories with everything below them). Relative ones
    /// are the app's working directory's.
    pub paths: Vec<PathBuf>,
    /// Names and relative paths left alone (`node_modules`, `logs`, `public/img`): a
    /// path with one of these as a component, or below one of these. Empty: PM2's
    /// default, `node_modules` and every name that starts with a dot, and the files an
    /// app writes as it serves (`DATA_FILES`).
    pub ignore: Vec<String>,
    /// How long the files must stay quiet after a change before the reload (PM2's
    /// `watch_delay`): saving a project writes many files.
    pub delay: Duration,
}

/// PM2's `watch_delay` default.
pub const DEFAULT_WATCH_DELAY: Duration = Duration::from_millis(1000);

/// Endings of the files an app writes as it serves, left alone by default: a log it
/// appends to on every request (`fs.appendFileSync('requests.log', ...)`), SQLite's
/// database and the journal it makes and removes at each write. Each such write
/// postponed the reload by `delay`, so under load a saved file was never applied (and
/// under PM2, whose default watches them, the app restarted at every request: 297 of
/// 461 failed). No code of any language ends so.
const DATA_FILES: [&str; 7] = [
    ".log", ".db", ".sqlite", ".sqlite3", "-journal", "-wal", "-shm",
];

/// How many delays' worth changes may keep postponing a reload before drover says
/// which files keep changing (see `FileWatcher::changed`): 10 s at PM2's default.
const POSTPONED_NOTE_AFTER: u32 = 10;

impl WatchSpec {
    /// Watches `paths` with PM2's default ignores and delay.
    pub fn new(paths: Vec<PathBuf>) -> WatchSpec {
        WatchSpec {
            paths,
            ignore: Vec::new(),
            delay: DEFAULT_WATCH_DELAY,
        }
    }

    /// Whether `path` (relative to a watched root) is left alone.
    pub fn ignores(&self, path: &Path) -> bool {
        let names: Vec<&str> = path
            .components()
            .filter_map(|c| c.as_os_str().to_str())
            .collect();
        if self.ignore.is_empty() {
            let data = names
                .last()
                .is_some_and(|name| DATA_FILES.iter().any(|end| name.ends_with(end)));
            return data
                || names.iter().any(|n| {
                    *n == "node_modules" || (n.starts_with('.') && *n != "." && *n != "..")
                });
        }
        self.ignore.iter().any(|entry| {
            let entry = entry.trim_start_matches("./").trim_end_matches('/');
            let parts: Vec<&str> = entry.split('/').filter(|p| !p.is_empty()).collect();
            match parts.as_slice() {
                [] => false,
                [one] => names.contains(one),
                many => names.starts_with(many),
            }
        })
    }
}

/// The changes inotify reports that mean a file was written, added or removed.
fn interesting() -> AddWatchFlags {
    AddWatchFlags::IN_CLOSE_WRITE
        | AddWatchFlags::IN_CREATE
        | AddWatchFlags::IN_DELETE
        | AddWatchFlags::IN_MOVED_FROM
        | AddWatchFlags::IN_MOVED_TO
        | AddWatchFlags::IN_DONT_FOLLOW
}

/// Watches the files of a `WatchSpec`.
pub struct FileWatcher {
    inotify: Inotify,
    /// Each watch's directory (or file), and the root it is under.
    watched: HashMap<WatchDescriptor, (PathBuf, PathBuf)>,
    spec: WatchSpec,
}

impl FileWatcher {
    /// Watches `spec`'s paths (relative ones under `cwd`). Fails naming the path that
    /// cannot be watched (missing, unreadable, or over the system's inotify limit).
    pub fn new(spec: WatchSpec, cwd: &Path) -> io::Result<FileWatcher> {
        let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)?;
        let mut watcher = FileWatcher {
            inotify,
            watched: HashMap::new(),
            spec: spec.clone(),
        };
        for path in &spec.paths {
            let root = if path == Path::new(".") {
                cwd.to_path_buf()
            } else {
                cwd.join(path)
            };
            let meta = std::fs::metadata(&root)
                .map_err(|e| io::Error::new(e.kind(), format!("watch {}: {e}", root.display())))?;
            if meta.is_dir() {
                watcher.add_tree(&root, &root)?;
            } else {
                watcher.add(&root, &root)?;
            }
        }
        Ok(watcher)
    }

    fn add(&mut self, path: &Path, root: &Path) -> io::Result<()> {
        let wd = self.inotify.add_watch(path, interesting()).map_err(|e| {
            let hint = if e == nix::errno::Errno::ENOSPC {
                " (the system's inotify watch limit, fs.inotify.max_user_watches: ignore \
                     more with ignore_watch)"
            } else {
                ""
            };
            io::Error::other(format!("watch {}: {e}{hint}", path.display()))
        })?;
        self.watched
            .insert(wd, (path.to_path_buf(), root.to_path_buf()));
        Ok(())
    }

    /// `dir` and every directory below it that is not ignored.
    fn add_tree(&mut self, dir: &Path, root: &Path) -> io::Result<()> {
        self.add(dir, root)?;
        let Ok(entries) = std::fs::read_dir(dir) else {
            return Ok(());
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
            if is_dir && !self.spec.ignores(path.strip_prefix(root).unwrap_or(&path)) {
                self.add_tree(&path, root)?;
            }
        }
        Ok(())
    }

    /// Waits for a change to a file that is not ignored, then until the files have
    /// been quiet for the spec's delay; the changed paths, first few first. Files that
    /// keep changing (what the app itself writes, unless ignored) postpone it for as
    /// long as they do: after `POSTPONED_NOTE_AFTER` delays, `postponed` hears once
    /// which changed last, so the user learns why a saved file is not applied.
    pub async fn changed(
        &mut self,
        mut postponed: impl FnMut(&[PathBuf]),
    ) -> io::Result<Vec<PathBuf>> {
        let mut changed = Vec::new();
        while changed.is_empty() {
            self.read_into(&mut changed, &mut Vec::new()).await?;
        }
        let first = tokio::time::Instant::now();
        let delay = self.spec.delay;
        let mut quiet_from = first;
        let mut noted = false;
        loop {
            let mut recent = Vec::new();
            let read = self.read_into(&mut changed, &mut recent);
            match tokio::time::timeout_at(quiet_from + delay, read).await {
                Ok(read) => read?,
                Err(_) => return Ok(changed),
            }
            // Only a change that counts puts the reload off: ignored files written
            // all the time (a log) did too, before, and it never came.
            if recent.is_empty() {
                continue;
            }
            quiet_from = tokio::time::Instant::now();
            if !noted && first.elapsed() >= delay * POSTPONED_NOTE_AFTER {
                noted = true;
                postponed(&recent);
            }
        }
    }

    /// Reads one batch of events, adding the paths that count to `changed` (the first
    /// 16) and to `recent`.
    async fn read_into(
        &mut self,
        changed: &mut Vec<PathBuf>,
        recent: &mut Vec<PathBuf>,
    ) -> io::Result<()> {
        let events = loop {
            match self.inotify.read_events() {
                Ok(events) => break events,
                Err(nix::errno::Errno::EAGAIN) => tokio::time::sleep(POLL).await,
                Err(e) => return Err(e.into()),
            }
        };
        for event in events {
            let Some((dir, root)) = self.watched.get(&event.wd).cloned() else {
                continue;
            };
            let path = match &event.name {
                Some(name) => dir.join(name),
                None => dir.clone(),
            };
            if self.spec.ignores(path.strip_prefix(&root).unwrap_or(&path)) {
                continue;
            }
            let new_dir = event.mask.contains(AddWatchFlags::IN_ISDIR)
                && event
                    .mask
                    .intersects(AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO);
            if new_dir {
                // Its files are watched from now on; one that fails (gone again) is
                // simply not.
                let _ = self.add_tree(&path, &root);
            }
            if recent.len() < 16 && !recent.contains(&path) {
                recent.push(path.clone());
            }
            if changed.len() < 16 && !changed.contains(&path) {
                changed.push(path);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn by_default_node_modules_and_dot_names_are_ignored_and_else_what_is_named() {
        let default = WatchSpec::new(vec![".".into()]);
        assert!(default.ignores(Path::new("node_modules/x/index.js")));
        assert!(default.ignores(Path::new(".git/index")));
        assert!(default.ignores(Path::new("src/.app.js.swp")));
        assert!(!default.ignores(Path::new("src/app.js")));
        assert!(!default.ignores(Path::new("./app.js")));
        // What an app writes as it serves.
        assert!(default.ignores(Path::new("requests.log")));
        assert!(default.ignores(Path::new("data/app.db-journal")));
        assert!(default.ignores(Path::new("app.sqlite3")));
        assert!(!default.ignores(Path::new("src/login.js")));
        assert!(!default.ignores(Path::new("logs.js")));

        let mut named = default.clone();
        named.ignore = vec!["logs".into(), "./public/img/".into()];
        assert!(named.ignores(Path::new("logs/today.log")));
        assert!(named.ignores(Path::new("src/logs/x")));
        assert!(named.ignores(Path::new("public/img/a.png")));
        assert!(!named.ignores(Path::new("public/app.js")));
        // Named ignores replace the default, as in PM2.
        assert!(!named.ignores(Path::new("node_modules/x/index.js")));
        assert!(!named.ignores(Path::new("requests.log")));
    }

    #[tokio::test]
    async fn a_write_below_a_watched_directory_is_seen_once_quiet_and_ignored_ones_are_not() {
        let dir = std::env::temp_dir().join(format!("drover-watch-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("src")).unwrap();
        std::fs::create_dir_all(dir.join("node_modules/dep")).unwrap();
        let mut spec = WatchSpec::new(vec![".".into()]);
        spec.delay = Duration::from_millis(100);
        let mut watcher = FileWatcher::new(spec, &dir).unwrap();

        std::fs::write(dir.join("node_modules/dep/index.js"), "x").unwrap();
        std::fs::write(dir.join("src/app.js"), "x").unwrap();
        let changed = watcher.changed(|_| {}).await.unwrap();
        assert_eq!(changed, vec![dir.join("src/app.js")]);

        // A directory made after the start is watched too.
        std::fs::create_dir_all(dir.join("src/routes")).unwrap();
        let _ = watcher.changed(|_| {}).await.unwrap();
        std::fs::write(dir.join("src/routes/a.js"), "x").unwrap();
        let changed = tokio::time::timeout(Duration::from_secs(5), watcher.changed(|_| {}))
            .await
            .expect("the new directory's file is seen")
            .unwrap();
        assert!(
            changed.contains(&dir.join("src/routes/a.js")),
            "{changed:?}"
        );

        // Changes that keep coming postpone the reload, and are named once (after 10
        // delays of 300 ms; each write comes 50 ms after the last, for 4 s).
        let mut spec = WatchSpec::new(vec![".".into()]);
        spec.delay = Duration::from_millis(300);
        let mut watcher = FileWatcher::new(spec, &dir).unwrap();
        let busy = dir.join("src/busy.txt");
        let writer = tokio::spawn(async move {
            for i in 0..80 {
                std::fs::write(&busy, format!("{i}")).unwrap();
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
        let mut named: Vec<Vec<PathBuf>> = Vec::new();
        let changed = tokio::time::timeout(
            Duration::from_secs(10),
            watcher.changed(|recent| named.push(recent.to_vec())),
        )
        .await
        .expect("quiet once the writes stop")
        .unwrap();
        writer.await.unwrap();
        assert_eq!(changed, vec![dir.join("src/busy.txt")]);
        assert_eq!(named, vec![vec![dir.join("src/busy.txt")]]);

        let missing = FileWatcher::new(WatchSpec::new(vec!["nope".into()]), &dir)
            .err()
            .unwrap();
        assert!(missing.to_string().contains("watch "), "{missing}");
        assert!(missing.to_string().contains("nope"), "{missing}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
