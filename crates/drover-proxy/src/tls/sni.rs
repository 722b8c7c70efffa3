//! Which certificate a handshake gets: one whose names match the client's SNI exactly,
//! else one with a wildcard for it (`*.example.com` covers `a.example.com`, one label
//! only, RFC 6125 §6.4.3), else the default (the first configured, and each other one
//! with the same names), which also answers a client that sends no SNI. Where several
//! certificates name the same host (an RSA and an ECDSA one, as nginx's two
//! `ssl_certificate` lines), the first listed that the client can use wins: one whose
//! key signs with a scheme the client offers, under a cipher suite it offers (TLS 1.2
//! suites name the key's algorithm). rustls's own `ResolvesServerCertUsingSni` has
//! neither wildcards, nor a default, nor a choice by algorithm.

use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::SupportedCipherSuite;
use std::collections::HashMap;
use std::sync::Arc;

#[derive(Debug)]
pub(super) struct BySni {
    keys: Vec<Arc<CertifiedKey>>,
    /// The default's candidates: 0, then each other certificate with its names.
    default: Vec<usize>,
    /// Each name's candidates, in the order configured.
    exact: HashMap<String, Vec<usize>>,
    /// By the wildcard's parent: `example.com` for `*.example.com`.
    wildcard: HashMap<String, Vec<usize>>,
    /// The provider's cipher suites, to tell which of a client's suites a key can use.
    suites: Vec<SupportedCipherSuite>,
}

impl BySni {
    /// `names[i]` are the lowercase names of `keys[i]`; `suites` the provider's.
    pub(super) fn new(
        keys: Vec<Arc<CertifiedKey>>,
        names: Vec<&[String]>,
        suites: Vec<SupportedCipherSuite>,
    ) -> BySni {
        let (mut exact, mut wildcard) = (HashMap::new(), HashMap::new());
        for (i, names) in names.iter().enumerate() {
            for name in names.iter() {
                let (map, key) = match name.strip_prefix("*.") {
                    Some(parent) => (&mut wildcard, parent),
                    None => (&mut exact, name.as_str()),
                };
                map.entry(key.to_string()).or_insert_with(Vec::new).push(i);
            }
        }
        let default = (0..names.len())
            .filter(|&i| i == 0 || names[i] == names[0])
            .collect();
        BySni {
            keys,
            default,
            exact,
            wildcard,
            suites,
        }
    }

    /// The candidates for `server_name` (any case), in the order configured; `None`
    /// for the default's.
    pub(super) fn find(&self, server_name: &str) -> Option<&[usize]> {
        let name = server_name.trim_end_matches('.').to_ascii_lowercase();
        if let Some(found) = self.exact.get(&name) {
            return Some(found);
        }
        let (_, parent) = name.split_once('.')?;
        self.wildcard.get(parent).map(Vec::as_slice)
    }

    /// Whether a client that offers `schemes` and `suites` can be served with `key`.
    fn usable(&self, key: &CertifiedKey, hello: &ClientHello<'_>) -> bool {
        let algorithm = key.key.algorithm();
        key.key.choose_scheme(hello.signature_schemes()).is_some()
            && hello.cipher_suites().iter().any(|offered| {
                self.suites
                    .iter()
                    .any(|s| s.suite() == *offered && s.usable_for_signature_algorithm(algorithm))
            })
    }
}

impl ResolvesServerCert for BySni {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let candidates = hello
            .server_name()
            .and_then(|n| self.find(n))
            .unwrap_or(&self.default);
        // None usable: the first, and the handshake fails as the client's offer says.
        let i = candidates
            .iter()
            .copied()
            .find(|&i| candidates.len() == 1 || self.usable(&self.keys[i], &hello))
            .unwrap_or(candidates[0]);
        self.keys.get(i).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&[&str]]) -> Vec<Vec<String>> {
        list.iter()
            .map(|n| n.iter().map(|s| s.to_string()).collect())
            .collect()
    }

    #[test]
    fn exact_then_wildcard_then_default() {
        let names = names(&[
            &["default.test"],
            &["*.example.com", "example.com"],
            &["api.example.com"],
            &["api.example.com", "other.test"],
        ]);
        let by = BySni::new(
            Vec::new(),
            names.iter().map(Vec::as_slice).collect(),
            Vec::new(),
        );
        let find = |name: &str| by.find(name).map(|c| c[0]);
        assert_eq!(find("api.example.com"), Some(2), "exact beats wildcard");
        assert_eq!(find("API.Example.COM."), Some(2), "any case, trailing dot");
        assert_eq!(find("www.example.com"), Some(1));
        assert_eq!(find("example.com"), Some(1));
        assert_eq!(find("a.b.example.com"), None, "a wildcard covers one label");
        assert_eq!(find("other.test"), Some(3));
        assert_eq!(find("default.test"), Some(0));
        assert_eq!(find("nowhere.test"), None);
        assert_eq!(find("localhost"), None);
        assert_eq!(
            by.find("api.example.com"),
            Some(&[2, 3][..]),
            "both, in order"
        );
        assert_eq!(by.default, [0]);
    }
}
