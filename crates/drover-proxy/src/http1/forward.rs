//! The head a backend sees: the client's request line and end-to-end fields, minus
//! what describes only the client's hop, plus drover's forwarding fields
//! (`X-Forwarded-For`, `-Proto`, `-Host`, RFC 7239 `Forwarded`, an `x-request-id`).

use super::headers::{self, is, put_header, ConnectionOptions};
use crate::routes::Strip;

/// Facts about the client connection the forwarding headers need, formatted once per
/// connection rather than per request.
#[derive(Debug, Clone)]
pub struct ClientInfo {
    /// The client's address (as a PROXY protocol header named it, if one came), for the
    /// header drover sends on (`send_proxy_protocol`).
    pub addr: std::net::SocketAddr,
    /// The client IP as text, for `X-Forwarded-For` and `hash` on client IP.
    pub ip: String,
    /// The same as an RFC 7239 node (`1.2.3.4` or `"[::1]"`).
    pub forwarded_node: String,
    pub proto: &'static str,
    /// The address the client connected to (see `server_authority`).
    pub server: std::net::SocketAddr,
    /// The client's own `X-Forwarded-Proto` and `X-Forwarded-Host` go on unchanged: it
    /// is on a loopback or private address, so taken for a proxy in front (nginx on the
    /// same machine, a cloud load balancer that terminates TLS), as Express's
    /// `trust proxy` preset "loopback, linklocal, uniquelocal" and Rails' default trusted
    /// proxies take it. From a public address drover writes its own. A balancer's
    /// `forwarded_headers` list replaces this rule (`ProxyOptions::forwarded_headers_from`).
    pub keeps_forwarded: bool,
    /// Its listener asks clients for certificates (`client_ca`): a client's own
    /// `X-Forwarded-Client-Cert` is dropped, and `client_cert` (the certificate it
    /// presented, if any) sent in its place.
    pub asks_client_cert: bool,
    pub client_cert: Option<std::sync::Arc<str>>,
}

impl ClientInfo {
    /// `server` is the connection's local address: where the client connected.
    pub fn new(
        peer: std::net::SocketAddr,
        server: std::net::SocketAddr,
        proto: &'static str,
    ) -> Self {
        // On a listener bound to `[::]` (dual-stack), an IPv4 client arrives as
        // `::ffff:a.b.c.d`: it is named by its IPv4 address, as it connected.
        let canonical =
            |a: std::net::SocketAddr| std::net::SocketAddr::new(a.ip().to_canonical(), a.port());
        let (peer, server) = (canonical(peer), canonical(server));
        let ip = peer.ip().to_string();
        let forwarded_node = match peer.ip() {
            std::net::IpAddr::V4(_) => ip.clone(),
            std::net::IpAddr::V6(_) => format!("\"[{ip}]\""),
        };
        ClientInfo {
            addr: peer,
            ip,
            forwarded_node,
            proto,
            server,
            keeps_forwarded: is_local_or_private(peer.ip()),
            asks_client_cert: false,
            client_cert: None,
        }
    }

    /// The address the client connected to as a `Host` value (`127.0.0.1:8000`,
    /// `[::1]:8443`; no port when it is the scheme's own): sent on for an HTTP/1.0
    /// request that named no host, since the HTTP/1.1 request drover makes of it must
    /// have one. Formatted only then: most requests name their host.
    pub fn server_authority(&self) -> String {
        let default_port = if self.proto == "https" { 443 } else { 80 };
        match (self.server.ip(), self.server.port()) {
            (std::net::IpAddr::V4(v4), p) if p == default_port => v4.to_string(),
            (std::net::IpAddr::V6(v6), p) if p == default_port => format!("[{v6}]"),
            _ => self.server.to_string(),
        }
    }
}

/// Loopback, private (RFC 1918, IPv6 unique local) or link-local: a proxy in front of
/// drover is on one of these.
fn is_local_or_private(ip: std::net::IpAddr) -> bool {
    match ip {
        std::net::IpAddr::V4(v4) => v4.is_loopback() || v4.is_private() || v4.is_link_local(),
        std::net::IpAddr::V6(v6) => {
            v6.is_loopback() || v6.is_unique_local() || v6.is_unicast_link_local()
        }
    }
}

