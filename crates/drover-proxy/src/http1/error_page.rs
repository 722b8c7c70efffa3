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

pub fn reason_phrase(status: u16) -> &'static str {
    match status {
        400 => "Bad Request",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        413 => "Content Too Large",
        414 => "URI Too Long",
        417 => "Expectation Failed",
        431 => "Request Header Fields Too Large",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Error",
    }
}
