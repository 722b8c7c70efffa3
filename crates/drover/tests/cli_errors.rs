//! Bad command-line flags: a clear error naming the flag, exit 2, nothing started.

mod common;

use common::bin;

async fn fails(args: &[&str], needle: &str) {
    // A drover that starts after all runs until it is stopped: bounded, and killed.
    let out = tokio::time::timeout(
        std::time::Duration::from_secs(20),
        tokio::process::Command::new(bin())
            .args(args)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap_or_else(|_| panic!("{args:?} started instead of failing"))
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
    assert!(
        stderr.contains(needle),
        "{args:?}: expected {needle:?} in: {stderr}"
    );
}

#[tokio::test]
async fn bad_flags_are_named() {
    let b = [
        "proxy",
        "--listen",
        "127.0.0.1:0",
        "--backend",
        "127.0.0.1:1",
    ];
    let with =
        |extra: &[&'static str]| -> Vec<&'static str> { b.iter().chain(extra).copied().collect() };
    fails(&["proxy", "--backend", "127.0.0.1:1"], "--listen").await;
    fails(&with(&["--shutdown-delay", "soon"]), "--shutdown-delay").await;
    for (range, says) in [
        ("9000-8000", "LOW is above HIGH"),
        ("9000", "expected LOW-HIGH"),
    ] {
        let run = ["run", "--worker-ports", range, "--", "sleep", "60"];
        fails(&run, "--worker-ports").await;
        fails(&run, says).await;
    }
    fails(
        &[
            "run",
            "--mode",
            "background",
            "--worker-ports",
            "9000-9010",
            "--",
            "sleep",
            "60",
        ],
        "--worker-ports",
    )
    .await;
    fails(&["proxy", "--listen", "127.0.0.1:0"], "--backend").await;
    fails(
        &["proxy", "--listen", "nowhere", "--backend", "127.0.0.1:1"],
        "--listen",
    )
    .await;
    fails(
        &["proxy", "--listen", "127.0.0.1:0", "--backend", "localhost"],
        "--backend",
    )
    .await;
    // What the address is missing, said: a port past 65535, a URL for a backend.
    fails(
        &[
            "proxy",
            "--listen",
            "127.0.0.1:80000",
            "--backend",
            "127.0.0.1:1",
        ],
        "port 80000 is past 65535",
    )
    .await;
    fails(
        &[
            "proxy",
            "--listen",
            "127.0.0.1:0",
            "--backend",
            "http://127.0.0.1:1",
        ],
        "a backend is an address, not a URL: write \"127.0.0.1:1\"",
    )
    .await;
    fails(
        &with(&["--strategy", "fastest"]),
        "unknown strategy \"fastest\"",
    )
    .await;
    fails(&with(&["--threads", "0"]), "--threads").await;
    fails(&with(&["--retries", "11"]), "--retries").await;
    fails(&with(&["--max-conns", "lots"]), "max_conns").await;
    fails(&with(&["--queue-timeout", "soon"]), "--queue-timeout").await;
    // One grammar for every duration: a bare number has no unit, here as in bench -d.
    fails(
        &with(&["--connect-timeout", "10"]),
        "a number needs a unit, e.g. \"10s\"",
    )
    .await;
    for bad in ["0s", "-1s", "soon"] {
        fails(&with(&["--body-timeout", bad]), "--body-timeout").await;
        fails(&with(&["--request-timeout", bad]), "--request-timeout").await;
    }
    // The request timeout alone may be "off".
    fails(&with(&["--connect-timeout", "off"]), "--connect-timeout").await;
    for bad in ["0", "-5", "fast", "1.5"] {
        fails(&with(&["--body-min-rate", bad]), "--body-min-rate").await;
    }
    fails(
        &with(&["--tcp", "--max-body-bytes", "1M"]),
        "--max-body-bytes does not apply to --tcp",
    )
    .await;
    fails(&with(&["--strategy", "hash"]), "--hash-key").await;
    fails(
        &with(&["--hash-key", "path"]),
        "only applies to --strategy hash",
    )
    .await;
    fails(
        &with(&["--strategy", "hash", "--hash-key", "ip"]),
        "invalid hash key",
    )
    .await;
    fails(
        &with(&["--health-path", "/h", "--health-tcp"]),
        "--health-tcp",
    )
    .await;
    // --tcp: the flags only HTTP has are named, and so are bad TCP timeouts.
    fails(
        &with(&["--tcp", "--header-timeout", "3s"]),
        "--header-timeout does not apply to --tcp",
    )
    .await;
    fails(
        &with(&["--tcp", "--forwarded-headers-from", "10.0.0.0/8"]),
        "--forwarded-headers-from does not apply to --tcp",
    )
    .await;
    // Senders to trust: addresses or CIDR ranges, at least one.
    fails(
        &with(&["--forwarded-headers-from", "10.0.0.0/33"]),
        "--forwarded-headers-from",
    )
    .await;
    fails(&with(&["--forwarded-headers-from", ","]), "no address").await;
    fails(
        &with(&["--tcp", "--strategy", "peak-ewma"]),
        "strategy \"peak-ewma\" ranks endpoints by request latency",
    )
    .await;
    fails(
        &with(&["--half-close-timeout", "3s"]),
        "--half-close-timeout applies to --tcp only",
    )
    .await;
    for bad in ["0s", "soon"] {
        fails(
            &with(&["--tcp", "--half-close-timeout", bad]),
            "--half-close-timeout",
        )
        .await;
    }
    fails(&with(&["--backend", "127.0.0.1:1"]), "given twice").await;
    fails(&with(&["--config", "x.toml"]), "--config").await;
    fails(
        &["up", "--config", "/nonexistent/drover.toml"],
        "/nonexistent/drover.toml",
    )
    .await;

    let run = |extra: &[&'static str]| -> Vec<&'static str> {
        ["run", "-l", "127.0.0.1:0", "--admin", "off"]
            .iter()
            .chain(extra)
            .chain(&["--", "true"])
            .copied()
            .collect()
    };
    // `--mode background` takes no `-l`.
    let background = |extra: &[&'static str]| -> Vec<&'static str> {
        ["run", "--admin", "off", "--mode", "background"]
            .iter()
            .chain(extra)
            .chain(&["--", "true"])
            .copied()
            .collect()
    };
    fails(&run(&["--mode", "cluster"]), "unknown mode \"cluster\"").await;
    fails(&run(&["--max-memory", "12X"]), "unknown unit \"x\"").await;
    fails(&run(&["--max-memory", "0"]), "greater than 0").await;
    fails(
        &run(&["--fall", "5"]),
        "--fall times the workers' health checks, and none is asked for: add --health-path",
    )
    .await;
    fails(&run(&["--health-path", "/health", "--fall", "0"]), "--fall").await;
    fails(
        &["run", "--admin", "everywhere", "--", "true"],
        "or \"off\"",
    )
    .await;
    fails(
        &run(&["--mode", "shared", "--strategy", "p2c"]),
        "--strategy does not apply to --mode shared",
    )
    .await;
    fails(
        &run(&["--mode", "shared", "--health-path", "/health"]),
        "--health-path needs a port per worker",
    )
    .await;
    // The port of a Node app's servers that drover balances: a port, with a balancer.
    fails(&run(&["--app-port", "0"]), "--app-port").await;
    fails(&run(&["--app-port", "65536"]), "--app-port").await;
    fails(&run(&["--app-port", "http"]), "--app-port").await;
    fails(
        &run(&["--mode", "shared", "--app-port", "3000"]),
        "--app-port does not apply to --mode shared",
    )
    .await;
    fails(
        &background(&["--app-port", "3000"]),
        "--app-port does not apply to --mode background",
    )
    .await;
    // The timeouts of drover proxy, for drover run's balancer too, and only there.
    fails(
        &run(&["--mode", "shared", "--request-timeout", "5m"]),
        "--request-timeout does not apply to --mode shared",
    )
    .await;
    fails(
        &background(&["--client-timeout", "1m"]),
        "--client-timeout does not apply to --mode background",
    )
    .await;
    fails(
        &run(&["--half-close-timeout", "5s"]),
        "--half-close-timeout applies to --tcp only",
    )
    .await;
    fails(
        &run(&["--tcp", "--request-timeout", "5m"]),
        "--request-timeout does not apply to --tcp",
    )
    .await;
    fails(
        &run(&["--tcp", "--forwarded-headers-from", "127.0.0.1"]),
        "--forwarded-headers-from",
    )
    .await;
    fails(
        &run(&["--tcp", "--max-header-bytes", "64KiB"]),
        "--max-header-bytes",
    )
    .await;
    fails(
        &run(&["--mode", "shared", "--max-header-bytes", "64KiB"]),
        "--max-header-bytes",
    )
    .await;
    for bad in ["1000", "2MiB", "0", "lots", "16x"] {
        fails(&run(&["--max-header-bytes", bad]), "--max-header-bytes").await;
    }
    for bad in ["lots", "10Q", "", "1.5.5M"] {
        fails(&run(&["--max-body-bytes", bad]), "--max-body-bytes").await;
    }
    // A body limit needs drover to see every request.
    for mode in ["shared", "handoff"] {
        fails(
            &run(&["--mode", mode, "--max-body-bytes", "1M"]),
            "--max-body-bytes",
        )
        .await;
    }
    fails(
        &run(&["--tcp", "--max-body-bytes", "1M"]),
        "--max-body-bytes: TCP mode reads no HTTP request",
    )
    .await;
    fails(&run(&["--request-timeout", "soon"]), "--request-timeout").await;
    // A request timeout is a duration above zero or "off", and only it may be off.
    for bad in ["0s", "none", "-1s"] {
        fails(&run(&["--request-timeout", bad]), "or \"off\"").await;
    }
    fails(&["ctl", "status", "--admin", "nowhere"], "--admin").await;
    fails(&["ctl", "restart"], "restart").await;
}

/// `drover proxy` on `addr` with `threads` serving threads, to the backend 127.0.0.1:1.
fn proxy_on<'a>(addr: &'a str, threads: &'a str) -> [&'a str; 7] {
    [
        "proxy",
        "--listen",
        addr,
        "--backend",
        "127.0.0.1:1",
        "--threads",
        threads,
    ]
}

/// Addresses as nginx and HAProxy users write them: `-l :PORT` (every address, HAProxy's
/// `bind :8000`), `-l PORT` (nginx's `listen 8000`) and `localhost:PORT`, for the listener
/// and a backend. Each was refused with a bare "invalid socket address syntax".
#[tokio::test]
async fn listen_and_backend_addresses_take_the_forms_nginx_and_haproxy_users_write() {
    let backend = drover_testkit::Backend::start().await;
    let backend_at = format!("localhost:{}", backend.addr().port());
    for listen in [":PORT", "PORT", "localhost:PORT"] {
        let port = drover_testkit::free_port();
        let listen = listen.replace("PORT", &port.to_string());
        let d = drover_testkit::DroverProcess::spawn(
            bin(),
            &["proxy", "-l", &listen, "-b", &backend_at, "--threads", "1"],
        )
        .await;
        let at = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        let r = drover_testkit::HttpClient::connect(at)
            .await
            .unwrap()
            .get("/")
            .await;
        assert_eq!(r.status, 200, "-l {listen}: {}", d.stderr_text());
    }
}

#[tokio::test]
async fn a_port_in_use_is_reported() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    fails(&proxy_on(&addr, "1"), "cannot listen on").await;
}

#[tokio::test]
async fn a_second_drover_on_the_same_address_fails_to_start() {
    // Each serving thread has its own socket on the port (one SO_REUSEPORT group). A
    // second drover's first socket must not join the first drover's group: the two
    // would split the connections between them, silently.
    let first = drover_testkit::DroverProcess::spawn(bin(), &proxy_on("127.0.0.1:0", "2")).await;
    let addr = first.addr().to_string();
    for threads in ["2", "1"] {
        fails(&proxy_on(&addr, threads), "Address already in use").await;
    }
    fails(
        &[
            "run", "-w", "1", "--listen", &addr, "--admin", "off", "--", "sleep", "60",
        ],
        "Address already in use",
    )
    .await;
}

/// A `DROVER_LOG` that is not a filter (a typo of a level) is refused by name before
/// anything starts. Before, tracing read `dbug` as a target name, and with no level
/// left for the rest, every warning was hidden, crash loops among them (container
/// seat). (`log_directives` in main.rs reads the good ones.)
#[test]
fn a_drover_log_that_is_not_a_filter_is_refused_by_name() {
    for bad in ["dbug", "garbage", "drover_proxy=lots"] {
        let out = std::process::Command::new(bin())
            .env("DROVER_LOG", bad)
            .args(["run", "--admin", "off", "--", "true"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad}: {err}");
        assert!(
            err.contains(&format!("DROVER_LOG=\"{bad}\"")) && err.contains("is not a level"),
            "{bad}: {err}"
        );
        assert!(
            !err.contains("listening"),
            "{bad}: something started: {err}"
        );
    }
}

/// A log format drover does not write is refused by name, from the flag and from the
/// environment, before anything starts.
#[test]
fn a_log_format_drover_does_not_write_is_refused_by_name() {
    let refuse = |cmd: &mut std::process::Command, what: &str| {
        let out = cmd
            .args(["run", "--admin", "off", "--", "true"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(
            err.contains("--log-format") && err.contains(what) && err.contains("json"),
            "{err}"
        );
        assert!(!err.contains("listening"), "something started: {err}");
    };
    refuse(
        std::process::Command::new(bin()).args(["--log-format", "yaml"]),
        "yaml",
    );
    refuse(
        std::process::Command::new(bin()).env("DROVER_LOG_FORMAT", "JSONL"),
        "JSONL",
    );
}
