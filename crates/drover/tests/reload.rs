//! Rolling reloads (`drover ctl reload`, SIGHUP), `drover ctl status`, the admin API's
//! answers to bad requests, shared-socket mode, crash loops and hung workers, all
//! through the real binary and real worker processes.

mod common;

use common::{
    admin_addr, assert_load_never_failed, assert_served_more, bin, counted_load, ctl, metrics_text,
    pi_server, status, steady_load, stops_cleanly, temp_dir,
};
use drover_testkit::{DroverProcess, HttpClient};
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::Arc;
use std::time::Duration;

fn worker_script(dir: &Path) -> String {
    // Python worker of drover-testkit: see fixtures/py_worker.py for what it answers.
    drover_testkit::write_py_worker(dir).display().to_string()
}

/// `drover run` of the Python test worker: `workers` of them, the balancer and admin
/// API on free ports, plus `extra` flags. Returns drover and its admin address.
async fn run_python(tag: &str, workers: &str, extra: &[&str]) -> (DroverProcess, SocketAddr) {
    let script = worker_script(&temp_dir(tag));
    let mut args = vec![
        "run",
        "-w",
        workers,
        "-l",
        "127.0.0.1:0",
        "--admin",
        "127.0.0.1:0",
    ];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--", "python3", &script]);
    let d = DroverProcess::spawn(bin(), &args).await;
    let admin = admin_addr(&d).await;
    (d, admin)
}

/// A drover.toml with an admin API, app "web" running the Python test worker and a
/// balancer over it; `admin`, `app` and `balancer` are extra lines for each table (`app`
/// may also append more tables).
fn web_config(script: &str, admin: &str, app: &str, balancer: &str) -> String {
    format!(
        "[admin]\nlisten = \"127.0.0.1:0\"\n{admin}\n[[app]]\nname = \"web\"\ncommand = [\"python3\", \"{script}\"]\n{app}\n[[balancer]]\nlisten = \"127.0.0.1:0\"\nthreads = 1\nbackends = [\"app:web\"]\n{balancer}"
    )
}

/// `drover up` on `toml` written to a fresh drover.toml; returns drover, its admin
/// address and the file (for reload tests to rewrite).
async fn up_with(tag: &str, toml: &str) -> (DroverProcess, SocketAddr, PathBuf) {
    let file = temp_dir(tag).join("drover.toml");
    std::fs::write(&file, toml).unwrap();
    let d = DroverProcess::spawn(bin(), &["up", "-c", file.to_str().unwrap()]).await;
    let admin = admin_addr(&d).await;
    (d, admin, file)
}

/// `n` requests for the Python worker's `/slow` (200 ms) at once, each on its own
/// connection; each answers the worker's JSON.
fn slow_requests(addr: SocketAddr, n: usize) -> Vec<tokio::task::JoinHandle<serde_json::Value>> {
    (0..n)
        .map(|_| {
            tokio::spawn(async move {
                let mut c = HttpClient::connect(addr).await.unwrap();
                let r = c.request("GET", "/slow", &[], None).await.unwrap();
                assert_eq!(r.status, 200, "{}", r.text());
                serde_json::from_str(&r.text()).unwrap()
            })
        })
        .collect()
}

/// The processes are gone, not zombies.
fn assert_gone<'a>(pids: impl IntoIterator<Item = &'a u32>, what: &str) {
    for pid in pids {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        assert!(stat.is_empty(), "{what} worker {pid} still there: {stat}");
    }
}

