//! The strategies as a user names them: drover.toml's `strategy` and backend weights, and
//! the `--strategy` flags with their keys. Each strategy's spread is tested in-process
//! (crates/drover-proxy/tests/strategies.rs).

mod common;

use common::{addrs, backends, bin, proxy, temp_dir};
use drover_testkit::{answered_by, DroverProcess, HttpClient};

fn share(seen: &[String], name: &str) -> usize {
    seen.iter().filter(|s| *s == name).count()
}

#[tokio::test]
async fn weighted_follows_weights_from_the_config() {
    let b = backends(2).await;
    let dir = temp_dir("weighted");
    let file = dir.join("drover.toml");
    std::fs::write(
        &file,
        format!(
            "[[balancer]]\nlisten = \"127.0.0.1:0\"\nstrategy = \"weighted\"\nthreads = 1\nbackends = [\n  {{ address = \"{}\", weight = 3 }},\n  {{ address = \"{}\", weight = 1 }},\n]\n",
            b[0].addr(),
            b[1].addr()
        ),
    )
    .unwrap();
    let d = DroverProcess::spawn(bin(), &["proxy", "--config", file.to_str().unwrap()]).await;
    let seen = answered_by(d.addr(), 100, "/", &[]).await;
    assert_eq!((share(&seen, "b0"), share(&seen, "b1")), (75, 25));
}

#[tokio::test]
async fn strategy_flags_and_their_keys_reach_the_balancer() {
    let b = backends(3).await;
    let d = proxy(
        &addrs(&b),
        &["--strategy", "hash", "--hash-key", "header:x-user"],
    )
    .await;
    let mut owners = std::collections::HashSet::new();
    for user in 0..30 {
        let user = format!("user-{user}");
        let seen = answered_by(d.addr(), 3, "/", &[("x-user", &user)]).await;
        assert!(seen.iter().all(|s| *s == seen[0]), "{user} moved: {seen:?}");
        owners.insert(seen[0].clone());
    }
    assert_eq!(owners.len(), 3, "30 keys should land on all 3 backends");

    let d = proxy(
        &addrs(&b),
        &["--strategy", "sticky", "--sticky-cookie", "pin"],
    )
    .await;
    let r = HttpClient::connect(d.addr()).await.unwrap().get("/").await;
    let cookie = r.header("set-cookie").expect("sticky sets a cookie");
    assert!(cookie.starts_with("pin="), "{cookie}");
}
