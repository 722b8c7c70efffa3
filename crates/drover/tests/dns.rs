//! `dns:` and `dns+srv:` backends through the real binary and a real DNS server
//! (dnsmasq): answers followed on their TTL, the last answer kept while DNS is down.

mod common;

#[path = "../../drover-dns/tests/dnsmasq/mod.rs"]
#[allow(dead_code)]
mod dnsmasq;

use common::{
    admin_addr, answering, app_config, bin, ctl, members_list, names, port_worker, stops_cleanly,
    temp_dir, up_serving, worker_names,
};
use dnsmasq::{free_port, Dnsmasq};
use drover_testkit::{wait_until_async, Backend, DroverProcess};
use std::net::SocketAddr;
use std::time::Duration;

/// Backends on 127.0.0.11, .12 and .13, all on one port (DNS A records carry no port).
async fn backends_on_one_port() -> (u16, Vec<Backend>) {
    for _ in 0..20 {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.11:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let mut started = Vec::new();
        for (i, ip) in ["127.0.0.11", "127.0.0.12", "127.0.0.13"]
            .iter()
            .enumerate()
        {
            let addr: SocketAddr = format!("{ip}:{port}").parse().unwrap();
            match Backend::named(&format!("b{}", i + 1)).start_on(addr).await {
                Ok(b) => started.push(b),
                Err(_) => break,
            }
        }
        if started.len() == 3 {
            return (port, started);
        }
    }
    panic!("no port free on all of 127.0.0.11-13");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dns_backend_follows_its_records_and_keeps_them_while_dns_is_down() {
    let dir = temp_dir("dns-follow");
    let (port, _backends) = backends_on_one_port().await;
    let mut dns = Dnsmasq::start(&dir, free_port(), "127.0.0.11 api.test\n", 1, &[]);
    let d = DroverProcess::spawn(
        bin(),
        &[
            "proxy",
            "--listen",
            "127.0.0.1:0",
            "--threads",
            "1",
            "--slow-start",
            "0s",
            "--strategy",
            "round-robin",
            "--backend",
            &format!("dns:api.test:{port}"),
            "--resolver",
            &dns.addr().to_string(),
            "--admin",
            "127.0.0.1:0",
        ],
    )
    .await;
    let admin = admin_addr(&d).await;
    // Resolved before the listener opened: the first request is served.
    assert_eq!(answering(d.addr(), 4).await, names(&["b1"]));

    // A record added and one removed: followed within the TTL (1 s) and a bit.
    dns.set_hosts("127.0.0.12 api.test\n127.0.0.13 api.test\n");
    assert!(
        wait_until_async(Duration::from_secs(5), || async {
            answering(d.addr(), 6).await == names(&["b2", "b3"])
        })
        .await,
        "the new answer was not followed"
    );
    let (code, out, err) = ctl(admin, &["members", "list"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("dns"), "{out}");

    // DNS down: the last answer stays, and the status says the lookups fail.
    dns.kill();
    let failing = wait_until_async(Duration::from_secs(8), || async {
        let (_, out, _) = ctl(admin, &["status"]).await;
        out.contains("dns api.test") && out.contains("failing")
    })
    .await;
    assert!(failing, "{}", ctl(admin, &["status"]).await.1);
    assert_eq!(answering(d.addr(), 6).await, names(&["b2", "b3"]));
    stops_cleanly(d).await;
}

#[tokio::test]
async fn srv_records_give_ports_and_a_reload_follows_new_names() {
    let dir = temp_dir("dns-srv");
    let (port, _backends) = backends_on_one_port().await;
    let srv = format!("--srv-host=_http._tcp.api.test,b3.test,{port},0,5");
    let dns = Dnsmasq::start(
        &dir,
        free_port(),
        "127.0.0.11 one.test\n127.0.0.13 b3.test\n",
        1,
        &[&srv],
    );
    let file = dir.join("drover.toml");
    let toml = |backend: &str| {
        format!(
            "[admin]\nlisten = \"127.0.0.1:0\"\n\n[resolver]\nnameservers = [\"{}\"]\n\n[[balancer]]\nname = \"web\"\nlisten = \"127.0.0.1:0\"\nthreads = 1\nslow_start = \"0s\"\nbackends = [\"{backend}\"]\n",
            dns.addr()
        )
    };
    std::fs::write(&file, toml("dns+srv:_http._tcp.api.test")).unwrap();
    let d = DroverProcess::spawn(bin(), &["proxy", "--config", file.to_str().unwrap()]).await;
    let admin = admin_addr(&d).await;
    assert_eq!(answering(d.addr(), 3).await, names(&["b3"]));

    std::fs::write(&file, toml(&format!("dns:one.test:{port}"))).unwrap();
    let (code, out, err) = ctl(admin, &["reload"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("balancers changed: web"), "{out}");
    assert_eq!(answering(d.addr(), 3).await, names(&["b1"]));
    stops_cleanly(d).await;
}

#[tokio::test]
async fn a_dns_name_serves_beside_an_apps_workers() {
    let dir = temp_dir("dns-app");
    let (port, _backends) = backends_on_one_port().await;
    let dns = Dnsmasq::start(&dir, free_port(), "127.0.0.11 api.test\n", 1, &[]);
    let toml = app_config(
        &port_worker(&dir),
        &format!("\"app:web\", \"dns:api.test:{port}\""),
        &format!("\n[resolver]\nnameservers = [\"{}\"]\n", dns.addr()),
    );
    let (d, admin, _) = up_serving("dns-app-up", &toml).await;
    let mut all = worker_names(admin).await;
    all.insert("b1".to_string());
    assert_eq!(answering(d.addr(), 9).await, all, "{}", d.stderr_text());
    let sources: Vec<String> = members_list(admin)
        .await
        .members
        .into_iter()
        .map(|m| m.source)
        .collect();
    assert_eq!(sources, ["supervisor", "supervisor", "dns"]);
    stops_cleanly(d).await;
}

#[tokio::test]
async fn bad_dns_and_etcd_settings_are_refused_naming_them() {
    let dir = temp_dir("dns-bad");
    let cases = [
        (
            "[resolver]\nnameservers = [\"not-an-ip\"]\n[[balancer]]\nlisten = \"127.0.0.1:0\"\nbackends = [\"dns:a.test:80\"]\n",
            "resolver.nameservers[0]",
        ),
        (
            "[resolver]\nmin_ttl = \"10s\"\nmax_ttl = \"1s\"\n[[balancer]]\nlisten = \"127.0.0.1:0\"\nbackends = [\"dns:a.test:80\"]\n",
            "min_ttl",
        ),
        (
            "[[balancer]]\nlisten = \"127.0.0.1:0\"\nbackends = [\"dns:bad name:80\"]\n",
            "dns:HOST:PORT",
        ),
        (
            "[[balancer]]\nlisten = \"127.0.0.1:0\"\nbackends = [\"dns+srv:\"]\n",
            "dns+srv:NAME",
        ),
        (
            "[[balancer]]\nlisten = \"127.0.0.1:0\"\nbackends = [\"etcd:/drover/web\"]\n",
            "needs an [etcd] table",
        ),
        (
            "[etcd]\nendpoints = [\"127.0.0.1:2379\"]\n[[balancer]]\nlisten = \"127.0.0.1:0\"\nbackends = [\"etcd:/drover/web\"]\n",
            "etcd.endpoints[0]",
        ),
    ];
    for (toml, says) in cases {
        let file = dir.join("drover.toml");
        std::fs::write(&file, toml).unwrap();
        let out = tokio::process::Command::new(bin())
            .args(["proxy", "--config", file.to_str().unwrap()])
            .output()
            .await
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{toml} started");
        assert!(err.contains(says), "{says:?} not in {err}");
    }
    for (args, says) in [
        (
            vec!["--backend", "dns:a.test:80", "--resolver", "nope"],
            "--resolver",
        ),
        (vec!["--backend", "etcd:/drover/web"], "needs --etcd"),
        (
            vec!["--backend", "etcd:/a", "--etcd", "localhost"],
            "--etcd",
        ),
    ] {
        let out = tokio::process::Command::new(bin())
            .args(["proxy", "--listen", "127.0.0.1:0"])
            .args(&args)
            .output()
            .await
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} started");
        assert!(err.contains(says), "{says:?} not in {err}");
    }
}
