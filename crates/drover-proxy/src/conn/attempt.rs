//! Phase 3, **forward**: one try of a request on the endpoint its slot holds, in
//! named steps: `upstream` (an idle kept-alive connection or a new one),
//! `send_request`, `final_response_head` (1xx passed on), `relay_response` (or
//! `tunnel` after a 101). What a try tells about the endpoint is `account.rs`'s.

use crate::admission::Slot;
use crate::body::{
    self, BodyError, BodyPace, Ends, Framer, Relayed, REQUEST_BUFFER, RESPONSE_BUFFER,
};
use crate::error::ProxyError;
use crate::http1::request::RequestHead;
use crate::http1::response::{self, Exchange, ResponseHead};
use crate::http2::backend::H2Conn;
use crate::options::BackendProtocol;
use crate::state::ClientConnection;
use crate::upstream::{self, Upstream};
use drover_balance::{clock, Endpoint, Pick, WorkerLife};
use drover_metrics::Cause;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tracing::{debug, warn};

use super::exchange::{Answered, CLIENT_CLOSED_REQUEST};
use super::Conn;

/// How one attempt on one endpoint ended.
pub(super) enum Attempt {
    /// The exchange completed; whether the client connection may be kept.
    Done(bool),
    /// Failed before the backend could have acted on it: try another endpoint.
    Retry(ProxyError),
    /// Failed in a way that must not be retried; the client gets this error.
    Fail(ProxyError),
    /// Failed after the response started, or on the client's side: close quietly.
    Abort,
}

impl Conn {
    /// One try on the endpoint `slot` holds, in its four steps: a connection to it, the
    /// request sent, the final response head read (and accounted for), the response
    /// relayed. On `Done`, `out` holds what the client has not taken yet of the
    /// response; the caller sends it once the slot is released.
    pub(super) async fn attempt(
        &mut self,
        head: &RequestHead,
        slot: &Slot,
        framer: &mut Framer,
        pace: Option<&mut BodyPace>,
        answered: &mut Option<Answered>,
    ) -> Attempt {
        if self.is_duplex(head) {
            return self.duplex(head, slot, answered).await;
        }
        let endpoint = slot.pick().endpoint();
        let mut pace = pace;
        let mut fresh = false;
        // What an HTTP/2 stream the backend refuses needs to go again: its head, and
        // its body when drover read all of it before binding (the relay takes both).
        let resend = match head.body {
            None => Some(None),
            Some(_) if framer.is_done() && self.opts().backend_protocol.is_http2() => {
                Some(Some(self.out.clone()))
            }
            Some(_) => None,
        };
        let (up, resp, request_sent) = loop {
            let (mut up, reused) = match self.upstream(slot, fresh).await {
                Ok(up) => up,
                // The endpoint refused a new connection right after its kept-alive one
                // closed on the request: it went away with the request in it, which
                // is a drop (`after_drop`), not a connection crossing its idle close.
                // Uncounted, a GET that hung each worker it was on (killed as hung)
                // went to a third on a busy app, whose connections are mostly kept.
                Err(Attempt::Retry(ProxyError::ConnectFailed | ProxyError::ConnectRefused))
                    if fresh =>
                {
                    return match self.count_drop() {
                        Ok(()) => Attempt::Retry(ProxyError::ConnectFailed),
                        Err(e) => Attempt::Fail(e),
                    };
                }
                Err(attempt) => return attempt,
            };
            let sent = self
                .send_request(&mut up, head, endpoint, reused, framer, pace.as_deref_mut())
                .await;
            let answer = match sent {
                Ok(sent) => self
                    .final_response_head(&mut up, head, slot, reused, sent)
                    .await
                    .map(|resp| (resp, sent)),
                Err(attempt) => Err(attempt),
            };
            // A stream the backend never processed (it refused it, or went away
            // gracefully before taking it, as a server does when a deploy stops it)
            // goes again whatever its method: RFC 9113 §8.7.
            let answer = match (answer, &resend) {
                (Err(Attempt::Fail(e)), Some(saved)) if up.never_processed() => {
                    if let Some(saved) = saved {
                        self.out.clone_from(saved);
                    }
                    Err(Attempt::Retry(e))
                }
                (answer, _) => answer,
            };
            match answer {
                Ok((resp, sent)) => break (up, resp, sent),
                // A kept-alive connection the backend closed as the request crossed it
                // (its idle timeout, or a restart) says nothing of the endpoint: the
                // request goes to the same endpoint again on a new connection, spending
                // no retry and keeping its slot. Only what is safe to send twice comes
                // here (see `backend_failed`). Without this, a GET met one stale
                // connection on each of two workers in a burst and got a 502.
                Err(Attempt::Retry(e)) if reused && e != ProxyError::BackendHung => fresh = true,
                Err(attempt) => return attempt,
            }
        };
        let latency = self.account_response(head, slot, &resp, answered);
        self.outcome.upstream = Some(latency);
        if resp.switching {
            endpoint.stats().record_request_duration(latency);
            return self.tunnel(up, endpoint).await;
        }
        let long_lived = head.is_long_lived() || resp.event_stream;
        self.relay_response(up, &resp, slot, request_sent, long_lived)
            .await
    }

