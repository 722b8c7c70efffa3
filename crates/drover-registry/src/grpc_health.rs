//! The gRPC health checking protocol (`grpc.health.v1.Health/Check`) as a probe writes
//! and reads it: the request as the HTTP/1.1 a balancer's HTTP/2 probe stream takes
//! (`drover_proxy::H2Probe` turns it into HEADERS and DATA), and the answer as that
//! stream gives it back: a head, a chunked body with the one response message, and
//! `grpc-status` in the head (a trailers-only answer) or the trailer section.
//!
//! The two messages have one field each (`HealthCheckRequest.service = 1`,
//! `HealthCheckResponse.status = 1`), so they are encoded and decoded here, by the
//! protobuf wire format's rules, rather than with a protobuf library and generated code.

use std::fmt;

/// The method's path.
const PATH: &str = "/grpc.health.v1.Health/Check";

/// `HealthCheckResponse.ServingStatus.SERVING`.
const SERVING: u64 = 1;

/// Why a gRPC health check failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GrpcHealthError {
    /// The call failed: its `grpc-status` (12 UNIMPLEMENTED: no health service) and
    /// message.
    Status(u32, String),
    /// The call succeeded, but the service is not serving (its status: 0 UNKNOWN,
    /// 2 NOT_SERVING, 3 SERVICE_UNKNOWN).
    NotServing(u64),
    /// The answer could not be read as the protocol's.
    Malformed(&'static str),
}

impl fmt::Display for GrpcHealthError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GrpcHealthError::Status(code, message) => {
                write!(f, "gRPC health check failed: grpc-status {code}")?;
                if *code == 12 {
                    f.write_str(
                        " (UNIMPLEMENTED: the server has no grpc.health.v1.Health service)",
                    )?;
                }
                if !message.is_empty() {
                    write!(f, ": {message}")?;
                }
                Ok(())
            }
            GrpcHealthError::NotServing(status) => {
                let name = match status {
                    0 => "UNKNOWN",
                    2 => "NOT_SERVING",
                    3 => "SERVICE_UNKNOWN",
                    _ => "not SERVING",
                };
                write!(f, "gRPC health: {name} ({status})")
            }
            GrpcHealthError::Malformed(why) => write!(f, "gRPC health answer: {why}"),
        }
    }
}

/// The request for `service` ("": the server as a whole), to `authority`.
pub fn request(service: &str, authority: &str) -> Vec<u8> {
    let mut message = Vec::new();
    if !service.is_empty() {
        message.push(0x0a); // field 1, length-delimited
        put_varint(&mut message, service.len() as u64);
        message.extend_from_slice(service.as_bytes());
    }
    let mut out = format!(
        "POST {PATH} HTTP/1.1\r\nHost: {authority}\r\nUser-Agent: drover-health\r\nContent-Type: application/grpc\r\nContent-Length: {}\r\n\r\n",
        5 + message.len()
    )
    .into_bytes();
    out.push(0); // not compressed
    out.extend_from_slice(&(message.len() as u32).to_be_bytes());
    out.extend_from_slice(&message);
    out
}

/// Reads the whole answer (`answer`: everything up to the stream's end): `Ok` when the
/// call succeeded and the status is SERVING. An HTTP status other than 200 is
/// `Err(Ok(status))`.
pub fn verdict(answer: &[u8]) -> Result<(), Result<u16, GrpcHealthError>> {
    let mut slots = [httparse::EMPTY_HEADER; 32];
    let mut response = httparse::Response::new(&mut slots);
    let head_len = match response.parse(answer) {
        Ok(httparse::Status::Complete(n)) => n,
        _ => return Err(Err(GrpcHealthError::Malformed("no whole response head"))),
    };
    let status = response.code.unwrap_or(0);
    if status != 200 {
        return Err(Ok(status));
    }
    let chunked = response
        .headers
        .iter()
        .any(|h| h.name.eq_ignore_ascii_case("transfer-encoding"));
    let mut grpc = grpc_status(response.headers);
    let body = &answer[head_len..];
    let (message, trailers) = if chunked {
        dechunk(body).ok_or(Err(GrpcHealthError::Malformed("bad chunked body")))?
    } else {
        (body.to_vec(), Vec::new())
    };
    if !trailers.is_empty() {
        let mut slots = [httparse::EMPTY_HEADER; 32];
        let mut section = trailers;
        section.extend_from_slice(b"\r\n");
        if let Ok(httparse::Status::Complete((_, fields))) =
            httparse::parse_headers(&section, &mut slots)
        {
            grpc = grpc.or(grpc_status(fields));
        }
    }
    match grpc {
        Some((0, _)) => {}
        Some((code, message)) => return Err(Err(GrpcHealthError::Status(code, message))),
        None => return Err(Err(GrpcHealthError::Malformed("no grpc-status"))),
    }
    let status = serving_status(&message).map_err(|why| Err(GrpcHealthError::Malformed(why)))?;
    if status == SERVING {
        Ok(())
    } else {
        Err(Err(GrpcHealthError::NotServing(status)))
    }
}

