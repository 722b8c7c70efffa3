//! Routes of an HTTP listener: which balancer serves a request, by its host (the
//! `Host` field, or an absolute-form target's authority, which the request parser passes
//! as the host with the target in origin form; HTTP/2's `:authority` arrives as `Host`)
//! and its path, picked once per request as its head is parsed.
//!
//! The most specific route that matches wins, host first: a route listing the exact
//! host, else a wildcard's, the longest suffix first (`Names`), else a route for any
//! host; among those, the longest path prefix. A request no route of a more specific
//! host matches by path falls to the next (as HAProxy's and Traefik's rules do, which
//! stand each alone; nginx's `server` blocks would answer 404). A path prefix matches
//! whole segments: `/api` takes `/api`, `/api/users` and `/api?x`, not `/apis`; a
//! prefix ending in `/` takes what starts with it. Paths are compared as sent: no
//! percent-decoding, case-sensitive (as HAProxy's `path_beg`).
//!
//! With `strip_prefix`, the backend sees the path without the prefix (`/api/users` as
//! `/users`, `/api` as `/`) and `X-Forwarded-Prefix: /api` (Traefik's `StripPrefix`).

use super::{host_buf, normal_host, Names, RouteTarget};
use std::collections::HashMap;
use std::sync::Arc;

/// One route: what it matches, and where it sends.
#[derive(Debug, Clone)]
pub struct HttpRoute {
    /// Host names (`*.SUFFIX` for a wildcard); empty: any host.
    pub hosts: Vec<String>,
    /// The path prefix; `/` takes every path.
    pub path_prefix: String,
    /// Whether the backend sees the path without the prefix.
    pub strip_prefix: bool,
    pub target: RouteTarget,
}

/// A listener's HTTP routes, ready to pick from.
#[derive(Debug)]
pub struct HttpRoutes {
    matcher: Matcher,
    /// Each route's balancer, in route order.
    targets: Vec<RouteTarget>,
    /// The balancers routes send to, each once (many routes may name one): what the
    /// accept loop's backpressure and the idle sweep go over.
    distinct: Vec<RouteTarget>,
}

/// What routes match on, apart from where they send.
#[derive(Debug)]
struct Matcher {
    /// Each route's path prefix.
    prefixes: Vec<Prefix>,
    /// Each host's routes.
    by_host: Names<Group>,
    /// The routes for any host.
    any_host: Group,
    /// Whether the listener's own balancer serves what no route matches.
    listener_default: bool,
}

/// How the backend's request target (origin form) loses a route's prefix: its first
/// `len` bytes go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Strip {
    pub len: usize,
}

/// Where a request goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HttpPick {
    /// `routes[index]`'s balancer, its target stripped so.
    Route { index: usize, strip: Option<Strip> },
    /// The listener's own balancer.
    Listener,
    /// Nowhere: drover answers 404.
    Nowhere,
}

impl HttpRoutes {
    /// `routes` in order; where two match a request alike (the config refuses that)
    /// the first listed wins. With `listener_default`, what matches none goes to the
    /// listener's own balancer; without it, it gets 404.
    pub fn new(routes: Vec<HttpRoute>, listener_default: bool) -> HttpRoutes {
        let matcher = Matcher::new(
            routes
                .iter()
                .map(|r| (&r.hosts[..], r.path_prefix.as_str(), r.strip_prefix)),
            listener_default,
        );
        let targets: Vec<RouteTarget> = routes.into_iter().map(|r| r.target).collect();
        let mut distinct: Vec<RouteTarget> = Vec::new();
        for t in &targets {
            if !distinct.iter().any(|d| Arc::ptr_eq(&d.current, &t.current)) {
                distinct.push(t.clone());
            }
        }
        HttpRoutes {
            matcher,
            targets,
            distinct,
        }
    }

    /// The route for a request with this `Host` field (`None`: it had none) and
    /// request target. No allocation.
    pub(crate) fn pick(&self, host: Option<&[u8]>, target: &str) -> HttpPick {
        self.matcher.pick(host, target)
    }

