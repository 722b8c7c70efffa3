//! The fifth post's tetration app (`examples/tetra/`) in its five frameworks: Sinatra,
//! Flask, Express, Go's net/http and Scotty, each behind `drover run -w 2` and in its
//! shared-socket mode, answering the post's routes from both workers.
//!
//! The Go and Haskell apps are built once per test process (`go build`, `ghc`) under
//! target/. A framework missing from the machine makes its tests pass as skipped, with a
//! message, except under CI (env `CI` set), where it is a failure: `scripts/test`
//! installs all of them.

mod common;

use common::examples::{self, clean_env, drover_stops_cleanly, get};
use drover_testkit::{spawn_ready_line, ChildProcess};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

/// What every app answers for an x outside its grammar (1 to 4 ASCII digits, ≤ 1000).
const BAD_X: &str = "x must be an integer in 0..1000";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Framework {
    Sinatra,
    Flask,
    Express,
    Go,
    Scotty,
}

impl Framework {
    /// Go computes x**x in 64-bit floats, as the post does; the others exactly.
    fn floats(self) -> bool {
        self == Framework::Go
    }
}

fn tetra_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/tetra")
        .canonicalize()
        .expect("examples/tetra/ exists")
}

/// Under target/, so runs reuse one directory instead of piling up builds in /tmp.
fn build_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `None` after saying why, when `what` is missing outside CI; a failure under CI.
fn missing(fw: Framework, what: &str) -> Option<Vec<String>> {
    assert!(
        std::env::var_os("CI").is_none(),
        "{fw:?}: {what} is missing; scripts/test installs it"
    );
    eprintln!("skipping the {fw:?} tetra app: {what} is missing (scripts/test installs it)");
    None
}

/// Whether `program args...` runs and exits 0 (in `dir`, when given).
fn succeeds(program: &str, args: &[&str], dir: Option<&Path>) -> bool {
    let mut cmd = Command::new(program);
    cmd.args(args);
    if let Some(dir) = dir {
        cmd.current_dir(dir);
    }
    cmd.output().is_ok_and(|o| o.status.success())
}

/// The command line that runs the app of `fw`, or `None` when it is skipped. Checked
/// (and built) once per test process.
fn command(fw: Framework) -> Option<Vec<String>> {
    static CACHE: [OnceLock<Option<Vec<String>>>; 5] = [const { OnceLock::new() }; 5];
    CACHE[fw as usize].get_or_init(|| prepare(fw)).clone()
}

fn prepare(fw: Framework) -> Option<Vec<String>> {
    let dir = tetra_dir();
    let file = |rel: &str| dir.join(rel).display().to_string();
    match fw {
        Framework::Sinatra => {
            // sinatra/base, not sinatra: the classic one starts a server at exit.
            if !succeeds("ruby", &["-e", "require 'sinatra/base'"], None) {
                return missing(fw, "ruby with Sinatra (apt-get install ruby-sinatra)");
            }
            Some(vec!["ruby".into(), file("sinatra/app.rb")])
        }
        Framework::Flask => {
            // Debian's python3-flask lands in /usr/bin/python3, which a python3 earlier
            // on PATH (pyenv, a venv) does not see.
            let Some(python) = ["python3", "/usr/bin/python3"]
                .into_iter()
                .find(|p| succeeds(p, &["-c", "import flask"], None))
            else {
                return missing(fw, "python3 with Flask (apt-get install python3-flask)");
            };
            Some(vec![python.into(), file("flask/app.py")])
        }
        Framework::Express => {
            let express = dir.join("express");
            if !succeeds("node", &["-e", "require('express')"], Some(&express)) {
                return missing(
                    fw,
                    "node with Express (npm ci --prefix examples/tetra/express)",
                );
            }
            Some(vec!["node".into(), file("express/app.js")])
        }
        Framework::Go => {
            if !succeeds("go", &["version"], None) {
                return missing(fw, "go (apt-get install golang-go)");
            }
            let out = build_dir("examples-tetra-go").join("tetra");
            let mut cmd = Command::new("go");
            cmd.args(["build", "-o"])
                .arg(&out)
                .arg(".")
                .current_dir(dir.join("go"))
                // The module needs no downloads; a newer toolchain must not be fetched.
                .env("GOTOOLCHAIN", "local");
            // `go` refuses to run without somewhere to cache builds.
            if ["GOCACHE", "XDG_CACHE_HOME", "HOME"]
                .iter()
                .all(|v| std::env::var_os(v).is_none())
            {
                cmd.env("GOCACHE", build_dir("examples-tetra-gocache"));
            }
            built(fw, cmd, out)
        }
        Framework::Scotty => {
            if !succeeds("ghc-pkg", &["describe", "scotty"], None) {
                return missing(
                    fw,
                    "ghc with Scotty (apt-get install ghc libghc-scotty-dev)",
                );
            }
            let objects = build_dir("examples-tetra-scotty");
            let out = objects.join("tetra-scotty");
            let mut cmd = Command::new("ghc");
            // Object and interface files go to target/ too, never next to Main.hs.
            cmd.args(["-O", "-threaded", "-outputdir"])
                .arg(&objects)
                .arg("-o")
                .arg(&out)
                .arg(dir.join("scotty/Main.hs"));
            built(fw, cmd, out)
        }
    }
}

