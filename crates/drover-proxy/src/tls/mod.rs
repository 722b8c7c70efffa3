//! TLS termination on a balancer's listener: the certificate files it is configured
//! with (`Settings`, the model's own type so each default has one definition), loaded and
//! checked into what a handshake uses (`Certificates`), the certificate chosen by SNI
//! (`sni`), and the handshake itself with its failure reasons (`handshake`). A TCP
//! listener's SNI routes read the same name without terminating (`client_hello`).
//!
//! rustls with its default provider (aws-lc-rs), through tokio-rustls; PEM is parsed by
//! rustls-pki-types (`PemObject`), a certificate's notAfter and names by x509-parser.
//! TLS 1.2 and 1.3. ALPN offers `h2` then `http/1.1` on a balancer that serves HTTP/2
//! (`http2`, the default), `http/1.1` alone on one that does not: a client told `h2`
//! speaks it at once.
//!
//! Sessions resume by stateless tickets under one process-wide ticketer (`ticketer`),
//! which a reload keeps, so a ticket issued before a reload still resumes after it;
//! `TLS13_TICKETS` are sent after each TLS 1.3 handshake.
//! rustls rotates its key itself: a new one every 6 hours, the one before still read.

pub mod client_hello;
mod handshake;
mod sni;
pub mod watch;

pub use handshake::{handshake, Failure};

/// What a TLS listener serves inside its sessions: what ALPN offers, and how a client
/// that speaks no TLS at all is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Inside {
    /// HTTP/1.1 only (`http2 = false`): ALPN `http/1.1`.
    Http1,
    /// HTTP/2 or HTTP/1.1: ALPN `h2`, then `http/1.1`.
    Http2,
    /// A TCP balancer's relayed bytes, whose protocol is the client's and the
    /// backend's: ALPN offers only what `Settings::alpn` lists (none by default, as
    /// HAProxy's `bind … ssl` in `mode tcp` without `alpn`), and a client that sends no
    /// ClientHello is closed unanswered.
    Bytes,
}

impl Inside {
    /// An HTTP listener's, offering HTTP/2 when `http2`.
    pub fn http(http2: bool) -> Inside {
        if http2 {
            Inside::Http2
        } else {
            Inside::Http1
        }
    }
}
use watch::Stamp;

use rustls::crypto::CryptoProvider;
use rustls::server::ProducesTickets;
use rustls::sign::CertifiedKey;
use rustls::ServerConfig;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// TLS 1.3 session tickets sent after each handshake. rustls sends the same count
/// after a full handshake and a resumed one (its `ServerConfig::send_tls13_tickets`;
/// only a client's RFC 9149 `ticket_request` changes it per connection), so one count
/// serves both: 1, what OpenSSL (nginx, HAProxy) sends after a resumed handshake, where
/// rustls's default of 2 made each resumed connection cost its client a ticket more to
/// take in (bench/README.md, tls.sh). A client that resumes in turn always has the one
/// ticket its last connection brought; only a client that opens several connections at
/// once after one full handshake resumes fewer of them than with 2.
pub const TLS13_TICKETS: usize = 1;

/// A certificate expiring within this long is warned about, at start and at each
/// reload (and on the dashboard, which reads the metrics' own definition).
pub const EXPIRY_WARNING: Duration = drover_metrics::CertificateExpiry::WARNING;

/// What a listener serves TLS with: one or more certificates, each with its key. The
/// first is the default, for a client that sends no SNI or one no certificate names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub certs: Vec<CertFiles>,
    /// The protocols a TCP listener agrees to by ALPN, in its order of preference
    /// (`Inside::Bytes`; HAProxy's `bind … ssl alpn`), for a client that will not speak
    /// without one (an HTTP/2 or gRPC client in front of a backend that speaks it in
    /// the clear). Empty: none offered. An HTTP listener's come from `http2`.
    pub alpn: Vec<String>,
    /// The oldest TLS version a client may use (nginx's `ssl_protocols`, HAProxy's
    /// `ssl-min-ver`).
    pub min_version: MinVersion,
    /// The CA certificates (PEM) a client's certificate must be signed by: with one, a
    /// client that presents none, or one no CA here signed, is refused in the handshake
    /// (nginx's `ssl_client_certificate` with `ssl_verify_client on`, HAProxy's
    /// `ca-file` with `verify required`).
    pub client_ca: Option<PathBuf>,
    /// Whether a client without a certificate is served too (`optional`), with only
    /// the certificates `client_ca` signed taken.
    pub verify_client: VerifyClient,
}

/// How a listener with a `client_ca` treats a client that presents no certificate.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum VerifyClient {
    /// Refused in the handshake (nginx's `ssl_verify_client on`).
    #[default]
    Required,
    /// Served, and its backend hears no client certificate (nginx's `optional`); one
    /// that presents a certificate `client_ca` did not sign is still refused.
    Optional,
}

