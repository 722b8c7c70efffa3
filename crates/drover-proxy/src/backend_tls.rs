//! TLS to backends (`backend_tls`): every connection to an endpoint of the balancer
//! speaks TLS, as nginx's `proxy_pass https://` with `proxy_ssl_verify on` and HAProxy's
//! `server … ssl verify required ca-file … sni … crt …`.
//!
//! - **Verification** against the CA file given (`ca`), or else the system's trust store
//!   (rustls-native-certs: `/etc/ssl/certs` and what `SSL_CERT_FILE`/`SSL_CERT_DIR`
//!   name), read at start and at each reload. `insecure_skip_verify` turns it off, and
//!   only that: the handshake's signatures are still checked, so the session is still
//!   keyed to whoever holds the certificate's key.
//! - **The name verified**, and sent as SNI: `server_name` when given, else the
//!   endpoint's IP address, checked against the certificate's IP SANs (no SNI is sent
//!   for an IP, as RFC 6066 says).
//! - **A client certificate** (`cert`, `key`) for backends that require one (mTLS).
//! - **ALPN** `http/1.1`: drover speaks HTTP/1.1 to backends (`h2` with
//!   `backend_protocol = "h2"`). A TCP balancer offers none, unless it ended its
//!   client's TLS with a protocol agreed by ALPN (`tls.alpn`): then it offers the
//!   backend that protocol, as the client's bytes speak it (`Connector::offering`).
//!
//! rustls with aws-lc-rs, as the listeners; the PEM parsing and the file errors are
//! theirs (`tls::load_one`), so a bad file reads the same wherever it was given.

use crate::tls::{self, CertFiles, ErrorKind};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::ResolvesClientCert;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;
use tokio::net::TcpStream;
use tokio::time::{timeout_at, Instant};
use tokio_rustls::client::TlsStream;

/// `backend_tls = { ca, server_name, cert, key, insecure_skip_verify }`: the model's own
/// type, so each default has one definition.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Settings {
    /// PEM file of the CA certificates that sign the backends' certificates; `None`
    /// (default): the system's trust store.
    pub ca: Option<PathBuf>,
    /// The name verified in each backend's certificate and sent as SNI; `None`
    /// (default): the endpoint's IP address, verified against its IP SANs.
    pub server_name: Option<String>,
    /// A client certificate and its key, shown to backends that ask (mTLS); `None`
    /// (default): none.
    pub client_cert: Option<CertFiles>,
    /// Accept any certificate (HAProxy's `verify none`, nginx's `proxy_ssl_verify off`):
    /// the connection is encrypted but not authenticated. Off by default.
    pub insecure_skip_verify: bool,
}

/// Which setting an error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    Ca,
    Cert,
    Key,
    ServerName,
}

impl Part {
    /// The key under `backend_tls`.
    pub fn as_str(self) -> &'static str {
        match self {
            Part::Ca => "ca",
            Part::Cert => "cert",
            Part::Key => "key",
            Part::ServerName => "server_name",
        }
    }
}

/// Why a balancer's backend TLS settings were not loaded; nothing of them is used then.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    pub part: Part,
    /// The file (empty for the system's trust store and for `server_name`).
    pub path: PathBuf,
    pub kind: ErrorKind,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.kind, self.part) {
            (ErrorKind::Rustls(e), Part::ServerName) => f.write_str(e),
            (ErrorKind::Rustls(e), Part::Ca) if self.path.as_os_str().is_empty() => f.write_str(e),
            // The listeners' messages, which name the file and why.
            (kind, part) => tls::Error {
                index: 0,
                part: if part == Part::Key {
                    tls::Part::Key
                } else {
                    tls::Part::Cert
                },
                path: self.path.clone(),
                kind: kind.clone(),
            }
            .fmt(f),
        }
    }
}

impl std::error::Error for Error {}

/// A balancer's backend TLS, loaded and checked: what each connection's handshake uses.
pub struct Connector {
    config: Arc<ClientConfig>,
    server_name: Option<ServerName<'static>>,
    settings: Settings,
    /// A TCP balancer's: the same connector offering one protocol by ALPN, made the
    /// first time a client agreed on it (a listener's `tls.alpn` names a few at most).
    offering: Mutex<Vec<(Vec<u8>, Arc<Connector>)>>,
}

