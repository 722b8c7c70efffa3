//! Routes of a TCP listener by SNI: which balancer serves a connection, by the server
//! name of its TLS ClientHello (`tls::client_hello`), the TLS relayed undecrypted
//! (passthrough). Each route names other balancers' pools, whose strategy, limits,
//! health, timeouts, access log and metrics are theirs; the listener's own balancer
//! serves what no route matches, if it has backends.
//!
//! A name matches a route exactly, or by a wildcard `*.example.com`, which covers any
//! name ending in `.example.com` (`a.example.com`, `a.b.example.com`; not
//! `example.com`), as nginx's `server_name` and `map … hostnames` do. The most
//! specific wins: an exact name, else the wildcard with the longest suffix. This is
//! not a certificate's wildcard (one label, `tls/sni.rs`): a route picks a pool, and a
//! pool behind `*.example.com` may serve names several labels deep. The config refuses
//! a name listed twice, so no two routes tie.

use crate::state::BalancerState;
use arc_swap::ArcSwap;
use std::collections::HashMap;
use std::sync::Arc;

/// A balancer a route can send connections to: its settings in force, followed across
/// its reloads (`Proxy::route_target`).
#[derive(Clone)]
pub struct RouteTarget {
    pub(crate) name: String,
    pub(crate) current: Arc<ArcSwap<BalancerState>>,
}

impl std::fmt::Debug for RouteTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("RouteTarget").field(&self.name).finish()
    }
}

impl RouteTarget {
    /// The balancer's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// One route: the names it takes (lowercase; `*.` first for a wildcard), and where.
#[derive(Debug, Clone)]
pub struct Route {
    pub sni: Vec<String>,
    pub target: RouteTarget,
}

/// A listener's routes, ready to pick from.
#[derive(Debug)]
pub struct SniRoutes {
    targets: Vec<RouteTarget>,
    exact: HashMap<String, usize>,
    /// By the suffix after `*.`: `example.com` for `*.example.com`.
    wildcard: HashMap<String, usize>,
    /// Whether the listener's own balancer serves what no route matches.
    listener_default: bool,
}

/// Where a connection goes.
#[derive(Debug)]
pub(crate) enum Pick<'a> {
    Route(&'a RouteTarget),
    /// The listener's own balancer.
    Listener,
    /// Nowhere: it is closed, and counted.
    Nowhere,
}

impl SniRoutes {
    /// `routes` in order; where a name is listed twice (the config refuses that) the
    /// first listing wins. With `listener_default`, what matches none goes to the
    /// listener's own balancer; without it, it is closed.
    pub fn new(routes: Vec<Route>, listener_default: bool) -> SniRoutes {
        let (mut exact, mut wildcard) = (HashMap::new(), HashMap::new());
        let mut targets = Vec::with_capacity(routes.len());
        for (i, route) in routes.into_iter().enumerate() {
            for name in &route.sni {
                let name = name.to_ascii_lowercase();
                match name.strip_prefix("*.") {
                    Some(suffix) => wildcard.entry(suffix.to_string()).or_insert(i),
                    None => exact.entry(name).or_insert(i),
                };
            }
            targets.push(route.target);
        }
        SniRoutes {
            targets,
            exact,
            wildcard,
            listener_default,
        }
    }

    /// The route for `server_name` (any case, a trailing dot allowed; `None`: the client
    /// sent none).
    pub(crate) fn pick(&self, server_name: Option<&str>) -> Pick<'_> {
        match server_name.and_then(|n| self.find(n)) {
            Some(i) => Pick::Route(&self.targets[i]),
            None if self.listener_default => Pick::Listener,
            None => Pick::Nowhere,
        }
    }

    fn find(&self, server_name: &str) -> Option<usize> {
        let name = server_name.trim_end_matches('.').to_ascii_lowercase();
        if let Some(&i) = self.exact.get(&name) {
            return Some(i);
        }
        // Each suffix after a dot, longest first: the most specific wildcard wins.
        let mut rest = name.as_str();
        while let Some((_, suffix)) = rest.split_once('.') {
            if let Some(&i) = self.wildcard.get(suffix) {
                return Some(i);
            }
            rest = suffix;
        }
        None
    }

    /// The balancers routes send to, in route order.
    pub fn targets(&self) -> impl Iterator<Item = &str> {
        self.targets.iter().map(|t| t.name.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The routes' indices only: `find` never looks at a target.
    fn table(routes: &[&[&str]], listener_default: bool) -> SniRoutes {
        let mut t = SniRoutes {
            targets: Vec::new(),
            exact: HashMap::new(),
            wildcard: HashMap::new(),
            listener_default,
        };
        for (i, names) in routes.iter().enumerate() {
            for n in *names {
                match n.strip_prefix("*.") {
                    Some(s) => t.wildcard.entry(s.to_string()).or_insert(i),
                    None => t.exact.entry(n.to_string()).or_insert(i),
                };
            }
        }
        t
    }

    #[test]
    fn exact_then_the_longest_wildcard() {
        let t = table(
            &[
                &["*.example.com"],
                &["*.api.example.com"],
                &["api.example.com", "www.test"],
            ],
            false,
        );
        assert_eq!(t.find("api.example.com"), Some(2), "exact beats wildcards");
        assert_eq!(
            t.find("API.Example.com."),
            Some(2),
            "any case, a trailing dot"
        );
        assert_eq!(t.find("v1.api.example.com"), Some(1), "the longer suffix");
        assert_eq!(t.find("a.b.v1.api.example.com"), Some(1));
        assert_eq!(t.find("www.example.com"), Some(0));
        assert_eq!(t.find("a.b.example.com"), Some(0), "any depth");
        assert_eq!(
            t.find("example.com"),
            None,
            "a wildcard needs a label before"
        );
        assert_eq!(t.find("www.test"), Some(2));
        assert_eq!(t.find("test"), None);
        assert_eq!(t.find("other.org"), None);
        assert_eq!(t.find(""), None);
        assert!(matches!(t.pick(None), Pick::Nowhere));
        assert!(matches!(t.pick(Some("other.org")), Pick::Nowhere));
        let t = table(&[&["a.test"]], true);
        assert!(matches!(t.pick(None), Pick::Listener));
        assert!(matches!(t.pick(Some("b.test")), Pick::Listener));
    }
}
