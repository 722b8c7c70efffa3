//! Harnesses for the HTTP/1 framing code and the PROXY protocol header, shared by the `cargo fuzz` targets in `fuzz/`
//! and by `tests/fuzz_corpus.rs`, which replays the committed corpus on stable Rust.
//!
//! Not an API: each function takes arbitrary bytes and panics when a property drover
//! relies on to stop request smuggling does not hold. They call the parsers through
//! [`crate::http1`], which is public already; this module adds nothing else.

use crate::http1::chunked::ChunkedScanner;
use crate::http1::forward::ClientInfo;
use crate::http1::headers::{self, is};
use crate::http1::keys::KeySpec;
use crate::http1::request::{self, Parsed, RequestHead};
use crate::http1::response::{self, Exchange};
use crate::http1::{find_bare_lf, BodyKind};
use crate::options::{HashKey, Limits};

/// Small limits, so that inputs of a few KiB reach the 414/431 paths too.
const LIMITS: Limits = Limits {
    max_header_bytes: 2048,
    max_uri_bytes: 512,
    max_headers: 24,
    max_body_bytes: None,
};

/// Slots for re-parsing a head drover wrote: its input's fields plus the few it adds.
const SLOTS: usize = crate::http1::HEADER_SLOTS + 16;

fn client() -> ClientInfo {
    ClientInfo::new(
        ([192, 0, 2, 1], 4321).into(),
        ([192, 0, 2, 2], 80).into(),
        "http",
    )
}

fn keys() -> KeySpec {
    KeySpec {
        hash: Some(HashKey::Header("x-key".into())),
        sticky_cookie: Some("s".into()),
    }
}

fn parse_request(data: &[u8], out: &mut Vec<u8>) -> Option<RequestHead> {
    match request::parse(data, &LIMITS, &client(), &keys(), None, out) {
        Ok(Parsed::Complete(head)) => Some(head),
        Ok(Parsed::Partial) | Err(_) => None,
    }
}

/// The body framing a head declares, read the plain RFC 9112 §6.3 way from parsed
/// fields; `None` when no single answer exists (both fields, conflicting lengths, a
/// length that is not a number, a transfer coding that does not end in chunked).
fn declared_framing(fields: &[httparse::Header<'_>]) -> Option<Option<BodyKind>> {
    let te: Vec<&[u8]> = fields
        .iter()
        .filter(|h| is(h.name, "transfer-encoding"))
        .map(|h| h.value)
        .collect();
    let cl: Vec<&[u8]> = fields
        .iter()
        .filter(|h| is(h.name, "content-length"))
        .map(|h| h.value)
        .collect();
    if !te.is_empty() {
        let list = te.join(&b","[..]);
        return (cl.is_empty() && headers::ends_with_chunked(&list))
            .then_some(Some(BodyKind::Chunked));
    }
    let mut len = None;
    for v in cl {
        let v = v.trim_ascii();
        if v.is_empty() || v.len() > 19 || !v.iter().all(u8::is_ascii_digit) {
            return None;
        }
        let n: u64 = std::str::from_utf8(v).ok()?.parse().ok()?;
        if len.is_some_and(|m| m != n) {
            return None;
        }
        len = Some(n);
    }
    Some(len.filter(|&n| n > 0).map(BodyKind::Length))
}

/// Re-parses a request head drover wrote for a backend and checks that it is one
/// well-formed head that frames the body as drover did.
fn check_forwarded_request<'b>(
    out: &'b [u8],
    head: &RequestHead,
    slots: &'b mut [httparse::Header<'b>],
) -> httparse::Request<'b, 'b> {
    assert_eq!(find_bare_lf(out), None, "bare LF in the forwarded head");
    let mut fwd = httparse::Request::new(slots);
    assert_eq!(
        fwd.parse(out),
        Ok(httparse::Status::Complete(out.len())),
        "the forwarded head is not one complete head"
    );
    assert_eq!(fwd.version, Some(1));
    assert_eq!(
        declared_framing(fwd.headers),
        Some(head.body),
        "the backend would frame the body differently"
    );
    fwd
}

