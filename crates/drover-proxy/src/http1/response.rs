//! Backend response heads: parse, validate, pick up the backend's load report, and write
//! the head the client will see.

use super::chunked::ChunkedScanner;
use super::headers::{self, is, put_header, ConnectionOptions};
use super::{find_bare_lf, BodyKind, HeadSlots, FIELDS_NODE_KEEPS};
use crate::orca;
use std::io::Write;

/// Largest backend response head accepted.
pub const MAX_RESPONSE_HEAD: usize = 64 * 1024;

/// A backend response drover will not pass on (the client gets a 502).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BadResponse(pub &'static str);

/// What the proxy must know about the request to frame the response.
#[derive(Debug, Clone, Copy, Default)]
pub struct Exchange {
    pub is_head: bool,
    /// An HTTP/1.0 client: it takes no 1xx heads, and a chunked body decoded. (An
    /// HTTP/2 stream takes the chunks as they come: `http2::H2Client` decodes them,
    /// trailers included, into its DATA and trailing HEADERS frames.)
    pub http10_client: bool,
    pub client_keep_alive: bool,
    pub upgrade: bool,
}

#[derive(Debug, Clone, Copy)]
pub struct ResponseHead {
    pub head_len: usize,
    pub status: u16,
    /// Framing of the body as the backend sends it.
    pub body: BodyKind,
    /// The backend connection may be reused after this response.
    pub backend_keep_alive: bool,
    /// The client connection may be kept after this response.
    pub client_keep_alive: bool,
    /// Chunks must be decoded for the client (HTTP/1.0 cannot read them).
    pub dechunk: bool,
    /// A 1xx other than 101: forwarded (or dropped), then another head follows.
    pub informational: bool,
    /// 101: both connections become a tunnel.
    pub switching: bool,
    /// Utilisation from an `endpoint-load-metrics` header.
    pub load: Option<f64>,
    /// How long the backend keeps this connection open while idle, from its
    /// `Keep-Alive: timeout=N` header (seconds).
    pub keep_alive_timeout: Option<u32>,
    /// `Content-Type: text/event-stream`: server-sent events, which come when the app
    /// has news, with quiet gaps of any length between them.
    pub event_stream: bool,
}

/// The `timeout` parameter of a `Keep-Alive` header (`timeout=5, max=1000`, RFC 2068
/// §19.7.1): whole seconds; `None` when it is missing or not a number.
fn keep_alive_timeout_of(value: &[u8]) -> Option<u32> {
    value.split(|&b| b == b',').find_map(|param| {
        let eq = param.iter().position(|&b| b == b'=')?;
        let (name, n) = (param[..eq].trim_ascii(), param[eq + 1..].trim_ascii());
        if !name.eq_ignore_ascii_case(b"timeout") {
            return None;
        }
        std::str::from_utf8(n).ok()?.parse().ok()
    })
}

/// The status line as drover re-writes it for the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct StatusLine<'a> {
    http10: bool,
    code: u16,
    reason: &'a [u8],
}

