//! What the admin API and SIGHUP act on: the running apps and balancers.

use crate::balancers::{
    app_of, discovery, static_pool, wire_routes, RunningBalancer, Sockets, StartError,
};
use crate::follow::{where_the_app_listens, FollowApp, Followed};
use crate::systemd;
use crate::up::Serving;
use drover_admin::{
    wall_clock, AppStatus, BalancerMembers, BalancerStatus, Control, ControlError, EndpointRow,
    RestartRow, SharedPortRow, Status, WorkerRow,
};
use drover_config::plan::BalancerPlan;
use drover_config::preflight;
use drover_config::{self as config, BalancerConfig, Config};
use drover_metrics::BalancerSnapshot;
use drover_proxy::tls::Certificates;
use drover_registry::Pool;
use drover_supervisor::{
    signal_name, RestartRecord, SharedListener, Supervisor, SupervisorError, WorkerStatus, Workers,
};
use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, RwLock};

/// Where the running config came from, which says what a reload reads again.
enum Source {
    /// `drover up` and `drover proxy --config`: the file, and the config running now.
    File(PathBuf, tokio::sync::Mutex<Config>),
    /// `drover run` and `drover proxy` from flags: the config they made. A reload
    /// restarts the same commands and reads the balancers' files (certificates, backend
    /// CA and client certificate) again.
    Flags(Config),
    /// `drover run ecosystem.config.js`: a reload reads the file again and applies
    /// each app's settings, as `pm2 reload ecosystem.config.js` does.
    Ecosystem(config::ecosystem::Source),
}

pub struct Controller {
    source: Source,
    /// Serializes reloads when there is no config to lock.
    reloading: tokio::sync::Mutex<()>,
    /// The supervised apps; a reload adds the ones its file names anew and (a
    /// drover.toml) stops the ones it no longer names.
    apps: RwLock<Vec<Arc<Supervisor>>>,
    /// Each supervised app's pool, for a balancer a reload puts in front of it.
    app_pools: RwLock<BTreeMap<String, Arc<Pool>>>,
    balancers: RwLock<Vec<Arc<RunningBalancer>>>,
    /// The apps whose files are watched (PM2's `watch`); a reload of a file changes them.
    pub(crate) watches: crate::watching::Watches,
    /// Set when a stop begins, before the listeners close (`--shutdown-delay`):
    /// `/readyz` answers "draining" from then on.
    stopping: std::sync::atomic::AtomicBool,
}

/// What a reload does with one balancer of the new file.
enum Step<'a> {
    /// Unchanged settings; its certificates, if it has some, as read again now.
    Keep(Arc<RunningBalancer>, Option<Arc<Certificates>>),
    /// New settings on the same sockets.
    Change(Arc<RunningBalancer>, &'a BalancerConfig, BalancerPlan),
    /// A new listener: a new balancer, or one whose address changed (it keeps its pool
    /// and members; the old listener drains).
    Start {
        index: usize,
        config: &'a BalancerConfig,
        plan: BalancerPlan,
        replaces: Option<Arc<RunningBalancer>>,
    },
}

impl Controller {
    /// `source` is the config file `config` came from; `None` when flags made it.
    pub fn new(
        source: Option<PathBuf>,
        config: Config,
        apps: Vec<Arc<Supervisor>>,
        app_pools: BTreeMap<String, Arc<Pool>>,
        balancers: Vec<Arc<RunningBalancer>>,
    ) -> Controller {
        let source = match source {
            Some(path) => Source::File(path, tokio::sync::Mutex::new(config)),
            None => Source::Flags(config),
        };
        Controller {
            source,
            reloading: tokio::sync::Mutex::new(()),
            apps: RwLock::new(apps),
            app_pools: RwLock::new(app_pools),
            balancers: RwLock::new(balancers),
            watches: Default::default(),
            stopping: Default::default(),
        }
    }

    /// Reloads read `ecosystem` again (`drover run ecosystem.config.js`).
    pub fn reading_ecosystem(mut self, ecosystem: config::ecosystem::Source) -> Controller {
        self.source = Source::Ecosystem(ecosystem);
        self
    }

    /// Serves `started` from now on, beside the others (`drover run`'s balancer, once
    /// the app's first `listen()` says where).
    pub fn add_balancer(&self, started: Arc<RunningBalancer>) {
        let mut all = self.balancers.write().unwrap_or_else(|e| e.into_inner());
        all.push(started);
        wire_routes(&all);
    }