/// Request heads: no panic; an accepted head is forwarded as one well-formed head that
/// frames the body the way drover does, and bytes after the head do not change it.
pub fn request(data: &[u8]) {
    let mut out = Vec::new();
    let Some(head) = parse_request(data, &mut out) else {
        return;
    };
    assert!(head.head_len <= data.len());
    let mut slots = [httparse::EMPTY_HEADER; SLOTS];
    check_forwarded_request(&out, &head, &mut slots);
    let mut again = Vec::new();
    let alone =
        parse_request(&data[..head.head_len], &mut again).expect("the head alone was not accepted");
    assert_eq!(format!("{alone:?}"), format!("{head:?}"));
}

/// Differential against httparse for request heads, where it defines the answer.
///
/// When drover accepts a head, httparse must parse the same bytes as a complete head
/// of the same length, and what drover forwards must have the same method, target and
/// version, every end-to-end field of the input in order and unchanged, and the body
/// framing RFC 9112 §6.3 gives for the fields httparse found.
///
/// Intended divergences, where drover refuses what httparse accepts (stricter on
/// purpose, so nothing ambiguous reaches a backend): bare LF line ends; `Content-Length`
/// with `Transfer-Encoding`; a duplicate `Content-Length` even with equal values; more
/// than one `Transfer-Encoding`, `Host`, `X-Forwarded-For` or `Forwarded` field; a
/// `Transfer-Encoding` not ending in `chunked`, or in an HTTP/1.0 request; a missing
/// `Host` in HTTP/1.1; `CONNECT`; an `Expect` other than `100-continue`; an Upgrade
/// request with a body; a `Connection` listing `Content-Length`, `Transfer-Encoding` or
/// `Host`; and the size limits (414, 431). Where httparse refuses a head,
/// drover must refuse it too.
pub fn request_vs_httparse(data: &[u8]) {
    let mut out = Vec::new();
    let drover = request::parse(data, &LIMITS, &client(), &keys(), None, &mut out);
    let mut slots = [httparse::EMPTY_HEADER; SLOTS];
    let mut theirs = httparse::Request::new(&mut slots);
    let verdict = theirs.parse(data);
    let head = match drover {
        Ok(Parsed::Complete(head)) => head,
        Ok(Parsed::Partial) => {
            assert!(
                matches!(verdict, Ok(httparse::Status::Partial)),
                "drover waits for more of a head httparse finished: {verdict:?}"
            );
            return;
        }
        Err(_) => return,
    };
    assert_eq!(verdict, Ok(httparse::Status::Complete(head.head_len)));
    assert_eq!(theirs.version == Some(0), head.http10);
    assert_eq!(
        declared_framing(theirs.headers),
        Some(head.body),
        "drover framed the body differently from RFC 9112"
    );

    let mut fwd_slots = [httparse::EMPTY_HEADER; SLOTS];
    let fwd = check_forwarded_request(&out, &head, &mut fwd_slots);
    assert_eq!(fwd.method, theirs.method);
    // An absolute-form target goes on in origin form, with its authority as the Host.
    let target = theirs.path.unwrap_or("");
    let absolute = !target.starts_with('/') && target != "*";
    if absolute {
        let rest = &target[target.find("://").expect("not an absolute URI") + 3..];
        let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
        let tail = &rest[authority.len()..];
        let tail = &tail[..tail.find('#').unwrap_or(tail.len())];
        let origin = match tail.chars().next() {
            Some('/') => tail.to_owned(),
            _ => format!("/{tail}"),
        };
        assert_eq!(
            fwd.path,
            Some(origin.as_str()),
            "not {target}'s origin form"
        );
        let hosts: Vec<&[u8]> = fwd
            .headers
            .iter()
            .filter(|h| is(h.name, "host"))
            .map(|h| h.value)
            .collect();
        assert_eq!(
            hosts,
            [authority.as_bytes()],
            "the Host is not the target's"
        );
    } else {
        assert_eq!(fwd.path, theirs.path);
    }

    // Fields that describe this hop (RFC 9110 §7.6.1) or that drover rewrites, written
    // out here again rather than taken from drover. `close`, `keep-alive` and `upgrade`
    // in `Connection` are options, not field names; a field literally named `Close` is
    // not compared (drover drops it only when other names are listed too: harmless).
    let listed: Vec<&[u8]> = theirs
        .headers
        .iter()
        .filter(|h| is(h.name, "connection"))
        .flat_map(|h| headers::tokens(h.value))
        .filter(|t| {
            !(t.eq_ignore_ascii_case(b"close")
                || t.eq_ignore_ascii_case(b"keep-alive")
                || t.eq_ignore_ascii_case(b"upgrade"))
        })
        .collect();
    let dropped = |name: &str| {
        [
            "connection",
            "keep-alive",
            "proxy-connection",
            "te",
            "trailer",
            "expect",
            "x-forwarded-for",
            "x-forwarded-proto",
            "x-forwarded-host",
            "forwarded",
        ]
        .iter()
        .any(|d| is(name, d))
            || (is(name, "upgrade") && !head.upgrade)
            || listed
                .iter()
                .any(|t| t.eq_ignore_ascii_case(name.as_bytes()))
    };
    let kept: Vec<(&str, &[u8])> = theirs
        .headers
        .iter()
        .filter(|h| !dropped(h.name) && !is(h.name, "close"))
        .filter(|h| !(absolute && is(h.name, "host")))
        .map(|h| (h.name, h.value))
        .collect();
    let sent: Vec<(&str, &[u8])> = fwd
        .headers
        .iter()
        .filter(|h| !is(h.name, "close"))
        .map(|h| (h.name, h.value))
        .collect();
    assert!(sent.len() >= kept.len(), "fields were lost");
    assert_eq!(&sent[..kept.len()], &kept[..], "fields were changed");
    for (name, _) in &sent[kept.len()..] {
        assert!(
            [
                "x-forwarded-for",
                "x-forwarded-proto",
                "x-forwarded-host",
                "forwarded",
                "x-request-id",
                "connection",
            ]
            .iter()
            .any(|a| is(name, a))
                // An HTTP/1.0 request without one goes on as HTTP/1.1, which needs one;
                // an absolute-form target's authority replaces the client's.
                || (is(name, "host")
                    && (absolute || !theirs.headers.iter().any(|h| is(h.name, "host")))),
            "drover added {name}"
        );
    }
}

