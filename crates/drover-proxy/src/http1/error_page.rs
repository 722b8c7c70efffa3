//! drover's own answers: the small error responses a client gets when drover, not a
//! backend, refuses or fails its request, each naming its cause in `drover-error`.

use std::io::Write;

/// Writes a small error response with a `drover-error` header naming the cause.
/// An error answer of drover's own; `retry_after` adds a `Retry-After` in seconds.
pub fn write_error(
    out: &mut Vec<u8>,
    status: u16,
    cause: &str,
    detail: &str,
    close: bool,
    retry_after: Option<u32>,
) {
    out.clear();
    let _ = write!(
        out,
        "HTTP/1.1 {status} {}\r\ncontent-type: text/plain; charset=utf-8\r\ndrover-error: {cause}\r\ncontent-length: {}\r\n",
        reason_phrase(status),
        detail.len() + 1,
    );
    if let Some(secs) = retry_after {
        let _ = write!(out, "retry-after: {secs}\r\n");
    }
    let _ = write!(
        out,
        "{}\r\n{detail}\n",
        if close { "connection: close\r\n" } else { "" }
    );
}

/// The status's reason phrase as RFC 9110 names it (`Content Too Large` for 413, which
/// the `http` crate still calls by RFC 7231's name; `Not Implemented` for 501).
pub fn reason_phrase(status: u16) -> &'static str {
    match status {
        413 => "Content Too Large",
        _ => http::StatusCode::from_u16(status)
            .ok()
            .and_then(|s| s.canonical_reason())
            .unwrap_or("Error"),
    }
}

#[cfg(test)]
mod tests {
    use super::reason_phrase;

    #[test]
    fn every_status_drover_answers_with_has_its_reason() {
        for (status, reason) in [
            (400, "Bad Request"),
            (404, "Not Found"),
            (413, "Content Too Large"),
            (431, "Request Header Fields Too Large"),
            (501, "Not Implemented"),
            (503, "Service Unavailable"),
            (599, "Error"),
        ] {
            assert_eq!(reason_phrase(status), reason);
        }
    }
}
