//! HTTPS targets: a rustls client that verifies the server against a CA file or the
//! system's roots (or, with `--insecure`, only the handshake's own signature, as
//! `curl -k` and `openssl s_time` do), offers ALPN `http/1.1` and, unless told not to,
//! resumes sessions from tickets the way browsers do.
//!
//! rustls and tokio-rustls are drover's TLS stack already (the proxy terminates TLS
//! with them); the system's roots are read from the PEM bundle OpenSSL reads, so no
//! crate of roots is added.

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::Resumption;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, HandshakeKind, RootCertStore, SignatureScheme};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

/// Where the system's CA bundle is, unless `SSL_CERT_FILE` says (Debian and Ubuntu's
/// ca-certificates; OpenSSL reads the same file).
const SYSTEM_ROOTS: &str = "/etc/ssl/certs/ca-certificates.crt";

/// How the server's certificate is checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trust {
    /// The system's roots (`SSL_CERT_FILE`, else the ca-certificates bundle).
    System,
    /// The CA certificates of this PEM file (`--cacert`).
    CaFile(PathBuf),
    /// No chain or name check; the handshake's signature is still checked
    /// (`--insecure`).
    Insecure,
}

/// An HTTPS target: the client configuration and the name the server is checked for.
#[derive(Debug, Clone)]
pub struct TlsTarget {
    config: Arc<ClientConfig>,
    name: ServerName<'static>,
}

/// How a connection's handshake went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handshake {
    Full,
    /// From a session ticket of an earlier connection.
    Resumed,
}

impl TlsTarget {
    /// A client for `host` (the URL's host: a name is sent as SNI and checked against
    /// the certificate; an IP address is checked against its IP entries).
    pub fn new(host: &str, trust: &Trust, resume: bool) -> Result<TlsTarget, String> {
        let name = ServerName::try_from(host.trim_start_matches('[').trim_end_matches(']'))
            .map_err(|_| format!("{host:?} is not a host name or address for TLS"))?
            .to_owned();
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS: {e}"))?;
        let mut config = match trust {
            Trust::Insecure => builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(SignatureOnly(provider)))
                .with_no_client_auth(),
            Trust::CaFile(path) => builder
                .with_root_certificates(roots(path)?)
                .with_no_client_auth(),
            Trust::System => {
                let path = std::env::var_os("SSL_CERT_FILE")
                    .map_or_else(|| PathBuf::from(SYSTEM_ROOTS), PathBuf::from);
                builder
                    .with_root_certificates(roots(&path).map_err(|e| {
                        format!("{e} (the system's CA bundle; --cacert FILE names a CA, --insecure skips the check)")
                    })?)
                    .with_no_client_auth()
            }
        };
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        if !resume {
            config.resumption = Resumption::disabled();
        }
        Ok(TlsTarget {
            config: Arc::new(config),
            name,
        })
    }

    /// The TLS handshake over `tcp`.
    pub async fn handshake(&self, tcp: TcpStream) -> io::Result<(TlsStream<TcpStream>, Handshake)> {
        let connector = TlsConnector::from(Arc::clone(&self.config));
        let stream = connector.connect(self.name.clone(), tcp).await?;
        let kind = match stream.get_ref().1.handshake_kind() {
            Some(HandshakeKind::Resumed) => Handshake::Resumed,
            _ => Handshake::Full,
        };
        Ok((stream, kind))
    }
}

/// The CA certificates of PEM file `path`.
fn roots(path: &Path) -> Result<RootCertStore, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut store = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&bytes) {
        let cert = cert.map_err(|e| format!("{}: not PEM certificates: {e}", path.display()))?;
        store
            .add(cert)
            .map_err(|e| format!("{}: a certificate rustls refuses: {e}", path.display()))?;
    }
    if store.is_empty() {
        return Err(format!("{}: no PEM certificate in it", path.display()));
    }
    Ok(store)
}

/// `--insecure`: any certificate chain and name, but the handshake must be signed by
/// the key of the certificate the server sent (what OpenSSL's clients check without
/// verification too), so a run costs the client what a real one does.
#[derive(Debug)]
struct SignatureOnly(Arc<CryptoProvider>);

impl ServerCertVerifier for SignatureOnly {
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
        verify_tls12_signature(
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
        verify_tls13_signature(
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_ca_files_are_named_with_why() {
        let dir = std::env::temp_dir().join(format!("drover-bench-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let missing = dir.join("missing.pem");
        let e = TlsTarget::new("localhost", &Trust::CaFile(missing.clone()), true).unwrap_err();
        assert!(
            e.contains("cannot read") && e.contains("missing.pem"),
            "{e}"
        );
        let text = dir.join("text.pem");
        std::fs::write(&text, "not a certificate\n").unwrap();
        let e = TlsTarget::new("localhost", &Trust::CaFile(text), true).unwrap_err();
        assert!(
            e.contains("no PEM certificate") && e.contains("text.pem"),
            "{e}"
        );
        let bad = dir.join("bad.pem");
        std::fs::write(
            &bad,
            "-----BEGIN CERTIFICATE-----\n!!!\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let e = TlsTarget::new("localhost", &Trust::CaFile(bad), true).unwrap_err();
        assert!(e.contains("bad.pem"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn names_and_addresses_are_targets() {
        for host in ["localhost", "127.0.0.1", "[::1]", "shop.example"] {
            TlsTarget::new(host, &Trust::Insecure, false).unwrap();
        }
        assert!(TlsTarget::new("bad host", &Trust::Insecure, true).is_err());
    }
}