/// Response heads: no panic; an accepted head is sent to the client as one head that
/// passes drover's own checks, carries the parsed status, no load report, and frames
/// the body as the client will read it. The first input byte picks the exchange.
pub fn response(data: &[u8]) {
    let Some((&flags, buf)) = data.split_first() else {
        return;
    };
    let ex = Exchange {
        is_head: flags & 1 != 0,
        http10_client: flags & 2 != 0,
        client_keep_alive: flags & 4 != 0,
        upgrade: flags & 8 != 0,
    };
    let cookie = (flags & 16 != 0).then_some(&b"s=e1; Path=/; HttpOnly"[..]);
    let mut out = Vec::new();
    let Ok(Some(head)) = response::parse(buf, &ex, cookie, &mut out) else {
        return;
    };
    assert!(head.head_len <= buf.len());
    assert!((100..=599).contains(&head.status));
    if out.is_empty() {
        assert!(head.informational && ex.http10_client);
        return;
    }
    let mut slots = vec![httparse::EMPTY_HEADER; crate::http1::FIELDS_NODE_KEEPS + 16];
    let mut sent = httparse::Response::new(&mut slots);
    assert_eq!(sent.parse(&out), Ok(httparse::Status::Complete(out.len())));
    assert_eq!(sent.code, Some(head.status));
    assert_eq!(sent.version, Some(1));
    // The head drover wrote must itself be a head drover would accept, unchanged; but
    // drover may add two fields (`Connection`, `Set-Cookie`) to a head already at the
    // field limit, and then would refuse its own output for that alone.
    if sent.headers.len() <= crate::http1::FIELDS_NODE_KEEPS {
        let mut again = Vec::new();
        let reparsed = response::parse(&out, &ex, None, &mut again)
            .expect("drover refuses the head it wrote")
            .expect("the head drover wrote is incomplete");
        assert_eq!(reparsed.head_len, out.len());
        assert_eq!(reparsed.status, head.status);
    }
    let has = |name: &str| sent.headers.iter().any(|h| is(h.name, name));
    assert!(
        !has(crate::orca::HEADER),
        "the load report reached the client"
    );
    if head.dechunk {
        assert!(!has("transfer-encoding") && !head.client_keep_alive);
    }
    match head.body {
        BodyKind::Chunked if !head.dechunk => {
            assert_eq!(
                declared_framing(sent.headers),
                Some(Some(BodyKind::Chunked))
            )
        }
        BodyKind::Length(n) => {
            let want = (n > 0).then_some(BodyKind::Length(n));
            assert_eq!(declared_framing(sent.headers), Some(want))
        }
        BodyKind::UntilClose => assert!(!head.client_keep_alive && !has("content-length")),
        _ => {}
    }
}

