//! A balancer that follows an etcd prefix starts serving with the prefix's members:
//! restarted under load, it answered its first clients `503 no-healthy-endpoint`
//! before its first listing came in.

mod common;

use common::{bin, ctl, proxy_with_admin, stops_cleanly, temp_dir};
use drover_testkit::HttpClient;
use std::process::Command;

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
