//! The server name of a TLS client's ClientHello, read without decrypting anything or
//! answering the client: what a TCP listener with SNI routes places a connection by
//! (HAProxy's `req_ssl_sni`, nginx's `ssl_preread`).
//!
//! The bytes are read into a buffer the caller then sends to the backend before
//! relaying the rest, so the backend sees the stream from its first byte, as nginx's
//! preread buffer does. Reading is bounded in bytes (`PREREAD_LIMIT`, nginx's
//! `preread_buffer_size` default) and in time (the caller's deadline).
//!
//! The parser is rustls's (`server::Acceptor`), the one TLS termination's certificate
//! choice reads the same name with (`sni.rs`): records split anywhere, a hello over
//! several records, names in lowercase, and an IP address sent as a name taken as no
//! name (RFC 6066 allows none). rustls also applies its own rules to a hello, so one
//! it would refuse is refused here too: a hello without `signature_algorithms` (as
//! only clients older than TLS 1.2 send), without null compression, or naming more
//! than one host. The tls-parser crate parses without such rules but does not join a
//! hello split over records; another parser for the same name was not worth it.

use rustls::server::Acceptor;
use std::io;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio::time::{timeout_at, Instant};

pub use drover_metrics::SniUnrouted as Failure;

/// The most bytes read before a ClientHello must be whole: nginx's default preread
/// buffer. A hello with post-quantum key shares is about 1.8 KiB.
pub const PREREAD_LIMIT: usize = 16 * 1024;

/// The first byte of a TLS record that carries a handshake message.
const HANDSHAKE_RECORD: u8 = 0x16;

/// Reads from `stream` onto `buf` until it holds a whole ClientHello, by `deadline`,
/// and returns the name the client asked for (`None`: it sent none). `buf` may hold
/// bytes already read (what followed a PROXY protocol header); on return it holds
/// every byte read, to be sent to the backend first.
pub async fn server_name(
    stream: &mut TcpStream,
    buf: &mut Vec<u8>,
    deadline: Instant,
) -> Result<Option<String>, Failure> {
    let mut acceptor = Acceptor::default();
    let mut fed = 0;
    loop {
        if buf.len() > fed {
            if buf[0] != HANDSHAKE_RECORD {
                return Err(Failure::NotTls);
            }
            feed(&mut acceptor, &buf[fed..])?;
            fed = buf.len();
            match acceptor.accept() {
                Ok(Some(accepted)) => {
                    let hello = accepted.client_hello();
                    return Ok(hello.server_name().map(str::to_owned));
                }
                Ok(None) => {}
                // The alert rustls would send is not: the client gets a close, as from
                // a listener with no route for it.
                Err(_) => return Err(Failure::BadHello),
            }
        }
        if buf.len() >= PREREAD_LIMIT {
            return Err(Failure::TooLarge);
        }
        // Never past the limit: a client cannot make drover hold more.
        buf.reserve(PREREAD_LIMIT - buf.len());
        let room = PREREAD_LIMIT - buf.len();
        let mut limited = (&mut *stream).take(room as u64);
        match timeout_at(deadline, limited.read_buf(buf)).await {
            Err(_) => return Err(Failure::Timeout),
            Ok(Ok(0)) | Ok(Err(_)) => return Err(Failure::Closed),
            Ok(Ok(_)) => {}
        }
    }
}

