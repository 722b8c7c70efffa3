//! The PROXY protocol (v1 text and v2 binary, HAProxy's spec), as a listener behind
//! another balancer reads it: the sender writes one header naming the client before any
//! byte of the client's, and drover takes that client's address for everything it does
//! with one (`X-Forwarded-For`, `Forwarded`, `hash` on `client-ip`, logs).
//!
//! A header is a claim anyone can make, so it is believed only from the senders the
//! configuration trusts, and those must send one: a connection from any other address is
//! closed unread, and so is one from a trusted sender whose header is missing, invalid
//! or late (nginx's `proxy_protocol` and HAProxy's `accept-proxy` also refuse a
//! connection without a header). A `LOCAL` header (the sender's own health check) keeps
//! the sender's address. Parsing is the `ppp` crate's.

use drover_metrics::{BalancerStats, ProxyRefusal};
use ipnet::IpNet;
use ppp::v1;
use ppp::v2;
use ppp::{HeaderResult, PartialResult};
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio::time::Instant;
use tracing::debug;

/// A v2 header may carry up to 64 KiB of TLVs; drover needs none of them, and a header
/// this long from a trusted sender is refused rather than buffered.
const MAX_HEADER: usize = 4096;

/// The longest v1 header, CRLF included (the spec's 107 bytes).
const V1_MAX: usize = 107;

/// The addresses allowed to send a PROXY protocol header: single addresses or CIDR
/// ranges (`10.0.0.0/8`, `127.0.0.1`, `::1`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrustedSenders(Vec<IpNet>);

impl TrustedSenders {
    pub fn new(ranges: Vec<IpNet>) -> TrustedSenders {
        TrustedSenders(ranges)
    }

    pub fn trusts(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.0.iter().any(|range| range.contains(&ip))
    }

    pub fn ranges(&self) -> &[IpNet] {
        &self.0
    }
}

/// One address or CIDR range, as a flag or the file writes it.
pub fn parse_range(s: &str) -> Result<IpNet, String> {
    let s = s.trim();
    IpNet::from_str(s)
        .or_else(|_| IpAddr::from_str(s).map(IpNet::from))
        .map_err(|_| {
            format!("invalid address or CIDR range {s:?} (e.g. 10.0.0.0/8, 127.0.0.1, ::1)")
        })
}

impl FromStr for TrustedSenders {
    type Err = String;

    /// A comma-separated list (`--proxy-protocol-from 10.0.0.0/8,127.0.0.1`).
    fn from_str(s: &str) -> Result<TrustedSenders, String> {
        let ranges = s
            .split(',')
            .filter(|part| !part.trim().is_empty())
            .map(parse_range)
            .collect::<Result<Vec<_>, _>>()?;
        if ranges.is_empty() {
            return Err("no address: name the senders to trust, e.g. 10.0.0.0/8".into());
        }
        Ok(TrustedSenders(ranges))
    }
}

impl fmt::Display for TrustedSenders {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.0.iter().map(IpNet::to_string).collect();
        f.write_str(&parts.join(","))
    }
}

/// Why a trusted sender's connection was closed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeaderError {
    /// The bytes are no PROXY header.
    Invalid(String),
    TooLong,
    /// The connection ended, or the header did not complete in time.
    Incomplete,
}

impl fmt::Display for HeaderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HeaderError::Invalid(why) => write!(f, "invalid PROXY protocol header: {why}"),
            HeaderError::TooLong => write!(f, "PROXY protocol header over {MAX_HEADER} bytes"),
            HeaderError::Incomplete => f.write_str("no complete PROXY protocol header in time"),
        }
    }
}

/// What a complete header says, and how many bytes of the input it took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// The client it names; `None` for `LOCAL` or `UNKNOWN` (the sender speaking for
    /// itself).
    pub client: Option<SocketAddr>,
    pub len: usize,
}