    /// The supervised apps running now.
    pub fn apps(&self) -> Vec<Arc<Supervisor>> {
        self.apps.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The pool of the supervised app `name`, if one runs.
    fn app_pool(&self, name: &str) -> Option<Arc<Pool>> {
        let pools = self.app_pools.read().unwrap_or_else(|e| e.into_inner());
        pools.get(name).cloned()
    }

    /// Says a stop has begun: `/readyz` answers "draining" while the listeners still
    /// accept (`--shutdown-delay`).
    pub fn begin_stop(&self) {
        self.stopping
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// The balancers running now.
    pub fn balancers(&self) -> Vec<Arc<RunningBalancer>> {
        self.balancers
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// `drover ctl reload` and SIGHUP. With a config file and no app named, the whole
    /// file applies: its balancers (new, removed, changed), its apps (new ones start,
    /// removed ones stop once their balancers drained) and the others' rolling reload.
    /// Either all of it applies or none: an invalid file, a change that needs a restart
    /// or an address that cannot be bound changes nothing, and a failed app reload is
    /// rolled back (and new apps stopped) before any balancer changes.
    /// Under systemd, RELOADING=1 before and READY=1 after, applied or not.
    pub async fn reload(&self, only: Option<String>) -> Result<String, ControlError> {
        // Said, not silent: a second deploy's `ctl reload` waited half a minute behind
        // the first with nothing in the log (Node seat #4).
        if self.reloading.try_lock().is_err() {
            drover_spool::eprintln!(
                "drover: a reload is under way; this one follows once it is done"
            );
        }
        systemd::reloading();
        let outcome = match (&self.source, &only) {
            (Source::File(path, running), None) => {
                // The same order as `reload_apps`: the reload lock, then the config.
                let _one = self.reloading.lock().await;
                let mut running = running.lock().await;
                self.reload_file(path, &mut running).await
            }
            (Source::Flags(flags), None) => self.reload_without_file(flags).await,
            (Source::Ecosystem(file), None) => self.reload_ecosystem(file).await,
            _ => self.reload_apps(only).await,
        };
        systemd::reloaded(match &outcome {
            Ok(_) => "serving; reloaded",
            Err(_) => "serving; the reload failed, nothing changed",
        });
        outcome
    }

    /// A reload of an ecosystem file's apps, as `pm2 reload ecosystem.config.js` does
    /// it: the file read again, every app it names and drover runs reloaded (rolling)
    /// with what it says now (env, arguments, instances...), and an app it names anew
    /// started, with its balancer where its workers listen. An app no longer in the file
    /// runs on, untouched, as under PM2. Moving an app between cluster and fork mode
    /// needs a restart. Nothing is half-applied: a new app that cannot start (or whose
    /// workers never listen) is stopped again before any app reloads, and a failed
    /// reload stops the new apps too.
    async fn reload_ecosystem(
        &self,
        source: &config::ecosystem::Source,
    ) -> Result<String, ControlError> {
        let _one = self.reloading.lock().await;
        let failed = |e: String| ControlError::Failed(format!("{e}; nothing was reloaded"));
        let file = source.file.display();
        // The file's mistake, not drover's: a 400, as for `read_next`.
        let (next, notes) = source
            .read()
            .map_err(|e| ControlError::Invalid(format!("{e}; nothing was reloaded")))?;
        // What the file says that drover does not apply, as at start: a key added
        // since is named too.
        for note in &notes {
            drover_spool::eprintln!("drover: note: {note}");
        }
        let running = self.apps();
        for app in &running {
            let moved = next
                .iter()
                .any(|n| n.app.spec.name == app.name() && n.app.spec.mode != app.spec().mode);
            if moved {
                return Err(failed(format!(
                    "{file}: app {:?} moved between cluster and fork mode: restart drover to apply that",
                    app.name()
                )));
            }
        }
        let (named, added): (Vec<_>, Vec<_>) = next
            .into_iter()
            .partition(|n| running.iter().any(|a| a.name() == n.app.spec.name));
        let left: Vec<&str> = running
            .iter()
            .map(|a| a.name())
            .filter(|name| !named.iter().any(|n| n.app.spec.name == *name))
            .collect();
        let next = Config {
            admin: None,
            resolver: Default::default(),
            etcd: None,
            apps: named.into_iter().map(|a| a.app).collect(),
            balancers: Vec::new(),
        };
        preflight::prepare(&next, &config::Origins::default())
            .map_err(|errors| failed(errors.join("; ")))?;
        let (balancers, follow) = config::flags::ecosystem_balancers(&added, source.threads);
        let new = Config {
            apps: added.into_iter().map(|a| a.app).collect(),
            balancers,
            ..next.clone()
        };
        let prepared = preflight::prepare(&new, &config::Origins::default())
            .map_err(|errors| failed(errors.join("; ")))?;
        // The apps of the file: those that left it run on as they are, watched too.
        let rewatch = self
            .watches
            .prepare(next.apps.iter().chain(&new.apps).map(|a| &a.spec), &[])
            .map_err(|e| failed(format!("{file}: {e}")))?;
        let started = start_new_apps(&new, prepared, &follow)
            .await
            .map_err(|e| failed(format!("{file}: {e}")))?;

        let targets: Vec<&Arc<Supervisor>> = running
            .iter()
            .filter(|a| !left.contains(&a.name()))
            .collect();
        if let Err(e) = reload_all(specs_from(&targets, &next)).await {
            started.stop().await;
            return Err(e);
        }
        let mut said = vec![summary(&targets)];
        for app in &started.apps {
            said.push(format!(
                "started {} ({}), as PM2 starts an app new to the file",
                app.name(),
                drover_units::count(app.spec().workers.resolve(), "worker")
            ));
        }
        for name in &left {
            said.push(format!(
                "{name} is not in {file}: it runs on, as under PM2 (restart drover to stop it)"
            ));
        }
        self.apps
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .extend(started.apps);
        self.app_pools
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .extend(started.pools);
        for b in started.balancers {
            self.add_balancer(b);
        }
        self.watches.apply(rewatch);
        Ok(said.join("; "))
    }

    /// A reload of what started from flags: every app's rolling reload, and every
    /// balancer's files read again: its certificates, and its backend CA and client
    /// certificate. A file that fails changes nothing, and the files apply only once
    /// the apps have reloaded.
    async fn reload_without_file(&self, flags: &Config) -> Result<String, ControlError> {
        let mut reread = Vec::new();
        for b in self.balancers() {
            let config = b.config();
            if config.tls.is_none() && config.backend_tls.is_none() {
                continue;
            }
            let plan = BalancerPlan::from_config(&config)
                .map_err(|e| ControlError::Failed(format!("{e}; nothing was reloaded")))?;
            b.can_reconfigure(&plan).map_err(|e| {
                ControlError::Failed(format!("balancer {:?}: {e}; nothing was reloaded", b.name))
            })?;
            reread.push((b, config, plan));
        }
        let apps = self.reload_apps(None).await?;
        if reread.is_empty() {
            return Ok(apps);
        }
        let names: Vec<String> = reread.iter().map(|(b, ..)| b.name.clone()).collect();
        for (b, config, plan) in reread {
            if config.backend_tls.is_some() {
                // New connections to the backends, and the health checks, use the files
                // just read; as in a reload of a file, `Step::Change`.
                b.reconfigure(config, plan, discovery(flags))
                    .await
                    .expect("can_reconfigure checked it");
            } else {
                b.proxy.set_tls(plan.proxy.tls);
            }
        }
        Ok(format!(
            "{apps}; certificates read again: {}",
            names.join(", ")
        ))
    }

    async fn reload_file(&self, path: &Path, running: &mut Config) -> Result<String, ControlError> {
        let next = read_next(path, running)?;
        let failed = |what: String| {
            ControlError::Failed(format!("{}: {what}; nothing was reloaded", path.display()))
        };
        let apps_now = self.apps();
        let added: Vec<&config::AppConfig> = next
            .apps
            .iter()
            .filter(|a| !apps_now.iter().any(|r| r.name() == a.spec.name))
            .collect();
        let removed: Vec<Arc<Supervisor>> = apps_now
            .iter()
            .filter(|r| !next.apps.iter().any(|a| a.spec.name == r.name()))
            .cloned()
            .collect();
        // An app new to the file gets its pool from the balancer in front of it, as at
        // start.
        let mut plans_of_added = Vec::new();
        for b in &next.balancers {
            if app_of(b).is_some_and(|app| added.iter().any(|a| a.spec.name == app)) {
                plans_of_added
                    .push(BalancerPlan::from_config(b).map_err(|e| failed(e.to_string()))?);
            }
        }
        let mut new_pools = crate::up::pools_of(&plans_of_added);
        let gone: Vec<String> = removed.iter().map(|a| a.name().to_string()).collect();
        let rewatch = self
            .watches
            .prepare(next.apps.iter().map(|a| &a.spec), &gone)
            .map_err(failed)?;
        let steps = self
            .plan_balancers(&next, &new_pools)
            .map_err(|e| restart_needed(path, &e))?;

        // A shared-mode app new to the file binds its address first, as the balancers
        // do: a taken one stops the reload with nothing changed.
        let mut shared_sockets = BTreeMap::new();
        for (i, app) in next.apps.iter().enumerate() {
            let (Some(listen), true) = (app.listen, added.contains(&app)) else {
                continue;
            };
            let socket = SharedListener::bind(listen).map_err(|e| {
                failed(format!(
                    "app[{i}].listen: app {:?}: cannot listen on {listen}: {e}{}",
                    app.spec.name,
                    preflight::held_by(listen, &e)
                ))
            })?;
            shared_sockets.insert(app.spec.name.clone(), socket);
        }

        // Bind every new address first: a taken one stops the reload with nothing
        // changed.
        let mut started: Vec<Option<Arc<RunningBalancer>>> = Vec::new();
        for step in &steps {
            let Step::Start {
                index,
                config,
                plan,
                replaces,
            } = step
            else {
                started.push(None);
                continue;
            };
            let pool = match replaces {
                Some(old) => Arc::clone(&old.pool),
                None => match app_of(config) {
                    Some(app) => self
                        .app_pool(app)
                        .or_else(|| new_pools.get(app).cloned())
                        .expect("plan_balancers checked it"),
                    None => static_pool(plan),
                },
            };
            let start = RunningBalancer::start(
                (*config).clone(),
                plan.clone(),
                discovery(&next),
                pool,
                replaces.as_deref(),
                // systemd's sockets serve the balancers of the first start only; one a
                // reload adds binds its address.
                Sockets::Bind,
            )
            .await;
            match start {
                Ok(b) => started.push(Some(Arc::new(b))),
                Err(e) => {
                    for b in started.into_iter().flatten() {
                        b.proxy.begin_shutdown();
                    }
                    let what = match e {
                        StartError::Bind(e) => format!(
                            "balancer[{index}].listen: balancer {:?}: cannot listen on {}: {e}{}",
                            config.name,
                            shown_listen(config.listen),
                            config
                                .listen
                                .map(|a| preflight::held_by(a, &e))
                                .unwrap_or_default()
                        ),
                        e @ StartError::Dns(_) => {
                            format!(
                                "balancer[{index}].backends: balancer {:?}: {e}",
                                config.name
                            )
                        }
                    };
                    return Err(ControlError::Failed(format!(
                        "{}: {what}; nothing was reloaded",
                        path.display()
                    )));
                }
            }
        }

        // The apps new to the file start, behind their new balancers; then the rolling
        // reload of the others, which undoes itself if it fails.
        let mut new_apps = NewApps {
            apps: Vec::new(),
            pools: BTreeMap::new(),
            balancers: started.iter().flatten().cloned().collect(),
        };
        for app in &added {
            let name = &app.spec.name;
            let serving = match shared_sockets.remove(name) {
                Some(socket) => Serving::Shared(socket),
                None => Serving::Pool(crate::up::app_pool(&mut new_pools, name)),
            };
            match crate::up::start_app(app.spec.clone(), serving) {
                Ok(sup) => new_apps.apps.push(Arc::new(sup)),
                Err(e) => {
                    new_apps.stop().await;
                    return Err(failed(format!("app {name:?}: {e}")));
                }
            }
        }
        let targets: Vec<&Arc<Supervisor>> = apps_now
            .iter()
            .filter(|a| !removed.iter().any(|r| Arc::ptr_eq(a, r)))
            .collect();
        if let Err(e) = reload_all(specs_from(&targets, &next)).await {
            new_apps.stop().await;
            return Err(e);
        }
        self.apps
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .extend(new_apps.apps.iter().cloned());
        self.app_pools
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .extend(new_pools);

        // Nothing below can fail: the balancers change.
        let mut now: Vec<Arc<RunningBalancer>> = Vec::with_capacity(steps.len());
        let mut changed = Vec::new();
        let mut certificates = Vec::new();
        let mut retired = Vec::new();
        for (step, new) in steps.into_iter().zip(started) {
            match step {
                Step::Keep(b, tls) => {
                    if tls.is_some() {
                        b.proxy.set_tls(tls);
                        certificates.push(b.name.clone());
                    }
                    now.push(b)
                }
                Step::Change(b, config, plan) => {
                    b.reconfigure(config.clone(), plan, discovery(&next))
                        .await
                        .expect("plan_balancers checked it");
                    changed.push(b.name.clone());
                    now.push(b);
                }
                Step::Start { replaces, .. } => {
                    let new = new.expect("started above");
                    changed.push(new.name.clone());
                    if let Some(old) = replaces {
                        retired.push(old);
                    }
                    now.push(new);
                }
            }
        }
        // Routes name balancers by name: each points at the one running from now on.
        wire_routes(&now);
        let old = std::mem::replace(
            &mut *self.balancers.write().unwrap_or_else(|e| e.into_inner()),
            now.clone(),
        );
        let mut gone = Vec::new();
        for b in old {
            if !now.iter().any(|n| Arc::ptr_eq(n, &b)) {
                if !retired.iter().any(|r| Arc::ptr_eq(r, &b)) {
                    changed.push(format!("{} (removed)", b.name));
                }
                gone.push(Arc::clone(&b));
                b.retire();
            }
        }
        *running = next;
        self.watches.apply(rewatch);
        let mut said = vec![summary(&targets)];
        said.push(if changed.is_empty() {
            "no balancer changed".to_string()
        } else {
            format!("balancers changed: {}", changed.join(", "))
        });
        if !certificates.is_empty() {
            // Read again on every reload, changed or not: a renewed certificate serves
            // new connections from now on (the settings around it did not change).
            said.push(format!(
                "certificates read again: {}",
                certificates.join(", ")
            ));
        }
        for app in &new_apps.apps {
            let workers = drover_units::count(app.spec().workers.resolve(), "worker");
            said.push(format!("started {} ({workers})", app.name()));
        }
        for app in &removed {
            self.stop_removed(app, &gone).await;
            said.push(format!("stopped {} (not in the file)", app.name()));
        }
        Ok(said.join("; "))
    }

    /// Stops `app`, which the file no longer names, once the balancers in front of it
    /// (among `retired`, which the reload retired) have drained: no request in flight on
    /// it is cut off. It stays among the apps until its workers are gone, so a SIGTERM
    /// meanwhile stops them too.
    async fn stop_removed(&self, app: &Arc<Supervisor>, retired: &[Arc<RunningBalancer>]) {
        for b in retired {
            if b.app().as_deref() == Some(app.name()) {
                b.proxy.drained(b.drain_timeout()).await;
            }
        }
        app.shutdown().await;
        self.apps
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|a| !Arc::ptr_eq(a, app));
        self.app_pools
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(app.name());
    }

    /// What to do with each balancer of `next`, checking everything that could refuse
    /// the reload before anything changes.
    fn plan_balancers<'a>(
        &self,
        next: &'a Config,
        new_pools: &BTreeMap<String, Arc<Pool>>,
    ) -> Result<Vec<Step<'a>>, String> {
        if let Some(tls) = next.etcd.as_ref().and_then(|e| e.tls.as_ref()) {
            drover_config::plan::load_etcd_tls(tls).map_err(|e| e.to_string())?;
        }
        if let Some(auth) = next.etcd.as_ref().and_then(|e| e.auth.as_ref()) {
            drover_config::plan::read_etcd_password(auth).map_err(|e| e.to_string())?;
        }
        let current = self.balancers();
        let mut steps = Vec::new();
        for (index, config) in next.balancers.iter().enumerate() {
            let plan = BalancerPlan::from_config(config).map_err(|e| e.to_string())?;
            let Some(b) = current.iter().find(|b| b.name == config.name) else {
                // The file's validation and `reloadable` let only an app that runs here
                // with a pool through; this keeps a mistake from being a panic.
                if let Some(app) = app_of(config) {
                    if self.app_pool(app).is_none() && !new_pools.contains_key(app) {
                        return Err(format!(
                            "balancer {:?} balances over app {app:?}, which does not run",
                            config.name
                        ));
                    }
                }
                steps.push(Step::Start {
                    index,
                    config,
                    plan,
                    replaces: None,
                });
                continue;
            };
            let old = b.config();
            // backend_tls files were just read again: a changed CA or client certificate
            // applies (new connections; the idle ones go with the old settings).
            if old == *config && config.backend_tls.is_none() {
                steps.push(Step::Keep(Arc::clone(b), plan.proxy.tls));
            } else if app_of(&old) != app_of(config) {
                // Its pool is the app's, which the workers join: another app (or none)
                // is another pool.
                let shown = |c| app_of(c).map_or("none".to_string(), |a| format!("\"app:{a}\""));
                return Err(format!(
                    "balancer {:?}: the app among its backends changed from {} to {}",
                    config.name,
                    shown(&old),
                    shown(config)
                ));
            } else if old.listen != config.listen {
                steps.push(Step::Start {
                    index,
                    config,
                    plan,
                    replaces: Some(Arc::clone(b)),
                });
            } else {
                b.can_reconfigure(&plan)
                    .map_err(|e| format!("balancer {:?}: {e}", config.name))?;
                steps.push(Step::Change(Arc::clone(b), config, plan));
            }
        }
        Ok(steps)
    }