/// The chunked decoder: no panic, and the same answer however the input is split (all
/// at once or byte by byte): where the body ends, its payload, or that it is invalid.
pub fn chunked(data: &[u8]) {
    let mut whole = ChunkedScanner::default();
    let mut payload = Vec::new();
    let all = whole.scan(data, |d| payload.extend_from_slice(d));

    let mut bytewise = ChunkedScanner::default();
    let mut payload2 = Vec::new();
    let mut used = 0;
    let mut failed = None;
    for b in data {
        match bytewise.scan(std::slice::from_ref(b), |d| payload2.extend_from_slice(d)) {
            Ok(n) => used += n,
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
        if bytewise.is_done() {
            break;
        }
    }
    match all {
        Ok(n) => {
            assert_eq!(failed, None);
            assert!(n <= data.len());
            assert!(whole.is_done() || n == data.len());
            assert_eq!(whole.is_done(), bytewise.is_done());
            assert_eq!(used, n);
            assert_eq!(payload, payload2);
            assert!(payload.len() <= n);
        }
        Err(e) => assert_eq!(failed, Some(e)),
    }
}

/// A PROXY protocol header (`crate::proxy_protocol::parse`) at the start of `data`: no
/// panic; a complete header lies within the input and `MAX_HEADER`, and parses the same
/// from its own bytes alone (nothing after it changes what it says); an input that
/// waits for more bytes keeps waiting, or fails, as bytes are cut off its end.
pub fn proxy_header(data: &[u8]) {
    use crate::proxy_protocol::{parse, HeaderError};
    match parse(data) {
        Ok(Some(h)) => {
            assert!(h.len > 0 && h.len <= data.len() && h.len <= 4096, "{h:?}");
            assert_eq!(parse(&data[..h.len]), Ok(Some(h)), "the header alone");
        }
        Ok(None) => {
            for cut in 0..data.len() {
                assert!(
                    !matches!(parse(&data[..cut]), Ok(Some(_))),
                    "a prefix of an incomplete header is complete"
                );
            }
        }
        Err(HeaderError::Invalid(_) | HeaderError::TooLong) => {}
        Err(HeaderError::Incomplete) => unreachable!("parse never reads"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Crashes the fuzz targets found, kept as regressions.
    #[test]
    fn response_at_the_field_limit_gets_two_more_fields() {
        // `response` found it (in the harness): 128 fields, then drover adds
        // `Connection: keep-alive` and `Set-Cookie` for an HTTP/1.0 client.
        let mut raw = b"\x16HTTP/1.1 200 OK\r\n".to_vec();
        for i in 0..127 {
            raw.extend_from_slice(format!("X-{i}: 1\r\n").as_bytes());
        }
        raw.extend_from_slice(b"Content-Length: 0\r\n\r\n");
        response(&raw);
    }
}