/// Parses a header at the start of `bytes`: `Ok(None)` while more bytes may complete it.
pub fn parse(bytes: &[u8]) -> Result<Option<Header>, HeaderError> {
    let parsed = HeaderResult::parse(bytes);
    if parsed.is_incomplete() {
        return if bytes.len() >= MAX_HEADER {
            Err(HeaderError::TooLong)
        } else {
            Ok(None)
        };
    }
    let header = match parsed {
        // A v1 header ends at its CRLF; the parser also takes `PROXY UNKNOWN` at the end
        // of the input without one, which on a stream only means the rest is on its way.
        HeaderResult::V1(Ok(h)) if !h.header.ends_with("\r\n") => {
            return if bytes.len() >= V1_MAX {
                Err(HeaderError::Invalid("no CRLF within 107 bytes".into()))
            } else {
                Ok(None)
            };
        }
        HeaderResult::V1(Ok(h)) => Header {
            client: match h.addresses {
                v1::Addresses::Tcp4(a) => Some((a.source_address, a.source_port).into()),
                v1::Addresses::Tcp6(a) => Some((a.source_address, a.source_port).into()),
                v1::Addresses::Unknown => None,
            },
            len: h.header.len(),
        },
        HeaderResult::V2(Ok(h)) => Header {
            client: match (h.command, h.addresses) {
                (v2::Command::Proxy, v2::Addresses::IPv4(a)) => {
                    Some((a.source_address, a.source_port).into())
                }
                (v2::Command::Proxy, v2::Addresses::IPv6(a)) => {
                    Some((a.source_address, a.source_port).into())
                }
                _ => None,
            },
            len: h.len(),
        },
        HeaderResult::V1(Err(e)) => return Err(HeaderError::Invalid(e.to_string())),
        HeaderResult::V2(Err(e)) => return Err(HeaderError::Invalid(e.to_string())),
    };
    if header.len > MAX_HEADER {
        return Err(HeaderError::TooLong);
    }
    Ok(Some(header))
}

/// Reads the header a trusted sender starts `stream` with, by `deadline`. Returns the
/// client it names (`None`: the sender's own); what came after the header stays in
/// `buf` for the HTTP parser.
async fn read_header(
    stream: &mut TcpStream,
    buf: &mut Vec<u8>,
    deadline: Instant,
) -> Result<Option<SocketAddr>, HeaderError> {
    loop {
        if let Some(header) = parse(buf)? {
            buf.drain(..header.len);
            return Ok(header.client);
        }
        buf.reserve(512);
        match tokio::time::timeout_at(deadline, stream.read_buf(buf)).await {
            Ok(Ok(n)) if n > 0 => {}
            _ => return Err(HeaderError::Incomplete),
        }
    }
}

/// The client a connection accepted from `peer` speaks for, on a listener that reads
/// PROXY headers (HTTP and TCP modes alike): the header's client, or `peer` for a
/// `LOCAL` one. `None`: the sender is not trusted, or its header was bad, missing or not
/// complete by `deadline`; the refusal is counted and the caller closes the connection
/// unread. Bytes that came after the header stay in `buf`: they are the client's.
pub(crate) async fn read_client(
    trusted: &TrustedSenders,
    stats: &BalancerStats,
    stream: &mut TcpStream,
    buf: &mut Vec<u8>,
    peer: SocketAddr,
    deadline: Instant,
) -> Option<SocketAddr> {
    if !trusted.trusts(peer.ip()) {
        stats.record_proxy_refusal(ProxyRefusal::Untrusted);
        debug!(%peer, "not a trusted PROXY protocol sender: closed");
        return None;
    }
    match read_header(stream, buf, deadline).await {
        Ok(named) => Some(named.unwrap_or(peer)),
        Err(e) => {
            stats.record_proxy_refusal(ProxyRefusal::BadHeader);
            debug!(%peer, "{e}: closed");
            None
        }
    }
}

/// The PROXY protocol version drover sends to backends (`send_proxy_protocol`), as
/// HAProxy's `send-proxy` (v1) and `send-proxy-v2` do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendVersion {
    V1,
    V2,
}

impl FromStr for SendVersion {
    type Err = String;

    fn from_str(s: &str) -> Result<SendVersion, String> {
        match s {
            "v1" => Ok(SendVersion::V1),
            "v2" => Ok(SendVersion::V2),
            other => Err(format!(
                "unknown PROXY protocol version {other:?} (v1: the text header, v2: the binary one)"
            )),
        }
    }
}

