//! Which certificate a handshake gets: the one whose names match the client's SNI
//! exactly, else one with a wildcard for it (`*.example.com` covers `a.example.com`,
//! one label only, RFC 6125 §6.4.3), else the default (the first configured), which is
//! also the answer to a client that sends no SNI. Where two certificates name the same
//! host, the one listed first wins. rustls's own `ResolvesServerCertUsingSni` has
//! neither wildcards nor a default.

use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use std::collections::HashMap;
use std::sync::Arc;

#[derive(Debug)]
pub(super) struct BySni {
    /// Never empty: index 0 is the default.
    keys: Vec<Arc<CertifiedKey>>,
    exact: HashMap<String, usize>,
    /// By the wildcard's parent: `example.com` for `*.example.com`.
    wildcard: HashMap<String, usize>,
}

impl BySni {
    /// `names[i]` are the lowercase names of `keys[i]`.
    pub(super) fn new(keys: Vec<Arc<CertifiedKey>>, names: Vec<&[String]>) -> BySni {
        let (mut exact, mut wildcard) = (HashMap::new(), HashMap::new());
        for (i, names) in names.into_iter().enumerate() {
            for name in names {
                match name.strip_prefix("*.") {
                    Some(parent) => wildcard.entry(parent.to_string()).or_insert(i),
                    None => exact.entry(name.clone()).or_insert(i),
                };
            }
        }
        BySni {
            keys,
            exact,
            wildcard,
        }
    }

    /// The index of the certificate for `server_name` (any case), `None` for the
    /// default.
    pub(super) fn find(&self, server_name: &str) -> Option<usize> {
        let name = server_name.trim_end_matches('.').to_ascii_lowercase();
        if let Some(&i) = self.exact.get(&name) {
            return Some(i);
        }
        let (_, parent) = name.split_once('.')?;
        self.wildcard.get(parent).copied()
    }
}

impl ResolvesServerCert for BySni {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let i = hello.server_name().and_then(|n| self.find(n)).unwrap_or(0);
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
        let by = BySni::new(Vec::new(), names.iter().map(Vec::as_slice).collect());
        assert_eq!(by.find("api.example.com"), Some(2), "exact beats wildcard");
        assert_eq!(
            by.find("API.Example.COM."),
            Some(2),
            "any case, trailing dot"
        );
        assert_eq!(by.find("www.example.com"), Some(1));
        assert_eq!(by.find("example.com"), Some(1));
        assert_eq!(
            by.find("a.b.example.com"),
            None,
            "a wildcard covers one label"
        );
        assert_eq!(by.find("other.test"), Some(3));
        assert_eq!(by.find("default.test"), Some(0));
        assert_eq!(by.find("nowhere.test"), None);
        assert_eq!(by.find("localhost"), None);
    }
}
