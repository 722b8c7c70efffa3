//! bench/queue-model.js, whose figures bench/README.md quotes as the limit the measured
//! p99 ratios are read against: its policies must rank as queueing theory says, and bad
//! options must be refused by name.

use std::path::PathBuf;
use std::process::Command;

fn model(args: &[&str]) -> std::process::Output {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../bench/queue-model.js");
    Command::new("node")
        .arg(script)
        .args(args)
        .output()
        .expect("node runs (scripts/test installs it)")
}

/// The p99 column of one policy's row in the last load's table.
fn p99(out: &str, policy: &str) -> f64 {
    let row = out
        .lines()
        .rev()
        .find(|l| l.split_whitespace().next() == Some(policy))
        .unwrap_or_else(|| panic!("no row for {policy} in\n{out}"));
    row.split_whitespace().nth(2).unwrap().parse().unwrap()
}

#[test]
fn late_binding_beats_least_conn_which_beats_random() {
    let out = model(&["--requests", "40000", "--loads", "75"]);
    assert!(out.status.success(), "{out:?}");
    let out = String::from_utf8(out.stdout).unwrap();
    let (random, lc) = (p99(&out, "random"), p99(&out, "least-conn"));
    let (fifo, bypass) = (p99(&out, "late-fifo"), p99(&out, "late-bypass"));
    assert!(lc < random, "least-conn {lc} vs random {random}\n{out}");
    assert!(fifo < lc, "late-fifo {fifo} vs least-conn {lc}\n{out}");
    assert!(
        bypass <= fifo,
        "late-bypass {bypass} vs late-fifo {fifo}\n{out}"
    );
    // Every policy's p99 is at least the expensive request itself.
    assert!(bypass >= 10.0, "{out}");
}

#[test]
fn bad_options_are_refused_by_name() {
    for (args, names) in [
        (&["--workers", "0"][..], "--workers"),
        (&["--workers", "2.5"], "--workers"),
        (&["--loads", "50,x"], "--loads"),
        (&["--expensive-share", "100"], "--expensive-share"),
        (&["--bogus", "1"], "--bogus"),
        (&["--requests"], "--requests"),
    ] {
        let out = model(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(names), "{args:?}: {err}");
    }
}
