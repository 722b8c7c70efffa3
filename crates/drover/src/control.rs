//! What the admin API and SIGHUP act on: the running apps and balancers.

use crate::config::{self, Config};
use crate::up::app_spec;
use drover_admin::{
    AppStatus, BalancerStatus, Control, ControlError, EndpointRow, Status, WorkerRow,
};
use drover_registry::Pool;
use drover_supervisor::Supervisor;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;

/// One balancer as the status view shows it.
pub struct BalancerView {
    pub name: String,
    pub listen: SocketAddr,
    pub strategy: String,
    pub app: Option<String>,
    pub pool: Arc<Pool>,
}

pub struct Controller {
    /// `drover up`: the file a reload reads again, and the config running now.
    /// `drover run` and `drover proxy`: none; a reload restarts the same commands.
    source: Option<(PathBuf, tokio::sync::Mutex<Config>)>,
    /// Serializes reloads when there is no config to lock.
    reloading: tokio::sync::Mutex<()>,
    apps: Vec<Arc<Supervisor>>,
    balancers: Vec<BalancerView>,
}

impl Controller {
    pub fn new(
        source: Option<(PathBuf, Config)>,
        apps: Vec<Arc<Supervisor>>,
        balancers: Vec<BalancerView>,
    ) -> Controller {
        Controller {
            source: source.map(|(p, c)| (p, tokio::sync::Mutex::new(c))),
            reloading: tokio::sync::Mutex::new(()),
            apps,
            balancers,
        }
    }

    /// Rolling reload of every app, or of `only`. With a config file, the file is read
    /// and checked again first, and its app settings (command, env, health, timings)
    /// apply to the new workers. Either every app reloads or, on a failure, the apps
    /// already reloaded are rolled back: nothing is left half-applied.
    pub async fn reload_apps(&self, only: Option<String>) -> Result<String, ControlError> {
        if let Some(name) = &only {
            if !self.apps.iter().any(|a| a.name() == name) {
                let known: Vec<&str> = self.apps.iter().map(|a| a.name()).collect();
                return Err(ControlError::NotFound(format!(
                    "no app named {name:?} (apps: {})",
                    if known.is_empty() {
                        "none".to_string()
                    } else {
                        known.join(", ")
                    }
                )));
            }
        }
        let _one = self.reloading.lock().await;
        let targets: Vec<&Arc<Supervisor>> = self
            .apps
            .iter()
            .filter(|a| only.as_deref().is_none_or(|n| a.name() == n))
            .collect();
        if targets.is_empty() {
            return Ok("no apps to reload".to_string());
        }
        let Some((path, running)) = &self.source else {
            reload_all(targets.iter().map(|s| (*s, None)).collect()).await?;
            return Ok(summary(&targets));
        };
        let mut running = running.lock().await;
        let next = config::load(path)
            .map_err(|e| ControlError::Failed(format!("{e}; nothing was reloaded")))?;
        reloadable(&running, &next).map_err(|e| {
            ControlError::Failed(format!(
                "{}: {e}: restart drover to apply that; nothing was reloaded",
                path.display()
            ))
        })?;
        let plan = targets
            .iter()
            .map(|sup| {
                let cfg = next
                    .apps
                    .iter()
                    .find(|a| a.name == sup.name())
                    .expect("reloadable() checked the app names");
                (*sup, Some(app_spec(cfg)))
            })
            .collect();
        reload_all(plan).await?;
        // Only what was reloaded is now running: with `only`, the other apps keep their
        // old settings until they are reloaded too.
        for app in &mut running.apps {
            if only.as_deref().is_none_or(|n| app.name == n) {
                if let Some(new) = next.apps.iter().find(|a| a.name == app.name) {
                    *app = new.clone();
                }
            }
        }
        Ok(summary(&targets))
    }
}

fn summary(apps: &[&Arc<Supervisor>]) -> String {
    let names: Vec<String> = apps
        .iter()
        .map(|a| format!("{} ({} workers)", a.name(), a.status().len()))
        .collect();
    format!("reloaded {}", names.join(", "))
}

