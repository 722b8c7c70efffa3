//! `drover ctl reload` and SIGHUP apply balancer changes from the file: new, removed and
//! changed balancers (strategy, limits, timeouts, health checks, backends), with no
//! connection refused and no request failed; a listener whose address is unchanged
//! keeps its socket; a file that cannot be applied changes nothing. Fixed backends
//! beside an app's workers come and go the same way.

mod common;

use common::{
    admin_addr, answering, app_config, bin, ctl, names, new_connection_load, port_worker,
    stops_cleanly, temp_dir, up_serving, worker_names,
};
use drover_testkit::{Backend, DroverProcess, HttpClient};
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

/// The balancer `web` on 127.0.0.1:0 over `backends`, with `extra` keys, and whatever
/// other `[[balancer]]` tables `others` holds.
fn file(backends: &[SocketAddr], extra: &str, others: &str) -> String {
    let list: Vec<String> = backends.iter().map(|b| format!("\"{b}\"")).collect();
    format!(
        "[admin]\nlisten = \"127.0.0.1:0\"\n\n[[balancer]]\nname = \"web\"\nlisten = \"127.0.0.1:0\"\nthreads = 1\nslow_start = \"0s\"\nbackends = [{}]\n{extra}\n{others}",
        list.join(", ")
    )
}

fn other(name: &str, listen: &str, backend: SocketAddr) -> String {
    format!(
        "[[balancer]]\nname = \"{name}\"\nlisten = \"{listen}\"\nthreads = 1\nbackends = [\"{backend}\"]\n"
    )
}

async fn proxy_with(tag: &str, toml: &str) -> (DroverProcess, SocketAddr, PathBuf) {
    let path = temp_dir(tag).join("drover.toml");
    std::fs::write(&path, toml).unwrap();
    let d = DroverProcess::spawn(bin(), &["proxy", "--config", path.to_str().unwrap()]).await;
    let admin = admin_addr(&d).await;
    (d, admin, path)
}

