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

/// drover's own error answer to a gRPC call, as gRPC clients read one: `200` with the
/// status in the headers and no body ("Trailers-Only", which goes to an HTTP/2 client
/// as one HEADERS frame that ends the stream). A bare `502` reached a gRPC client as
/// "Received HTTP status code 502", drover's reason lost (gRPC seat #3); now it reads
/// `UNAVAILABLE: all endpoints failed to connect` and the cause in `drover-error`, as
/// Envoy answers. `status` is the HTTP status drover would have sent, which gives the
/// gRPC code (`grpc_code`).
pub fn write_grpc_error(out: &mut Vec<u8>, status: u16, cause: &str, detail: &str, close: bool) {
    out.clear();
    let _ = write!(
        out,
        "HTTP/1.1 200 OK\r\ncontent-type: application/grpc\r\ngrpc-status: {}\r\ngrpc-message: ",
        grpc_code(status),
    );
    // Percent-encoded as gRPC's spec asks: '%' and what is not printable ASCII.
    for &b in detail.as_bytes() {
        if (0x20..0x7f).contains(&b) && b != b'%' {
            out.push(b);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    let _ = write!(
        out,
        "\r\ndrover-error: {cause}\r\ncontent-length: 0\r\n{}\r\n",
        if close { "connection: close\r\n" } else { "" }
    );
}

/// The gRPC status code for an HTTP status drover answers with, as gRPC's
/// http-grpc-status-mapping and Envoy's local replies give it; a timeout is
/// DEADLINE_EXCEEDED (4).
fn grpc_code(status: u16) -> u8 {
    match status {
        400 => 13,             // INTERNAL
        401 => 16,             // UNAUTHENTICATED
        403 => 7,              // PERMISSION_DENIED
        404 => 12,             // UNIMPLEMENTED
        408 | 504 => 4,        // DEADLINE_EXCEEDED
        413 | 431 => 8,        // RESOURCE_EXHAUSTED
        429 | 502 | 503 => 14, // UNAVAILABLE
        _ => 2,                // UNKNOWN
    }
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
    use super::{reason_phrase, write_grpc_error};

    #[test]
    fn a_grpc_error_carries_its_status_and_an_encoded_message() {
        let mut out = Vec::new();
        write_grpc_error(
            &mut out,
            503,
            "connect-failed",
            "no backend: 100% down\n",
            false,
        );
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
        assert!(text.contains("\r\ngrpc-status: 14\r\n"), "{text}");
        assert!(
            text.contains("\r\ngrpc-message: no backend: 100%25 down%0A\r\n"),
            "{text}"
        );
        assert!(text.ends_with("content-length: 0\r\n\r\n"), "{text}");
    }

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