async fn all_ready(admin: SocketAddr, n: usize) -> Vec<u32> {
    let mut pids = Vec::new();
    for _ in 0..300 {
        let s = status(admin).await;
        let ws = &s.apps[0].workers;
        if ws.len() == n && ws.iter().all(|w| w.state == "ready") {
            pids = ws.iter().map(|w| w.pid.unwrap()).collect();
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(pids.len(), n, "workers never all ready");
    pids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolling_reload_under_load_fails_no_request() {
    let server = pi_server();
    let d = DroverProcess::spawn(
        bin(),
        &[
            "run",
            "-w",
            "2",
            "--listen",
            "127.0.0.1:0",
            "--threads",
            "1",
            "--admin",
            "127.0.0.1:0",
            "--health-path",
            "/health",
            "--",
            "node",
            &server,
        ],
    )
    .await;
    let admin = admin_addr(&d).await;
    let first = all_ready(admin, 2).await;

    let stop = Arc::new(AtomicBool::new(false));
    let served = Arc::new(AtomicUsize::new(0));
    let load = counted_load(
        d.addr(),
        4,
        "/pi?iterations=20000",
        stop.clone(),
        served.clone(),
    );
    assert_served_more(&d, &served, 20, "before the first reload").await;

    // Once through the admin API...
    let (code, out, err) = ctl(admin, &["reload"]).await;
    assert_eq!(code, 0, "{err}\n{}", d.stderr_text());
    assert!(out.contains("reloaded app (2 workers)"), "{out}");
    let second = all_ready(admin, 2).await;
    assert!(
        second.iter().all(|p| !first.contains(p)),
        "{first:?} -> {second:?}"
    );

    // drover's output says so too, as for a SIGHUP (before, only the caller was told).
    assert!(
        d.wait_for_line("drover: reloaded app", Duration::from_secs(10))
            .await
            .is_some(),
        "{}",
        d.stderr_text()
    );

    // ...and once by signal, as `kill -HUP` or systemd's ExecReload would.
    let before = d.lines_containing("drover: reloaded app").len();
    d.signal("HUP").unwrap();
    assert!(
        drover_testkit::wait_until(Duration::from_secs(30), || {
            d.lines_containing("drover: reloaded app").len() > before
        })
        .await,
        "{}",
        d.stderr_text()
    );
    let third = all_ready(admin, 2).await;
    assert!(
        third.iter().all(|p| !second.contains(p)),
        "{second:?} -> {third:?}"
    );
    assert_served_more(&d, &served, 20, "after the second reload").await;

    assert_load_never_failed(&stop, load, 101, "during reloads").await;
    assert_gone(first.iter().chain(&second), "replaced");
    stops_cleanly(d).await;
}

/// A server that opens its port before it loads the app, as gunicorn's master does
/// before its worker imports the code, and exits half a second later when the code is
/// broken (the file `broken` exists).
const BINDS_THEN_LOADS: &str = r#"import http.server, os, socket, sys, time
port = int(os.environ["PORT"])
listener = socket.socket()
listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.bind(("127.0.0.1", port))
listener.listen(128)
time.sleep(0.5)
if os.path.exists("broken"):
    print("SyntaxError: invalid syntax", file=sys.stderr)
    sys.exit(1)
class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        body = str(os.getpid()).encode()
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler, bind_and_activate=False)
server.socket.close()
server.socket = listener
server.serve_forever()
"#;

/// A reload of broken code, under a server that opens its port before it loads the
/// app (gunicorn): the replacement accepts connects at once and exits half a second
/// later. drover keeps the old workers, says why, and no request fails. Before, the
/// reload said "reloaded", every old worker was retired, and the app answered 502
/// until the next deploy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_of_code_that_fails_after_its_port_opened_keeps_the_old_workers() {
    let dir = temp_dir("binds-then-loads");
    std::fs::write(dir.join("app.py"), BINDS_THEN_LOADS).unwrap();
    let mut cmd = std::process::Command::new(bin());
    cmd.args("run -w 2 -l 127.0.0.1:0 --admin 127.0.0.1:0 -- python3 app.py".split(' '))
        .current_dir(&dir);
    let d = drover_testkit::spawn_ready_line(cmd, "\"default\" listening on ").await;
    let admin = admin_addr(&d).await;
    let before = all_ready(admin, 2).await;
    let stop = Arc::new(AtomicBool::new(false));
    let served = Arc::new(AtomicUsize::new(0));
    let load = counted_load(d.addr(), 2, "/", Arc::clone(&stop), Arc::clone(&served));
    assert_served_more(&d, &served, 5, "before the reload").await;
    std::fs::write(dir.join("broken"), "").unwrap();
    let (code, out, err) = ctl(admin, &["reload"]).await;
    assert_ne!(code, 0, "the reload said: {out}\n{}", d.stderr_text());
    assert!(
        err.contains("exited with exit status: 1 before it was ready")
            && err.contains("no worker was restarted"),
        "{err}"
    );
    assert_load_never_failed(&stop, load, 10, "while broken code was reloaded").await;
    assert_eq!(
        all_ready(admin, 2).await,
        before,
        "the old workers serve on"
    );
}

#[tokio::test]
async fn ctl_status_prints_workers_and_endpoints() {
    let (d, admin) = run_python("status", "2", &["-t", "1"]).await;
    let pids = all_ready(admin, 2).await;
    let (code, table, err) = ctl(admin, &["status"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(
        table.contains("app app (auto mode, 2 workers): python3"),
        "{table}"
    );
    for header in ["PID", "UPTIME", "RESTARTS", "RSS", "IN-FLIGHT", "STATE"] {
        assert!(table.contains(header), "{header} missing:\n{table}");
    }
    for pid in &pids {
        assert!(table.contains(&pid.to_string()), "{table}");
    }
    assert!(
        table.contains(&format!("balancer default on {} (p2c)", d.addr())),
        "{table}"
    );
    assert_eq!(table.matches("  up  ").count(), 2, "{table}");
    let s = status(admin).await;
    assert!(s.apps[0]
        .workers
        .iter()
        .all(|w| w.rss_bytes.unwrap() > 1 << 20));
    assert_eq!(s.balancers[0].endpoints.len(), 2);
}

#[tokio::test]
async fn admin_api_refuses_bad_requests_and_wrong_tokens() {
    let dir = temp_dir("reload-admin");
    let toml = web_config(&worker_script(&dir), "token = \"s3cret\"\n", "", "");
    let (_d, admin, _) = up_with("admin", &toml).await;

    let raw = |req: String| async move {
        let resp = drover_testkit::raw_exchange(admin, req.as_bytes())
            .await
            .unwrap();
        String::from_utf8_lossy(&resp).into_owned()
    };
    let auth = "Authorization: Bearer s3cret\r\n";
    let get = |path: &str, headers: &str| {
        format!("GET {path} HTTP/1.1\r\nHost: x\r\n{headers}Connection: close\r\n\r\n")
    };
    let post = |path: &str| {
        format!("POST {path} HTTP/1.1\r\nHost: x\r\n{auth}Content-Length: 0\r\nConnection: close\r\n\r\n")
    };
    let no_token = raw(get("/v1/status", "")).await;
    assert!(no_token.starts_with("HTTP/1.1 401"), "{no_token}");
    assert!(no_token.contains("www-authenticate: Bearer"), "{no_token}");
    let wrong = raw(get("/v1/status", "Authorization: Bearer s3creT\r\n")).await;
    assert!(wrong.starts_with("HTTP/1.1 401"), "{wrong}");
    let ok = raw(get("/v1/status", auth)).await;
    assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");

    let cases = [
        (get("/v1/reload", auth), "405", "use POST"),
        (get("/v1/nope", auth), "404", "no such endpoint"),
        (get("/v1/status?x=1", auth), "400", "unknown query parameter"),
        (
            format!("POST /v1/reload?app= HTTP/1.1\r\nHost: x\r\n{auth}Content-Length: 0\r\nConnection: close\r\n\r\n"),
            "400",
            "app must not be empty",
        ),
        (
            format!("POST /v1/reload?app=%zz HTTP/1.1\r\nHost: x\r\n{auth}Content-Length: 0\r\nConnection: close\r\n\r\n"),
            "400",
            "percent",
        ),
        (
            format!("POST /v1/reload?app=ghost HTTP/1.1\r\nHost: x\r\n{auth}Content-Length: 0\r\nConnection: close\r\n\r\n"),
            "404",
            "no app named \\\"ghost\\\" (apps: web)",
        ),
        ("NOT HTTP AT ALL\r\n\r\n".to_string(), "400", ""),
        (get("/v1/scale?workers=2", auth), "405", "use POST"),
        (post("/v1/scale"), "400", "workers is missing"),
        (post("/v1/scale?workers=x"), "400", "workers must be a whole number, not \\\"x\\\""),
        (post("/v1/scale?workers=-1"), "400", "workers must be a whole number"),
        (post("/v1/scale?workers=2&workers=3"), "400", "workers given more than once"),
        (post("/v1/scale?workers=0"), "400", "workers must be in 1..=1024, not 0"),
        (post("/v1/scale?replicas=2"), "400", "unknown query parameter \\\"replicas\\\": /v1/scale takes app, workers"),
        (post("/v1/scale?workers=2&app=ghost"), "404", "no app named"),
    ];
    for (req, code, says) in cases {
        let resp = raw(req.clone()).await;
        assert!(
            resp.starts_with(&format!("HTTP/1.1 {code}")),
            "{req:?} -> {resp}"
        );
        assert!(resp.contains(says), "{req:?} -> {resp}");
    }

    // drover ctl passes the token from the environment, and says what went wrong.
    let (code, _, err) = ctl(admin, &["status"]).await;
    assert_eq!(code, 2);
    assert!(
        err.contains("401") && err.contains("pass --token TOKEN (or DROVER_ADMIN_TOKEN"),
        "{err}"
    );
    let out = tokio::process::Command::new(bin())
        .args(["ctl", "--admin", &admin.to_string(), "status", "--json"])
        .env("DROVER_ADMIN_TOKEN", "s3cret")
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (code, _, err) = ctl("127.0.0.1:1".parse().unwrap(), &["status"]).await;
    assert_eq!(code, 2);
    assert!(
        err.contains("cannot reach drover's admin API at 127.0.0.1:1"),
        "{err}"
    );
}

#[tokio::test]
async fn reload_under_up_applies_app_changes_and_refuses_the_rest() {
    let script = worker_script(&temp_dir("reload-up-reload-script"));
    let config = |extra: &str, retries: u32, workers: u32| {
        web_config(
            &script,
            "",
            &format!("workers = {workers}\nenv = {{ EXTRA = \"{extra}\" }}\n"),
            &format!("retries = {retries}\n"),
        )
    };
    let (d, admin, file) = up_with("up-reload", &config("v1", 2, 2)).await;
    let v1 = all_ready(admin, 2).await;
    let extras = || async {
        let mut seen = BTreeSet::new();
        for _ in 0..20 {
            let mut c = HttpClient::connect(d.addr()).await.unwrap();
            let r = c.request("GET", "/", &[], None).await.unwrap();
            let json: serde_json::Value = serde_json::from_str(&r.text()).unwrap();
            seen.insert(json["extra"].as_str().unwrap_or("").to_string());
        }
        seen
    };
    assert_eq!(extras().await, BTreeSet::from(["v1".to_string()]));

    // An app change applies to new workers.
    std::fs::write(&file, config("v2", 2, 2)).unwrap();
    let (code, out, err) = ctl(admin, &["reload", "--app", "web"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("reloaded web"), "{out}");
    assert_eq!(extras().await, BTreeSet::from(["v2".to_string()]));
    let v2 = all_ready(admin, 2).await;
    assert!(v2.iter().all(|p| !v1.contains(p)));

    // The worker count follows the file as well; `ctl scale` holds until the next
    // reload, which makes the app match the file again.
    std::fs::write(&file, config("v2", 2, 3)).unwrap();
    let (code, _, err) = ctl(admin, &["reload"]).await;
    assert_eq!(code, 0, "{err}");
    all_ready(admin, 3).await;
    let (code, _, err) = ctl(admin, &["scale", "1"]).await;
    assert_eq!(code, 0, "{err}");
    all_ready(admin, 1).await;
    std::fs::write(&file, config("v2", 2, 2)).unwrap();
    let (code, _, err) = ctl(admin, &["reload"]).await;
    assert_eq!(code, 0, "{err}");
    let v2 = all_ready(admin, 2).await;
    assert_eq!(extras().await, BTreeSet::from(["v2".to_string()]));

    // A change that needs a restart (the admin API's token) is refused as a whole,
    // balancer changes with it, and so is a broken file.
    let needs_restart = web_config(
        &script,
        "token = \"s3cret\"",
        "workers = 2\nenv = { EXTRA = \"v3\" }\n",
        "retries = 3\n",
    );
    std::fs::write(&file, needs_restart).unwrap();
    let (code, _, err) = ctl(admin, &["reload"]).await;
    assert_eq!(code, 2);
    // The file's mistake: a 400, not a server error.
    assert!(err.contains("admin API answered 400"), "{err}");
    assert!(err.contains("the [admin] table changed"), "{err}");
    assert!(err.contains("nothing was reloaded"), "{err}");
    std::fs::write(&file, "[[app]]\nname = \"web\"\nworkerz = 2\n").unwrap();
    let (code, _, err) = ctl(admin, &["reload"]).await;
    assert_eq!(code, 2);
    assert!(
        err.contains("drover.toml:") && err.contains("workerz"),
        "{err}"
    );
    assert_eq!(
        all_ready(admin, 2).await,
        v2,
        "a refused reload touched workers"
    );
    assert_eq!(extras().await, BTreeSet::from(["v2".to_string()]));
}

/// A drover.toml is what runs: a reload starts an `[[app]]` new to the file (with the
/// balancer in front of it) and stops one taken out of it, once the balancer in front
/// of it has drained, while the other app serves on with no failed request. An app
/// that cannot start (its program is missing, its address is taken) changes nothing.
/// Before, any change to the apps' names was refused with "the apps changed".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_under_up_starts_an_app_new_to_the_file_and_stops_one_taken_out() {
    let script = worker_script(&temp_dir("reload-up-apps-script"));
    let web = web_config(&script, "", "workers = 2\n", "name = \"web\"\n");
    let api = format!(
        "\n[[app]]\nname = \"api\"\nworkers = 2\ncommand = [\"python3\", \"{script}\"]\nenv = {{ EXTRA = \"api\" }}\n\n[[balancer]]\nname = \"api\"\nlisten = \"127.0.0.1:0\"\nthreads = 1\nbackends = [\"app:api\"]\n"
    );
    let (d, admin, file) = up_with("up-reload-apps", &web).await;
    all_ready(admin, 2).await;
    let stop = Arc::new(AtomicBool::new(false));
    let load = steady_load(d.addr(), 4, "/", stop.clone());
    let names = |s: &drover_admin::Status| -> Vec<String> {
        s.apps.iter().map(|a| a.name.clone()).collect()
    };

    std::fs::write(&file, format!("{web}{api}")).unwrap();
    let (code, out, err) = ctl(admin, &["reload"]).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("started api (2 workers)"), "{out}");
    let s = status(admin).await;
    assert_eq!(names(&s), ["web", "api"]);
    let api_addr: SocketAddr = s
        .balancers
        .iter()
        .find(|b| b.name == "api")
        .expect("the api balancer runs")
        .listen
        .parse()
        .unwrap();
    let mut api_pids = Vec::new();
    for _ in 0..300 {
        let s = status(admin).await;
        let ws = &s.apps[1].workers;
        if ws.len() == 2 && ws.iter().all(|w| w.state == "ready") {
            api_pids = ws.iter().filter_map(|w| w.pid).collect();
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(api_pids.len(), 2, "api's workers never became ready");
    for _ in 0..10 {
        let mut c = HttpClient::connect(api_addr).await.unwrap();
        let r = c.request("GET", "/", &[], None).await.unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        assert!(r.text().contains("\"api\""), "{}", r.text());
    }

    // An app that cannot start changes nothing: a program that is not there, a
    // shared-mode address another program holds.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    for (bad, says) in [
        (
            "\n[[app]]\nname = \"ghost\"\ncommand = [\"no-such-program-here\"]\n".to_string(),
            "no-such-program-here",
        ),
        (
            format!(
                "\n[[app]]\nname = \"ghost\"\nmode = \"shared\"\nlisten = \"{}\"\ncommand = [\"python3\", \"{script}\"]\n",
                taken.local_addr().unwrap()
            ),
            "cannot listen on",
        ),
    ] {
        std::fs::write(&file, format!("{web}{api}{bad}")).unwrap();
        let (code, out, err) = ctl(admin, &["reload"]).await;
        assert_ne!(code, 0, "{out}{err}");
        assert!(err.contains(says) && err.contains("nothing was reloaded"), "{err}");
        assert_eq!(names(&status(admin).await), ["web", "api"], "{err}");
    }
    drop(taken);

    // A new app that starts, beside an app whose replacement fails at start: the
    // reload is rolled back, and the log names the new app that ran meanwhile (it
    // said only "nothing was reloaded").
    let broken_api = api.replace(
        &format!("[\"python3\", \"{script}\"]"),
        "[\"python3\", \"-c\", \"raise SystemExit(3)\"]",
    );
    assert_ne!(broken_api, api);
    let newbie =
        "\n[[app]]\nname = \"newbie\"\nmode = \"background\"\ncommand = [\"sleep\", \"60\"]\n";
    std::fs::write(&file, format!("{web}{broken_api}{newbie}")).unwrap();
    let (code, out, err) = ctl(admin, &["reload"]).await;
    assert_ne!(code, 0, "{out}{err}");
    assert_eq!(names(&status(admin).await), ["web", "api"], "{err}");
    assert!(
        d.stderr_text().contains(
            "reload failed: app(s) new to the file, \"newbie\", started and stopped again"
        ),
        "{err}\n{}",
        d.stderr_text()
    );
    std::fs::write(&file, format!("{web}{api}")).unwrap();

    // Taken out of the file: its balancer drains and its workers stop.
    std::fs::write(&file, &web).unwrap();
    let (code, out, err) = ctl(admin, &["reload"]).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("stopped api (not in the file)"), "{out}");
    assert!(out.contains("api (removed)"), "{out}");
    let s = status(admin).await;
    assert_eq!(names(&s), ["web"]);
    assert!(s.balancers.iter().all(|b| b.name != "api"));
    let outlived: Vec<&u32> = api_pids.iter().filter(|p| common::alive(**p)).collect();
    assert!(
        outlived.is_empty(),
        "api's workers outlived its removal: {outlived:?}"
    );
    assert!(
        HttpClient::connect(api_addr).await.is_err(),
        "api's address still answers"
    );
    assert_load_never_failed(&stop, load, 20, "while apps came and went").await;
    stops_cleanly(d).await;
}

#[tokio::test]
async fn shared_mode_serves_on_every_worker_through_one_address() {
    let (d, admin) = run_python("shared", "2", &["--mode", "shared"]).await;
    assert!(
        d.stderr_text().contains("(shared socket, 2 workers)"),
        "{}",
        d.stderr_text()
    );
    let pids = all_ready(admin, 2).await;
    let s = status(admin).await;
    assert_eq!(s.apps[0].mode, "shared");
    assert!(s.balancers.is_empty());

    // Overlapping slow requests reach both workers: each has a socket of its own and
    // drover places new connections evenly while they are equally loaded (how evenly
    // is shared_steer.rs's business).
    let mut seen = BTreeSet::new();
    for _ in 0..10 {
        for ask in slow_requests(d.addr(), 4) {
            let json = ask.await.unwrap();
            let pid = json["pid"].as_u64().unwrap();
            assert_eq!(json["listen_pid"].as_str(), Some(pid.to_string().as_str()));
            seen.insert(pid as u32);
        }
        if seen.len() == 2 {
            break;
        }
    }
    assert_eq!(seen, pids.iter().copied().collect::<BTreeSet<_>>());

    let (code, _, err) = ctl(admin, &["reload"]).await;
    assert_eq!(code, 0, "{err}");
    let after = all_ready(admin, 2).await;
    assert!(after.iter().all(|p| !pids.contains(p)));
    let mut c = HttpClient::connect(d.addr()).await.unwrap();
    assert_eq!(c.request("GET", "/", &[], None).await.unwrap().status, 200);
}

#[tokio::test]
async fn a_crash_looping_app_is_reported_while_the_other_keeps_serving() {
    let dir = temp_dir("reload-crashloop");
    let bad = "[[app]]\nname = \"bad\"\ncommand = [\"sh\", \"-c\", \"echo boom >&2; exit 3\"]\n";
    let (d, admin, _) = up_with("crashloop", &web_config(&worker_script(&dir), "", bad, "")).await;
    let mut looping = false;
    for _ in 0..200 {
        let s = status(admin).await;
        let bad = s.apps.iter().find(|a| a.name == "bad").unwrap();
        if bad.workers[0].state == "crash-looping" {
            assert!(bad.workers[0].crash_streak >= 5);
            assert_eq!(bad.workers[0].last_exit.as_deref(), Some("exit status: 3"));
            looping = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(looping, "{}", d.stderr_text());
    // Its next start is said as it comes: no worker of "bad" serves, so one starts each
    // second, whatever the back-off says (before: "next start in 30s", never true).
    let says_sooner = drover_testkit::wait_until(Duration::from_secs(15), || {
        d.stderr_text().lines().any(|l| {
            l.contains("is crash-looping") && l.contains("sooner while no worker of the app serves")
        })
    })
    .await;
    assert!(says_sooner, "{}", d.stderr_text());
    assert!(d.stderr_text().contains("[bad/0] boom"));
    let mut c = HttpClient::connect(d.addr()).await.unwrap();
    assert_eq!(c.request("GET", "/", &[], None).await.unwrap().status, 200);

    // With two apps, scale must be told which; more of a crash-looping command is
    // refused and leaves it as it was.
    let (code, _, err) = ctl(admin, &["scale", "2"]).await;
    assert_eq!(code, 2);
    assert!(
        err.contains("several apps run (web, bad): name one"),
        "{err}"
    );
    let (code, _, err) = ctl(admin, &["scale", "2", "--app", "bad"]).await;
    assert_eq!(code, 2);
    assert!(
        err.contains("500") && err.contains("worker 1 is crash-looping"),
        "{err}"
    );
    assert!(err.contains("the app keeps 1"), "{err}");
    let s = status(admin).await;
    assert_eq!(
        s.apps
            .iter()
            .find(|a| a.name == "bad")
            .unwrap()
            .workers
            .len(),
        1
    );
}

#[tokio::test]
async fn a_hung_worker_is_taken_out_and_restarted() {
    let dir = temp_dir("reload-hung");
    let app = format!(
        "workers = 2\nenv = {{ HANG_FLAG = \"{}\", HANG_AFTER = \"2\" }}\nhealth = {{ path = \"/health\", interval = \"100ms\", timeout = \"200ms\", fall = 2 }}\n",
        dir.join("hung-once").display()
    );
    let (d, admin, _) = up_with("hung", &web_config(&worker_script(&dir), "", &app, "")).await;
    let mut restarted = false;
    for _ in 0..200 {
        let s = status(admin).await;
        let ws = &s.apps[0].workers;
        if ws.iter().any(|w| w.restarts >= 1) && ws.iter().all(|w| w.state == "ready") {
            restarted = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(restarted, "{}", d.stderr_text());
    assert!(d.stderr_text().contains("unhealthy"), "{}", d.stderr_text());
    // Both workers serve again.
    let mut c = HttpClient::connect(d.addr()).await.unwrap();
    for _ in 0..10 {
        assert_eq!(c.request("GET", "/", &[], None).await.unwrap().status, 200);
    }
}

/// Every worker of the Python test worker uses more than 1 MiB, so each is replaced in
/// turn, the way a rolling reload replaces it: the new one serves before the old one
/// leaves, the old one finishes what it holds and gets SIGTERM, and its restart record
/// says memory. No request fails meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_memory_replaces_a_worker_gracefully() {
    let (d, admin) = run_python("memory", "1", &["-t", "1", "--max-memory", "1M"]).await;
    all_ready(admin, 1).await;
    let stop = Arc::new(AtomicBool::new(false));
    let load = steady_load(d.addr(), 2, "/", stop.clone());

    // A worker seen serving under the load is replaced for its memory (so it left the
    // pool while the load ran), and its replacement serves.
    let mut serving_under_load = BTreeSet::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let record = loop {
        let s = status(admin).await;
        let w = &s.apps[0].workers[0];
        if matches!(w.state.as_str(), "ready" | "busy") {
            serving_under_load.extend(w.pid);
        }
        let found = common::restart_records(&s).into_iter().find(|r| {
            r.reason == "memory"
                && r.pid.is_some_and(|p| serving_under_load.contains(&p))
                && w.state == "ready"
                && w.pid.is_some_and(|p| Some(p) != r.pid)
        });
        if let Some(r) = found {
            break r;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no worker replaced for its memory under load in 30 s (seen serving: \
             {serving_under_load:?}): {s:#?}\n{}",
            d.stderr_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        record
            .detail
            .as_deref()
            .is_some_and(|d| d.contains("over max_memory 1 MiB")),
        "{record:#?}"
    );
    assert!(record.rss_bytes.is_some_and(|b| b > 1 << 20), "{record:#?}");
    // Stopped by drover's SIGTERM, not the SIGKILL that follows a stop timeout.
    assert_eq!(
        record.signal_name.as_deref(),
        Some("SIGTERM"),
        "{record:#?}"
    );
    assert_eq!(status(admin).await.apps[0].workers[0].crash_streak, 0);
    assert!(
        d.stderr_text().contains("over max_memory"),
        "{}",
        d.stderr_text()
    );
    let ok = assert_load_never_failed(
        &stop,
        load,
        20,
        "while a worker was replaced for its memory",
    )
    .await;
    eprintln!(
        "pid {:?} replaced ({:?}, {:?}) under a load that got {ok} answers",
        record.pid, record.detail, record.signal_name
    );
}

/// Workers of one app leak alike, so they cross `max_memory` in the same second. Each
/// is replaced as above, one at a time while it is under 1.5 × the limit (past that it
/// goes at once: see `at_once_past_the_overshoot` below). Every worker here holds about
/// 60 MiB against a 50 MiB limit and takes a second to start, so replacements follow
/// one another for as long as the test looks: drover's live children never number more
/// than the workers and one. Before, all were replaced at once (6 children).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_over_max_memory_together_are_replaced_one_at_a_time() {
    let most = most_children_while_replaced("memory-turns", "40").await;
    assert!(
        most <= 4,
        "{most} at once, over 3 workers and 1 replacement"
    );
}

/// As above, but worker 1 holds about 140 MiB, past 1.5 × the 50 MiB limit: it does
/// not wait for its turn, since a worker that waits goes on growing. Its replacement
/// runs beside the turn of the others (5 children at once), and the others still take
/// turns (never 6).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_once_past_the_overshoot() {
    let most = most_children_while_replaced("memory-overshoot", "40,120,40").await;
    assert_eq!(
        most, 5,
        "a worker past the overshoot waited, or the others did not"
    );
}

/// `drover up` of 3 Python workers that hold `hold_mib` (per worker id) and start in a
/// second, `max_memory = "50M"`; watches drover's live children until each worker was
/// replaced for its memory twice (30 s at most: a worker whose successor is over at once
/// must not keep the others waiting) and returns the most seen at once.
async fn most_children_while_replaced(tag: &str, hold_mib: &str) -> usize {
    let script = worker_script(&temp_dir(&format!("{tag}-script")));
    let app = format!(
        "workers = 3\nmax_memory = \"50M\"\nenv = {{ HOLD_MIB = \"{hold_mib}\", START_DELAY = \"1\" }}\n"
    );
    let (d, admin, _) = up_with(tag, &web_config(&script, "", &app, "")).await;
    all_ready(admin, 3).await;
    let replaced_twice = |s: &drover_admin::Status| {
        (0..3).all(|id| {
            common::restart_records(s)
                .iter()
                .filter(|r| r.reason == "memory" && r.worker == id)
                .count()
                >= 2
        })
    };
    let mut most = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !replaced_twice(&status(admin).await) && std::time::Instant::now() < deadline {
        for _ in 0..20 {
            most = most.max(live_children(d.pid()));
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    let s = status(admin).await;
    assert!(
        replaced_twice(&s),
        "not every worker was replaced twice: {:#?}\n{}",
        common::restart_records(&s),
        d.stderr_text()
    );
    most
}

/// How many processes have `pid` as their parent, zombies left out.
fn live_children(pid: u32) -> usize {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|child| {
            let stat = std::fs::read_to_string(format!("/proc/{child}/stat")).unwrap_or_default();
            // pid (comm) state ppid ...: the comm may hold spaces, so read after its ')'.
            let mut rest = stat.rsplit_once(')').map_or("", |r| r.1).split_whitespace();
            let state = rest.next();
            let ppid = rest.next().and_then(|p| p.parse::<u32>().ok());
            state != Some("Z") && ppid == Some(pid)
        })
        .count()
}

#[tokio::test]
async fn workers_die_with_drover_even_on_sigkill() {
    let (d, admin) = run_python("sigkill", "2", &["-t", "1"]).await;
    let pids = all_ready(admin, 2).await;
    // Only drover itself: its workers are left to the kernel's parent-death signal.
    d.kill();
    d.wait_exit(Duration::from_secs(5))
        .await
        .expect("drover survived SIGKILL");
    let gone = |pid: &u32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| s.contains(") Z "))
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !pids.iter().all(gone) && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        pids.iter().all(gone),
        "workers {pids:?} outlived a SIGKILLed drover"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_up_and_down_under_load_fails_no_request() {
    let (d, admin) = run_python("scale", "1", &["-t", "1"]).await;
    let first = all_ready(admin, 1).await;
    let stop = Arc::new(AtomicBool::new(false));
    let served = Arc::new(AtomicUsize::new(0));
    let load = counted_load(d.addr(), 4, "/", stop.clone(), served.clone());
    assert_served_more(&d, &served, 20, "before scaling up").await;

    let (code, out, err) = ctl(admin, &["scale", "3"]).await;
    assert_eq!(code, 0, "{err}\n{}", d.stderr_text());
    assert_eq!(out.trim(), "app \"app\": 1 -> 3 workers");
    let three = all_ready(admin, 3).await;
    assert_eq!(three[0], first[0], "scaling up replaced a worker");
    let s = status(admin).await;
    let ports: BTreeSet<String> = s.apps[0]
        .workers
        .iter()
        .map(|w| format!("127.0.0.1:{}", w.port.unwrap()))
        .collect();
    let endpoints: BTreeSet<String> = s.balancers[0]
        .endpoints
        .iter()
        .map(|e| e.addr.clone())
        .collect();
    assert_eq!(endpoints, ports, "every worker, and only they, in the pool");
    assert_served_more(&d, &served, 20, "on three workers").await;

    // Down again: the highest ids go, after finishing what they hold. Requests bound to
    // them must be answered by them: a GET cut off would be sent again to worker 0,
    // which the load could not tell from a drain, but drover's retry count can. (The
    // load keeps every worker busy; slow requests add some that last 200 ms.)
    let slow = slow_requests(d.addr(), 6);
    let mut bound_to_retiring = false;
    for _ in 0..100 {
        let s = status(admin).await;
        if s.apps[0].workers[1..]
            .iter()
            .any(|w| w.in_flight.unwrap_or(0) > 0)
        {
            bound_to_retiring = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(bound_to_retiring, "no request reached workers 1 or 2");
    let (code, out, err) = ctl(admin, &["scale", "1", "--app", "app"]).await;
    assert_eq!(code, 0, "{err}\n{}", d.stderr_text());
    assert_eq!(out.trim(), "app \"app\": 3 -> 1 workers");
    for s in slow {
        s.await.unwrap();
    }
    let metrics = metrics_text(admin).await;
    let retried: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("drover_retries_total{"))
        .collect();
    assert!(
        retried.is_empty(),
        "requests on retiring workers were sent again: {retried:?}"
    );
    assert_eq!(all_ready(admin, 1).await, first);
    assert_eq!(status(admin).await.balancers[0].endpoints.len(), 1);
    assert_served_more(&d, &served, 20, "after scaling down").await;

    assert_load_never_failed(&stop, load, 101, "while scaling").await;
    assert_gone(&three[1..], "retired");

    // Bad counts and names change nothing, and say what is wrong.
    for (args, says) in [
        (&["scale", "0"][..], "workers must be in 1..=1024, not 0"),
        (&["scale", "5000"], "workers must be in 1..=1024, not 5000"),
        (&["scale", "two"], "\"two\" is not a number of workers"),
        (&["scale", "-1"], "unexpected argument '-1'"),
        (
            &["scale", "2", "--app", "ghost"],
            "no app named \"ghost\" (apps: app)",
        ),
    ] {
        let (code, _, err) = ctl(admin, args).await;
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
    assert_eq!(all_ready(admin, 1).await, first);
    stops_cleanly(d).await;
}

/// Two reloads asked at once (two deploys): the second says it follows the first, and
/// both succeed. Before, the second waited with nothing in the log (Node seat #4).
#[tokio::test]
async fn a_reload_asked_during_another_says_it_follows() {
    let dir = common::temp_dir("reload-twice");
    let app = dir.join("slow.js");
    // Each new worker listens 2 s after it starts: a reload takes that long.
    std::fs::write(
        &app,
        "setTimeout(() => require('http').createServer((q, s) => s.end('ok')).listen(process.env.PORT), 2000);\n",
    )
    .unwrap();
    let args = common::run_args(1, &[], &["node", &app.display().to_string()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let d = DroverProcess::spawn(common::bin(), &args).await;
    let admin = common::admin_addr(&d).await;
    common::wait_all_serving_within(&d, admin, Duration::from_secs(20)).await;
    let first = tokio::spawn(async move { common::ctl(admin, &["reload"]).await });
    d.wait_for_line("reload asked", Duration::from_secs(10))
        .await
        .unwrap_or_else(|| panic!("no reload:\n{}", d.stderr_text()));
    let (code, out, err) = common::ctl(admin, &["reload"]).await;
    assert_eq!(code, 0, "{out}{err}\n{}", d.stderr_text());
    let (code, out, err) = first.await.unwrap();
    assert_eq!(code, 0, "{out}{err}\n{}", d.stderr_text());
    assert!(
        d.stderr_text()
            .contains("a reload is under way; this one follows once it is done"),
        "{}",
        d.stderr_text()
    );
}
