//! What every way of starting checks before it starts anything, and `drover check` and
//! a reload with it: each balancer's plan, each app's settings, and each app's program
//! (found, and executable). The file's own rules ran when it loaded (`file`). Binding
//! the listen addresses is the caller's: only it knows whether a running drover holds
//! one ([`listen_addresses`] lists them).

use crate::file::Origins;
use crate::model::Config;
use crate::plan::BalancerPlan;
use drover_supervisor::AppSpec;
use std::net::SocketAddr;

/// A config's parts, ready to run.
#[derive(Debug)]
pub struct Prepared {
    /// One per `[[balancer]]`, in file order.
    pub plans: Vec<BalancerPlan>,
    /// One per `[[app]]`, in file order.
    pub specs: Vec<AppSpec>,
}

/// Plans every balancer and app of `cfg`, or every reason it cannot run (not just the
/// first: `drover check` lists them all), each named with its place in the file or the
/// flag it came from where that is known.
pub fn prepare(cfg: &Config, origins: &Origins) -> Result<Prepared, Vec<String>> {
    let mut errors = Vec::new();
    let mut plans = Vec::with_capacity(cfg.balancers.len());
    for (i, b) in cfg.balancers.iter().enumerate() {
        match BalancerPlan::from_config(b) {
            Ok(plan) => plans.push(plan),
            Err(e) => errors.push(match e.key(i) {
                Some(key) => origins.error(&key, e.to_string()),
                None => e.to_string(),
            }),
        }
        // Opened as the writer will: a missing directory or a file that cannot be
        // appended to fails the start, not the first request's line.
        if let Err(e) = b.access_log.check_path() {
            let key = format!("balancer[{i}].access_log.path");
            let message = format!(
                "balancer {:?}: cannot open {} for append: {e}",
                b.name, b.access_log.path
            );
            errors.push(origins.error(&key, message));
        }
    }
    let mut specs = Vec::with_capacity(cfg.apps.len());
    for (i, a) in cfg.apps.iter().enumerate() {
        let spec = a.spec.clone();
        if let Err(e) = spec.validate() {
            errors.push(format!("app {:?}: {e}", spec.name));
            continue;
        }
        // A program that cannot start would only restart forever behind a balancer
        // that never gets a worker.
        if let Err(e) = spec.resolve_program() {
            let key = format!("app[{i}].command");
            errors.push(origins.error(&key, format!("app {:?}: {e}", spec.name)));
            continue;
        }
        specs.push(spec);
    }
    if errors.is_empty() {
        Ok(Prepared { plans, specs })
    } else {
        Err(errors)
    }
}

/// An address drover itself binds for `cfg`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenAddress {
    /// The setting's key, as `Origins` knows it (`balancer[0].listen`).
    pub key: String,
    pub owner: Listener,
    pub addr: SocketAddr,
}

/// What listens at a [`ListenAddress`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listener {
    /// The balancer of this name.
    Balancer(String),
    /// The shared-mode app of this name (its workers accept there).
    App(String),
    AdminApi,
}

impl std::fmt::Display for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Listener::Balancer(name) => write!(f, "balancer {name:?}"),
            Listener::App(name) => write!(f, "app {name:?}"),
            Listener::AdminApi => f.write_str("admin API"),
        }
    }
}

/// Every address drover binds for `cfg`: each balancer's, each shared-mode app's, and
/// the admin API's.
pub fn listen_addresses(cfg: &Config) -> Vec<ListenAddress> {
    let balancers = cfg
        .balancers
        .iter()
        .enumerate()
        .map(|(i, b)| ListenAddress {
            key: format!("balancer[{i}].listen"),
            owner: Listener::Balancer(b.name.clone()),
            addr: b.listen,
        });
    let apps = cfg.apps.iter().enumerate().filter_map(|(i, a)| {
        Some(ListenAddress {
            key: format!("app[{i}].listen"),
            owner: Listener::App(a.spec.name.clone()),
            addr: a.listen?,
        })
    });
    let admin = cfg.admin.iter().map(|a| ListenAddress {
        key: "admin.listen".into(),
        owner: Listener::AdminApi,
        addr: a.listen,
    });
    balancers.chain(apps).chain(admin).collect()
}