impl std::str::FromStr for VerifyClient {
    type Err = String;

    /// `required` (or nginx's `on`) or `optional`.
    fn from_str(s: &str) -> Result<VerifyClient, String> {
        match s {
            "required" | "on" => Ok(VerifyClient::Required),
            "optional" => Ok(VerifyClient::Optional),
            _ => Err(format!(
                "{s:?}: expected \"required\" (a client without a certificate is refused) or \"optional\""
            )),
        }
    }
}

/// A client certificate as `X-Forwarded-Client-Cert` (XFCC, Envoy's format) names it to
/// a backend: its subject, and its SAN DNS names and URIs (a SPIFFE ID). What a field
/// cannot hold (a quote, a backslash, a control or non-ASCII character) is escaped or
/// replaced: a certificate names no header of its own.
pub fn forwarded_client_cert(der: &CertificateDer<'_>) -> String {
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else {
        return String::new();
    };
    let clean = |s: &str| -> String {
        s.chars()
            .map(|c| match c {
                '"' | '\\' => format!("\\{c}"),
                c if c.is_ascii_graphic() || c == ' ' => c.to_string(),
                _ => "?".into(),
            })
            .collect()
    };
    let mut field = format!("Subject=\"{}\"", clean(&cert.subject().to_string()));
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            match name {
                x509_parser::extensions::GeneralName::URI(uri) => {
                    field.push_str(&format!(
                        ";URI={}",
                        clean(uri).replace([';', ',', '='], "?")
                    ));
                }
                x509_parser::extensions::GeneralName::DNSName(dns) => {
                    field.push_str(&format!(
                        ";DNS={}",
                        clean(dns).replace([';', ',', '='], "?")
                    ));
                }
                _ => {}
            }
        }
    }
    field
}

/// The oldest TLS version a listener takes. 1.0 and 1.1 never: rustls has neither.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum MinVersion {
    /// TLS 1.2 and 1.3.
    #[default]
    Tls12,
    /// TLS 1.3 alone: a client that offers only 1.2 gets a protocol_version alert.
    Tls13,
}

static FROM_TLS12: [&rustls::SupportedProtocolVersion; 2] =
    [&rustls::version::TLS13, &rustls::version::TLS12];
static TLS13_ONLY: [&rustls::SupportedProtocolVersion; 1] = [&rustls::version::TLS13];

impl MinVersion {
    fn versions(self) -> &'static [&'static rustls::SupportedProtocolVersion] {
        match self {
            MinVersion::Tls12 => &FROM_TLS12,
            MinVersion::Tls13 => &TLS13_ONLY,
        }
    }
}

impl fmt::Display for MinVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MinVersion::Tls12 => "1.2",
            MinVersion::Tls13 => "1.3",
        })
    }
}

impl std::str::FromStr for MinVersion {
    type Err = String;

    /// `1.2` or `1.3`, also as nginx and HAProxy write them (`TLSv1.3`).
    fn from_str(s: &str) -> Result<MinVersion, String> {
        let bare = s
            .strip_prefix("TLSv")
            .or_else(|| s.strip_prefix("tlsv"))
            .unwrap_or(s);
        match bare {
            "1.2" => Ok(MinVersion::Tls12),
            "1.3" => Ok(MinVersion::Tls13),
            "1.0" | "1.1" | "1" => Err(format!(
                "{s:?}: TLS 1.0 and 1.1 are not offered at all (rustls has neither); 1.2 or 1.3"
            )),
            _ => Err(format!(
                "{s:?}: expected 1.2 or 1.3 (the oldest TLS version taken)"
            )),
        }
    }
}

/// Why `name` cannot be offered by ALPN, or `None`: a protocol ID is 1 to 255 bytes
/// (RFC 7301); drover takes visible ASCII (`h2`, `http/1.1`, `mqtt`), as written in
/// IANA's registry.
pub fn alpn_refusal(name: &str) -> Option<String> {
    if name.is_empty() || name.len() > 255 {
        return Some(format!(
            "ALPN protocol {name:?}: give 1 to 255 characters, e.g. \"h2\" or \"http/1.1\""
        ));
    }
    (!name.bytes().all(|b| b.is_ascii_graphic())).then(|| {
        format!("ALPN protocol {name:?}: only visible ASCII (no spaces), as \"h2\" or \"http/1.1\"")
    })
}

/// One certificate chain (PEM, the server's certificate first) and its private key
/// (PEM: PKCS#8, PKCS#1 or SEC1). `key` may be the same file as `cert` (a combined PEM,
/// as HAProxy's `crt`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// Which file of `Settings::certs[index]` an error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    Cert,
    Key,
    /// `Settings::client_ca` (its `index` is 0).
    ClientCa,
}