/// Hands `bytes` to the acceptor; rustls takes them in pieces as its buffer allows.
fn feed(acceptor: &mut Acceptor, mut bytes: &[u8]) -> Result<(), Failure> {
    while !bytes.is_empty() {
        match acceptor.read_tls(&mut bytes) {
            Ok(0) => return Err(Failure::BadHello),
            Ok(_) => {}
            // Its buffer is full without a whole message: no hello fits.
            Err(e) if e.kind() == io::ErrorKind::Other => return Err(Failure::TooLarge),
            Err(_) => return Err(Failure::BadHello),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;
    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpListener;

    /// The bytes a rustls client sends first for `name` (None: an IP address, so no SNI).
    fn hello(name: &str) -> Vec<u8> {
        let roots = rustls::RootCertStore::empty();
        let config = rustls::ClientConfig::builder()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let server = rustls_pki_types::ServerName::try_from(name.to_owned()).unwrap();
        let mut conn = rustls::ClientConnection::new(Arc::new(config), server).unwrap();
        let mut out = Vec::new();
        while conn.wants_write() {
            conn.write_tls(&mut out).unwrap();
        }
        out
    }

    /// Sends `pieces` to a listener, each in its own write, pausing between them, then
    /// keeps the connection open (or closes it, with `close`); returns what
    /// `server_name` made of it and the bytes it kept.
    async fn read_from(
        pieces: Vec<Vec<u8>>,
        close: bool,
        within: Duration,
    ) -> (Result<Option<String>, Failure>, Vec<u8>) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let client = tokio::spawn(async move {
            let mut c = TcpStream::connect(addr).await.unwrap();
            c.set_nodelay(true).unwrap();
            for p in pieces {
                c.write_all(&p).await.unwrap();
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            if close {
                drop(c);
            } else {
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
        });
        let (mut s, _) = l.accept().await.unwrap();
        let mut buf = Vec::new();
        let got = server_name(&mut s, &mut buf, Instant::now() + within).await;
        client.abort();
        (got, buf)
    }

    const LONG: Duration = Duration::from_secs(5);

    #[tokio::test]
    async fn the_name_of_a_whole_hello_and_every_byte_kept() {
        let h = hello("API.Example.com");
        let (got, kept) = read_from(vec![h.clone()], false, LONG).await;
        assert_eq!(got, Ok(Some("api.example.com".into())));
        assert_eq!(kept, h, "every byte read goes to the backend");
    }

    #[tokio::test]
    async fn a_hello_split_into_many_pieces() {
        let h = hello("split.test");
        // Record headers and the hello cut at every 7th byte, each piece sent alone.
        let pieces = h.chunks(7).map(<[u8]>::to_vec).collect();
        let (got, kept) = read_from(pieces, false, LONG).await;
        assert_eq!(got, Ok(Some("split.test".into())));
        assert_eq!(kept, h);
    }

    #[tokio::test]
    async fn a_hello_without_a_name() {
        let (got, _) = read_from(vec![hello("127.0.0.1")], false, LONG).await;
        assert_eq!(got, Ok(None), "an IP address is sent as no SNI");
    }

    #[tokio::test]
    async fn garbage_truncation_a_stall_and_a_huge_record() {
        let (got, _) = read_from(vec![b"GET / HTTP/1.1\r\n\r\n".to_vec()], false, LONG).await;
        assert_eq!(got, Err(Failure::NotTls));
        let h = hello("cut.test");
        let (got, _) = read_from(vec![h[..h.len() / 2].to_vec()], true, LONG).await;
        assert_eq!(got, Err(Failure::Closed), "truncated, then closed");
        let (got, _) = read_from(
            vec![h[..h.len() / 2].to_vec()],
            false,
            Duration::from_millis(200),
        )
        .await;
        assert_eq!(got, Err(Failure::Timeout), "truncated, then stalled");
        // A handshake record that claims 16 KiB, and its bytes: never a whole hello.
        let mut big = vec![0x16, 0x03, 0x01, 0x40, 0x00];
        big.resize(big.len() + PREREAD_LIMIT + 10, 0x01);
        let (got, kept) = read_from(vec![big], false, LONG).await;
        assert!(
            matches!(got, Err(Failure::TooLarge | Failure::BadHello)),
            "{got:?}"
        );
        assert!(kept.len() <= PREREAD_LIMIT);
        // A record with a handshake message that is no ClientHello.
        let (got, _) = read_from(
            vec![vec![0x16, 0x03, 0x01, 0x00, 0x04, 0x02, 0x00, 0x00, 0x00]],
            false,
            LONG,
        )
        .await;
        assert_eq!(got, Err(Failure::BadHello));
    }
}
