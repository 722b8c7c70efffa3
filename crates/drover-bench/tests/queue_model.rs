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

/// The p99 column of one policy's row in the last table.
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
    let out = model(&["--requests", "40000", "--loads", "75", "--closed", "none"]);
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

/// Under a standing queue, unbounded passing starves the expensive requests (their p99
/// grows several-fold) while drover's bounded passes stay near first come, first served.
#[test]
fn a_standing_queue_punishes_unbounded_passing_but_not_bounded() {
    let out = model(&["--requests", "40000", "--loads", "75", "--closed", "50"]);
    assert!(out.status.success(), "{out:?}");
    let out = String::from_utf8(out.stdout).unwrap();
    let closed = &out[out.find("closed loop").expect("a closed-loop table")..];
    let (fifo, bypass, sjf) = (
        p99(closed, "late-fifo"),
        p99(closed, "late-bypass"),
        p99(closed, "late-sjf"),
    );
    assert!(
        sjf > 2.0 * fifo,
        "late-sjf {sjf} vs late-fifo {fifo}\n{out}"
    );
    assert!(
        bypass < 1.25 * fifo,
        "late-bypass {bypass} vs late-fifo {fifo}\n{out}"
    );
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
        (&["--closed", "0"], "--closed"),
        (&["--closed", "8,x"], "--closed"),
    ] {
        let out = model(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(names), "{args:?}: {err}");
    }
}
