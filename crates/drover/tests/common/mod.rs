//! Shared set-up for tests that drive the real `drover` binary.
#![allow(dead_code)]

pub mod browser;
pub mod examples;
pub mod pki;

use drover_testkit::{DroverProcess, HttpClient};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

pub fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_drover"))
}

/// `drover proxy` on 127.0.0.1:0 over `backends`, one thread, plus `extra` flags.
pub async fn proxy(backends: &[SocketAddr], extra: &[&str]) -> DroverProcess {
    let args = proxy_args(backends, extra);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    DroverProcess::spawn(bin(), &args).await
}

/// The arguments of `proxy`.
fn proxy_args(backends: &[SocketAddr], extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = vec![
        "proxy".into(),
        "--listen".into(),
        "127.0.0.1:0".into(),
        "--threads".into(),
        "1".into(),
    ];
    for b in backends {
        args.push("--backend".into());
        args.push(b.to_string());
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

#[allow(unused_imports)] // each test file uses its own share
pub use drover_testkit::{addrs, backends};

/// A Node server started by `cmd` (killed on drop) that prints `listening PORT` first,
/// and its address on 127.0.0.1.
pub async fn node_listening(
    mut cmd: tokio::process::Command,
) -> (tokio::process::Child, SocketAddr) {
    use tokio::io::AsyncBufReadExt;
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("node");
    let stdout = child.stdout.take().unwrap();
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let line = tokio::time::timeout(std::time::Duration::from_secs(20), lines.next_line())
        .await
        .expect("the server printed no port in time")
        .unwrap()
        .unwrap_or_default();
    let port: u16 = line
        .strip_prefix("listening ")
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"));
    (child, SocketAddr::from(([127, 0, 0, 1], port)))
}

/// A fresh scratch directory for one test, unique per test process.
pub fn temp_dir(tag: &str) -> PathBuf {
    // Under target/ (cargo's per-build scratch dir), so runs leave nothing in /tmp.
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("drover-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The bundled Node pi server, as an absolute path.
pub fn pi_server() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/pi-server.js")
        .canonicalize()
        .unwrap()
        .display()
        .to_string()
}

/// Writes a Node server for an `[[app]]`'s workers into `dir`; its path. It answers
/// `worker PORT` (its own port: tests tell the workers apart, and from other backends,
/// by it), `GET /health` with a 503 that it counts, and `GET /probes` with that count: a
/// worker a balancer's health check probed would go down, and say so.
pub fn port_worker(dir: &Path) -> PathBuf {
    let path = dir.join("port_worker.js");
    std::fs::write(
        &path,
        r#"let probes = 0;
require("http")
  .createServer((req, res) => {
    if (req.url === "/health") {
      probes += 1;
      res.statusCode = 503;
      return res.end("not for a balancer to check");
    }
    res.end(req.url === "/probes" ? String(probes) : `worker ${process.env.PORT}`);
  })
  .listen(Number(process.env.PORT), "127.0.0.1");
"#,
    )
    .unwrap();
    path
}

/// A drover.toml with an admin API, app "web" (two workers of the `port_worker` at
/// `worker`) and balancer "front" (round-robin, no slow start) over `backends`, the items
/// of a TOML list such as `"app:web", "127.0.0.1:9001"`; `extra` follows the balancer's
/// keys (more of them, or more tables).
pub fn app_config(worker: &Path, backends: &str, extra: &str) -> String {
    format!(
        "[admin]\nlisten = \"127.0.0.1:0\"\n\n[[app]]\nname = \"web\"\ncommand = [\"node\", \"{}\"]\nworkers = 2\n\n[[balancer]]\nname = \"front\"\nlisten = \"127.0.0.1:0\"\nthreads = 1\nstrategy = \"round-robin\"\nslow_start = \"0s\"\nbackends = [{backends}]\n{extra}",
        worker.display()
    )
}

/// A drover.toml of app "web": `workers` Node workers of the liveness fixture
/// (`tests/fixtures/liveness/server.js`: endless loops, crashes, slow answers) with quick
/// health checks (every 300 ms, 300 ms to answer, 2 failures in a row, so a hang is found
/// in about a second), `app_extra` added to its table, behind one balancer.
pub fn liveness_config(workers: usize, app_extra: &str) -> String {
    let server = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/liveness/server.js");
    format!(
        "[admin]\nlisten = \"127.0.0.1:0\"\n\
         [[app]]\nname = \"web\"\ncommand = [\"node\", \"{}\"]\nworkers = {workers}\n{app_extra}\
         health = {{ path = \"/health\", interval = \"300ms\", timeout = \"300ms\", fall = 2 }}\n\
         [[balancer]]\nlisten = \"127.0.0.1:0\"\nthreads = 1\nbackends = [\"app:web\"]\n",
        server.display()
    )
}

/// `drover up` of `toml`, written to `drover.toml` in a fresh directory for `tag`, once
/// every worker of its first app serves: drover, its admin address and the file (for
/// reload tests to rewrite).
pub async fn up_serving(tag: &str, toml: &str) -> (DroverProcess, SocketAddr, PathBuf) {
    let file = temp_dir(tag).join("drover.toml");
    std::fs::write(&file, toml).unwrap();
    let d = DroverProcess::spawn(bin(), &["up", "-c", file.to_str().unwrap()]).await;
    let admin = admin_addr(&d).await;
    wait_all_serving(&d, admin).await;
    (d, admin, file)
}

/// What the first app's workers answer (`worker PORT`, see `port_worker`), as
/// `answering` names them.
pub async fn worker_names(admin: SocketAddr) -> std::collections::BTreeSet<String> {
    status(admin).await.apps[0]
        .workers
        .iter()
        .map(|w| format!("worker {}", w.port.expect("a worker's port")))
        .collect()
}

/// `drover ctl members list --json` of the only balancer, parsed.
pub async fn members_list(admin: SocketAddr) -> drover_admin::MemberList {
    let (code, out, err) = ctl(admin, &["members", "list", "--json"]).await;
    assert_eq!(code, 0, "{err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// Keeps `conns` keep-alive clients busy with GETs until `stop`; returns how many
/// succeeded and every failure.
pub fn steady_load(
    addr: SocketAddr,
    conns: usize,
    path: &'static str,
    stop: Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<(usize, Vec<String>)>> {
    counted_load(addr, conns, path, stop, Arc::default())
}

/// `steady_load` that also adds each success to `served` as it comes, so a test can tell
/// what was served after some event while the load still runs.
pub fn counted_load(
    addr: SocketAddr,
    conns: usize,
    path: &'static str,
    stop: Arc<AtomicBool>,
    served: Arc<AtomicUsize>,
) -> Vec<tokio::task::JoinHandle<(usize, Vec<String>)>> {
    (0..conns)
        .map(|_| {
            let stop = stop.clone();
            let served = served.clone();
            tokio::spawn(async move {
                let mut c = HttpClient::connect(addr).await.unwrap();
                let (mut ok, mut failed) = (0, Vec::new());
                while !stop.load(Ordering::Relaxed) {
                    match c.request("GET", path, &[], None).await {
                        Ok(r) if r.status == 200 => {
                            ok += 1;
                            served.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(r) => {
                            failed.push(format!("{} {:?}", r.status, r.header("drover-error")))
                        }
                        Err(e) => {
                            failed.push(e.to_string());
                            c = HttpClient::connect(addr).await.unwrap();
                        }
                    }
                }
                (ok, failed)
            })
        })
        .collect()
}

/// Keeps `clients` clients busy with GETs of `path` until `stop`, each request on a new
/// connection that carries only it (so drover places every one, and hands none to a
/// worker); returns how many succeeded and every failure.
pub fn new_connection_load(
    addr: SocketAddr,
    clients: usize,
    path: &'static str,
    stop: Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<(usize, Vec<String>)>> {
    (0..clients)
        .map(|_| {
            let stop = stop.clone();
            tokio::spawn(async move {
                let (mut ok, mut failed) = (0, Vec::new());
                while !stop.load(Ordering::Relaxed) {
                    let answer = match HttpClient::connect(addr).await {
                        Ok(mut c) => c.request("GET", path, &[], None).await,
                        Err(e) => Err(e),
                    };
                    match answer {
                        Ok(r) if r.status == 200 => ok += 1,
                        Ok(r) => {
                            failed.push(format!("{} {:?}", r.status, r.header("drover-error")))
                        }
                        Err(e) => failed.push(e.to_string()),
                    }
                }
                (ok, failed)
            })
        })
        .collect()
}

/// Waits (up to 10 s) until a `counted_load` has had `more` answers beyond those in
/// `served` now: the load flows through whatever serves at this point. Panics naming
/// `what` otherwise.
pub async fn assert_served_more(d: &DroverProcess, served: &AtomicUsize, more: usize, what: &str) {
    let from = served.load(Ordering::Relaxed);
    assert!(
        drover_testkit::wait_until(std::time::Duration::from_secs(10), || {
            served.load(Ordering::Relaxed) >= from + more
        })
        .await,
        "the load got {} of {more} more answers {what}\n{}",
        served.load(Ordering::Relaxed) - from,
        d.stderr_text()
    );
}

/// Stops `steady_load`, then asserts that it sent at least `min_ok` requests and that
/// none failed; `during` names what happened meanwhile, for the message. Answers how
/// many were served.
pub async fn assert_load_never_failed(
    stop: &AtomicBool,
    load: Vec<tokio::task::JoinHandle<(usize, Vec<String>)>>,
    min_ok: usize,
    during: &str,
) -> usize {
    stop.store(true, Ordering::Relaxed);
    let (mut ok, mut failed) = (0, Vec::new());
    for l in load {
        let (o, f) = l.await.unwrap();
        ok += o;
        failed.extend(f);
    }
    assert!(ok >= min_ok, "too little load to mean anything: {ok}");
    assert!(
        failed.is_empty(),
        "{} of {} requests failed {during}: {:?}",
        failed.len(),
        ok + failed.len(),
        &failed[..failed.len().min(5)]
    );
    ok
}

/// Which backends answer `n` requests, each on a new connection.
pub async fn answering(addr: SocketAddr, n: usize) -> std::collections::BTreeSet<String> {
    let mut names = std::collections::BTreeSet::new();
    for _ in 0..n {
        let mut c = HttpClient::connect(addr).await.unwrap();
        let r = c.get("/").await;
        assert_eq!(r.status, 200, "{:?}", r.header("drover-error"));
        names.insert(r.text());
    }
    names
}

/// A set of backend names, to compare `answering` with.
pub fn names(list: &[&str]) -> std::collections::BTreeSet<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// `drover ctl ARGS` against `admin`: exit code, stdout, stderr.
pub async fn ctl(admin: SocketAddr, args: &[&str]) -> (i32, String, String) {
    let out = tokio::process::Command::new(bin())
        .arg("ctl")
        .arg("--admin")
        .arg(admin.to_string())
        .args(args)
        .output()
        .await
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `drover ctl status --json`, parsed.
pub async fn status(admin: SocketAddr) -> drover_admin::Status {
    let (code, out, err) = ctl(admin, &["status", "--json"]).await;
    assert_eq!(code, 0, "{err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// The admin address a drover prints at start-up. It may come after the line
/// `DroverProcess::spawn` waited for (shared mode prints the app's socket first), so
/// wait for it.
pub async fn admin_addr(d: &DroverProcess) -> SocketAddr {
    let marker = "admin API listening on ";
    d.wait_for_line(marker, std::time::Duration::from_secs(10))
        .await;
    *d.addrs_after(marker)
        .first()
        .unwrap_or_else(|| panic!("no admin line\n{}", d.stderr_text()))
}

/// `drover proxy` on 127.0.0.1:0, one thread, with an admin API on 127.0.0.1:0, plus
/// `extra` flags; and the admin API's address.
pub async fn proxy_with_admin(extra: &[&str]) -> (DroverProcess, SocketAddr) {
    let mut args = vec![
        "proxy",
        "--listen",
        "127.0.0.1:0",
        "--threads",
        "1",
        "--admin",
        "127.0.0.1:0",
    ];
    args.extend_from_slice(extra);
    let d = DroverProcess::spawn(bin(), &args).await;
    let admin = admin_addr(&d).await;
    (d, admin)
}

/// SIGTERM drains and exits 0.
pub async fn stops_cleanly(d: DroverProcess) {
    d.signal("TERM").unwrap();
    assert!(d
        .wait_exit(std::time::Duration::from_secs(15))
        .await
        .unwrap()
        .success());
}

/// `drover proxy` as `proxy` starts it, but allowed only `nofile` open descriptors
/// (RLIMIT_NOFILE, set by the shell before it execs drover): for drover's own shortages.
pub async fn proxy_with_nofile(
    nofile: u32,
    backends: &[SocketAddr],
    extra: &[&str],
) -> DroverProcess {
    let script = format!("ulimit -n {nofile} && exec \"$0\" \"$@\"");
    let mut args: Vec<String> = vec!["-c".into(), script, bin().display().to_string()];
    args.extend(proxy_args(backends, extra));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    DroverProcess::spawn(Path::new("/bin/sh"), &args).await
}

/// Lowers a running drover's descriptor limit (soft and hard) to `nofile` with
/// `prlimit --pid`. drover sizes its client budget from the limit it starts under, so
/// this is how a test runs it short of descriptors all the same (as descriptors held
/// elsewhere in the process would).
pub fn lower_nofile(d: &DroverProcess, nofile: u32) {
    let status = std::process::Command::new("prlimit")
        .arg("--pid")
        .arg(d.pid().to_string())
        .arg(format!("--nofile={nofile}:{nofile}"))
        .status()
        .expect("run prlimit (util-linux)");
    assert!(status.success(), "prlimit --pid {} failed", d.pid());
}

/// Every restart record of every app in `s`.
pub fn restart_records(s: &drover_admin::Status) -> Vec<drover_admin::RestartRow> {
    s.apps.iter().flat_map(|a| a.restarts.clone()).collect()
}

/// GETs `path` on `c` and asserts it was answered 200 with `body`; the failure shows
/// drover's log.
pub async fn get_answered(c: &mut HttpClient, path: &str, body: &str, d: &DroverProcess) {
    let r = c.get(path).await;
    assert_eq!(
        (r.status, r.text().as_str()),
        (200, body),
        "GET {path}\n{}",
        d.stderr_text()
    );
}

/// Asserts that no worker of `admin`'s drover was restarted; `why` says what the test
/// expected instead, and the failure shows the records and drover's log.
pub async fn assert_no_restarts(admin: SocketAddr, why: &str, d: &DroverProcess) {
    let records = restart_records(&status(admin).await);
    assert!(
        records.is_empty(),
        "{why}: {records:?}\n{}",
        d.stderr_text()
    );
}

/// The pids of the first app's workers by worker id, `None` for one not serving (ready
/// or busy).
pub fn serving_pids(s: &drover_admin::Status) -> Vec<Option<u32>> {
    s.apps[0]
        .workers
        .iter()
        .map(|w| {
            matches!(w.state.as_str(), "ready" | "busy")
                .then_some(w.pid)
                .flatten()
        })
        .collect()
}

/// Waits until every worker of the first app serves; their pids.
pub async fn wait_all_serving(d: &DroverProcess, admin: SocketAddr) -> Vec<Option<u32>> {
    wait_all_serving_within(d, admin, std::time::Duration::from_secs(20)).await
}

/// [`wait_all_serving`], waiting up to `limit`: for apps built or compiled before they
/// listen (tens of seconds on a loaded machine).
pub async fn wait_all_serving_within(
    d: &DroverProcess,
    admin: SocketAddr,
    limit: std::time::Duration,
) -> Vec<Option<u32>> {
    let ready = drover_testkit::wait_until_async(limit, || async {
        serving_pids(&status(admin).await)
            .iter()
            .all(Option::is_some)
    })
    .await;
    assert!(ready, "{}", d.stderr_text());
    serving_pids(&status(admin).await)
}

/// Where `scripts/debian-node18` puts the wrapper that runs Debian's Node.js 18, unless
/// `DROVER_TEST_NODE18` names it (`scripts/test` sets it to what the script printed):
/// `$XDG_CACHE_HOME/drover/debian-node18/bin/node`, or `~/.cache/...` without it.
pub fn debian_node18_path() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("DROVER_TEST_NODE18") {
        return Some(PathBuf::from(path));
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(cache.join("drover/debian-node18/bin/node"))
}

/// `node --version` of `program` ("v18.20.4"), `None` when it does not run.
pub fn node_version(program: &Path) -> Option<String> {
    let out = std::process::Command::new(program)
        .arg("--version")
        .output()
        .ok()?;
    let version = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (out.status.success() && version.starts_with('v')).then_some(version)
}

/// The Node.js programs the Node integration is tested on (issue 21: "at least Debian's
/// `nodejs` and the machine's own Node"), each as (a name for messages, its path):
/// ("system node v20", the `node` on PATH) and ("debian node v18", the wrapper
/// `scripts/debian-node18` makes, see [`debian_node18_path`]). Run a test's Node part
/// once per entry.
///
/// One that is missing fails the test under CI (`CI` set; `scripts/test` installs both)
/// and is left out elsewhere, with a note on stderr.
pub fn node_binaries() -> Vec<(String, PathBuf)> {
    let mut found = Vec::new();
    let system = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join("node"))
            .find(|p| p.is_file())
    });
    match system.as_deref().and_then(|p| Some((p, node_version(p)?))) {
        Some((path, version)) => {
            let major = version.split('.').next().unwrap_or(&version);
            found.push((format!("system node {major}"), path.to_path_buf()));
        }
        None => missing_node("`node` is not on PATH or does not run (apt-get install nodejs)"),
    }
    let debian = debian_node18_path();
    match debian.as_deref().and_then(|p| Some((p, node_version(p)?))) {
        Some((path, version)) if version.starts_with("v18.") => {
            found.push(("debian node v18".to_string(), path.to_path_buf()));
        }
        Some((path, version)) => missing_node(&format!(
            "{} runs node {version}, not Debian's 18; run scripts/debian-node18",
            path.display()
        )),
        None => missing_node(&format!(
            "Debian's node 18 is not at {}; run scripts/debian-node18 (scripts/test does)",
            debian.map_or("$HOME/.cache/drover/debian-node18/bin/node".into(), |p| p
                .display()
                .to_string())
        )),
    }
    found
}

/// A Node.js that `node_binaries` should have found: fails under CI, a note elsewhere.
fn missing_node(why: &str) {
    assert!(std::env::var_os("CI").is_none(), "{why}");
    eprintln!("skipping a Node.js: {why}");
}

/// Whether a test must skip for want of a tool (`present` false): under CI (env `CI`
/// set) that fails, naming `what` is missing; elsewhere it says so and skips.
pub fn tool_missing(present: bool, what: &str) -> bool {
    if present {
        return false;
    }
    assert!(std::env::var_os("CI").is_none(), "{what} is missing");
    eprintln!("skipped: {what} is missing");
    true
}

/// The text of /metrics at `admin`.
pub async fn metrics_text(admin: SocketAddr) -> String {
    HttpClient::connect(admin)
        .await
        .unwrap()
        .get("/metrics")
        .await
        .text()
}

/// A counter or gauge of the balancer named `default`, from /metrics of `admin`.
pub async fn default_metric(admin: SocketAddr, name: &str) -> u64 {
    let metrics = metrics_text(admin).await;
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name}{{balancer=\"default\"}} ")))
        .unwrap_or_else(|| panic!("no {name} in\n{metrics}"))
        .parse()
        .unwrap()
}

/// HAProxy with the config `cfg` (after its `defaults`, which say `mode http`: a
/// section of `cfg` may say `mode tcp`), once every address of `up`
/// takes connections; the caller keeps the child (dropped, it is killed). `None` outside
/// CI when HAProxy is missing.
pub async fn start_haproxy(
    tag: &str,
    cfg: &str,
    up: &[SocketAddr],
) -> Option<tokio::process::Child> {
    let haproxy = ["/usr/sbin/haproxy", "/usr/bin/haproxy"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists());
    let Some(haproxy) = haproxy else {
        assert!(
            std::env::var_os("CI").is_none(),
            "haproxy is missing (scripts/test installs it)"
        );
        eprintln!("skipped: haproxy is missing (apt-get install haproxy)");
        return None;
    };
    let path = temp_dir(tag).join("haproxy.cfg");
    std::fs::write(
        &path,
        format!("defaults\n  mode http\n  timeout connect 5s\n  timeout client 30s\n  timeout server 30s\n{cfg}"),
    )
    .unwrap();
    let mut cmd = tokio::process::Command::new(haproxy);
    cmd.arg("-db").arg("-f").arg(&path).kill_on_drop(true);
    let child = cmd.spawn().expect("start haproxy");
    let listening =
        drover_testkit::wait_until_async(std::time::Duration::from_secs(10), || async {
            for addr in up {
                if tokio::net::TcpStream::connect(addr).await.is_err() {
                    return false;
                }
            }
            true
        })
        .await;
    assert!(listening, "haproxy did not start");
    Some(child)
}

/// `drover proxy --config` of `toml`, written to `dir`/drover.toml: drover, the address
/// balancer `listener` listens on, the admin API's address, and the file.
pub async fn proxy_config(
    dir: &Path,
    toml: &str,
    listener: &str,
) -> (DroverProcess, SocketAddr, SocketAddr, PathBuf) {
    let path = dir.join("drover.toml");
    std::fs::write(&path, toml).unwrap();
    let d = DroverProcess::spawn(bin(), &["proxy", "--config", path.to_str().unwrap()]).await;
    let admin = admin_addr(&d).await;
    let addr = *d
        .addrs_after(&format!("balancer \"{listener}\" listening on "))
        .first()
        .unwrap_or_else(|| panic!("no listen line\n{}", d.stderr_text()));
    (d, addr, admin, path)
}

/// A process is gone once /proc has no entry for it or it is a zombie (dead, waiting
/// for a parent to reap it; in a container the reaper may be a shell that never does).
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name, which is in parentheses and may hold
        // spaces: read it after the last ')'.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_none_or(|(_, rest)| !rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// The etcd source's row of the first balancer's status: (ok, members, detail).
pub async fn etcd_source(admin: SocketAddr) -> (bool, usize, String) {
    let s = status(admin).await;
    let row = s.balancers[0]
        .sources
        .iter()
        .find(|r| r.kind == "etcd")
        .expect("an etcd source")
        .clone();
    (row.ok, row.members, row.detail)
}

/// The body of a GET / through `d`, when it answers 200.
pub async fn body_through(d: &DroverProcess) -> Option<String> {
    let mut c = HttpClient::connect(d.addr()).await.ok()?;
    let r = c.request("GET", "/", &[], None).await.ok()?;
    (r.status == 200).then(|| r.text())
}

/// Waits (10 s at most) until a GET / through `d` answers with `body` in it: the member
/// registered elsewhere is served here. Fails showing the etcd source's row.
pub async fn serves_within_10s(d: &DroverProcess, admin: SocketAddr, body: &str) {
    let served = drover_testkit::wait_until_async(std::time::Duration::from_secs(10), || async {
        body_through(d).await.is_some_and(|got| got.contains(body))
    })
    .await;
    assert!(
        served,
        "the member registered at another balancer is not served: {:?}\n{}",
        etcd_source(admin).await,
        d.stderr_text()
    );
}

/// An etcd named `name` (its data in `dir`) on free loopback ports, its clients served
/// over `scheme` ("http" or "https", whose files the caller adds): the command to start
/// it, and its client URL.
pub fn etcd_command(name: &str, dir: &Path, scheme: &str) -> (std::process::Command, String) {
    let (client_port, peer_port) = (drover_testkit::free_port(), drover_testkit::free_port());
    let client = format!("{scheme}://127.0.0.1:{client_port}");
    let peer = format!("http://127.0.0.1:{peer_port}");
    let mut cmd = std::process::Command::new("etcd");
    cmd.args(["--name", name])
        .arg("--data-dir")
        .arg(dir.join("etcd-data"))
        .args(["--listen-client-urls", &client])
        .args(["--advertise-client-urls", &client])
        .args(["--listen-peer-urls", &peer])
        .args(["--initial-advertise-peer-urls", &peer])
        .args(["--initial-cluster", &format!("{name}={peer}")]);
    (cmd, client)
}

/// `METHOD path` on the admin API with no token (an orchestrator's probe): the status
/// and the body.
pub async fn probe(admin: std::net::SocketAddr, method: &str, path: &str) -> (u16, String) {
    let request = format!("{method} {path} HTTP/1.1\r\nHost: probe\r\nConnection: close\r\n\r\n");
    let answer = drover_testkit::raw_exchange_timeout(
        admin,
        request.as_bytes(),
        std::time::Duration::from_secs(5),
    )
    .await
    .unwrap();
    let status = drover_testkit::parse_status(&answer).unwrap_or(0);
    let text = String::from_utf8_lossy(&answer).into_owned();
    let body = text
        .split("\r\n\r\n")
        .nth(1)
        .unwrap_or_default()
        .to_string();
    (status, body)
}

/// `n` GETs of `path` at once, each on a connection of its own that waits up to `wait`
/// for its answer: their statuses, spawned.
pub fn gets_at_once(
    addr: SocketAddr,
    n: usize,
    path: &'static str,
    wait: std::time::Duration,
) -> Vec<tokio::task::JoinHandle<u16>> {
    (0..n)
        .map(|_| {
            tokio::spawn(async move {
                let mut c = HttpClient::connect(addr).await.unwrap();
                c.set_timeout(wait);
                c.get(path).await.status
            })
        })
        .collect()
}

/// The arguments of `drover run -w WORKERS`, on a free listen and admin address, with
/// `flags`, of `command`.
pub fn run_args(workers: usize, flags: &[&str], command: &[&str]) -> Vec<String> {
    let workers = workers.to_string();
    [
        "run",
        "-w",
        &workers,
        "-l",
        "127.0.0.1:0",
        "--admin",
        "127.0.0.1:0",
    ]
    .iter()
    .chain(flags)
    .chain(&["--"])
    .chain(command)
    .map(|s| s.to_string())
    .collect()
}

/// GET `path` through `d`, waiting up to `wait`: it must fail with `status` and a
/// `drover-error` of `cause`.
pub async fn get_fails(
    d: &DroverProcess,
    path: &str,
    wait: std::time::Duration,
    failure: (u16, &str),
) {
    let mut c = HttpClient::connect(d.addr()).await.unwrap();
    c.set_timeout(wait);
    let r = c.get(path).await;
    assert_eq!(
        (r.status, r.header("drover-error")),
        (failure.0, Some(failure.1)),
        "GET {path}: {}\n{}",
        r.text(),
        d.stderr_text()
    );
}