    /// Rolling reload of every app, or of `only`. With a config file, the file is read
    /// and checked again first, and its app settings (command, env, health, timings)
    /// apply to the new workers. Either every app reloads or, on a failure, the apps
    /// already reloaded are rolled back: nothing is left half-applied.
    async fn reload_apps(&self, only: Option<String>) -> Result<String, ControlError> {
        if let Some(name) = &only {
            self.app(name)?;
        }
        let _one = self.reloading.lock().await;
        let apps = self.apps();
        let targets: Vec<&Arc<Supervisor>> = apps
            .iter()
            .filter(|a| only.as_deref().is_none_or(|n| a.name() == n))
            .collect();
        if targets.is_empty() {
            return Ok("no apps to reload".to_string());
        }
        let Source::File(path, running) = &self.source else {
            reload_all(targets.iter().map(|s| (*s, None)).collect()).await?;
            return Ok(summary(&targets));
        };
        let mut running = running.lock().await;
        let next = read_next(path, &running)?;
        for app in &targets {
            if !next.apps.iter().any(|a| a.spec.name == app.name()) {
                return Err(ControlError::Failed(format!(
                    "{}: app {:?} is no longer in the file: reload the whole file (drover ctl reload) to stop it; nothing was reloaded",
                    path.display(),
                    app.name()
                )));
            }
        }
        reload_all(specs_from(&targets, &next)).await?;
        // Only what was reloaded is now running: with `only`, the other apps keep their
        // old settings until they are reloaded too.
        for app in &mut running.apps {
            if only.as_deref().is_none_or(|n| app.spec.name == n) {
                if let Some(new) = next.apps.iter().find(|a| a.spec.name == app.spec.name) {
                    *app = new.clone();
                }
            }
        }
        Ok(summary(&targets))
    }

