//! The balancers running now, and how a reload changes them: new ones start, removed
//! ones drain, changed ones take their new settings on the sockets they hold.

use drover_config::plan::BalancerPlan;
use drover_config::{BackendRef, BalancerConfig, EtcdConfig, ResolverConfig};
use drover_dns::{DnsSource, DnsTarget};
use drover_etcd::{EtcdAuth, EtcdMembers, EtcdOptions, EtcdTls, TlsClient};
use drover_metrics::BalancerSnapshot;
use drover_proxy::routes::{HttpRoute, HttpRoutes, Route, Routes, SniRoutes};
use drover_proxy::{H2Probe, Proxy, ReconfigureError};
use drover_registry::{
    spawn_active_checks_with, ActiveChecks, MemberStore, Members, Pool, Probing, Source,
};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One running balancer.
pub struct RunningBalancer {
    pub name: String,
    /// Where it accepts clients (the bound address, when `:0` was asked for); `None`:
    /// nowhere, it serves what other balancers' routes send it.
    pub listen: Option<SocketAddr>,
    pub pool: Arc<Pool>,
    pub proxy: Proxy,
    state: Mutex<State>,
}

/// What a reload replaces.
struct State {
    config: BalancerConfig,
    strategy: String,
    app: Option<String>,
    checks: Option<ActiveChecks>,
    drain_timeout: Duration,
    /// The DNS names followed, the resolver settings, and the source following them.
    dns: Option<(Vec<DnsTarget>, ResolverConfig, DnsSource)>,
    /// Where members that register at runtime are kept.
    store: Store,
}

/// Where members come from besides the balancer's own entry: the file's `[resolver]`
/// and `[etcd]`.
#[derive(Debug, Clone, Copy)]
pub struct Discovery<'a> {
    pub resolver: &'a ResolverConfig,
    pub etcd: Option<&'a EtcdConfig>,
}

/// A balancer's runtime members: in its own memory, or, with an `etcd:` backend, in
/// etcd, where every balancer watching the prefix sees them.
#[derive(Clone)]
enum Store {
    Local(Arc<Members>),
    Etcd {
        prefix: String,
        cluster: EtcdConfig,
        members: Arc<EtcdMembers>,
    },
}

impl Store {
    /// The store `plan` asks for, reusing `previous` when it is that one already.
    fn for_plan(
        plan: &BalancerPlan,
        etcd: Option<&EtcdConfig>,
        pool: &Arc<Pool>,
        previous: Option<&Store>,
    ) -> Store {
        match (&plan.etcd, etcd) {
            (Some(prefix), Some(cluster)) => match previous {
                Some(
                    same @ Store::Etcd {
                        prefix: p,
                        cluster: c,
                        ..
                    },
                ) if p == prefix && c == cluster => same.clone(),
                _ => Store::Etcd {
                    prefix: prefix.clone(),
                    cluster: cluster.clone(),
                    members: EtcdMembers::start_with(
                        cluster.endpoints.clone(),
                        prefix.clone(),
                        Arc::clone(pool),
                        EtcdOptions {
                            tls: cluster.tls.as_ref().map(etcd_tls),
                            auth: cluster.auth.as_ref().map(etcd_auth),
                            ..EtcdOptions::default()
                        },
                    ),
                },
            },
            _ => match previous {
                Some(local @ Store::Local(_)) => local.clone(),
                _ => {
                    let members = Members::new(Arc::clone(pool), Source::Admin);
                    members.spawn_sweeper();
                    Store::Local(members)
                }
            },
        }
    }

    fn as_dyn(&self) -> Arc<dyn MemberStore> {
        match self {
            Store::Local(m) => Arc::clone(m) as Arc<dyn MemberStore>,
            Store::Etcd { members, .. } => Arc::clone(members) as Arc<dyn MemberStore>,
        }
    }

    fn same(&self, other: &Store) -> bool {
        match (self, other) {
            (Store::Local(a), Store::Local(b)) => Arc::ptr_eq(a, b),
            (Store::Etcd { members: a, .. }, Store::Etcd { members: b, .. }) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }

    /// Takes what a store that is being replaced put in the pool out of it.
    fn clear(&self, pool: &Pool) {
        match self {
            Store::Local(_) => pool.set_source(Source::Admin, &[]),
            Store::Etcd { .. } => pool.set_source(Source::Etcd, &[]),
        };
    }
}

/// Why a balancer did not start.
#[derive(Debug)]
pub enum StartError {
    /// Its listen address could not be bound.
    Bind(std::io::Error),
    /// Its DNS names cannot be followed (the system's resolver settings are unreadable).
    Dns(drover_dns::SetupError),
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StartError::Bind(e) => write!(f, "{e}"),
            StartError::Dns(e) => write!(f, "dns: {e}"),
        }
    }
}