impl Part {
    pub fn as_str(self) -> &'static str {
        match self {
            Part::Cert => "cert",
            Part::Key => "key",
            Part::ClientCa => "client_ca",
        }
    }
}

/// Why a listener's certificates were not loaded; nothing of them is used then. Each
/// names the file, and which entry and part of the settings gave it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    /// The entry of `Settings::certs`.
    pub index: usize,
    pub part: Part,
    pub path: PathBuf,
    pub kind: ErrorKind,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ErrorKind {
    /// The file cannot be read (missing, no permission).
    Read(String),
    /// Not PEM, or PEM that does not parse.
    NotPem(String),
    /// PEM, but no section of the kind needed (`what`: "CERTIFICATE", "PRIVATE KEY").
    Missing(&'static str),
    /// The certificate does not parse as X.509.
    BadCertificate(String),
    /// A key the provider cannot use.
    BadKey(String),
    /// The key is encrypted with a pass phrase (PKCS#8 `ENCRYPTED PRIVATE KEY`, or a
    /// legacy PEM with `Proc-Type: 4,ENCRYPTED`), which drover has no way to ask for.
    Encrypted,
    /// The key is not the certificate's (`cert` names the certificate's file).
    KeyMismatch { cert: PathBuf },
    /// The certificate's notAfter has passed: refused as a backend's client certificate,
    /// or where it would replace one that has not (`Certificates::check_renewal_of`).
    Expired { not_after: String },
    /// No settings at all (an empty list).
    NoCertificates,
    /// rustls refused the configuration, or its ticketer could not start.
    Rustls(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let path = self.path.display();
        match &self.kind {
            ErrorKind::Read(e) => write!(f, "cannot read {path}: {e}"),
            ErrorKind::NotPem(e) => write!(f, "{path} is not PEM: {e}"),
            ErrorKind::Missing(what) => {
                write!(f, "{path} has no {what} section (-----BEGIN {what}-----)")
            }
            ErrorKind::BadCertificate(e) => {
                write!(f, "{path}: the certificate does not parse: {e}")
            }
            ErrorKind::BadKey(e) => write!(f, "{path}: the private key cannot be used: {e}"),
            ErrorKind::Encrypted => write!(
                f,
                "{path}: the private key is encrypted with a pass phrase, which drover cannot \
                 ask for; write it unencrypted (`openssl pkey -in {path} -out KEY.pem`) and \
                 keep that file readable by drover alone"
            ),
            ErrorKind::KeyMismatch { cert } => write!(
                f,
                "{path} is not the private key of the certificate in {}",
                cert.display()
            ),
            ErrorKind::Expired { not_after } => {
                write!(f, "{path}: the certificate expired on {not_after}")
            }
            ErrorKind::NoCertificates => f.write_str("no certificate given"),
            ErrorKind::Rustls(e) => write!(f, "{path}: {e}"),
        }
    }
}

impl std::error::Error for Error {}

/// One loaded certificate, as metrics and logs show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertInfo {
    /// The certificate file, as configured: the metric's `cert` label.
    pub path: String,
    /// The DNS names SNI picks it by (its SAN names, or its CN when it has none),
    /// lowercase; `*.example.com` for a wildcard.
    pub names: Vec<String>,
    /// notAfter, in seconds since the Unix epoch.
    pub not_after: i64,
}

impl CertInfo {
    /// notAfter as x509 tools write it (`Jan  2 03:04:05 2030 +00:00`).
    pub fn not_after_text(&self) -> String {
        x509_parser::time::ASN1Time::from_timestamp(self.not_after)
            .map_or_else(|_| self.not_after.to_string(), |t| t.to_string())
    }
}

/// A listener's certificates, loaded and checked: what its handshakes use.
pub struct Certificates {
    /// ALPN `h2`, `http/1.1`.
    config_h2: Arc<ServerConfig>,
    /// ALPN `http/1.1` only (`http2 = false`): the same certificates and ticketer.
    config: Arc<ServerConfig>,
    /// A TCP listener's (`Inside::Bytes`): its own ALPN list (`Settings::alpn`), the
    /// same certificates and ticketer.
    config_bytes: Arc<ServerConfig>,
    info: Vec<CertInfo>,
    /// The files they were read from, to read again when they change (`watch`).
    settings: Settings,
    /// Each file (cert, key, for each entry) as it was just before it was read.
    stamps: Vec<Option<Stamp>>,
}

impl fmt::Debug for Certificates {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Certificates")
            .field("certs", &self.info)
            .finish_non_exhaustive()
    }
}

