//! HTTP routes through a real listener and real backends in this process: a request's
//! host and path pick the balancer, whose own pool, strategy and counts serve it (how
//! `routes` in a drover.toml reach this is the `drover` crate's test).

mod common;

use common::{addrs, backends, proxy, unbound, InProcess};
use drover_balance::Strategy;
use drover_proxy::routes::{HttpRoute, HttpRoutes, Routes};
use drover_proxy::HashKey;
use drover_testkit::{wait_until, Backend, HttpClient};
use std::time::Duration;

/// A route to `target` for `hosts` (none: any) and `prefix`.
fn route(hosts: &[&str], prefix: &str, strip: bool, target: &InProcess) -> HttpRoute {
    HttpRoute {
        hosts: hosts.iter().map(|h| h.to_string()).collect(),
        path_prefix: prefix.to_string(),
        strip_prefix: strip,
        target: target.route_target(),
    }
}

fn http(routes: Vec<HttpRoute>, listener_default: bool) -> Option<Routes> {
    Some(Routes::Http(HttpRoutes::new(routes, listener_default)))
}

/// Which backend answers `GET target` with `Host: host` on `c`.
async fn who(c: &mut HttpClient, host: &str, target: &str) -> String {
    let r = c
        .request("GET", target, &[("host", host)], None)
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{host} {target}: {}", r.text());
    r.header("x-backend").unwrap().to_string()
}

/// Four single-backend balancers: `front` (the listener, backend `f`) routing to
/// `api`, `web` and `files`, which have no listener.
struct Site {
    front: InProcess,
    api: InProcess,
    web: InProcess,
    files: InProcess,
    /// `f`, `api`, `web`, `files`.
    backends: Vec<Backend>,
}

async fn site() -> Site {
    let mut b = Vec::new();
    for name in ["f", "api", "web", "files"] {
        b.push(Backend::named(name).start().await);
    }
    let one = |i: usize| addrs(&b[i..=i]);
    let front = proxy(&one(0), Strategy::RoundRobin, |o| o.name = "front".into());
    let api = unbound("api", &one(1), Strategy::RoundRobin, |_| {});
    let web = unbound("web", &one(2), Strategy::RoundRobin, |_| {});
    let files = unbound("files", &one(3), Strategy::RoundRobin, |_| {});
    front.set_routes(http(
        vec![
            route(&["api.example.com"], "/v1", false, &api),
            route(&["*.example.com"], "/", false, &web),
            route(&[], "/static/", true, &files),
            route(&["api.example.com"], "/v1/files", true, &files),
        ],
        true,
    ));
    Site {
        front,
        api,
        web,
        files,
        backends: b,
    }
}

#[tokio::test]
async fn host_then_the_longest_prefix_picks_each_request_of_one_connection() {
    let s = site().await;
    let mut c = HttpClient::connect(s.front.addr()).await.unwrap();
    for (host, target, want) in [
        ("api.example.com", "/v1/users", "api"),
        ("API.Example.com.:8080", "/v1", "api"),
        ("api.example.com", "/v1?page=2", "api"),
        ("api.example.com", "/v1/files/a", "files"),
        // Whole segments: /v10 is not under /v1; the wildcard's route takes it.
        ("api.example.com", "/v10", "web"),
        ("www.example.com", "/v1/users", "web"),
        ("a.b.example.com", "/", "web"),
        ("other.org", "/static/app.js", "files"),
        ("other.org", "/static", "f"),
        ("example.com", "/", "f"),
        // An absolute-form target's authority stands for Host.
        ("other.org", "http://api.example.com/v1/users", "api"),
        ("other.org", "/", "f"),
    ] {
        assert_eq!(who(&mut c, host, target).await, want, "{host} {target}");
    }
    // Each balancer counted its own requests; the listener only those it served.
    // (A request is counted once its answer is out: the last one may lag.)
    let requests = || [&s.front, &s.api, &s.web, &s.files].map(|b| b.counts().requests);
    wait_until(Duration::from_secs(2), || requests() == [3, 4, 3, 2]).await;
    assert_eq!(requests(), [3, 4, 3, 2]);
}