/// The sockets a balancer serves on.
pub enum Sockets {
    /// Its listen address, bound at start.
    Bind,
    /// A socket systemd passed, instead of binding.
    Passed(std::net::TcpListener),
    /// Its listen address, and these listening sockets bound elsewhere.
    BindAlso(Vec<std::net::TcpListener>),
}

impl RunningBalancer {
    /// Starts `plan` (from `config`) over `pool`; a balancer it replaces (its address
    /// changed) hands over its runtime members. Must run inside the control runtime
    /// (health checks, DNS lookups, the etcd watch and the members' sweeper live
    /// there). In a supervised app's pool, the workers are checked by their
    /// supervisor; the health checks here probe the other members. It serves on
    /// `sockets`.
    pub async fn start(
        config: BalancerConfig,
        plan: BalancerPlan,
        discovery: Discovery<'_>,
        pool: Arc<Pool>,
        replaces: Option<&RunningBalancer>,
        sockets: Sockets,
    ) -> Result<RunningBalancer, StartError> {
        apply_pool_plan(&pool, &plan);
        let previous = replaces.map(|b| b.state().store.clone());
        let store = Store::for_plan(&plan, discovery.etcd, &pool, previous.as_ref());
        // An etcd prefix is listed before the listener opens, as names are looked up:
        // a balancer restarted under load answered its first clients 503 (no member
        // yet). An etcd that does not answer within a request's time holds it no longer.
        if let Store::Etcd { members, .. } = &store {
            members
                .wait_for_revision(1, EtcdOptions::default().op_timeout)
                .await;
        }
        // Names are looked up before the listener opens, so it serves with them.
        let dns = follow_dns(&plan, discovery.resolver, &pool)
            .await
            .map_err(StartError::Dns)?;
        // The pool may have served another balancer: an app's, which outlives the
        // balancers in front of it, or the one this replaces. Names and a prefix this
        // plan does not follow leave it.
        if dns.is_none() {
            pool.set_source(Source::Dns, &[]);
        }
        if !matches!(store, Store::Etcd { .. }) {
            pool.set_source(Source::Etcd, &[]);
        }
        let checks = active_checks(&plan, &pool);
        let name = plan.proxy.name.clone();
        let strategy = plan.strategy.to_string();
        let tcp = if plan.proxy.protocol == drover_proxy::Protocol::Tcp {
            ", tcp"
        } else {
            ""
        };
        let (opts, strategy_built) = (plan.proxy, plan.strategy.build());
        let proxy = match sockets {
            Sockets::Passed(listener) => {
                Proxy::start_on(opts, listener, Arc::clone(&pool), strategy_built)
            }
            _ if opts.listen.is_none() => Proxy::unbound(opts, Arc::clone(&pool), strategy_built),
            Sockets::Bind => Proxy::start(opts, Arc::clone(&pool), strategy_built),
            Sockets::BindAlso(also) => {
                Proxy::start_also(opts, also, Arc::clone(&pool), strategy_built)
            }
        }
        .map_err(StartError::Bind)?;
        let over = match &plan.app {
            Some(app) if plan.backends.is_empty() => format!("app {app:?}"),
            Some(app) => format!(
                "app {app:?} and {}",
                drover_units::count(plan.backends.len(), "backend")
            ),
            None => drover_units::count(plan.backends.len(), "backend"),
        };
        // Scripts and tests read this line to learn the port when listening on :0.
        let also: String = proxy
            .also_addrs()
            .iter()
            .map(|addr| format!(" and {addr}"))
            .collect();
        match proxy.local_addr() {
            Some(addr) => drover_spool::eprintln!(
                "drover: balancer {name:?} listening on {addr}{also} ({over}, strategy {strategy}{tcp})"
            ),
            None => drover_spool::eprintln!(
                "drover: balancer {name:?} serving what routes send it ({over}, strategy {strategy}{tcp})"
            ),
        }
        Ok(RunningBalancer {
            name,
            listen: proxy.local_addr(),
            pool,
            proxy,
            state: Mutex::new(State {
                config,
                strategy,
                app: plan.app,
                checks,
                drain_timeout: plan.drain_timeout,
                dns,
                store,
            }),
        })
    }

    /// Where members that register at runtime are kept.
    pub fn members(&self) -> Arc<dyn MemberStore> {
        self.state().store.as_dyn()
    }

