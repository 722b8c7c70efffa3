//! A balancer to start, whether it came from flags or from a drover.toml.

use crate::cli::ProxyArgs;
use crate::config::{self, BackendRef};
use drover_balance::Strategy;
use drover_proxy::{Limits, ProxyOptions, QueueOptions, Timeouts};
use drover_registry::{CheckKind, HealthCheck, PassivePolicy, PoolOptions, StatusRange};
use std::net::SocketAddr;
use std::time::Duration;

/// Everything needed to start one balancer.
#[derive(Debug, Clone)]
pub struct BalancerPlan {
    pub proxy: ProxyOptions,
    pub pool: PoolOptions,
    pub strategy: Strategy,
    /// Backend addresses with weights (empty when `app` is set).
    pub backends: Vec<(SocketAddr, u32)>,
    /// The supervised app whose workers are the backends (`backends = ["app:NAME"]`).
    pub app: Option<String>,
    /// Per-backend concurrency limits that differ from the pool's.
    pub max_conns: Vec<(SocketAddr, u32)>,
    /// Names whose DNS answers are backends.
    pub dns: Vec<drover_dns::DnsTarget>,
    /// The etcd prefix whose members are backends (and where members register).
    pub etcd: Option<String>,
    pub health: Option<HealthCheck>,
    pub drain_timeout: Duration,
}

/// What `drover proxy` runs when given flags instead of a file: the same model a file
/// fills, so a setting has one default and one set of checks.
pub fn proxy_config_from_args(a: &ProxyArgs) -> Result<config::Config, String> {
    let admin = match a.admin {
        Some(listen) => {
            drover_admin::check_exposure(listen, a.admin_token.as_deref()).map_err(|e| {
                format!("--admin {listen}: {e}; pass --admin-token TOKEN or set DROVER_ADMIN_TOKEN")
            })?;
            Some(config::AdminConfig {
                listen,
                token: a.admin_token.clone(),
            })
        }
        None => None,
    };
    let mut resolver = config::ResolverConfig::default();
    if !a.resolver.is_empty() {
        let servers = a
            .resolver
            .iter()
            .map(|s| config::nameserver(s).map_err(|e| format!("--resolver: {e}")))
            .collect::<Result<Vec<_>, _>>()?;
        resolver.nameservers = Some(servers);
    }
    for url in &a.etcd {
        config::check_etcd_endpoint(url).map_err(|e| format!("--etcd: {e}"))?;
    }
    let etcd = (!a.etcd.is_empty()).then(|| config::EtcdConfig {
        endpoints: a.etcd.clone(),
    });
    Ok(config::Config {
        admin,
        resolver,
        etcd,
        apps: Vec::new(),
        balancers: vec![BalancerPlan::config_from_args(a)?],
    })
}

impl BalancerPlan {
    /// The balancer the `proxy` flags describe, as a config entry so flags and files
    /// share one validation and one translation.
    pub fn config_from_args(a: &ProxyArgs) -> Result<config::BalancerConfig, String> {
        let listen = a.listen.ok_or("--listen is required without --config")?;
        if a.backend.is_empty() && a.admin.is_none() {
            return Err("at least one --backend is required (or --admin, for members that register at runtime)".into());
        }
        if !config::is_valid_name(&a.name) {
            return Err(format!("--name {:?}: {}", a.name, config::NAME_RULE));
        }
        let mut backends = Vec::new();
        for b in &a.backend {
            let backend = config::backend_from_flag(b, !a.etcd.is_empty())
                .map_err(|e| format!("--backend: {e}"))?;
            if backends.contains(&backend) {
                return Err(format!("--backend {b} is given twice"));
            }
            if matches!(backend, BackendRef::Etcd(_))
                && backends.iter().any(|o| matches!(o, BackendRef::Etcd(_)))
            {
                return Err(format!(
                    "--backend {b}: one etcd: prefix per balancer (the members API writes to it)"
                ));
            }
            backends.push(backend);
        }
        let mut b = config::BalancerConfig::new(a.name.clone(), listen, backends);
        b.apply_strategy(a.strategy, &a.keys)?;
        b.retries = a.retries;
        b.apply_limits(&a.limits);
        b.timeouts = config::TimeoutConfig {
            connect: a.connect_timeout,
            header_read: a.header_timeout,
            request: a.request_timeout,
            idle: a.idle_timeout,
            client: a.client_timeout,
        };
        if a.health_tcp || a.health_path.is_some() {
            b.health = Some(config::HealthCheckConfig {
                kind: match &a.health_path {
                    Some(path) => config::HealthCheckKind::Http {
                        path: path.clone(),
                        expect: (200, 399),
                    },
                    None => config::HealthCheckKind::Tcp,
                },
                interval: a.health_interval,
                timeout: a.health_timeout,
                rise: a.rise,
                fall: a.fall,
            });
        }
        b.slow_start = a.slow_start;
        b.drain_timeout = a.drain_timeout;
        b.threads = Some(a.threads);
        Ok(b)
    }