/// Checks a complete raw head (`head`, ending in the blank line) beyond what httparse
/// checks, and parses its status line strictly. httparse takes a bare LF as a line end
/// and drover used to copy the status line through: `HTTP/1.1 200 OK\nX-Injected: 1`
/// showed the client a header drover never saw as one. So every line must end in CRLF,
/// no byte other than HTAB may be a control, no line may be folded, and the status line
/// must be exactly `HTTP/1.x DDD[ reason]`; the client's head is then rebuilt from these
/// parts, never copied.
fn check_head(head: &[u8]) -> Result<StatusLine<'_>, BadResponse> {
    if find_bare_lf(head).is_some() {
        return Err(BadResponse("bare LF in response head"));
    }
    for (i, &b) in head.iter().enumerate() {
        match b {
            b'\r' if head.get(i + 1) != Some(&b'\n') => {
                return Err(BadResponse("bare CR in response head"))
            }
            b'\r' | b'\n' | b'\t' => {}
            0..=0x1f | 0x7f => return Err(BadResponse("control byte in response head")),
            _ => {}
        }
    }
    // A line starting with whitespace continues the previous one (obs-fold, RFC 9112
    // §5.2): a client may join it to the field before, drover would not.
    if memchr::memmem::find_iter(head, b"\r\n")
        .any(|i| matches!(head.get(i + 2), Some(b' ' | b'\t')))
    {
        return Err(BadResponse("obsolete line folding in response head"));
    }
    let line_end = memchr::memmem::find(head, b"\r\n").unwrap_or(head.len());
    let line = &head[..line_end];
    let http10 = match line.get(..9) {
        Some(b"HTTP/1.1 ") => false,
        Some(b"HTTP/1.0 ") => true,
        _ => return Err(BadResponse("malformed version or status line")),
    };
    let digits = &line[9..];
    let code = match digits.get(..3) {
        Some(d)
            if d.iter().all(u8::is_ascii_digit) && matches!(digits.get(3), None | Some(b' ')) =>
        {
            d.iter().fold(0u16, |n, d| n * 10 + u16::from(d - b'0'))
        }
        _ => return Err(BadResponse("status code is not three digits")),
    };
    if !(100..=599).contains(&code) {
        return Err(BadResponse("status code out of range"));
    }
    Ok(StatusLine {
        http10,
        code,
        reason: digits.get(4..).unwrap_or_default(),
    })
}

