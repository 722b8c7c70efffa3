//! Members that join a pool at runtime, the way Consul's agent API has services do it:
//! registered under an id with a TTL, kept alive by heartbeats (which may carry the
//! backend's own load), drained on request, removed when the TTL lapses.
//!
//! `MemberStore` is what the admin API calls; `Members` is the store kept in this
//! balancer's memory. A store shared by several balancers (etcd) implements the same
//! trait, so the API and `drover ctl` do not change with where members are kept.

use crate::pool::{Pool, Source};
use drover_balance::{clock, Endpoint};
use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// The shortest TTL a member may ask for: heartbeats at a third of it must still be
/// far apart compared to a request.
pub const TTL_MIN: Duration = Duration::from_secs(1);
/// The longest: a day. A member that wants no TTL leaves it out.
pub const TTL_MAX: Duration = Duration::from_secs(24 * 3600);
/// Relative weight, as for a configured backend.
pub const WEIGHT_MAX: u32 = 1000;
/// An id is a path segment: letters, digits, `.`, `_`, `-`, `:`, at most this long.
pub const ID_MAX_LEN: usize = 128;
/// `meta` is free-form labels, bounded so a registration cannot grow drover's memory.
pub const META_MAX_KEYS: usize = 32;
pub const META_MAX_LEN: usize = 256;

/// How often lapsed TTLs and finished drains are looked for, while there are any to
/// look for: with no member that has a TTL or drains, the sweeper sleeps until one
/// registers or drains, so an idle balancer is not woken ten times a second.
const SWEEP_EVERY: Duration = Duration::from_millis(100);

/// What a member asks for when it registers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registration {
    /// The address as given (it may be a name that `addr` was resolved from).
    pub address: String,
    pub addr: SocketAddr,
    /// `None`: the member stays until it is drained.
    pub ttl: Option<Duration>,
    pub weight: u32,
    pub meta: BTreeMap<String, String>,
}

impl Registration {
    /// Checks the bounds of every field; the error names the first one out of bounds.
    pub fn validate(&self) -> Result<(), MemberError> {
        if let Some(ttl) = self.ttl {
            if !(TTL_MIN..=TTL_MAX).contains(&ttl) {
                return Err(MemberError::InvalidTtl(ttl));
            }
        }
        if !(1..=WEIGHT_MAX).contains(&self.weight) {
            return Err(MemberError::InvalidWeight(self.weight));
        }
        if self.meta.len() > META_MAX_KEYS {
            return Err(MemberError::InvalidMeta(format!(
                "{} keys; at most {META_MAX_KEYS}",
                self.meta.len()
            )));
        }
        for (k, v) in &self.meta {
            if k.is_empty() || k.len() > META_MAX_LEN || v.len() > META_MAX_LEN {
                return Err(MemberError::InvalidMeta(format!(
                    "key {k:?}: keys are 1..={META_MAX_LEN} bytes and values at most {META_MAX_LEN}"
                )));
            }
        }
        Ok(())
    }
}

/// Checks a member id (it travels in URL paths and etcd keys).
pub fn check_id(id: &str) -> Result<(), MemberError> {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | ':');
    if id.is_empty() || id.len() > ID_MAX_LEN || !id.chars().all(ok_char) || id == "." || id == ".."
    {
        return Err(MemberError::InvalidId(id.to_string()));
    }
    Ok(())
}

/// Checks a heartbeat's load report: a utilisation, 0 (idle) to 1 (saturated).
pub fn check_load(load: f64) -> Result<(), MemberError> {
    if load.is_finite() && (0.0..=1.0).contains(&load) {
        Ok(())
    } else {
        Err(MemberError::InvalidLoad(load.to_string()))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemberState {
    /// In the pool.
    Active,
    /// Out of the pool: gets no new requests, its requests in flight finish.
    Draining,
    /// Gone (the answer to a drain of a member with nothing in flight).
    Removed,
}

impl MemberState {
    pub fn as_str(self) -> &'static str {
        match self {
            MemberState::Active => "active",
            MemberState::Draining => "draining",
            MemberState::Removed => "removed",
        }
    }
}

/// A member as the admin API lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct MemberView {
    pub id: String,
    pub address: String,
    pub addr: SocketAddr,
    pub source: Source,
    pub state: MemberState,
    pub weight: u32,
    pub ttl: Option<Duration>,
    /// Time until the TTL lapses without a heartbeat.
    pub ttl_left: Option<Duration>,
    pub meta: BTreeMap<String, String>,
    pub in_flight: u32,
}