    /// Whether the request runs both ways at once (`duplex`): a gRPC call from an HTTP/2
    /// client to HTTP/2 backends, whose messages come when the app has them (a
    /// bidirectional call waits for a reply before it sends more). Its body is then
    /// neither read ahead before binding nor held to a minimum rate.
    pub(super) fn is_duplex(&self, head: &RequestHead) -> bool {
        head.grpc && head.http2 && head.body.is_some() && self.opts().backend_protocol.is_http2()
    }

    /// One try of a `duplex` request: the head opens the stream, then the body goes
    /// from the client's stream to the backend's while the response comes back. What
    /// the body sends is kept, up to `REQUEST_BUFFER`, in case the backend refuses the
    /// stream unprocessed (a server stopping for a deploy): it then goes again to
    /// another endpoint, from `self.reqbody`, the kept bytes first.
    async fn duplex(
        &mut self,
        head: &RequestHead,
        slot: &Slot,
        answered: &mut Option<Answered>,
    ) -> Attempt {
        let endpoint = slot.pick().endpoint();
        let (mut up, reused) = match self.upstream(slot, false).await {
            Ok(up) => up,
            Err(attempt) => return attempt,
        };
        let timeout = self.opts().timeouts.backend_write();
        let opened = body::write_all(&mut up, &self.out, timeout).await.is_ok();
        let (body, client) = match (&mut up, self.client.h2()) {
            (Upstream::H2(stream), Some(client)) if opened => (stream.take_body(), client.clone()),
            _ => {
                let retry = up.never_processed();
                return self.backend_failed(endpoint, reused, ProxyError::BackendClosed, retry);
            }
        };
        let Some(mut body) = body else {
            return self.backend_failed(endpoint, reused, ProxyError::BackendClosed, false);
        };
        let kept = Arc::new(Mutex::new(Some(std::mem::take(&mut self.reqbody))));
        let (done, refused) = {
            let pump = {
                let kept = Arc::clone(&kept);
                async move {
                    let again = kept.lock().ok().and_then(|k| k.clone()).unwrap_or_default();
                    let mut client = Kept {
                        inner: client,
                        kept,
                    };
                    let sent = match body.write_all(&again).await {
                        Ok(()) => tokio::io::copy(&mut client, &mut body).await.map(|_| ()),
                        Err(e) => Err(e),
                    };
                    if let Err(e) = sent {
                        debug!("a gRPC stream's request half ended early: {e}");
                    }
                }
            };
            let answer = async {
                let resp = match self
                    .final_response_head(&mut up, head, slot, reused, true)
                    .await
                {
                    Ok(resp) => resp,
                    Err(Attempt::Fail(e) | Attempt::Retry(e)) if up.never_processed() => {
                        return (Attempt::Retry(e), true);
                    }
                    // What the client sent has gone to this backend: never again.
                    Err(Attempt::Retry(e)) => return (Attempt::Fail(e), false),
                    Err(attempt) => return (attempt, false),
                };
                let latency = self.account_response(head, slot, &resp, answered);
                self.outcome.upstream = Some(latency);
                (
                    self.relay_response(up, &resp, slot, true, true).await,
                    false,
                )
            };
            tokio::pin!(pump, answer);
            let mut pumped = false;
            // The response decides: once it has ended (the call's status is in its
            // trailers), what the client still sends has no one to go to.
            loop {
                tokio::select! {
                    done = &mut answer => break done,
                    () = &mut pump, if !pumped => pumped = true,
                }
            }
        };
        let Attempt::Retry(e) = done else {
            return done;
        };
        match kept.lock().ok().and_then(|mut k| k.take()) {
            Some(sent) if refused => {
                self.reqbody = sent;
                Attempt::Retry(e)
            }
            _ => Attempt::Fail(e),
        }
    }