/// Reloads each app in turn; if one fails, rolls back the ones before it.
async fn reload_all(
    plan: Vec<(&Arc<Supervisor>, Option<drover_supervisor::AppSpec>)>,
) -> Result<(), ControlError> {
    let mut done: Vec<(&Arc<Supervisor>, Arc<drover_supervisor::AppSpec>)> = Vec::new();
    for (sup, spec) in plan {
        let previous = sup.spec();
        if let Err(e) = sup.reload(spec).await {
            let mut msg = e;
            for (sup, previous) in done.into_iter().rev() {
                if let Err(e) = sup.reload(Some((*previous).clone())).await {
                    msg.push_str(&format!("; rolling back app {:?} failed: {e}", sup.name()));
                } else {
                    msg.push_str(&format!("; app {:?} rolled back", sup.name()));
                }
            }
            return Err(ControlError::Failed(msg));
        }
        done.push((sup, previous));
    }
    Ok(())
}

/// What a reload can apply: app settings other than the worker count, mode and
/// listen address. Anything else is refused as a whole.
fn reloadable(running: &Config, next: &Config) -> Result<(), String> {
    if running.admin != next.admin {
        return Err("the [admin] table changed".into());
    }
    let names = |c: &Config| c.apps.iter().map(|a| a.name.clone()).collect::<Vec<_>>();
    if names(running) != names(next) {
        return Err(format!(
            "the apps changed from {:?} to {:?}",
            names(running),
            names(next)
        ));
    }
    for (old, new) in running.apps.iter().zip(&next.apps) {
        if old.workers != new.workers || old.mode != new.mode || old.listen != new.listen {
            return Err(format!(
                "app {:?}: workers, mode or listen changed",
                old.name
            ));
        }
    }
    if running.balancers.len() != next.balancers.len() {
        return Err("balancers were added or removed".into());
    }
    if let Some((old, _)) = running
        .balancers
        .iter()
        .zip(&next.balancers)
        .find(|(a, b)| a != b)
    {
        return Err(format!("balancer {:?} changed", old.name));
    }
    Ok(())
}

impl Control for Controller {
    fn status(&self) -> Status {
        let apps = self
            .apps
            .iter()
            .map(|sup| {
                let spec = sup.spec();
                AppStatus {
                    name: sup.name().to_string(),
                    mode: spec.mode.to_string(),
                    command: spec.command.clone(),
                    workers: sup
                        .status()
                        .into_iter()
                        .map(|w| WorkerRow {
                            id: w.id,
                            pid: w.pid,
                            port: w.port,
                            state: w.state.to_string(),
                            uptime_secs: w.uptime.map(|u| u.as_secs_f64()),
                            restarts: w.restarts,
                            crash_streak: w.crash_streak,
                            rss_bytes: w.rss_bytes,
                            in_flight: w.in_flight,
                            last_exit: w.last_exit,
                        })
                        .collect(),
                }
            })
            .collect();
        let balancers = self
            .balancers
            .iter()
            .map(|b| BalancerStatus {
                name: b.name.clone(),
                listen: b.listen.to_string(),
                strategy: b.strategy.clone(),
                app: b.app.clone(),
                endpoints: b
                    .pool
                    .status()
                    .into_iter()
                    .map(|e| EndpointRow {
                        addr: e.addr.to_string(),
                        healthy: e.healthy,
                        available: e.available,
                        in_flight: e.in_flight,
                        rtt_ms: e.rtt_ns as f64 / 1e6,
                        weight: e.weight,
                        ejections: e.ejections,
                    })
                    .collect(),
            })
            .collect();
        Status { apps, balancers }
    }

    fn reload(
        &self,
        app: Option<String>,
    ) -> Pin<Box<dyn Future<Output = Result<String, ControlError>> + Send + '_>> {
        Box::pin(self.reload_apps(app))
    }
}
