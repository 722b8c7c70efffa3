//! Incremental scanner for chunked transfer coding (RFC 9112 §7.1).
//!
//! The proxy forwards chunked bodies byte for byte; it only needs to know where the body
//! ends, and to refuse framing a backend might read differently (bare LF, bad sizes,
//! junk after a chunk). It can also hand out the payload, for HTTP/1.0 clients that
//! cannot read chunks.

use std::fmt;

/// Longest trailer section accepted; trailers are rare and small.
const MAX_TRAILER_BYTES: usize = 8192;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    SizeStart,
    Size,
    SizeWs,
    Ext,
    SizeLf,
    Data,
    DataCr,
    DataLf,
    TrailerStart,
    TrailerLine,
    TrailerLf,
    EndLf,
    Done,
}

/// Why a chunked body was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkedError(pub &'static str);

impl fmt::Display for ChunkedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid chunked body: {}", self.0)
    }
}

impl std::error::Error for ChunkedError {}

#[derive(Debug, Clone)]
pub struct ChunkedScanner {
    state: State,
    size: u64,
    digits: u8,
    trailer_bytes: usize,
    /// The trailer section's fields, kept when asked (`keeping_trailers`): an HTTP/2
    /// peer gets them as a HEADERS frame of their own.
    trailers: Option<Vec<u8>>,
}

impl Default for ChunkedScanner {
    fn default() -> Self {
        ChunkedScanner {
            state: State::SizeStart,
            size: 0,
            digits: 0,
            trailer_bytes: 0,
            trailers: None,
        }
    }
}

impl ChunkedScanner {
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// A scanner that keeps the trailer section's field lines (each ending in CRLF),
    /// for [`ChunkedScanner::take_trailers`].
    pub fn keeping_trailers() -> Self {
        ChunkedScanner {
            trailers: Some(Vec::new()),
            ..ChunkedScanner::default()
        }
    }

