//! What the admin API and SIGHUP act on: the running apps and balancers.

use crate::config::{self, Config};
use crate::up::app_spec;
use drover_admin::{
    AppStatus, BalancerMembers, BalancerStatus, Control, ControlError, EndpointRow, Status,
    WorkerRow,
};
use drover_registry::{MemberStore, Pool};
use drover_supervisor::{check_workers, Supervisor};
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
    /// Where members that register at runtime are kept.
    pub members: Arc<dyn MemberStore>,
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
            self.app(name)?;
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

    fn app(&self, name: &str) -> Result<&Arc<Supervisor>, ControlError> {
        self.apps.iter().find(|a| a.name() == name).ok_or_else(|| {
            ControlError::NotFound(format!(
                "no app named {name:?} (apps: {})",
                self.app_names()
            ))
        })
    }

    fn app_names(&self) -> String {
        let known: Vec<&str> = self.apps.iter().map(|a| a.name()).collect();
        if known.is_empty() {
            "none".to_string()
        } else {
            known.join(", ")
        }
    }

    /// `drover ctl scale`: `workers` workers of the app named, or of the only app. Under
    /// `drover up` the count holds until the next reload, which makes the apps match
    /// the file again, count included.
    pub async fn scale_app(
        &self,
        name: Option<String>,
        workers: usize,
    ) -> Result<String, ControlError> {
        let sup = match (&name, self.apps.as_slice()) {
            (Some(name), _) => self.app(name)?,
            (None, [only]) => only,
            (None, []) => return Err(ControlError::NotFound("no apps to scale".into())),
            (None, _) => {
                return Err(ControlError::Invalid(format!(
                    "several apps run ({}): name one",
                    self.app_names()
                )))
            }
        };
        // A bad count is the asker's mistake (400), not a failed scale (500).
        check_workers(workers).map_err(ControlError::Invalid)?;
        // Not during a reload: its rollback would undo the count.
        let _one = self.reloading.lock().await;
        sup.scale(workers).await.map_err(ControlError::Failed)
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
        if let Err(e) = apply(sup, spec).await {
            let mut msg = e;
            for (sup, previous) in done.into_iter().rev() {
                if let Err(e) = apply(sup, Some((*previous).clone())).await {
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

/// Reloads one app with `spec`, scaling it to `spec.workers` too: retiring workers
/// before the reload (none is replaced only to be stopped), adding them after (they
/// start from the new spec). A failed step undoes the ones before it.
async fn apply(sup: &Supervisor, spec: Option<drover_supervisor::AppSpec>) -> Result<(), String> {
    let Some(mut spec) = spec else {
        return sup.reload(None).await;
    };
    let previous = sup.spec();
    let (want, have) = (spec.workers, previous.workers);
    if want < have {
        sup.scale(want).await?;
    }
    spec.workers = want.min(have);
    if let Err(e) = sup.reload(Some(spec)).await {
        if want < have {
            return Err(match sup.scale(have).await {
                Ok(_) => format!("{e}; scaled back to {have} workers"),
                Err(e2) => format!("{e}; scaling back to {have} workers failed: {e2}"),
            });
        }
        return Err(e);
    }
    if want > have {
        if let Err(e) = sup.scale(want).await {
            return Err(match sup.reload(Some((*previous).clone())).await {
                Ok(()) => format!("{e}; the reload was rolled back"),
                Err(e2) => format!("{e}; rolling the reload back failed: {e2}"),
            });
        }
    }
    Ok(())
}

/// What a reload can apply: app settings other than the mode and listen address (the
/// worker count too). Anything else is refused as a whole.
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
        if old.mode != new.mode || old.listen != new.listen {
            return Err(format!("app {:?}: mode or listen changed", old.name));
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
                        load: e.load,
                        limit: e.limit,
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

    fn scale(
        &self,
        app: Option<String>,
        workers: usize,
    ) -> Pin<Box<dyn Future<Output = Result<String, ControlError>> + Send + '_>> {
        Box::pin(self.scale_app(app, workers))
    }

    fn members(&self, balancer: &str) -> Result<BalancerMembers, ControlError> {
        let b = self
            .balancers
            .iter()
            .find(|b| b.name == balancer)
            .ok_or_else(|| {
                let known: Vec<&str> = self.balancers.iter().map(|b| b.name.as_str()).collect();
                ControlError::NotFound(format!(
                    "no balancer named {balancer:?} (balancers: {})",
                    if known.is_empty() {
                        "none".to_string()
                    } else {
                        known.join(", ")
                    }
                ))
            })?;
        Ok(BalancerMembers {
            store: Arc::clone(&b.members),
            pool: Arc::clone(&b.pool),
        })
    }
}