    fn app(&self, name: &str) -> Result<Arc<Supervisor>, ControlError> {
        self.apps()
            .into_iter()
            .find(|a| a.name() == name)
            .ok_or_else(|| {
                ControlError::NotFound(format!(
                    "no app named {name:?} (apps: {})",
                    self.app_names()
                ))
            })
    }

    fn app_names(&self) -> String {
        let apps = self.apps();
        let known: Vec<&str> = apps.iter().map(|a| a.name()).collect();
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
        let apps = self.apps();
        let sup = match (&name, apps.as_slice()) {
            (Some(name), _) => self.app(name)?,
            (None, [only]) => Arc::clone(only),
            (None, []) => return Err(ControlError::NotFound("no apps to scale".into())),
            (None, _) => {
                return Err(ControlError::Invalid(format!(
                    "several apps run ({}): name one",
                    self.app_names()
                )))
            }
        };
        // Not during a reload: its rollback would undo the count.
        let _one = self.reloading.lock().await;
        sup.scale(workers).await.map_err(|e| match e {
            // A bad count is the asker's mistake (400), not a failed scale (500).
            SupervisorError::InvalidWorkers { source, .. } => {
                ControlError::Invalid(source.to_string())
            }
            e => ControlError::Failed(e.to_string()),
        })
    }
}

