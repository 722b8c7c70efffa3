//! Backends that join and leave a running `drover proxy` through the admin API and
//! `drover ctl members`: registration, TTL heartbeats, drains, and bad requests that
//! change nothing.

mod common;

use common::{bin, ctl};
use drover_admin::{MemberList, MemberRow};
use drover_testkit::{wait_until_async, Backend, DroverProcess, HttpClient};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// `drover proxy --name web` with no static backends and an admin API, plus `extra`.
async fn members_proxy(extra: &[&str]) -> (DroverProcess, SocketAddr) {
    common::proxy_with_admin(&[&["--name", "web"], extra].concat()).await
}

/// One admin API request with an optional JSON body: status and body.
async fn admin(
    admin: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&str>,
    headers: &[(&str, &str)],
) -> (u16, String) {
    let mut c = HttpClient::connect(admin).await.unwrap();
    let r = c
        .request(method, path, headers, body.map(str::as_bytes))
        .await
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
    (r.status, r.text())
}

async fn list(admin_at: SocketAddr) -> MemberList {
    let (status, body) = admin(admin_at, "GET", "/v1/balancers/web/members", None, &[]).await;
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

async fn register(admin_at: SocketAddr, id: &str, body: &str) -> (u16, String) {
    let path = format!("/v1/balancers/web/members/{id}");
    admin(admin_at, "PUT", &path, Some(body), &[]).await
}

/// Which backend answered each of `n` sequential requests (each on a new connection).
async fn served_by(addr: SocketAddr, n: usize) -> Vec<String> {
    let mut names = Vec::new();
    for _ in 0..n {
        let mut c = HttpClient::connect(addr).await.unwrap();
        let r = c.get("/").await;
        assert_eq!(r.status, 200, "{:?} {}", r.header("drover-error"), r.text());
        names.push(r.text());
    }
    names
}

#[tokio::test]
async fn members_join_stay_while_they_heartbeat_and_leave_when_their_ttl_lapses() {
    let (d, admin_at) = members_proxy(&[]).await;
    let (a, b) = (
        Backend::named("a").start().await,
        Backend::named("b").start().await,
    );

    // No members yet: a clean 503, not a hang.
    let mut c = HttpClient::connect(d.addr()).await.unwrap();
    let r = c.get("/").await;
    assert_eq!(r.status, 503);

    let body = format!(
        r#"{{"address": "{}", "ttl": "2s", "meta": {{"zone": "a"}}}}"#,
        a.addr()
    );
    let (status, answer) = register(admin_at, "a-1", &body).await;
    assert_eq!(status, 201, "{answer}");
    let row: MemberRow = serde_json::from_str(&answer).unwrap();
    assert_eq!(
        (row.source.as_str(), row.state.as_str()),
        ("admin", "active")
    );
    assert_eq!(row.ttl_secs, Some(2.0));
    assert!(served_by(d.addr(), 5).await.iter().all(|n| n == "a"));

    // `drover ctl members add` (one balancer runs, so it need not be named).
    let (code, out, err) = ctl(
        admin_at,
        &[
            "members",
            "add",
            "b-1",
            &b.addr().to_string(),
            "--ttl",
            "30s",
            "--meta",
            "zone=b",
        ],
    )
    .await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("added member b-1"), "{out}");
    let names = served_by(d.addr(), 20).await;
    assert!(names.iter().any(|n| n == "a") && names.iter().any(|n| n == "b"));

    let (code, out, err) = ctl(admin_at, &["members", "list"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("a-1") && out.contains("b-1") && out.contains("zone=b"),
        "{out}"
    );

    // Heartbeats (with a load report) keep a-1 past its TTL ...
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(3) {
        let (status, body) = admin(
            admin_at,
            "PUT",
            "/v1/balancers/web/members/a-1/heartbeat",
            Some(r#"{"load": 0.25}"#),
            &[],
        )
        .await;
        assert_eq!(status, 200, "{body}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let members = list(admin_at).await.members;
    assert!(members.iter().any(|m| m.id == "a-1" && m.state == "active"));
    let (code, _, err) = ctl(admin_at, &["members", "heartbeat", "a-1", "--load", "0.3"]).await;
    assert_eq!(code, 0, "{err}");

    // ... and without them it is gone within its TTL (plus the sweep period).
    let silent = Instant::now();
    let gone = wait_until_async(Duration::from_secs(5), || async {
        !list(admin_at).await.members.iter().any(|m| m.id == "a-1")
    })
    .await;
    let took = silent.elapsed();
    assert!(gone, "a-1 still there {took:?} after its last heartbeat");
    assert!(
        took >= Duration::from_millis(1500),
        "removed before its TTL: {took:?}"
    );
    assert!(served_by(d.addr(), 10).await.iter().all(|n| n == "b"));
    // Its next heartbeat is told to register again.
    let (status, body) = admin(
        admin_at,
        "PUT",
        "/v1/balancers/web/members/a-1/heartbeat",
        None,
        &[],
    )
    .await;
    assert_eq!(status, 404, "{body}");
    assert!(d.stderr_text().contains("no heartbeat within its TTL"));
    common::stops_cleanly(d).await;
}

#[tokio::test]
async fn a_drained_member_finishes_its_requests_and_gets_no_new_ones() {
    let (d, admin_at) = members_proxy(&[]).await;
    let (a, b) = (
        Backend::named("a").start().await,
        Backend::named("b").start().await,
    );
    register(admin_at, "a", &format!(r#"{{"address": "{}"}}"#, a.addr())).await;

    // A slow request in flight at a.
    let proxy = d.addr();
    let slow = tokio::spawn(async move {
        let mut c = HttpClient::connect(proxy).await.unwrap();
        c.get("/delay/1500").await
    });
    assert!(
        drover_testkit::wait_until(Duration::from_secs(5), || a.in_flight() == 1).await,
        "the slow request never reached a"
    );
    register(admin_at, "b", &format!(r#"{{"address": "{}"}}"#, b.addr())).await;

    let (code, out, err) = ctl(admin_at, &["members", "--balancer", "web", "drain", "a"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("draining") && out.contains("1 in flight"),
        "{out}"
    );
    let row = list(admin_at)
        .await
        .members
        .into_iter()
        .find(|m| m.id == "a")
        .unwrap();
    assert_eq!(row.state, "draining");
    // New requests go to b only; the slow one finishes at a.
    assert!(served_by(d.addr(), 10).await.iter().all(|n| n == "b"));
    let r = slow.await.unwrap();
    assert_eq!((r.status, r.text().as_str()), (200, "a"));
    assert!(
        wait_until_async(Duration::from_secs(3), || async {
            list(admin_at).await.members.iter().all(|m| m.id != "a")
        })
        .await,
        "a was not removed once its request finished"
    );

    // `remove` waits until the member is gone; with nothing in flight that is at once.
    let (code, out, err) = ctl(admin_at, &["members", "remove", "b"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("member b removed"), "{out}");
    let (code, _, err) = ctl(admin_at, &["members", "remove", "b"]).await;
    assert_ne!(code, 0);
    assert!(err.contains("no member \"b\""), "{err}");
    common::stops_cleanly(d).await;
}

#[tokio::test]
async fn bad_member_requests_are_refused_naming_what_is_wrong_and_change_nothing() {
    let fixed = Backend::named("fixed").start().await;
    let (d, admin_at) = members_proxy(&["--backend", &fixed.addr().to_string()]).await;
    let a = Backend::named("a").start().await;
    let (status, body) = register(
        admin_at,
        "a",
        &format!(r#"{{"address": "{}", "ttl": 60}}"#, a.addr()),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let before = list(admin_at).await;
    assert_eq!(before.members.len(), 2, "{before:?}");

    let other = "127.0.0.1:1";
    let cases: Vec<(&str, String, Option<String>, u16, &str)> = vec![
        ("PUT", "b".into(), Some("not json".into()), 400, "body"),
        (
            "PUT",
            "b".into(),
            Some("{}".into()),
            400,
            "missing field `address`",
        ),
        (
            "PUT",
            "b".into(),
            Some(format!(r#"{{"address": "{other}", "tll": "1s"}}"#)),
            400,
            "unknown field `tll`",
        ),
        (
            "PUT",
            "b".into(),
            Some(format!(r#"{{"address": "{other}", "ttl": "ten"}}"#)),
            400,
            "ttl: invalid duration \"ten\"",
        ),
        (
            "PUT",
            "b".into(),
            Some(format!(r#"{{"address": "{other}", "ttl": "0s"}}"#)),
            400,
            "ttl 0s is out of bounds",
        ),
        (
            "PUT",
            "b".into(),
            Some(format!(r#"{{"address": "{other}", "weight": 0}}"#)),
            400,
            "weight 0",
        ),
        (
            "PUT",
            "b".into(),
            Some(format!(r#"{{"address": "{other}", "weight": 5000}}"#)),
            400,
            "weight 5000",
        ),
        (
            "PUT",
            "b".into(),
            Some(format!(r#"{{"address": "{other}", "weight": -1}}"#)),
            400,
            "body",
        ),
        (
            "PUT",
            "b".into(),
            Some(r#"{"address": "no-port"}"#.into()),
            400,
            "not host:port",
        ),
        (
            "PUT",
            "b".into(),
            Some(r#"{"address": "127.0.0.1:0"}"#.into()),
            400,
            "cannot be connected to",
        ),
        (
            "PUT",
            "b".into(),
            Some(r#"{"address": "does-not-exist.invalid:80"}"#.into()),
            400,
            "does not resolve",
        ),
        (
            "PUT",
            "bad%20id".into(),
            Some(format!(r#"{{"address": "{other}"}}"#)),
            400,
            "is not a member id",
        ),
        (
            "PUT",
            "a".into(),
            Some(format!(r#"{{"address": "{other}"}}"#)),
            409,
            "member \"a\" is registered with",
        ),
        (
            "PUT",
            "b".into(),
            Some(format!(r#"{{"address": "{}"}}"#, a.addr())),
            409,
            "already member \"a\"",
        ),
        (
            "PUT",
            "b".into(),
            Some(format!(r#"{{"address": "{}"}}"#, fixed.addr())),
            409,
            "static backend",
        ),
        (
            "PUT",
            "b".into(),
            Some(format!(
                r#"{{"address": "{other}", "meta": {{"k": "{}"}}}}"#,
                "x".repeat(70_000)
            )),
            413,
            "larger than",
        ),
        ("PUT", "zz/heartbeat".into(), None, 404, "no member \"zz\""),
        (
            "PUT",
            "a/heartbeat".into(),
            Some(r#"{"load": 2}"#.into()),
            400,
            "load 2",
        ),
        ("DELETE", "zz".into(), None, 404, "no member \"zz\""),
        ("POST", "b".into(), None, 405, "method not allowed"),
    ];
    for (method, rest, body, want, says) in &cases {
        let path = format!("/v1/balancers/web/members/{rest}");
        let (status, answer) = admin(admin_at, method, &path, body.as_deref(), &[]).await;
        assert_eq!(status, *want, "{method} {path}: {answer}");
        let answer = serde_json::from_str::<serde_json::Value>(&answer).unwrap()["error"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(
            answer.contains(says),
            "{method} {path}: {answer} lacks {says:?}"
        );
    }
    let (status, answer) = admin(admin_at, "GET", "/v1/balancers/nope/members", None, &[]).await;
    assert_eq!(status, 404, "{answer}");
    assert!(answer.contains(r#"no balancer named \"nope\""#), "{answer}");
    let (code, _, err) = ctl(
        admin_at,
        &["members", "add", "c", other, "--meta", "novalue"],
    )
    .await;
    assert_ne!(code, 0);
    assert!(err.contains("KEY=VALUE"), "{err}");

    let after = list(admin_at).await;
    let strip = |l: &MemberList| -> Vec<(String, String, String)> {
        l.members
            .iter()
            .map(|m| (m.id.clone(), m.addr.clone(), m.state.clone()))
            .collect()
    };
    assert_eq!(strip(&after), strip(&before), "a refusal changed something");
    common::stops_cleanly(d).await;
}

#[tokio::test]
async fn the_members_api_takes_the_admin_token() {
    let (d, admin_at) = members_proxy(&["--admin-token", "s3cret"]).await;
    let a = Backend::named("a").start().await;
    let body = format!(r#"{{"address": "{}"}}"#, a.addr());
    let (status, _) = register(admin_at, "a", &body).await;
    assert_eq!(status, 401);
    let (status, answer) = admin(
        admin_at,
        "PUT",
        "/v1/balancers/web/members/a",
        Some(&body),
        &[("authorization", "Bearer s3cret")],
    )
    .await;
    assert_eq!(status, 201, "{answer}");
    let out = tokio::process::Command::new(bin())
        .args(["ctl", "--admin", &admin_at.to_string(), "--token", "s3cret"])
        .args(["members", "list"])
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{:?}", out);
    assert!(String::from_utf8_lossy(&out.stdout).contains(&a.addr().to_string()));
    common::stops_cleanly(d).await;
}

#[tokio::test]
async fn a_proxy_without_backends_needs_an_admin_api_and_a_valid_name() {
    for (args, says) in [
        (vec!["proxy", "--listen", "127.0.0.1:0"], "--backend"),
        (
            vec![
                "proxy",
                "--listen",
                "127.0.0.1:0",
                "--admin",
                "127.0.0.1:0",
                "--name",
                "Web!",
            ],
            "--name \"Web!\"",
        ),
        (
            vec!["proxy", "--listen", "127.0.0.1:0", "--admin", "0.0.0.0:0"],
            "--admin 0.0.0.0:0",
        ),
    ] {
        let out = tokio::process::Command::new(bin())
            .args(&args)
            .env_remove("DROVER_ADMIN_TOKEN")
            .output()
            .await
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} started");
        assert!(err.contains(says), "{args:?}: {err}");
    }
}
