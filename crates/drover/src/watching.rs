//! PM2's `watch`, wired: each app whose spec says `watch` is reloaded (rolling, through
//! the controller, as `drover ctl reload --app NAME` does) once its files change and
//! have been quiet for the watch delay. A reload of drover's file that adds an app, or
//! changes an app's watch settings, watches from then on as it says.

use crate::control::Controller;
use drover_supervisor::watch::{FileWatcher, WatchSpec};
use drover_supervisor::AppSpec;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use tokio::task::JoinHandle;

/// The files of one app, watched from before it starts.
pub(crate) struct AppFiles {
    app: String,
    spec: WatchSpec,
    watcher: FileWatcher,
    cwd: PathBuf,
}

/// What a reload changes in what is watched: an app's files as its new settings say,
/// or (`None`) no longer any.
pub(crate) type Rewatch = Vec<(String, Option<AppFiles>)>;

/// The apps whose files are watched now, each with what it watches and the task that
/// reloads it.
#[derive(Default)]
pub(crate) struct Watches {
    control: OnceLock<Weak<Controller>>,
    running: Mutex<BTreeMap<String, (Watched, JoinHandle<()>)>>,
}

/// What an app's files are: its watch settings, relative to its directory.
type Watched = (WatchSpec, PathBuf);

impl Watches {
    /// From now on, each app of `watched` is reloaded through `control` after its files
    /// change.
    pub(crate) fn start(&self, control: &Arc<Controller>, watched: Vec<AppFiles>) {
        let _ = self.control.set(Arc::downgrade(control));
        self.apply(
            watched
                .into_iter()
                .map(|f| (f.app.clone(), Some(f)))
                .collect(),
        );
    }

    /// What changes for the apps of `specs` (a reload's), their files watched already,
    /// so that a path that cannot be watched fails the reload before anything changes.
    /// `gone`: apps the reload stops, no longer watched.
    pub(crate) fn prepare<'a>(
        &self,
        specs: impl IntoIterator<Item = &'a AppSpec>,
        gone: &[String],
    ) -> Result<Rewatch, String> {
        let running = self.lock();
        let now = |name: &str| running.get(name).map(|(watched, _)| watched.clone());
        let mut changes = Vec::new();
        for spec in specs {
            let wanted = match &spec.watch {
                Some(watch) => Some((watch.clone(), app_dir(spec)?)),
                None => None,
            };
            if now(&spec.name) == wanted {
                continue;
            }
            let files = watch_files([spec])?.pop();
            changes.push((spec.name.clone(), files));
        }
        for name in gone {
            if now(name).is_some() {
                changes.push((name.clone(), None));
            }
        }
        Ok(changes)
    }

    /// Applies what `prepare` found (once the reload has applied the rest).
    pub(crate) fn apply(&self, changes: Rewatch) {
        let control = self.control.get().cloned().unwrap_or_default();
        let mut running = self.lock();
        for (app, files) in changes {
            if let Some((_, task)) = running.remove(&app) {
                task.abort();
            }
            if let Some(files) = files {
                let watched = (files.spec.clone(), files.cwd.clone());
                let task = tokio::spawn(reload_each_change(control.clone(), files));
                running.insert(app, (watched, task));
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, (Watched, JoinHandle<()>)>> {
        self.running.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Watches the files of every app of `specs` that asks for it, before any starts.
/// Fails, naming the app and the path, when one cannot be watched.
pub(crate) fn watch_files<'a>(
    specs: impl IntoIterator<Item = &'a AppSpec>,
) -> Result<Vec<AppFiles>, String> {
    let mut watched = Vec::new();
    for spec in specs {
        let Some(watch) = spec.watch.clone() else {
            continue;
        };
        let cwd = app_dir(spec)?;
        let watcher = FileWatcher::new(watch.clone(), &cwd)
            .map_err(|e| format!("app {:?}: cannot {e}", spec.name))?;
        watched.push(AppFiles {
            app: spec.name.clone(),
            spec: watch,
            watcher,
            cwd,
        });
    }
    Ok(watched)
}

async fn reload_each_change(control: Weak<Controller>, files: AppFiles) {
    let AppFiles {
        app,
        mut watcher,
        cwd,
        spec,
    } = files;
    let delay = spec.delay;
    loop {
        let postponed = |recent: &[PathBuf]| {
            drover_spool::eprintln!(
                "drover: app {app:?}: files keep changing ({}): the reload waits until they \
                 are quiet for {:?}; if the app writes them itself, name them in \
                 ignore_watch (pm2's --ignore-watch)",
                shown(recent, &cwd),
                delay,
            );
        };
        let changed = match watcher.changed(postponed).await {
            Ok(changed) => changed,
            Err(e) => {
                drover_spool::eprintln!("drover: app {app:?}: watching its files failed ({e}); no more reloads on changes");
                return;
            }
        };
        let Some(control) = control.upgrade() else {
            return;
        };
        if !control.apps().iter().any(|a| a.name() == app) {
            return;
        }
        drover_spool::eprintln!(
            "drover: app {app:?}: {} changed; reloading",
            shown(&changed, &cwd)
        );
        match control.reload(Some(app.clone())).await {
            Ok(_) => drover_spool::eprintln!("drover: app {app:?} reloaded after the change"),
            Err(e) => drover_spool::eprintln!(
                "drover: app {app:?}: the reload after the change failed: {e}"
            ),
        }
    }
}

/// The directory an app runs in, which its watch paths are relative to.
fn app_dir(spec: &AppSpec) -> Result<PathBuf, String> {
    match &spec.cwd {
        Some(cwd) => Ok(cwd.clone()),
        None => std::env::current_dir().map_err(|e| format!("drover's directory: {e}")),
    }
}

/// The first changed path (relative to the app's directory), and how many more.
fn shown(changed: &[PathBuf], cwd: &Path) -> String {
    let path = |p: &PathBuf| p.strip_prefix(cwd).unwrap_or(p).display().to_string();
    match changed {
        [] => "its files".to_string(),
        [one] => path(one),
        [first, rest @ ..] => format!("{} and {} more", path(first), rest.len()),
    }
}