/// `grpc-status` and `grpc-message` among `fields`, if the status is there.
fn grpc_status(fields: &[httparse::Header<'_>]) -> Option<(u32, String)> {
    let find = |name: &str| {
        fields
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| String::from_utf8_lossy(h.value).into_owned())
    };
    let code = find("grpc-status")?.trim().parse().unwrap_or(u32::MAX);
    Some((code, find("grpc-message").unwrap_or_default()))
}

/// A chunked body's payload and trailer lines, or `None` if it is not chunked as it
/// should be (drover's own stream wrote it, whole).
fn dechunk(mut body: &[u8]) -> Option<(Vec<u8>, Vec<u8>)> {
    let mut payload = Vec::new();
    loop {
        let line_end = body.windows(2).position(|w| w == b"\r\n")?;
        let size = std::str::from_utf8(&body[..line_end]).ok()?;
        let size = usize::from_str_radix(size.split(';').next()?.trim(), 16).ok()?;
        body = &body[line_end + 2..];
        if size == 0 {
            let trailers = body.strip_suffix(b"\r\n")?;
            return Some((payload, trailers.to_vec()));
        }
        if body.len() < size + 2 || &body[size..size + 2] != b"\r\n" {
            return None;
        }
        payload.extend_from_slice(&body[..size]);
        body = &body[size + 2..];
    }
}

/// `HealthCheckResponse.status` from the body's one message (0 when absent, as
/// protobuf's default).
fn serving_status(body: &[u8]) -> Result<u64, &'static str> {
    if body.len() < 5 {
        return Err("no response message");
    }
    if body[0] != 0 {
        return Err("a compressed response message");
    }
    let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
    let mut message = body.get(5..5 + len).ok_or("a response message cut short")?;
    let mut status = 0;
    while !message.is_empty() {
        let key = varint(&mut message).ok_or("bad field key")?;
        match (key >> 3, key & 7) {
            (1, 0) => status = varint(&mut message).ok_or("bad status")?,
            (_, 0) => {
                varint(&mut message).ok_or("bad field")?;
            }
            (_, 1) => message = message.get(8..).ok_or("bad field")?,
            (_, 5) => message = message.get(4..).ok_or("bad field")?,
            (_, 2) => {
                let n = varint(&mut message).ok_or("bad field")? as usize;
                message = message.get(n..).ok_or("bad field")?;
            }
            _ => return Err("bad wire type"),
        }
    }
    Ok(status)
}

fn varint(bytes: &mut &[u8]) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let (&b, rest) = bytes.split_first()?;
        *bytes = rest;
        value |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(message: &[u8], trailers: &str) -> Vec<u8> {
        let mut framed = vec![0];
        framed.extend_from_slice(&(message.len() as u32).to_be_bytes());
        framed.extend_from_slice(message);
        let mut out = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/grpc\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n",
            framed.len()
        )
        .into_bytes();
        out.extend_from_slice(&framed);
        out.extend_from_slice(format!("\r\n0\r\n{trailers}\r\n").as_bytes());
        out
    }

    #[test]
    fn the_request_names_its_service() {
        let whole = request("", "10.0.0.1:50051");
        assert!(whole.starts_with(b"POST /grpc.health.v1.Health/Check HTTP/1.1\r\n"));
        assert!(whole.ends_with(b"Content-Length: 5\r\n\r\n\0\0\0\0\0"));
        let named = request("pkg.Svc", "h");
        assert!(named.ends_with(b"\0\0\0\0\x09\x0a\x07pkg.Svc"));
    }

    #[test]
    fn serving_passes_and_everything_else_says_why() {
        assert_eq!(verdict(&answer(&[0x08, 1], "grpc-status: 0\r\n")), Ok(()));
        // Unknown fields are skipped.
        assert_eq!(
            verdict(&answer(
                &[0x12, 2, b'h', b'i', 0x08, 1],
                "grpc-status: 0\r\n"
            )),
            Ok(())
        );
        assert_eq!(
            verdict(&answer(&[0x08, 2], "grpc-status: 0\r\n")),
            Err(Err(GrpcHealthError::NotServing(2)))
        );
        assert_eq!(
            verdict(&answer(&[], "grpc-status: 0\r\n")),
            Err(Err(GrpcHealthError::NotServing(0)))
        );
        // A trailers-only answer: the status in the head.
        let unimplemented = b"HTTP/1.1 200 OK\r\ngrpc-status: 12\r\ngrpc-message: unknown service\r\ncontent-length: 0\r\n\r\n";
        let e = verdict(unimplemented).unwrap_err().unwrap_err();
        assert_eq!(e, GrpcHealthError::Status(12, "unknown service".into()));
        assert!(e.to_string().contains("UNIMPLEMENTED"), "{e}");
        assert_eq!(verdict(b"HTTP/1.1 503 x\r\n\r\n"), Err(Ok(503)));
        assert!(verdict(&answer(&[0x08, 1], "")).is_err(), "no grpc-status");
        assert!(verdict(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n").is_err());
    }
}