/// What parsing found that the forwarded head depends on.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Forwarding<'a> {
    /// The target in origin form (an absolute-form one's path and query).
    pub target: &'a str,
    /// A Host drover writes in place of the client's fields (see `request::parse`).
    pub send_host: Option<&'a [u8]>,
    pub conn: ConnectionOptions,
    /// A protocol upgrade (WebSocket) goes through: keep `Upgrade`, say `Connection: upgrade`.
    pub upgrade: bool,
    pub host: Option<&'a [u8]>,
    /// The client's own `X-Forwarded-For` and `Forwarded`, which drover's extend.
    pub xff: Option<&'a [u8]>,
    pub forwarded: Option<&'a [u8]>,
    /// The client's own `X-Forwarded-Proto` and `X-Forwarded-Host` (one field each),
    /// passed on when `ClientInfo::keeps_forwarded`.
    pub proto: Option<&'a [u8]>,
    pub forwarded_host: Option<&'a [u8]>,
    pub has_request_id: bool,
    /// The prefix of the path the route that picked the balancer strips (`routes`).
    pub strip: Option<Strip>,
}

/// Writes the head the backend sees for `req` into `out`.
pub(crate) fn write_backend_head(
    out: &mut Vec<u8>,
    req: &httparse::Request<'_, '_>,
    f: &Forwarding<'_>,
    client: &ClientInfo,
) {
    let Forwarding {
        target,
        send_host,
        conn,
        upgrade,
        host,
        xff,
        forwarded,
        proto,
        forwarded_host,
        has_request_id,
        strip,
    } = *f;
    // A proxy in front said how its client came, and to which host: an app behind both
    // (Express's `req.secure`, `req.hostname` with `trust proxy`) must hear it, or its
    // redirect to HTTPS loops and its secure cookies are never set.
    let keeps = client.keeps_forwarded;
    let forwarded_host = forwarded_host.filter(|_| keeps).or(host);
    let proto = proto.filter(|_| keeps).unwrap_or(client.proto.as_bytes());
    out.clear();
    out.extend_from_slice(req.method.unwrap_or("GET").as_bytes());
    out.push(b' ');
    // With a stripped prefix, the path from where it ended, in origin form.
    let prefix = strip.map(|Strip { len }| {
        let rest = &target[len..];
        if !rest.starts_with('/') {
            out.push(b'/');
        }
        out.extend_from_slice(rest.as_bytes());
        target[..len].trim_end_matches('/')
    });
    if prefix.is_none() {
        out.extend_from_slice(target.as_bytes());
    }
    out.extend_from_slice(b" HTTP/1.1\r\n");
    for h in req.headers.iter() {
        let name = h.name;
        let drop = headers::is_hop_by_hop(name)
            || (is(name, "host") && send_host.is_some())
            || is(name, "expect")
            || is(name, "x-forwarded-for")
            || is(name, "x-forwarded-proto")
            || is(name, "x-forwarded-host")
            || is(name, "forwarded")
            || (is(name, "x-forwarded-prefix") && prefix.is_some())
            || (is(name, "upgrade") && !upgrade)
            || (client.asks_client_cert && is(name, "x-forwarded-client-cert"))
            || headers::named_by_connection(name, &conn, req.headers);
        if !drop {
            put_header(out, name.as_bytes(), h.value);
        }
    }
    if let Some(host) = send_host {
        put_header(out, b"Host", host);
    }
    put_header(out, b"X-Forwarded-Proto", proto);
    if let Some(host) = forwarded_host {
        put_header(out, b"X-Forwarded-Host", host);
    }
    if let Some(prefix) = prefix {
        put_header(out, b"X-Forwarded-Prefix", prefix.as_bytes());
    }
    if let Some(cert) = &client.client_cert {
        put_header(out, b"X-Forwarded-Client-Cert", cert.as_bytes());
    }
    if !has_request_id {
        out.extend_from_slice(b"x-request-id: ");
        crate::request_id::write_new(out);
        out.extend_from_slice(b"\r\n");
    }
    if upgrade {
        out.extend_from_slice(b"Connection: upgrade\r\n");
    }
    // The two fields that name the client come last, X-Forwarded-For then Forwarded:
    // drover's preload in a Node worker finds them there and takes drover's element off
    // at little cost (the worker's socket gives the client's address instead).
    out.extend_from_slice(b"X-Forwarded-For: ");
    if let Some(prev) = xff {
        out.extend_from_slice(prev);
        out.extend_from_slice(b", ");
    }
    out.extend_from_slice(client.ip.as_bytes());
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(b"Forwarded: ");
    if let Some(prev) = forwarded {
        out.extend_from_slice(prev);
        out.extend_from_slice(b", ");
    }
    out.extend_from_slice(b"for=");
    out.extend_from_slice(client.forwarded_node.as_bytes());
    if let Some(host) = host.filter(|h| h.iter().all(|&b| b.is_ascii_graphic() && b != b'"')) {
        out.extend_from_slice(b";host=\"");
        out.extend_from_slice(host);
        out.push(b'"');
    }
    out.extend_from_slice(b";proto=");
    out.extend_from_slice(client.proto.as_bytes());
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(b"\r\n");
}