    /// A connection to the endpoint `slot` holds: an idle kept-alive one (unless `fresh`),
    /// or a new one; and whether it was reused.
    async fn upstream(&mut self, slot: &Slot, fresh: bool) -> Result<(Upstream, bool), Attempt> {
        if self.opts().backend_protocol.is_http2() {
            return self.h2_upstream(slot, fresh).await;
        }
        let endpoint = slot.pick().endpoint();
        let addr = endpoint.addr();
        let send_header = self.thread.shared.opts.send_proxy_protocol;
        // This client's own connection, never the thread's pool: a connection that
        // named one client to the backend must not carry another's requests.
        let kept = self.private_upstream.take();
        if !fresh {
            let reused = match (send_header, kept) {
                (Some(_), Some(kept))
                    if kept.0 == addr && kept.1.tcp().is_some_and(upstream::is_open) =>
                {
                    Some(kept.1)
                }
                (Some(_), _) => None,
                (None, _) => self.thread.upstreams.checkout(addr),
            };
            if let Some(stream) = reused {
                self.upstream_is_private = send_header.is_some();
                return Ok((stream, true));
            }
        }
        let shared = &self.thread.shared;
        let timeout = shared.opts.timeouts.connect;
        let header = send_header.map(|version| {
            let local = self.client.local_addr().unwrap_or(addr);
            (version, self.info.addr, local)
        });
        let tls = shared.opts.backend_tls.as_deref();
        let started = slot.pick().started();
        let (pool, stats) = (&shared.pool, &shared.stats);
        match upstream::connect_upstream(endpoint, pool, stats, timeout, started, header, tls).await
        {
            Ok(stream) => {
                self.upstream_is_private = send_header.is_some();
                Ok((stream, false))
            }
            Err(e) => Err(Attempt::Retry(e)),
        }
    }