/// Runs a build and returns the program it made; a failed build fails the test.
fn built(fw: Framework, mut cmd: Command, program: PathBuf) -> Option<Vec<String>> {
    let out = cmd.output().expect("run the build");
    assert!(
        out.status.success(),
        "{fw:?}: build failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Some(vec![program.display().to_string()])
}

/// The post's routes and what `fw` must answer: (path, status, exact body). A `None`
/// body is the framework's own 404 page, which differs in each.
fn expected(fw: Framework) -> Vec<(&'static str, u16, Option<String>)> {
    let ok = |path, body: &str| (path, 200, Some(body.to_string()));
    let bad = |path| (path, 400, Some(BAD_X.to_string()));
    let exact = |int: &str, float: &str| {
        if fw.floats() {
            float.to_string()
        } else {
            int.to_string()
        }
    };
    vec![
        ok("/", "OK, no problema!"),
        ok("/health", "ok"),
        ok("/tetra/3", "27"),
        ok("/tetra/2", "4"),
        ok("/tetra/0", "1"),
        ok(
            "/tetra/20",
            &exact("104857600000000000000000000", "1.048576e+26"),
        ),
        // The largest x allowed: 3001 digits, or past the largest float64.
        ok(
            "/tetra/1000",
            &exact(&format!("1{}", "0".repeat(3000)), "+Inf"),
        ),
        bad("/tetra/abc"),
        bad("/tetra/1001"),
        bad("/tetra/-1"),
        bad("/tetra/0x10"),
        bad("/tetra/2.5"),
        bad("/tetra/00001"),
        ("/tetra/", 404, None),
        ("/nope", 404, None),
    ]
}

/// Checks every route of `expected` through `addr`; every answer must name a worker.
async fn check_routes(who: &str, fw: Framework, addr: SocketAddr) {
    for (path, status, body) in expected(fw) {
        let r = get(addr, path).await;
        let short: String = r.text().chars().take(200).collect();
        assert_eq!(r.status, status, "{who} GET {path}: {short}");
        if let Some(body) = body {
            let want: String = body.chars().take(200).collect();
            assert!(
                r.text() == body,
                "{who} GET {path}: {short:?}, want {want:?}"
            );
        }
        let worker = r.header("x-worker");
        assert!(
            matches!(worker, Some("0" | "1")),
            "{who} GET {path}: x-worker {worker:?}"
        );
    }
}

/// Asks `/tetra/3` until both workers, 0 and 1, have answered it.
async fn check_both_workers(who: &str, d: &ChildProcess) {
    examples::check_both_workers(who, d, "/tetra/3", |r| {
        assert_eq!(r.text(), "27", "{who}");
        r.header("x-worker")
            .expect("x-worker on every answer")
            .to_string()
    })
    .await;
}

async fn behind_drover(fw: Framework) {
    let Some(app) = command(fw) else {
        return;
    };
    let who = format!("{fw:?} tetra");
    let d = examples::behind_drover(&app).await;
    check_both_workers(&who, &d).await;
    check_routes(&who, fw, d.addr()).await;
    drover_stops_cleanly(&who, &d).await;
}

/// drover's shared mode: no balancer; the workers accept on the socket drover passes
/// them as fd 3 (LISTEN_FDS, one socket per worker), and drover places the connections.
async fn shared_mode(fw: Framework) {
    let Some(app) = command(fw) else {
        return;
    };
    let who = format!("{fw:?} tetra (shared socket)");
    let d = examples::shared_mode(&who, &app).await;
    check_both_workers(&who, &d).await;
    check_routes(&who, fw, d.addr()).await;
    drover_stops_cleanly(&who, &d).await;
}

/// Without drover: the app on a socket passed as fd 3 by the test launcher (as drover's
/// shared mode and systemd pass it), then SIGTERM, which must end it with status 0.
async fn alone_on_fd_3(fw: Framework) {
    let Some(app) = command(fw) else {
        return;
    };
    let who = format!("{fw:?} tetra (alone)");
    let launcher =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/listen_fds_launch.py");
    let mut cmd = Command::new("python3");
    cmd.arg(launcher).args(&app);
    clean_env(&mut cmd);
    // PORT=0: an app that wrongly binds PORT announces some other port, and fails here.
    cmd.env("PORT", "0");
    let p = spawn_ready_line(cmd, "fd 3 listening on ").await;
    let ready = format!("listening on {} (fd 3 from LISTEN_FDS)", p.addr());
    assert!(
        p.wait_for_line(&ready, Duration::from_secs(15))
            .await
            .is_some(),
        "{who}: no {ready:?} line\n{}{}",
        p.stdout_text(),
        p.stderr_text()
    );
    let r = get(p.addr(), "/tetra/3").await;
    assert_eq!((r.status, r.text().as_str()), (200, "27"), "{who}");
    // No DROVER_WORKER_ID: the pid, which exec kept from the launcher.
    let pid = p.pid().to_string();
    assert_eq!(r.header("x-worker"), Some(pid.as_str()), "{who}");

    p.signal("TERM").unwrap();
    let status = p.wait_exit(Duration::from_secs(10)).await;
    assert!(
        status.is_some_and(|s| s.success()),
        "{who}: exit after SIGTERM: {status:?}\n{}{}",
        p.stdout_text(),
        p.stderr_text()
    );
}

macro_rules! tetra_app {
    ($name:ident, $fw:expr) => {
        mod $name {
            use super::*;

            #[tokio::test]
            async fn answers_the_posts_routes_behind_drover_from_both_workers() {
                behind_drover($fw).await;
            }

            #[tokio::test]
            async fn answers_the_posts_routes_in_shared_mode_from_both_workers() {
                shared_mode($fw).await;
            }

            #[tokio::test]
            async fn serves_fd_3_alone_and_exits_0_on_sigterm() {
                alone_on_fd_3($fw).await;
            }
        }
    };
}

tetra_app!(sinatra, Framework::Sinatra);
tetra_app!(flask, Framework::Flask);
tetra_app!(express, Framework::Express);
tetra_app!(go, Framework::Go);
tetra_app!(scotty, Framework::Scotty);