impl Certificates {
    /// Reads and checks every file of `settings`: each is PEM, each key is its
    /// certificate's. The first error stops it. An expired certificate is loaded, and
    /// served (see `expired`).
    pub fn load(settings: &Settings) -> Result<Certificates, Error> {
        let Some(first) = settings.certs.first() else {
            return Err(Error {
                index: 0,
                part: Part::Cert,
                path: PathBuf::new(),
                kind: ErrorKind::NoCertificates,
            });
        };
        // Taken before the files are read: a file rewritten meanwhile differs from its
        // stamp, and is read again.
        let stamps = stamps(settings);
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let mut keys = Vec::with_capacity(settings.certs.len());
        let mut info = Vec::with_capacity(settings.certs.len());
        for (index, files) in settings.certs.iter().enumerate() {
            let (key, cert_info) = load_one(index, files, &provider)?;
            keys.push(Arc::new(key));
            info.push(cert_info);
        }
        let fail = |kind| Error {
            index: 0,
            part: Part::Cert,
            path: first.cert.clone(),
            kind,
        };
        let resolver = sni::BySni::new(
            keys,
            info.iter().map(|i| i.names.as_slice()).collect::<Vec<_>>(),
            provider.cipher_suites.clone(),
        );
        let versions = ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_protocol_versions(settings.min_version.versions())
            .map_err(|e| fail(ErrorKind::Rustls(e.to_string())))?;
        let mut config = match &settings.client_ca {
            None => versions.with_no_client_auth(),
            Some(path) => versions.with_client_cert_verifier(client_verifier(
                path,
                settings.verify_client,
                provider,
            )?),
        }
        .with_cert_resolver(Arc::new(resolver));
        // `http/1.0` too, as nginx offers it: `curl -0` names it, and a server that
        // knows none of what a client offers ends the handshake (alert 120), so such a
        // client got no answer at all.
        config.alpn_protocols = vec![b"http/1.1".to_vec(), b"http/1.0".to_vec()];
        config.ticketer = ticketer().map_err(|e| fail(ErrorKind::Rustls(e)))?;
        config.send_tls13_tickets = TLS13_TICKETS;
        // Made once per load, so a handshake only picks one: the server's preference
        // (h2 first) wins, as in nginx and HAProxy.
        let mut config_h2 = config.clone();
        config_h2.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec(), b"http/1.0".to_vec()];
        let mut config_bytes = config.clone();
        config_bytes.alpn_protocols = settings
            .alpn
            .iter()
            .map(|p| p.as_bytes().to_vec())
            .collect();
        Ok(Certificates {
            config_h2: Arc::new(config_h2),
            config: Arc::new(config),
            config_bytes: Arc::new(config_bytes),
            info,
            settings: settings.clone(),
            stamps,
        })
    }

    /// The files' stamps now, in the order of `stamps`.
    fn stamps_now(&self) -> Vec<Option<Stamp>> {
        stamps(&self.settings)
    }

    /// Each certificate, in the order configured.
    pub fn info(&self) -> &[CertInfo] {
        &self.info
    }

    /// The certificates whose notAfter comes within `EXPIRY_WARNING` of `now`.
    pub fn expiring(&self, now: SystemTime) -> impl Iterator<Item = &CertInfo> {
        let limit = now
            .checked_add(EXPIRY_WARNING)
            .map_or(i64::MAX, unix_seconds);
        self.info.iter().filter(move |c| c.not_after <= limit)
    }

    /// The certificates whose notAfter has passed by `now`. They are served: a client
    /// refuses one and says why, and the listener's other names, its other listeners and
    /// the rest of the process serve on, as under nginx and HAProxy. Refused, one
    /// expired certificate of a minor name (its renewal failed) blocked the renewal of
    /// every other certificate of its listener, every reload, and, at the next restart,
    /// every listener of the process (edge seat).
    pub fn expired(&self, now: SystemTime) -> impl Iterator<Item = &CertInfo> {
        let now = unix_seconds(now);
        self.info.iter().filter(move |c| c.not_after < now)
    }

    /// Whether these may replace `served` (the same settings read again, or a reload's):
    /// not when one of them has expired by `now` where the certificate `served` read
    /// from the same file has not. Such a renewal (an old copy put back) would break a
    /// name that works, so it changes nothing, as a file that does not parse.
    pub fn check_renewal_of(&self, served: &Certificates, now: SystemTime) -> Result<(), Error> {
        let now = unix_seconds(now);
        for (index, new) in self.info.iter().enumerate() {
            let replaces_valid = served
                .info
                .iter()
                .any(|old| old.path == new.path && old.not_after >= now);
            if new.not_after < now && replaces_valid {
                return Err(Error {
                    index,
                    part: Part::Cert,
                    path: self.settings.certs[index].cert.clone(),
                    kind: ErrorKind::Expired {
                        not_after: new.not_after_text(),
                    },
                });
            }
        }
        Ok(())
    }

    /// Whether its handshakes ask clients for certificates (`client_ca`): their
    /// backends then hear who each client is, and nobody else's word for it.
    pub fn asks_client_certs(&self) -> bool {
        self.settings.client_ca.is_some()
    }

    /// The handshake's configuration for what the listener serves inside.
    pub(crate) fn server_config(&self, inside: Inside) -> &Arc<ServerConfig> {
        match inside {
            Inside::Http2 => &self.config_h2,
            Inside::Http1 => &self.config,
            Inside::Bytes => &self.config_bytes,
        }
    }
}

