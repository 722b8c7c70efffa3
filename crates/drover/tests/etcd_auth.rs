//! etcd with authentication on: a real etcd whose `root` user turned auth on
//! (`etcdctl auth enable`), with a user `drover` whose role may read and write the
//! balancers' prefix, and login tokens that lapse after 2 s unused. A balancer that logs
//! in by flags (`--etcd-user`, `--etcd-password-file`) and one by a drover.toml (`[etcd]
//! user`, `password_file`) share a member registered at one of them; a registration
//! after the token lapsed logs in again and goes through; a balancer with a wrong
//! password says why in its status and refuses registrations. Bad settings are refused
//! at start, naming them, and a password in the file itself is refused.

mod common;

use common::{bin, ctl, etcd_source, serves_within_10s, stops_cleanly, temp_dir};
use drover_testkit::{ChildProcess, DroverProcess};
use std::path::Path;
use std::time::Duration;

const PREFIX: &str = "/drover/auth";

/// An etcd with auth on, `drover`/`s3cret` allowed to read and write `PREFIX`, and
/// tokens that lapse after 2 s unused; and its client URL.
async fn auth_etcd(dir: &Path) -> (ChildProcess, String) {
    let (mut cmd, client) = common::etcd_command("auth", dir, "http");
    cmd.args(["--auth-token-ttl", "2"]);
    // etcd 3.4: "serving insecure client requests on 127.0.0.1:PORT".
    let etcd = drover_testkit::spawn_ready_line(cmd, "serving insecure client requests on").await;
    let mut root = etcd_client::Client::connect([client.as_str()], None)
        .await
        .unwrap();
    root.user_add("root", "root-password", None).await.unwrap();
    root.user_grant_role("root", "root").await.unwrap();
    root.role_add("pool").await.unwrap();
    let perm = etcd_client::Permission::read_write(PREFIX).with_prefix();
    root.role_grant_permission("pool", perm).await.unwrap();
    root.user_add("drover", "s3cret", None).await.unwrap();
    root.user_grant_role("drover", "pool").await.unwrap();
    root.auth_enable().await.unwrap();
    (etcd, client)
}

fn arg(path: &Path) -> &str {
    path.to_str().unwrap()
}

