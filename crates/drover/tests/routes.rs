//! HTTP routes from a drover.toml, through the real binary: one listener, balancers
//! without a listen of their own picked by host and path prefix, a stripped prefix, 404
//! where nothing matches, the routes in `ctl status` and each balancer's metrics, a
//! reload that adds and removes routes and balancers under load with no failed
//! request, and `drover check`'s messages.

mod common;

use common::{assert_load_never_failed, bin, ctl, metrics_text, proxy_config, status, temp_dir};
use drover_testkit::{Backend, HttpClient};
use std::net::SocketAddr;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// `front` on 127.0.0.1:0 with `routes` and no backends of its own, then `others`
/// (balancers without listen), behind an admin API.
fn config(routes: &str, others: &str) -> String {
    format!(
        "[admin]\nlisten = \"127.0.0.1:0\"\n\n\
         [[balancer]]\nname = \"front\"\nlisten = \"127.0.0.1:0\"\nbackends = []\nroutes = [\n{routes}]\n\n{others}"
    )
}

/// A balancer without listen over `backend`.
fn pool(name: &str, backend: SocketAddr) -> String {
    format!("[[balancer]]\nname = \"{name}\"\nbackends = [\"{backend}\"]\n\n")
}

/// `GET target` with `Host: host` on `c`: the status and who answered.
async fn get(c: &mut HttpClient, host: &str, target: &str) -> (u16, String) {
    let r = c
        .request("GET", target, &[("host", host)], None)
        .await
        .unwrap();
    let by = r
        .header("x-backend")
        .or(r.header("drover-error"))
        .unwrap_or("-");
    (r.status, by.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_go_where_host_and_path_say_and_a_reload_changes_routes_under_load() {
    let api = Backend::named("api").start().await;
    let files = Backend::named("files").start().await;
    let web = Backend::named("web").start().await;
    let dir = temp_dir("routes");
    let before = config(
        "  { host = [\"api.test\", \"*.api.test\"], balancer = \"api\" },\n  { path_prefix = \"/static/\", strip_prefix = true, balancer = \"files\" },\n",
        &format!("{}{}", pool("api", api.addr()), pool("files", files.addr())),
    );
    let (d, addr, admin, path) = proxy_config(&dir, &before, "front").await;
    let stderr = d.stderr_text();
    assert!(
        stderr.contains("balancer \"api\" serving what routes send it"),
        "{stderr}"
    );

    let mut c = HttpClient::connect(addr).await.unwrap();
    assert_eq!(get(&mut c, "api.test", "/x").await, (200, "api".into()));
    assert_eq!(
        get(&mut c, "v2.api.test:80", "/").await,
        (200, "api".into())
    );
    assert_eq!(
        get(&mut c, "other.test", "/static/app.js").await,
        (200, "files".into())
    );
    assert_eq!(files.last_request_head().unwrap().target, "/app.js");
    assert_eq!(
        get(&mut c, "other.test", "/").await,
        (404, "no-route".into())
    );

    // The routes in status; each balancer its own row and metrics.
    let st = status(admin).await;
    let front = st.balancers.iter().find(|b| b.name == "front").unwrap();
    let shown: Vec<(String, String)> = front
        .routes
        .iter()
        .map(|r| (r.matches.clone(), r.balancer.clone()))
        .collect();
    assert_eq!(
        shown,
        [
            ("host api.test, *.api.test path /".into(), "api".into()),
            ("any host path /static/ (stripped)".into(), "files".into()),
        ]
    );
    let api_row = st.balancers.iter().find(|b| b.name == "api").unwrap();
    assert_eq!(api_row.listen, "-");
    let (code, text, err) = ctl(admin, &["status"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(
        text.contains("balancer api no listener: what routes send it (p2c)"),
        "{text}"
    );
    assert!(
        text.contains("  route any host path /static/ (stripped) -> files\n"),
        "{text}"
    );
    let metrics = metrics_text(admin).await;
    assert!(
        metrics.contains("drover_requests_total{balancer=\"api\"} 2"),
        "{metrics}"
    );

    // Under load on api.test (routed before and after), a reload adds `web` and its
    // route, and removes `files` and its route.
    let stop = Arc::new(AtomicBool::new(false));
    let load: Vec<_> = (0..4)
        .map(|_| {
            let stop = Arc::clone(&stop);
            tokio::spawn(async move {
                let mut c = HttpClient::connect(addr).await.unwrap();
                let (mut ok, mut failed) = (0, Vec::new());
                while !stop.load(Ordering::Relaxed) {
                    match get(&mut c, "api.test", "/").await {
                        (200, by) if by == "api" => ok += 1,
                        other => failed.push(format!("{other:?}")),
                    }
                }
                (ok, failed)
            })
        })
        .collect();
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let after = config(
        "  { host = [\"api.test\", \"*.api.test\"], balancer = \"api\" },\n  { host = [\"web.test\"], path_prefix = \"/app\", balancer = \"web\" },\n",
        &format!("{}{}", pool("api", api.addr()), pool("web", web.addr())),
    );
    for toml in [&after, &before, &after] {
        std::fs::write(&path, toml).unwrap();
        let (code, out, err) = ctl(admin, &["reload"]).await;
        assert_eq!(code, 0, "{out}{err}");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    assert_load_never_failed(&stop, load, 50, "while reloads changed the routes").await;
    let mut c = HttpClient::connect(addr).await.unwrap();
    assert_eq!(get(&mut c, "web.test", "/app/x").await, (200, "web".into()));
    assert_eq!(
        get(&mut c, "web.test", "/other").await,
        (404, "no-route".into())
    );
    assert_eq!(
        get(&mut c, "x.test", "/static/app.js").await,
        (404, "no-route".into())
    );
    let st = status(admin).await;
    let names: Vec<&str> = st.balancers.iter().map(|b| b.name.as_str()).collect();
    assert_eq!(names, ["front", "api", "web"]);
    drop(d);
}

#[test]
fn drover_check_names_an_ambiguous_route_and_a_balancer_nothing_reaches() {
    let dir = temp_dir("routes-check");
    let path = dir.join("drover.toml");
    let b: SocketAddr = "127.0.0.1:9001".parse().unwrap();
    let check = |text: &str| {
        std::fs::write(&path, text).unwrap();
        let out = Command::new(bin())
            .args(["check", "-c", path.to_str().unwrap()])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1));
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = check(&config(
        "  { host = [\"a.test\"], path_prefix = \"/api\", balancer = \"api\" },\n  { host = [\"A.test.\"], path_prefix = \"/api\", balancer = \"web\" },\n",
        &format!("{}{}", pool("api", b), pool("web", b)),
    ));
    assert!(
        err.contains(&format!(
            "{}:10:13: balancer[0].routes[1].host[0]: host \"a.test\" with path_prefix \"/api\" is routed already by balancer[0].routes[0].host[0] (line 9, column 13)",
            path.display()
        )),
        "{err}"
    );
    let err = check(&config(
        "  { balancer = \"api\" },\n",
        &format!("{}{}", pool("api", b), pool("web", b)),
    ));
    assert!(
        err.contains(
            "balancer[2].listen: required key is missing: balancer \"web\" needs a listen address"
        ),
        "{err}"
    );
}

/// An absolute-form target (`GET http://api.test/x`, which a server must accept) is
/// routed by its own host, not by the Host field beside it, and the backend gets it in
/// origin form with that host: routed by one name while the backend reads the other, a
/// client could reach one app's backend asking for another's pages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_absolute_form_target_is_routed_and_sent_by_its_own_host() {
    let api = Backend::named("api").start().await;
    let files = Backend::named("files").start().await;
    let dir = temp_dir("routes-absolute");
    let toml = config(
        "  { host = [\"api.test\"], balancer = \"api\" },\n  { path_prefix = \"/static/\", strip_prefix = true, balancer = \"files\" },\n",
        &format!("{}{}", pool("api", api.addr()), pool("files", files.addr())),
    );
    let (d, addr, _admin, _path) = proxy_config(&dir, &toml, "front").await;
    let mut c = HttpClient::connect(addr).await.unwrap();

    assert_eq!(
        get(&mut c, "other.test", "http://api.test/x?y=1").await,
        (200, "api".into())
    );
    let seen = api.last_request_head().unwrap();
    assert_eq!(seen.target, "/x?y=1");
    assert_eq!(seen.header_all("host"), [b"api.test"]);

    assert_eq!(
        get(&mut c, "api.test", "http://other.test/static/app.js").await,
        (200, "files".into())
    );
    let seen = files.last_request_head().unwrap();
    assert_eq!(seen.target, "/app.js");
    assert_eq!(seen.header_all("host"), [b"other.test"]);
    assert_eq!(api.hits(), 1, "routed by the Host field");

    // A target that is neither a path nor an absolute http(s) URI: refused, naming why.
    let r = c
        .request("GET", "ftp://api.test/x", &[("host", "api.test")], None)
        .await
        .unwrap();
    assert_eq!(r.status, 400);
    drop(d);
}
