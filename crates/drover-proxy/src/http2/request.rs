//! Phase 1 for an HTTP/2 stream: its request head, checked against RFC 9113 §8.2-8.3,
//! written as the HTTP/1.1 head that `http1::request::parse` then reads. Every rule of
//! that parser (framing, Host, limits, forwarding headers, request id, balancing keys)
//! so holds for both protocols, written once; what is HTTP/2's own is here:
//! connection-specific fields refused, `:authority` as `Host`, cookies joined, and a
//! body without a length sent on chunked.
//!
//! The h2 crate has already refused what HTTP/2 itself makes malformed (uppercase
//! names, connection-specific fields, `te` other than `trailers`, a value with CR, LF or
//! NUL, bad pseudo-fields); the checks are repeated here because the head written below
//! must never carry a line break a client put in it.

use crate::http1::request::BadRequest;
use http::header;

const fn bad(reason: &'static str) -> BadRequest {
    BadRequest {
        status: 400,
        reason,
    }
}

/// Fields that manage an HTTP/1.1 connection, which an HTTP/2 request must not carry
/// (RFC 9113 §8.2.2): refused, not dropped, as the RFC asks of a malformed request.
const CONNECTION_SPECIFIC: [&str; 5] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "upgrade",
];

/// Whether a request whose HEADERS did not end the stream, and that names no length,
/// has its body sent chunked.
pub(crate) fn body_is_chunked(parts: &http::request::Parts, end_stream: bool) -> bool {
    !end_stream && !parts.headers.contains_key(header::CONTENT_LENGTH)
}

/// Writes the request `parts` as an HTTP/1.1 head into `out`.
pub(crate) fn write_head(
    parts: &http::request::Parts,
    end_stream: bool,
    out: &mut Vec<u8>,
) -> Result<(), BadRequest> {
    out.clear();
    let target = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str())
        .filter(|p| !p.is_empty())
        .ok_or(bad("missing :path"))?;
    let mut hosts = parts.headers.get_all(header::HOST).iter();
    let host_field = hosts.next().map(|h| h.as_bytes());
    if hosts.next().is_some() {
        return Err(bad("more than one Host field"));
    }
    let authority = parts.uri.authority().map(|a| a.as_str().as_bytes());
    // RFC 9113 §8.3.1: no userinfo in `:authority` of an http or https URI.
    if authority.is_some_and(|a| a.contains(&b'@')) {
        return Err(bad(":authority with userinfo"));
    }
    let host = match (authority, host_field) {
        (Some(a), Some(h)) if a != h => return Err(bad(":authority and Host disagree")),
        (Some(a), _) => a,
        (None, Some(h)) => h,
        (None, None) => return Err(bad("missing :authority")),
    };
    out.extend_from_slice(parts.method.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(target.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    put(out, b"host", host)?;
    // RFC 9113 §8.2.3: cookie fields may come split; HTTP/1.1 has one, joined by "; ".
    let mut cookies = parts.headers.get_all(header::COOKIE).iter().peekable();
    if cookies.peek().is_some() {
        let mut joined = Vec::new();
        for (i, c) in cookies.enumerate() {
            if i > 0 {
                joined.extend_from_slice(b"; ");
            }
            joined.extend_from_slice(c.as_bytes());
        }
        put(out, b"cookie", &joined)?;
    }
    for (name, value) in parts.headers.iter() {
        let name = name.as_str();
        if CONNECTION_SPECIFIC.contains(&name) {
            return Err(bad("connection-specific header field in an HTTP/2 request"));
        }
        match name {
            "host" | "cookie" => {}
            // Hop by hop: the HTTP/1.1 backend gets none (and no trailers: HTTP/2
            // trailers to backends are issue 24's next item).
            "te" if value.as_bytes().eq_ignore_ascii_case(b"trailers") => {}
            "te" => return Err(bad("te other than trailers in an HTTP/2 request")),
            _ => put(out, name.as_bytes(), value.as_bytes())?,
        }
    }
    if body_is_chunked(parts, end_stream) {
        out.extend_from_slice(b"transfer-encoding: chunked\r\n");
    }
    out.extend_from_slice(b"\r\n");
    Ok(())
}

fn put(out: &mut Vec<u8>, name: &[u8], value: &[u8]) -> Result<(), BadRequest> {
    if value.iter().any(|&b| matches!(b, b'\r' | b'\n' | 0)) {
        return Err(bad("CR, LF or NUL in a header value"));
    }
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(req: http::Request<()>, end_stream: bool) -> Result<String, BadRequest> {
        let (parts, ()) = req.into_parts();
        let mut out = Vec::new();
        write_head(&parts, end_stream, &mut out)?;
        Ok(String::from_utf8(out).unwrap())
    }

    #[test]
    fn authority_becomes_host_and_cookies_join() {
        let req = http::Request::get("https://ex.com/a?b=1")
            .header("cookie", "a=1")
            .header("cookie", "b=2")
            .header("x-y", "z")
            .body(())
            .unwrap();
        assert_eq!(
            head(req, true).unwrap(),
            "GET /a?b=1 HTTP/1.1\r\nhost: ex.com\r\ncookie: a=1; b=2\r\nx-y: z\r\n\r\n"
        );
    }

    #[test]
    fn a_body_without_a_length_goes_chunked() {
        let post = || http::Request::post("http://ex.com/up");
        let chunked = head(post().body(()).unwrap(), false).unwrap();
        assert!(
            chunked.ends_with("transfer-encoding: chunked\r\n\r\n"),
            "{chunked}"
        );
        let sized = head(
            post().header("content-length", "3").body(()).unwrap(),
            false,
        )
        .unwrap();
        assert!(!sized.contains("transfer-encoding"), "{sized}");
        let empty = head(post().body(()).unwrap(), true).unwrap();
        assert!(!empty.contains("transfer-encoding"), "{empty}");
    }

    #[test]
    fn refuses_what_http1_would_read_differently() {
        let with = |name: &str, value: &str| {
            head(
                http::Request::get("http://ex.com/")
                    .header(name, value)
                    .body(())
                    .unwrap(),
                true,
            )
        };
        for name in [
            "connection",
            "keep-alive",
            "proxy-connection",
            "transfer-encoding",
            "upgrade",
        ] {
            assert!(with(name, "x").is_err(), "{name}");
        }
        assert!(with("te", "gzip").is_err());
        assert!(!with("te", "trailers").unwrap().contains("te:"));
        assert_eq!(
            with("host", "other.com").unwrap_err().reason,
            ":authority and Host disagree"
        );
        assert!(with("host", "ex.com").is_ok());
        let userinfo = http::Request::get("http://u:p@ex.com/").body(()).unwrap();
        assert_eq!(
            head(userinfo, true).unwrap_err().reason,
            ":authority with userinfo"
        );
    }
}
