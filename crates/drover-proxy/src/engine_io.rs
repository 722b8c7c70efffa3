//! socket.io sessions stay on the endpoint that holds them, under any strategy.
//!
//! socket.io (through engine.io, its transport) keeps each session in the process that
//! answered its handshake. Over long-polling, a session is a series of requests (a GET
//! held open, POSTs beside it), each naming the session in its query
//! (`/socket.io/?EIO=4&transport=polling&sid=…`), and any that reaches another process
//! is answered `400 Session ID unknown`. Node's cluster module and PM2 place
//! connections by turn, so a socket.io app run as written fails under them; socket.io's
//! guide has the app's primary parse the query itself (@socket.io/sticky). drover reads
//! the session id from the handshake's answer (`0{"sid":"…",…}`, in the bytes that
//! came with its head) and sends each later request naming it to the same endpoint
//! (`drover_balance::strategy::pinned`), while that endpoint is up.
//!
//! A session's pin lasts while the session makes requests: it is dropped once idle for
//! `IDLE` (engine.io's client polls at least every ping interval, 25 s by default; a
//! session that upgraded to a WebSocket makes no more requests, and its socket stays
//! where it is). The table holds at most `MAX_SESSIONS`: past that, the longest idle
//! pin goes first.

use drover_balance::Nanos;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard};

/// A pin unused for this long (2 minutes) is dropped.
const IDLE: Nanos = 120_000_000_000;

/// At most this many pins (about 100 bytes each).
const MAX_SESSIONS: usize = 65_536;

/// The longest session id taken (engine.io's are 20 characters).
const MAX_SID: usize = 64;

/// What an engine.io request is, by its target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum EngineIo {
    /// A new session over long-polling: its answer names the session.
    Handshake,
    /// A request of the session it names.
    Session(Box<str>),
    /// A new session that starts as a WebSocket: one connection, nothing to pin.
    WebSocket,
}

impl EngineIo {
    /// What `target` is, if it is an engine.io request: a query with `EIO=`.
    pub(crate) fn of_target(target: &str) -> Option<EngineIo> {
        let (_, query) = target.split_once('?')?;
        let (mut eio, mut sid, mut websocket) = (false, None, false);
        for pair in query.split('&') {
            match pair.split_once('=') {
                Some(("EIO", _)) => eio = true,
                Some(("sid", v)) => sid = Some(v),
                Some(("transport", v)) => websocket = v == "websocket",
                _ => {}
            }
        }
        if !eio {
            return None;
        }
        Some(match sid {
            Some(sid) if is_sid(sid) => EngineIo::Session(sid.into()),
            // A malformed id is engine.io's to refuse, wherever it goes.
            Some(_) => return None,
            None if websocket => EngineIo::WebSocket,
            None => EngineIo::Handshake,
        })
    }

    pub(crate) fn sid(&self) -> Option<&str> {
        match self {
            EngineIo::Session(sid) => Some(sid),
            _ => None,
        }
    }
}

/// The session id a handshake's answer names: `"sid":"…"` in its first bytes (engine.io
/// 4 answers `0{"sid":"…",…}`; engine.io 3, `96:0{"sid":"…",…}`).
pub(crate) fn sid_in_handshake(body: &[u8]) -> Option<&str> {
    const KEY: &[u8] = b"\"sid\":\"";
    let at = body.windows(KEY.len()).position(|w| w == KEY)? + KEY.len();
    let rest = &body[at..];
    let end = rest.iter().take(MAX_SID + 1).position(|&b| b == b'"')?;
    let sid = std::str::from_utf8(&rest[..end]).ok()?;
    is_sid(sid).then_some(sid)
}

