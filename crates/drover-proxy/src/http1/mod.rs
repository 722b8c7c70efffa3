//! HTTP/1.1 message heads and body framing, written for a proxy.
//!
//! We parse with `httparse` but own the rules around it: a proxy that is lenient where
//! its backend is strict (or the reverse) is how request smuggling happens, so every
//! ambiguity in framing is refused here, before anything reaches a backend.

pub mod chunked;
pub mod error_page;
pub mod forward;
pub mod headers;
pub mod keys;
pub mod redirect;
pub mod request;
pub mod response;

/// Header slots httparse may fill in a request or response head;
/// `Limits::max_headers` may only lower it for requests.
pub const HEADER_SLOTS: usize = 128;

/// How the length of a message body is known (RFC 9112 §6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyKind {
    None,
    Length(u64),
    Chunked,
    /// Response only: the body runs until the backend closes the connection.
    UntilClose,
}

/// The byte offset of the first bare LF (a `\n` not preceded by `\r`) in a head, if any.
/// httparse accepts bare LF as a line end; RFC 9112 lets a server refuse it, and a proxy
/// must, because a backend that disagrees about line ends disagrees about framing.
pub fn find_bare_lf(head: &[u8]) -> Option<usize> {
    memchr::memchr_iter(b'\n', head).find(|&i| i == 0 || head[i - 1] != b'\r')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_lf_found_only_without_cr() {
        assert_eq!(find_bare_lf(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n"), None);
        assert_eq!(find_bare_lf(b"GET / HTTP/1.1\nHost: a\r\n\r\n"), Some(14));
        assert_eq!(find_bare_lf(b"\n"), Some(0));
    }
}
