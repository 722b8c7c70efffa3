//! The balancers running now, and how a reload changes them: new ones start, removed
//! ones drain, changed ones take their new settings on the sockets they hold.

use crate::config::{BackendRef, BalancerConfig};
use crate::plan::BalancerPlan;
use drover_proxy::{Proxy, ReconfigureError};
use drover_registry::{spawn_active_checks, ActiveChecks, MemberStore, Members, Pool, Source};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One running balancer.
pub struct RunningBalancer {
    pub name: String,
    /// Where it accepts clients (the bound address, when `:0` was asked for).
    pub listen: SocketAddr,
    pub pool: Arc<Pool>,
    /// Members that register at runtime.
    pub members: Arc<dyn MemberStore>,
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
}

impl RunningBalancer {
    /// Starts `plan` (from `config`) over `pool`, with the runtime `members` of the
    /// balancer it replaces, if any. Must run inside the control runtime (health checks
    /// and the members' sweeper live there). A supervised app's pool is checked by its
    /// supervisor, not here. The error is the bind's: the caller knows where the
    /// address was configured.
    pub fn start(
        config: BalancerConfig,
        plan: BalancerPlan,
        pool: Arc<Pool>,
        members: Option<Arc<dyn MemberStore>>,
    ) -> std::io::Result<RunningBalancer> {
        apply_pool_plan(&pool, &plan);
        let checks = active_checks(&plan, &pool);
        let name = plan.proxy.name.clone();
        let strategy = plan.strategy.to_string();
        let proxy = Proxy::start(plan.proxy, Arc::clone(&pool), plan.strategy.build())?;
        let over = match &plan.app {
            Some(app) => format!("app {app:?}"),
            None => format!("{} backends", plan.backends.len()),
        };
        // Scripts and tests read this line to learn the port when listening on :0.
        eprintln!(
            "drover: balancer {name:?} listening on {} ({over}, strategy {strategy})",
            proxy.local_addr(),
        );
        let members = members.unwrap_or_else(|| {
            let members = Members::new(Arc::clone(&pool), Source::Admin);
            members.spawn_sweeper();
            members
        });
        Ok(RunningBalancer {
            name,
            listen: proxy.local_addr(),
            pool,
            members,
            proxy,
            state: Mutex::new(State {
                config,
                strategy,
                app: plan.app,
                checks,
                drain_timeout: plan.drain_timeout,
            }),
        })
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

    pub fn drain_timeout(&self) -> Duration {
        self.state().drain_timeout
    }

    /// Checks that `plan` can be applied with `reconfigure`, changing nothing.
    pub fn can_reconfigure(&self, plan: &BalancerPlan) -> Result<(), ReconfigureError> {
        let (from, to) = (self.proxy.thread_count(), plan.proxy.threads.max(1));
        if from != to {
            return Err(ReconfigureError::ThreadsChanged { from, to });
        }
        Ok(())
    }

    /// Applies `plan` (from `config`), whose listen address is this balancer's: new
    /// settings and strategy on the same sockets, the same pool with its new options
    /// and backends (endpoints that stay keep their state), new health checks if they
    /// changed. Call `can_reconfigure` first; this fails only where that said so.
    pub fn reconfigure(
        &self,
        config: BalancerConfig,
        plan: BalancerPlan,
    ) -> Result<(), ReconfigureError> {
        let mut state = self.state();
        self.proxy.reconfigure(
            plan.proxy.clone(),
            Arc::clone(&self.pool),
            plan.strategy.build(),
        )?;
        apply_pool_plan(&self.pool, &plan);
        if state.config.health != config.health {
            // The old checks stop when dropped; the endpoints keep their verdicts.
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
                    open = self.proxy.active_connections(),
                    "drain timeout reached; closing remaining connections"
                );
            }
        });
    }
}

/// A plan's pool options and fixed backends, on a pool that may already run (the
/// endpoints that stay keep their state).
fn apply_pool_plan(pool: &Pool, plan: &BalancerPlan) {
    if *pool.options() != plan.pool {
        pool.set_options(plan.pool.clone());
    }
    if plan.app.is_none() {
        pool.set_source(Source::Static, &plan.backends);
        for (addr, max) in &plan.max_conns {
            if let Some(ep) = pool.find(*addr) {
                ep.set_max_conns(*max);
            }
        }
    }
}

fn active_checks(plan: &BalancerPlan, pool: &Arc<Pool>) -> Option<ActiveChecks> {
    plan.health
        .clone()
        .filter(|_| plan.app.is_none())
        .map(|check| spawn_active_checks(Arc::clone(pool), check))
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

/// The app a balancer config balances over, if any.
pub fn app_of(config: &BalancerConfig) -> Option<&str> {
    config.backends.iter().find_map(|b| match b {
        BackendRef::App(name) => Some(name.as_str()),
        BackendRef::Addr { .. } => None,
    })
}