/// engine.io's ids are base64url (with `-` and `_`); nothing else is taken as one, so an
/// id never needs decoding to match its query's.
fn is_sid(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_SID
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// Which endpoint holds each session of one balancer (kept across reloads), and whether
/// its clients speak engine.io at all.
#[derive(Debug, Default)]
pub(crate) struct Sessions {
    held: Mutex<HashMap<Box<str>, Held>>,
    /// Set at the first engine.io request: connections are then no longer handed to
    /// workers (see `handoff`), as a session's requests must all pass drover.
    seen: AtomicBool,
}

#[derive(Debug)]
struct Held {
    endpoint: Box<str>,
    used: Nanos,
}

impl Sessions {
    /// Notes an engine.io request; true the first time.
    pub(crate) fn saw_one(&self) -> bool {
        !self.seen.load(Relaxed) && !self.seen.swap(true, Relaxed)
    }

    pub(crate) fn seen(&self) -> bool {
        self.seen.load(Relaxed)
    }

    /// The session `sid` lives on the endpoint with id `endpoint`.
    pub(crate) fn pin(&self, sid: &str, endpoint: &str, now: Nanos) {
        let mut held = self.lock();
        if held.len() >= MAX_SESSIONS && !held.contains_key(sid) {
            held.retain(|_, h| now.saturating_sub(h.used) < IDLE);
            if held.len() >= MAX_SESSIONS {
                let oldest = held
                    .iter()
                    .min_by_key(|(_, h)| h.used)
                    .map(|(sid, _)| sid.clone());
                if let Some(oldest) = oldest {
                    held.remove(&oldest);
                }
            }
        }
        held.insert(
            sid.into(),
            Held {
                endpoint: endpoint.into(),
                used: now,
            },
        );
    }

    /// The id of the endpoint that holds session `sid`, if drover saw its handshake and
    /// it has not idled out.
    pub(crate) fn endpoint_of(&self, sid: &str, now: Nanos) -> Option<Box<str>> {
        let mut held = self.lock();
        let h = held.get_mut(sid)?;
        if now.saturating_sub(h.used) >= IDLE {
            held.remove(sid);
            return None;
        }
        h.used = now;
        Some(h.endpoint.clone())
    }

    /// How many sessions each endpoint (by id) holds, of those used within `IDLE`. A
    /// scrape's count: the table stays locked for one pass with no allocation per
    /// session (a socket.io request waits on the same lock), and is not touched at all
    /// by a balancer that never saw socket.io.
    pub(crate) fn held_by_endpoint(&self, now: Nanos) -> HashMap<Box<str>, u64> {
        if !self.seen() {
            return HashMap::new();
        }
        let held = self.lock();
        let mut by_endpoint: HashMap<&str, u64> = HashMap::new();
        for h in held.values() {
            if now.saturating_sub(h.used) < IDLE {
                *by_endpoint.entry(&h.endpoint).or_insert(0) += 1;
            }
        }
        by_endpoint
            .into_iter()
            .map(|(e, n)| (e.into(), n))
            .collect()
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<Box<str>, Held>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_are_read_as_handshakes_sessions_or_nothing() {
        use EngineIo::*;
        let of = EngineIo::of_target;
        assert_eq!(
            of("/socket.io/?EIO=4&transport=polling&t=PxQ1"),
            Some(Handshake)
        );
        assert_eq!(
            of("/socket.io/?EIO=4&transport=polling&t=PxQ&sid=Ab-9_z"),
            Some(Session("Ab-9_z".into()))
        );
        assert_eq!(
            of("/chat/?sid=Zz1&EIO=3&transport=websocket"),
            Some(Session("Zz1".into()))
        );
        assert_eq!(of("/socket.io/?EIO=4&transport=websocket"), Some(WebSocket));
        assert_eq!(of("/socket.io/?transport=polling&sid=abc"), None);
        assert_eq!(of("/socket.io/"), None);
        assert_eq!(of("/?EIOX=4"), None);
        assert_eq!(of("/socket.io/?EIO=4&sid=a%2Fb"), None);
        assert_eq!(of(&format!("/?EIO=4&sid={}", "a".repeat(65))), None);
    }

    #[test]
    fn the_handshakes_answer_names_the_session() {
        let v4 =
            br#"0{"sid":"lv_VI97HAXpY6yYWAAAC","upgrades":["websocket"],"pingInterval":25000}"#;
        assert_eq!(sid_in_handshake(v4), Some("lv_VI97HAXpY6yYWAAAC"));
        let v3 = br#"96:0{"sid":"Xy-1","upgrades":[],"pingInterval":25000,"pingTimeout":5000}2:40"#;
        assert_eq!(sid_in_handshake(v3), Some("Xy-1"));
        assert_eq!(sid_in_handshake(b"0{\"sid\":\"unterminated"), None);
        assert_eq!(sid_in_handshake(b"0{\"sid\":\"a b\"}"), None);
        assert_eq!(sid_in_handshake(b"{\"code\":1}"), None);
        assert_eq!(sid_in_handshake(b""), None);
    }

    #[test]
    fn a_pin_lasts_while_used_and_idles_out() {
        let s = Sessions::default();
        s.pin("a", "ep1", 0);
        assert_eq!(s.endpoint_of("a", IDLE - 1).as_deref(), Some("ep1"));
        // Used just now: it lasts another IDLE.
        assert_eq!(s.endpoint_of("a", 2 * IDLE - 2).as_deref(), Some("ep1"));
        assert_eq!(s.endpoint_of("a", 3 * IDLE), None);
        assert_eq!(s.endpoint_of("a", 3 * IDLE), None);
        assert_eq!(s.endpoint_of("b", 0), None);
    }

    #[test]
    fn sessions_are_counted_by_endpoint_until_they_idle_out() {
        let s = Sessions::default();
        s.pin("a", "ep1", 0);
        s.pin("b", "ep1", 10);
        s.pin("c", "ep2", IDLE);
        assert!(
            s.held_by_endpoint(0).is_empty(),
            "no socket.io request seen yet"
        );
        assert!(s.saw_one());
        let counts = |now| {
            let mut v: Vec<_> = s.held_by_endpoint(now).into_iter().collect();
            v.sort();
            v
        };
        assert_eq!(counts(IDLE - 1), [("ep1".into(), 2), ("ep2".into(), 1)]);
        // "a" idled out; "b" just did not.
        assert_eq!(counts(IDLE), [("ep1".into(), 1), ("ep2".into(), 1)]);
        assert_eq!(counts(3 * IDLE), []);
    }

    #[test]
    fn a_full_table_drops_idle_pins_then_the_longest_idle() {
        let s = Sessions::default();
        for i in 0..MAX_SESSIONS {
            s.pin(&format!("s{i}"), "ep", i as Nanos);
        }
        s.pin("new", "ep2", MAX_SESSIONS as Nanos);
        assert_eq!(s.lock().len(), MAX_SESSIONS);
        assert_eq!(s.endpoint_of("s0", MAX_SESSIONS as Nanos), None);
        assert!(s.endpoint_of("s1", MAX_SESSIONS as Nanos).is_some());
        assert_eq!(
            s.endpoint_of("new", MAX_SESSIONS as Nanos).as_deref(),
            Some("ep2")
        );
        // Past IDLE, the idle ones go together.
        s.pin("later", "ep3", IDLE + MAX_SESSIONS as Nanos);
        assert!(s.lock().len() < 10);
    }

    #[test]
    fn the_first_engine_io_request_is_told_once() {
        let s = Sessions::default();
        assert!(!s.seen());
        assert!(s.saw_one());
        assert!(!s.saw_one());
        assert!(s.seen());
    }
}
