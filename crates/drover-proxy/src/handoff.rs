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
use drover_registry::OwnWorker;
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use tokio::net::TcpStream;
use tracing::debug;

/// A proxied connection is offered to a worker once it has carried this many requests:
/// then it is one the client reuses. After one, many clients close it (HTTP/1.1
/// clients that open a connection per request but do not say so).
const HAND_OVER_AFTER_REQUESTS: u32 = 2;

/// After a proxied connection could not be handed over (every worker behind), it is
/// offered again after this many more requests.
const RETRY_AFTER_REQUESTS: u32 = 64;

/// A connection offered a worker of its own goes to the worker that served its last
/// request alone (`OwnWorker::Only`), tried this many times a request apart, before any
/// free worker may take it. The app may keep this client's state there (an in-memory
/// session), and a worker says late that a client left: on 2 busy cores, a browser tab's
/// connection, offered right after its login, went to another worker because the one that
/// served the login had not yet said the previous tab was gone, and its pages answered
/// "who are you?" (4 runs of 12 of the test of that name, run 4 at a time). A worker
/// that truly serves another client gives the connection up after these tries.
const TRIES_WHERE_SERVED: u32 = 4;

/// When a proxied keep-alive connection is next offered to a worker.
#[derive(Debug)]
pub(crate) struct Offers {
    /// Once it has carried this many requests.
    due_at: u32,
    /// Offers so far to the worker that served it alone.
    where_served: u32,
}

impl Offers {
    pub(crate) fn new() -> Self {
        Offers {
            due_at: HAND_OVER_AFTER_REQUESTS,
            where_served: 0,
        }
    }

    /// Whether a connection that has carried `requests` is offered now.
    pub(crate) fn are_due(&self, requests: u32) -> bool {
        requests >= self.due_at
    }
}

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
        || shared.sessions.seen()
    {
        return Some(stream);
    }
    match give(shared, stream, Give::LeastBehind { prefer: None }) {
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
    // A worker would see the PROXY protocol sender as its client. socket.io sessions
    // are kept on their workers by drover, which must see their requests (`engine_io`).
    let may = |shared: &BalancerState| {
        shared.opts.proxy_protocol.is_none()
            && shared.pool.handoffs().any()
            && !shared.sessions.seen()
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

/// Offers a proxied connection, between two requests, to a worker (the one `to` says,
/// `served_by` where it may: the one that answered its last request). The stream back
/// when none took it, to serve here until `offers` are due again.
pub(crate) fn offer(
    shared: &BalancerState,
    stream: TcpStream,
    to: HandOver,
    served_by: Option<SocketAddr>,
    offers: &mut Offers,
    requests: u32,
) -> Result<(), ClientStream> {
    let give_to = match (to, served_by) {
        (HandOver::LeastBehind, prefer) => Give::LeastBehind { prefer },
        (HandOver::OwnWorker, Some(addr)) if offers.where_served < TRIES_WHERE_SERVED => {
            offers.where_served += 1;
            Give::Own(OwnWorker::Only(addr))
        }
        (HandOver::OwnWorker, prefer) => Give::Own(OwnWorker::AnyFree { prefer }),
    };
    let retry_after = match give_to {
        Give::Own(OwnWorker::Only(_)) => 1,
        _ => RETRY_AFTER_REQUESTS,
    };
    let given = give(shared, stream, give_to);
    if given.is_err() {
        offers.due_at = requests.saturating_add(retry_after);
    }
    given
}

/// Which worker `give` gives a connection to.
enum Give {
    /// The one least behind, `prefer` among those as far behind.
    LeastBehind { prefer: Option<SocketAddr> },
    /// One that serves nothing else.
    Own(OwnWorker),
}

/// Gives `stream` to a worker; the stream back when none took it.
fn give(shared: &BalancerState, stream: TcpStream, to: Give) -> Result<(), ClientStream> {
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
        Give::LeastBehind { prefer } => shared.pool.hand_off(plain, prefer),
        Give::Own(own) => shared.pool.hand_to_own(plain, own),
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