    /// A new stream to the endpoint `slot` holds (`backend_protocol` h2c or h2): on
    /// the thread's connection to it (unless `fresh`), or on a new one, which is kept
    /// for the requests that follow; and whether the connection was there before.
    async fn h2_upstream(&mut self, slot: &Slot, fresh: bool) -> Result<(Upstream, bool), Attempt> {
        let endpoint = slot.pick().endpoint();
        let addr = endpoint.addr();
        let https = self.opts().backend_protocol == BackendProtocol::H2;
        let stream = |conn: &H2Conn| Upstream::H2(Box::new(conn.exchange(https, addr)));
        if !fresh {
            if let Some(conn) = self.thread.h2_upstreams.get(addr) {
                return Ok((stream(&conn), true));
            }
        }
        let shared = &self.thread.shared;
        let timeout = shared.opts.timeouts.connect;
        // Behind the endpoint's gate, within the connect timeout: the request that
        // opened the connection may have failed, and then this one tries.
        let gate = self.thread.h2_upstreams.connect_gate(addr);
        let Ok(_gate) = tokio::time::timeout(timeout, gate.lock()).await else {
            return Err(Attempt::Retry(ProxyError::ConnectFailed));
        };
        if !fresh {
            if let Some(conn) = self.thread.h2_upstreams.get(addr) {
                return Ok((stream(&conn), true));
            }
        }
        let tls = shared.opts.backend_tls.as_deref();
        let started = slot.pick().started();
        let (pool, stats) = (&shared.pool, &shared.stats);
        let io = upstream::connect_upstream(endpoint, pool, stats, timeout, started, None, tls)
            .await
            .map_err(Attempt::Retry)?;
        if let Upstream::Tls(tls) = &io {
            if tls.get_ref().1.alpn_protocol() != Some(b"h2") {
                // The backend speaks TLS but not HTTP/2 over it (it ignored ALPN; one
                // that refuses it ends the handshake): nothing was sent.
                let why = crate::backend_tls::Failure::NoAlpn;
                return Err(Attempt::Retry(upstream::tls_failed(
                    endpoint, pool, stats, why,
                )));
            }
        }
        match tokio::time::timeout(timeout, H2Conn::handshake(io)).await {
            Ok(Ok(conn)) => {
                self.thread.shared.stats.record_backend_http2_connection();
                self.thread.h2_upstreams.keep(addr, &conn);
                Ok((stream(&conn), false))
            }
            Ok(Err(e)) => {
                endpoint.stats().record_failure(Cause::ConnectFailed);
                warn!(endpoint = %addr, "HTTP/2 handshake with the backend failed: {e}");
                Err(Attempt::Retry(ProxyError::ConnectFailed))
            }
            Err(_) => {
                endpoint.stats().record_failure(Cause::ConnectFailed);
                Err(Attempt::Retry(ProxyError::ConnectFailed))
            }
        }
    }

    /// The request: head, the body read so far, then the rest streamed from the client
    /// while watching for an answer that comes before the body ends. `Ok(false)`: the
    /// backend answered before the body ended, and the rest is never sent.
    async fn send_request(
        &mut self,
        up: &mut Upstream,
        head: &RequestHead,
        endpoint: &Arc<Endpoint>,
        reused: bool,
        framer: &mut Framer,
        pace: Option<&mut BodyPace>,
    ) -> Result<bool, Attempt> {
        let timeouts = self.opts().timeouts;
        if head.body.is_none() {
            if body::write_all(up, &self.out, timeouts.backend_write())
                .await
                .is_err()
            {
                // Nothing reached the backend: safe to send elsewhere.
                return Err(self.backend_failed(endpoint, reused, ProxyError::BackendClosed, true));
            }
            return Ok(true);
        }
        self.out.extend_from_slice(&self.reqbody);
        let relayed = match up {
            Upstream::Plain(tcp) => {
                let (up_read, mut up_write) = tcp.split();
                let answered = async {
                    let _ = up_read.readable().await;
                };
                self.relay_request_body(framer, &mut up_write, pace, answered)
                    .await
            }
            // No early answer is watched for under TLS: the socket turning readable
            // says nothing there (a TLS 1.3 server sends its session tickets after the
            // handshake, as the body goes), and the stream cannot be split into a half
            // that writes and one that reads records. The body is sent whole, then the
            // answer read (a backend that answered early and stopped reading fails the
            // write, or the request timeout).
            Upstream::Tls(tls) => {
                self.relay_request_body(framer, tls.as_mut(), pace, std::future::pending())
                    .await
            }
            // An HTTP/2 stream sends the body whole, then reads the answer: its response
            // comes through the same stream, whose reading sends nothing.
            Upstream::H2(h2) => {
                self.relay_request_body(framer, h2.as_mut(), pace, std::future::pending())
                    .await
            }
        };
        match relayed {
            Ok(Relayed::Complete) => Ok(true),
            Ok(Relayed::Interrupted) => {
                // The rest is never sent: the backend connection cannot be reused.
                self.out.clear();
                Ok(false)
            }
            Err(BodyError::Write) => {
                Err(self.backend_failed(endpoint, reused, ProxyError::BackendClosed, false))
            }
            Err(BodyError::Stalled) => {
                self.endpoint_failed(endpoint, Cause::BackendTimeout);
                warn!(endpoint = %endpoint.addr(), "backend stopped reading the request body");
                Err(Attempt::Fail(ProxyError::Timeout))
            }
            Err(e) => {
                self.refuse_body(e).await;
                Err(Attempt::Abort)
            }
        }
    }