#[tokio::test]
async fn balancers_log_in_to_an_etcd_with_auth_on_and_a_wrong_password_is_refused() {
    let dir = temp_dir("etcd-auth");
    let (_etcd, url) = auth_etcd(&dir).await;
    let backends = drover_testkit::backends(2).await;
    let password = dir.join("etcd-password");
    // As `echo s3cret > FILE` writes it: the newline is not part of the password.
    std::fs::write(&password, "s3cret\n").unwrap();
    let wrong = dir.join("wrong-password");
    std::fs::write(&wrong, "guess").unwrap();
    let backend = format!("etcd:{PREFIX}");
    let logged_in = |file: &Path| {
        [
            "--backend".to_string(),
            backend.clone(),
            "--etcd".into(),
            url.clone(),
            "--etcd-user".into(),
            "drover".into(),
            "--etcd-password-file".into(),
            arg(file).into(),
        ]
    };

    // A: flags. B: the same as a drover.toml's [etcd] user and password_file.
    let flags_a = logged_in(&password);
    let flags_a: Vec<&str> = flags_a.iter().map(String::as_str).collect();
    let (a, admin_a) = common::proxy_with_admin(&flags_a).await;
    let file = dir.join("drover.toml");
    std::fs::write(
        &file,
        format!(
            "[admin]\nlisten = \"127.0.0.1:0\"\n\n[etcd]\nendpoints = [\"{url}\"]\nuser = \"drover\"\npassword_file = {:?}\n\n[[balancer]]\nlisten = \"127.0.0.1:0\"\nthreads = 1\nbackends = [\"{backend}\"]\n",
            arg(&password)
        ),
    )
    .unwrap();
    let b = DroverProcess::spawn(bin(), &["proxy", "--config", arg(&file)]).await;
    let admin_b = common::admin_addr(&b).await;

    let add = |id: &'static str, i: usize| {
        let addr = backends[i].addr().to_string();
        async move { ctl(admin_a, &["members", "add", id, &addr, "--ttl", "30s"]).await }
    };
    let (code, out, err) = add("be-1", 0).await;
    assert_eq!(code, 0, "{out}{err}\n{}", a.stderr_text());
    for (d, admin) in [(&a, admin_a), (&b, admin_b)] {
        serves_within_10s(d, admin, "b0").await;
    }

    // Unused for longer than etcd's --auth-token-ttl, A's login token has lapsed: the
    // next registration meets it, logs in again, and goes through.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let (code, out, err) = add("be-2", 1).await;
    assert_eq!(
        code,
        0,
        "after the token lapsed: {out}{err}\n{}",
        a.stderr_text()
    );
    let both = drover_testkit::wait_until_async(Duration::from_secs(10), || async {
        etcd_source(admin_b).await.1 == 2
    })
    .await;
    assert!(both, "{:?}", etcd_source(admin_b).await);

    // A wrong password: etcd refuses the login; the status says so, and so does a
    // registration, which reaches nothing.
    let flags_c = logged_in(&wrong);
    let flags_c: Vec<&str> = flags_c.iter().map(String::as_str).collect();
    let (c, admin_c) = common::proxy_with_admin(&flags_c).await;
    let said = drover_testkit::wait_until_async(Duration::from_secs(10), || async {
        let (ok, _, detail) = etcd_source(admin_c).await;
        !ok && detail.contains("authentication failed")
    })
    .await;
    assert!(
        said,
        "{:?}\n{}",
        etcd_source(admin_c).await,
        c.stderr_text()
    );
    let addr = backends[0].addr().to_string();
    let (code, out, err) = ctl(admin_c, &["members", "add", "be-3", &addr]).await;
    assert_ne!(code, 0, "registered: {out}");
    assert!(err.contains("authentication failed"), "{err}");
    stops_cleanly(c).await;
    let (code, out, err) = ctl(admin_a, &["members", "list"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(!out.contains("be-3"), "{out}");

    // A reload of B's file whose password file is gone is refused, naming it, and B
    // goes on as it was.
    let text = std::fs::read_to_string(&file).unwrap();
    std::fs::write(&file, text.replace("etcd-password", "gone-password")).unwrap();
    let (code, out, err) = ctl(admin_b, &["reload"]).await;
    assert_ne!(code, 0, "reloaded: {out}");
    assert!(err.contains("gone-password"), "{err}");
    assert!(etcd_source(admin_b).await.0);
    stops_cleanly(a).await;
    stops_cleanly(b).await;
}

#[tokio::test]
async fn bad_etcd_auth_settings_are_refused_at_start_naming_them() {
    let dir = temp_dir("etcd-auth-bad");
    let missing = dir.join("missing-password");
    let empty = dir.join("empty-password");
    std::fs::write(&empty, "\n").unwrap();
    let http = "http://127.0.0.1:2379";
    let backend = format!("etcd:{PREFIX}");
    let cases: [(&[&str], &[&str]); 5] = [
        (
            &[
                "--etcd",
                http,
                "--etcd-user",
                "drover",
                "--etcd-password-file",
                arg(&missing),
            ],
            &["--etcd-password-file", "missing-password"],
        ),
        (
            &[
                "--etcd",
                http,
                "--etcd-user",
                "drover",
                "--etcd-password-file",
                arg(&empty),
            ],
            &["--etcd-password-file", "empty", "\"drover\""],
        ),
        (
            &["--etcd", http, "--etcd-user", "drover"],
            &["--etcd-password-file"],
        ),
        (
            &[
                "--etcd",
                http,
                "--etcd-user",
                "",
                "--etcd-password-file",
                arg(&empty),
            ],
            &["--etcd-user", "empty user name"],
        ),
        (
            &["--etcd-user", "drover", "--etcd-password-file", arg(&empty)],
            &["need --etcd"],
        ),
    ];
    for (flags, says) in cases {
        let out = tokio::process::Command::new(bin())
            .args(["proxy", "--listen", "127.0.0.1:0"])
            .args(if flags.contains(&"--etcd") {
                vec!["--backend", backend.as_str()]
            } else {
                vec!["--backend", "127.0.0.1:9"]
            })
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
    let table = |keys: &str| {
        format!(
            "[etcd]\nendpoints = [\"{http}\"]\n{keys}\n\n[[balancer]]\nlisten = \"127.0.0.1:0\"\nbackends = [\"{backend}\"]\n"
        )
    };
    let file_cases: Vec<(String, Vec<&str>)> = vec![
        (
            table("user = \"drover\"\npassword = \"s3cret\""),
            vec!["drover.toml:4", "etcd.password", "password_file"],
        ),
        (
            table("user = \"drover\""),
            vec!["drover.toml:3", "etcd.user", "password_file"],
        ),
        (
            table(&format!("password_file = {:?}", arg(&empty))),
            vec!["drover.toml:3", "etcd.password_file", "user"],
        ),
        (
            table(&format!(
                "user = \"drover\"\npassword_file = {:?}",
                arg(&missing)
            )),
            vec!["drover.toml:4", "etcd.password_file", "missing-password"],
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