    /// The trailer field lines kept so far (empty when there were none, or when the
    /// scanner does not keep them).
    pub fn take_trailers(&mut self) -> Vec<u8> {
        self.trailers
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// Scans `input` and returns how many bytes of it belong to the body; fewer than
    /// `input.len()` only when the body ended inside it. Payload bytes are passed to
    /// `on_data` as they are found.
    pub fn scan(
        &mut self,
        input: &[u8],
        mut on_data: impl FnMut(&[u8]),
    ) -> Result<usize, ChunkedError> {
        let mut i = 0;
        while i < input.len() {
            if self.state == State::Data {
                let take = (self.size as usize).min(input.len() - i);
                on_data(&input[i..i + take]);
                i += take;
                self.size -= take as u64;
                if self.size == 0 {
                    self.state = State::DataCr;
                }
                continue;
            }
            let b = input[i];
            i += 1;
            if let Some(kept) = &mut self.trailers {
                if matches!(self.state, State::TrailerLine | State::TrailerLf)
                    || (self.state == State::TrailerStart && b != b'\r')
                {
                    kept.push(b);
                }
            }
            self.state = match (self.state, b) {
                (State::Done, _) => return Ok(i - 1),
                (State::SizeStart | State::Size, _) if b.is_ascii_hexdigit() => {
                    self.digits += 1;
                    if self.digits > 15 {
                        return Err(ChunkedError("chunk size too large"));
                    }
                    self.size = self.size * 16 + (b as char).to_digit(16).unwrap_or(0) as u64;
                    State::Size
                }
                (State::SizeStart, _) => return Err(ChunkedError("expected a chunk size")),
                (State::Size | State::SizeWs, b' ' | b'\t') => State::SizeWs,
                (State::Size | State::SizeWs, b';') => State::Ext,
                (State::Size | State::SizeWs | State::Ext, b'\r') => State::SizeLf,
                (State::Ext, b'\n') => return Err(ChunkedError("bare LF in chunk extension")),
                (State::Ext, b) if b == b'\t' || !b.is_ascii_control() => State::Ext,
                (State::Ext, _) => return Err(ChunkedError("control byte in chunk extension")),
                (State::Size | State::SizeWs, _) => {
                    return Err(ChunkedError("invalid byte in chunk size"))
                }
                (State::SizeLf, b'\n') => {
                    self.digits = 0;
                    if self.size == 0 {
                        State::TrailerStart
                    } else {
                        State::Data
                    }
                }
                (State::DataCr, b'\r') => State::DataLf,
                (State::DataLf, b'\n') => State::SizeStart,
                (State::TrailerLf, b'\n') => State::TrailerStart,
                (State::EndLf, b'\n') => State::Done,
                (State::TrailerStart, b'\r') => State::EndLf,
                (State::TrailerLine, b'\r') => State::TrailerLf,
                (State::TrailerStart | State::TrailerLine, b'\n') => {
                    return Err(ChunkedError("bare LF in trailer"))
                }
                (State::TrailerStart | State::TrailerLine, _) => {
                    self.trailer_bytes += 1;
                    if self.trailer_bytes > MAX_TRAILER_BYTES {
                        return Err(ChunkedError("trailer section too large"));
                    }
                    State::TrailerLine
                }
                (State::DataCr, _) => return Err(ChunkedError("chunk data longer than its size")),
                _ => return Err(ChunkedError("expected CRLF")),
            };
            if self.state == State::Done {
                return Ok(i);
            }
        }
        Ok(i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan_all(input: &[u8]) -> Result<(usize, Vec<u8>, bool), ChunkedError> {
        let mut s = ChunkedScanner::default();
        let mut out = Vec::new();
        let n = s.scan(input, |d| out.extend_from_slice(d))?;
        Ok((n, out, s.is_done()))
    }

    #[test]
    fn decodes_and_finds_the_end() {
        let body = b"5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\n\r\nNEXT";
        let (n, data, done) = scan_all(body).unwrap();
        assert!(done);
        assert_eq!(&body[n..], b"NEXT");
        assert_eq!(data, b"hello world");
    }

    #[test]
    fn trailers_are_part_of_the_body() {
        let body = b"1\r\na\r\n0\r\nX-T: 1\r\nY: 2\r\n\r\nZ";
        let (n, data, done) = scan_all(body).unwrap();
        assert!(done);
        assert_eq!(&body[n..], b"Z");
        assert_eq!(data, b"a");
    }

    #[test]
    fn trailers_are_kept_when_asked() {
        let body = b"1\r\na\r\n0\r\ngrpc-status: 0\r\nY: 2\r\n\r\nZ";
        let mut s = ChunkedScanner::keeping_trailers();
        for b in body {
            s.scan(std::slice::from_ref(b), |_| {}).unwrap();
        }
        assert_eq!(s.take_trailers(), b"grpc-status: 0\r\nY: 2\r\n");
        let mut none = ChunkedScanner::keeping_trailers();
        none.scan(b"0\r\n\r\n", |_| {}).unwrap();
        assert!(none.is_done() && none.take_trailers().is_empty());
    }

    #[test]
    fn works_byte_by_byte() {
        let body = b"A\r\n0123456789\r\n0\r\n\r\n";
        let mut s = ChunkedScanner::default();
        let mut out = Vec::new();
        for (i, b) in body.iter().enumerate() {
            assert_eq!(
                s.scan(std::slice::from_ref(b), |d| out.extend_from_slice(d)),
                Ok(1)
            );
            assert_eq!(s.is_done(), i == body.len() - 1);
        }
        assert_eq!(out, b"0123456789");
    }

    #[test]
    fn refuses_ambiguous_framing() {
        for bad in [
            &b"5\nhello\r\n0\r\n\r\n"[..],
            b"5\r\nhello\n0\r\n\r\n",
            b"5\r\nhelloX\r\n0\r\n\r\n",
            b"x\r\n",
            b"\r\n",
            b"-5\r\n",
            b"fffffffffffffffff\r\n",
            b"0\r\nX: 1\n\r\n",
            b"1;a\nb\r\n",
            b"0\r\n\n",
        ] {
            assert!(scan_all(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
    }
}