/// The answer to a registration.
#[derive(Debug, Clone, PartialEq)]
pub struct Registered {
    /// False when an existing member was updated.
    pub created: bool,
    pub member: MemberView,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemberError {
    InvalidId(String),
    InvalidTtl(Duration),
    InvalidWeight(u32),
    InvalidMeta(String),
    InvalidLoad(String),
    /// The id is registered with another address.
    IdTaken {
        id: String,
        addr: SocketAddr,
    },
    /// The address already belongs to another member, or to another source of the pool.
    AddressTaken {
        addr: SocketAddr,
        by: String,
    },
    NotFound {
        id: String,
    },
    /// A heartbeat for a member that is being drained.
    Draining {
        id: String,
    },
    /// The member's key or its address's changed under each try of a registration
    /// (other clients writing them at the same moment); nothing was changed.
    Contended {
        id: String,
        addr: SocketAddr,
    },
    /// The store is out of reach (etcd down); nothing was changed.
    Unavailable(String),
}

/// How an API answers a `MemberError`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemberErrorKind {
    Invalid,
    Conflict,
    NotFound,
    Unavailable,
}

impl MemberError {
    pub fn kind(&self) -> MemberErrorKind {
        match self {
            MemberError::InvalidId(_)
            | MemberError::InvalidTtl(_)
            | MemberError::InvalidWeight(_)
            | MemberError::InvalidMeta(_)
            | MemberError::InvalidLoad(_) => MemberErrorKind::Invalid,
            MemberError::IdTaken { .. }
            | MemberError::AddressTaken { .. }
            | MemberError::Draining { .. }
            | MemberError::Contended { .. } => MemberErrorKind::Conflict,
            MemberError::NotFound { .. } => MemberErrorKind::NotFound,
            MemberError::Unavailable(_) => MemberErrorKind::Unavailable,
        }
    }
}

impl fmt::Display for MemberError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MemberError::InvalidId(id) => write!(
                f,
                "id {id:?} is not a member id: 1..={ID_MAX_LEN} letters, digits, '.', '_', '-' or ':'"
            ),
            MemberError::InvalidTtl(ttl) => write!(
                f,
                "ttl {} is out of bounds: {}s..={}s",
                humanish(*ttl),
                TTL_MIN.as_secs(),
                TTL_MAX.as_secs()
            ),
            MemberError::InvalidWeight(w) => write!(f, "weight {w} is out of bounds: 1..={WEIGHT_MAX}"),
            MemberError::InvalidMeta(why) => write!(f, "meta: {why}"),
            MemberError::InvalidLoad(l) => {
                write!(f, "load {l} is not a utilisation: a number from 0 to 1")
            }
            MemberError::IdTaken { id, addr } => write!(
                f,
                "address: member {id:?} is registered with {addr}; drain it first or use another id"
            ),
            MemberError::AddressTaken { addr, by } => {
                write!(f, "address: {addr} is already {by}")
            }
            MemberError::NotFound { id } => write!(f, "no member {id:?}: register it first"),
            MemberError::Draining { id } => write!(
                f,
                "member {id:?} is draining; register it again to bring it back"
            ),
            MemberError::Contended { id, addr } => write!(
                f,
                "member {id:?} or address {addr} was changed by another client at each try; try again"
            ),
            MemberError::Unavailable(why) => write!(f, "membership store unavailable: {why}"),
        }
    }
}

impl std::error::Error for MemberError {}

fn humanish(d: Duration) -> String {
    format!("{}s", d.as_secs_f64())
}

pub type MemberFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, MemberError>> + Send + 'a>>;

