//! End-to-end config errors: `drover proxy --config FILE` must refuse a bad file with
//! exit code 2 and an `error: FILE:LINE:COL: KEY: message` line on stderr, before it
//! binds anything, and `drover check -c FILE` must find the same error (exit code 1).
//! Finer-grained cases live in drover-config's unit tests; these check that the binary
//! surfaces the loader's errors unchanged.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A scratch directory for one case, removed when dropped.
fn scratch(case: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("drover-config-errors-{case}-"))
        .tempdir()
        .expect("create scratch dir")
}

struct Outcome {
    code: Option<i32>,
    stderr: String,
}

/// Runs `drover proxy --config <dir>/<file_name>` on `text` and returns its exit code and
/// stderr. A valid config would make drover serve forever, so the run is killed after a
/// deadline rather than hanging the test suite.
fn run_with_config(case: &str, file_name: &str, text: Option<&str>) -> Outcome {
    let scratch = scratch(case);
    let path = scratch.path().join(file_name);
    if let Some(text) = text {
        std::fs::write(&path, text).expect("write config");
    }
    let mut child = Command::new(env!("CARGO_BIN_EXE_drover"))
        .arg("proxy")
        .arg("--config")
        .arg(&path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn drover");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if child.try_wait().expect("wait for drover").is_some() {
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("drover did not exit on an invalid config ({case}); it must refuse to start");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("collect drover output");
    Outcome {
        code: out.status.code(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// `drover check -c <dir>/<file_name>` on `text`: what `drover check` says of the same file.
fn check_config(case: &str, file_name: &str, text: Option<&str>) -> Outcome {
    let scratch = scratch(&format!("check-{case}"));
    let path = scratch.path().join(file_name);
    if let Some(text) = text {
        std::fs::write(&path, text).expect("write config");
    }
    let out = Command::new(env!("CARGO_BIN_EXE_drover"))
        .args(["check", "-c"])
        .arg(&path)
        .stdin(Stdio::null())
        .output()
        .expect("run drover check");
    Outcome {
        code: out.status.code(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Asserts exit code 2 and an error naming `file_name:line` and every one of `needles`,
/// and that `drover check` finds the same error (exit code 1).
#[track_caller]
fn assert_config_error(case: &str, text: &str, line: usize, needles: &[&str]) {
    let file_name = format!("{case}.toml");
    let started = run_with_config(case, &file_name, Some(text));
    assert_eq!(
        started.code,
        Some(2),
        "exit code for {case}; stderr:\n{}",
        started.stderr
    );
    let checked = check_config(case, &file_name, Some(text));
    assert_eq!(
        checked.code,
        Some(1),
        "drover check's exit code for {case}; stderr:\n{}",
        checked.stderr
    );
    for out in [started, checked] {
        assert_error_names(case, &file_name, &out, line, needles);
    }
}

#[track_caller]
fn assert_error_names(case: &str, file_name: &str, out: &Outcome, line: usize, needles: &[&str]) {
    let stderr = &out.stderr;
    assert!(stderr.contains("error: "), "{case}: stderr:\n{stderr}");
    let at = format!("{file_name}:{line}:");
    assert!(
        stderr.contains(&at),
        "{case}: expected {at:?} in stderr:\n{stderr}"
    );
    for needle in needles {
        assert!(
            stderr.contains(needle),
            "{case}: expected {needle:?} in stderr:\n{stderr}"
        );
    }
}

#[test]
fn unknown_key() {
    assert_config_error(
        "unknown-key",
        "[[balancer]]\nlisten = \"127.0.0.1:0\"\nbackend = [\"127.0.0.1:9001\"]\n",
        3,
        &["balancer[0].backend", "unknown key", "backends"],
    );
}

#[test]
fn bad_duration() {
    assert_config_error(
        "bad-duration",
        "[[balancer]]\nlisten = \"127.0.0.1:0\"\nbackends = [\"127.0.0.1:9001\"]\ntimeouts = { connect = \"fast\" }\n",
        4,
        &["balancer[0].timeouts.connect", "\"fast\""],
    );
}

#[test]
fn bad_minimum_body_rate() {
    for (case, value, needle) in [
        ("body-rate-zero", "body_min_rate = 0", "0 is out of range"),
        (
            "body-rate-negative",
            "body_min_rate = -500",
            "-500 is out of range",
        ),
        ("body-rate-garbage", "body_min_rate = \"fast\"", "\"fast\""),
        ("body-grace-zero", "body = \"0s\"", "greater than 0"),
        ("body-grace-garbage", "body = \"soon\"", "\"soon\""),
    ] {
        let key = if value.starts_with("body_min_rate") {
            "balancer[0].timeouts.body_min_rate"
        } else {
            "balancer[0].timeouts.body"
        };
        assert_config_error(
            case,
            &format!("[[balancer]]\nlisten = \"127.0.0.1:0\"\nbackends = [\"127.0.0.1:9001\"]\ntimeouts = {{ {value} }}\n"),
            4,
            &[key, needle],
        );
    }
}

#[test]
fn bad_listen_address() {
    assert_config_error(
        "bad-listen",
        "[[balancer]]\nlisten = \"localhost\"\nbackends = [\"127.0.0.1:9001\"]\n",
        2,
        &["balancer[0].listen", "\"localhost\""],
    );
}

#[test]
fn unknown_strategy() {
    assert_config_error(
        "unknown-strategy",
        "[[balancer]]\nlisten = \"127.0.0.1:0\"\nstrategy = \"fastest\"\nbackends = [\"127.0.0.1:9001\"]\n",
        3,
        &["balancer[0].strategy", "\"fastest\"", "round-robin", "p2c"],
    );
}

#[test]
fn missing_hash_key() {
    assert_config_error(
        "missing-hash",
        "[[balancer]]\nlisten = \"127.0.0.1:0\"\nbackends = [\"127.0.0.1:9001\"]\nstrategy = \"hash\"\n",
        4,
        &["balancer[0].hash"],
    );
}

#[test]
fn app_backend_without_app() {
    assert_config_error(
        "missing-app",
        "[[balancer]]\nlisten = \"127.0.0.1:0\"\nbackends = [\"app:nope\"]\n",
        3,
        &["balancer[0].backends[0]", "app:nope"],
    );
}

#[test]
fn retries_out_of_range() {
    assert_config_error(
        "retries-range",
        "[[balancer]]\nlisten = \"127.0.0.1:0\"\nbackends = [\"127.0.0.1:9001\"]\nretries = 11\n",
        4,
        &["balancer[0].retries", "0..=10"],
    );
}

#[test]
fn missing_file_is_a_config_error() {
    let out = run_with_config("missing-file", "does-not-exist.toml", None);
    assert_eq!(out.code, Some(2), "stderr:\n{}", out.stderr);
    let checked = check_config("missing-file", "does-not-exist.toml", None);
    assert_eq!(checked.code, Some(1), "stderr:\n{}", checked.stderr);
    for out in [out, checked] {
        assert!(
            out.stderr.contains("does-not-exist.toml") && out.stderr.contains("cannot read"),
            "stderr:\n{}",
            out.stderr
        );
    }
}

#[test]
fn bad_proxy_protocol_senders() {
    assert_config_error(
        "proxy-protocol-range",
        "[[balancer]]\nlisten = \"127.0.0.1:0\"\nbackends = [\"127.0.0.1:9001\"]\nproxy_protocol = { trusted = [\"127.0.0.1\", \"10.0.0.0/33\"] }\n",
        4,
        &["balancer[0].proxy_protocol.trusted[1]", "10.0.0.0/33"],
    );
    assert_config_error(
        "proxy-protocol-empty",
        "[[balancer]]\nlisten = \"127.0.0.1:0\"\nbackends = [\"127.0.0.1:9001\"]\nproxy_protocol = { trusted = [] }\n",
        4,
        &["balancer[0].proxy_protocol.trusted", "no sender to trust"],
    );
    assert_config_error(
        "proxy-protocol-key",
        "[[balancer]]\nlisten = \"127.0.0.1:0\"\nbackends = [\"127.0.0.1:9001\"]\nproxy_protocol = { from = [\"127.0.0.1\"] }\n",
        4,
        &["balancer[0].proxy_protocol", "from"],
    );
    assert_config_error(
        "forwarded-headers-range",
        "[[balancer]]\nlisten = \"127.0.0.1:0\"\nbackends = [\"127.0.0.1:9001\"]\nforwarded_headers = { trusted = [\"127.0.0.1\", \"proxy.internal\"] }\n",
        4,
        &["balancer[0].forwarded_headers.trusted[1]", "proxy.internal"],
    );
    assert_config_error(
        "forwarded-headers-key",
        "[[balancer]]\nlisten = \"127.0.0.1:0\"\nbackends = [\"127.0.0.1:9001\"]\nforwarded_headers = { trusted_ips = [\"127.0.0.1\"] }\n",
        4,
        &["balancer[0].forwarded_headers", "trusted_ips"],
    );
    assert_config_error(
        "send-proxy-protocol-version",
        "[[balancer]]\nlisten = \"127.0.0.1:0\"\nbackends = [\"127.0.0.1:9001\"]\nsend_proxy_protocol = \"v3\"\n",
        4,
        &["balancer[0].send_proxy_protocol", "\"v3\"", "v1", "v2"],
    );
    assert_config_error(
        "send-proxy-protocol-app",
        "[[app]]\nname = \"web\"\ncommand = [\"node\", \"app.js\"]\n\n[[balancer]]\nlisten = \"127.0.0.1:0\"\nbackends = [\"app:web\"]\nsend_proxy_protocol = \"v2\"\n",
        8,
        &["balancer[0].send_proxy_protocol", "not in front of app \"web\""],
    );
}

#[test]
fn tcp_mode_refuses_what_only_http_has() {
    let tcp =
        "[[balancer]]\nlisten = \"127.0.0.1:0\"\nbackends = [\"127.0.0.1:9001\"]\nmode = \"tcp\"\n";
    assert_config_error(
        "tcp-mode-value",
        "[[balancer]]\nlisten = \"127.0.0.1:0\"\nbackends = [\"127.0.0.1:9001\"]\nmode = \"udp\"\n",
        4,
        &["balancer[0].mode", "expected \"http\" or \"tcp\""],
    );
    assert_config_error(
        "tcp-mode-timeout",
        &format!("{tcp}timeouts = {{ idle = \"5m\", header_read = \"5s\" }}\n"),
        5,
        &[
            "balancer[0].timeouts.header_read",
            "does not apply to mode = \"tcp\"",
        ],
    );
    assert_config_error(
        "tcp-mode-strategy",
        &format!("{tcp}strategy = \"sticky\"\n"),
        5,
        &["balancer[0].strategy", "HTTP cookie", "client-ip"],
    );
    assert_config_error(
        "tcp-mode-health",
        &format!("{tcp}health = {{ path = \"/health\" }}\n"),
        5,
        &["balancer[0].health.path", "tcp = true"],
    );
    assert_config_error(
        "tcp-mode-forwarded-headers",
        &format!("{tcp}forwarded_headers = {{ trusted = [\"10.0.0.0/8\"] }}\n"),
        5,
        &[
            "balancer[0].forwarded_headers",
            "does not apply to mode = \"tcp\"",
        ],
    );
    assert_config_error(
        "http-mode-half-close",
        "[[balancer]]\nlisten = \"127.0.0.1:0\"\nbackends = [\"127.0.0.1:9001\"]\ntimeouts = { half_close = \"1s\" }\n",
        4,
        &["balancer[0].timeouts.half_close", "mode = \"tcp\" only"],
    );
}
