//! The DNS source against a real DNS server (dnsmasq) on a free 127.0.0.1 port.

mod dnsmasq;

use dnsmasq::{free_port, temp_dir, Dnsmasq};
use drover_dns::{DnsSource, DnsTarget, LookupError, ResolverSettings};
use drover_registry::{Pool, PoolOptions, Source};
use std::collections::BTreeSet;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// Every test finishes within this, or fails.
const TEST_BOUND: Duration = Duration::from_secs(30);

fn run<F: Future<Output = ()>>(f: F) {
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter("drover_dns=debug")
        .try_init();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            tokio::time::timeout(TEST_BOUND, f)
                .await
                .expect("test timed out")
        });
}

fn settings(dns: &Dnsmasq) -> ResolverSettings {
    ResolverSettings {
        nameservers: Some(vec![dns.addr()]),
        min_ttl: Duration::from_secs(1),
        max_ttl: Duration::from_secs(300),
        timeout: Duration::from_secs(1),
    }
}

fn a(host: &str, port: u16) -> DnsTarget {
    DnsTarget::A {
        host: host.into(),
        port,
    }
}

fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn set(addrs: &[&str]) -> BTreeSet<SocketAddr> {
    addrs.iter().map(|s| sa(s)).collect()
}

fn empty_pool() -> Arc<Pool> {
    Arc::new(Pool::new("web", &[], PoolOptions::default()))
}

fn members(pool: &Pool) -> BTreeSet<SocketAddr> {
    pool.endpoints().iter().map(|e| e.addr()).collect()
}

/// Polls `cond` every 50 ms until it holds or `within` passes; returns whether it held.
async fn eventually(within: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if cond() {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[test]
fn a_records_follow_changes_and_keep_endpoint_state() {
    run(async {
        let dir = temp_dir();
        let mut dns = Dnsmasq::start(
            dir.path(),
            free_port(),
            "127.0.0.11 api.test\n127.0.0.12 api.test\n::1 api.test\n",
            1,
            &[],
        );
        let pool = empty_pool();
        let source = DnsSource::start(vec![a("api.test", 8080)], settings(&dns), pool.clone())
            .await
            .unwrap();
        // start waited for the first answer: members are there at once.
        assert_eq!(
            members(&pool),
            set(&["127.0.0.11:8080", "127.0.0.12:8080", "[::1]:8080"])
        );
        assert_eq!(pool.sources_of(sa("127.0.0.11:8080")), vec![Source::Dns]);
        let st = &source.status()[0];
        assert!(st.is_ok(), "{st:?}");
        assert_eq!(st.ttl, Some(Duration::from_secs(1)));
        assert!(st.expires_in().unwrap() <= Duration::from_secs(1));
        let stays = pool.find(sa("127.0.0.12:8080")).unwrap();
        stays.note_failure();

        dns.set_hosts("127.0.0.12 api.test\n127.0.0.13 api.test\n::1 api.test\n");
        let want = set(&["127.0.0.12:8080", "127.0.0.13:8080", "[::1]:8080"]);
        // TTL 1 s: the next lookup is at most 1 s away, plus the lookup itself.
        assert!(
            eventually(Duration::from_millis(2500), || members(&pool) == want).await,
            "pool {:?}, status {:?}\n{}",
            members(&pool),
            source.status(),
            dns.log()
        );
        let after = pool.find(sa("127.0.0.12:8080")).unwrap();
        assert!(
            Arc::ptr_eq(&stays, &after),
            "the endpoint that stayed was replaced"
        );
        assert_eq!(after.fail_streak(), 1, "endpoint state was lost");
        assert_eq!(
            source.status()[0].addrs(),
            want.into_iter().collect::<Vec<_>>()
        );
    });
}

#[test]
fn srv_records_give_ports_and_weights_of_the_lowest_priority() {
    run(async {
        let dir = temp_dir();
        let dns = Dnsmasq::start(
            dir.path(),
            free_port(),
            "127.0.0.21 a.test\n127.0.0.22 b.test\n127.0.0.23 c.test\n127.0.0.24 d.test\n",
            1,
            &[
                // --srv-host=NAME,TARGET,PORT,PRIORITY,WEIGHT
                "--srv-host=_http._tcp.svc.test,a.test,8080,10,5",
                "--srv-host=_http._tcp.svc.test,b.test,8081,10,0",
                "--srv-host=_http._tcp.svc.test,d.test,8083,10,5000",
                // A higher priority value: a fallback level, not used.
                "--srv-host=_http._tcp.svc.test,c.test,8082,20,100",
                // A target without addresses is skipped.
                "--srv-host=_http._tcp.svc.test,gone.test,8084,10,7",
            ],
        );
        let pool = empty_pool();
        let source = DnsSource::start(
            vec![DnsTarget::Srv {
                name: "_http._tcp.svc.test".into(),
            }],
            settings(&dns),
            pool.clone(),
        )
        .await
        .unwrap();
        let weights: Vec<(SocketAddr, u32)> = pool
            .endpoints()
            .iter()
            .map(|e| (e.addr(), e.weight()))
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        assert_eq!(
            weights,
            vec![
                (sa("127.0.0.21:8080"), 5),
                (sa("127.0.0.22:8081"), 1),
                (sa("127.0.0.24:8083"), 1000),
            ],
            "status {:?}\n{}",
            source.status(),
            dns.log()
        );
        let st = &source.status()[0];
        assert!(st.is_ok(), "{st:?}");
        assert_eq!(st.members, weights);
    });
}

#[test]
fn a_dead_server_keeps_the_last_answer_and_a_restarted_one_is_followed() {
    run(async {
        let dir = temp_dir();
        let port = free_port();
        let dns = Dnsmasq::start(
            dir.path(),
            port,
            "127.0.0.11 api.test\n127.0.0.12 api.test\n",
            1,
            &[],
        );
        let pool = empty_pool();
        let source = DnsSource::start(vec![a("api.test", 80)], settings(&dns), pool.clone())
            .await
            .unwrap();
        let before = set(&["127.0.0.11:80", "127.0.0.12:80"]);
        assert_eq!(members(&pool), before);

        dns.kill();
        // The answer expires after 1 s; the lookup then fails (refused or timed out).
        assert!(
            eventually(Duration::from_secs(4), || source.status()[0].failures >= 1).await,
            "{:?}",
            source.status()
        );
        let st = &source.status()[0];
        assert!(st.last_error.is_some(), "{st:?}");
        assert!(!st.is_ok());
        assert_eq!(members(&pool), before, "a failure changed the pool");
        assert_eq!(st.members.len(), 2, "status lost the last answer");

        // Back on the same port with another answer: the next retry (1-2 s) sees it.
        let dns = Dnsmasq::start(dir.path(), port, "127.0.0.13 api.test\n", 1, &[]);
        let want = set(&["127.0.0.13:80"]);
        assert!(
            eventually(Duration::from_secs(6), || members(&pool) == want).await,
            "pool {:?}, status {:?}\n{}",
            members(&pool),
            source.status(),
            dns.log()
        );
        let st = &source.status()[0];
        assert!(st.is_ok(), "{st:?}");
        assert_eq!(st.failures, 0);
        assert!(st.last_error.is_none());
    });
}

#[test]
fn a_name_missing_at_start_is_reported_and_retried_while_others_resolve() {
    run(async {
        let dir = temp_dir();
        let mut dns = Dnsmasq::start(dir.path(), free_port(), "127.0.0.11 api.test\n", 1, &[]);
        let pool = empty_pool();
        let source = DnsSource::start(
            vec![a("missing.test", 80), a("api.test", 80)],
            settings(&dns),
            pool.clone(),
        )
        .await
        .unwrap();
        assert_eq!(members(&pool), set(&["127.0.0.11:80"]));
        let errors = source.first_errors();
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].0, a("missing.test", 80));
        assert!(
            matches!(errors[0].1, LookupError::NxDomain),
            "{:?}",
            errors[0].1
        );
        let st = &source.status()[0];
        assert!(st.members.is_empty() && st.resolved_at.is_none() && st.failures >= 1);
        assert!(source.status()[1].is_ok());

        // It is retried (1 s, then 2 s): once it exists, it joins.
        dns.set_hosts("127.0.0.11 api.test\n127.0.0.31 missing.test\n");
        let want = set(&["127.0.0.11:80", "127.0.0.31:80"]);
        assert!(
            eventually(Duration::from_secs(5), || members(&pool) == want).await,
            "pool {:?}, status {:?}",
            members(&pool),
            source.status()
        );
        assert!(source.status()[0].is_ok());
    });
}