impl fmt::Display for SendVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SendVersion::V1 => "v1",
            SendVersion::V2 => "v2",
        })
    }
}

/// The header drover writes first on a backend connection made for the client at
/// `client`, which connected to `local`: the backend then sees the client, not drover.
/// Addresses of two families (an IPv4 client on an IPv6 listener's mapped address
/// excepted) cannot be told in one header; it then says `UNKNOWN` (v1) or `LOCAL` (v2).
pub fn header(version: SendVersion, client: SocketAddr, local: SocketAddr) -> Vec<u8> {
    let (client, local) = same_family(client, local);
    match version {
        SendVersion::V1 => v1::Addresses::from((client, local))
            .to_string()
            .into_bytes(),
        SendVersion::V2 => {
            let same = client.is_ipv4() == local.is_ipv4();
            let built = if same {
                v2::Builder::with_addresses(
                    v2::Version::Two | v2::Command::Proxy,
                    v2::Protocol::Stream,
                    (client, local),
                )
                .build()
            } else {
                return local_header(SendVersion::V2);
            };
            // Building writes into a Vec and fails only on a length over 64 KiB, which
            // two addresses never reach.
            built.expect("a PROXY v2 header of two addresses")
        }
    }
}

/// The header on a connection drover makes for itself (a health check): v2's `LOCAL`,
/// v1's `UNKNOWN`, so a backend that requires a header takes the connection and sees
/// drover as its peer.
pub fn local_header(version: SendVersion) -> Vec<u8> {
    match version {
        SendVersion::V1 => v1::Addresses::Unknown.to_string().into_bytes(),
        SendVersion::V2 => v2::Builder::new(
            v2::Version::Two | v2::Command::Local,
            v2::AddressFamily::Unspecified | v2::Protocol::Unspecified,
        )
        .build()
        .expect("a PROXY v2 header without addresses"),
    }
}

