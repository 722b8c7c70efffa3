//! Two balancers and three backends on five "machines" (network namespaces on one
//! bridge), sharing one etcd on a sixth: a backend registered at one balancer is served
//! by the other; a backend whose machine vanishes is dropped by both within its TTL;
//! etcd stopped for 20 s under load fails no request, and changes made after it returns
//! reach both balancers. Skips, saying why, where namespaces cannot be made, except under
//! CI (env `CI` set), where that is a failure.

mod common;

use drover_admin::MemberList;
use drover_testkit::netns::{spawn_in, Lab};
use drover_testkit::{testkit_backend_bin, wait_until_async, ChildProcess, HttpClient};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const TOKEN: &str = "lab-token";
const PREFIX: &str = "/drover/pools/web";
const TTL_SECS: u64 = 3;

struct Machines {
    lab: Mutex<Lab>,
    etcd: Ipv4Addr,
    lb: [Ipv4Addr; 2],
    be: [Ipv4Addr; 3],
}

impl Machines {
    fn command(&self, node: &str, program: &Path) -> tokio::process::Command {
        self.lab
            .lock()
            .unwrap()
            .tokio_command(node, program.to_str().unwrap())
    }
}

fn sock(ip: Ipv4Addr, port: u16) -> SocketAddr {
    SocketAddr::from((ip, port))
}

async fn start_etcd(m: &Machines, dir: &Path) -> ChildProcess {
    let (client, peer) = (
        format!("http://{}:2379", m.etcd),
        format!("http://{}:2380", m.etcd),
    );
    let mut cmd = m.command("etcd", Path::new("etcd"));
    cmd.args([
        "--name",
        "lab",
        "--data-dir",
        dir.join("etcd").to_str().unwrap(),
        "--listen-client-urls",
        &client,
        "--advertise-client-urls",
        &client,
        "--listen-peer-urls",
        &peer,
        "--initial-advertise-peer-urls",
        &peer,
        "--initial-cluster",
        &format!("lab={peer}"),
    ]);
    // etcd 3.4 logs "serving insecure client requests on 10.77.0.11:2379".
    let std_cmd = cmd.as_std().clone_for_spawn();
    drover_testkit::spawn_ready_line(std_cmd, "requests on ").await
}

/// std's Command cannot be cloned; rebuild it from the parts.
trait CloneForSpawn {
    fn clone_for_spawn(&self) -> std::process::Command;
}

impl CloneForSpawn for std::process::Command {
    fn clone_for_spawn(&self) -> std::process::Command {
        let mut c = std::process::Command::new(self.get_program());
        c.args(self.get_args());
        c
    }
}

async fn start_balancer(m: &Machines, i: usize) -> ChildProcess {
    let lb = m.lb[i];
    let node = ["lb-a", "lb-b"][i];
    let mut cmd = m.command(node, common::bin());
    cmd.args([
        "proxy",
        "--name",
        "web",
        "--listen",
        &sock(lb, 8080).to_string(),
        "--admin",
        &sock(lb, 9900).to_string(),
        "--admin-token",
        TOKEN,
        "--backend",
        &format!("etcd:{PREFIX}"),
        "--etcd",
        &format!("http://{}:2379", m.etcd),
        "--threads",
        "1",
        "--slow-start",
        "0s",
        "--strategy",
        "round-robin",
    ]);
    let cmd = cmd.as_std().clone_for_spawn();
    drover_testkit::spawn_ready_line(cmd, "balancer \"web\" listening on ").await
}

async fn start_backend(m: &Machines, i: usize) -> ChildProcess {
    let node = ["be-1", "be-2", "be-3"][i];
    let mut cmd = m.command(node, &testkit_backend_bin());
    cmd.args(["--listen", &sock(m.be[i], 8080).to_string(), "--name", node]);
    drover_testkit::spawn_ready_line(cmd.as_std().clone_for_spawn(), "listening on ").await
}

/// One admin API request to the balancer at `lb`.
async fn admin(lb: Ipv4Addr, method: &str, path: &str, body: Option<String>) -> (u16, String) {
    let mut c = HttpClient::connect(sock(lb, 9900)).await.unwrap();
    let auth = format!("Bearer {TOKEN}");
    let r = c
        .request(
            method,
            path,
            &[("authorization", &auth)],
            body.as_deref().map(str::as_bytes),
        )
        .await
        .unwrap();
    (r.status, r.text())
}

