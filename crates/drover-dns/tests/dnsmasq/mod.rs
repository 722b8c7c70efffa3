//! A real DNS server for the tests: Debian's dnsmasq, in the foreground on a free
//! 127.0.0.1 port (UDP and TCP), answering only from a hosts file and flags.

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A scratch directory, removed when dropped.
pub fn temp_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("drover-dns-test-")
        .tempdir()
        .expect("create temp dir")
}

/// A port free for both UDP and TCP on 127.0.0.1 (checked, then released).
pub fn free_port() -> u16 {
    for _ in 0..50 {
        let tcp = TcpListener::bind("127.0.0.1:0").expect("bind tcp");
        let port = tcp.local_addr().unwrap().port();
        if UdpSocket::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no port free for both UDP and TCP on 127.0.0.1");
}

fn dnsmasq_binary() -> PathBuf {
    for dir in std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .chain(["/usr/sbin", "/sbin"])
    {
        let p = Path::new(dir).join("dnsmasq");
        if p.is_file() {
            return p;
        }
    }
    panic!(
        "dnsmasq is not installed: these tests run a real DNS server. scripts/test installs \
         it (Debian package dnsmasq-base: apt-get install -y dnsmasq-base)"
    );
}

/// One running dnsmasq. Killed on drop.
pub struct Dnsmasq {
    child: Child,
    pub port: u16,
    hosts: PathBuf,
    log: Arc<Mutex<Vec<String>>>,
}

impl Dnsmasq {
    /// Starts dnsmasq on `port` answering from `dir/hosts` (written with `hosts` first)
    /// and `extra` flags, with `--local-ttl=local_ttl`; waits until it has read the file.
    pub fn start(dir: &Path, port: u16, hosts: &str, local_ttl: u32, extra: &[&str]) -> Dnsmasq {
        let hosts_path = dir.join("hosts");
        std::fs::write(&hosts_path, hosts).expect("write hosts");
        let mut cmd = Command::new(dnsmasq_binary());
        cmd.arg("--keep-in-foreground")
            .arg("--conf-file=/dev/null")
            .arg(format!("--port={port}"))
            .arg("--listen-address=127.0.0.1")
            .arg("--bind-interfaces")
            .arg("--no-resolv")
            .arg("--no-hosts")
            .arg(format!("--addn-hosts={}", hosts_path.display()))
            // Names under .test that are not in the file get NXDOMAIN, not REFUSED.
            .arg("--local=/test/")
            .arg(format!("--local-ttl={local_ttl}"))
            .arg(format!("--pid-file={}", dir.join("dnsmasq.pid").display()))
            .arg("--log-queries")
            .arg("--log-facility=-")
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if is_root() {
            // As root dnsmasq drops to `nobody`, who may not read the scratch directory.
            cmd.arg("--user=root").arg("--group=root");
        }
        let mut child = cmd.spawn().expect("spawn dnsmasq");
        let log = Arc::new(Mutex::new(Vec::new()));
        let stderr = child.stderr.take().unwrap();
        let sink = Arc::clone(&log);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                sink.lock().unwrap().push(line);
            }
        });
        let mut d = Dnsmasq {
            child,
            port,
            hosts: hosts_path,
            log,
        };
        d.wait_log("read ", 1);
        d
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Rewrites the hosts file and makes dnsmasq re-read it (SIGHUP), waiting until it has.
    pub fn set_hosts(&mut self, hosts: &str) {
        let before = self.count_log("read ");
        std::fs::write(&self.hosts, hosts).expect("rewrite hosts");
        let status = Command::new("kill")
            .arg("-HUP")
            .arg(self.pid().to_string())
            .status()
            .expect("run kill -HUP");
        assert!(status.success(), "kill -HUP dnsmasq failed");
        self.wait_log("read ", before + 1);
    }

    /// How many log lines contain `needle` (e.g. `query[A] name.test`).
    pub fn count_log(&self, needle: &str) -> usize {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains(needle))
            .count()
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    fn wait_log(&mut self, needle: &str, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.count_log(needle) < n {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("dnsmasq exited ({status}):\n{}", self.log());
            }
            assert!(
                Instant::now() < deadline,
                "dnsmasq did not log {needle:?} x{n} within 5 s:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills dnsmasq and waits for it to exit.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Dnsmasq {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}
