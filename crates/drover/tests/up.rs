//! `drover up`: apps and balancers from one drover.toml, through real processes.

mod common;

use common::{
    alive, answering, app_config, assert_load_never_failed, bin, counted_load, members_list,
    pi_server, port_worker, stops_cleanly, temp_dir, up_serving, worker_names,
};
use drover_testkit::{wait_until, wait_until_async, Backend, DroverProcess, HttpClient};
use std::collections::BTreeSet;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

fn field<'a>(json: &'a str, name: &str) -> Option<&'a str> {
    let at = json.find(&format!("\"{name}\":"))? + name.len() + 3;
    let rest = &json[at..];
    let end = rest.find([',', '}'])?;
    Some(rest[..end].trim().trim_matches('"'))
}

#[tokio::test]
async fn up_balances_over_supervised_workers_and_stops_them() {
    let dir = temp_dir("up-pi");
    let file = dir.join("drover.toml");
    std::fs::write(
        &file,
        format!(
            "[[app]]\nname = \"pi\"\ncommand = [\"node\", \"{}\"]\nworkers = 2\nhealth = {{ path = \"/health\", interval = \"200ms\" }}\n\n[[balancer]]\nlisten = \"127.0.0.1:0\"\nthreads = 1\nstrategy = \"round-robin\"\nbackends = [\"app:pi\"]\n",
            pi_server()
        ),
    )
    .unwrap();
    let d = DroverProcess::spawn(bin(), &["up", "--config", file.to_str().unwrap()]).await;
    let addr = d.addr();
    // Workers join as they become ready; wait until both answer.
    let pids = worker_pids(addr, 2).await;
    let both = pids.len() == 2;
    assert!(
        both,
        "both workers never answered: {pids:?}\n{}",
        d.stderr_text()
    );
    assert!(
        d.stderr_text().contains("[pi/0] "),
        "worker output is not prefixed"
    );

    d.signal("TERM").unwrap();
    let status = d
        .wait_exit(Duration::from_secs(15))
        .await
        .expect("drover did not exit");
    assert!(status.success(), "{status:?}\n{}", d.stderr_text());
    for pid in pids.values() {
        assert!(!alive(*pid), "worker {pid} outlived drover");
    }
}

#[tokio::test]
async fn a_bad_config_names_the_key_and_starts_nothing() {
    let dir = temp_dir("up-bad");
    let marker = dir.join("started");
    let file = dir.join("drover.toml");
    std::fs::write(
        &file,
        format!(
            "[[app]]\nname = \"web\"\ncommand = [\"sh\", \"-c\", \"touch {} && sleep 30\"]\n\n[[balancer]]\nlisten = \"127.0.0.1:0\"\nbackends = [\"app:web\"]\nretries = 2\nretry = 3\n",
            marker.display()
        ),
    )
    .unwrap();
    let out = tokio::process::Command::new(bin())
        .args(["up", "--config", file.to_str().unwrap()])
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("drover.toml:9:") && stderr.contains("retry"),
        "{stderr}"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!marker.exists(), "a worker was started from a bad config");
}

#[tokio::test]
async fn proxy_refuses_a_config_with_apps() {
    let dir = temp_dir("up-proxy-apps");
    let file = dir.join("drover.toml");
    std::fs::write(&file, "[[app]]\nname = \"web\"\ncommand = [\"true\"]\n").unwrap();
    let out = tokio::process::Command::new(bin())
        .args(["proxy", "--config", file.to_str().unwrap()])
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr.contains("drover up"), "{stderr}");
}

