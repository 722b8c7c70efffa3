//! Routes: which balancer serves a connection (TCP mode, by the SNI of its TLS
//! ClientHello: `sni.rs`) or a request (HTTP mode, by its host and path: `http.rs`).
//! A route names another balancer, whose strategy, limits, health, timeouts, access
//! log and metrics are its own; the listener's own balancer serves what no route
//! matches, if it has backends.
//!
//! Both match names alike (`Names`): exactly, or by a wildcard `*.example.com`, which
//! covers any name ending in `.example.com` (`a.example.com`, `a.b.example.com`; not
//! `example.com`), as nginx's `server_name` and `map … hostnames` do. The most
//! specific wins: an exact name, else the wildcard with the longest suffix. This is
//! not a certificate's wildcard (one label, `tls/sni.rs`): a route picks a pool, and a
//! pool behind `*.example.com` may serve names several labels deep.

mod http;
mod sni;

pub(crate) use http::{HttpPick, Strip};
pub use http::{HttpRoute, HttpRoutes};
pub(crate) use sni::Pick;
pub use sni::{Route, SniRoutes};

use crate::state::{BalancerState, ThreadCell, ThreadState};
use arc_swap::ArcSwap;
use std::cell::Cell;
use std::collections::HashMap;
use std::sync::Arc;

/// A balancer a route can send to: its settings in force, followed across its reloads
/// (`Proxy::route_target`), and its per-thread states (their idle backend connections).
#[derive(Clone)]
pub struct RouteTarget {
    pub(crate) name: String,
    pub(crate) current: Arc<ArcSwap<BalancerState>>,
    pub(crate) cells: Arc<[Arc<ThreadCell>]>,
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

    /// Its state for the serving thread that runs this (its settings in force, and
    /// idle backend connections no other listener thread takes from).
    pub(crate) fn thread(&self) -> Arc<ThreadState> {
        self.cell().load_full()
    }

    fn cell(&self) -> &ThreadCell {
        &self.cells[SERVING_THREAD.with(Cell::get) % self.cells.len()]
    }
}

thread_local! {
    /// This serving thread's index in its listener (0 off serving threads): a routed
    /// request uses the target balancer's state of the same index, so two listener
    /// threads do not share idle backend connections.
    static SERVING_THREAD: Cell<usize> = const { Cell::new(0) };
}

/// Called once by each serving thread as it starts.
pub(crate) fn set_serving_thread(index: usize) {
    SERVING_THREAD.with(|t| t.set(index));
}

/// What a listener's routes are.
#[derive(Debug)]
pub enum Routes {
    /// TCP mode: by the SNI of the TLS ClientHello.
    Sni(SniRoutes),
    /// HTTP mode: by each request's host and path.
    Http(HttpRoutes),
}

impl Routes {
    /// Drops the routed balancers' idle backend connections past their idle timeout,
    /// for this serving thread (a balancer without a listener has no thread of its own
    /// to do it).
    pub(crate) fn sweep(&self) {
        if let Routes::Http(r) = self {
            for t in r.distinct_targets() {
                t.cell().load().sweep();
            }
        }
    }
}

/// Names to values: exact (lowercase, no trailing dot) and wildcards (by the suffix
/// after `*.`). The config refuses a name listed twice; where one is, the first wins.
#[derive(Debug)]
pub(crate) struct Names<T> {
    exact: HashMap<String, T>,
    wildcard: HashMap<String, T>,
}

impl<T> Default for Names<T> {
    fn default() -> Self {
        Names {
            exact: HashMap::new(),
            wildcard: HashMap::new(),
        }
    }
}

impl<T> Names<T> {
    /// What `name` (any case; `*.SUFFIX` for a wildcard) maps to, a default value
    /// first.
    pub(crate) fn entry(&mut self, name: &str) -> &mut T
    where
        T: Default,
    {
        let name = name.to_ascii_lowercase();
        match name.strip_prefix("*.") {
            Some(suffix) => self.wildcard.entry(suffix.to_string()).or_default(),
            None => self.exact.entry(name).or_default(),
        }
    }