    /// The rest of the request body, from the client to `dst`, until it ends or
    /// `answered` (the backend spoke first).
    async fn relay_request_body<W: tokio::io::AsyncWrite + Unpin>(
        &mut self,
        framer: &mut Framer,
        dst: &mut W,
        pace: Option<&mut BodyPace>,
        answered: impl std::future::Future<Output = ()>,
    ) -> Result<Relayed, BodyError> {
        let timeouts = self.opts().timeouts;
        let ends = Ends {
            src: &mut self.client,
            pending: &mut self.cbuf,
            dst,
            out: &mut self.out,
            read_timeout: timeouts.client,
            write_timeout: timeouts.backend_write(),
            pace,
        };
        body::relay(framer, ends, REQUEST_BUFFER, true, answered, &mut 0).await
    }

    /// The response head after any 1xx, which go to the client as they come.
    async fn final_response_head(
        &mut self,
        up: &mut Upstream,
        head: &RequestHead,
        slot: &Slot,
        reused: bool,
        request_sent: bool,
    ) -> Result<ResponseHead, Attempt> {
        let endpoint = slot.pick().endpoint();
        self.ubuf.clear();
        let sticky_cookie = self
            .opts()
            .sticky_cookie
            .as_ref()
            .filter(|_| head.sticky.as_deref() != Some(endpoint.id()))
            .map(|name| format!("{name}={}; Path=/; HttpOnly", endpoint.id()));
        let ex = Exchange {
            is_head: head.is_head,
            http10_client: head.http10,
            client_keep_alive: head.keep_alive && request_sent,
            upgrade: head.upgrade,
        };
        let client_timeout = self.opts().timeouts.client;
        let long_lived = head.is_long_lived();
        // What may be sent twice, until a byte of an answer comes (a 1xx included).
        let mut may_go_again = head.idempotent && head.body.is_none();
        loop {
            let resp = match self
                .read_response_head(
                    up,
                    &ex,
                    sticky_cookie.as_deref(),
                    slot.pick(),
                    long_lived,
                    may_go_again,
                )
                .await
            {
                Ok(resp) => resp,
                Err(ReadHead::Closed { got_bytes }) => {
                    if let Some(why) = up.tls_failure() {
                        // The server refused the session (its client certificate
                        // check): the request never reached the application.
                        let shared = &self.thread.shared;
                        let failed =
                            upstream::tls_failed(endpoint, &shared.pool, &shared.stats, why);
                        return Err(Attempt::Retry(failed));
                    }
                    let sent = slot.pick().started();
                    // Every request a worker killed as hung held says when it was
                    // sent, whether it may go again or not (a POST that loops is the
                    // oldest as much as a GET); the one it hung on (`after_drop`)
                    // fails. A stream's answer (an event stream) waits for news, and
                    // so does not hang its worker: it is no suspect.
                    let held = !long_lived && !up.never_processed();
                    if held && endpoint.worker_life() == Some(WorkerLife::Hung) {
                        endpoint.held_when_hung(sent);
                    }
                    let retry = !got_bytes && head.idempotent && head.body.is_none();
                    // A stream the backend refused unprocessed (its GOAWAY) was not
                    // dropped: it goes again (`attempt`) whatever the backend's state.
                    if retry && !up.never_processed() {
                        if let Err(e) = self.after_drop(endpoint, sent, reused).await {
                            return Err(self.backend_failed(endpoint, reused, e, false));
                        }
                    }
                    return Err(self.backend_failed(
                        endpoint,
                        reused,
                        ProxyError::BackendClosed,
                        retry,
                    ));
                }
                Err(ReadHead::Timeout) => {
                    self.endpoint_failed(endpoint, Cause::BackendTimeout);
                    return Err(Attempt::Fail(ProxyError::Timeout));
                }
                Err(ReadHead::Hung) => {
                    // A worker found hung is killed (`drover run`): the request that
                    // leaves it may be what hung it, as one a worker dropped may be
                    // what ended it, so it counts as a drop. A backend drover does not
                    // run is left alone, and the request may hang no other.
                    let last = endpoint.worker_life().is_some() && self.count_drop().is_err();
                    let e = ProxyError::BackendHung;
                    return Err(self.backend_failed(endpoint, reused, e, !last));
                }
                Err(ReadHead::ClientLeft) => {
                    debug!(client = %self.info.ip, "client left before the answer it waited for began");
                    // Counted and logged as nginx's 499: the backend had the request,
                    // and an operator looking for it finds it.
                    self.outcome.status = CLIENT_CLOSED_REQUEST;
                    self.outcome.error = Some("client-closed-request");
                    return Err(Attempt::Abort);
                }
                Err(ReadHead::Bad(why)) => {
                    self.endpoint_failed(endpoint, Cause::BadResponse);
                    warn!(endpoint = %endpoint.addr(), "invalid response: {why}");
                    return Err(Attempt::Fail(ProxyError::BadResponse(why)));
                }
            };
            if !resp.informational {
                return Ok(resp);
            }
            if !self.out.is_empty()
                && body::write_all(&mut self.client, &self.out, client_timeout)
                    .await
                    .is_err()
            {
                return Err(Attempt::Abort);
            }
            may_go_again = false;
            self.ubuf.drain(..resp.head_len);
        }
    }

