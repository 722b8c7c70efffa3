//! A CA of the test's own and the certificates it signs (rcgen), for the TLS tests of
//! the binary (tls.rs, tcp_sni.rs), and whether the TLS command-line clients are here.

use rustls::pki_types::CertificateDer;
use std::path::PathBuf;
use std::process::Command;

use super::temp_dir;

/// Whether curl and openssl are here; under CI they must be (scripts/test installs
/// them).
pub fn tools() -> bool {
    let missing: Vec<&str> = ["curl", "openssl"]
        .into_iter()
        .filter(|t| {
            Command::new(t)
                .arg("--version")
                .output()
                .map_or(true, |o| !o.status.success())
                && Command::new(t).arg("version").output().is_err()
        })
        .collect();
    if missing.is_empty() {
        return true;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "{missing:?} missing (scripts/test installs them)"
    );
    eprintln!("skipped: {missing:?} missing");
    false
}

/// A CA of the test's own, and the certificates it signs, as files in `dir`.
pub struct Pki {
    pub dir: PathBuf,
    pub ca: rcgen::CertifiedIssuer<'static, rcgen::KeyPair>,
    /// The CA's certificate, for clients (`--cacert`, `-CAfile`).
    pub ca_pem: PathBuf,
}

/// When test certificates expire unless a test says otherwise (year, month, day).
pub fn far_future() -> (i32, u8, u8) {
    (2100, 1, 1)
}

impl Pki {
    pub fn new(tag: &str) -> Pki {
        let dir = temp_dir(tag);
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "drover test CA");
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let ca = rcgen::CertifiedIssuer::self_signed(params, rcgen::KeyPair::generate().unwrap())
            .unwrap();
        let ca_pem = dir.join("ca.pem");
        std::fs::write(&ca_pem, ca.pem()).unwrap();
        Pki { dir, ca, ca_pem }
    }

    /// A certificate with CN `cn` and SAN `names`, valid from 2000 to `until`, signed by
    /// the CA: `FILE.pem` and `FILE.key`.
    pub fn leaf(
        &self,
        file: &str,
        cn: &str,
        names: &[&str],
        until: (i32, u8, u8),
    ) -> (PathBuf, PathBuf) {
        let key = rcgen::KeyPair::generate().unwrap();
        let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        let mut params = rcgen::CertificateParams::new(names).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        params.not_before = rcgen::date_time_ymd(2000, 1, 1);
        params.not_after = rcgen::date_time_ymd(until.0, until.1, until.2);
        let cert = params.signed_by(&key, &self.ca).unwrap();
        let (pem, k) = (
            self.dir.join(format!("{file}.pem")),
            self.dir.join(format!("{file}.key")),
        );
        std::fs::write(&pem, cert.pem()).unwrap();
        std::fs::write(&k, key.serialize_pem()).unwrap();
        (pem, k)
    }

    pub fn ca_der(&self) -> CertificateDer<'static> {
        self.ca.der().clone()
    }
}