/// Where a balancer's runtime members are kept.
pub trait MemberStore: Send + Sync {
    /// Registers `id` (or replaces its TTL, weight and meta; a draining member comes back).
    fn register(&self, id: String, registration: Registration) -> MemberFuture<'_, Registered>;
    /// Keeps `id` alive for another TTL; `load` is the backend's utilisation, if it says.
    fn heartbeat(&self, id: String, load: Option<f64>) -> MemberFuture<'_, MemberView>;
    /// Takes `id` out of the pool; it is removed once its requests in flight finish.
    fn drain(&self, id: String) -> MemberFuture<'_, MemberView>;
    /// The members as this balancer knows them now.
    fn list(&self) -> Vec<MemberView>;
}

struct Member {
    reg: Registration,
    /// When the TTL lapses without a heartbeat.
    deadline: Option<Instant>,
    state: MemberState,
    /// While draining: the endpoint whose requests are awaited.
    draining: Option<Arc<Endpoint>>,
}

/// Runtime members kept in this balancer's memory, feeding one pool as `source`.
pub struct Members {
    pool: Arc<Pool>,
    source: Source,
    table: Mutex<BTreeMap<String, Member>>,
    /// Wakes a sleeping sweeper: a member registered or began to drain, or the
    /// `Members` is gone.
    changed: Arc<tokio::sync::Notify>,
}

impl Drop for Members {
    fn drop(&mut self) {
        self.changed.notify_one();
    }
}

impl fmt::Debug for Members {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Members")
            .field("pool", &self.pool.name())
            .field("source", &self.source)
            .finish()
    }
}