/// Seconds since the Unix epoch (0 before it), as `CertInfo::not_after` counts.
fn unix_seconds(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

fn stamps(settings: &Settings) -> Vec<Option<Stamp>> {
    settings
        .certs
        .iter()
        .flat_map(|f| [Stamp::of(&f.cert), Stamp::of(&f.key)])
        .chain(settings.client_ca.iter().map(|ca| Stamp::of(ca)))
        .collect()
}

/// What checks a client's certificate against the CAs of `path`.
fn client_verifier(
    path: &Path,
    verify: VerifyClient,
    provider: Arc<CryptoProvider>,
) -> Result<Arc<dyn rustls::server::danger::ClientCertVerifier>, Error> {
    let err = |kind| Error {
        index: 0,
        part: Part::ClientCa,
        path: path.to_owned(),
        kind,
    };
    let roots = ca_roots(path).map_err(err)?;
    let builder =
        rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
    match verify {
        VerifyClient::Required => builder.build(),
        VerifyClient::Optional => builder.allow_unauthenticated().build(),
    }
    .map_err(|e| err(ErrorKind::Rustls(e.to_string())))
}

/// The CA certificates of a PEM file, every one of which must parse.
pub(crate) fn ca_roots(path: &Path) -> Result<rustls::RootCertStore, ErrorKind> {
    let bytes = std::fs::read(path).map_err(|e| ErrorKind::Read(e.to_string()))?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| ErrorKind::NotPem(pem_error(&e)))?;
    if certs.is_empty() {
        return Err(if has_pem_section(&bytes) {
            ErrorKind::Missing("CERTIFICATE")
        } else {
            ErrorKind::NotPem("no -----BEGIN line".into())
        });
    }
    let mut roots = rustls::RootCertStore::empty();
    for cert in certs {
        roots
            .add(cert)
            .map_err(|e| ErrorKind::BadCertificate(e.to_string()))?;
    }
    Ok(roots)
}

/// The process's one ticketer: every listener's, and every reload's, so a session
/// ticket stays good across reloads.
fn ticketer() -> Result<Arc<dyn ProducesTickets>, String> {
    static TICKETER: OnceLock<Arc<dyn ProducesTickets>> = OnceLock::new();
    if let Some(t) = TICKETER.get() {
        return Ok(Arc::clone(t));
    }
    let made = rustls::crypto::aws_lc_rs::Ticketer::new()
        .map_err(|e| format!("cannot start the session ticketer: {e}"))?;
    // Two threads may race here; the first one set is the one everyone uses.
    Ok(Arc::clone(TICKETER.get_or_init(|| made)))
}

fn read(index: usize, part: Part, path: &Path) -> Result<Vec<u8>, Error> {
    std::fs::read(path).map_err(|e| Error {
        index,
        part,
        path: path.to_owned(),
        kind: ErrorKind::Read(e.to_string()),
    })
}

/// Whether `bytes` look like PEM at all: a file with no BEGIN line is some other format
/// (DER, a typo'd path to another file), which says more than "no certificate".
pub(crate) fn has_pem_section(bytes: &[u8]) -> bool {
    memchr::memmem::find(bytes, b"-----BEGIN ").is_some()
}

/// Why a PEM file could not be read, in words: the parser's own message gives the
/// marker it wanted as a list of byte values (`missing section end marker: [67, 69,
/// 82, ...]` for a file cut short).
pub(crate) fn pem_error(e: &rustls_pki_types::pem::Error) -> String {
    use rustls_pki_types::pem::Error;
    match e {
        Error::MissingSectionEnd { end_marker } => format!(
            "no -----END {}----- line: the file is cut short, or two sections run together",
            String::from_utf8_lossy(end_marker)
        ),
        Error::IllegalSectionStart { line } => format!(
            "a BEGIN line that is not one: {:?}",
            String::from_utf8_lossy(line)
        ),
        other => other.to_string(),
    }
}

/// Whether a PEM file holds a pass-phrase-encrypted private key (PKCS#8's own section,
/// or OpenSSL's legacy headers on an `RSA`/`EC PRIVATE KEY` section), which a parser of
/// plain keys reports as no key at all.
fn is_encrypted_key(bytes: &[u8]) -> bool {
    memchr::memmem::find(bytes, b"-----BEGIN ENCRYPTED PRIVATE KEY-----").is_some()
        || memchr::memmem::find(bytes, b"Proc-Type: 4,ENCRYPTED").is_some()
}

