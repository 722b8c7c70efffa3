//! The answer of a balancer that redirects to HTTPS (`redirect_to_https`): a 308 to the
//! same host and target over HTTPS, as nginx's `return 301 https://$host$request_uri`
//! (308 keeps the method and body, where a 301 lets clients turn a POST into a GET).

use super::HeadSlots;
use std::io::Write;

/// Writes the redirect for the request whose head, as drover would forward it, is
/// `backend_head` (parsed and checked already), to `https://HOST[:port]TARGET`; the port
/// is left out when it is 443. `Err` names why the request cannot be redirected.
pub fn write(
    out: &mut Vec<u8>,
    backend_head: &[u8],
    port: u16,
    close: bool,
) -> Result<(), &'static str> {
    // The forwarded head carries a few fields of drover's own beside the client's.
    let mut slots = HeadSlots::new();
    let (parsed, req) = slots.request(backend_head, usize::MAX);
    if !matches!(parsed, Ok(httparse::Status::Complete(_))) {
        return Err("request head not understood");
    }
    let target = req.path.unwrap_or("/");
    if !target.starts_with('/') {
        return Err("a redirect to HTTPS needs a target that starts with /");
    }
    let host = req
        .headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("host"))
        .map(|h| h.value)
        .ok_or("a redirect to HTTPS needs a Host")?;
    let host = hostname(host).ok_or("the Host is not a name or address to redirect to")?;
    out.clear();
    let _ = write!(
        out,
        "HTTP/1.1 308 Permanent Redirect\r\nlocation: https://{host}"
    );
    if port != 443 {
        let _ = write!(out, ":{port}");
    }
    out.extend_from_slice(target.as_bytes());
    out.extend_from_slice(b"\r\ncontent-length: 0\r\n");
    if close {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
    Ok(())
}

/// The host of a `Host` value without its port: a DNS name, an IPv4 address or an IPv6
/// literal in brackets; `None` for anything else (it goes into a Location as it is).
fn hostname(value: &[u8]) -> Option<&str> {
    let value = std::str::from_utf8(value).ok()?.trim();
    let host = if value.starts_with('[') {
        &value[..=value.find(']')?]
    } else {
        value.split(':').next()?
    };
    let name_char = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '.';
    let ipv6_char = |c: char| c.is_ascii_hexdigit() || c == ':' || c == '.';
    let ok = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(v6) => !v6.is_empty() && v6.chars().all(ipv6_char),
        None => !host.is_empty() && host.chars().all(name_char),
    };
    ok.then_some(host)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn redirect(head: &str, port: u16) -> Result<String, &'static str> {
        let mut out = Vec::new();
        write(&mut out, head.as_bytes(), port, false)?;
        Ok(String::from_utf8(out).unwrap())
    }

    #[test]
    fn same_host_and_target_over_https() {
        let r = redirect("GET /a/b?c=d HTTP/1.1\r\nHost: Example.com:80\r\n\r\n", 443).unwrap();
        assert_eq!(
            r,
            "HTTP/1.1 308 Permanent Redirect\r\nlocation: https://Example.com/a/b?c=d\r\ncontent-length: 0\r\n\r\n"
        );
        let r = redirect("GET / HTTP/1.1\r\nhost: [::1]:8080\r\n\r\n", 8443).unwrap();
        assert!(r.contains("location: https://[::1]:8443/\r\n"), "{r}");
        let r = redirect("GET /x HTTP/1.1\r\nHost: 10.0.0.1\r\n\r\n", 443).unwrap();
        assert!(r.contains("location: https://10.0.0.1/x\r\n"), "{r}");
    }

    #[test]
    fn what_cannot_be_redirected_is_refused() {
        for host in ["", "a b", "evil.test/path", "a\"b", "[::1", "[zz]", "a@b"] {
            let head = format!("GET / HTTP/1.1\r\nHost: {host}\r\n\r\n");
            assert!(redirect(&head, 443).is_err(), "{host:?}");
        }
        assert!(redirect("GET / HTTP/1.1\r\nX: y\r\n\r\n", 443).is_err());
        assert!(redirect("OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n", 443).is_err());
    }
}