/// The apps a reload started, not yet among the running ones.
struct NewApps {
    apps: Vec<Arc<Supervisor>>,
    pools: BTreeMap<String, Arc<Pool>>,
    balancers: Vec<Arc<RunningBalancer>>,
}

impl NewApps {
    /// Undoes the start: nothing of it outlives a reload that failed. Says which apps
    /// ran meanwhile: a reload refused with "nothing was reloaded" had run a new app's
    /// workers for a moment, and a queue consumer among them may have taken a job
    /// (ops seat).
    async fn stop(self) {
        for b in &self.balancers {
            b.proxy.begin_shutdown();
        }
        for app in &self.apps {
            app.shutdown().await;
        }
        if !self.apps.is_empty() {
            let names: Vec<String> = self
                .apps
                .iter()
                .map(|a| format!("{:?}", a.name()))
                .collect();
            tracing::warn!(
                "reload failed: app(s) new to the file, {}, started and stopped again",
                names.join(", ")
            );
        }
    }
}

/// Starts the apps of `new` (prepared as `prepared`), and the balancer of each `follow`
/// where its app's workers listen; an app's workers have its `ready_timeout` to listen.
/// On an error, what started is stopped again.
async fn start_new_apps(
    new: &Config,
    prepared: preflight::Prepared,
    follow: &[config::flags::FollowListen],
) -> Result<NewApps, String> {
    let preflight::Prepared { plans, specs } = prepared;
    let mut started = NewApps {
        apps: Vec::new(),
        pools: crate::up::pools_of(&plans),
        balancers: Vec::new(),
    };
    for spec in specs {
        let pool = crate::up::app_pool(&mut started.pools, &spec.name);
        match crate::up::start_app(spec, crate::up::Serving::Pool(pool)) {
            Ok(sup) => started.apps.push(Arc::new(sup)),
            Err(e) => {
                started.stop().await;
                return Err(e);
            }
        }
    }
    for listen in follow {
        let (config, plan) = (&new.balancers[listen.balancer], &plans[listen.balancer]);
        let app = started
            .apps
            .iter()
            .find(|a| plan.app.as_deref() == Some(a.name()))
            .cloned()
            .expect("each follow balancer balances an app of the file");
        let wait = app.spec().ready_timeout;
        let follow = FollowApp {
            config: config.clone(),
            plan: plan.clone(),
            pool: Arc::clone(&started.pools[app.name()]),
            app: Arc::clone(&app),
            discovery: new.clone(),
            listen: listen.clone(),
        };
        let why = match tokio::time::timeout(wait, where_the_app_listens(follow)).await {
            Ok(Ok(Followed::Balancer(b))) => {
                started.balancers.push(Arc::from(b));
                continue;
            }
            Ok(Ok(Followed::UnixSocket)) => continue,
            Ok(Err(e)) => e,
            Ok(Ok(Followed::Stopped)) => format!("app {:?} stopped before it listened", app.name()),
            Err(_) => format!(
                "app {:?}: no worker listened within {wait:?} (its ready_timeout), so drover cannot tell where its clients connect",
                app.name(),
            ),
        };
        started.stop().await;
        return Err(why);
    }
    Ok(started)
}

