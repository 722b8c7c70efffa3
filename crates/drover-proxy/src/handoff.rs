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
//! And back: a worker that retires gives its connections back between two requests
//! (drover-node's preload), and the balancer serves them like new ones.

use crate::conn::ClientStream;
use crate::options::Handoff;
use crate::state::{BalancerState, ThreadCell};
use drover_balance::clock;
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
    match give(shared, stream) {
        Ok(()) => None,
        Err(back) => back.into_plain().ok(),
    }
}

/// Whether a proxied keep-alive connection, between two requests and with nothing of
/// the next one read, should be offered to a worker.
pub(crate) fn between_requests(shared: &BalancerState) -> bool {
    // Cheapest first: this runs after every proxied request of a keep-alive connection.
    // A worker would see the PROXY protocol sender as its client.
    let may = |shared: &BalancerState| {
        shared.opts.proxy_protocol.is_none() && shared.pool.handoffs().any()
    };
    match shared.opts.handoff {
        Handoff::Never => false,
        Handoff::Always => may(shared),
        Handoff::WhenEven => may(shared) && shared.spread.is_even(clock::now()),
    }
}

/// Gives `stream` to the worker least behind; the stream back when none took it.
pub(crate) fn give(shared: &BalancerState, stream: TcpStream) -> Result<(), ClientStream> {
    // Out of this thread's reactor: from here the worker's event loop owns it.
    let plain = match stream.into_std() {
        Ok(plain) => plain,
        Err(e) => {
            // The stream is gone with the error; the client sees its connection close.
            debug!("cannot hand a connection off: {e}");
            return Ok(());
        }
    };
    match shared.pool.hand_off(plain) {
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
