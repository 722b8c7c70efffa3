//! The Node SDK (`sdk/node`): its `node:test` suite, run against this build's drover
//! (`DROVER_BIN`). The suite starts `drover proxy` with an admin API and no backends,
//! registers servers with the SDK, and runs `examples/pi-server-sdk.js` as a child.
//!
//! Without `node` the test passes as skipped, with a message, except under CI (env `CI`
//! set), where it is a failure: `scripts/test` installs it.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// Each test bounds itself to ~10 s and the files run in parallel; this is the backstop.
const DEADLINE: Duration = Duration::from_secs(180);

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("the repository root exists")
}

/// Node's major version, or `None` when `node` does not run.
fn node_major() -> Option<u32> {
    let out = Command::new("node").arg("--version").output().ok()?;
    let version = String::from_utf8_lossy(&out.stdout);
    version
        .trim()
        .trim_start_matches('v')
        .split('.')
        .next()?
        .parse()
        .ok()
}

#[test]
fn node_sdk_suite_passes_against_this_drover() {
    match node_major() {
        Some(major) if major >= 18 => {}
        found => {
            let what = match found {
                Some(major) => format!("node {major} is too old (the SDK needs 18 or later)"),
                None => "node is missing".to_string(),
            };
            assert!(
                std::env::var_os("CI").is_none(),
                "{what}; scripts/test installs node"
            );
            eprintln!("skipping the Node SDK suite: {what}");
            return;
        }
    }

    let mut cmd = Command::new("node");
    cmd.args(["--test", "sdk/node/test/"])
        .current_dir(repo_root())
        .env("DROVER_BIN", env!("CARGO_BIN_EXE_drover"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own process group, so a run past the deadline is killed with every test
        // file, drover and example server under it.
        .process_group(0);
    // A surrounding `drover run` (or shell) must not make the SDK think it is a worker.
    for var in [
        "DROVER_WORKER_ID",
        "DROVER_APP",
        "DROVER_ADMIN",
        "DROVER_BALANCER",
        "DROVER_ADMIN_TOKEN",
        "LISTEN_FDS",
        "LISTEN_PID",
        "PORT",
    ] {
        cmd.env_remove(var);
    }
    let mut child = cmd.spawn().expect("run node --test");
    let pid = child.id();
    // Read both pipes while waiting, so a chatty run cannot fill one and stall.
    let drain = |mut pipe: Box<dyn Read + Send>| {
        thread::spawn(move || {
            let mut text = String::new();
            let _ = pipe.read_to_string(&mut text);
            text
        })
    };
    let stdout = drain(Box::new(child.stdout.take().unwrap()));
    let stderr = drain(Box::new(child.stderr.take().unwrap()));

    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for node") {
            break Some(status);
        }
        if started.elapsed() > DEADLINE {
            let _ = Command::new("kill")
                .args(["-KILL", &format!("-{pid}")])
                .status();
            let _ = child.wait();
            break None;
        }
        thread::sleep(Duration::from_millis(100));
    };
    let output = format!(
        "{}{}",
        stdout.join().unwrap_or_default(),
        stderr.join().unwrap_or_default()
    );
    match status {
        Some(s) if s.success() => {}
        Some(s) => panic!("node --test sdk/node/test/ failed ({s}):\n{output}"),
        None => panic!("node --test sdk/node/test/ ran past {DEADLINE:?}; killed:\n{output}"),
    }
}

/// The SDK installs as its README says: `npm pack` of `sdk/node`, then `npm install` of
/// that tarball into an app of its own (no registry needed: it has no dependencies),
/// where `require('@drover/sdk')` gives `register` and `loadReporter`.
#[test]
fn the_sdk_installs_from_a_packed_tarball_as_its_readme_says() {
    if node_major().is_none_or(|major| major < 18)
        || Command::new("npm").arg("--version").output().is_err()
    {
        assert!(
            std::env::var_os("CI").is_none(),
            "node 18+ and npm are needed"
        );
        eprintln!("skipping: node 18+ and npm are needed");
        return;
    }
    let dir = std::env::temp_dir().join(format!("drover-sdk-install-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("app")).unwrap();
    let npm = |args: &[&str], cwd: &Path| {
        let out = Command::new("npm")
            .args(args)
            .args(["--no-audit", "--no-fund", "--offline"])
            .current_dir(cwd)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "npm {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let sdk = repo_root().join("sdk/node");
    let packed = npm(&["pack", &sdk.display().to_string()], &dir);
    let tarball = dir.join(packed.lines().last().unwrap());
    std::fs::write(
        dir.join("app/package.json"),
        r#"{"name":"app","private":true}"#,
    )
    .unwrap();
    npm(
        &["install", &tarball.display().to_string()],
        &dir.join("app"),
    );
    let out = Command::new("node")
        .args([
            "-e",
            "const d = require('@drover/sdk'); console.log(typeof d.register, typeof d.loadReporter)",
        ])
        .current_dir(dir.join("app"))
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "function function",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
