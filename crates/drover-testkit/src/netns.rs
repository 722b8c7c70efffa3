//! Several "machines" on one host: Linux network namespaces joined by veth pairs to a
//! bridge that lives in a namespace of its own. Nothing touches the host's namespace:
//! every address is the lab's, so labs of concurrent tests do not see each other.
//!
//! Needs root (or CAP_SYS_ADMIN and CAP_NET_ADMIN) and iproute2's `ip`; `Lab::create`
//! says why it cannot when it cannot, so a test can skip with that message.

use std::future::Future;
use std::net::Ipv4Addr;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

/// The lab's subnet; every lab has its own bridge, so they may all use it.
const SUBNET: [u8; 3] = [10, 77, 0];

/// One namespace of a lab.
#[derive(Debug, Clone)]
pub struct Node {
    /// Its name in the lab.
    pub name: String,
    /// The namespace (`ip netns` name).
    pub netns: String,
    pub ip: Ipv4Addr,
}

/// A set of namespaces on one bridge; deleted, with every process in them, when dropped.
#[derive(Debug)]
pub struct Lab {
    hub: String,
    nodes: Vec<Node>,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run `ip` (iproute2): {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`ip {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl Lab {
    /// Namespaces called `names` (10.77.0.11, .12, ... in that order) on one bridge.
    pub fn create(names: &[&str]) -> Result<Lab, String> {
        static LABS: AtomicU32 = AtomicU32::new(0);
        let tag = format!(
            "drv{}x{}",
            std::process::id() % 100_000,
            LABS.fetch_add(1, Ordering::Relaxed)
        );
        let hub = format!("{tag}-hub");
        ip(&["netns", "add", &hub])?;
        let mut lab = Lab {
            hub: hub.clone(),
            nodes: Vec::new(),
        };
        ip(&["-n", &hub, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &hub, "link", "set", "br0", "up"])?;
        for (i, name) in names.iter().enumerate() {
            let netns = format!("{tag}-{name}");
            ip(&["netns", "add", &netns])?;
            let node = Node {
                name: name.to_string(),
                netns: netns.clone(),
                ip: Ipv4Addr::new(SUBNET[0], SUBNET[1], SUBNET[2], 11 + i as u8),
            };
            lab.nodes.push(node.clone());
            let port = format!("p{i}");
            ip(&[
                "link", "add", &port, "netns", &hub, "type", "veth", "peer", "name", "eth0",
                "netns", &netns,
            ])?;
            ip(&["-n", &hub, "link", "set", &port, "master", "br0", "up"])?;
            ip(&[
                "-n",
                &netns,
                "addr",
                "add",
                &format!("{}/24", node.ip),
                "dev",
                "eth0",
            ])?;
            ip(&["-n", &netns, "link", "set", "eth0", "up"])?;
            ip(&["-n", &netns, "link", "set", "lo", "up"])?;
        }
        Ok(lab)
    }

    pub fn node(&self, name: &str) -> &Node {
        self.nodes
            .iter()
            .find(|n| n.name == name)
            .unwrap_or_else(|| panic!("no node {name} in the lab"))
    }

    /// `program` run inside `node`'s namespace (`ip netns exec`).
    pub fn command(&self, node: &str, program: &str) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.node(node).netns, program]);
        cmd
    }

    /// The same as a tokio command.
    pub fn tokio_command(&self, node: &str, program: &str) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new("ip");
        cmd.args(["netns", "exec", &self.node(node).netns, program]);
        cmd
    }

    /// Runs `f` on a thread of its own inside `node`'s namespace, on a single-threaded
    /// tokio runtime: every socket it opens is the namespace's.
    pub fn spawn_in<F, Fut, T>(&self, node: &str, f: F) -> std::thread::JoinHandle<T>
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = T>,
        T: Send + 'static,
    {
        spawn_in(&self.node(node).netns, f)
    }

    /// Tears `node` down as a machine that vanishes would go: every process in it is
    /// killed and its namespace (with its address) deleted.
    pub fn remove(&mut self, node: &str) {
        let netns = self.node(node).netns.clone();
        delete_netns(&netns);
        self.nodes.retain(|n| n.netns != netns);
    }
}

/// Runs `f` on a thread of its own inside the namespace `netns`, on a single-threaded
/// tokio runtime: every socket it opens, and every process it starts, is the
/// namespace's.
pub fn spawn_in<F, Fut, T>(netns: &str, f: F) -> std::thread::JoinHandle<T>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = T>,
    T: Send + 'static,
{
    let path = format!("/var/run/netns/{netns}");
    std::thread::spawn(move || {
        let ns = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        // setns(2) moves only this thread; the test's other threads stay where they are.
        nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET)
            .unwrap_or_else(|e| panic!("setns {path}: {e}"));
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime")
            .block_on(f())
    })
}

/// Kills every process in `netns`, then deletes it.
fn delete_netns(netns: &str) {
    if let Ok(out) = Command::new("ip").args(["netns", "pids", netns]).output() {
        for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
            if let Ok(pid) = pid.parse::<i32>() {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    }
    let _ = ip(&["netns", "del", netns]);
}

impl Drop for Lab {
    fn drop(&mut self) {
        for node in &self.nodes {
            delete_netns(&node.netns);
        }
        delete_netns(&self.hub);
    }
}