impl fmt::Debug for Connector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connector")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl Connector {
    /// Reads and checks every file of `settings` (the CA file, or the system's trust
    /// store; the client certificate and key, which must be a pair and unexpired).
    pub fn load(settings: &Settings) -> Result<Connector, Error> {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let server_name = match &settings.server_name {
            Some(name) => Some(server_name(name).map_err(|e| Error {
                part: Part::ServerName,
                path: PathBuf::new(),
                kind: ErrorKind::Rustls(e),
            })?),
            None => None,
        };
        let builder = ClientConfig::builder_with_provider(Arc::clone(&provider))
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .map_err(|e| Error {
                part: Part::Ca,
                path: PathBuf::new(),
                kind: ErrorKind::Rustls(e.to_string()),
            })?;
        let builder = if settings.insecure_skip_verify {
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AnyCertificate(Arc::clone(&provider))))
        } else {
            let roots = match &settings.ca {
                Some(path) => ca_file(path)?,
                None => system_roots()?,
            };
            builder.with_root_certificates(roots)
        };
        let mut config = match &settings.client_cert {
            Some(files) => {
                let now = SystemTime::now()
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
                let (key, info) = tls::load_one(0, files, &provider).map_err(|e| Error {
                    part: match e.part {
                        tls::Part::Cert | tls::Part::ClientCa => Part::Cert,
                        tls::Part::Key => Part::Key,
                    },
                    path: e.path,
                    kind: e.kind,
                })?;
                if info.not_after < now {
                    return Err(Error {
                        part: Part::Cert,
                        path: files.cert.clone(),
                        kind: ErrorKind::Expired {
                            not_after: info.not_after_text(),
                        },
                    });
                }
                builder.with_client_cert_resolver(Arc::new(ClientCert(Arc::new(key))))
            }
            None => builder.with_no_client_auth(),
        };
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Connector {
            config: Arc::new(config),
            server_name,
            settings: settings.clone(),
            offering: Mutex::default(),
        })
    }

    /// The same, offering HTTP/2 by ALPN (`h2`) instead of HTTP/1.1: for a balancer
    /// with `backend_protocol = "h2"`.
    pub fn for_http2(mut self) -> Connector {
        let mut config = (*self.config).clone();
        config.alpn_protocols = vec![b"h2".to_vec()];
        self.config = Arc::new(config);
        self
    }

    /// The same, offering no protocol by ALPN: for a TCP balancer, which relays the
    /// client's bytes unread, whatever protocol they are.
    pub fn for_tcp(mut self) -> Connector {
        let mut config = (*self.config).clone();
        config.alpn_protocols = Vec::new();
        self.config = Arc::new(config);
        self
    }

    /// The same, offering `protocol` by ALPN: for a TCP balancer whose client agreed on
    /// it with drover (`tls.alpn`). The client's bytes speak it, so the backend must
    /// too: an HTTP/2 or gRPC server over TLS takes only sessions that agreed on `h2`.
    /// The sessions it resumes are this connector's (one store).
    pub fn offering(&self, protocol: &[u8]) -> Arc<Connector> {
        let mut offering = self.offering.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, connector)) = offering.iter().find(|(p, _)| p == protocol) {
            return Arc::clone(connector);
        }
        let mut config = (*self.config).clone();
        config.alpn_protocols = vec![protocol.to_vec()];
        let connector = Arc::new(Connector {
            config: Arc::new(config),
            server_name: self.server_name.clone(),
            settings: self.settings.clone(),
            offering: Mutex::default(),
        });
        offering.push((protocol.to_vec(), Arc::clone(&connector)));
        connector
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The rustls configuration each handshake uses (for a client of another protocol
    /// that makes its own connections: the etcd watcher's gRPC channel).
    pub fn client_config(&self) -> Arc<ClientConfig> {
        Arc::clone(&self.config)
    }

    /// `server_name`, parsed; `None`: the peer's own address or host name is verified.
    pub fn server_name(&self) -> Option<&ServerName<'static>> {
        self.server_name.as_ref()
    }

    /// The TLS handshake on a new connection to `addr`, done by `deadline` (the one its
    /// connect had: a backend that stalls mid-handshake holds the request no longer
    /// than one that never accepts).
    pub async fn handshake(
        &self,
        tcp: TcpStream,
        addr: SocketAddr,
        deadline: Instant,
    ) -> Result<TlsStream<TcpStream>, Failure> {
        let name = self
            .server_name
            .clone()
            .unwrap_or_else(|| ServerName::IpAddress(addr.ip().into()));
        let connector = tokio_rustls::TlsConnector::from(Arc::clone(&self.config));
        match timeout_at(deadline, connector.connect(name, tcp)).await {
            Ok(Ok(stream)) => Ok(stream),
            Ok(Err(e)) => Err(failure_of_io(&e)),
            Err(_) => Err(Failure::Timeout),
        }
    }
}

pub use drover_metrics::BackendTlsFailure as Failure;

/// Why a handshake ended with an I/O error: rustls's own, carried inside, or the
/// connection's.
fn failure_of_io(e: &std::io::Error) -> Failure {
    match e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
    {
        Some(e) => failure_of(e),
        None => Failure::Closed,
    }
}

/// Why rustls ended a session with a backend.
pub(crate) fn failure_of(e: &rustls::Error) -> Failure {
    use rustls::{AlertDescription as A, CertificateError as C};
    match e {
        rustls::Error::InvalidCertificate(c) => match c {
            C::UnknownIssuer => Failure::UnknownIssuer,
            C::Expired
            | C::ExpiredContext { .. }
            | C::NotValidYet
            | C::NotValidYetContext { .. } => Failure::Expired,
            C::NotValidForName | C::NotValidForNameContext { .. } => Failure::WrongName,
            _ => Failure::BadCertificate,
        },
        rustls::Error::AlertReceived(A::CertificateRequired) => Failure::ClientCertRequired,
        rustls::Error::AlertReceived(A::NoApplicationProtocol) => Failure::NoAlpn,
        // What a server answers a client certificate it does not take with
        // (rustls's DecryptError for a signature by another CA of the same name).
        rustls::Error::AlertReceived(
            A::BadCertificate
            | A::UnknownCA
            | A::CertificateUnknown
            | A::CertificateExpired
            | A::CertificateRevoked
            | A::UnsupportedCertificate
            | A::AccessDenied
            | A::DecryptError,
        ) => Failure::ClientCertRefused,
        rustls::Error::InvalidMessage(_) => Failure::NotTls,
        _ => Failure::Protocol,
    }
}