/// An IPv4 client that reached an IPv6 socket as `::ffff:a.b.c.d` is an IPv4 client:
/// both addresses in the family they really are, where they can be.
fn same_family(client: SocketAddr, local: SocketAddr) -> (SocketAddr, SocketAddr) {
    let canonical = |a: SocketAddr| SocketAddr::new(a.ip().to_canonical(), a.port());
    (canonical(client), canonical(local))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_sent_names_the_client_to_a_reader() {
        let client: SocketAddr = "203.0.113.7:51234".parse().unwrap();
        let local: SocketAddr = "10.0.0.1:80".parse().unwrap();
        let v1 = header(SendVersion::V1, client, local);
        assert_eq!(v1, b"PROXY TCP4 203.0.113.7 10.0.0.1 51234 80\r\n");
        for version in [SendVersion::V1, SendVersion::V2] {
            let bytes = header(version, client, local);
            let parsed = parse(&bytes).unwrap().unwrap();
            assert_eq!((parsed.client, parsed.len), (Some(client), bytes.len()));
            // IPv6, and an IPv4 client seen through an IPv6 socket.
            let six: SocketAddr = "[2001:db8::1]:4000".parse().unwrap();
            let bytes = header(version, six, "[2001:db8::2]:443".parse().unwrap());
            assert_eq!(parse(&bytes).unwrap().unwrap().client, Some(six));
            let mapped: SocketAddr = "[::ffff:198.51.100.9]:8080".parse().unwrap();
            let bytes = header(version, mapped, "[::ffff:10.0.0.1]:80".parse().unwrap());
            let want: SocketAddr = "198.51.100.9:8080".parse().unwrap();
            assert_eq!(parse(&bytes).unwrap().unwrap().client, Some(want));
            // Two families cannot share a header: the backend sees drover then.
            let bytes = header(version, client, "[2001:db8::2]:443".parse().unwrap());
            assert_eq!(parse(&bytes).unwrap().unwrap().client, None);
        }
        for version in [SendVersion::V1, SendVersion::V2] {
            let bytes = local_header(version);
            let parsed = parse(&bytes).unwrap().unwrap();
            assert_eq!((parsed.client, parsed.len), (None, bytes.len()));
        }
        assert_eq!("v2".parse::<SendVersion>(), Ok(SendVersion::V2));
        assert!("2".parse::<SendVersion>().unwrap_err().contains("\"2\""));
    }

    #[test]
    fn v1_names_the_client_and_leaves_the_request() {
        let input = b"PROXY TCP4 203.0.113.7 10.0.0.1 51234 80\r\nGET / HTTP/1.1\r\n";
        let h = parse(input).unwrap().unwrap();
        assert_eq!(h.client, Some("203.0.113.7:51234".parse().unwrap()));
        assert_eq!(&input[h.len..], b"GET / HTTP/1.1\r\n");
        let v6 = b"PROXY TCP6 2001:db8::1 2001:db8::2 4000 443\r\n";
        let h = parse(v6).unwrap().unwrap();
        assert_eq!(h.client, Some("[2001:db8::1]:4000".parse().unwrap()));
        assert_eq!(parse(b"PROXY UNKNOWN\r\n").unwrap().unwrap().client, None);
    }

    #[test]
    fn v2_names_the_client_and_local_keeps_the_sender() {
        let mut input = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
        // Version 2, PROXY; TCP over IPv4; 12 address bytes.
        input.extend([
            0x21, 0x11, 0, 12, 198, 51, 100, 9, 10, 0, 0, 1, 0x1f, 0x90, 0, 80,
        ]);
        input.extend(b"GET");
        let h = parse(&input).unwrap().unwrap();
        assert_eq!(h.client, Some("198.51.100.9:8080".parse().unwrap()));
        assert_eq!(&input[h.len..], b"GET");
        let mut local = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
        local.extend([0x20, 0x00, 0, 0]);
        let h = parse(&local).unwrap().unwrap();
        assert_eq!((h.client, h.len), (None, 16));
    }

    #[test]
    fn partial_headers_wait_and_bad_ones_are_refused() {
        assert_eq!(parse(b"PROXY TCP4 203.0.113.7"), Ok(None));
        assert_eq!(parse(b"\r\n\r\n\0\r\n"), Ok(None));
        assert_eq!(parse(b""), Ok(None));
        // Found by fuzzing: `PROXY UNKNOWN` is not a header until its CRLF comes.
        assert_eq!(parse(b"PROXY UNKNOWN"), Ok(None));
        assert_eq!(parse(b"PROXY UNKNOWN PR \nUNC"), Ok(None));
        for bad in [
            &b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"[..],
            b"PROXY TCP4 999.0.0.1 10.0.0.1 1 2\r\n",
            b"PROXY TCP4 203.0.113.7 10.0.0.1 70000 80\r\n",
        ] {
            assert!(
                matches!(parse(bad), Err(HeaderError::Invalid(_))),
                "{:?}: {:?}",
                String::from_utf8_lossy(bad),
                parse(bad)
            );
        }
        // A v2 header that claims 60,000 bytes of TLVs is not buffered to its end.
        let mut long = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
        long.extend([0x21, 0x11, 0xea, 0x60]);
        long.resize(MAX_HEADER, 0);
        assert_eq!(parse(&long), Err(HeaderError::TooLong));
        assert_eq!(parse(&long[..100]), Ok(None));
    }

    #[test]
    fn trusted_senders_are_addresses_and_ranges() {
        let t: TrustedSenders = "10.0.0.0/8, 127.0.0.1,::1".parse().unwrap();
        assert!(t.trusts("10.1.2.3".parse().unwrap()));
        assert!(t.trusts("127.0.0.1".parse().unwrap()));
        assert!(t.trusts("::1".parse().unwrap()));
        // An IPv4 client on a dual-stack listener shows as ::ffff:a.b.c.d.
        assert!(t.trusts("::ffff:10.9.9.9".parse().unwrap()));
        assert!(!t.trusts("192.168.1.1".parse().unwrap()));
        assert!(!t.trusts("127.0.0.2".parse().unwrap()));
        assert_eq!(t.to_string(), "10.0.0.0/8,127.0.0.1/32,::1/128");
        for bad in ["", "10.0.0.0/33", "localhost", "10.0.0.1/8/2"] {
            assert!(bad.parse::<TrustedSenders>().is_err(), "{bad:?}");
        }
    }
}