/// Asks `/pi` until `n` distinct workers have answered; returns worker id → pid. The
/// requests overlap, so a load-aware balancer spreads them (one at a time, it would
/// rightly send them all to the fastest worker).
async fn worker_pids(
    addr: std::net::SocketAddr,
    n: usize,
) -> std::collections::BTreeMap<String, u32> {
    let mut pids = std::collections::BTreeMap::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while pids.len() < n && tokio::time::Instant::now() < deadline {
        let asks: Vec<_> = (0..4)
            .map(|_| {
                tokio::spawn(async move {
                    let mut c = HttpClient::connect(addr).await.ok()?;
                    let r = c
                        .request("GET", "/pi?iterations=300000", &[], None)
                        .await
                        .ok()?;
                    (r.status == 200).then(|| r.text())
                })
            })
            .collect();
        for ask in asks {
            if let Ok(Some(text)) = ask.await {
                if let (Some(w), Some(p)) = (field(&text, "worker"), field(&text, "pid")) {
                    pids.insert(w.to_owned(), p.parse::<u32>().unwrap());
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    pids
}

/// Every GET drover places survives a kill -9 of its worker. `--mode proxy`, where
/// drover places them all: under the default `auto`, once drover has seen these
/// equal-cost requests it hands the keep-alive connections to the workers, and a request
/// in flight on one handed to the killed worker is lost with it, as under Node's cluster
/// module (the README says so). This test met exactly that in a CI run, one connection
/// reset of 201 requests, when the handoff began before the kill.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_survives_kill_9_of_a_worker_under_load() {
    let server = pi_server();
    let d = DroverProcess::spawn(
        bin(),
        &[
            "run",
            "-w",
            "2",
            "--mode",
            "proxy",
            "--listen",
            "127.0.0.1:0",
            "--threads",
            "1",
            "--",
            "node",
            &server,
        ],
    )
    .await;
    let addr = d.addr();
    let before = worker_pids(addr, 2).await;
    assert_eq!(
        before.len(),
        2,
        "workers never both answered\n{}",
        d.stderr_text()
    );

    let stop = Arc::new(AtomicBool::new(false));
    let served = Arc::new(AtomicUsize::new(0));
    let load = counted_load(addr, 3, "/pi?iterations=2000", stop.clone(), served.clone());
    assert!(
        wait_until(Duration::from_secs(10), || served.load(Ordering::Relaxed)
            > 0)
        .await,
        "the load was never served\n{}",
        d.stderr_text()
    );
    let victim = before["0"];
    std::process::Command::new("kill")
        .args(["-9", &victim.to_string()])
        .status()
        .unwrap();
    let at_kill = served.load(Ordering::Relaxed);

    // Load runs on through the kill and the restart: the supervisor restarts worker 0
    // under a new pid, and it serves again while the load still runs.
    let after = worker_pids(addr, 2).await;
    let while_restarting = served.load(Ordering::Relaxed) - at_kill;
    assert!(
        after.get("0").is_some_and(|p| *p != victim),
        "worker 0 was not restarted: {after:?}\n{}",
        d.stderr_text()
    );
    assert!(
        d.stderr_text().contains("restarting"),
        "{}",
        d.stderr_text()
    );
    // The load was served after the kill, before worker 0 was seen back (worker 1 took
    // it while 0 was gone), and goes on being served after.
    assert!(
        while_restarting > 0,
        "no request was served between the kill and the restarted worker's first answer\n{}",
        d.stderr_text()
    );
    let back = at_kill + while_restarting;
    assert!(
        wait_until(Duration::from_secs(10), || served.load(Ordering::Relaxed)
            > back)
        .await,
        "no request was served after worker 0 came back\n{}",
        d.stderr_text()
    );
    let ok = assert_load_never_failed(&stop, load, back + 1, "through a kill -9").await;
    eprintln!(
        "{at_kill} served before the kill, {while_restarting} until worker 0 was back, {ok} in all"
    );
}

#[tokio::test]
async fn run_supervises_a_python_program_too() {
    let server = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/pi-server.py")
        .canonicalize()
        .unwrap();
    let d = DroverProcess::spawn(
        bin(),
        &[
            "run",
            "-w",
            "2",
            "--listen",
            "127.0.0.1:0",
            "--threads",
            "1",
            "--health-path",
            "/health",
            "--",
            "python3",
            server.to_str().unwrap(),
        ],
    )
    .await;
    let pids = worker_pids(d.addr(), 2).await;
    assert_eq!(pids.len(), 2, "{pids:?}\n{}", d.stderr_text());
    d.signal("TERM").unwrap();
    assert!(d
        .wait_exit(Duration::from_secs(15))
        .await
        .is_some_and(|s| s.success()));
    for pid in pids.values() {
        assert!(!alive(*pid), "worker {pid} outlived drover");
    }
}

/// `drover up` of app "web" (two workers of `port_worker`) behind balancer "front" with
/// the backend `fixed` (a TOML list item) beside it, plus `extra` balancer keys; drover
/// and its admin address, once both workers serve.
async fn up_app_beside(
    tag: &str,
    fixed: &str,
    extra: &str,
) -> (DroverProcess, std::net::SocketAddr) {
    let worker = port_worker(&temp_dir(&format!("{tag}-worker")));
    let toml = app_config(&worker, &format!("\"app:web\", {fixed}"), extra);
    let (d, admin, _) = up_serving(tag, &toml).await;
    (d, admin)
}

#[tokio::test]
async fn an_apps_workers_and_a_fixed_backend_serve_as_one_pool() {
    let fixed = Backend::named("fixed").start().await;
    let entry = format!("{{ address = \"{}\", max_conns = 3 }}", fixed.addr());
    let (d, admin) = up_app_beside("up-union", &entry, "").await;
    let workers = worker_names(admin).await;
    let mut all = workers.clone();
    all.insert("fixed".to_string());
    // Round-robin over three members: each of them answers.
    assert_eq!(answering(d.addr(), 12).await, all, "{}", d.stderr_text());

    // Each member with the source that put it there.
    let sources: BTreeSet<(String, String)> = members_list(admin)
        .await
        .members
        .into_iter()
        .map(|m| (m.addr, m.source))
        .collect();
    let mut want: BTreeSet<(String, String)> = workers
        .iter()
        .map(|w| {
            let port = w.strip_prefix("worker ").unwrap();
            (format!("127.0.0.1:{port}"), "supervisor".to_string())
        })
        .collect();
    want.insert((fixed.addr().to_string(), "static".to_string()));
    assert_eq!(sources, want);
    // The fixed backend's own limit holds in the app's pool; the workers have none.
    let limits: Vec<(String, u32)> = common::status(admin).await.balancers[0]
        .endpoints
        .iter()
        .filter(|e| e.limit_reason == "max-conns")
        .map(|e| (e.addr.clone(), e.limit))
        .collect();
    assert_eq!(limits, [(fixed.addr().to_string(), 3)]);
    assert!(
        d.stderr_text().contains("(app \"web\" and 1 backend,"),
        "{}",
        d.stderr_text()
    );
    stops_cleanly(d).await;
}

#[tokio::test]
async fn a_health_check_beside_an_app_takes_a_dead_fixed_backend_out_and_never_probes_a_worker() {
    let fixed = Backend::named("fixed").start().await;
    // The workers answer /health with 503: probed, they would go down after two.
    let (d, admin) = up_app_beside(
        "up-union-health",
        &format!("\"{}\"", fixed.addr()),
        "health = { path = \"/health\", interval = \"100ms\", timeout = \"500ms\", fall = 2 }\n",
    )
    .await;
    let workers = worker_names(admin).await;
    assert!(
        wait_until_async(Duration::from_secs(5), || async {
            fixed.hits_for("/health") >= 2
        })
        .await,
        "the fixed backend was never checked"
    );
    assert!(answering(d.addr(), 6).await.contains("fixed"));

    fixed.stop().await;
    let fixed_health = || async {
        members_list(admin)
            .await
            .members
            .into_iter()
            .find(|m| m.addr == fixed.addr().to_string())
            .and_then(|m| m.healthy)
    };
    assert!(
        wait_until_async(Duration::from_secs(5), || async {
            fixed_health().await == Some(false)
        })
        .await,
        "the dead fixed backend was not marked down\n{}",
        d.stderr_text()
    );
    // The workers serve on, every request, and are up: no check reached them.
    assert_eq!(answering(d.addr(), 8).await, workers);
    let members = members_list(admin).await.members;
    let worker_rows: Vec<_> = members
        .iter()
        .filter(|m| m.source == "supervisor")
        .collect();
    assert_eq!(worker_rows.len(), 2, "{members:?}");
    assert!(
        worker_rows.iter().all(|m| m.healthy == Some(true)),
        "{members:?}"
    );
    for m in worker_rows {
        let mut c = HttpClient::connect(m.addr.parse().unwrap()).await.unwrap();
        assert_eq!(
            c.get("/probes").await.text(),
            "0",
            "worker {} was probed",
            m.addr
        );
    }
    stops_cleanly(d).await;
}

/// `drover ctl` in `drover up`'s directory reaches the admin API its drover.toml names,
/// with its token, as `drover up` reads the file with no `-c`; `-c FILE` names another
/// file. Before, only `--admin` counted, and a file's `[admin] listen` off the default
/// got "Connection refused" with no hint (ops seat). Where nothing answers, or the
/// address is a balancer's, the error says where the address came from and what names
/// another.
#[tokio::test]
async fn ctl_reads_the_admin_address_and_token_of_the_drover_toml() {
    let dir = temp_dir("ctl-reach");
    let toml = |admin: &str| {
        format!(
            "[admin]\nlisten = \"{admin}\"\ntoken = \"s3cret\"\n\
             [[app]]\nname = \"web\"\ncommand = [\"python3\", \"-m\", \"http.server\", \"{{port}}\", \"--bind\", \"127.0.0.1\"]\n\
             [[balancer]]\nlisten = \"127.0.0.1:0\"\nthreads = 1\nbackends = [\"app:web\"]\n"
        )
    };
    let up_file = temp_dir("ctl-reach-up").join("drover.toml");
    std::fs::write(&up_file, toml("127.0.0.1:0")).unwrap();
    let d = DroverProcess::spawn(bin(), &["up", "-c", up_file.to_str().unwrap()]).await;
    let admin = common::admin_addr(&d).await;
    // The file as the running drover serves it, where the user runs `drover ctl`.
    let ctl = |args: &[&str]| {
        let out = std::process::Command::new(bin())
            .current_dir(&dir)
            .env_remove("DROVER_ADMIN")
            .env_remove("DROVER_ADMIN_TOKEN")
            .arg("ctl")
            .args(args)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    std::fs::write(dir.join("drover.toml"), toml(&admin.to_string())).unwrap();
    let (code, out, err) = ctl(&["status"]);
    assert_eq!(code, Some(0), "{err}\n{}", d.stderr_text());
    assert!(out.contains("app web"), "{out}");
    // The token is the file's: without it, refused.
    let (code, _, err) = ctl(&["--admin", &admin.to_string(), "status"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("401"), "{err}");
    let other = dir.join("other.toml");
    std::fs::write(&other, toml(&admin.to_string())).unwrap();
    std::fs::remove_file(dir.join("drover.toml")).unwrap();
    let (code, out, err) = ctl(&["-c", other.to_str().unwrap(), "status"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("app web"), "{out}");

    // Nothing answers at the file's address: said, with where it came from.
    std::fs::write(&other, toml("127.0.0.1:9")).unwrap();
    let (code, _, err) = ctl(&["status", "-c", other.to_str().unwrap()]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("cannot reach drover's admin API at 127.0.0.1:9")
            && err.contains(&format!(
                "the address is [admin] listen of {}",
                other.display()
            ))
            && err.contains("--admin HOST:PORT, DROVER_ADMIN or -c FILE names another"),
        "{err}"
    );
    // A file with no [admin], or none at all, is named.
    std::fs::write(
        &other,
        "[[balancer]]\nlisten = \"127.0.0.1:0\"\nbackends = [\"127.0.0.1:1\"]\n",
    )
    .unwrap();
    let (code, _, err) = ctl(&["-c", other.to_str().unwrap(), "status"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("no [admin] table"), "{err}");
    let (code, _, err) = ctl(&["-c", "missing.toml", "status"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("missing.toml") && err.contains("cannot read"),
        "{err}"
    );
    // A balancer's address is not the admin API (its worker answers the path with a
    // page, once it serves).
    let serving = wait_until(Duration::from_secs(20), || {
        std::net::TcpStream::connect(d.addr()).is_ok()
            && ctl(&["--admin", &admin.to_string(), "--token", "s3cret", "status"])
                .1
                .contains("ready")
    })
    .await;
    assert!(serving, "{}", d.stderr_text());
    let (code, _, err) = ctl(&["--admin", &d.addr().to_string(), "status"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("not a balancer's listen?"), "{err}");
}
