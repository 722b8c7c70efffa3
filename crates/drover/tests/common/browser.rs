//! Headless Chromium for tests of pages and browser clients (`/usr/bin/chromium`,
//! Debian's package; `scripts/test` installs it), driven over the DevTools protocol with
//! the WebSocket client of drover-testkit. Without Chromium a test is skipped, saying so,
//! except under CI (env `CI` set), where that is a failure.

use drover_testkit::{ws_connect, WsClient, WsMessage};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// Headless Chromium with its DevTools endpoint on a free port; killed (its whole
/// process group) when dropped.
pub struct Chromium {
    child: tokio::process::Child,
    devtools: SocketAddr,
    browser_path: String,
}

impl Chromium {
    /// Chromium with a profile and a home of its own in `profile`, trusting no
    /// certificate authority a test makes.
    pub async fn start(profile: &Path) -> Chromium {
        Chromium::launch(profile).await
    }

    /// Chromium that trusts the CA in `ca_pem` as a user's browser trusts a company CA:
    /// in the NSS database of its home (`~/.pki/nssdb`, where Chromium on Linux reads the
    /// user's own trust anchors), made here with NSS's `certutil`. Nothing else is
    /// relaxed: the server's certificate must chain to that CA and name the host.
    pub async fn start_trusting(profile: &Path, ca_pem: &Path) -> Chromium {
        let db = profile.join("home/.pki/nssdb");
        std::fs::create_dir_all(&db).unwrap();
        let db = format!("sql:{}", db.display());
        certutil(&["-N", "-d", &db, "--empty-password"]);
        let ca = ca_pem.to_str().unwrap();
        certutil(&[
            "-A",
            "-d",
            &db,
            "-t",
            "C,,",
            "-n",
            "drover test CA",
            "-i",
            ca,
        ]);
        Chromium::launch(profile).await
    }

    async fn launch(profile: &Path) -> Chromium {
        let home = profile.join("home");
        std::fs::create_dir_all(&home).unwrap();
        let mut cmd = tokio::process::Command::new("/usr/bin/chromium");
        cmd.args([
            "--headless=new",
            "--remote-debugging-port=0",
            "--remote-debugging-address=127.0.0.1",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-gpu",
            "--disable-extensions",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-dev-shm-usage",
            "--window-size=1400,1000",
            // In a container (and as root) Chromium's sandbox cannot start.
            "--no-sandbox",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg("about:blank")
        .env("HOME", &home)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .kill_on_drop(true);
        let child = cmd.spawn().expect("start chromium");
        // It writes its port and the browser's WebSocket path there once it listens.
        let file = profile.join("DevToolsActivePort");
        let ready = drover_testkit::wait_until(Duration::from_secs(30), || {
            std::fs::read_to_string(&file).is_ok_and(|t| t.lines().count() >= 2)
        })
        .await;
        assert!(ready, "chromium wrote no {}", file.display());
        let text = std::fs::read_to_string(&file).unwrap();
        let mut lines = text.lines();
        let port: u16 = lines.next().unwrap().trim().parse().unwrap();
        let browser_path = lines.next().unwrap().trim().to_string();
        Chromium {
            child,
            devtools: SocketAddr::from(([127, 0, 0, 1], port)),
            browser_path,
        }
    }
}

impl Drop for Chromium {
    fn drop(&mut self) {
        if let Some(pid) = self.child.id() {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", "--", &format!("-{pid}")])
                .stderr(Stdio::null())
                .status();
        }
        let _ = self.child.start_kill();
    }
}

/// A DevTools-protocol client on one page (a flattened session of the browser's
/// WebSocket), keeping every event it reads past.
pub struct Cdp {
    ws: WsClient,
    next_id: u64,
    session: Option<String>,
    pub events: Vec<Value>,
}

impl Cdp {
    pub async fn page(chromium: &Chromium) -> Cdp {
        let ws = ws_connect(chromium.devtools, &chromium.browser_path)
            .await
            .expect("connect to chromium's DevTools");
        let mut cdp = Cdp {
            ws,
            next_id: 0,
            session: None,
            events: Vec::new(),
        };
        let target = cdp
            .call("Target.createTarget", json!({ "url": "about:blank" }))
            .await;
        let attached = cdp
            .call(
                "Target.attachToTarget",
                json!({ "targetId": target["targetId"], "flatten": true }),
            )
            .await;
        cdp.session = Some(attached["sessionId"].as_str().unwrap().to_string());
        cdp
    }

    pub async fn call(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let mut msg = json!({ "id": id, "method": method, "params": params });
        if let Some(s) = &self.session {
            msg["sessionId"] = json!(s);
        }
        self.ws.send_text(&msg.to_string()).await.unwrap();
        loop {
            let text = match self.ws.recv().await.unwrap() {
                WsMessage::Text(t) => t,
                WsMessage::Close(code) => panic!("DevTools closed ({code:?})"),
                _ => continue,
            };
            let reply: Value = serde_json::from_str(&text).unwrap();
            if reply["id"] == json!(id) {
                if let Some(e) = reply.get("error") {
                    panic!("{method} failed: {e}");
                }
                return reply["result"].clone();
            }
            if reply.get("method").is_some() {
                self.events.push(reply);
            }
        }
    }

    /// The value of a JavaScript expression in the page.
    pub async fn eval(&mut self, expr: &str) -> Value {
        let r = self
            .call(
                "Runtime.evaluate",
                json!({ "expression": expr, "returnByValue": true, "awaitPromise": true }),
            )
            .await;
        if let Some(e) = r.get("exceptionDetails") {
            panic!("{expr}: {e}");
        }
        r["result"]["value"].clone()
    }

    /// Polls `expr` until it is true, for at most `limit`; answers whether it became so.
    /// An expression that throws (the page not parsed yet: an element still missing)
    /// counts as not yet.
    pub async fn until(&mut self, limit: Duration, expr: &str) -> bool {
        let deadline = Instant::now() + limit;
        loop {
            let r = self
                .call(
                    "Runtime.evaluate",
                    json!({ "expression": expr, "returnByValue": true, "awaitPromise": true }),
                )
                .await;
            if r.get("exceptionDetails").is_none() && r["result"]["value"] == json!(true) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Every URL the page asked for so far.
    pub fn requested(&self) -> Vec<String> {
        self.events
            .iter()
            .filter(|e| e["method"] == "Network.requestWillBeSent")
            .filter_map(|e| e["params"]["request"]["url"].as_str().map(str::to_string))
            .collect()
    }
}

fn certutil(args: &[&str]) {
    let out = std::process::Command::new("certutil")
        .args(args)
        .output()
        .expect("run certutil (libnss3-tools; scripts/test installs it)");
    assert!(
        out.status.success(),
        "certutil {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Whether NSS's `certutil` is missing (the browser tests over HTTPS need it to trust
/// the test's CA); under CI it must be here (scripts/test installs libnss3-tools).
pub fn certutil_missing() -> bool {
    let here = std::process::Command::new("certutil")
        .arg("-H")
        .output()
        .is_ok();
    super::tool_missing(here, "certutil (libnss3-tools; scripts/test installs it)")
}

pub fn chromium_missing() -> bool {
    super::tool_missing(
        Path::new("/usr/bin/chromium").exists(),
        "/usr/bin/chromium (scripts/test installs it)",
    )
}