    /// The response body, read up to the buffer ahead of the client: a response that
    /// fits frees the backend at once, however slowly the client reads it. The
    /// connection goes back to the idle pool when it can carry another request.
    async fn relay_response(
        &mut self,
        mut up: Upstream,
        resp: &ResponseHead,
        slot: &Slot,
        request_sent: bool,
        long_lived: bool,
    ) -> Attempt {
        let timeouts = self.opts().timeouts;
        let endpoint = slot.pick().endpoint();
        let mut framer = Framer::new(resp.body, resp.dechunk);
        // `out` holds the response head the relay writes first.
        self.outcome.head_bytes += self.out.len() as u64;
        let mut written = 0;
        let sent = loop {
            // A long-lived answer from a worker told to stop ends when its supervisor
            // says (`Endpoint::cut_streams`); the client's EventSource comes back.
            let cut = async {
                if long_lived {
                    endpoint.streams_cut().await;
                } else {
                    std::future::pending().await
                }
            };
            let ends = Ends {
                src: &mut up,
                pending: &mut self.ubuf,
                dst: &mut self.client,
                out: &mut self.out,
                read_timeout: timeouts.quiet_backend(long_lived),
                write_timeout: timeouts.client,
                pace: None,
            };
            let sent =
                body::relay(&mut framer, ends, RESPONSE_BUFFER, false, cut, &mut written).await;
            match sent {
                // A quiet gap in a long-lived answer is the app's (an event stream with
                // no news): it goes on for as long as the client waits for it.
                Err(BodyError::Timeout) if timeouts.waits_while_client_stays(long_lived) => {
                    if self.client.has_left() {
                        debug!(client = %self.info.ip, "client left a quiet long-lived answer");
                        // As a write to a client that has gone would end it.
                        break Err(BodyError::Write);
                    }
                }
                sent => break sent,
            }
        };
        self.outcome.bytes += written;
        endpoint
            .stats()
            .record_request_duration(clock::now().saturating_sub(slot.pick().started()));
        match sent {
            Ok(Relayed::Interrupted) => {
                debug!(endpoint = %endpoint.addr(), "a stream from a stopping worker ended");
                Attempt::Abort
            }
            Ok(Relayed::Complete) => {
                // An HTTP/2 stream is done; its connection stays with the thread's.
                let reusable = !matches!(up, Upstream::H2(_)) && !endpoint.is_retiring();
                if reusable && resp.backend_keep_alive && request_sent && self.ubuf.is_empty() {
                    if self.upstream_is_private {
                        self.private_upstream = Some(Box::new((endpoint.addr(), up)));
                    } else {
                        self.thread
                            .upstreams
                            .checkin(endpoint.addr(), up, resp.keep_alive_timeout);
                    }
                }
                Attempt::Done(resp.client_keep_alive)
            }
            Err(BodyError::Write) => Attempt::Abort,
            Err(BodyError::Stalled) => {
                debug!(client = %self.info.ip, "client stopped reading the response: cut off");
                Attempt::Abort
            }
            Err(e) => {
                if let Some(held_back) = MID_STREAM_FAILURES.check_now() {
                    warn!(endpoint = %endpoint.addr(), held_back, "response body failed mid-stream: {e:?}");
                }
                Attempt::Abort
            }
        }
    }

