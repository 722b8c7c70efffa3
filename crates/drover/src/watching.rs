//! PM2's `watch`, wired: each app whose spec says `watch` is reloaded (rolling, through
//! the controller, as `drover ctl reload --app NAME` does) once its files change and
//! have been quiet for the watch delay.

use crate::control::Controller;
use drover_supervisor::watch::FileWatcher;
use drover_supervisor::AppSpec;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};

/// The files of one app, watched from before it starts.
pub(crate) struct AppFiles {
    app: String,
    watcher: FileWatcher,
    cwd: PathBuf,
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
        let cwd = match &spec.cwd {
            Some(cwd) => cwd.clone(),
            None => std::env::current_dir().map_err(|e| format!("drover's directory: {e}"))?,
        };
        let watcher = FileWatcher::new(watch, &cwd)
            .map_err(|e| format!("app {:?}: cannot {e}", spec.name))?;
        watched.push(AppFiles {
            app: spec.name.clone(),
            watcher,
            cwd,
        });
    }
    Ok(watched)
}

/// From now on, each app of `watched` is reloaded after its files change.
pub(crate) fn reload_on_change(control: &Arc<Controller>, watched: Vec<AppFiles>) {
    for files in watched {
        tokio::spawn(reload_each_change(Arc::downgrade(control), files));
    }
}

async fn reload_each_change(control: Weak<Controller>, files: AppFiles) {
    let AppFiles {
        app,
        mut watcher,
        cwd,
    } = files;
    loop {
        let changed = match watcher.changed().await {
            Ok(changed) => changed,
            Err(e) => {
                eprintln!("drover: app {app:?}: watching its files failed ({e}); no more reloads on changes");
                return;
            }
        };
        let Some(control) = control.upgrade() else {
            return;
        };
        if !control.apps().iter().any(|a| a.name() == app) {
            return;
        }
        eprintln!(
            "drover: app {app:?}: {} changed; reloading",
            shown(&changed, &cwd)
        );
        match control.reload(Some(app.clone())).await {
            Ok(_) => eprintln!("drover: app {app:?} reloaded after the change"),
            Err(e) => eprintln!("drover: app {app:?}: the reload after the change failed: {e}"),
        }
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