    /// Why each endpoint's active health checks are failing, for those whose last
    /// check failed.
    pub fn check_errors(&self) -> std::collections::HashMap<std::net::SocketAddr, String> {
        let state = self.state();
        let Some(checks) = &state.checks else {
            return Default::default();
        };
        checks
            .report()
            .into_iter()
            .filter(|r| r.failures > 0)
            .filter_map(|r| Some((r.addr, r.last_error?)))
            .collect()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn config(&self) -> BalancerConfig {
        self.state().config.clone()
    }

    pub fn strategy(&self) -> String {
        self.state().strategy.clone()
    }

    pub fn app(&self) -> Option<String> {
        self.state().app.clone()
    }

    /// "http" or "tcp", as `mode` in a drover.toml.
    pub fn mode(&self) -> String {
        self.state().config.mode.to_string()
    }

    pub fn drain_timeout(&self) -> Duration {
        self.state().drain_timeout
    }

    /// How long it still accepts once a stop begins (`BalancerConfig::shutdown_delay`).
    pub fn shutdown_delay(&self) -> Duration {
        self.state().config.shutdown_delay
    }

    /// Checks that `plan` can be applied with `reconfigure`, changing nothing.
    pub fn can_reconfigure(&self, plan: &BalancerPlan) -> Result<(), ReconfigureError> {
        let (from, to) = (self.proxy.thread_count(), plan.proxy.threads.max(1));
        if from != to {
            return Err(ReconfigureError::ThreadsChanged { from, to });
        }
        let (from, to) = (self.state().config.mode, plan.proxy.protocol);
        if from != to {
            return Err(ReconfigureError::ModeChanged { from, to });
        }
        Ok(())
    }

    /// Applies `plan` (from `config`), whose listen address is this balancer's: new
    /// settings and strategy on the same sockets, the same pool with its new options
    /// and backends (endpoints that stay keep their state), new health checks and DNS
    /// names if they changed. Call `can_reconfigure` first; this fails only where that
    /// said so. DNS names that cannot be followed now (the system's resolver settings
    /// are unreadable) keep the old ones, with an error logged.
    pub async fn reconfigure(
        &self,
        config: BalancerConfig,
        plan: BalancerPlan,
        discovery: Discovery<'_>,
    ) -> Result<(), ReconfigureError> {
        let resolver = discovery.resolver;
        let dns_changed = {
            let state = self.state();
            match &state.dns {
                Some((targets, settings, _)) => *targets != plan.dns || settings != resolver,
                None => !plan.dns.is_empty(),
            }
        };
        // The new source starts before the old one stops, so no answer is missed.
        let new_dns = if dns_changed {
            match follow_dns(&plan, resolver, &self.pool).await {
                Ok(dns) => Some(dns),
                Err(e) => {
                    tracing::error!(balancer = %self.name, "dns: {e}; keeping the names followed so far");
                    None
                }
            }
        } else {
            None
        };
        let mut state = self.state();
        if let Some(dns) = new_dns {
            if dns.is_none() {
                self.pool.set_source(Source::Dns, &[]);
            }
            state.dns = dns;
        }
        self.proxy.reconfigure(
            plan.proxy.clone(),
            Arc::clone(&self.pool),
            plan.strategy.build(),
        )?;
        apply_pool_plan(&self.pool, &plan);
        let store = Store::for_plan(&plan, discovery.etcd, &self.pool, Some(&state.store));
        if !store.same(&state.store) {
            // The new store has applied its view; what the old one put in the pool goes.
            let old = std::mem::replace(&mut state.store, store);
            let kinds_differ = matches!(
                (&old, &state.store),
                (Store::Local(_), Store::Etcd { .. }) | (Store::Etcd { .. }, Store::Local(_))
            );
            if kinds_differ {
                old.clear(&self.pool);
            }
        }
        let probes_changed = state.config.health != config.health
            || state.config.send_proxy_protocol != config.send_proxy_protocol
            || state.config.backend_protocol != config.backend_protocol;
        if probes_changed || config.backend_tls.is_some() {
            // The old checks stop when dropped; the endpoints keep their verdicts. A
            // PROXY header turned on or off changes each probe's first bytes, HTTP/2
            // to the backends (or back) what each probe speaks; with
            // backend_tls they probe with the files just read again.
            state.checks = active_checks(&plan, &self.pool);
        }
        state.strategy = plan.strategy.to_string();
        state.drain_timeout = plan.drain_timeout;
        state.config = config;
        Ok(())
    }

    /// Stops accepting, lets the connections finish within the drain timeout, then
    /// closes what is left; in the background.
    pub fn retire(self: Arc<Self>) {
        self.proxy.begin_shutdown();
        tokio::spawn(async move {
            let timeout = self.drain_timeout();
            if !self.proxy.drained(timeout).await {
                tracing::warn!(
                    balancer = %self.name,
                    open = self.proxy.connections(),
                    "drain timeout reached; closing remaining connections"
                );
            }
        });
    }
}

/// A plan's pool options and fixed backends, on a pool that may already run (the
/// endpoints that stay keep their state). In an app's pool the fixed backends are the
/// static source beside the supervisor's workers, which this leaves alone.
fn apply_pool_plan(pool: &Pool, plan: &BalancerPlan) {
    if *pool.options() != plan.pool {
        pool.set_options(plan.pool.clone());
    }
    pool.set_source(Source::Static, &plan.backends);
    for (addr, max) in &plan.max_conns {
        if let Some(ep) = pool.find(*addr) {
            ep.set_max_conns(*max);
        }
    }
}

/// Follows the plan's DNS names into `pool`, if it has any.
async fn follow_dns(
    plan: &BalancerPlan,
    resolver: &ResolverConfig,
    pool: &Arc<Pool>,
) -> Result<Option<(Vec<DnsTarget>, ResolverConfig, DnsSource)>, drover_dns::SetupError> {
    if plan.dns.is_empty() {
        return Ok(None);
    }
    let source = DnsSource::start(plan.dns.clone(), resolver.clone(), Arc::clone(pool)).await?;
    for (target, e) in source.first_errors() {
        // Not fatal: the name is looked up again, and other backends serve meanwhile.
        tracing::warn!(balancer = %plan.proxy.name, %target, "dns: {e}; retrying");
        drover_spool::eprintln!(
            "drover: warning: balancer {:?}: {target} does not resolve yet: {e}",
            plan.proxy.name
        );
    }
    Ok(Some((plan.dns.clone(), resolver.clone(), source)))
}

/// The plan's active health checks on `pool`. They never probe an app's workers
/// (`spawn_active_checks` leaves the supervisor's members to it), so beside an app they
/// check the fixed, DNS, etcd and registered members only.
fn active_checks(plan: &BalancerPlan, pool: &Arc<Pool>) -> Option<ActiveChecks> {
    // A backend that expects a PROXY protocol header refuses a probe without one.
    let preamble = plan
        .proxy
        .send_proxy_protocol
        .map(drover_proxy::proxy_protocol::local_header)
        .unwrap_or_default();
    // With backend_tls, each probe does the handshake a request would: a certificate
    // that does not verify fails the check, with why.
    // With HTTP/2 to the backends, each probe is a stream (over TLS for "h2").
    let tls = plan.proxy.backend_tls.clone();
    let wrap = if plan.proxy.backend_protocol.is_http2() {
        Some(Arc::new(H2Probe { tls }) as Arc<dyn drover_registry::WrapProbe>)
    } else {
        tls.map(|c| c as Arc<dyn drover_registry::WrapProbe>)
    };
    let probing = Probing {
        preamble: preamble.into(),
        wrap,
    };
    plan.health
        .clone()
        .map(|check| spawn_active_checks_with(Arc::clone(pool), check, probing))
}

/// The pool a plan's fixed backends make up (`RunningBalancer::start` applies their
/// own limits).
pub fn static_pool(plan: &BalancerPlan) -> Arc<Pool> {
    Arc::new(Pool::new(
        plan.proxy.name.clone(),
        &plan.backends,
        plan.pool.clone(),
    ))
}

impl RunningBalancer {
    /// Its counts, queue and endpoints now, for `/metrics` and the dashboard.
    pub fn metrics(&self) -> BalancerSnapshot {
        let sessions = self.proxy.sessions_by_endpoint();
        BalancerSnapshot {
            name: self.name.clone(),
            counts: self.proxy.stats().snapshot(),
            queue_depth: self.proxy.queue_depth() as u64,
            connections: self.proxy.connections() as u64,
            endpoints: self
                .pool
                .metrics(|id| sessions.get(id).copied().unwrap_or(0)),
        }
    }

