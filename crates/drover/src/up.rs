//! `drover up`: every app and balancer a drover.toml describes.

use crate::config::{self, AppConfig};
use crate::plan::{self, BalancerPlan};
use crate::run;
use drover_registry::{Pool, PoolOptions};
use drover_supervisor::{AppSpec, Supervisor};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

/// Loads `path`, checks all of it, then starts apps and balancers; runs until a signal.
/// Nothing starts when any part of the config is wrong.
pub async fn up(path: &Path) -> Result<(), String> {
    let cfg = config::load(path).map_err(|e| e.to_string())?;
    if cfg.apps.is_empty() && cfg.balancers.is_empty() {
        return Err(format!(
            "{}: nothing to run: no [[app]] or [[balancer]]",
            path.display()
        ));
    }
    run_config(&cfg).await
}

/// `drover run -w N -- CMD`: one app and a balancer in front of it, from flags.
pub async fn run_app(args: &crate::cli::RunArgs) -> Result<(), String> {
    let mut app = AppConfig::new("app", args.command.clone());
    app.workers = args.workers;
    if let Some(path) = &args.health_path {
        app.health = Some(config::HealthCheckConfig {
            kind: config::HealthCheckKind::Http {
                path: path.clone(),
                expect: (200, 399),
            },
            ..config::HealthCheckConfig::default_for_app()
        });
    }
    let mut balancer = config::BalancerConfig::new(
        "default",
        args.listen,
        vec![config::BackendRef::App("app".into())],
    );
    balancer.strategy = args.strategy;
    balancer.threads = Some(args.threads);
    let cfg = config::Config {
        admin: None,
        apps: vec![app],
        balancers: vec![balancer],
    };
    run_config(&cfg).await
}

async fn run_config(cfg: &config::Config) -> Result<(), String> {
    let plans = cfg
        .balancers
        .iter()
        .map(BalancerPlan::from_config)
        .collect::<Result<Vec<_>, _>>()?;
    let specs = cfg
        .apps
        .iter()
        .map(|a| {
            let spec = app_spec(a);
            spec.validate().map(|()| spec)
        })
        .collect::<Result<Vec<_>, _>>()?;

    // An app's pool takes its balancing options from the balancer in front of it.
    let mut pools: BTreeMap<String, Arc<Pool>> = BTreeMap::new();
    for plan in &plans {
        if let Some(app) = &plan.app {
            if pools.contains_key(app) {
                return Err(format!(
                    "app {app:?} is behind two balancers; give each balancer its own app"
                ));
            }
            pools.insert(
                app.clone(),
                Arc::new(Pool::new(app.clone(), &[], plan.pool.clone())),
            );
        }
    }

    let mut apps = Vec::new();
    for spec in specs {
        let pool = pools
            .entry(spec.name.clone())
            .or_insert_with(|| Arc::new(Pool::new(spec.name.clone(), &[], PoolOptions::default())))
            .clone();
        let workers = spec.workers;
        let name = spec.name.clone();
        let sup = Supervisor::start(spec, pool)?;
        eprintln!("drover: app {name:?} starting {workers} workers");
        apps.push(sup);
    }
    let mut balancers = Vec::new();
    for plan in plans {
        let pool = match &plan.app {
            Some(app) => Arc::clone(&pools[app]),
            None => run::static_pool(&plan),
        };
        match run::start(plan, pool) {
            Ok(b) => balancers.push(b),
            Err(e) => {
                for app in &apps {
                    app.shutdown().await;
                }
                return Err(e);
            }
        }
    }
    run::serve_until_signal(balancers, apps).await
}

fn app_spec(a: &AppConfig) -> AppSpec {
    let mut spec = AppSpec::new(a.name.clone(), a.command.clone());
    spec.workers = a.workers.resolve();
    spec.cwd = a.cwd.clone();
    spec.env = a.env.clone();
    spec.health = a.health.as_ref().map(plan::health_check);
    spec.ready_timeout = a.ready_timeout;
    spec.stop_timeout = a.stop_timeout;
    spec
}
