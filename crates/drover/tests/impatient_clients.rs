//! Clients that leave while their requests wait in drover's queue (issue 20, sustained
//! overload): a departed client's request never reaches a backend, and while clients
//! are leaving, the newest waiters go first, so the backends serve requests whose
//! clients are still there.

mod common;

use common::*;
use drover_testkit::HttpClient;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// The request that holds the one slot (`--max-conns 1`) while the others queue: long
/// enough that every other request below has joined the queue before it ends.
const HOLD_MS: u64 = 800;

/// A GET of `target` on a connection of its own, sent and left waiting for its answer.
async fn send(addr: SocketAddr, target: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {target} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes())
        .await
        .unwrap();
    s
}

/// The status of the answer on `s`, read within 10 s.
async fn status_of(s: TcpStream) -> Option<u16> {
    let mut c = HttpClient::from_stream(s).unwrap();
    c.set_timeout(Duration::from_secs(10));
    c.read_response(false).await.ok().map(|r| r.status)
}

/// The targets the backend was sent, in order, but its health probes.
fn targets(b: &drover_testkit::Backend) -> Vec<String> {
    b.request_heads()
        .into_iter()
        .map(|h| h.target)
        .filter(|t| t != "/health")
        .collect()
}

/// The held request and every patient one were answered.
async fn all_answered(hold: TcpStream, waiting: Vec<TcpStream>) {
    assert_eq!(status_of(hold).await, Some(200));
    for s in waiting {
        assert_eq!(
            status_of(s).await,
            Some(200),
            "a patient client was not served"
        );
    }
}

/// The held request and the patient one (`/delay/1?stayed`) were answered, only they
/// reached the backend (`what` says otherwise), and the queue counted one departure.
async fn only_the_stayer_went_on(
    b: &drover_testkit::Backend,
    admin: SocketAddr,
    hold: TcpStream,
    stayer: TcpStream,
    held: &str,
    what: &str,
) {
    assert_eq!(status_of(hold).await, Some(200));
    assert_eq!(status_of(stayer).await, Some(200));
    assert_eq!(targets(b), [held, "/delay/1?stayed"], "{what}");
    assert_eq!(
        common::default_metric(admin, "drover_queue_abandoned_total").await,
        1
    );
}

/// `drover proxy` with one slot on one backend (and `extra` flags), and its admin
/// address.
async fn one_slot(
    b: &drover_testkit::Backend,
    extra: &[&str],
) -> (drover_testkit::DroverProcess, SocketAddr) {
    let backend = b.addr().to_string();
    let mut args = vec!["--backend", &backend, "--max-conns", "1"];
    args.extend_from_slice(extra);
    proxy_with_admin(&args).await
}

#[tokio::test]
async fn a_request_whose_client_left_the_queue_never_reaches_the_backend() {
    let b = drover_testkit::Backend::start().await;
    let (d, admin) = one_slot(&b, &[]).await;
    let hold = send(d.addr(), &format!("/delay/{HOLD_MS}?hold")).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let leaver = send(d.addr(), "/delay/1?left").await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let stayer = send(d.addr(), "/delay/1?stayed").await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(leaver);
    only_the_stayer_went_on(
        &b,
        admin,
        hold,
        stayer,
        "/delay/800?hold",
        "the request whose client closed its connection while it waited was sent on",
    )
    .await;
    stops_cleanly(d).await;
}

#[tokio::test]
async fn while_clients_leave_the_queue_the_newest_waiters_go_first() {
    let b = drover_testkit::Backend::start().await;
    let (d, _admin) = one_slot(&b, &[]).await;
    let hold = send(d.addr(), &format!("/delay/{HOLD_MS}?hold")).await;
    let mut waiting = Vec::new();
    for n in 1..=2 {
        tokio::time::sleep(Duration::from_millis(80)).await;
        waiting.push(send(d.addr(), &format!("/delay/1?n={n}")).await);
    }
    // A client gives up: the queue has grown past its patience.
    tokio::time::sleep(Duration::from_millis(80)).await;
    let leaver = send(d.addr(), "/delay/1?left").await;
    tokio::time::sleep(Duration::from_millis(80)).await;
    drop(leaver);
    tokio::time::sleep(Duration::from_millis(80)).await;
    waiting.push(send(d.addr(), "/delay/1?n=3").await);
    all_answered(hold, waiting).await;
    assert_eq!(
        targets(&b),
        [
            "/delay/800?hold",
            "/delay/1?n=3",
            "/delay/1?n=2",
            "/delay/1?n=1"
        ],
        "after a client left, the newest waiter should have gone first"
    );
    stops_cleanly(d).await;
}

#[tokio::test]
async fn patient_clients_are_served_first_come_first_served() {
    let b = drover_testkit::Backend::start().await;
    let (d, _admin) = one_slot(&b, &[]).await;
    let hold = send(d.addr(), &format!("/delay/{HOLD_MS}?hold")).await;
    let mut waiting = Vec::new();
    for n in 1..=3 {
        tokio::time::sleep(Duration::from_millis(80)).await;
        waiting.push(send(d.addr(), &format!("/delay/1?n={n}")).await);
    }
    all_answered(hold, waiting).await;
    assert_eq!(
        targets(&b),
        [
            "/delay/800?hold",
            "/delay/1?n=1",
            "/delay/1?n=2",
            "/delay/1?n=3"
        ]
    );
    stops_cleanly(d).await;
}

#[tokio::test]
async fn an_http2_request_whose_client_gave_up_never_reaches_the_backend() {
    let b = drover_testkit::Backend::start().await;
    let (d, admin) = one_slot(&b, &["--h2c"]).await;
    let hold = send(d.addr(), &format!("/delay/{HOLD_MS}?hold")).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    // curl over cleartext HTTP/2, giving up after 300 ms while its stream waits.
    let gave_up = tokio::process::Command::new("curl")
        .args([
            "-sS",
            "--http2-prior-knowledge",
            "-m",
            "0.3",
            "-o",
            "/dev/null",
        ])
        .arg(format!("http://{}/delay/1?left", d.addr()))
        .kill_on_drop(true)
        .status()
        .await
        .expect("curl runs");
    assert!(!gave_up.success(), "curl should have timed out");
    let stayer = send(d.addr(), "/delay/1?stayed").await;
    only_the_stayer_went_on(
        &b,
        admin,
        hold,
        stayer,
        "/delay/800?hold",
        "the stream whose client gave up while it waited was sent on",
    )
    .await;
    stops_cleanly(d).await;
}

#[tokio::test]
async fn a_client_that_sent_more_and_left_is_seen_at_the_next_look() {
    let b = drover_testkit::Backend::start().await;
    let (d, admin) = one_slot(&b, &[]).await;
    // Held past the once-a-second look (`LOOK_AT_CLIENT`).
    let hold = send(d.addr(), "/delay/2000?hold").await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut leaver = send(d.addr(), "/delay/1?left").await;
    // The start of a pipelined request, after drover has read the first: its close
    // then sits behind bytes a peek sees first.
    tokio::time::sleep(Duration::from_millis(100)).await;
    leaver.write_all(b"GET /next").await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(leaver);
    let stayer = send(d.addr(), "/delay/1?stayed").await;
    only_the_stayer_went_on(
        &b,
        admin,
        hold,
        stayer,
        "/delay/2000?hold",
        "the request whose client sent more and then closed its connection was sent on",
    )
    .await;
    stops_cleanly(d).await;
}