impl Members {
    pub fn new(pool: Arc<Pool>, source: Source) -> Arc<Members> {
        Arc::new(Members {
            pool,
            source,
            table: Mutex::new(BTreeMap::new()),
            changed: Arc::default(),
        })
    }

    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    /// Removes lapsed members and finished drains every `SWEEP_EVERY` on the current
    /// tokio runtime, until the `Members` is dropped.
    pub fn spawn_sweeper(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let weak: Weak<Members> = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(SWEEP_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                let Some(members) = weak.upgrade() else {
                    return;
                };
                if !members.has_sweeping_to_do() {
                    // `notify_one` keeps a wake-up that comes before this waits.
                    let changed = Arc::clone(&members.changed);
                    drop(members);
                    changed.notified().await;
                    continue;
                }
                drop(members);
                tick.tick().await;
                let Some(members) = weak.upgrade() else {
                    return;
                };
                members.sweep_at(Instant::now());
            }
        })
    }

    /// Whether a sweep could remove anything: a member with a TTL, or one draining.
    fn has_sweeping_to_do(&self) -> bool {
        self.lock()
            .values()
            .any(|m| m.deadline.is_some() || m.state != MemberState::Active)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Member>> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn register_at(
        &self,
        id: &str,
        reg: Registration,
        now: Instant,
    ) -> Result<Registered, MemberError> {
        check_id(id)?;
        reg.validate()?;
        let mut table = self.lock();
        if let Some(m) = table.get(id) {
            if m.reg.addr != reg.addr && m.state == MemberState::Active {
                return Err(MemberError::IdTaken {
                    id: id.to_string(),
                    addr: m.reg.addr,
                });
            }
        }
        if let Some((other, _)) = table
            .iter()
            .find(|(k, m)| m.reg.addr == reg.addr && m.state == MemberState::Active && *k != id)
        {
            return Err(MemberError::AddressTaken {
                addr: reg.addr,
                by: format!("member {other:?}"),
            });
        }
        if let Some(other) = self
            .pool
            .sources_of(reg.addr)
            .into_iter()
            .find(|s| *s != self.source)
        {
            return Err(MemberError::AddressTaken {
                addr: reg.addr,
                by: format!("a {other} backend of balancer {:?}", self.pool.name()),
            });
        }
        let deadline = reg.ttl.map(|ttl| now + ttl);
        let (addr, weight) = (reg.addr, reg.weight);
        let previous = table.insert(
            id.to_string(),
            Member {
                reg,
                deadline,
                state: MemberState::Active,
                draining: None,
            },
        );
        if let Some(old) = &previous {
            if old.reg.addr != addr && old.state == MemberState::Active {
                self.pool.remove(self.source, old.reg.addr);
            }
        }
        self.pool.insert(self.source, addr, weight);
        if previous.is_none() {
            tracing::info!(pool = %self.pool.name(), member = id, %addr, "member registered");
        }
        let member = self.view(id, &table[id], now);
        self.changed.notify_one();
        Ok(Registered {
            created: previous.is_none(),
            member,
        })
    }

    pub fn heartbeat_at(
        &self,
        id: &str,
        load: Option<f64>,
        now: Instant,
    ) -> Result<MemberView, MemberError> {
        if let Some(load) = load {
            check_load(load)?;
        }
        let mut table = self.lock();
        let m = table
            .get_mut(id)
            .ok_or_else(|| MemberError::NotFound { id: id.to_string() })?;
        if m.state != MemberState::Active {
            return Err(MemberError::Draining { id: id.to_string() });
        }
        m.deadline = m.reg.ttl.map(|ttl| now + ttl);
        if let Some(load) = load {
            if let Some(ep) = self.pool.find(m.reg.addr) {
                ep.report_load(clock::now(), load);
            }
        }
        Ok(self.view(id, &table[id], now))
    }

    pub fn drain_at(&self, id: &str, now: Instant) -> Result<MemberView, MemberError> {
        let mut table = self.lock();
        let m = table
            .get_mut(id)
            .ok_or_else(|| MemberError::NotFound { id: id.to_string() })?;
        if m.state == MemberState::Active {
            let ep = self.pool.find(m.reg.addr);
            self.pool.remove(self.source, m.reg.addr);
            m.state = MemberState::Draining;
            m.deadline = None;
            m.draining = ep;
            tracing::info!(pool = %self.pool.name(), member = id, addr = %m.reg.addr, "member draining");
        }
        let mut view = self.view(id, m, now);
        if view.in_flight == 0 {
            table.remove(id);
            view.state = MemberState::Removed;
        } else {
            self.changed.notify_one();
        }
        Ok(view)
    }

    pub fn list_at(&self, now: Instant) -> Vec<MemberView> {
        let table = self.lock();
        table.iter().map(|(id, m)| self.view(id, m, now)).collect()
    }

    /// Removes members whose TTL lapsed and drained members with nothing left in flight;
    /// returns the ids removed.
    pub fn sweep_at(&self, now: Instant) -> Vec<String> {
        let mut table = self.lock();
        let mut gone = Vec::new();
        table.retain(|id, m| {
            let keep = match m.state {
                MemberState::Active => match m.deadline {
                    Some(deadline) if deadline <= now => {
                        self.pool.remove(self.source, m.reg.addr);
                        tracing::warn!(
                            pool = %self.pool.name(),
                            member = %id,
                            addr = %m.reg.addr,
                            ttl = ?m.reg.ttl.unwrap_or_default(),
                            "member sent no heartbeat within its TTL; removed"
                        );
                        false
                    }
                    _ => true,
                },
                _ => m.draining.as_ref().is_some_and(|ep| ep.in_flight() > 0),
            };
            if !keep {
                gone.push(id.clone());
            }
            keep
        });
        gone
    }

    fn view(&self, id: &str, m: &Member, now: Instant) -> MemberView {
        let in_flight = match &m.draining {
            Some(ep) => ep.in_flight(),
            None => self.pool.find(m.reg.addr).map_or(0, |ep| ep.in_flight()),
        };
        MemberView {
            id: id.to_string(),
            address: m.reg.address.clone(),
            addr: m.reg.addr,
            source: self.source,
            state: m.state,
            weight: m.reg.weight,
            ttl: m.reg.ttl,
            ttl_left: m.deadline.map(|d| d.saturating_duration_since(now)),
            meta: m.reg.meta.clone(),
            in_flight,
        }
    }
}

impl MemberStore for Members {
    fn register(&self, id: String, registration: Registration) -> MemberFuture<'_, Registered> {
        let result = self.register_at(&id, registration, Instant::now());
        Box::pin(std::future::ready(result))
    }

    fn heartbeat(&self, id: String, load: Option<f64>) -> MemberFuture<'_, MemberView> {
        let result = self.heartbeat_at(&id, load, Instant::now());
        Box::pin(std::future::ready(result))
    }

    fn drain(&self, id: String) -> MemberFuture<'_, MemberView> {
        let result = self.drain_at(&id, Instant::now());
        Box::pin(std::future::ready(result))
    }

    fn list(&self) -> Vec<MemberView> {
        self.list_at(Instant::now())
    }
}
