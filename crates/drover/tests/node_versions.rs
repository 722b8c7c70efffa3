//! The Node.js programs of `node_binaries` (the machine's own node and Debian's Node 18,
//! which `scripts/debian-node18` unpacks beside it): Debian's runs through its wrapper
//! as node itself, and each serves examples/pi-server.js behind `drover run`, in proxy
//! mode and on the shared socket of fd 3 (which must pass through the wrapper).

mod common;

use common::examples::{self, drover_stops_cleanly};
use common::{node_binaries, pi_server};
use std::path::Path;
use std::process::{Command, Stdio};

/// Whether process `pid` has Debian's libnode mapped: it runs Debian's node, not the
/// machine's (a nodesource node has no libnode).
fn runs_libnode108(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .is_ok_and(|maps| maps.contains("libnode.so.108"))
}

#[test]
fn debian_node18_runs_as_node_itself() {
    let Some((_, node)) = node_binaries()
        .into_iter()
        .find(|(name, _)| name.starts_with("debian"))
    else {
        return;
    };
    let child = Command::new(&node)
        .args([
            "-e",
            "console.log(process.version, process.pid, process.env.DROVER_PROBE)",
        ])
        .env("DROVER_PROBE", "through")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}: {stdout}{}",
        node.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let fields: Vec<&str> = stdout.split_whitespace().collect();
    assert!(
        fields[0].starts_with("v18."),
        "{} printed {stdout}",
        node.display()
    );
    // The wrapper execs: node has the pid that was started (so drover's signals reach
    // it), and the environment arrives as it was given.
    assert_eq!(
        fields[1..],
        [pid.to_string().as_str(), "through"],
        "{stdout}"
    );
}

#[tokio::test]
async fn every_node_serves_pi_server_behind_drover_run() {
    for (name, node) in node_binaries() {
        let server = [node.display().to_string(), pi_server()];
        let debian = name.starts_with("debian");
        let who = format!("{name} ({})", node.display());
        let d = examples::behind_drover(&server).await;
        // Every worker pid that answered (the check takes a `Fn`, hence the cell).
        let pids = std::cell::RefCell::new(std::collections::BTreeSet::new());
        examples::check_both_workers(&who, &d, "/", |r| {
            let body: serde_json::Value = serde_json::from_str(&r.text()).unwrap();
            pids.borrow_mut()
                .insert(body["pid"].as_u64().unwrap() as u32);
            body["worker"].as_str().unwrap().to_string()
        })
        .await;
        for pid in pids.into_inner() {
            let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap();
            assert_eq!(
                exe.file_name(),
                Some(Path::new("node").as_os_str()),
                "{who}: the worker is {}, not node",
                exe.display()
            );
            assert_eq!(runs_libnode108(pid), debian, "{who}: worker {pid}");
        }
        drover_stops_cleanly(&who, &d).await;

        // Shared mode: the socket on fd 3 reaches node through the wrapper.
        let who = format!("{who} (shared socket)");
        let d = examples::shared_mode(&who, &server).await;
        examples::check_both_workers(&who, &d, "/", |r| r.header("x-worker").unwrap().to_string())
            .await;
        drover_stops_cleanly(&who, &d).await;
    }
}