#[tokio::test]
async fn a_stripped_prefix_is_gone_from_the_path_and_named_in_a_header() {
    let s = site().await;
    let mut c = HttpClient::connect(s.front.addr()).await.unwrap();
    // What the backend `i` saw last: its target, and its `x-forwarded-prefix`.
    let saw = |i: usize| {
        let head = s.backends[i].last_request_head().unwrap();
        assert!(head.header_all("x-forwarded-prefix").len() <= 1);
        (head.target.clone(), head.header_str("x-forwarded-prefix"))
    };
    let some = |p: &str| Some(p.to_string());
    let get =
        |target: &'static str, headers: &'static [(&'static str, &'static str)]| (target, headers);
    for ((target, headers), backend, want) in [
        (
            get("/static/app.js?v=1", &[("x-forwarded-prefix", "/spoofed")]),
            3,
            ("/app.js?v=1", some("/static")),
        ),
        (get("/static/", &[]), 3, ("/", some("/static"))),
        // A prefix without a trailing slash strips to `/`, and keeps the query.
        (
            get("/v1/files?q", &[("host", "api.example.com")]),
            3,
            ("/?q", some("/v1/files")),
        ),
        (
            get("http://api.example.com/v1/files/a/b", &[]),
            3,
            ("/a/b", some("/v1/files")),
        ),
        // Not stripped: the target and the client's header go as they came.
        (
            get(
                "/v1/users",
                &[("host", "api.example.com"), ("x-forwarded-prefix", "/mine")],
            ),
            1,
            ("/v1/users", some("/mine")),
        ),
    ] {
        let r = c.request("GET", target, headers, None).await.unwrap();
        assert_eq!(r.status, 200, "{target}: {}", r.text());
        assert_eq!(saw(backend), (want.0.to_string(), want.1), "{target}");
    }
}

#[tokio::test]
async fn no_route_and_no_default_is_404_and_the_connection_goes_on() {
    let b = backends(1).await;
    let api = unbound("api", &addrs(&b), Strategy::RoundRobin, |_| {});
    let front = proxy(&[], Strategy::RoundRobin, |o| o.name = "front".into());
    front.set_routes(http(vec![route(&["a.test"], "/api", false, &api)], false));
    let mut c = HttpClient::connect(front.addr()).await.unwrap();
    let r = c
        .request("GET", "/web", &[("host", "a.test")], None)
        .await
        .unwrap();
    assert_eq!(r.status, 404);
    assert_eq!(r.header("drover-error"), Some("no-route"));
    assert_eq!(who(&mut c, "a.test", "/api/x").await, "b0", "kept alive");
    // A body drover did not read closes the connection after the answer.
    let r = c
        .request("POST", "/web", &[("host", "b.test")], Some(b"hello"))
        .await
        .unwrap();
    assert_eq!(r.status, 404);
    assert_eq!(r.header("connection"), Some("close"));
    let counted = || (front.counts().requests, api.counts().requests);
    wait_until(Duration::from_secs(2), || counted() == (2, 1)).await;
    assert_eq!(counted(), (2, 1), "the 404s are the listener's");
}

#[tokio::test]
async fn a_routed_balancer_places_by_its_own_strategy_and_keys() {
    let b = backends(4).await;
    let spread = unbound("spread", &addrs(&b[..2]), Strategy::RoundRobin, |_| {});
    let pinned = unbound("pinned", &addrs(&b[2..]), Strategy::Hash, |o| {
        o.hash_key = Some(HashKey::Header("x-user".into()))
    });
    let front = proxy(&[], Strategy::RoundRobin, |o| o.name = "front".into());
    front.set_routes(http(
        vec![
            route(&[], "/spread", false, &spread),
            route(&[], "/pinned", false, &pinned),
        ],
        false,
    ));
    let mut c = HttpClient::connect(front.addr()).await.unwrap();
    let mut seen = Vec::new();
    for _ in 0..4 {
        seen.push(who(&mut c, "h", "/spread").await);
    }
    assert_eq!(seen, ["b0", "b1", "b0", "b1"]);
    for user in ["ann", "bob", "cy", "dee"] {
        let mut got = Vec::new();
        for _ in 0..3 {
            let r = c
                .request("GET", "/pinned", &[("x-user", user)], None)
                .await
                .unwrap();
            got.push(r.header("x-backend").unwrap().to_string());
        }
        assert!(got.iter().all(|g| *g == got[0]), "{user}: {got:?}");
        assert!(["b2", "b3"].contains(&got[0].as_str()), "{got:?}");
    }
}