/// Parses a response head at the start of `buf`; `Ok(None)` means more bytes are needed.
/// On success the client's head is in `out` (empty for a 1xx an HTTP/1.0 client must
/// not see), rebuilt from the parsed status and fields.
///
/// Body bytes in `buf` after a chunked head are checked too: until the head is sent the
/// client can still get a 502 rather than a connection cut after a head.
pub fn parse(
    buf: &[u8],
    ex: &Exchange,
    set_cookie: Option<&[u8]>,
    out: &mut Vec<u8>,
) -> Result<Option<ResponseHead>, BadResponse> {
    let mut slots = HeadSlots::new();
    let (parsed, res) = slots.response(buf, FIELDS_NODE_KEEPS);
    let head_len = match parsed {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() > MAX_RESPONSE_HEAD => {
            return Err(BadResponse("response head too large"))
        }
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => {
            return Err(BadResponse("too many response header fields"))
        }
        Err(httparse::Error::Status | httparse::Error::Version) => {
            return Err(BadResponse("malformed status line"))
        }
        Err(_) => return Err(BadResponse("malformed response header field")),
    };
    let line = check_head(&buf[..head_len])?;
    let status = line.code;
    let backend_http10 = line.http10;

    let mut conn = ConnectionOptions::default();
    let mut content_length: Option<u64> = None;
    let mut chunked = false;
    let mut te_other = false;
    let mut load = None;
    let mut keep_alive_timeout = None;
    let mut event_stream = false;
    for h in res.headers.iter() {
        if is(h.name, "content-length") {
            let n = headers::parse_content_length(h.value)
                .ok_or(BadResponse("invalid Content-Length"))?;
            if content_length.is_some_and(|m| m != n) {
                return Err(BadResponse("conflicting Content-Length"));
            }
            content_length = Some(n);
        } else if is(h.name, "transfer-encoding") {
            if headers::ends_with_chunked(h.value) && !chunked {
                chunked = true;
            } else {
                te_other = true;
            }
        } else if is(h.name, "connection") {
            conn.add(h.value);
        } else if is(h.name, orca::HEADER) {
            load = orca::parse_text(h.value).or(load);
        } else if is(h.name, "keep-alive") {
            keep_alive_timeout = keep_alive_timeout_of(h.value).or(keep_alive_timeout);
        } else if is(h.name, "content-type") {
            event_stream = h
                .value
                .get(..17)
                .is_some_and(|v| v.eq_ignore_ascii_case(b"text/event-stream"));
        }
    }
    if conn.names_end_to_end {
        return Err(BadResponse(
            "Connection lists Content-Length, Transfer-Encoding or Host",
        ));
    }
    if content_length.is_some() && (chunked || te_other) {
        return Err(BadResponse("both Content-Length and Transfer-Encoding"));
    }

    let informational = (100..200).contains(&status) && status != 101;
    let switching = status == 101 && ex.upgrade;
    if status == 101 && !ex.upgrade {
        return Err(BadResponse(
            "101 Switching Protocols without an Upgrade request",
        ));
    }
    let no_body = ex.is_head || (100..200).contains(&status) || status == 204 || status == 304;
    let body = if no_body {
        BodyKind::None
    } else if te_other {
        // RFC 9112 §6.3: a response whose last coding is not chunked ends at close.
        BodyKind::UntilClose
    } else if chunked {
        BodyKind::Chunked
    } else if let Some(n) = content_length {
        BodyKind::Length(n)
    } else {
        BodyKind::UntilClose
    };
    let backend_keep_alive = !conn.close
        && (!backend_http10 || conn.keep_alive)
        && body != BodyKind::UntilClose
        && !switching;
    if body == BodyKind::Chunked {
        ChunkedScanner::default()
            .scan(&buf[head_len..], |_| {})
            .map_err(|e| BadResponse(e.0))?;
    }
    let dechunk = body == BodyKind::Chunked && ex.http10_client;
    let client_keep_alive =
        ex.client_keep_alive && !switching && !dechunk && body != BodyKind::UntilClose;

    let head = ResponseHead {
        head_len,
        status,
        body,
        backend_keep_alive,
        client_keep_alive,
        dechunk,
        informational,
        switching,
        load,
        keep_alive_timeout,
        event_stream,
    };
    out.clear();
    if informational && ex.http10_client {
        return Ok(Some(head));
    }
    // Status line with our version: drover speaks HTTP/1.1 to clients whatever the
    // backend. The SP before an empty reason is required (RFC 9112 §4).
    let _ = write!(out, "HTTP/1.1 {status} ");
    out.extend_from_slice(line.reason);
    out.extend_from_slice(b"\r\n");
    for h in res.headers.iter() {
        let name = h.name;
        let drop = headers::is_hop_by_hop(name)
            || is(name, orca::HEADER)
            || (is(name, "transfer-encoding") && (dechunk || no_body))
            || (is(name, "upgrade") && !switching)
            || headers::named_by_connection(name, &conn, res.headers);
        if !drop {
            put_header(out, name.as_bytes(), h.value);
        }
    }
    if let Some(cookie) = set_cookie.filter(|_| !informational) {
        put_header(out, b"Set-Cookie", cookie);
    }
    if switching {
        out.extend_from_slice(b"Connection: upgrade\r\n");
    } else if informational {
        // Connection options of a 1xx say nothing about the final response.
    } else if !client_keep_alive {
        out.extend_from_slice(b"Connection: close\r\n");
    } else if ex.http10_client {
        out.extend_from_slice(b"Connection: keep-alive\r\n");
    }
    out.extend_from_slice(b"\r\n");
    Ok(Some(head))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ex() -> Exchange {
        Exchange {
            client_keep_alive: true,
            ..Default::default()
        }
    }

    fn run(raw: &[u8], ex: &Exchange) -> Result<(ResponseHead, String), BadResponse> {
        let mut out = Vec::new();
        let h = parse(raw, ex, None, &mut out)?.expect("complete");
        Ok((h, String::from_utf8(out).unwrap()))
    }

    #[test]
    fn keep_alive_timeout_is_read_from_its_header() {
        assert_eq!(keep_alive_timeout_of(b"timeout=5"), Some(5));
        assert_eq!(keep_alive_timeout_of(b"max=100, Timeout = 300"), Some(300));
        for bad in [
            &b"timeout=-1"[..],
            b"timeout=",
            b"timeout=5s",
            b"max=5",
            b"",
            b"timeout",
        ] {
            assert_eq!(
                keep_alive_timeout_of(bad),
                None,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        let (h, _) = run(
            b"HTTP/1.1 200 OK\r\nKeep-Alive: timeout=5\r\nContent-Length: 0\r\n\r\n",
            &ex(),
        )
        .unwrap();
        assert_eq!(h.keep_alive_timeout, Some(5));
        let (h, _) = run(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", &ex()).unwrap();
        assert_eq!(h.keep_alive_timeout, None);
    }

    #[test]
    fn an_event_stream_is_known_by_its_content_type() {
        for (head, want) in [
            (&b"Content-Type: text/event-stream\r\n"[..], true),
            (b"content-type: Text/Event-Stream; charset=utf-8\r\n", true),
            (b"Content-Type: text/plain\r\n", false),
            (b"Content-Type: text/event\r\n", false),
            (b"", false),
        ] {
            let mut raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n".to_vec();
            raw.extend_from_slice(head);
            raw.extend_from_slice(b"\r\n");
            let (h, _) = run(&raw, &ex()).unwrap();
            assert_eq!(h.event_stream, want, "{}", String::from_utf8_lossy(head));
        }
    }

    #[test]
    fn strips_hop_by_hop_and_load_report() {
        let (h, out) = run(
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nKeep-Alive: timeout=5\r\nConnection: keep-alive\r\nendpoint-load-metrics: TEXT cpu_utilization=0.25\r\nX-A: b\r\n\r\nok",
            &ex(),
        )
        .unwrap();
        assert_eq!(h.status, 200);
        assert_eq!(h.body, BodyKind::Length(2));
        assert_eq!(h.load, Some(0.25));
        assert!(h.backend_keep_alive && h.client_keep_alive);
        assert_eq!(
            out,
            "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-A: b\r\n\r\n"
        );
    }

    #[test]
    fn framing_rules() {
        let (h, _) = run(b"HTTP/1.1 200 OK\r\n\r\n", &ex()).unwrap();
        assert_eq!(h.body, BodyKind::UntilClose);
        assert!(!h.client_keep_alive && !h.backend_keep_alive);
        let (h, _) = run(b"HTTP/1.1 204 No Content\r\n\r\n", &ex()).unwrap();
        assert_eq!(h.body, BodyKind::None);
        let head = Exchange {
            is_head: true,
            ..ex()
        };
        let (h, _) = run(b"HTTP/1.1 200 OK\r\nContent-Length: 99\r\n\r\n", &head).unwrap();
        assert_eq!(h.body, BodyKind::None);
        let (h, out) = run(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
            &ex(),
        )
        .unwrap();
        assert_eq!(h.body, BodyKind::Chunked);
        assert!(out.contains("Transfer-Encoding: chunked"));
        let old = Exchange {
            http10_client: true,
            ..ex()
        };
        let (h, out) = run(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
            &old,
        )
        .unwrap();
        assert!(h.dechunk && !h.client_keep_alive);
        assert!(!out.contains("Transfer-Encoding") && out.contains("Connection: close"));
        let (h, _) = run(b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n", &ex()).unwrap();
        assert!(!h.backend_keep_alive && h.client_keep_alive);
    }

    #[test]
    fn switching_protocols_only_for_upgrades() {
        let up = Exchange {
            upgrade: true,
            ..ex()
        };
        let raw = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n";
        let (h, out) = run(raw, &up).unwrap();
        assert!(h.switching && !h.backend_keep_alive);
        assert!(out.contains("Upgrade: websocket\r\n") && out.contains("Connection: upgrade\r\n"));
        assert!(run(raw, &ex()).is_err());
        let raw = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: Upgrade, X-A\r\nX-A: 1\r\n\r\n";
        let (_, out) = run(raw, &up).unwrap();
        assert!(
            out.contains("Upgrade: h2c\r\n") && !out.contains("X-A"),
            "{out}"
        );
    }

    #[test]
    fn an_answer_with_as_many_fields_as_node_sends_goes_on_whole() {
        // 150 cookies, as an app's Node sends them to the client under PM2.
        let cookies: String = (0..150)
            .map(|i| format!("Set-Cookie: c{i}=v\r\n"))
            .collect();
        let raw = format!("HTTP/1.1 200 OK\r\n{cookies}Content-Length: 0\r\n\r\n");
        let (_, out) = run(raw.as_bytes(), &ex()).expect("150 fields refused");
        assert_eq!(
            out.matches("set-cookie: ").count() + out.matches("Set-Cookie: ").count(),
            150
        );
        let fields: String = (0..FIELDS_NODE_KEEPS)
            .map(|i| format!("X-{i}: v\r\n"))
            .collect();
        let raw = format!("HTTP/1.1 200 OK\r\n{fields}Content-Length: 0\r\n\r\n");
        assert!(matches!(
            run(raw.as_bytes(), &ex()),
            Err(BadResponse("too many response header fields"))
        ));
    }

    #[test]
    fn refuses_bad_backend_heads() {
        for raw in [
            &b"HTTX/1.1 200 OK\r\n\r\n"[..],
            b"HTTP/1.1 2000 OK\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nBad Header: 1\r\n\r\n",
            // The client would get no framing and read the next response as this body.
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: transfer-encoding\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nConnection: Content-Length\r\n\r\n",
        ] {
            assert!(run(raw, &ex()).is_err(), "{}", String::from_utf8_lossy(raw));
        }
        assert!(matches!(
            parse(b"HTTP/1.1 200 OK\r\n", &ex(), None, &mut Vec::new()),
            Ok(None)
        ));
    }

    #[test]
    fn refuses_injection_and_garbled_status_lines() {
        for raw in [
            &b"HTTP/1.1 200 OK\nX-Injected: 1\r\nContent-Length: 0\r\n\r\n"[..],
            b"HTTP/1.1 200 OK\nendpoint-load-metrics: TEXT cpu_utilization=0.5\r\n\r\n",
            b"HTTP/1.1 200 OK\nTransfer-Encoding: chunked\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nX-A: 1\nX-B: 2\r\n\r\n",
            b"HTTP/1.1 200 O\rK\r\n\r\n",
            b"HTTP/1.1 200 O\x01K\r\n\r\n",
            b"HTTP/1.1 200 O\x7fK\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nX-A: a\x7fb\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nX-A: a\r\n b\r\n\r\n",
            b"HTTP/1.1 200 OK\r\n\tX-A: a\r\n\r\n",
            b"HTTP/1.1\r\n\r\n",
            b"HTTP/1.1 \r\n\r\n",
            b"HTTP/1.1 20 OK\r\n\r\n",
            b"HTTP/1.1 20a OK\r\n\r\n",
            b"HTTP/1.1 200OK\r\n\r\n",
            b"HTTP/1.1  200 OK\r\n\r\n",
            b"HTTP/1.1 099 OK\r\n\r\n",
            b"HTTP/1.1 600 OK\r\n\r\n",
            b"HTTP/2.0 200 OK\r\n\r\n",
            b"http/1.1 200 OK\r\n\r\n",
            b"HTTP/1.2 200 OK\r\n\r\n",
        ] {
            assert!(run(raw, &ex()).is_err(), "{}", String::from_utf8_lossy(raw));
        }
    }

    #[test]
    fn status_line_is_rebuilt_from_its_parts() {
        // obs-text and HTAB are allowed in a reason (RFC 9112 §4); the version is ours.
        let mut out = Vec::new();
        let raw = b"HTTP/1.0 404 Not\there\xff\r\nContent-Length: 0\r\n\r\n";
        parse(raw, &ex(), None, &mut out).unwrap().unwrap();
        assert_eq!(
            out,
            b"HTTP/1.1 404 Not\there\xff\r\nContent-Length: 0\r\n\r\n"
        );
        let (h, out) = run(b"HTTP/1.1 599\r\nContent-Length: 0\r\n\r\n", &ex()).unwrap();
        assert_eq!(h.status, 599);
        assert!(out.starts_with("HTTP/1.1 599 \r\n"), "{out}");
    }

    #[test]
    fn chunk_sizes_that_came_with_the_head_are_checked() {
        let head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";
        for bad in [&b"zz\r\n"[..], b"5;\n", b"1\r\nab", b"fffffffffffffffff"] {
            let raw = [&head[..], bad].concat();
            assert!(
                run(&raw, &ex()).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        for fine in [&b""[..], b"5", b"5\r\nhel", b"0\r\n\r\n"] {
            let raw = [&head[..], fine].concat();
            assert!(
                run(&raw, &ex()).is_ok(),
                "{}",
                String::from_utf8_lossy(fine)
            );
        }
    }

    #[test]
    fn sticky_cookie_is_set() {
        let mut out = Vec::new();
        parse(
            b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
            &ex(),
            Some(b"s=1; Path=/"),
            &mut out,
        )
        .unwrap();
        assert!(String::from_utf8(out)
            .unwrap()
            .contains("Set-Cookie: s=1; Path=/\r\n"));
    }
}
