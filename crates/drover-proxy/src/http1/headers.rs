//! Header classification shared by requests and responses.

/// Case-insensitive ASCII comparison of a header name.
#[inline]
pub fn is(name: &str, lower: &str) -> bool {
    name.len() == lower.len() && name.eq_ignore_ascii_case(lower)
}

/// Headers that describe one hop, never forwarded (RFC 9110 §7.6.1). `Transfer-Encoding`
/// and `Upgrade` are handled by the caller because they are forwarded in some cases.
pub fn is_hop_by_hop(name: &str) -> bool {
    is(name, "connection")
        || is(name, "keep-alive")
        || is(name, "proxy-connection")
        || is(name, "te")
        || is(name, "trailer")
}

/// The comma-separated tokens of a list header value, trimmed.
pub fn tokens(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value
        .split(|&b| b == b',')
        .map(|t| t.trim_ascii())
        .filter(|t| !t.is_empty())
}

/// Options named by `Connection` headers: what matters to the proxy, and whether other
/// header names were listed (those must be dropped too, so the caller checks each).
#[derive(Debug, Default, Clone, Copy)]
pub struct ConnectionOptions {
    pub close: bool,
    pub keep_alive: bool,
    pub upgrade: bool,
    pub names_others: bool,
    /// `Content-Length`, `Transfer-Encoding` or `Host` is listed. Dropping it as
    /// hop-by-hop would let the next hop frame the message differently than drover did
    /// (`Connection: content-length` made a body the backend's next request), and RFC
    /// 9110 §7.6.1 forbids listing fields meant for every recipient, so such a message
    /// is refused.
    pub names_end_to_end: bool,
}

impl ConnectionOptions {
    pub fn add(&mut self, value: &[u8]) {
        for t in tokens(value) {
            if t.eq_ignore_ascii_case(b"close") {
                self.close = true;
            } else if t.eq_ignore_ascii_case(b"keep-alive") {
                self.keep_alive = true;
            } else if t.eq_ignore_ascii_case(b"upgrade") {
                self.upgrade = true;
            } else {
                self.names_others = true;
                self.names_end_to_end |= t.eq_ignore_ascii_case(b"content-length")
                    || t.eq_ignore_ascii_case(b"transfer-encoding")
                    || t.eq_ignore_ascii_case(b"host");
            }
        }
    }
}

/// Whether an `Upgrade` value offers HTTP/2 in the clear alone (`h2c`), the upgrade
/// RFC 9113 §3.1 deprecated.
pub fn only_h2c(value: &[u8]) -> bool {
    let mut offered = tokens(value).peekable();
    offered.peek().is_some() && offered.all(|t| t.eq_ignore_ascii_case(b"h2c"))
}

/// Whether a field must be dropped because a `Connection` field names it (RFC 9110
/// §7.6.1), for requests and responses alike. `Connection: upgrade` lists Upgrade too,
/// but whether Upgrade goes through is the caller's decision: it used to be dropped
/// from real upgrades whenever another name was listed as well.
pub fn named_by_connection(
    name: &str,
    conn: &ConnectionOptions,
    fields: &[httparse::Header<'_>],
) -> bool {
    conn.names_others
        && !is(name, "upgrade")
        && listed_in_connection(
            name,
            fields
                .iter()
                .filter(|c| is(c.name, "connection"))
                .map(|c| c.value),
        )
}

/// Writes one field line.
pub(crate) fn put_header(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// Whether `name` is listed in any of the `Connection` header values (so it is hop-by-hop).
pub fn listed_in_connection<'a>(
    name: &str,
    mut connection_values: impl Iterator<Item = &'a [u8]>,
) -> bool {
    connection_values.any(|v| tokens(v).any(|t| t.eq_ignore_ascii_case(name.as_bytes())))
}

/// Parses a `Content-Length` value: digits only. `+5`, `5,5`, ` ` and overflow are refused,
/// because backends differ on them.
pub fn parse_content_length(value: &[u8]) -> Option<u64> {
    let v = value.trim_ascii();
    if v.is_empty() || v.len() > 19 || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    v.iter().try_fold(0u64, |n, d| {
        n.checked_mul(10)?.checked_add((d - b'0') as u64)
    })
}

/// Whether a `Transfer-Encoding` list ends with `chunked` and names each coding as a
/// token. Anything else leaves the body length unknown, which a request must not be.
pub fn ends_with_chunked(value: &[u8]) -> bool {
    let mut last = None;
    for t in value.split(|&b| b == b',').map(|t| t.trim_ascii()) {
        if t.is_empty() || !t.iter().all(|&b| is_tchar(b)) {
            return false;
        }
        last = Some(t);
    }
    last.is_some_and(|t| t.eq_ignore_ascii_case(b"chunked"))
}

/// A non-empty RFC 9110 token (header and cookie names).
pub fn is_token(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(is_tchar)
}

/// RFC 9110 token characters.
pub fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_length_is_strict() {
        assert_eq!(parse_content_length(b"42"), Some(42));
        assert_eq!(parse_content_length(b" 42 "), Some(42));
        for bad in [
            &b""[..],
            b"+4",
            b"4,4",
            b"-1",
            b"0x10",
            b"99999999999999999999",
        ] {
            assert_eq!(parse_content_length(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn transfer_encoding_must_end_in_chunked() {
        assert!(ends_with_chunked(b"chunked"));
        assert!(ends_with_chunked(b"gzip, Chunked"));
        for bad in [
            &b"gzip"[..],
            b"chunked, gzip",
            b"chunked,",
            b"",
            b"chu nked",
            b"\"chunked\"",
        ] {
            assert!(!ends_with_chunked(bad), "{bad:?}");
        }
    }

    #[test]
    fn connection_options() {
        let mut c = ConnectionOptions::default();
        c.add(b"Keep-Alive, Upgrade , x-foo");
        assert!(c.keep_alive && c.upgrade && c.names_others && !c.close);
        assert!(!c.names_end_to_end);
        c.add(b"Content-Length");
        assert!(c.names_end_to_end);
        assert!(listed_in_connection(
            "X-Foo",
            [&b"keep-alive, x-foo"[..]].into_iter()
        ));
    }
}
