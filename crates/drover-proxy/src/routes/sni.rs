//! Routes of a TCP listener by SNI: which balancer serves a connection, by the server
//! name of its TLS ClientHello (`tls::client_hello`), the TLS relayed undecrypted
//! (passthrough). Names match as `routes` says (`Names`); the config refuses a name
//! listed twice, so no two routes tie.

use super::{Names, RouteTarget};

/// One route: the names it takes (`*.` first for a wildcard), and where.
#[derive(Debug, Clone)]
pub struct Route {
    pub sni: Vec<String>,
    pub target: RouteTarget,
}

/// A listener's routes, ready to pick from.
#[derive(Debug)]
pub struct SniRoutes {
    targets: Vec<RouteTarget>,
    names: Names<Option<usize>>,
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
        let mut names: Names<Option<usize>> = Names::default();
        let mut targets = Vec::with_capacity(routes.len());
        for (i, route) in routes.into_iter().enumerate() {
            for name in &route.sni {
                names.entry(name).get_or_insert(i);
            }
            targets.push(route.target);
        }
        SniRoutes {
            targets,
            names,
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
        let found = self.names.matches(&name).find_map(|i| *i);
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The routes' indices only: `find` never looks at a target.
    fn table(routes: &[&[&str]], listener_default: bool) -> SniRoutes {
        let mut names: Names<Option<usize>> = Names::default();
        for (i, route) in routes.iter().enumerate() {
            for n in *route {
                names.entry(n).get_or_insert(i);
            }
        }
        SniRoutes {
            targets: Vec::new(),
            names,
            listener_default,
        }
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
