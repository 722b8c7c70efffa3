//! A balancer that follows an etcd prefix starts serving with the prefix's members:
//! restarted under load, it answered its first clients `503 no-healthy-endpoint`
//! before its first listing came in. And it keeps serving its members when etcd comes
//! back empty, until etcd lists one again.

mod common;

use common::{bin, body_through, ctl, etcd_source, proxy_with_admin, stops_cleanly, temp_dir};
use drover_testkit::{wait_until_async, HttpClient};
use std::process::Command;
use std::time::Duration;

#[tokio::test]
async fn a_balancer_started_on_an_etcd_prefix_serves_its_members_from_its_first_request() {
    let dir = temp_dir("etcd-start");
    let (cmd, client) = common::etcd_command("start", &dir, "http");
    // etcd 3.4: "serving insecure client requests on 127.0.0.1:PORT".
    let _etcd = drover_testkit::spawn_ready_line(cmd, "serving insecure client requests on").await;
    let backends = drover_testkit::backends(1).await;
    let follow = ["--backend", "etcd:/drover/start", "--etcd", client.as_str()];

    // One balancer registers the backend in etcd, with no TTL: it stays there.
    let (a, admin_a) = proxy_with_admin(&follow).await;
    let addr = backends[0].addr().to_string();
    let (code, out, err) = ctl(admin_a, &["members", "add", "be-1", &addr]).await;
    assert_eq!(code, 0, "{out}{err}\n{}", a.stderr_text());
    stops_cleanly(a).await;

    // Each new balancer on the prefix answers its first request from the backend: a
    // client that connects as soon as the port opens, as one does under load.
    for start in 0..10 {
        let port = drover_testkit::free_port();
        let listen = format!("127.0.0.1:{port}");
        let mut b = Command::new(bin())
            .args(["proxy", "--listen", &listen, "--threads", "1"])
            .args(["--admin", "off"])
            .args(follow)
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let at = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        let mut c = None;
        for _ in 0..5_000 {
            if let Ok(conn) = HttpClient::connect(at).await {
                c = Some(conn);
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
        let mut c = c.unwrap_or_else(|| panic!("start {start}: {at} never opened"));
        let r = c.request("GET", "/", &[], None).await.unwrap();
        let _ = b.kill();
        let _ = b.wait();
        assert_eq!(
            r.status,
            200,
            "start {start}: {}",
            String::from_utf8_lossy(&r.body)
        );
    }
}

/// etcd restored or rebuilt with an empty data directory (revision 1 again): the
/// balancer lists the prefix anew and finds nothing. It applied that, and answered
/// `503 no-healthy-endpoint` to everything until the apps registered again: 35,714
/// failed requests (median of 3) across two balancers, where nginx fed by confd kept
/// its last upstreams and failed none (multi-machine seat). Now it serves the members
/// etcd listed last while etcd lists none, says so in its status, and applies etcd's
/// list again once it has a member.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_stay_served_while_etcd_comes_back_empty_until_it_lists_one_again() {
    let dir = temp_dir("etcd-empty");
    let (cmd, client) = common::etcd_command("empty", &dir, "http");
    let args: Vec<std::ffi::OsString> = cmd.get_args().map(ToOwned::to_owned).collect();
    let ready = "serving insecure client requests on";
    let etcd = drover_testkit::spawn_ready_line(cmd, ready).await;
    let backends = drover_testkit::backends(3).await;
    let (d, admin) =
        proxy_with_admin(&["--backend", "etcd:/drover/empty", "--etcd", client.as_str()]).await;
    for (name, b) in ["be-0", "be-1"].iter().zip(&backends) {
        let (code, out, err) = ctl(admin, &["members", "add", name, &b.addr().to_string()]).await;
        assert_eq!(code, 0, "{out}{err}\n{}", d.stderr_text());
    }
    common::serves_within_10s(&d, admin, "b1").await;

    etcd.kill();
    etcd.wait_exit(Duration::from_secs(10)).await;
    std::fs::remove_dir_all(dir.join("etcd-data")).unwrap();
    let mut again = Command::new("etcd");
    again.args(&args);
    let _etcd = drover_testkit::spawn_ready_line(again, ready).await;
    assert!(
        d.wait_for_line("etcd lists no member", Duration::from_secs(30))
            .await
            .is_some(),
        "{:?}\n{}",
        etcd_source(admin).await,
        d.stderr_text()
    );
    for i in 0..20 {
        let body = body_through(&d).await;
        assert!(
            body.as_deref()
                .is_some_and(|b| b.contains("b0") || b.contains("b1")),
            "request {i} while etcd lists none: {body:?}\n{}",
            d.stderr_text()
        );
    }
    let (ok, _, detail) = etcd_source(admin).await;
    assert!(
        ok && detail.contains("serving the 2 it listed last"),
        "{detail}"
    );

    // An app registers again: etcd's list is what the balancer serves.
    let b2 = backends[2].addr().to_string();
    let (code, out, err) = ctl(admin, &["members", "add", "be-2", &b2]).await;
    assert_eq!(code, 0, "{out}{err}\n{}", d.stderr_text());
    let only_b2 = wait_until_async(Duration::from_secs(10), || async {
        let mut bodies = Vec::new();
        for _ in 0..6 {
            bodies.push(body_through(&d).await);
        }
        bodies
            .iter()
            .all(|b| b.as_deref().is_some_and(|b| b.contains("b2")))
    })
    .await;
    assert!(
        only_b2,
        "{:?}\n{}",
        etcd_source(admin).await,
        d.stderr_text()
    );
}
