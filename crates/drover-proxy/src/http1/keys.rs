//! What balancing reads from a request head: its cost class (method and target), and
//! the keys that pin it (`hash` on a header, cookie, client IP or path; the `sticky`
//! cookie).

use super::forward::ClientInfo;
use super::headers::is;
use crate::options::HashKey;

/// What balancing needs from a request: its keys, when the strategy uses them.
#[derive(Debug, Clone, Default)]
pub struct KeySpec {
    pub hash: Option<HashKey>,
    pub sticky_cookie: Option<String>,
}

/// The keys of one request, as `KeySpec` asks for them.
pub(crate) fn of(
    keys: &KeySpec,
    req: &httparse::Request<'_, '_>,
    target: &str,
    client: &ClientInfo,
) -> (Option<Vec<u8>>, Option<String>) {
    let hash = keys
        .hash
        .as_ref()
        .and_then(|k| hash_key(k, req, target, client));
    let sticky = keys
        .sticky_cookie
        .as_deref()
        .and_then(|c| cookie(req, c))
        .and_then(|v| std::str::from_utf8(v).ok())
        .map(str::to_owned);
    (hash, sticky)
}

/// A request's cost class: method plus target, so `/report?year=2020` and `/` differ.
pub(crate) fn cost_key(method: &str, target: &str) -> u64 {
    drover_balance::cost::CostTable::key(method.as_bytes(), target.as_bytes())
}

fn hash_key(
    key: &HashKey,
    req: &httparse::Request<'_, '_>,
    target: &str,
    client: &ClientInfo,
) -> Option<Vec<u8>> {
    match key {
        HashKey::Header(name) => req
            .headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| h.value.to_vec()),
        HashKey::Cookie(name) => cookie(req, name).map(<[u8]>::to_vec),
        HashKey::ClientIp => Some(client.ip.as_bytes().to_vec()),
        HashKey::Path => Some(target.split('?').next().unwrap_or("").as_bytes().to_vec()),
    }
}

/// The value of cookie `name` in the request's `Cookie` fields.
fn cookie<'b>(req: &httparse::Request<'_, 'b>, name: &str) -> Option<&'b [u8]> {
    req.headers
        .iter()
        .filter(|h| is(h.name, "cookie"))
        .flat_map(|h| h.value.split(|&b| b == b';'))
        .find_map(|pair| {
            let pair = pair.trim_ascii();
            let eq = memchr::memchr(b'=', pair)?;
            (pair[..eq].trim_ascii() == name.as_bytes()).then(|| pair[eq + 1..].trim_ascii())
        })
}
