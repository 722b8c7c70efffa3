//! Real etcd servers for the tests: loopback only, free ports from the OS, a temporary
//! data directory, bounded waits everywhere.
#![allow(dead_code)]

use drover_etcd::{EtcdMembers, EtcdOptions, MemberValue};
use drover_registry::{Pool, PoolOptions, Registration};
use etcd_client::{Client, GetOptions};
use std::collections::BTreeMap;
use std::future::Future;
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub const PREFIX: &str = "/drover/pools/web";

/// A port the OS says is free now, never the same one twice in this process.
pub fn free_port() -> u16 {
    static GIVEN: Mutex<Vec<u16>> = Mutex::new(Vec::new());
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .expect("a free loopback port")
            .local_addr()
            .unwrap()
            .port();
        let mut given = GIVEN.lock().unwrap();
        if !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
}

/// One etcd server; killed and its data removed on drop.
pub struct Etcd {
    child: Option<Child>,
    pub dir: PathBuf,
    pub client_port: u16,
    pub peer_port: u16,
    /// Flags of its own, after the ports' (`--auth-token-ttl 1`).
    extra: Vec<String>,
}

impl Etcd {
    pub async fn start() -> Etcd {
        Etcd::start_inner(free_port(), false, &[]).await
    }

    /// An etcd serving clients on `client_port`.
    pub async fn start_on(client_port: u16) -> Etcd {
        Etcd::start_inner(client_port, true, &[]).await
    }

    /// An etcd started with `extra` flags too.
    pub async fn start_with(extra: &[&str]) -> Etcd {
        Etcd::start_inner(free_port(), false, extra).await
    }

