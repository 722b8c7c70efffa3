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

/// Header slots on the stack for parsing a head: enough for nearly every request and
/// response, cheap to clear per request. A head with more fields is parsed again in
/// slots on the heap (`HeadSlots`).
pub const HEADER_SLOTS: usize = 128;

/// The fields of one head that Node's http server and client keep (`maxHeadersCount`):
/// a head that an app's own Node accepts, drover accepts (`Limits::max_headers` for
/// requests; responses always).
pub const FIELDS_NODE_KEEPS: usize = 2000;

/// Where httparse puts a head's fields: `HEADER_SLOTS` on the stack, and only for a head
/// with more fields than that, as many as it has lines (up to the caller's `most`) on
/// the heap.
pub struct HeadSlots<'b> {
    stack: [httparse::Header<'b>; HEADER_SLOTS],
    heap: Vec<httparse::Header<'b>>,
}

impl<'b> HeadSlots<'b> {
    pub fn new() -> Self {
        HeadSlots {
            stack: [httparse::EMPTY_HEADER; HEADER_SLOTS],
            heap: Vec::new(),
        }
    }

    /// `buf` parsed as a request head of at most `most` fields.
    pub fn request<'h>(
        &'h mut self,
        buf: &'b [u8],
        most: usize,
    ) -> (httparse::Result<usize>, httparse::Request<'h, 'b>) {
        self.parse(buf, most, httparse::Request::new, httparse::Request::parse)
    }

    /// `buf` parsed as a response head of at most `most` fields.
    pub fn response<'h>(
        &'h mut self,
        buf: &'b [u8],
        most: usize,
    ) -> (httparse::Result<usize>, httparse::Response<'h, 'b>) {
        self.parse(
            buf,
            most,
            httparse::Response::new,
            httparse::Response::parse,
        )
    }

    /// `buf` parsed by `parse` into the head `new` makes, in the stack's slots and, when
    /// the head has more fields than those, again in the heap's.
    fn parse<'h, H>(
        &'h mut self,
        buf: &'b [u8],
        most: usize,
        new: fn(&'h mut [httparse::Header<'b>]) -> H,
        parse: fn(&mut H, &'b [u8]) -> httparse::Result<usize>,
    ) -> (httparse::Result<usize>, H) {
        let mut head = new(&mut self.stack[..most.clamp(1, HEADER_SLOTS)]);
        let first = parse(&mut head, buf);
        if matches!(first, Err(httparse::Error::TooManyHeaders)) && most > HEADER_SLOTS {
            self.heap = vec![httparse::EMPTY_HEADER; lines_in(buf).min(most)];
            let mut head = new(&mut self.heap);
            return (parse(&mut head, buf), head);
        }
        (first, head)
    }
}

impl Default for HeadSlots<'_> {
    fn default() -> Self {
        Self::new()
    }
}

/// An upper bound on the fields of the head at the start of `buf`: its line count (a
/// field takes a line; the head's end may lie further on, in what is not read yet).
fn lines_in(buf: &[u8]) -> usize {
    memchr::memchr_iter(b'\n', buf).count() + 1
}

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
