//! Handing client connections to workers that serve them directly (`Pool::hand_off`: a
//! Node worker under `drover run`, through its cluster channel). Once handed, drover is
//! out of the connection's path: no hop, and none of its requests seen or counted here.
//!
//! Two moments: at accept (`Handoff::Always`), and between two requests of a proxied
//! keep-alive connection, when drover has read nothing of the next one (the kernel holds
//! whatever the client sends next, and the worker reads it from there).
//! `Handoff::WhenEven` places every connection's first request itself and hands the
//! connection over once the app's requests cost alike (`CostSpread`): a load test's
//! keep-alive connections, all opened at a cold start, leave drover's path after its
//! first second, while an app with heavy routes keeps per-request placement. A new
//! connection per request stays proxied: its one request is placed best where drover
//! sees every worker's requests in flight, and a `kill -9` of a worker fails none of
//! them (drover retries).
//!
//! While costs differ, `auto` still hands a keep-alive connection over when the app has
//! a worker for it alone (`HandOver::OwnWorker`): more workers than client connections,
//! and one that serves nothing else. Then no request waits behind another, and the hop
//! is all that placing requests would add: a load test with 2 connections on 8 workers
//! ran at half of Node cluster's req/s through drover's hop (`bench/sweep.sh --seed 4
//! --only 3`). Once connections outnumber the workers, a new connection asks the
//! workers for theirs back (`at_new_connection`), and each request is placed again.
//!
//! And back: a worker that retires gives its connections back between two requests
//! (drover-node's preload), and the balancer serves them like new ones.

use crate::conn::ClientStream;
use crate::options::Handoff;
use crate::state::{BalancerState, ThreadCell};
use drover_balance::clock;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use tokio::net::TcpStream;
use tracing::debug;

/// A proxied connection is offered to a worker once it has carried this many requests:
/// then it is one the client reuses. After one, many clients close it (HTTP/1.1
/// clients that open a connection per request but do not say so).
pub(crate) const HAND_OVER_AFTER_REQUESTS: u32 = 2;

/// After a proxied connection could not be handed over (every worker behind), it is
/// offered again after this many more requests.
pub(crate) const RETRY_AFTER_REQUESTS: u32 = 64;

/// A new connection: `None` when a worker took it; the stream back to serve here.
pub(crate) fn at_accept(cell: &ThreadCell, stream: TcpStream) -> Option<TcpStream> {
    let worker = cell.load();
    let shared = &worker.shared;
    // A TLS connection's session is this process's: a worker could not read it. On an
    // h2c listener, the first bytes say whether the client speaks HTTP/2, which a worker
    // may not: such a connection is read here first (and an HTTP/1.1 one may still be
    // handed over between its requests).
    if shared.opts.handoff != Handoff::Always
        || shared.opts.proxy_protocol.is_some()
        || shared.opts.h2c
        || shared.tls.load().is_some()
        || !shared.pool.handoffs().any()
    {
        return Some(stream);
    }
    match give(shared, stream, HandOver::LeastBehind, None) {
        Ok(()) => None,
        Err(back) => back.into_plain().ok(),
    }
}

/// Which worker a connection handed over between two requests goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HandOver {
    /// The one least behind (costs alike, or `handoff` mode).
    LeastBehind,
    /// One that serves nothing else (see the module's notes).
    OwnWorker,
}

/// Whether a proxied keep-alive connection, between two requests and with nothing of
/// the next one read, should be offered to a worker, and to which.
pub(crate) fn between_requests(shared: &BalancerState) -> Option<HandOver> {
    // Cheapest first: this runs after every proxied request of a keep-alive connection.
    // A worker would see the PROXY protocol sender as its client.
    let may = |shared: &BalancerState| {
        shared.opts.proxy_protocol.is_none() && shared.pool.handoffs().any()
    };
    match shared.opts.handoff {
        Handoff::Never => None,
        Handoff::Always => may(shared).then_some(HandOver::LeastBehind),
        Handoff::WhenEven if !may(shared) => None,
        Handoff::WhenEven if shared.spread.is_even(clock::now()) => Some(HandOver::LeastBehind),
        Handoff::WhenEven => has_worker_of_its_own(shared).then_some(HandOver::OwnWorker),
    }
}

/// Whether every client connection could have a worker of its own: the proxied ones
/// (this one among them) and those workers serve, against the workers that count theirs.
/// Never with an access log: a worker's requests would be missing from it, and the
/// light traffic this is for is when someone reads it.
fn has_worker_of_its_own(shared: &BalancerState) -> bool {
    if shared.access_log.is_some() {
        return false;
    }
    let proxied = shared.active.load(Relaxed);
    // More connections than workers at all: no need to count what they serve.
    if proxied > shared.pool.handoffs().taker_count() {
        return false;
    }
    let o = shared.pool.handoff_occupancy();
    proxied + o.clients <= o.workers
}

/// A new client connection, in `auto` mode while costs differ: once client connections
/// outnumber the workers, those handed to workers of their own come back, so that each
/// request is placed again.
pub(crate) fn at_new_connection(shared: &BalancerState) {
    if shared.opts.handoff != Handoff::WhenEven || !shared.pool.handoffs().any() {
        return;
    }
    let o = shared.pool.handoff_occupancy();
    if o.clients > 0
        && shared.active.load(Relaxed) + o.clients > o.workers
        && !shared.spread.is_even(clock::now())
    {
        shared.pool.handoffs().reclaim();
    }
}

/// Gives `stream` to a worker (the one `to` says, `served_by` where it may: the one
/// that answered its last request); the stream back when none took it.
pub(crate) fn give(
    shared: &BalancerState,
    stream: TcpStream,
    to: HandOver,
    served_by: Option<std::net::SocketAddr>,
) -> Result<(), ClientStream> {
    // Out of this thread's reactor: from here the worker's event loop owns it.
    let plain = match stream.into_std() {
        Ok(plain) => plain,
        Err(e) => {
            // The stream is gone with the error; the client sees its connection close.
            debug!("cannot hand a connection off: {e}");
            return Ok(());
        }
    };
    let given = match to {
        HandOver::LeastBehind => shared.pool.hand_off(plain, served_by),
        HandOver::OwnWorker => shared.pool.hand_to_own(plain, served_by),
    };
    match given {
        Ok(_) => {
            shared.stats.record_handoff();
            Ok(())
        }
        Err(back) => match TcpStream::from_std(back) {
            Ok(back) => Err(ClientStream::Plain(back)),
            Err(e) => {
                debug!("cannot serve a connection no worker took: {e}");
                Ok(())
            }
        },
    }
}

/// Ready when a retiring worker of this balancer's pool may have given a connection back.
pub(crate) async fn returned(cell: &ThreadCell) {
    let pool = Arc::clone(&cell.load().shared.pool);
    pool.handoffs().returned().await
}