pub(crate) fn load_one(
    index: usize,
    files: &CertFiles,
    provider: &CryptoProvider,
) -> Result<(CertifiedKey, CertInfo), Error> {
    let err = |part, path: &Path, kind| Error {
        index,
        part,
        path: path.to_owned(),
        kind,
    };
    let cert_bytes = read(index, Part::Cert, &files.cert)?;
    let chain = CertificateDer::pem_slice_iter(&cert_bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| err(Part::Cert, &files.cert, ErrorKind::NotPem(pem_error(&e))))?;
    if chain.is_empty() {
        let kind = if has_pem_section(&cert_bytes) {
            ErrorKind::Missing("CERTIFICATE")
        } else {
            ErrorKind::NotPem("no -----BEGIN line".into())
        };
        return Err(err(Part::Cert, &files.cert, kind));
    }
    let info = cert_info(&chain[0], &files.cert)
        .map_err(|e| err(Part::Cert, &files.cert, ErrorKind::BadCertificate(e)))?;
    let key_bytes = if files.key == files.cert {
        cert_bytes
    } else {
        read(index, Part::Key, &files.key)?
    };
    if is_encrypted_key(&key_bytes) {
        return Err(err(Part::Key, &files.key, ErrorKind::Encrypted));
    }
    let key = match PrivateKeyDer::from_pem_slice(&key_bytes) {
        Ok(key) => key,
        Err(rustls_pki_types::pem::Error::NoItemsFound) => {
            let kind = if has_pem_section(&key_bytes) {
                ErrorKind::Missing("PRIVATE KEY")
            } else {
                ErrorKind::NotPem("no -----BEGIN line".into())
            };
            return Err(err(Part::Key, &files.key, kind));
        }
        Err(e) => return Err(err(Part::Key, &files.key, ErrorKind::NotPem(pem_error(&e)))),
    };
    let certified = CertifiedKey::from_der(chain, key, provider).map_err(|e| match e {
        rustls::Error::InconsistentKeys(_) => err(
            Part::Key,
            &files.key,
            ErrorKind::KeyMismatch {
                cert: files.cert.clone(),
            },
        ),
        e => err(Part::Key, &files.key, ErrorKind::BadKey(e.to_string())),
    })?;
    Ok((certified, info))
}

