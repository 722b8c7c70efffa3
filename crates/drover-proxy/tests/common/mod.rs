//! The data plane in this test process: a `Proxy` started on `127.0.0.1:0` over
//! testkit backends, with no binary, flags or config in between (those are the
//! `drover` crate's tests).

#![allow(dead_code)] // each test file uses its own share

use drover_balance::Strategy;
use drover_proxy::{Proxy, ProxyOptions};
use drover_registry::{Pool, PoolOptions};
use std::net::SocketAddr;
use std::sync::Arc;

/// A running `Proxy`; shut down when dropped.
pub struct InProcess {
    proxy: Proxy,
}

impl InProcess {
    pub fn addr(&self) -> SocketAddr {
        self.proxy.local_addr().expect("a listener")
    }

    /// This balancer as routes send to it.
    pub fn route_target(&self) -> drover_proxy::routes::RouteTarget {
        self.proxy.route_target()
    }

    /// Places requests by these routes from now on.
    pub fn set_routes(&self, routes: Option<drover_proxy::routes::Routes>) {
        self.proxy.set_routes(routes);
    }

    /// The balancer's counts so far (requests, errors, retries by cause).
    pub fn counts(&self) -> drover_metrics::BalancerCounts {
        self.proxy.stats().snapshot()
    }

    /// Client connections open now.
    pub fn client_connections(&self) -> usize {
        self.proxy.connections()
    }

    /// Requests waiting in drover's queue now.
    pub fn queue_depth(&self) -> usize {
        self.proxy.queue_depth()
    }
}

impl Drop for InProcess {
    fn drop(&mut self) {
        self.proxy.begin_shutdown();
    }
}

/// A proxy with one serving thread over `backends` by `strategy`, its options the
/// library's defaults as `tune` leaves them.
pub fn proxy(
    backends: &[SocketAddr],
    strategy: Strategy,
    tune: impl FnOnce(&mut ProxyOptions),
) -> InProcess {
    proxy_with_pool(backends, strategy, tune, |_| {})
}

/// As `proxy`, with the pool's options (limits, passive health) as `tune_pool` leaves
/// the library's defaults.
pub fn proxy_with_pool(
    backends: &[SocketAddr],
    strategy: Strategy,
    tune: impl FnOnce(&mut ProxyOptions),
    tune_pool: impl FnOnce(&mut PoolOptions),
) -> InProcess {
    let mut opts = ProxyOptions {
        listen: Some(SocketAddr::from(([127, 0, 0, 1], 0))),
        threads: 1,
        ..ProxyOptions::default()
    };
    tune(&mut opts);
    let mut pool_opts = PoolOptions::default();
    tune_pool(&mut pool_opts);
    let members: Vec<(SocketAddr, u32)> = backends.iter().map(|&a| (a, 1)).collect();
    let pool = Arc::new(Pool::new(opts.name.clone(), &members, pool_opts));
    let proxy = match opts.listen {
        Some(_) => Proxy::start(opts, pool, strategy.build()),
        None => Proxy::unbound(opts, pool, strategy.build()),
    };
    InProcess {
        proxy: proxy.expect("the proxy starts"),
    }
}

/// A balancer `name` without a listener over `backends` by `strategy`, which serves
/// what routes send it.
pub fn unbound(
    name: &str,
    backends: &[SocketAddr],
    strategy: Strategy,
    tune: impl FnOnce(&mut ProxyOptions),
) -> InProcess {
    proxy(backends, strategy, |o| {
        o.name = name.to_string();
        o.listen = None;
        tune(o);
    })
}

#[allow(unused_imports)] // each test file uses its own share
pub use drover_testkit::{addrs, backends};
