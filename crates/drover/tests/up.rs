//! `drover up`: apps and balancers from one drover.toml, through real processes.

mod common;

use common::bin;
use drover_testkit::{DroverProcess, HttpClient};
use std::path::{Path, PathBuf};
use std::time::Duration;

fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("drover-up-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn pi_server() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/pi-server.js")
        .canonicalize()
        .unwrap()
        .display()
        .to_string()
}

fn field<'a>(json: &'a str, name: &str) -> Option<&'a str> {
    let at = json.find(&format!("\"{name}\":"))? + name.len() + 3;
    let rest = &json[at..];
    let end = rest.find([',', '}'])?;
    Some(rest[..end].trim_matches('"'))
}

fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| s.contains(") Z "))
}

#[tokio::test]
async fn up_balances_over_supervised_workers_and_stops_them() {
    let dir = temp_dir("pi");
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
    let mut pids = std::collections::BTreeMap::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while pids.len() < 2 && tokio::time::Instant::now() < deadline {
        if let Ok(mut c) = HttpClient::connect(addr).await {
            if let Ok(r) = c.request("GET", "/pi?iterations=1000", &[], None).await {
                let text = r.text();
                if let (200, Some(w), Some(p)) =
                    (r.status, field(&text, "worker"), field(&text, "pid"))
                {
                    pids.insert(w.to_owned(), p.parse::<u32>().unwrap());
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
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
    let dir = temp_dir("bad");
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
    let dir = temp_dir("proxy-apps");
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
