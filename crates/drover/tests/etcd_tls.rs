//! etcd over TLS: a real etcd serving clients on `https://` only, with
//! `--client-cert-auth`, and certificates a CA of the test's own signs (rcgen). Two
//! balancers given its CA and a client certificate (`--etcd-ca`, `--etcd-cert`,
//! `--etcd-key`, and the same as `[etcd] tls` in a drover.toml) share a member registered
//! at one of them. A balancer that trusts another CA, or shows no client certificate,
//! says why in its status and refuses registrations; nothing reaches etcd. Bad files and
//! settings are refused at start, naming the file or the flag.

mod common;

use common::pki::{far_future, Pki};
use common::{
    admin_addr, bin, body_through, ctl, etcd_source, serves_within_10s, stops_cleanly, temp_dir,
};
use drover_testkit::{ChildProcess, DroverProcess};
use std::path::Path;
use std::time::Duration;

const PREFIX: &str = "etcd:/drover/tls";

/// An etcd serving clients over TLS only, requiring a client certificate its CA signed.
async fn tls_etcd(pki: &Pki, dir: &Path) -> (ChildProcess, String) {
    let (cert, key) = pki.leaf("etcd", "etcd", &["127.0.0.1"], far_future());
    let (mut cmd, client) = common::etcd_command("tls", dir, "https");
    cmd.arg("--cert-file")
        .arg(&cert)
        .arg("--key-file")
        .arg(&key)
        .arg("--trusted-ca-file")
        .arg(&pki.ca_pem)
        .arg("--client-cert-auth");
    // etcd 3.4: "serving client requests on 127.0.0.1:PORT" (over TLS).
    let etcd = drover_testkit::spawn_ready_line(cmd, "serving client requests on").await;
    (etcd, client)
}

