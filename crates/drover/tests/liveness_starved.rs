//! A worker that other processes keep off a core (a noisy neighbour, a build on the
//! same machine) is busy, not hung: its checks time out while its request computes,
//! slowly. An endless loop is still found, later by as much as it is starved. A test
//! binary of its own: its spinning processes would starve the other tests' workers.

mod common;

use common::{assert_no_restarts, liveness_config, restart_records, status, temp_dir, up_serving};
use drover_testkit::{wait_until_async, HttpClient};
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_starved_of_cpu_by_other_processes_is_not_restarted() {
    let sick = temp_dir("liveness-starved-sick").join("sick");
    let env = format!("env = {{ SICK_FILE = \"{}\" }}\n", sick.display());
    let (d, admin, _) = up_serving("liveness-starved", &liveness_config(1, &env)).await;
    let pid = status(admin).await.apps[0].workers[0].pid.unwrap();
    // The worker, every thread of it, and eight spinning processes share CPU 0: it
    // gets about a ninth of it.
    let pinned = Command::new("taskset")
        .args(["-a", "-p", "-c", "0", &pid.to_string()])
        .output()
        .unwrap();
    assert!(pinned.status.success(), "{pinned:?}");
    let hogs = Hogs(
        (0..8)
            .map(|_| {
                Command::new("taskset")
                    .args(["-c", "0", "sh", "-c", "while :; do :; done"])
                    .spawn()
                    .unwrap()
            })
            .collect(),
    );
    let mut c = HttpClient::connect(d.addr()).await.unwrap();
    c.set_timeout(Duration::from_secs(60));
    // 250 ms of computing, within what the checks allow (300 ms: `fall` 2, a check
    // every 300 ms), though starved it takes seconds, and its checks time out.
    let r = c.get("/compute?ms=250").await;
    assert_eq!(
        (r.status, r.text().as_str()),
        (200, "computed"),
        "{}",
        d.stderr_text()
    );
    assert_no_restarts(admin, "a starved worker is busy", &d).await;
    assert!(
        d.stderr_text()
            .contains("other processes keep it off a core"),
        "{}",
        d.stderr_text()
    );
    // An endless loop, starved the same, is still killed once it has run longer than
    // the checks allow a request.
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
        detail.is_some_and(|d| d.contains("an endless loop?")),
        "{}",
        d.stderr_text()
    );
}