/// `name` as the name a certificate is verified for: a DNS name or an IP address.
pub fn server_name(name: &str) -> Result<ServerName<'static>, String> {
    ServerName::try_from(name.to_owned())
        .map_err(|e| format!("{name:?} is not a DNS name or an IP address: {e}"))
}

/// The CA certificates of a PEM file.
fn ca_file(path: &Path) -> Result<RootCertStore, Error> {
    tls::ca_roots(path).map_err(|kind| Error {
        part: Part::Ca,
        path: path.to_owned(),
        kind,
    })
}

/// The system's trust store. Certificates in it that do not parse are skipped, as
/// OpenSSL skips them; a store with none that parse is an error.
fn system_roots() -> Result<RootCertStore, Error> {
    let found = rustls_native_certs::load_native_certs();
    let mut roots = RootCertStore::empty();
    let (added, _ignored) = roots.add_parsable_certificates(found.certs);
    if added == 0 {
        let why = found
            .errors
            .first()
            .map_or_else(|| "none found".to_owned(), |e| e.to_string());
        return Err(Error {
            part: Part::Ca,
            path: PathBuf::new(),
            kind: ErrorKind::Rustls(format!(
                "no CA certificate in the system's trust store ({why}): install ca-certificates, or give ca = \"FILE\""
            )),
        });
    }
    Ok(roots)
}

/// The one client certificate, shown to every backend that asks.
#[derive(Debug)]
struct ClientCert(Arc<CertifiedKey>);

impl ResolvesClientCert for ClientCert {
    fn resolve(&self, _hints: &[&[u8]], _schemes: &[SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        Some(Arc::clone(&self.0))
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// `insecure_skip_verify`: any certificate is taken, but the handshake's signatures are
/// still checked with the provider's algorithms.
#[derive(Debug)]
struct AnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// Active health checks of a balancer with backend TLS go over TLS too.
impl drover_registry::WrapProbe for Connector {
    fn wrap<'a>(
        &'a self,
        tcp: TcpStream,
        addr: SocketAddr,
        deadline: Instant,
    ) -> drover_registry::WrapFuture<'a> {
        Box::pin(async move {
            match self.handshake(tcp, addr, deadline).await {
                Ok(tls) => Ok(Box::new(tls) as Box<dyn drover_registry::ProbeStream>),
                Err(f) => Err(format!("{} ({f})", f.as_str())),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_server_name_is_refused_naming_it() {
        let e = Connector::load(&Settings {
            server_name: Some("not a name".into()),
            insecure_skip_verify: true,
            ..Settings::default()
        })
        .unwrap_err();
        assert_eq!(e.part, Part::ServerName);
        assert!(
            e.to_string().contains("\"not a name\" is not a DNS name"),
            "{e}"
        );
    }

    #[test]
    fn a_tcp_connector_offers_each_agreed_protocol_from_one_made_connector() {
        let tcp = Connector::load(&Settings {
            insecure_skip_verify: true,
            ..Settings::default()
        })
        .unwrap()
        .for_tcp();
        assert!(tcp.config.alpn_protocols.is_empty());
        let h2 = tcp.offering(b"h2");
        assert_eq!(h2.config.alpn_protocols, [b"h2".to_vec()]);
        assert!(Arc::ptr_eq(&h2, &tcp.offering(b"h2")));
        let mqtt = tcp.offering(b"mqtt");
        assert_eq!(mqtt.config.alpn_protocols, [b"mqtt".to_vec()]);
        assert!(tcp.config.alpn_protocols.is_empty());
    }

    #[test]
    fn a_ca_file_that_is_missing_or_not_pem_is_named_with_why() {
        let d = std::env::temp_dir().join(format!("drover-backend-tls-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let missing = d.join("missing.pem");
        let e = Connector::load(&Settings {
            ca: Some(missing.clone()),
            ..Settings::default()
        })
        .unwrap_err();
        assert_eq!(e.part, Part::Ca);
        assert!(
            e.to_string()
                .starts_with(&format!("cannot read {}", missing.display())),
            "{e}"
        );
        let garbage = d.join("garbage.pem");
        std::fs::write(&garbage, b"not a certificate\n").unwrap();
        let e = Connector::load(&Settings {
            ca: Some(garbage.clone()),
            ..Settings::default()
        })
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("{} is not PEM: no -----BEGIN line", garbage.display())
        );
        let _ = std::fs::remove_dir_all(&d);
    }
}