async fn register(lb: Ipv4Addr, id: &str, addr: SocketAddr) -> (u16, String) {
    let body = format!(r#"{{"address": "{addr}", "ttl": "{TTL_SECS}s"}}"#);
    admin(
        lb,
        "PUT",
        &format!("/v1/balancers/web/members/{id}"),
        Some(body),
    )
    .await
}

async fn member_ids(lb: Ipv4Addr) -> Vec<String> {
    let (status, body) = admin(lb, "GET", "/v1/balancers/web/members", None).await;
    assert_eq!(status, 200, "{body}");
    let list: MemberList = serde_json::from_str(&body).unwrap();
    list.members.into_iter().map(|m| m.id).collect()
}

/// Which backend answered one request through the balancer at `lb`.
async fn served_by(lb: Ipv4Addr) -> Option<String> {
    let mut c = HttpClient::connect(sock(lb, 8080)).await.ok()?;
    let r = c.request("GET", "/", &[], None).await.ok()?;
    (r.status == 200).then(|| r.text())
}

/// Heartbeats for `id` every second, at balancer A and B in turn, until `stop`;
/// answers when the last one was taken.
fn heartbeats(
    m: &Arc<Machines>,
    id: &'static str,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<Option<Instant>> {
    let lbs = m.lb;
    tokio::spawn(async move {
        let (mut turn, mut last) = (0, None);
        while !stop.load(Ordering::Relaxed) {
            let path = format!("/v1/balancers/web/members/{id}/heartbeat");
            // While etcd is away this answers 503; the lease is then extended by etcd
            // itself when it comes back.
            if admin(lbs[turn % 2], "PUT", &path, None).await.0 == 200 {
                last = Some(Instant::now());
            }
            turn += 1;
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        last
    })
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

#[test]
fn two_balancers_share_one_view_through_etcd_across_machines() {
    let lab = match Lab::create(&["etcd", "lb-a", "lb-b", "be-1", "be-2", "be-3", "client"]) {
        Ok(lab) => lab,
        Err(why) => {
            // Under CI a failure, as a missing tool is: scripts/test installs iproute2, and
            // CI must run it as root.
            assert!(
                std::env::var_os("CI").is_none(),
                "network namespaces cannot be made here (root and iproute2's `ip` are needed): {why}"
            );
            eprintln!("skipped: network namespaces cannot be made here: {why}");
            return;
        }
    };
    let client = lab.node("client").netns.clone();
    let m = Arc::new(Machines {
        etcd: lab.node("etcd").ip,
        lb: [lab.node("lb-a").ip, lab.node("lb-b").ip],
        be: [
            lab.node("be-1").ip,
            lab.node("be-2").ip,
            lab.node("be-3").ip,
        ],
        lab: Mutex::new(lab),
    });
    let dir = common::temp_dir("multi-machine");
    let run = spawn_in(&client, move || async move {
        tokio::time::timeout(Duration::from_secs(120), scenario(m, &dir))
            .await
            .expect("the scenario took over 120 s")
    });
    run.join().expect("the scenario failed");
}

async fn scenario(m: Arc<Machines>, dir: &Path) {
    let etcd = start_etcd(&m, dir).await;
    let a = start_balancer(&m, 0).await;
    let b = start_balancer(&m, 1).await;
    let backends = [
        start_backend(&m, 0).await,
        start_backend(&m, 1).await,
        start_backend(&m, 2).await,
    ];
    let [lb_a, lb_b] = m.lb;

    // be-1 registers at A, be-2 at B (with `drover ctl` there); both balancers serve both.
    let (status, body) = register(lb_a, "be-1", sock(m.be[0], 8080)).await;
    assert_eq!(status, 201, "{body}\n{}", a.stderr_text());
    let out = m
        .command("client", common::bin())
        .args([
            "ctl",
            "--admin",
            &sock(lb_b, 9900).to_string(),
            "--token",
            TOKEN,
        ])
        .args(["members", "add", "be-2", &sock(m.be[1], 8080).to_string()])
        .args(["--ttl", &format!("{TTL_SECS}s")])
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let stop_beats = Arc::new(AtomicBool::new(false));
    let beat_1 = heartbeats(&m, "be-1", stop_beats.clone());
    let stop_beat_2 = Arc::new(AtomicBool::new(false));
    let beat_2 = heartbeats(&m, "be-2", stop_beat_2.clone());
    for lb in [lb_a, lb_b] {
        let both = wait_until_async(Duration::from_secs(5), || async {
            let mut seen = std::collections::BTreeSet::new();
            for _ in 0..6 {
                seen.extend(served_by(lb).await);
            }
            seen.len() == 2
        })
        .await;
        assert!(
            both,
            "balancer {lb} does not serve both backends\nA: {}\nB: {}",
            a.stderr_text(),
            b.stderr_text()
        );
    }

    // Registration at A to the first request served through B, 100 times.
    let mut took = Vec::new();
    for i in 0..100 {
        let id = format!("probe-{i}");
        let started = Instant::now();
        let (status, body) = register(lb_a, &id, sock(m.be[2], 8080)).await;
        assert_eq!(status, 201, "{body}");
        loop {
            if served_by(lb_b).await.as_deref() == Some("be-3") {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "{id} never served by B"
            );
        }
        took.push(started.elapsed());
        let (status, body) = admin(
            lb_a,
            "DELETE",
            &format!("/v1/balancers/web/members/{id}"),
            None,
        )
        .await;
        assert_eq!(status, 200, "{body}");
        // Wait until B has let it go too, so the next probe measures a fresh join.
        let gone = wait_until_async(Duration::from_secs(5), || async {
            !member_ids(lb_b).await.contains(&id)
        })
        .await;
        assert!(gone, "{id} stayed at B");
    }
    took.sort();
    eprintln!(
        "registration at A to first request through B: p50 {:?}, p99 {:?}, max {:?} (100 registrations)",
        percentile(&took, 0.5),
        percentile(&took, 0.99),
        took.last().unwrap()
    );

    // be-2's machine vanishes: its heartbeats stop with it; both balancers drop it
    // within its TTL (and a sweep), and nothing is sent to it after that.
    stop_beat_2.store(true, Ordering::Relaxed);
    let last_beat = beat_2.await.unwrap().expect("be-2 had heartbeats");
    let vanished = Instant::now();
    m.lab.lock().unwrap().remove("be-2");
    let both_dropped = wait_until_async(Duration::from_secs(TTL_SECS + 5), || async {
        !member_ids(lb_a).await.contains(&"be-2".to_string())
            && !member_ids(lb_b).await.contains(&"be-2".to_string())
    })
    .await;
    let removal = last_beat.elapsed();
    assert!(
        both_dropped,
        "be-2 still listed {removal:?} after its last heartbeat"
    );
    eprintln!(
        "a vanished member was dropped by both balancers {removal:?} after its last heartbeat (TTL {TTL_SECS}s; its machine went {:?} before)",
        vanished.elapsed()
    );
    assert!(
        removal >= Duration::from_secs(TTL_SECS) - Duration::from_millis(100),
        "dropped before its TTL: {removal:?}"
    );
    assert!(removal <= Duration::from_secs(TTL_SECS + 2), "{removal:?}");

    // etcd stopped for 20 s under load through both balancers: no request fails.
    let stop_load = Arc::new(AtomicBool::new(false));
    let load: Vec<_> = [lb_a, lb_b, lb_a, lb_b]
        .into_iter()
        .map(|lb| {
            let stop = stop_load.clone();
            tokio::spawn(async move {
                let (mut ok, mut failed) = (0u64, Vec::new());
                while !stop.load(Ordering::Relaxed) {
                    match served_by(lb).await {
                        Some(_) => ok += 1,
                        None => failed.push(lb),
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                (ok, failed)
            })
        })
        .collect();
    etcd.kill();
    let outage = Instant::now();
    // Both say so in their status while it lasts.
    let (status, body) = admin(lb_a, "GET", "/v1/status", None).await;
    assert_eq!(status, 200);
    let noticed = wait_until_async(Duration::from_secs(10), || async {
        let (_, body) = admin(lb_b, "GET", "/v1/status", None).await;
        body.contains("\"kind\":\"etcd\"") && body.contains("\"ok\":false")
    })
    .await;
    assert!(noticed, "B's status never said etcd is away: {body}");
    let (status, body) = register(lb_a, "during-outage", sock(m.be[2], 8080)).await;
    assert_eq!(status, 503, "{body}");
    tokio::time::sleep(Duration::from_secs(20).saturating_sub(outage.elapsed())).await;
    let etcd = start_etcd(&m, dir).await;
    let returned = Instant::now();

    // A change after it returns reaches both: be-3 registered at B is served by A.
    let back = wait_until_async(Duration::from_secs(15), || async {
        register(lb_b, "be-3", sock(m.be[2], 8080)).await.0 == 201
    })
    .await;
    assert!(back, "registration never worked again after etcd returned");
    // be-3 heartbeats as a member does: A's watch comes back on its own reconnect
    // back-off (up to 5 s after etcd does), and a member left to its 3 s TTL could lapse
    // before then; A would then read its put and its expiry in one batch and never serve
    // it (CI saw exactly that). The bound is for a test that must end, not a speed target.
    let beat_3 = heartbeats(&m, "be-3", stop_beats.clone());
    let reached = wait_until_async(Duration::from_secs(30), || async {
        for _ in 0..6 {
            if served_by(lb_a).await.as_deref() == Some("be-3") {
                return true;
            }
        }
        false
    })
    .await;
    assert!(
        reached,
        "A never served be-3 registered at B after the outage"
    );
    eprintln!(
        "a member registered at B after etcd returned was served by A {:?} after etcd's return",
        returned.elapsed()
    );
    stop_load.store(true, Ordering::Relaxed);
    let (mut ok, mut failed) = (0, Vec::new());
    for l in load {
        let (o, f) = l.await.unwrap();
        ok += o;
        failed.extend(f);
    }
    eprintln!(
        "requests during and after the 20 s etcd outage: {ok} served, {} failed",
        failed.len()
    );
    assert!(ok > 200, "too little load: {ok}");
    assert!(
        failed.is_empty(),
        "{} requests failed while etcd was away",
        failed.len()
    );

    stop_beats.store(true, Ordering::Relaxed);
    beat_1.await.unwrap().expect("be-1 had heartbeats");
    beat_3.await.unwrap().expect("be-3 had heartbeats");
    etcd.kill();
    drop(backends);
    for lb in [a, b] {
        lb.signal("TERM").unwrap();
        assert!(lb.wait_exit(Duration::from_secs(15)).await.is_some());
    }
}