/// The file at `path` again, checked as `drover check` checks it (but for the
/// addresses: those the reload keeps are this drover's own), and against what runs.
/// A file that does not parse, fails the checks or asks for a restart is the file's
/// mistake, answered with a 400 (it was a 500, a server error, for a user's typo).
fn read_next(path: &Path, running: &Config) -> Result<Config, ControlError> {
    let (next, origins) = config::load_with_origins(path)
        .map_err(|e| ControlError::Invalid(format!("{e}; nothing was reloaded")))?;
    if let Err(errors) = preflight::prepare(&next, &origins) {
        return Err(ControlError::Invalid(format!(
            "{}; nothing was reloaded",
            errors.join("; ")
        )));
    }
    reloadable(running, &next).map_err(|e| restart_needed(path, &e))?;
    Ok(next)
}

fn restart_needed(path: &Path, why: &str) -> ControlError {
    ControlError::Invalid(format!(
        "{}: {why}: restart drover to apply that; nothing was reloaded",
        path.display()
    ))
}

/// Each app of `targets` with its settings from `next`.
fn specs_from<'a>(
    targets: &[&'a Arc<Supervisor>],
    next: &Config,
) -> Vec<(&'a Arc<Supervisor>, Option<drover_supervisor::AppSpec>)> {
    targets
        .iter()
        .map(|sup| {
            let cfg = next
                .apps
                .iter()
                .find(|a| a.spec.name == sup.name())
                .expect("every app reloaded is in the file");
            (*sup, Some(cfg.spec.clone()))
        })
        .collect()
}

