//! etcd over TLS (`https://` endpoints): the gRPC channel's connections are made here,
//! with the rustls configuration the caller loads (CA, client certificate for etcd's
//! `--client-cert-auth`), rather than by etcd-client's own TLS, which would bring a
//! second crypto provider (ring) beside drover's aws-lc-rs.
//!
//! One connection at a time, to the first endpoint that answers, starting from the one
//! that answered last: etcd forwards every request to its leader, so any member serves.

use rustls::pki_types::ServerName;
use std::fmt;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::net::TcpStream;

/// What the handshakes use: the client configuration (it must offer `h2` by ALPN, as
/// gRPC needs), and the name verified in etcd's certificate when it is not the
/// endpoint's host.
#[derive(Clone)]
pub struct TlsClient {
    pub config: Arc<rustls::ClientConfig>,
    pub server_name: Option<ServerName<'static>>,
}

/// Reads the TLS files again: called for each new connection to etcd, so a client
/// certificate renewed on disk is used from the next reconnection on. An error names
/// the file and why.
pub type LoadTls = Arc<dyn Fn() -> Result<TlsClient, String> + Send + Sync>;

/// `EtcdOptions::tls`: a loader with a `Debug` and an equality (by identity).
#[derive(Clone)]
pub struct EtcdTls(pub LoadTls);

impl fmt::Debug for EtcdTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("EtcdTls(..)")
    }
}

impl PartialEq for EtcdTls {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// An endpoint URL's host and port: `https://HOST:PORT` (an IPv6 host in brackets).
pub fn host_port(url: &str) -> Result<(String, u16), String> {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))
        .unwrap_or(url)
        .trim_end_matches('/');
    let (host, port) = rest
        .rsplit_once(':')
        .ok_or_else(|| format!("{url:?} names no port"))?;
    let port = port
        .parse()
        .map_err(|_| format!("{url:?}: {port:?} is not a port"))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return Err(format!("{url:?} names no host"));
    }
    Ok((host.to_string(), port))
}

/// The tonic connector: TCP to an endpoint, then the TLS handshake.
#[derive(Clone)]
pub(crate) struct Connector {
    endpoints: Arc<Vec<(String, u16)>>,
    /// The endpoint that answered last: tried first.
    last_good: Arc<AtomicUsize>,
    tls: TlsClient,
    timeout: Duration,
}

impl Connector {
    pub(crate) fn new(endpoints: Vec<(String, u16)>, tls: TlsClient, timeout: Duration) -> Self {
        Connector {
            endpoints: Arc::new(endpoints),
            last_good: Arc::new(AtomicUsize::new(0)),
            tls,
            timeout,
        }
    }

    async fn connect(self) -> io::Result<TlsIo> {
        let n = self.endpoints.len();
        let first = self.last_good.load(Ordering::Relaxed);
        let mut last_error = io::Error::other("no etcd endpoint");
        for i in 0..n {
            let at = (first + i) % n;
            let (host, port) = &self.endpoints[at];
            match self.connect_to(host, *port).await {
                Ok(io) => {
                    self.last_good.store(at, Ordering::Relaxed);
                    return Ok(io);
                }
                Err(e) => last_error = io::Error::new(e.kind(), format!("{host}:{port}: {e}")),
            }
        }
        Err(last_error)
    }

    async fn connect_to(&self, host: &str, port: u16) -> io::Result<TlsIo> {
        let name = match &self.tls.server_name {
            Some(name) => name.clone(),
            None => ServerName::try_from(host.to_string())
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?,
        };
        let connector = tokio_rustls::TlsConnector::from(Arc::clone(&self.tls.config));
        let handshake = async {
            let tcp = TcpStream::connect((host, port)).await?;
            tcp.set_nodelay(true)?;
            connector.connect(name, tcp).await
        };
        match tokio::time::timeout(self.timeout, handshake).await {
            Ok(Ok(tls)) => Ok(hyper_util::rt::TokioIo::new(tls)),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no TLS session within {:?}", self.timeout),
            )),
        }
    }
}

type TlsIo = hyper_util::rt::TokioIo<tokio_rustls::client::TlsStream<TcpStream>>;

impl tower_service::Service<tonic::transport::Uri> for Connector {
    type Response = TlsIo;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<TlsIo>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    /// The URI is the first endpoint's, as tonic needs one; the endpoints are tried
    /// in turn whatever it says.
    fn call(&mut self, _: tonic::transport::Uri) -> Self::Future {
        Box::pin(self.clone().connect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_urls_give_their_host_and_port() {
        assert_eq!(
            host_port("https://10.0.0.5:2379").unwrap(),
            ("10.0.0.5".to_string(), 2379)
        );
        assert_eq!(
            host_port("https://etcd.internal:2379/").unwrap(),
            ("etcd.internal".to_string(), 2379)
        );
        assert_eq!(
            host_port("https://[::1]:2379").unwrap(),
            ("::1".to_string(), 2379)
        );
        assert!(host_port("https://etcd.internal").is_err());
        assert!(host_port("https://:2379").is_err());
        assert!(host_port("https://h:99999").is_err());
    }
}
