//! `drover up`: apps and balancers from one drover.toml, through real processes.

mod common;

use common::{bin, pi_server, steady_load, temp_dir};
use drover_testkit::{DroverProcess, HttpClient};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

fn field<'a>(json: &'a str, name: &str) -> Option<&'a str> {
    let at = json.find(&format!("\"{name}\":"))? + name.len() + 3;
    let rest = &json[at..];
    let end = rest.find([',', '}'])?;
    Some(rest[..end].trim().trim_matches('"'))
}

fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| s.contains(") Z "))
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_survives_kill_9_of_a_worker_under_load() {
    let server = pi_server();
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
    let load = steady_load(addr, 3, "/pi?iterations=2000", stop.clone());
    tokio::time::sleep(Duration::from_millis(100)).await;
    let victim = before["0"];
    std::process::Command::new("kill")
        .args(["-9", &victim.to_string()])
        .status()
        .unwrap();
    // Load runs on through the kill and the restart.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stop.store(true, Ordering::Relaxed);
    let mut failed = Vec::new();
    for l in load {
        failed.extend(l.await.unwrap().1);
    }
    assert!(
        failed.is_empty(),
        "{} failed GETs: {:?}\n{}",
        failed.len(),
        &failed[..failed.len().min(5)],
        d.stderr_text()
    );

    // The supervisor restarted worker 0 under a new pid, and it serves again.
    let after = worker_pids(addr, 2).await;
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
