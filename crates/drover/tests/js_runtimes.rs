//! JavaScript runtimes other than Node under `drover run`, as their users write apps:
//! Bun (`Bun.serve`) and Deno (`Deno.serve`, with only the permissions it needs), from
//! `tests/fixtures/js-runtimes` (`npm ci` there installs both, as `scripts/test` does).

mod common;

use common::examples::{drover_stops_cleanly, get};
use common::{admin_addr, bin, temp_dir, wait_all_serving};
use drover_testkit::DroverProcess;
use std::path::Path;

/// The runtime `name` from the fixture's `node_modules/.bin`.
fn runtime(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/js-runtimes/node_modules/.bin")
        .join(name);
    assert!(
        path.exists(),
        "run `npm ci --prefix crates/drover/tests/fixtures/js-runtimes` (scripts/test does)"
    );
    path.display().to_string()
}

/// Bun and Deno read Node's cluster variables as their own. Given drover's Node channel
/// (`NODE_UNIQUE_ID`, `NODE_CHANNEL_FD`), Bun made every worker share a port the app
/// names past drover (a reload then left the balancer with no endpoint), and Deno, run
/// with only the permissions its app needs, panicked at every start ("Requires env
/// access to NODE_UNIQUE_ID"). They run now as any program does: at their `PORT`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bun_and_deno_apps_serve_at_their_port_with_no_node_channel() {
    let dir = temp_dir("js-runtimes");
    let bun_app = dir.join("bun-app.ts");
    std::fs::write(
        &bun_app,
        "Bun.serve({ port: Number(process.env.PORT), hostname: '127.0.0.1', fetch() {\n\
         \x20 return new Response(JSON.stringify({ runtime: 'bun', unique: process.env.NODE_UNIQUE_ID ?? null }));\n\
         } });\n",
    )
    .unwrap();
    let deno_app = dir.join("deno-app.ts");
    std::fs::write(
        &deno_app,
        "Deno.serve({ port: Number(Deno.env.get('PORT')), hostname: '127.0.0.1' },\n\
         \x20 () => new Response(JSON.stringify({ runtime: 'deno' })));\n",
    )
    .unwrap();
    let runs: [(&str, Vec<String>); 2] = [
        ("bun", vec![runtime("bun"), bun_app.display().to_string()]),
        (
            "deno",
            vec![
                runtime("deno"),
                "run".into(),
                "--allow-net".into(),
                "--allow-env=PORT".into(),
                deno_app.display().to_string(),
            ],
        ),
    ];
    for (name, command) in runs {
        let mut args = vec![
            "run",
            "-w",
            "2",
            "-l",
            "127.0.0.1:0",
            "--admin",
            "127.0.0.1:0",
            "--",
        ];
        args.extend(command.iter().map(String::as_str));
        let d = DroverProcess::spawn(bin(), &args).await;
        let admin = admin_addr(&d).await;
        wait_all_serving(&d, admin).await;
        for _ in 0..4 {
            let answer = get(d.addr(), "/").await;
            let body = String::from_utf8_lossy(&answer.body).into_owned();
            assert_eq!(answer.status, 200, "{name}: {body}\n{}", d.stderr_text());
            assert!(body.contains(&format!("\"runtime\":\"{name}\"")), "{body}");
            assert!(
                !body.contains("\"unique\":\""),
                "{name} got a Node channel: {body}"
            );
        }
        assert!(
            !d.stderr_text().contains("panicked"),
            "{name}: {}",
            d.stderr_text()
        );
        drover_stops_cleanly(name, &d).await;
    }
}