    /// Waits for the response head. One that `may_go_again` looks at its endpoint every
    /// `LOOK_AT_ENDPOINT` while nothing comes: found hung, it leaves (`ReadHead::Hung`).
    async fn read_response_head(
        &mut self,
        up: &mut Upstream,
        ex: &Exchange,
        set_cookie: Option<&str>,
        pick: &Pick,
        long_lived: bool,
        may_go_again: bool,
    ) -> Result<ResponseHead, ReadHead> {
        let timeouts = self.opts().timeouts;
        let timeout = timeouts.quiet_backend(long_lived);
        let waits = timeouts.waits_while_client_stays(long_lived);
        // Watching the client costs a syscall (a peek) per request, and most answers
        // come well within a second: so an answer is waited on for that long first.
        // Then every request watches: a client that gave up on a slow report closes
        // its backend connection at once, as nginx closes its upstream's, and the app
        // sees it go (`req.on('close')`) instead of working on for nobody.
        let mut watch_client = false;
        // How long the backend has been quiet in the current wait, cut into looks.
        let mut quiet_for = Duration::ZERO;
        // The part of the current quiet spell waited before watching began: it counts
        // toward the timeout of an answer that does not wait while its client stays.
        let mut unwatched = Duration::ZERO;
        loop {
            if !self.ubuf.is_empty() {
                // Shutdown may have begun while the backend worked, or clients may
                // wait for a descriptor this connection holds: then this response
                // tells the client to close.
                let ex = Exchange {
                    client_keep_alive: ex.client_keep_alive
                        && !*self.shutdown.borrow()
                        && !ClientConnection::crowded(),
                    ..*ex
                };
                match response::parse(
                    &self.ubuf,
                    &ex,
                    set_cookie.map(str::as_bytes),
                    &mut self.out,
                ) {
                    Ok(Some(head)) => return Ok(head),
                    Ok(None) => {}
                    Err(bad) => return Err(ReadHead::Bad(bad.0)),
                }
            }
            let quiet = if !watch_client {
                timeout.min(WATCH_CLIENT_AFTER)
            } else if waits {
                timeout
            } else {
                timeout.saturating_sub(unwatched)
            };
            let mut look = quiet.saturating_sub(quiet_for);
            if may_go_again {
                look = look.min(LOOK_AT_ENDPOINT);
            }
            let read = body::read_some(up, &mut self.ubuf, look);
            let read = if watch_client {
                tokio::select! {
                    biased;
                    read = read => read,
                    () = self.client.left() => return Err(ReadHead::ClientLeft),
                }
            } else {
                read.await
            };
            match read {
                Ok(0)
                | Err(
                    BodyError::Read
                    | BodyError::Write
                    | BodyError::Stalled
                    | BodyError::TooSlow
                    | BodyError::TooLarge
                    | BodyError::Framing(_),
                ) => {
                    return Err(ReadHead::Closed {
                        got_bytes: !self.ubuf.is_empty(),
                    })
                }
                Ok(_) => {
                    quiet_for = Duration::ZERO;
                    unwatched = Duration::ZERO;
                }
                Err(BodyError::Timeout) => {
                    if may_go_again && self.ubuf.is_empty() && pick.endpoint().is_hung() {
                        return Err(ReadHead::Hung);
                    }
                    quiet_for += look;
                    if quiet_for < quiet {
                        continue;
                    }
                    quiet_for = Duration::ZERO;
                    if !watch_client && quiet < timeout {
                        watch_client = true;
                        unwatched = quiet;
                    } else if !waits {
                        return Err(ReadHead::Timeout);
                    } else if self.client.has_left() {
                        return Err(ReadHead::ClientLeft);
                    } else {
                        // Past a quiet interval with its client still there, the answer
                        // waits for news (an event stream, a long-poll): the app is not
                        // working on it, or the worker's CPU says so. Still pending, an
                        // endless loop's request would keep an `h2c` worker "busy"
                        // (`works_on_a_batch`).
                        watch_client = true;
                        pick.stop_pending();
                    }
                }
            }
        }
    }

