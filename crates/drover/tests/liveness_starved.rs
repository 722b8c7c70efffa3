//! A worker that other processes keep off a core (a noisy neighbour, a build on the
//! same machine) is busy, not hung: its checks time out while its request computes,
//! slowly. An endless loop is still found, later by as much as it is starved. A test
//! binary of its own: its spinning processes would starve the other tests' workers.

mod common;

use common::{
    assert_no_restarts, get_answered, liveness_config, restart_records, status, temp_dir,
    up_serving,
};
use drover_testkit::{wait_until_async, DroverProcess, HttpClient};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command};
use std::time::Duration;

/// Processes that spin on CPU 0 until dropped.
struct Hogs(Vec<Child>);

impl Drop for Hogs {
    fn drop(&mut self) {
        for hog in &mut self.0 {
            let _ = hog.kill();
            let _ = hog.wait();
        }
    }
}

/// One test at a time: each pins its worker beside spinning processes on CPU 0, and
/// two at once would starve each other's workers past what the tests allow for.
static CPU0: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Pins every thread of `pids` to CPU 0 beside eight processes spinning there: the
/// worker gets about a ninth of it.
fn starve_on_cpu0(pids: &[u32]) -> Hogs {
    for pid in pids {
        let pinned = Command::new("taskset")
            .args(["-a", "-p", "-c", "0", &pid.to_string()])
            .output()
            .unwrap();
        assert!(pinned.status.success(), "{pinned:?}");
    }
    Hogs(
        (0..8)
            .map(|_| {
                Command::new("taskset")
                    .args(["-c", "0", "sh", "-c", "while :; do :; done"])
                    .spawn()
                    .unwrap()
            })
            .collect(),
    )
}

/// 250 ms of computing, within what the checks allow (300 ms: `fall` 2, a check every
/// 300 ms), though starved it takes seconds and its checks time out: answered, the
/// worker not restarted, and the log says why. Then an endless loop, starved the same,
/// is still killed once it has run longer than the checks allow a request, and its
/// restart record says it spun.
async fn starved_then_spinning(d: DroverProcess, admin: SocketAddr, hogs: Hogs) {
    let mut c = HttpClient::connect(d.addr()).await.unwrap();
    c.set_timeout(Duration::from_secs(60));
    get_answered(&mut c, "/compute?ms=250", "computed", &d).await;
    assert_no_restarts(admin, "a starved worker is busy", &d).await;
    assert!(
        d.stderr_text()
            .contains("other processes keep it off a core"),
        "{}",
        d.stderr_text()
    );
    let spin = tokio::spawn(async move {
        let mut c = HttpClient::connect(d.addr()).await.unwrap();
        c.set_timeout(Duration::from_secs(60));
        let status = c
            .request("POST", "/spin", &[], Some(b""))
            .await
            .map_or(0, |r| r.status);
        (status, d)
    });
    let killed = wait_until_async(Duration::from_secs(40), || async {
        restart_records(&status(admin).await).len() == 1
    })
    .await;
    drop(hogs);
    let (spun, d) = spin.await.unwrap();
    assert!(killed, "{}", d.stderr_text());
    assert_ne!(spun, 200);
    let detail = restart_records(&status(admin).await)[0].detail.clone();
    assert!(
        detail
            .as_deref()
            .is_some_and(|d| d.contains("busy 100% of the time (an endless loop?")),
        "{detail:?}\n{}",
        d.stderr_text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_starved_of_cpu_by_other_processes_is_not_restarted() {
    let _cpu0 = CPU0.lock().await;
    let sick = temp_dir("liveness-starved-sick").join("sick");
    let env = format!("env = {{ SICK_FILE = \"{}\" }}\n", sick.display());
    let (d, admin, _) = up_serving("liveness-starved", &liveness_config(1, &env)).await;
    let pid = status(admin).await.apps[0].workers[0].pid.unwrap();
    let hogs = starve_on_cpu0(&[pid]);
    starved_then_spinning(d, admin, hogs).await;
}

/// The same for a pre-fork server (gunicorn's model): the process drover started only
/// waits on the child that serves. drover read that process's main thread alone, so the
/// starved child was killed as hung where a Node worker was spared, and its endless
/// loop was said to be a deadlock ("busy 0% of the time").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pre_fork_worker_starved_of_cpu_is_not_restarted_and_its_endless_loop_is_told() {
    let _cpu0 = CPU0.lock().await;
    let server = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/liveness/prefork.py");
    let toml = format!(
        "[admin]\nlisten = \"127.0.0.1:0\"\n\
         [[app]]\nname = \"web\"\ncommand = [\"python3\", \"{}\"]\nworkers = 1\n\
         health = {{ path = \"/health\", interval = \"300ms\", timeout = \"300ms\", fall = 2 }}\n\
         [[balancer]]\nlisten = \"127.0.0.1:0\"\nthreads = 1\nbackends = [\"app:web\"]\n",
        server.display()
    );
    let (d, admin, _) = up_serving("liveness-starved-prefork", &toml).await;
    let started = status(admin).await.apps[0].workers[0].pid.unwrap();
    let children = Command::new("pgrep")
        .args(["-P", &started.to_string()])
        .output()
        .unwrap();
    let mut pids: Vec<u32> = String::from_utf8_lossy(&children.stdout)
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    assert_eq!(pids.len(), 1, "the server forks one child: {pids:?}");
    pids.push(started);
    let hogs = starve_on_cpu0(&pids);
    starved_then_spinning(d, admin, hogs).await;
}