    /// What `name` maps to, the most specific first: the exact entry, then each
    /// wildcard whose suffix ends the name, longest first. `name` must be lowercase,
    /// without a trailing dot.
    pub(crate) fn matches<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a T> + 'a {
        let exact = self.exact.get(name);
        let mut rest = name;
        let wildcards = std::iter::from_fn(move || loop {
            let (_, suffix) = rest.split_once('.')?;
            rest = suffix;
            if let Some(v) = self.wildcard.get(suffix) {
                return Some(v);
            }
        });
        exact.into_iter().chain(wildcards)
    }

    /// Changes every value in place.
    pub(crate) fn for_each_mut(&mut self, mut f: impl FnMut(&mut T)) {
        self.exact
            .values_mut()
            .chain(self.wildcard.values_mut())
            .for_each(&mut f);
    }
}

/// The longest host name looked up (RFC 1035's 253, a trailing dot and slack); a longer
/// one matches no name, only routes for any host.
const HOST_MAX: usize = 256;

/// `host` lowercase, without a port or a trailing dot, in `buf`: no allocation per
/// request. `None` when it cannot be a name (too long, not UTF-8 after lowercasing).
pub(crate) fn normal_host<'b>(host: &[u8], buf: &'b mut [u8; HOST_MAX]) -> Option<&'b str> {
    let host = match host.first() {
        // An IPv6 literal: its port follows the bracket.
        Some(b'[') => {
            &host[..host
                .iter()
                .position(|&b| b == b']')
                .map_or(host.len(), |i| i + 1)]
        }
        _ => host.split(|&b| b == b':').next().unwrap_or(host),
    };
    let host = host.strip_suffix(b".").unwrap_or(host);
    let out = buf.get_mut(..host.len())?;
    for (o, b) in out.iter_mut().zip(host) {
        *o = b.to_ascii_lowercase();
    }
    std::str::from_utf8(out).ok()
}

/// A buffer for `normal_host`.
pub(crate) fn host_buf() -> [u8; HOST_MAX] {
    [0; HOST_MAX]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_most_specific_first() {
        let mut n: Names<Vec<usize>> = Names::default();
        n.entry("*.example.com").push(0);
        n.entry("*.api.example.com").push(1);
        n.entry("API.example.com").push(2);
        n.entry("www.test").push(3);
        let all = |name: &str| n.matches(name).flatten().copied().collect::<Vec<_>>();
        assert_eq!(all("api.example.com"), [2, 0], "exact, then wildcards");
        assert_eq!(all("v1.api.example.com"), [1, 0], "the longer suffix first");
        assert_eq!(all("a.b.v1.api.example.com"), [1, 0], "any depth");
        assert_eq!(
            all("example.com"),
            Vec::<usize>::new(),
            "a wildcard needs a label"
        );
        assert_eq!(all("www.test"), [3]);
        assert_eq!(all("test"), Vec::<usize>::new());
        assert_eq!(all(""), Vec::<usize>::new());
    }

    #[test]
    fn hosts_lose_port_case_and_dot() {
        let mut buf = host_buf();
        assert_eq!(
            normal_host(b"API.Example.com.:8080", &mut buf),
            Some("api.example.com")
        );
        assert_eq!(normal_host(b"a.test", &mut buf), Some("a.test"));
        assert_eq!(normal_host(b"[::1]:80", &mut buf), Some("[::1]"));
        assert_eq!(normal_host(b"10.0.0.1:80", &mut buf), Some("10.0.0.1"));
        assert_eq!(normal_host(b"", &mut buf), Some(""));
        assert_eq!(normal_host(&[b'a'; 300], &mut buf), None, "too long");
        assert_eq!(normal_host(b"\xff.test", &mut buf), None, "not UTF-8");
    }
}