    /// After a 101: relay bytes both ways until either side closes.
    async fn tunnel(&mut self, mut up: Upstream, endpoint: &Endpoint) -> Attempt {
        self.out.extend_from_slice(&self.ubuf);
        self.ubuf.clear();
        let client_timeout = self.opts().timeouts.client;
        if body::write_all(&mut self.client, &self.out, client_timeout)
            .await
            .is_err()
        {
            return Attempt::Abort;
        }
        self.outcome.bytes += self.out.len() as u64;
        self.outcome.head_bytes += self.out.len() as u64;
        self.out.clear();
        if !self.cbuf.is_empty() {
            if up.write_all(&self.cbuf).await.is_err() {
                return Attempt::Abort;
            }
            self.cbuf.clear();
        }
        // The connection's HTTP buffers are done with: a WebSocket may stay for days.
        for buf in [
            &mut self.cbuf,
            &mut self.ubuf,
            &mut self.out,
            &mut self.reqbody,
        ] {
            *buf = Vec::new();
        }
        let stats = endpoint.stats();
        let relayed = crate::tcp::tunnel(&mut self.client, &mut up, || stats.record_tunnel_read());
        self.outcome.bytes += tokio::select! {
            sent = relayed => sent,
            // Its worker was told to stop, and waits for its connections to end.
            () = endpoint.streams_cut() => 0,
        };
        Attempt::Done(false)
    }
}

/// How long an answer is waited on before drover starts watching for its client to
/// leave.
const WATCH_CLIENT_AFTER: Duration = Duration::from_secs(1);

/// Warnings about responses cut mid-body, at most one a second with the count of those
/// it stands for: a worker stopped with 50 event streams open wrote 50 lines within
/// 3 ms (10,000 streams, 10,000 lines), where other failures write one line a second.
static MID_STREAM_FAILURES: drover_registry::WarnLimit =
    drover_registry::WarnLimit::new(Duration::from_secs(1));

/// How often a request that may go again, waiting for an answer, looks whether its
/// endpoint was found hung. Active checks take a second or more to find it so.
const LOOK_AT_ENDPOINT: Duration = Duration::from_secs(1);

enum ReadHead {
    Closed {
        got_bytes: bool,
    },
    Timeout,
    /// The client of a long-lived exchange left while its backend was quiet: no fault
    /// of the backend's.
    ClientLeft,
    /// Its endpoint was found hung (`Endpoint::is_hung`) while nothing came: a request
    /// that may go again leaves it.
    Hung,
    Bad(&'static str),
}

/// A `duplex` request's client stream, keeping what is read of it in `kept` until that
/// passes `REQUEST_BUFFER` (then `None`: the body can no longer go again).
struct Kept<R> {
    inner: R,
    kept: Arc<Mutex<Option<Vec<u8>>>>,
}

impl<R: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Kept<R> {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let read = std::pin::Pin::new(&mut this.inner).poll_read(cx, buf);
        if let std::task::Poll::Ready(Ok(())) = read {
            let new = &buf.filled()[before..];
            if let Ok(mut kept) = this.kept.lock() {
                let fits = kept
                    .as_ref()
                    .is_some_and(|k| k.len() + new.len() <= REQUEST_BUFFER);
                match kept.as_mut() {
                    Some(k) if fits => k.extend_from_slice(new),
                    _ => *kept = None,
                }
            }
        }
        read
    }
}