    /// The balancer of `routes[index]`.
    pub(crate) fn target(&self, index: usize) -> &RouteTarget {
        &self.targets[index]
    }

    /// The balancers routes send to, each once.
    pub(crate) fn distinct_targets(&self) -> &[RouteTarget] {
        &self.distinct
    }

    /// Whether the listener's own balancer serves what no route matches.
    pub(crate) fn listener_default(&self) -> bool {
        self.matcher.listener_default
    }
}

impl Matcher {
    fn new<'a>(
        routes: impl Iterator<Item = (&'a [String], &'a str, bool)>,
        listener_default: bool,
    ) -> Matcher {
        let mut by_host: Names<Group> = Names::default();
        let mut any_host = Group::default();
        let mut prefixes = Vec::new();
        for (i, (hosts, prefix, strip)) in routes.enumerate() {
            if hosts.is_empty() {
                any_host.add(i, prefix);
            }
            for host in hosts {
                by_host.entry(host).add(i, prefix);
            }
            prefixes.push(Prefix {
                text: prefix.to_string(),
                strip,
            });
        }
        let longest_first = |group: &mut Group| {
            for bucket in group.by_segment.values_mut() {
                bucket.sort_by_key(|&i| std::cmp::Reverse(prefixes[i].text.len()));
            }
        };
        longest_first(&mut any_host);
        by_host.for_each_mut(longest_first);
        Matcher {
            prefixes,
            by_host,
            any_host,
            listener_default,
        }
    }

    fn pick(&self, host: Option<&[u8]>, target: &str) -> HttpPick {
        let path = target.split('?').next().unwrap_or("");
        let path = if path.is_empty() { "/" } else { path };
        let segment = first_segment(path);
        let mut buf = host_buf();
        let name = host.and_then(|h| normal_host(h, &mut buf));
        let by_host = name.into_iter().flat_map(|n| self.by_host.matches(n));
        for group in by_host.chain(std::iter::once(&self.any_host)) {
            let bucket = group.by_segment.get(segment).map_or(&[][..], Vec::as_slice);
            for &index in bucket.iter().chain(&group.root) {
                let prefix = &self.prefixes[index];
                if prefix_matches(path, &prefix.text) {
                    let strip = prefix.strip.then_some(Strip {
                        len: prefix.text.len(),
                    });
                    return HttpPick::Route { index, strip };
                }
            }
        }
        if self.listener_default {
            HttpPick::Listener
        } else {
            HttpPick::Nowhere
        }
    }
}

/// A route's path prefix, and whether it is stripped.
#[derive(Debug)]
struct Prefix {
    text: String,
    strip: bool,
}

/// One host's routes (or those for any host), by the first segment of their prefix:
/// a prefix matches whole segments, so only a path with the same first segment can
/// start with it, and a request compares its path with those alone (a scan of 45
/// prefixes of one host cost ~1,600 instructions a request; bench/README).
#[derive(Debug, Default)]
struct Group {
    /// By first segment (`/api` for `/api`, `/api/` and `/api/v1`), the longest prefix
    /// first.
    by_segment: HashMap<String, Vec<usize>>,
    /// The routes whose prefix is `/`, which every path starts with.
    root: Vec<usize>,
}

impl Group {
    fn add(&mut self, index: usize, prefix: &str) {
        if prefix == "/" {
            self.root.push(index);
        } else {
            let segment = first_segment(prefix).to_string();
            self.by_segment.entry(segment).or_default().push(index);
        }
    }
}

/// A path's first segment with its `/`: `/api` of `/api/v1`, `/api/` and `/api`.
fn first_segment(path: &str) -> &str {
    let end = path
        .get(1..)
        .and_then(|rest| rest.find('/'))
        .map_or(path.len(), |i| i + 1);
    &path[..end]
}