fn arg(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// `drover proxy` over the etcd prefix, with `tls` flags.
async fn balancer(url: &str, tls: &[&str]) -> (DroverProcess, std::net::SocketAddr) {
    common::proxy_with_admin(&[&["--backend", PREFIX, "--etcd", url], tls].concat()).await
}

#[tokio::test]
async fn balancers_share_members_through_an_etcd_that_speaks_only_tls() {
    let dir = temp_dir("etcd-tls");
    let pki = Pki::new("etcd-tls-ca");
    let (client_cert, client_key) = pki.leaf("client", "drover", &[], far_future());
    let (_etcd, url) = tls_etcd(&pki, &dir).await;
    let backend = drover_testkit::backends(1).await;
    let ca = pki.ca_pem.clone();
    let good: [&str; 6] = [
        "--etcd-ca",
        arg(&ca),
        "--etcd-cert",
        arg(&client_cert),
        "--etcd-key",
        arg(&client_key),
    ];

    // A: flags. B: the same as a drover.toml's [etcd] tls.
    let (a, admin_a) = balancer(&url, &good).await;
    let file = dir.join("drover.toml");
    std::fs::write(
        &file,
        format!(
            "[admin]\nlisten = \"127.0.0.1:0\"\n\n[etcd]\nendpoints = [\"{url}\"]\ntls = {{ ca = {:?}, cert = {:?}, key = {:?} }}\n\n[[balancer]]\nlisten = \"127.0.0.1:0\"\nthreads = 1\nbackends = [\"{PREFIX}\"]\n",
            arg(&ca),
            arg(&client_cert),
            arg(&client_key)
        ),
    )
    .unwrap();
    let b = DroverProcess::spawn(bin(), &["proxy", "--config", arg(&file)]).await;
    let admin_b = admin_addr(&b).await;

    let (code, out, err) = ctl(
        admin_a,
        &[
            "members",
            "add",
            "be-1",
            &backend[0].addr().to_string(),
            "--ttl",
            "30s",
        ],
    )
    .await;
    assert_eq!(code, 0, "{out}{err}\n{}", a.stderr_text());
    for (d, admin) in [(&a, admin_a), (&b, admin_b)] {
        serves_within_10s(d, admin, "b0").await;
        let (ok, members, detail) = etcd_source(admin).await;
        assert!(ok && members == 1, "{ok} {members} {detail}");
    }

    // A reload of B's file whose CA file is gone is refused, naming it, and B goes on
    // as it was.
    let gone = dir.join("gone-ca.pem");
    let text = std::fs::read_to_string(&file).unwrap();
    std::fs::write(&file, text.replace(arg(&ca), arg(&gone))).unwrap();
    let (code, out, err) = ctl(admin_b, &["reload"]).await;
    assert_ne!(code, 0, "reloaded: {out}");
    assert!(err.contains("gone-ca.pem"), "{err}");
    assert!(body_through(&b)
        .await
        .is_some_and(|body| body.contains("b0")));
    assert!(etcd_source(admin_b).await.0);

    // Trusting another CA: etcd's certificate is refused, and so is a registration.
    let other = Pki::new("etcd-tls-other-ca");
    let wrong_ca = [
        "--etcd-ca",
        arg(&other.ca_pem),
        "--etcd-cert",
        arg(&client_cert),
        "--etcd-key",
        arg(&client_key),
    ];
    // No client certificate: etcd refuses the session.
    let no_cert = ["--etcd-ca", arg(&ca)];
    for (flags, why) in [
        (&wrong_ca[..], "invalid peer certificate"),
        (&no_cert[..], "certificate"),
    ] {
        let (c, admin_c) = balancer(&url, flags).await;
        let said = drover_testkit::wait_until_async(Duration::from_secs(10), || async {
            let (ok, _, detail) = etcd_source(admin_c).await;
            !ok && detail.to_lowercase().contains(why)
        })
        .await;
        assert!(
            said,
            "{flags:?}: {:?}\n{}",
            etcd_source(admin_c).await,
            c.stderr_text()
        );
        let (code, out, err) = ctl(
            admin_c,
            &["members", "add", "be-2", &backend[0].addr().to_string()],
        )
        .await;
        assert_ne!(code, 0, "{flags:?}: registered: {out}");
        assert!(err.contains("503") || err.contains("etcd"), "{err}");
        stops_cleanly(c).await;
    }
    // Nothing of theirs reached etcd: A still lists be-1 alone.
    let (code, out, err) = ctl(admin_a, &["members", "list"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("be-1") && !out.contains("be-2"), "{out}");
    stops_cleanly(a).await;
    stops_cleanly(b).await;
}

#[tokio::test]
async fn bad_etcd_tls_settings_are_refused_at_start_naming_them() {
    let dir = temp_dir("etcd-tls-bad");
    let missing = dir.join("missing-ca.pem");
    let not_pem = dir.join("not-pem.pem");
    std::fs::write(&not_pem, "hello\n").unwrap();
    let pki = Pki::new("etcd-tls-bad-ca");
    let (cert, _) = pki.leaf("client", "drover", &[], far_future());
    let (_, other_key) = pki.leaf("other", "other", &[], far_future());
    let https = "https://127.0.0.1:2379";
    let (ca, client_cert, wrong_key) = (arg(&pki.ca_pem), arg(&cert), arg(&other_key));
    let http = "http://127.0.0.1:2379";
    let cases: [(&[&str], &[&str]); 5] = [
        (
            &["--etcd", https, "--etcd-ca", arg(&missing)],
            &["--etcd-ca", "missing-ca.pem"],
        ),
        (
            &["--etcd", https, "--etcd-ca", arg(&not_pem)],
            &["--etcd-ca", "not-pem.pem"],
        ),
        // A key that is not the certificate's.
        (
            &[
                "--etcd",
                https,
                "--etcd-cert",
                client_cert,
                "--etcd-key",
                wrong_key,
            ],
            &["--etcd-key", "other.key"],
        ),
        // TLS files for an etcd that speaks no TLS.
        (&["--etcd", http, "--etcd-ca", ca], &["--etcd", "https://"]),
        (&["--etcd", http, "--etcd", https], &["--etcd", "mix"]),
    ];
    for (flags, says) in cases {
        let out = tokio::process::Command::new(bin())
            .args(["proxy", "--listen", "127.0.0.1:0", "--backend", PREFIX])
            .args(flags)
            .output()
            .await
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flags:?} started");
        for s in says {
            assert!(err.contains(s), "{flags:?}: {s:?} not in {err}");
        }
    }
    let tls_table = |endpoint: &str, tls: &str| {
        format!(
            "[etcd]\nendpoints = [\"{endpoint}\"]\ntls = {tls}\n\n[[balancer]]\nlisten = \"127.0.0.1:0\"\nbackends = [\"{PREFIX}\"]\n"
        )
    };
    let file_cases: Vec<(String, Vec<&str>)> = vec![
        (
            tls_table(https, &format!("{{ ca = {:?} }}", arg(&missing))),
            vec!["drover.toml:3", "missing-ca.pem"],
        ),
        (
            tls_table(
                "http://127.0.0.1:2379",
                &format!("{{ ca = {:?} }}", arg(&pki.ca_pem)),
            ),
            vec!["drover.toml:3", "etcd.tls", "https://"],
        ),
        (
            tls_table(https, "{ key = \"k.pem\" }"),
            vec!["etcd.tls.key", "without its certificate"],
        ),
    ];
    let file = dir.join("drover.toml");
    for (toml, says) in file_cases {
        std::fs::write(&file, &toml).unwrap();
        let out = tokio::process::Command::new(bin())
            .args(["proxy", "--config", arg(&file)])
            .output()
            .await
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{toml} started");
        for s in says {
            assert!(err.contains(s), "{toml}: {s:?} not in {err}");
        }
    }
}