#[test]
fn ttls_are_clamped_to_the_bounds() {
    run(async {
        let dir = temp_dir();
        // Hosts-file answers carry TTL 0; long.test carries an hour.
        let dns = Dnsmasq::start(
            dir.path(),
            free_port(),
            "127.0.0.41 zero.test\n",
            0,
            &["--host-record=long.test,127.0.0.42,3600"],
        );
        let pool = empty_pool();
        let settings = ResolverSettings {
            max_ttl: Duration::from_secs(2),
            ..settings(&dns)
        };
        let started = tokio::time::Instant::now();
        let source = DnsSource::start(
            vec![a("zero.test", 80), a("long.test", 80)],
            settings,
            pool.clone(),
        )
        .await
        .unwrap();
        assert_eq!(members(&pool), set(&["127.0.0.41:80", "127.0.0.42:80"]));
        let st = source.status();
        assert_eq!(st[0].ttl, Some(Duration::ZERO));
        assert_eq!(st[1].ttl, Some(Duration::from_secs(3600)));
        let held = |s: &drover_dns::TargetStatus| s.expires_at.unwrap() - s.resolved_at.unwrap();
        assert_eq!(held(&st[0]), Duration::from_secs(1), "min_ttl");
        assert_eq!(held(&st[1]), Duration::from_secs(2), "max_ttl");

        // Over 3.5 s a TTL-0 name is asked for at most once per min_ttl (1 s): the first
        // lookup and three more. Count what the server saw.
        tokio::time::sleep_until(started + Duration::from_millis(3500)).await;
        let zero = dns.count_log("query[A] zero.test");
        let long = dns.count_log("query[A] long.test");
        assert!(
            (3..=4).contains(&zero),
            "{zero} queries for the TTL-0 name in 3.5 s\n{}",
            dns.log()
        );
        // The hour-long TTL is re-resolved after max_ttl (2 s): twice.
        assert_eq!(long, 2, "{}", dns.log());
        assert_eq!(source.status()[0].lookups as usize, zero);

        // Dropping the source stops the lookups.
        drop(source);
        let at_drop = dns.count_log("query[A] zero.test");
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_eq!(
            dns.count_log("query[A] zero.test"),
            at_drop,
            "lookups after drop"
        );
        // And leaves the pool's members as they were.
        assert_eq!(members(&pool), set(&["127.0.0.41:80", "127.0.0.42:80"]));
    });
}