/// Whether `path` is under `prefix`, by whole segments unless the prefix ends in `/`.
fn prefix_matches(path: &str, prefix: &str) -> bool {
    path.starts_with(prefix)
        && (prefix.ends_with('/')
            || path.len() == prefix.len()
            || path.as_bytes()[prefix.len()] == b'/')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(routes: &[(&[&str], &str, bool)], listener_default: bool) -> Matcher {
        let owned: Vec<(Vec<String>, &str, bool)> = routes
            .iter()
            .map(|(h, p, s)| (h.iter().map(|h| h.to_string()).collect(), *p, *s))
            .collect();
        Matcher::new(
            owned.iter().map(|(h, p, s)| (&h[..], *p, *s)),
            listener_default,
        )
    }

    fn index(t: &Matcher, host: &str, target: &str) -> Option<usize> {
        match t.pick(Some(host.as_bytes()), target) {
            HttpPick::Route { index, .. } => Some(index),
            _ => None,
        }
    }

    #[test]
    fn host_first_then_the_longest_prefix() {
        let t = table(
            &[
                (&["api.example.com"], "/v1", false),
                (&["*.example.com"], "/", false),
                (&[], "/static/", false),
                (&[], "/", false),
                (&["api.example.com"], "/v1/admin", false),
                (&["*.api.example.com"], "/", false),
            ],
            false,
        );
        assert_eq!(index(&t, "api.example.com", "/v1/users"), Some(0));
        assert_eq!(index(&t, "API.example.com.:8080", "/v1"), Some(0));
        assert_eq!(index(&t, "api.example.com", "/v1?q=1"), Some(0));
        assert_eq!(
            index(&t, "api.example.com", "/v1/admin/x"),
            Some(4),
            "longer"
        );
        assert_eq!(
            index(&t, "api.example.com", "/v10"),
            Some(1),
            "whole segments; then the wildcard's routes"
        );
        assert_eq!(
            index(&t, "x.api.example.com", "/v1"),
            Some(5),
            "longer suffix"
        );
        assert_eq!(index(&t, "www.example.com", "/static/a.css"), Some(1));
        assert_eq!(index(&t, "other.org", "/static/a.css"), Some(2));
        assert_eq!(
            index(&t, "other.org", "/static"),
            Some(3),
            "/static/ needs the /"
        );
        assert_eq!(index(&t, "other.org", "*"), None, "OPTIONS * has no path");
        assert_eq!(
            t.pick(None, "/x"),
            HttpPick::Route {
                index: 3,
                strip: None
            }
        );
    }

    #[test]
    fn no_match_goes_to_the_listener_or_nowhere() {
        let t = table(&[(&["a.test"], "/api", true)], false);
        assert_eq!(t.pick(Some(b"a.test"), "/web"), HttpPick::Nowhere);
        assert_eq!(t.pick(None, "/api"), HttpPick::Nowhere);
        let t = table(&[(&["a.test"], "/api", true)], true);
        assert_eq!(t.pick(Some(b"b.test"), "/api"), HttpPick::Listener);
    }

    #[test]
    fn first_segments() {
        assert_eq!(first_segment("/api/v1"), "/api");
        assert_eq!(first_segment("/api/"), "/api");
        assert_eq!(first_segment("/api"), "/api");
        assert_eq!(first_segment("/"), "/");
        assert_eq!(first_segment("//x"), "/");
        assert_eq!(first_segment("*"), "*");
    }

    #[test]
    fn strips_the_prefix_from_the_path() {
        let t = table(&[(&[], "/api", true), (&[], "/static/", true)], false);
        let strip = |target: &str| match t.pick(Some(b"h"), target) {
            HttpPick::Route { strip, .. } => strip,
            other => panic!("{other:?}"),
        };
        assert_eq!(strip("/api/users"), Some(Strip { len: 4 }));
        assert_eq!(strip("/static/a.css"), Some(Strip { len: 8 }));
        assert_eq!(strip("/api?x"), Some(Strip { len: 4 }));
    }
}