    async fn start_inner(client_port: u16, fixed_port: bool, extra: &[&str]) -> Etcd {
        static N: AtomicU32 = AtomicU32::new(0);
        if Command::new("etcd")
            .arg("--version")
            .stdout(Stdio::null())
            .status()
            .is_err()
        {
            panic!(
                "etcd is not on PATH: these tests run real etcd servers; \
                 scripts/test installs Debian's etcd-server (apt-get install etcd-server)"
            );
        }
        let dir = std::env::temp_dir().join(format!(
            "drover-etcd-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut etcd = Etcd {
            child: None,
            dir,
            client_port,
            peer_port: free_port(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        // A port the OS called free may be taken again before etcd binds it (by a
        // connection's ephemeral port): then try other ports.
        for _ in 0..3 {
            etcd.spawn_on(etcd.client_port);
            if etcd
                .try_ready(etcd.client_port, Duration::from_secs(10))
                .await
            {
                return etcd;
            }
            let log = etcd.log_tail();
            etcd.kill();
            if !log.contains("address already in use") {
                panic!("etcd on port {client_port} not ready within 10 s; log:\n{log}");
            }
            let _ = std::fs::remove_dir_all(etcd.dir.join("data"));
            etcd.peer_port = free_port();
            if !fixed_port {
                etcd.client_port = free_port();
            }
        }
        panic!("etcd could not bind its ports: {}", etcd.log_tail());
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    /// Runs etcd on this data directory, serving clients on `client_port`.
    pub fn spawn_on(&mut self, client_port: u16) {
        assert!(self.child.is_none(), "etcd already running");
        let client = format!("http://127.0.0.1:{client_port}");
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("etcd.log"))
            .unwrap();
        let child = Command::new("etcd")
            .args(["--name", "t"])
            .arg("--data-dir")
            .arg(self.dir.join("data"))
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("t={peer}")])
            .args(["--initial-cluster-state", "new"])
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("etcd starts");
        self.child = Some(child);
    }

    /// Polls until etcd answers a read on `client_port` (10 s at most).
    pub async fn wait_ready(&mut self, client_port: u16) {
        if !self.try_ready(client_port, Duration::from_secs(10)).await {
            panic!(
                "etcd on port {client_port} not ready within 10 s; log:\n{}",
                self.log_tail()
            );
        }
    }

    /// Polls until etcd answers a read; false when it does not in time or exits.
    async fn try_ready(&mut self, client_port: u16, within: Duration) -> bool {
        let url = format!("http://127.0.0.1:{client_port}");
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            let attempt = async {
                let mut c = Client::connect([url.as_str()], None).await.ok()?;
                c.get("ready", None).await.ok()
            };
            if let Ok(Some(_)) = tokio::time::timeout(Duration::from_millis(500), attempt).await {
                return true;
            }
            if let Some(child) = self.child.as_mut() {
                if child.try_wait().ok().flatten().is_some() {
                    return false;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    }

    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("etcd.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port and data directory.
    pub async fn restart(&mut self) {
        self.spawn_on(self.client_port);
        self.wait_ready(self.client_port).await;
    }

    pub async fn client(&self) -> Client {
        client_on(self.client_port).await
    }
}

pub async fn client_on(port: u16) -> Client {
    tokio::time::timeout(
        Duration::from_secs(5),
        Client::connect([format!("http://127.0.0.1:{port}")], None),
    )
    .await
    .expect("connect in time")
    .expect("connect")
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub fn options() -> EtcdOptions {
    EtcdOptions {
        op_timeout: Duration::from_secs(2),
        backoff_min: Duration::from_millis(100),
        backoff_max: Duration::from_millis(400),
        settle: Duration::from_secs(1),
        tls: None,
        auth: None,
    }
}

pub fn pool(static_addrs: &[SocketAddr]) -> Arc<Pool> {
    let members: Vec<(SocketAddr, u32)> = static_addrs.iter().map(|a| (*a, 1)).collect();
    Arc::new(Pool::new("web", &members, PoolOptions::default()))
}

pub fn start(etcd: &Etcd, pool: &Arc<Pool>) -> Arc<EtcdMembers> {
    start_at(etcd.client_port, pool)
}

pub fn start_at(port: u16, pool: &Arc<Pool>) -> Arc<EtcdMembers> {
    EtcdMembers::start_with(
        vec![format!("http://127.0.0.1:{port}")],
        PREFIX.to_string(),
        Arc::clone(pool),
        options(),
    )
}

pub fn addr(port: u16) -> SocketAddr {
    ([127, 0, 0, 1], port).into()
}

pub fn reg(port: u16, ttl: Option<u64>) -> Registration {
    Registration {
        address: addr(port).to_string(),
        addr: addr(port),
        ttl: ttl.map(Duration::from_secs),
        weight: 1,
        meta: BTreeMap::new(),
    }
}

pub fn value(port: u16) -> Vec<u8> {
    serde_json::to_vec(&MemberValue::from_registration(&reg(port, None))).unwrap()
}

/// The pool's addresses, sorted.
pub fn addrs(pool: &Pool) -> Vec<SocketAddr> {
    let mut a: Vec<SocketAddr> = pool.endpoints().iter().map(|e| e.addr()).collect();
    a.sort();
    a
}

pub fn sorted(mut a: Vec<SocketAddr>) -> Vec<SocketAddr> {
    a.sort();
    a
}

/// Polls `cond` every 25 ms for up to `within`.
pub async fn eventually(within: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Keys under the test prefix, as etcd has them now.
pub async fn keys(client: &mut Client) -> Vec<String> {
    let resp = tokio::time::timeout(
        Duration::from_secs(5),
        client.get(
            format!("{PREFIX}/members/"),
            Some(GetOptions::new().with_prefix()),
        ),
    )
    .await
    .unwrap()
    .unwrap();
    resp.kvs()
        .iter()
        .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
        .collect()
}

/// Runs a test body with a bound, so no test can hang.
pub async fn bounded<F: Future<Output = ()>>(secs: u64, body: F) {
    tokio::time::timeout(Duration::from_secs(secs), body)
        .await
        .unwrap_or_else(|_| panic!("test took longer than {secs} s"));
}