#[tokio::test]
async fn routes_change_under_load_with_no_failed_request() {
    let b = backends(2).await;
    let one = unbound("one", &addrs(&b[..1]), Strategy::RoundRobin, |_| {});
    let two = unbound("two", &addrs(&b[1..]), Strategy::RoundRobin, |_| {});
    let front = proxy(&[], Strategy::RoundRobin, |o| o.name = "front".into());
    front.set_routes(http(vec![route(&[], "/", false, &one)], false));
    let addr = front.addr();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut clients = Vec::new();
    for _ in 0..4 {
        let stop = std::sync::Arc::clone(&stop);
        clients.push(tokio::spawn(async move {
            let mut c = HttpClient::connect(addr).await.unwrap();
            let (mut ok, mut seen) = (0, std::collections::BTreeSet::new());
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let r = c.request("GET", "/", &[], None).await.unwrap();
                assert_eq!(r.status, 200, "{}", r.text());
                seen.insert(r.header("x-backend").unwrap().to_string());
                ok += 1;
            }
            (ok, seen)
        }));
    }
    for i in 0..20 {
        tokio::time::sleep(Duration::from_millis(25)).await;
        let to = if i % 2 == 0 { &two } else { &one };
        front.set_routes(http(vec![route(&[], "/", false, to)], false));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut seen_all = std::collections::BTreeSet::new();
    for c in clients {
        let (ok, seen) = c.await.unwrap();
        assert!(ok > 0);
        seen_all.extend(seen);
    }
    assert_eq!(seen_all.into_iter().collect::<Vec<_>>(), ["b0", "b1"]);
    assert_eq!(front.counts().errors, [0; drover_metrics::Cause::COUNT]);
}

#[tokio::test]
async fn an_http2_stream_is_routed_by_its_authority() {
    let s = site().await;
    let front = proxy(&addrs(&s.backends[..1]), Strategy::RoundRobin, |o| {
        o.name = "h2-front".into();
        o.h2c = true;
    });
    front.set_routes(http(
        vec![
            route(&["api.example.com"], "/v1", false, &s.api),
            route(&[], "/static/", true, &s.files),
        ],
        true,
    ));
    // curl sends a Host given to it as HTTP/2's :authority.
    let curl = |host: &'static str, path: &'static str| {
        let url = format!("http://{}{path}", front.addr());
        async move {
            let out = tokio::process::Command::new("curl")
                .args(["-sS", "--http2-prior-knowledge", "-H"])
                .arg(format!("Host: {host}"))
                .args(["-w", " %{http_version}", &url])
                .output()
                .await
                .expect("curl runs");
            String::from_utf8_lossy(&out.stdout).into_owned()
        }
    };
    assert_eq!(curl("api.example.com", "/v1/users").await, "api 2");
    assert_eq!(curl("other.test", "/static/app.js").await, "files 2");
    assert_eq!(s.backends[3].last_request_head().unwrap().target, "/app.js");
    assert_eq!(
        curl("other.test", "/v1/users").await,
        "f 2",
        "the listener's own"
    );
}

/// Past capacity, new connections wait in the listen backlog (issue 20): with routes,
/// once the queue of every balancer the listener's requests may go to is backed up, and
/// not while one of them still serves.
#[tokio::test]
async fn the_listener_stops_accepting_once_every_routed_queue_is_backed_up() {
    let b = backends(2).await;
    let one_at_a_time = |o: &mut drover_proxy::ProxyOptions| {
        o.queue.timeout = Duration::from_secs(8);
    };
    let pool = |p: &mut drover_registry::PoolOptions| p.max_conns = 1;
    let slow = common::unbound_with_pool("slow", &addrs(&b[..1]), one_at_a_time, pool);
    let other = common::unbound_with_pool("other", &addrs(&b[1..]), one_at_a_time, pool);
    let front = proxy(&[], Strategy::RoundRobin, |o| o.name = "front".into());
    front.set_routes(http(
        vec![
            route(&[], "/slow", true, &slow),
            route(&[], "/other", true, &other),
        ],
        false,
    ));
    let addr = front.addr();
    let hold = |path: &'static str| {
        tokio::spawn(async move {
            let mut c = HttpClient::connect(addr).await.unwrap();
            c.set_timeout(Duration::from_secs(10));
            c.get(path).await.status
        })
    };
    // `slow`'s one slot taken, one request queued behind it past a quarter of the
    // queue timeout (2 s): `other` still serves, so the listener accepts.
    let held = [hold("/slow/delay/7000"), hold("/slow/delay/10")];
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(slow.queue_depth(), 1);
    let mut c = HttpClient::connect(addr).await.unwrap();
    assert_eq!(c.get("/other/x").await.status, 200);
    // Both backed up: a new connection waits in the backlog until a slot frees.
    let more = [hold("/other/delay/5000"), hold("/other/delay/10")];
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(other.queue_depth(), 1);
    // (The accept loop looks again after each accept: the first connection since the
    // queues backed up is taken, the ones after it wait.)
    let first = hold("/other/x");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let open = front.client_connections();
    let waiting = hold("/other/x");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(front.client_connections(), open, "not accepted yet");
    for h in held.into_iter().chain(more).chain([first]) {
        assert_eq!(h.await.unwrap(), 200);
    }
    assert_eq!(
        waiting.await.unwrap(),
        200,
        "accepted once the queues drained"
    );
}