fn summary(apps: &[&Arc<Supervisor>]) -> String {
    if apps.is_empty() {
        return "no apps to reload".to_string();
    }
    let names: Vec<String> = apps
        .iter()
        .map(|a| {
            let workers = drover_units::count(a.status().len(), "worker");
            format!("{} ({workers})", a.name())
        })
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
        return sup.reload(None).await.map_err(|e| e.to_string());
    };
    let previous = sup.spec();
    let (want, have) = (spec.workers.resolve(), previous.workers.resolve());
    if want < have {
        sup.scale(want).await.map_err(|e| e.to_string())?;
    }
    spec.workers = Workers::Count(want.min(have));
    if let Err(e) = sup.reload(Some(spec)).await {
        if want < have {
            return Err(match sup.scale(have).await {
                Ok(_) => format!("{e}; scaled back to {have} workers"),
                Err(e2) => format!("{e}; scaling back to {have} workers failed: {e2}"),
            });
        }
        return Err(e.to_string());
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

/// What a reload can apply: apps added and removed, app settings other than the mode
/// and listen address (the worker count too), and balancers (checked by
/// `plan_balancers`). Anything else is refused as a whole.
fn reloadable(running: &Config, next: &Config) -> Result<(), String> {
    if running.admin != next.admin {
        return Err("the [admin] table changed".into());
    }
    for old in &running.apps {
        let Some(new) = next.apps.iter().find(|a| a.spec.name == old.spec.name) else {
            continue;
        };
        if old.spec.mode != new.spec.mode || old.listen != new.listen {
            return Err(format!("app {:?}: mode or listen changed", old.spec.name));
        }
    }
    Ok(())
}

fn worker_row(w: WorkerStatus) -> WorkerRow {
    WorkerRow {
        id: w.id,
        pid: w.pid,
        port: w.port,
        state: w.state.to_string(),
        uptime_secs: w.uptime.map(|u| u.as_secs_f64()),
        restarts: w.restarts,
        crash_streak: w.crash_streak,
        rss_bytes: w.rss_bytes,
        in_flight: w.in_flight,
        clients: w.clients,
        last_exit: w.last_exit,
        last_restart_reason: w.last_reason.map(|r| r.to_string()),
        last_exit_code: w.last_exit_code,
        last_signal: w.last_signal,
        last_signal_name: w.last_signal.and_then(signal_name).map(str::to_string),
        restarts_by_reason: w
            .restarts_by_reason
            .iter()
            .map(|(reason, n)| (reason.to_string(), n))
            .collect(),
        cpu_seconds: w.cpu_seconds,
        started_at_unix_secs: w.started_at.map(|t| wall_clock(t).1),
    }
}

fn restart_row(r: RestartRecord) -> RestartRow {
    let (time, unix_secs) = wall_clock(r.at);
    RestartRow {
        time,
        unix_secs,
        signal_name: r.signal_name().map(str::to_string),
        app: r.app,
        worker: r.worker,
        pid: r.pid,
        reason: r.reason.to_string(),
        detail: r.detail,
        exit_code: r.exit_code,
        signal: r.signal,
        uptime_secs: r.uptime.map(|u| u.as_secs_f64()),
        rss_bytes: r.rss_bytes,
        cpu_seconds: r.cpu_seconds,
        stderr_tail: r.stderr_tail,
    }
}

impl Control for Controller {
    fn status(&self) -> Status {
        let apps = self
            .apps()
            .iter()
            .map(|sup| {
                let spec = sup.spec();
                AppStatus {
                    name: sup.name().to_string(),
                    mode: spec.mode.to_string(),
                    command: spec.command.clone(),
                    workers: sup.status().into_iter().map(worker_row).collect(),
                    restarts: sup.restarts().into_iter().map(restart_row).collect(),
                    shared_ports: sup
                        .shared_ports()
                        .into_iter()
                        .map(|(place, workers)| SharedPortRow {
                            listen: place.to_string(),
                            workers,
                        })
                        .collect(),
                }
            })
            .collect();
        let balancers = self
            .balancers()
            .iter()
            .map(|b| (b, b.check_errors()))
            .map(|(b, check_errors)| BalancerStatus {
                name: b.name.clone(),
                listen: shown_listen(b.listen),
                also_listen: b
                    .proxy
                    .also_addrs()
                    .iter()
                    .map(ToString::to_string)
                    .collect(),
                strategy: b.strategy(),
                mode: b.mode(),
                app: b.app(),
                backend_protocol: b.config().backend_protocol.to_string(),
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
                        limit_reason: e.limit_reason.as_str().to_owned(),
                        learned_limit: e.learned_limit,
                        pending: e.pending,
                        waiting: e.waiting,
                        rtt_ms: e.rtt_ns as f64 / 1e6,
                        weight: e.weight,
                        ramp: e.ramp,
                        ejections: e.ejections,
                        check_error: check_errors.get(&e.addr).cloned(),
                    })
                    .collect(),
                sources: b.source_rows(),
                routes: b.config().routes.iter().map(route_row).collect(),
            })
            .collect();
        Status { apps, balancers }
    }

    /// `drover ctl reload` (the admin API): the outcome goes to drover's own output too,
    /// as SIGHUP's does, so whoever reads the log sees each reload and what it did.
    fn reload(
        &self,
        app: Option<String>,
    ) -> Pin<Box<dyn Future<Output = Result<String, ControlError>> + Send + '_>> {
        Box::pin(async move {
            match &app {
                Some(app) => drover_spool::eprintln!(
                    "drover: reload of app {app:?} asked through the admin API"
                ),
                None => drover_spool::eprintln!("drover: reload asked through the admin API"),
            }
            let outcome = self.reload(app).await;
            match &outcome {
                Ok(msg) => drover_spool::eprintln!("drover: {msg}"),
                Err(e) => drover_spool::eprintln!("drover: reload failed: {e}"),
            }
            outcome
        })
    }

    fn scale(
        &self,
        app: Option<String>,
        workers: usize,
    ) -> Pin<Box<dyn Future<Output = Result<String, ControlError>> + Send + '_>> {
        Box::pin(self.scale_app(app, workers))
    }

    fn members(&self, balancer: &str) -> Result<BalancerMembers, ControlError> {
        let balancers = self.balancers();
        let b = balancers
            .iter()
            .find(|b| b.name == balancer)
            .ok_or_else(|| {
                let known: Vec<&str> = balancers.iter().map(|b| b.name.as_str()).collect();
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
            store: b.members(),
            pool: Arc::clone(&b.pool),
        })
    }

    fn metrics(&self) -> Vec<BalancerSnapshot> {
        self.balancers().iter().map(|b| b.metrics()).collect()
    }

    /// Not ready from the moment a stop begins: an orchestrator takes drover out of
    /// rotation while it drains.
    fn readiness(&self) -> Result<(), drover_admin::probes::NotReady> {
        if self.stopping.load(std::sync::atomic::Ordering::Relaxed)
            || self.balancers().iter().any(|b| b.proxy.is_shutting_down())
        {
            return Err(drover_admin::probes::NotReady::Draining);
        }
        drover_admin::probes::readiness(&self.status())
    }
}

/// A balancer's listen address as status and errors show it; `-` for one without (it
/// serves what routes send it).
fn shown_listen(listen: Option<std::net::SocketAddr>) -> String {
    listen.map_or_else(|| "-".to_string(), |a| a.to_string())
}

/// A route as status shows it.
fn route_row(r: &drover_config::RouteConfig) -> drover_admin::RouteRow {
    let matches = if !r.sni.is_empty() {
        format!("sni {}", r.sni.join(", "))
    } else {
        let host = match r.host.is_empty() {
            true => "any host".to_string(),
            false => format!("host {}", r.host.join(", ")),
        };
        let strip = if r.strip_prefix { " (stripped)" } else { "" };
        format!("{host} path {}{strip}", r.path_prefix)
    };
    drover_admin::RouteRow {
        matches,
        balancer: r.balancer.clone(),
    }
}
