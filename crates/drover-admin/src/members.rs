//! `/v1/balancers/{balancer}/members[/{id}[/heartbeat]]`: backends that join and leave
//! at runtime, in the shape Consul's agent API made familiar (register with a TTL, pass
//! it with heartbeats, deregister).

use drover_registry::{
    EndpointStatus, MemberError, MemberErrorKind, MemberState, MemberStore, MemberView, Pool,
    Registration,
};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// What a balancer's members are kept in, and the pool they feed.
#[derive(Clone)]
pub struct BalancerMembers {
    pub store: Arc<dyn MemberStore>,
    pub pool: Arc<Pool>,
}

/// A registration body: `{"address": "host:port", "ttl": "10s", "weight": 1, "meta": {}}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RegisterBody {
    address: String,
    #[serde(default)]
    ttl: Option<TtlValue>,
    #[serde(default)]
    weight: Option<u32>,
    #[serde(default)]
    meta: BTreeMap<String, String>,
}

/// A TTL as a duration string ("10s", "1m 30s") or a number of seconds.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum TtlValue {
    Seconds(f64),
    Text(String),
}

/// A heartbeat body: `{"load": 0.7}`, or none at all.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct HeartbeatBody {
    #[serde(default)]
    load: Option<f64>,
}

/// One member as the API answers it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemberRow {
    pub id: String,
    /// As registered (a name, or an IP:PORT).
    pub address: String,
    /// What it resolved to.
    pub addr: String,
    /// static, supervisor, admin, etcd or dns.
    pub source: String,
    /// active, draining or removed.
    pub state: String,
    pub weight: u32,
    pub ttl_secs: Option<f64>,
    pub ttl_left_secs: Option<f64>,
    pub meta: BTreeMap<String, String>,
    pub in_flight: u32,
    /// Health as the balancer sees it; none once the member left the pool.
    pub healthy: Option<bool>,
    pub available: Option<bool>,
}

/// `GET /v1/balancers/{balancer}/members`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemberList {
    pub balancer: String,
    pub members: Vec<MemberRow>,
}

/// An API failure: the status to answer and a message naming what is wrong.
pub(crate) struct Refusal {
    pub status: u16,
    pub message: String,
}

impl Refusal {
    fn invalid(message: String) -> Refusal {
        Refusal {
            status: 400,
            message,
        }
    }
}

impl From<MemberError> for Refusal {
    fn from(e: MemberError) -> Refusal {
        let status = match e.kind() {
            MemberErrorKind::Invalid => 400,
            MemberErrorKind::Conflict => 409,
            MemberErrorKind::NotFound => 404,
            MemberErrorKind::Unavailable => 503,
        };
        Refusal {
            status,
            message: e.to_string(),
        }
    }
}

/// `PUT .../members/{id}`: answers whether the member was created, and the member.
pub(crate) async fn register(
    members: &BalancerMembers,
    id: &str,
    body: &[u8],
) -> Result<(bool, MemberRow), Refusal> {
    drover_registry::members::check_id(id)?;
    let body: RegisterBody = parse_body(body, "{\"address\": \"host:port\", \"ttl\": \"10s\"}")?;
    let ttl = match body.ttl {
        None => None,
        Some(TtlValue::Seconds(s)) if (0.0..=1e9).contains(&s) => Some(Duration::from_secs_f64(s)),
        Some(TtlValue::Seconds(s)) => {
            return Err(Refusal::invalid(format!(
                "ttl {s} is not a number of seconds"
            )))
        }
        Some(TtlValue::Text(t)) => {
            Some(drover_units::duration(&t).map_err(|e| Refusal::invalid(format!("ttl: {e}")))?)
        }
    };
    let addr = resolve(&body.address).await?;
    let registration = Registration {
        address: body.address,
        addr,
        ttl,
        weight: body.weight.unwrap_or(1),
        meta: body.meta,
    };
    let registered = members.store.register(id.to_string(), registration).await?;
    Ok((registered.created, row(&members.pool, &registered.member)))
}

/// `PUT .../members/{id}/heartbeat`.
pub(crate) async fn heartbeat(
    members: &BalancerMembers,
    id: &str,
    body: &[u8],
) -> Result<MemberRow, Refusal> {
    let body: HeartbeatBody = if body.iter().all(u8::is_ascii_whitespace) {
        HeartbeatBody::default()
    } else {
        parse_body(body, "{\"load\": 0.7}")?
    };
    let member = members.store.heartbeat(id.to_string(), body.load).await?;
    Ok(row(&members.pool, &member))
}

/// `DELETE .../members/{id}`.
pub(crate) async fn drain(members: &BalancerMembers, id: &str) -> Result<MemberRow, Refusal> {
    let member = members.store.drain(id.to_string()).await?;
    Ok(row(&members.pool, &member))
}