/// The address the balancer `name` listens on, from the last line drover printed for it.
fn listen_of(d: &DroverProcess, name: &str) -> SocketAddr {
    *d.addrs_after(&format!("balancer \"{name}\" listening on "))
        .last()
        .unwrap_or_else(|| panic!("no listen line for {name}\n{}", d.stderr_text()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_reloads_under_load_change_balancers_and_fail_no_request() {
    let a = Backend::named("a").start().await;
    let b = Backend::named("b").start().await;
    let c = Backend::named("c").start().await;
    let side = Backend::named("side").start().await;
    let v1 = file(
        &[a.addr(), b.addr()],
        "strategy = \"round-robin\"\n",
        &other("old", "127.0.0.1:0", side.addr()),
    );
    let (d, admin, path) = proxy_with("reload-balancers", &v1).await;
    let web = listen_of(&d, "web");
    let old = listen_of(&d, "old");
    assert_eq!(answering(web, 10).await, names(&["a", "b"]));

    let stop = Arc::new(AtomicBool::new(false));
    let mut load = common::steady_load(web, 3, "/delay/5", stop.clone());
    load.extend(new_connection_load(web, 2, "/delay/5", stop.clone()));
    tokio::time::sleep(Duration::from_millis(200)).await;

    // Five versions: backends, strategy, limits, timeouts and health checks change,
    // one balancer goes and another comes; `web` keeps its address throughout.
    let versions = [
        file(
            &[b.addr(), c.addr()],
            "strategy = \"least-conn\"\nretries = 1\n",
            &other("new", "127.0.0.1:0", side.addr()),
        ),
        file(
            &[a.addr(), b.addr(), c.addr()],
            "strategy = \"round-robin\"\nmax_conns = 8\nqueue = { max = 100, timeout = \"5s\" }\ntimeouts = { request = \"20s\" }\n",
            &other("new", "127.0.0.1:0", side.addr()),
        ),
        file(
            &[a.addr(), c.addr()],
            "strategy = \"round-robin\"\nhealth = { path = \"/health\", interval = \"200ms\" }\n",
            "",
        ),
        file(&[c.addr()], "strategy = \"p2c\"\n", ""),
        file(&[a.addr(), b.addr()], "strategy = \"round-robin\"\n", ""),
    ];
    let expect = [
        names(&["b", "c"]),
        names(&["a", "b", "c"]),
        names(&["a", "c"]),
        names(&["c"]),
        names(&["a", "b"]),
    ];
    for (i, (version, want)) in versions.iter().zip(&expect).enumerate() {
        // Load under the settings of the last version for a while first.
        tokio::time::sleep(Duration::from_millis(300)).await;
        std::fs::write(&path, version).unwrap();
        if i % 2 == 0 {
            let (code, out, err) = ctl(admin, &["reload"]).await;
            assert_eq!(code, 0, "reload {i}: {err}\n{}", d.stderr_text());
            assert!(out.contains("balancers changed: web"), "reload {i}: {out}");
        } else {
            let before = d.lines_containing("drover: no apps to reload").len();
            d.signal("HUP").unwrap();
            assert!(
                drover_testkit::wait_until(Duration::from_secs(10), || {
                    d.lines_containing("drover: no apps to reload").len() > before
                })
                .await,
                "SIGHUP reload {i} did not finish\n{}",
                d.stderr_text()
            );
        }
        assert_eq!(listen_of(&d, "web"), web, "web moved");
        let seen = answering(web, 12).await;
        if version.contains("round-robin") {
            assert_eq!(&seen, want, "after reload {i}");
        } else {
            // least-conn may favour one of equally idle backends.
            assert!(
                !seen.is_empty() && seen.is_subset(want),
                "after reload {i}: {seen:?}"
            );
        }
        if i == 0 {
            // `old` is gone, `new` serves.
            let new = listen_of(&d, "new");
            assert_eq!(answering(new, 2).await, names(&["side"]));
            assert!(
                drover_testkit::wait_until_async(Duration::from_secs(5), || async {
                    HttpClient::connect(old).await.is_err()
                })
                .await,
                "the removed balancer still accepts"
            );
        }
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let served = common::assert_load_never_failed(&stop, load, 101, "during 5 reloads").await;
    eprintln!("5 reloads under load: {served} requests served, none failed");
    stops_cleanly(d).await;
}

#[tokio::test]
async fn a_reload_that_cannot_apply_changes_nothing_and_says_why() {
    let a = Backend::named("a").start().await;
    let b = Backend::named("b").start().await;
    let v1 = file(&[a.addr()], "", "");
    let (d, admin, path) = proxy_with("reload-balancers-refused", &v1).await;
    let web = listen_of(&d, "web");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken_addr = taken.local_addr().unwrap();

    let refused = [
        (
            // A syntax error: the file and line.
            format!("{}\nretries = \n", file(&[b.addr()], "", "")),
            "drover.toml:",
        ),
        (
            // A new balancer on a taken address: the key, and nothing else applies.
            file(
                &[b.addr()],
                "",
                &other("new", &taken_addr.to_string(), b.addr()),
            ),
            "balancer[1].listen",
        ),
        (file(&[b.addr()], "strategy = \"bogus\"\n", ""), "bogus"),
        (
            file(&[b.addr()], "", "").replace("threads = 1", "threads = 2"),
            "threads changed from 1 to 2",
        ),
        (
            file(&[b.addr()], "", "").replace("127.0.0.1:0\"\n\n", "127.0.0.1:1\"\n\n"),
            "the [admin] table changed",
        ),
    ];
    for (toml, says) in &refused {
        reload_is_refused(admin, &path, toml, says).await;
        assert_eq!(answering(web, 4).await, names(&["a"]), "after {says:?}");
        assert!(d.lines_containing("balancer \"new\" listening").is_empty());
    }
    drop(taken);

    // A listen address that changes moves the balancer; the old address drains.
    let port = std::net::SocketAddr::from(([127, 0, 0, 1], drover_testkit::free_port()));
    let moved = file(&[a.addr()], "", "").replacen(
        "listen = \"127.0.0.1:0\"\nthreads",
        &format!("listen = \"{port}\"\nthreads"),
        1,
    );
    std::fs::write(&path, moved).unwrap();
    let (code, out, err) = ctl(admin, &["reload"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("balancers changed: web"), "{out}");
    assert_eq!(answering(port, 3).await, names(&["a"]));
    assert!(
        drover_testkit::wait_until_async(Duration::from_secs(5), || async {
            HttpClient::connect(web).await.is_err()
        })
        .await,
        "the old address still accepts"
    );
    stops_cleanly(d).await;
}

/// Asserts that `want` answer at `addr`, each of them and nothing else, within 5 s.
/// Round-robin beside other load does not reach every member in any one turn.
async fn serves_exactly(addr: SocketAddr, want: &BTreeSet<String>) {
    let mut seen = BTreeSet::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while seen != *want && tokio::time::Instant::now() < deadline {
        seen.extend(answering(addr, 8).await);
        assert!(seen.is_subset(want), "{seen:?} answered, not only {want:?}");
    }
    assert_eq!(seen, *want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixed_backends_beside_an_app_come_and_go_on_reload_and_a_bad_file_changes_nothing() {
    let a = Backend::named("a").start().await;
    let b = Backend::named("b").start().await;
    let worker = port_worker(&temp_dir("reload-union-worker"));
    let with = |backends: String, extra: &str| app_config(&worker, &backends, extra);
    let (d, admin, path) = up_serving("reload-union", &with("\"app:web\"".into(), "")).await;
    let front = d.addr();
    let stop = Arc::new(AtomicBool::new(false));
    let load = common::steady_load(front, 2, "/", stop.clone());

    // Fixed backends join the workers' pool, then one of them leaves it. The apps get
    // their rolling reload as always; the pool keeps serving through both.
    let mut serving = BTreeSet::new();
    for (backends, fixed) in [
        (
            format!("\"app:web\", \"{}\", \"{}\"", a.addr(), b.addr()),
            &["a", "b"][..],
        ),
        (format!("\"app:web\", \"{}\"", b.addr()), &["b"][..]),
    ] {
        std::fs::write(&path, with(backends, "")).unwrap();
        let (code, out, err) = ctl(admin, &["reload"]).await;
        assert_eq!(code, 0, "{err}\n{}", d.stderr_text());
        assert!(out.contains("balancers changed: front"), "{out}");
        serving = worker_names(admin).await;
        serving.extend(names(fixed));
        serves_exactly(front, &serving).await;
    }

    // A second balancer over the app, and the app taken out of its balancer: refused,
    // and the workers and the fixed backend serve on as they did.
    let b_only = format!("\"{}\"", b.addr());
    let refused = [
        (
            with(
                format!("\"app:web\", {b_only}"),
                "\n[[balancer]]\nname = \"back\"\nlisten = \"127.0.0.1:0\"\nbackends = [\"app:web\"]\n",
            ),
            "drover.toml:20:13: balancer[1].backends[0]: app \"web\" is behind balancer[0] already",
        ),
        (
            with(b_only.clone(), ""),
            "balancer \"front\": the app among its backends changed from \"app:web\" to none",
        ),
    ];
    for (toml, says) in &refused {
        reload_is_refused(admin, &path, toml, says).await;
        serves_exactly(front, &serving).await;
        assert!(d.lines_containing("balancer \"back\" listening").is_empty());
    }
    common::assert_load_never_failed(&stop, load, 20, "during reloads beside an app").await;
    stops_cleanly(d).await;
}

/// Writes `toml` to the config at `path` and asks for a reload, which must be refused
/// with `says` in its error, and nothing reloaded.
async fn reload_is_refused(admin: SocketAddr, path: &Path, toml: &str, says: &str) {
    std::fs::write(path, toml).unwrap();
    let (code, _, err) = ctl(admin, &["reload"]).await;
    assert_eq!(code, 2, "{toml}");
    assert!(err.contains(says), "{says:?} not in {err}");
    assert!(err.contains("nothing was reloaded"), "{err}");
}