/// The names and notAfter of a certificate.
fn cert_info(der: &CertificateDer<'_>, path: &Path) -> Result<CertInfo, String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).map_err(|e| e.to_string())?;
    let mut names = Vec::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            if let x509_parser::extensions::GeneralName::DNSName(dns) = name {
                names.push(dns.to_ascii_lowercase());
            }
        }
    }
    if names.is_empty() {
        // No SAN DNS name: the CN, as HAProxy falls back to (clients no longer accept a
        // CN alone, but a default certificate may still be such a one).
        names.extend(
            cert.subject()
                .iter_common_name()
                .filter_map(|cn| cn.as_str().ok())
                .map(str::to_ascii_lowercase),
        );
    }
    Ok(CertInfo {
        path: path.display().to_string(),
        names,
        not_after: cert.validity().not_after.timestamp(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scratch directory of this test, removed when it ends.
    fn dir(tag: &str) -> tempfile::TempDir {
        tempfile::Builder::new()
            .prefix(&format!("drover-tls-{tag}-"))
            .tempdir()
            .unwrap()
    }

    /// A self-signed certificate for `names`, valid until `until` (a year), written as
    /// `NAME.pem` and `NAME.key` in `d`.
    fn cert(d: &Path, name: &str, names: &[&str], until: i32) -> CertFiles {
        let key = rcgen::KeyPair::generate().unwrap();
        let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        let mut params = rcgen::CertificateParams::new(names).unwrap();
        params.not_before = rcgen::date_time_ymd(2000, 1, 1);
        params.not_after = rcgen::date_time_ymd(until, 1, 1);
        let c = params.self_signed(&key).unwrap();
        let files = CertFiles {
            cert: d.join(format!("{name}.pem")),
            key: d.join(format!("{name}.key")),
        };
        std::fs::write(&files.cert, c.pem()).unwrap();
        std::fs::write(&files.key, key.serialize_pem()).unwrap();
        files
    }

    fn load(certs: Vec<CertFiles>) -> Result<Certificates, Error> {
        Certificates::load(&Settings {
            certs,
            alpn: Vec::new(),
            min_version: MinVersion::default(),
            client_ca: None,
            verify_client: VerifyClient::default(),
        })
    }

    #[test]
    fn loads_names_and_expiry() {
        let scratch = dir("ok");
        let d = scratch.path();
        let a = cert(d, "a", &["a.test", "*.w.test"], 2100);
        let combined = d.join("combined.pem");
        let b = cert(d, "b", &["B.test"], 2101);
        let text =
            std::fs::read_to_string(&b.cert).unwrap() + &std::fs::read_to_string(&b.key).unwrap();
        std::fs::write(&combined, text).unwrap();
        let c = load(vec![
            a,
            CertFiles {
                cert: combined.clone(),
                key: combined,
            },
        ])
        .unwrap();
        let info = c.info();
        assert_eq!(info[0].names, ["a.test", "*.w.test"]);
        assert_eq!(info[1].names, ["b.test"], "lowercase");
        // 2100-01-01T00:00:00Z
        assert_eq!(info[0].not_after, 4_102_444_800);
        assert_eq!(info[0].not_after_text(), "Jan  1 00:00:00 2100 +00:00");
        assert_eq!(c.expiring(SystemTime::now()).count(), 0);
        let late = UNIX_EPOCH + Duration::from_secs(4_102_444_800 - 13 * 24 * 3600);
        let names: Vec<&str> = c.expiring(late).map(|i| i.path.as_str()).collect();
        assert_eq!(names.len(), 1, "only a.pem is within 14 days: {names:?}");
        assert!(names[0].ends_with("a.pem"));
    }

    #[test]
    fn each_bad_file_is_named_with_why() {
        let scratch = dir("bad");
        let d = scratch.path();
        let good = cert(d, "good", &["good.test"], 2100);
        let other = cert(d, "other", &["other.test"], 2100);
        let old = cert(d, "old", &["old.test"], 2001);
        let not_pem = d.join("not.pem");
        std::fs::write(&not_pem, "hello, I am not a certificate\n").unwrap();
        let broken = d.join("broken.pem");
        std::fs::write(
            &broken,
            "-----BEGIN CERTIFICATE-----\nnot base64 at all!\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        // Cut short: a copy interrupted, a paste that lost its last lines.
        let cut = d.join("cut.pem");
        let whole = std::fs::read_to_string(&good.cert).unwrap();
        std::fs::write(&cut, &whole[..whole.len() / 2]).unwrap();
        let missing = d.join("missing.pem");
        let encrypted_pkcs8 = d.join("enc8.key");
        std::fs::write(
            &encrypted_pkcs8,
            "-----BEGIN ENCRYPTED PRIVATE KEY-----\nMIIBvTBXBgkq\n-----END ENCRYPTED PRIVATE KEY-----\n",
        )
        .unwrap();
        let encrypted_legacy = d.join("enc1.key");
        std::fs::write(
            &encrypted_legacy,
            "-----BEGIN RSA PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\nDEK-Info: AES-256-CBC,00\n\nMIIBvTBXBgkq\n-----END RSA PRIVATE KEY-----\n",
        )
        .unwrap();
        let with = |cert: &Path, key: &Path| {
            load(vec![
                good.clone(),
                CertFiles {
                    cert: cert.to_owned(),
                    key: key.to_owned(),
                },
            ])
            .unwrap_err()
        };
        let check = |e: Error, part: Part, path: &Path, text: &str| {
            assert_eq!((e.index, e.part, e.path.as_path()), (1, part, path), "{e}");
            let shown = e.to_string();
            assert!(shown.contains(&path.display().to_string()), "{shown}");
            assert!(shown.contains(text), "{shown} lacks {text:?}");
        };
        check(
            with(&missing, &good.key),
            Part::Cert,
            &missing,
            "cannot read",
        );
        check(
            with(&good.cert, &missing),
            Part::Key,
            &missing,
            "cannot read",
        );
        check(
            with(&not_pem, &good.key),
            Part::Cert,
            &not_pem,
            "is not PEM",
        );
        check(
            with(&good.cert, &not_pem),
            Part::Key,
            &not_pem,
            "is not PEM",
        );
        check(with(&broken, &good.key), Part::Cert, &broken, "is not PEM");
        check(
            with(&cut, &good.key),
            Part::Cert,
            &cut,
            "is not PEM: no -----END CERTIFICATE----- line: the file is cut short",
        );
        check(
            with(&good.key, &good.key),
            Part::Cert,
            &good.key,
            "no CERTIFICATE section",
        );
        check(
            with(&good.cert, &good.cert),
            Part::Key,
            &good.cert,
            "no PRIVATE KEY section",
        );
        check(
            with(&good.cert, &other.key),
            Part::Key,
            &other.key,
            "is not the private key of the certificate in",
        );
        for encrypted in [&encrypted_pkcs8, &encrypted_legacy] {
            check(
                with(&good.cert, encrypted),
                Part::Key,
                encrypted,
                "is encrypted with a pass phrase",
            );
        }
        // Expired is not a bad file: it is served (see `expired`).
        let expired = load(vec![good.clone(), old.clone()]).unwrap();
        let names: Vec<&str> = expired
            .expired(SystemTime::now())
            .map(|i| i.names[0].as_str())
            .collect();
        assert_eq!(names, ["old.test"]);
        let none = Certificates::load(&Settings {
            certs: Vec::new(),
            alpn: Vec::new(),
            min_version: MinVersion::default(),
            client_ca: None,
            verify_client: VerifyClient::default(),
        });
        assert_eq!(none.unwrap_err().kind, ErrorKind::NoCertificates);
    }

    /// `from` moved over `to`, as renewal tools replace files (a new inode).
    fn replace(from: &Path, to: &Path) {
        std::fs::rename(from, to).unwrap();
    }

    #[test]
    fn changed_files_are_read_once_settled_and_a_bad_change_is_not_retried_until_it_changes() {
        let scratch = dir("watch");
        let d = scratch.path();
        let a = cert(d, "a", &["a.test"], 2100);
        let certs = load(vec![a.clone()]).unwrap();
        let mut watch = watch::Watch::default();
        assert!(watch.look(&certs).is_none(), "nothing changed");

        let b = cert(d, "b", &["b.test"], 2100);
        replace(&b.cert, &a.cert);
        // The certificate changed and its key not yet: not read while settling.
        assert!(watch.look(&certs).is_none(), "read before it settled");
        replace(&b.key, &a.key);
        assert!(watch.look(&certs).is_none(), "read before it settled");
        let read = watch.look(&certs).expect("read once settled").unwrap();
        assert_eq!(read.info()[0].names, ["b.test"]);
        assert!(watch.look(&read).is_none(), "the files it was read from");

        std::fs::write(d.join("bad"), "garbage\n").unwrap();
        replace(&d.join("bad"), &a.cert);
        assert!(watch.look(&read).is_none());
        let e = watch.look(&read).expect("read once settled").unwrap_err();
        assert_eq!((e.part, e.path.as_path()), (Part::Cert, a.cert.as_path()));
        assert!(watch.look(&read).is_none(), "tried again unchanged");
        assert!(watch.look(&read).is_none(), "tried again unchanged");
        let c = cert(d, "c", &["c.test"], 2100);
        replace(&c.cert, &a.cert);
        replace(&c.key, &a.key);
        assert!(watch.look(&read).is_none());
        let fixed = watch.look(&read).expect("read once settled").unwrap();
        assert_eq!(fixed.info()[0].names, ["c.test"]);
    }

    #[test]
    fn an_expired_renewal_of_a_valid_certificate_changes_nothing_and_of_an_expired_one_is_read() {
        let scratch = dir("renewal");
        let d = scratch.path();
        let a = cert(d, "a", &["a.test"], 2100);
        let served = load(vec![a.clone()]).unwrap();
        let mut watch = watch::Watch::default();
        let old = cert(d, "old", &["a.test"], 2001);
        replace(&old.cert, &a.cert);
        replace(&old.key, &a.key);
        assert!(watch.look(&served).is_none(), "read before it settled");
        let e = watch.look(&served).expect("read once settled").unwrap_err();
        assert_eq!((e.part, e.path.as_path()), (Part::Cert, a.cert.as_path()));
        assert!(
            e.to_string().contains("expired on Jan  1 00:00:00 2001"),
            "{e}"
        );
        assert!(watch.look(&served).is_none(), "tried again unchanged");

        // Served expired (it was loaded so at start): its renewal is read, expired or not.
        let expired = load(vec![a.clone()]).unwrap();
        assert_eq!(expired.expired(SystemTime::now()).count(), 1);
        let older = cert(d, "older", &["a.test"], 2000);
        replace(&older.cert, &a.cert);
        replace(&older.key, &a.key);
        let mut watch = watch::Watch::default();
        assert!(watch.look(&expired).is_none());
        assert!(watch.look(&expired).expect("read once settled").is_ok());
        let new = cert(d, "new", &["a.test"], 2100);
        replace(&new.cert, &a.cert);
        replace(&new.key, &a.key);
        assert!(watch.look(&expired).is_none());
        let renewed = watch.look(&expired).expect("read once settled").unwrap();
        assert_eq!(renewed.expired(SystemTime::now()).count(), 0);
        assert!(renewed
            .check_renewal_of(&expired, SystemTime::now())
            .is_ok());
        assert!(expired
            .check_renewal_of(&renewed, SystemTime::now())
            .is_err());
    }

    #[test]
    fn one_ticketer_for_the_process() {
        let a = ticketer().unwrap();
        let b = ticketer().unwrap();
        assert!(Arc::ptr_eq(&a, &b), "a reload must keep the ticket key");
    }
}
