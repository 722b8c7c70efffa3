//! The server side of a client's TLS handshake, bounded in time, with why it failed.

use super::{Certificates, Inside};
use crate::http1::error_page;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{timeout_at, Instant};
use tokio_rustls::server::TlsStream;

pub use drover_metrics::TlsFailure as Failure;

/// The first bytes of TLS records: change_cipher_spec, alert, handshake (a
/// ClientHello) and application data. A connection that starts with another byte
/// speaks something else (plain HTTP); one that starts with an alert speaks TLS, and
/// was counted `not-tls` (edge seat).
const TLS_RECORDS: std::ops::RangeInclusive<u8> = 0x14..=0x17;

/// How long a handshake that failed on what the client sent first may take to send
/// rustls's alert for why: a client that sent garbage in a TLS record held its
/// connection until the header read timeout (10 s) while the alert waited.
const ALERT_LINGER: Duration = Duration::from_secs(1);

/// How long the answer to plain HTTP on a TLS port waits for the client to take it and
/// close, so closing with its request unread does not reset the answer away.
const PLAIN_ANSWER_LINGER: Duration = Duration::from_secs(1);

/// Runs the handshake on `stream`, which must complete by `deadline` (the header read
/// timeout: a client that connects and never says hello holds a connection no longer
/// than one that never sends its request head). `buf` holds what was already read from
/// the stream (what followed a PROXY protocol header), which the handshake reads first;
/// it is empty on return. ALPN offers what `inside` says (the caller reads what was
/// agreed from the stream).
///
/// On an HTTP listener, plain HTTP sent to the port gets a 400 saying so, as nginx
/// does, before it closes; a TCP listener's client gets no answer in a protocol it may
/// not speak.
pub async fn handshake(
    certs: &Certificates,
    mut stream: TcpStream,
    buf: &mut Vec<u8>,
    deadline: Instant,
    inside: Inside,
) -> Result<TlsStream<TcpStream>, Failure> {
    if buf.is_empty() {
        buf.reserve(512);
        match timeout_at(deadline, stream.read_buf(buf)).await {
            Err(_) => return Err(Failure::Timeout),
            Ok(Ok(n)) if n > 0 => {}
            Ok(_) => return Err(Failure::Closed),
        }
    }
    if !TLS_RECORDS.contains(&buf[0]) {
        if inside != Inside::Bytes {
            answer_plain(&mut stream, deadline).await;
        }
        return Err(Failure::NotTls);
    }
    // The bytes already read go to the handshake first; processed here, so that the
    // handshake writes its answer before it waits for more.
    let mut fed = Ok(());
    let acceptor =
        tokio_rustls::TlsAcceptor::from(std::sync::Arc::clone(certs.server_config(inside)));
    let accept = acceptor.accept_with(stream, |conn| {
        let mut rest = &buf[..];
        while !rest.is_empty() && fed.is_ok() {
            fed = match conn.read_tls(&mut rest) {
                Ok(_) => conn.process_new_packets().map(|_| ()),
                Err(e) => Err(rustls::Error::General(e.to_string())),
            };
        }
    });
    buf.clear();
    if let Err(e) = fed {
        // The handshake failed on what was read already; running it on sends the
        // client rustls's alert for why (no shared ALPN protocol, no shared cipher),
        // as OpenSSL's peers do, rather than a bare close.
        let _ = timeout_at(deadline.min(Instant::now() + ALERT_LINGER), accept).await;
        return Err(reason(&e));
    }
    match timeout_at(deadline, accept).await {
        Ok(Ok(stream)) => Ok(stream),
        Ok(Err(e)) => Err(io_reason(&e)),
        Err(_) => Err(Failure::Timeout),
    }
}

/// Why rustls ended a handshake.
fn reason(e: &rustls::Error) -> Failure {
    match e {
        rustls::Error::AlertReceived(_) => Failure::ClientAlert,
        rustls::Error::NoCertificatesPresented | rustls::Error::InvalidCertificate(_) => {
            Failure::ClientCert
        }
        _ => Failure::Protocol,
    }
}

/// Why a handshake ended with an I/O error: rustls's own, carried inside, or the
/// connection's.
fn io_reason(e: &std::io::Error) -> Failure {
    match e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
    {
        Some(e) => reason(e),
        None => Failure::Closed,
    }
}

/// Tells a plain HTTP client that the port speaks HTTPS, then closes.
async fn answer_plain(stream: &mut TcpStream, deadline: Instant) {
    let mut out = Vec::new();
    error_page::write_error(
        &mut out,
        400,
        "plain-http-to-tls",
        "this port speaks HTTPS: use https://",
        true,
        None,
    );
    if timeout_at(deadline, stream.write_all(&out)).await.is_err() {
        return;
    }
    let _ = stream.shutdown().await;
    let until = Instant::now() + PLAIN_ANSWER_LINGER;
    let mut sink = [0u8; 1024];
    while let Ok(Ok(n)) = timeout_at(until, stream.read(&mut sink)).await {
        if n == 0 {
            break;
        }
    }
}