/// `GET .../members`: the runtime members, then every other endpoint of the pool with
/// the source that put it there.
pub(crate) fn list(balancer: &str, members: &BalancerMembers) -> MemberList {
    let runtime = members.store.list();
    // One status and one index, not one per member: lists of thousands stay linear.
    let status = members.pool.status();
    let by_addr: HashMap<SocketAddr, &EndpointStatus> =
        status.iter().map(|e| (e.addr, e)).collect();
    let mut rows: Vec<MemberRow> = runtime
        .iter()
        .map(|m| row_with(m, by_addr.get(&m.addr).copied()))
        .collect();
    let listed: HashSet<SocketAddr> = runtime
        .iter()
        .filter(|m| m.state == MemberState::Active)
        .map(|m| m.addr)
        .collect();
    for ep in &status {
        if listed.contains(&ep.addr) {
            continue;
        }
        let source = members
            .pool
            .sources_of(ep.addr)
            .first()
            .map_or("-", |s| s.as_str())
            .to_string();
        rows.push(MemberRow {
            id: ep.id.clone(),
            address: ep.addr.to_string(),
            addr: ep.addr.to_string(),
            source,
            state: MemberState::Active.as_str().to_string(),
            weight: ep.weight,
            ttl_secs: None,
            ttl_left_secs: None,
            meta: BTreeMap::new(),
            in_flight: ep.in_flight,
            healthy: Some(ep.healthy),
            available: Some(ep.available),
        });
    }
    MemberList {
        balancer: balancer.to_string(),
        members: rows,
    }
}

/// One member as answered to a single request about it.
fn row(pool: &Pool, m: &MemberView) -> MemberRow {
    let status = pool.status();
    row_with(m, status.iter().find(|e| e.addr == m.addr))
}

/// One member, with its endpoint's state while it is in the pool.
fn row_with(m: &MemberView, ep: Option<&EndpointStatus>) -> MemberRow {
    let ep = ep.filter(|_| m.state == MemberState::Active);
    MemberRow {
        id: m.id.clone(),
        address: m.address.clone(),
        addr: m.addr.to_string(),
        source: m.source.as_str().to_string(),
        state: m.state.as_str().to_string(),
        weight: m.weight,
        ttl_secs: m.ttl.map(|t| t.as_secs_f64()),
        ttl_left_secs: m.ttl_left.map(|t| t.as_secs_f64()),
        meta: m.meta.clone(),
        in_flight: m.in_flight,
        healthy: ep.map(|e| e.healthy),
        available: ep.map(|e| e.available),
    }
}

fn parse_body<T: serde::de::DeserializeOwned>(body: &[u8], example: &str) -> Result<T, Refusal> {
    serde_json::from_slice(body)
        .map_err(|e| Refusal::invalid(format!("body: {e}; expected JSON such as {example}")))
}

/// `host:port` to one socket address: an IP literal as it is, a name through the
/// system resolver (once, at registration).
async fn resolve(address: &str) -> Result<SocketAddr, Refusal> {
    if let Ok(addr) = address.parse::<SocketAddr>() {
        return check_port(address, addr);
    }
    let Some((host, port)) = address.rsplit_once(':') else {
        return Err(Refusal::invalid(format!(
            "address {address:?} is not host:port"
        )));
    };
    if host.is_empty() || port.parse::<u16>().is_err() {
        return Err(Refusal::invalid(format!(
            "address {address:?} is not host:port"
        )));
    }
    let found = tokio::time::timeout(Duration::from_secs(5), tokio::net::lookup_host(address))
        .await
        .map_err(|_| Refusal::invalid(format!("address {address:?}: lookup timed out")))?
        .map_err(|e| Refusal::invalid(format!("address {address:?} does not resolve: {e}")))?
        .next()
        .ok_or_else(|| Refusal::invalid(format!("address {address:?} resolves to nothing")))?;
    check_port(address, found)
}

fn check_port(address: &str, addr: SocketAddr) -> Result<SocketAddr, Refusal> {
    if addr.port() == 0 || addr.ip().is_unspecified() {
        return Err(Refusal::invalid(format!(
            "address {address:?} cannot be connected to: give the host and port the member listens on"
        )));
    }
    Ok(addr)
}

impl MemberList {
    /// The human view `drover ctl members list` prints.
    pub fn to_table(&self) -> String {
        let mut out = format!(
            "balancer {}: {} members\n",
            self.balancer,
            self.members.len()
        );
        let secs = |s: Option<f64>| s.map_or("-".to_string(), |s| format!("{s:.1}s"));
        let rows: Vec<Vec<String>> = self
            .members
            .iter()
            .map(|m| {
                let health = match (m.healthy, m.available) {
                    (Some(true), Some(true)) => "up",
                    (Some(true), _) => "ejected",
                    (Some(false), _) => "down",
                    (None, _) => "-",
                };
                let meta: Vec<String> = m.meta.iter().map(|(k, v)| format!("{k}={v}")).collect();
                vec![
                    m.id.clone(),
                    m.addr.clone(),
                    m.source.clone(),
                    m.state.clone(),
                    health.to_string(),
                    m.in_flight.to_string(),
                    m.weight.to_string(),
                    secs(m.ttl_secs),
                    secs(m.ttl_left_secs),
                    if meta.is_empty() {
                        "-".to_string()
                    } else {
                        meta.join(",")
                    },
                ]
            })
            .collect();
        crate::status::table(
            &mut out,
            &[
                "ID",
                "ADDRESS",
                "SOURCE",
                "STATE",
                "HEALTH",
                "IN-FLIGHT",
                "WEIGHT",
                "TTL",
                "TTL LEFT",
                "META",
            ],
            &rows,
        );
        out
    }
}