    /// Translates a validated config entry into the parts that run it.
    pub fn from_config(b: &config::BalancerConfig) -> Result<BalancerPlan, String> {
        let mut backends = Vec::new();
        let mut max_conns = Vec::new();
        let mut app = None;
        let (mut dns, mut etcd) = (Vec::new(), None);
        for backend in &b.backends {
            match backend {
                BackendRef::Addr {
                    addr,
                    weight,
                    max_conns: own,
                } => {
                    backends.push((*addr, *weight));
                    if let Some(m) = own {
                        max_conns.push((*addr, *m));
                    }
                }
                BackendRef::App(name) => app = Some(name.clone()),
                BackendRef::Dns(target) => dns.push(target.clone()),
                BackendRef::Etcd(prefix) => etcd = Some(prefix.clone()),
            }
        }
        if app.is_some() && b.backends.len() > 1 {
            // One pool per balancer: an app's workers come and go under the supervisor,
            // and mixing them with fixed addresses would make both harder to reason about.
            return Err(format!(
                "balancer {:?}: backends = [\"app:NAME\"] must be the only backend; run fixed addresses behind a balancer of their own",
                b.name
            ));
        }
        let health = b.health.as_ref().map(health_check);
        if let Some(h) = &health {
            h.validate()
                .map_err(|e| format!("balancer {:?}: health: {e}", b.name))?;
        }
        let passive = PassivePolicy {
            connect_failures: if b.passive.failures == 0 { 0 } else { 1 },
            consecutive_5xx: b.passive.failures,
            base_ejection: b.passive.ejection,
            max_ejection: b.passive.max_ejection,
            slow_start: b.slow_start,
            ..PassivePolicy::default()
        };
        Ok(BalancerPlan {
            proxy: ProxyOptions {
                name: b.name.clone(),
                listen: b.listen,
                threads: b.threads.unwrap_or_else(default_threads),
                retries: b.retries,
                timeouts: Timeouts {
                    connect: b.timeouts.connect,
                    header_read: b.timeouts.header_read,
                    request: b.timeouts.request,
                    idle: b.timeouts.idle,
                    client: b.timeouts.client,
                },
                limits: Limits {
                    max_header_bytes: b.limits.max_header_bytes,
                    max_uri_bytes: b.limits.max_uri_bytes,
                    max_headers: b.limits.max_headers,
                },
                queue: QueueOptions {
                    max: b.queue.max.as_usize(),
                    // A request that waits here would have waited inside a busy backend
                    // anyway; by default it may wait as long as a backend may take.
                    timeout: b.queue.timeout.unwrap_or(b.timeouts.request),
                },
                hash_key: b.hash.clone(),
                sticky_cookie: b.sticky.as_ref().map(|s| s.cookie.clone()),
                ..ProxyOptions::default()
            },
            pool: PoolOptions {
                slow_start: b.slow_start,
                max_conns: match b.max_conns {
                    config::ConnLimit::Auto => 0,
                    config::ConnLimit::Fixed(n) => n,
                },
                adaptive_limit: b.max_conns == config::ConnLimit::Auto,
                initially_unhealthy: false,
                passive,
            },
            strategy: b.strategy,
            backends,
            app,
            max_conns,
            dns,
            etcd,
            health,
            drain_timeout: b.drain_timeout,
        })
    }
}

/// A config health check as the registry runs it.
pub fn health_check(h: &config::HealthCheckConfig) -> HealthCheck {
    HealthCheck {
        kind: match &h.kind {
            config::HealthCheckKind::Http { path, expect } => CheckKind::Http {
                path: path.clone(),
                expect: StatusRange::new(expect.0, expect.1),
            },
            config::HealthCheckKind::Tcp => CheckKind::Tcp,
        },
        interval: h.interval,
        timeout: h.timeout,
        rise: h.rise,
        fall: h.fall,
    }
}

/// One serving thread per core, as nginx's `worker_processes auto`.
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    /// The flags' defaults are written as text for `--help`; they must be the proxy's.
    #[test]
    fn flag_defaults_are_the_proxys_defaults() {
        let cli = crate::cli::Cli::try_parse_from([
            "drover",
            "proxy",
            "-l",
            "127.0.0.1:0",
            "-b",
            "127.0.0.1:1",
        ])
        .unwrap();
        let crate::cli::Command::Proxy(a) = cli.command else {
            panic!("not the proxy command");
        };
        let b = BalancerPlan::config_from_args(&a).unwrap();
        // Every setting the flags leave alone is what a file that leaves it out gets.
        let mut file = config::BalancerConfig::new("default", b.listen, b.backends.clone());
        file.threads = b.threads;
        assert_eq!(b, file);
    }
}