    /// The DNS names and the etcd prefix it follows, for the status view.
    pub fn source_rows(&self) -> Vec<drover_admin::SourceRow> {
        let state = self.state();
        let mut rows = Vec::new();
        if let Store::Etcd {
            prefix, members, ..
        } = &state.store
        {
            let st = members.status();
            let since = st.since.elapsed().unwrap_or_default().as_secs_f64();
            let detail = match (&st.connected, &st.last_error) {
                (true, _) if st.kept > 0 => format!(
                    "watching at revision {}; it lists no member: serving the {} it \
                     listed last until it lists one",
                    st.revision, st.kept
                ),
                (true, _) => format!("watching at revision {}", st.revision),
                (false, Some(e)) => format!(
                    "unreachable for {since:.0}s ({e}); serving the last view, reconnecting"
                ),
                (false, None) => "connecting".to_string(),
            };
            rows.push(drover_admin::SourceRow {
                kind: "etcd".into(),
                target: prefix.clone(),
                ok: st.connected,
                members: st.members,
                detail,
            });
        }
        let Some((_, _, source)) = &state.dns else {
            return rows;
        };
        rows.extend(source.status().into_iter().map(|t| {
            let next = t
                .next_lookup
                .saturating_duration_since(tokio::time::Instant::now());
            let detail = match &t.last_error {
                Some(e) => format!(
                    "{e} ({} lookups in a row failed); keeping the last answer, next try in {:.1}s",
                    t.failures,
                    next.as_secs_f64()
                ),
                None if next.is_zero() => "looking up now".to_string(),
                None => format!("next lookup in {:.1}s", next.as_secs_f64()),
            };
            drover_admin::SourceRow {
                kind: "dns".into(),
                target: t.target.to_string(),
                ok: t.is_ok(),
                members: t.members.len(),
                detail,
            }
        }));
        rows
    }
}

/// Points each balancer's routes at the balancers they name, as running now (`all`):
/// at start, and after a reload put every balancer in place, since a route's balancer
/// may have been started anew. A balancer without routes serves on its own pool.
pub fn wire_routes(all: &[Arc<RunningBalancer>]) {
    for b in all {
        let config = b.config();
        if config.routes.is_empty() {
            b.proxy.set_routes(None);
            continue;
        }
        // The file's validation makes each name a running balancer.
        let target = |name: &str| {
            all.iter()
                .find(|t| t.name == name)
                .map(|t| t.proxy.route_target())
        };
        // What no route matches goes to the balancer's own backends, if it has any.
        let own = !config.backends.is_empty();
        let routes = match config.mode {
            drover_proxy::Protocol::Tcp => Routes::Sni(SniRoutes::new(
                config
                    .routes
                    .iter()
                    .filter_map(|r| {
                        Some(Route {
                            sni: r.sni.clone(),
                            target: target(&r.balancer)?,
                        })
                    })
                    .collect(),
                own,
            )),
            drover_proxy::Protocol::Http => Routes::Http(HttpRoutes::new(
                config
                    .routes
                    .iter()
                    .filter_map(|r| {
                        Some(HttpRoute {
                            hosts: r.host.clone(),
                            path_prefix: r.path_prefix.clone(),
                            strip_prefix: r.strip_prefix,
                            target: target(&r.balancer)?,
                        })
                    })
                    .collect(),
                own,
            )),
        };
        b.proxy.set_routes(Some(routes));
    }
}

/// The etcd client's TLS: the files of `settings`, read at each new connection (the
/// start and each reload have checked them; a file replaced since is read as it is).
fn etcd_tls(settings: &drover_config::BackendTlsConfig) -> EtcdTls {
    let settings = settings.clone();
    EtcdTls(Arc::new(move || {
        let c = drover_config::plan::load_etcd_tls(&settings).map_err(|e| e.to_string())?;
        Ok(TlsClient {
            config: c.client_config(),
            server_name: c.server_name().cloned(),
        })
    }))
}

/// The etcd client's login: the user, and its password read from the file at each
/// login (the start and each reload have read it; a password changed since is used).
fn etcd_auth(settings: &drover_config::EtcdAuthConfig) -> EtcdAuth {
    let settings = settings.clone();
    EtcdAuth {
        user: settings.user.clone(),
        password: Arc::new(move || {
            drover_config::plan::read_etcd_password(&settings).map_err(|e| e.to_string())
        }),
    }
}

/// The discovery settings of a config.
pub fn discovery(cfg: &drover_config::Config) -> Discovery<'_> {
    Discovery {
        resolver: &cfg.resolver,
        etcd: cfg.etcd.as_ref(),
    }
}

/// The app a balancer config balances over, if any.
pub fn app_of(config: &BalancerConfig) -> Option<&str> {
    config.backends.iter().find_map(|b| match b {
        BackendRef::App(name) => Some(name.as_str()),
        _ => None,
    })
}
