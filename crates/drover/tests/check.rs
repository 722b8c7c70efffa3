//! `drover check -c FILE`: what `drover up` would refuse, found without starting anything,
//! and the same check before `drover ctl reload` applies a file. (Every bad file of
//! `config_errors.rs` goes through `drover check` there too.)

mod common;

use common::{app_config, bin, ctl, port_worker, status, temp_dir, up_serving};
use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::process::{Command, Output};

/// `drover check -c FILE`.
fn check(file: &Path) -> Output {
    Command::new(bin())
        .args(["check", "-c"])
        .arg(file)
        .output()
        .expect("run drover check")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A port nothing listens on right now (bound to :0, then let go).
fn free_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

#[test]
fn a_good_file_passes_and_nothing_is_started() {
    let dir = temp_dir("check-good");
    let marker = dir.join("started");
    let file = dir.join("drover.toml");
    // The app's program is found on PATH; were it run, it would leave the marker.
    std::fs::write(
        &file,
        format!(
            "[[app]]\nname = \"web\"\ncommand = [\"sh\", \"-c\", \"touch {}\"]\n\n[[balancer]]\nname = \"front\"\nlisten = \"{}\"\nbackends = [\"app:web\"]\n",
            marker.display(),
            free_addr()
        ),
    )
    .unwrap();
    let out = check(&file);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let said = text(&out.stdout);
    assert!(said.contains("ok: 1 balancer(s), 1 app(s)"), "{said}");
    assert!(!marker.exists(), "drover check ran the app");
}

#[test]
fn every_error_is_named_with_its_place_at_once() {
    let dir = temp_dir("check-errors");
    let file = dir.join("drover.toml");
    // Held by this test, as by any other program.
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let taken_addr = taken.local_addr().unwrap();
    std::fs::write(
        &file,
        format!(
            "[[app]]\nname = \"api\"\ncommand = [\"no-such-program-drover-check\"]\n\n\
             [[app]]\nname = \"jobs\"\ncommand = [\"./missing.sh\"]\n\n\
             [[balancer]]\nname = \"front\"\nlisten = \"{taken_addr}\"\nbackends = [\"app:api\"]\n\n\
             [[balancer]]\nname = \"back\"\nlisten = \"{}\"\nbackends = [\"app:jobs\"]\n",
            free_addr()
        ),
    )
    .unwrap();
    let out = check(&file);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("error: "))
        .collect();
    assert_eq!(errors.len(), 3, "{stderr}");
    for (line, key, what) in [
        (3, "app[0].command", "no-such-program-drover-check"),
        (7, "app[1].command", "missing.sh"),
        (11, "balancer[0].listen", "cannot listen on"),
    ] {
        let at = format!("drover.toml:{line}:");
        assert!(
            errors
                .iter()
                .any(|e| e.contains(&at) && e.contains(key) && e.contains(what)),
            "no error at {at} for {key} naming {what:?}:\n{stderr}"
        );
    }
    assert!(stderr.contains("3 error(s); check failed"), "{stderr}");
    drop(taken);
}

#[tokio::test]
async fn addresses_the_drover_running_the_file_holds_pass_and_reload_checks_first() {
    let dir = temp_dir("check-running-worker");
    let worker = port_worker(&dir);
    let (admin_at, front_at) = (free_addr(), free_addr());
    let toml = app_config(&worker, "\"app:web\"", "")
        .replacen("127.0.0.1:0", &admin_at.to_string(), 1)
        .replacen("127.0.0.1:0", &front_at.to_string(), 1);
    assert!(toml.contains(&front_at.to_string()), "{toml}");
    let (d, admin, file) = up_serving("check-running", &toml).await;
    assert_eq!(admin, admin_at);

    // Both addresses are in use, by the drover that runs this file: fine.
    let out = check(&file);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let said = text(&out.stdout);
    assert!(
        said.contains("2 address(es) held by the drover running this file"),
        "{said}"
    );

    // A program that is gone: `drover check` says so, and a reload of the same file
    // is refused with the same words before anything changes.
    let before = status(admin).await;
    let broken = toml.replace(
        &format!("[\"node\", \"{}\"]", worker.display()),
        "[\"no-such-node-drover-check\"]",
    );
    assert_ne!(broken, toml);
    std::fs::write(&file, &broken).unwrap();
    let out = check(&file);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("app[0].command") && stderr.contains("no-such-node-drover-check"),
        "{stderr}"
    );
    let (code, _, err) = ctl(admin, &["reload"]).await;
    assert_ne!(code, 0, "the reload went ahead: {err}");
    assert!(
        err.contains("no-such-node-drover-check") && err.contains("nothing was reloaded"),
        "{err}"
    );
    let after = status(admin).await;
    let pids = |s: &drover_admin::Status| -> Vec<Option<u32>> {
        s.apps[0].workers.iter().map(|w| w.pid).collect()
    };
    assert_eq!(
        pids(&after),
        pids(&before),
        "workers changed on a refused reload"
    );
    assert_eq!(after.apps[0].command, before.apps[0].command);
    common::stops_cleanly(d).await;
}
