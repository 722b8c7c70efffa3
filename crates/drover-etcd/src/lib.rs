//! drover-etcd: a balancer's runtime members kept in etcd, shared by every balancer that
//! watches the same prefix.
//!
//! Layout: one key per member, `{prefix}/members/{id}`, whose value is the JSON of
//! [`MemberValue`]. A member with a TTL is attached to an etcd lease of that TTL, so a
//! member that stops heartbeating disappears from every balancer at once; a member
//! without one has no lease and stays until it is drained. Never an array index per
//! server nor one document holding all members.
//!
//! Beside it, `{prefix}/addresses/{addr}` holds the id that registered an address, on
//! the same lease. Only registrations read and write it: a registration's transaction
//! compares both keys' revisions, so two balancers (or two clients of one) registering
//! one address under two ids at once cannot both win. The members' keys stay what the
//! watchers read and what says who holds an address; a stale address key (its member
//! gone) is simply written over.
//!
//! [`EtcdMembers`] implements [`MemberStore`] (what the admin API calls) and feeds its
//! pool as [`Source::Etcd`]: a background task lists the prefix, applies the whole set,
//! then watches from the list's revision + 1 and applies each event. After a dropped
//! stream it resumes from the last revision it saw; when that revision was compacted it
//! lists again and applies only the difference (the pool keeps the `Arc<Endpoint>` of
//! every address that stays). While etcd is out of reach the pool keeps the last view
//! ("fail static") and the task reconnects with exponential back-off and jitter.
//!
//! Over TLS (`tls`), the channel's connections are made with rustls here; with
//! authentication on (`auth`), drover logs in as a user and logs in again when its
//! token lapses.

use drover_balance::{clock, Endpoint};
use drover_registry::members::{check_id, check_load};
use drover_registry::{
    MemberError, MemberFuture, MemberState, MemberStore, MemberView, Pool, Registered,
    Registration, Source,
};
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, DeleteOptions, EventType, GetOptions, KeyValue,
    PutOptions, Txn, TxnOp, TxnOpResponse, WatchOptions,
};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

mod auth;
mod last_view;
mod tls;
pub use auth::{EtcdAuth, LoadPassword};
pub use tls::{host_port, EtcdTls, LoadTls, TlsClient};

/// The value stored under `{prefix}/members/{id}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberValue {
    /// The address as the member gave it (it may be a name `addr` was resolved from).
    pub address: String,
    pub addr: SocketAddr,
    pub weight: u32,
    #[serde(default)]
    pub meta: BTreeMap<String, String>,
    /// The TTL of the member's lease in whole seconds; `None`: no lease.
    #[serde(default)]
    pub ttl_secs: Option<u64>,
    /// It is leaving on purpose (a drain through some balancer), which writes this just
    /// before it deletes the key: a balancer then takes it out at once and does not
    /// keep it should etcd list none (see `last_view`), as it would a lapsed lease.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub draining: bool,
}

impl MemberValue {
    /// The value for a registration; a TTL is rounded up to whole seconds (etcd
    /// leases count in seconds).
    pub fn from_registration(reg: &Registration) -> MemberValue {
        MemberValue {
            address: reg.address.clone(),
            addr: reg.addr,
            weight: reg.weight,
            meta: reg.meta.clone(),
            ttl_secs: reg.ttl.map(|ttl| {
                let secs = ttl.as_secs();
                if ttl.subsec_nanos() > 0 {
                    secs + 1
                } else {
                    secs
                }
            }),
            draining: false,
        }
    }

    pub fn ttl(&self) -> Option<Duration> {
        self.ttl_secs.map(Duration::from_secs)
    }

    fn registration(&self) -> Registration {
        Registration {
            address: self.address.clone(),
            addr: self.addr,
            ttl: self.ttl(),
            weight: self.weight,
            meta: self.meta.clone(),
        }
    }
}

/// Why a key under the prefix is not a member.
#[derive(Debug)]
pub enum ValueError {
    /// The key is not `{prefix}/members/{id}` with a valid id.
    Key(String),
    /// The value is not a `MemberValue`.
    Json(serde_json::Error),
    /// A field is out of bounds.
    Bounds(MemberError),
}

impl fmt::Display for ValueError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ValueError::Key(key) => write!(f, "key {key:?} is not {{prefix}}/members/{{id}}"),
            ValueError::Json(e) => write!(f, "value is not a member: {e}"),
            ValueError::Bounds(e) => write!(f, "value out of bounds: {e}"),
        }
    }
}

impl std::error::Error for ValueError {}

/// Parses a value as stored by `EtcdMembers::register`, with the same bounds.
pub fn parse_value(bytes: &[u8]) -> Result<MemberValue, ValueError> {
    let value: MemberValue = serde_json::from_slice(bytes).map_err(ValueError::Json)?;
    value
        .registration()
        .validate()
        .map_err(ValueError::Bounds)?;
    Ok(value)
}

/// Timeouts and back-off of an [`EtcdMembers`].
#[derive(Debug, Clone, PartialEq)]
pub struct EtcdOptions {
    /// Bound on each request to etcd (and on opening a watch).
    pub op_timeout: Duration,
    /// Reconnection back-off: doubles from `backoff_min` up to `backoff_max`, with
    /// jitter (each wait is between half and all of the current step).
    pub backoff_min: Duration,
    pub backoff_max: Duration,
    /// How long a write waits for this balancer's watcher to apply it, so that the
    /// answer and a `list()` right after it agree with etcd.
    pub settle: Duration,
    /// For `https://` endpoints: the TLS files, read at each new connection.
    pub tls: Option<EtcdTls>,
    /// For a cluster with authentication on: the user drover logs in as, and its
    /// password, read at each login.
    pub auth: Option<EtcdAuth>,
}

impl Default for EtcdOptions {
    fn default() -> Self {
        EtcdOptions {
            op_timeout: Duration::from_secs(2),
            backoff_min: Duration::from_millis(100),
            backoff_max: Duration::from_secs(5),
            settle: Duration::from_secs(1),
            tls: None,
            auth: None,
        }
    }
}

/// The connection to etcd as the admin API shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdStatus {
    /// The watcher is connected and the view is current.
    pub connected: bool,
    /// Since when `connected` has had its value.
    pub since: SystemTime,
    /// The last error talking to etcd (kept after it comes back).
    pub last_error: Option<String>,
    /// The etcd revision the view reflects (0 before the first list).
    pub revision: i64,
    /// Members in the view.
    pub members: usize,
    /// Full listings after the first: one per compaction that outran the watch.
    pub relists: u64,
    /// Members served though etcd no longer lists them: it lists none, and these are
    /// the ones it listed last (`last_view`); 0 while its list applies.
    pub kept: usize,
}

/// A member as this balancer's view has it.
#[derive(Debug, Clone)]
struct Entry {
    value: MemberValue,
    lease: i64,
}

/// A lease deadline this balancer knows because it granted or renewed the lease.
#[derive(Debug, Clone, Copy)]
struct Deadline {
    lease: i64,
    at: Instant,
}

struct State {
    view: BTreeMap<String, Entry>,
    deadlines: HashMap<String, Deadline>,
    /// Members drained through this balancer with requests still in flight here.
    draining: BTreeMap<String, (MemberValue, Arc<Endpoint>)>,
    status: EtcdStatus,
    /// The current outage has been warned about.
    outage_warned: bool,
    /// The prefix has been listed once.
    listed: bool,
    /// The members etcd listed lately, kept while it lists none.
    last_view: last_view::LastView,
}

struct EtcdState {
    pool: Arc<Pool>,
    /// `{prefix}/members/`
    members_prefix: String,
    endpoints: Vec<String>,
    options: EtcdOptions,
    client: Mutex<Option<Client>>,
    state: Mutex<State>,
    /// The revision the view has been brought up to.
    applied: tokio::sync::watch::Sender<i64>,
    /// Wakes a watcher waiting out its back-off when a request of this balancer's
    /// (a registration, a heartbeat) got an answer: etcd is back, so the view need
    /// not lag behind the writes for the rest of a back-off of up to `backoff_max`.
    answered: tokio::sync::Notify,
    /// A request met a lapsed login token (`auth`): the client was dropped, so the next
    /// one logs in again, and the member operation that met it is tried once more.
    token_lapsed: AtomicBool,
}

/// Runtime members kept in etcd under a prefix, feeding `pool` as `Source::Etcd`.
///
/// Dropping it ends its watcher task.
pub struct EtcdMembers {
    shared: Arc<EtcdState>,
    task: tokio::task::AbortHandle,
}

impl fmt::Debug for EtcdMembers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdMembers")
            .field("pool", &self.shared.pool.name())
            .field("prefix", &self.shared.members_prefix)
            .finish()
    }
}

impl Drop for EtcdMembers {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl EtcdMembers {
    /// Starts watching `{prefix}/members/` on the current tokio runtime with the default
    /// options. Never fails nor waits for etcd: an unreachable etcd (or an endpoint that
    /// is not a URL) is retried in the background and shows in `status()`.
    ///
    /// `endpoints` are etcd client URLs (`http://127.0.0.1:2379`); plain `host:port`
    /// works too. `https://` endpoints need `EtcdOptions::tls` (see `start_with`).
    /// Panics outside a tokio runtime.
    pub fn start(endpoints: Vec<String>, prefix: String, pool: Arc<Pool>) -> Arc<EtcdMembers> {
        EtcdMembers::start_with(endpoints, prefix, pool, EtcdOptions::default())
    }

    pub fn start_with(
        endpoints: Vec<String>,
        prefix: String,
        pool: Arc<Pool>,
        options: EtcdOptions,
    ) -> Arc<EtcdMembers> {
        let (applied, _) = tokio::sync::watch::channel(0);
        let shared = Arc::new(EtcdState {
            pool,
            members_prefix: format!("{}/members/", prefix.trim_end_matches('/')),
            endpoints,
            options,
            client: Mutex::new(None),
            state: Mutex::new(State {
                view: BTreeMap::new(),
                deadlines: HashMap::new(),
                draining: BTreeMap::new(),
                status: EtcdStatus {
                    connected: false,
                    since: SystemTime::now(),
                    last_error: None,
                    revision: 0,
                    members: 0,
                    relists: 0,
                    kept: 0,
                },
                outage_warned: false,
                listed: false,
                last_view: last_view::LastView::default(),
            }),
            applied,
            answered: tokio::sync::Notify::new(),
            token_lapsed: AtomicBool::new(false),
        });
        let task = tokio::spawn(watch_loop(Arc::clone(&shared))).abort_handle();
        Arc::new(EtcdMembers { shared, task })
    }

    pub fn pool(&self) -> &Arc<Pool> {
        &self.shared.pool
    }

    /// The etcd key of member `id`.
    pub fn key_of(&self, id: &str) -> String {
        self.shared.key_of(id)
    }

    pub fn status(&self) -> EtcdStatus {
        self.shared.lock().status.clone()
    }

    /// Waits until the view reflects etcd revision `revision` or later; false on timeout.
    pub async fn wait_for_revision(&self, revision: i64, timeout: Duration) -> bool {
        self.shared.wait_applied(revision, timeout).await
    }

    async fn register_inner(&self, id: &str, reg: Registration) -> Result<Registered, MemberError> {
        check_id(id)?;
        reg.validate()?;
        let sh = &self.shared;
        let key = sh.key_of(id);
        let value = MemberValue::from_registration(&reg);
        let json = serde_json::to_vec(&value).expect("a MemberValue serializes");
        let address_key = sh.address_key(reg.addr);
        let mut client = sh.client().await?;
        // A transaction of ours lost to a write of the same key in between.
        let mut lost_race = false;
        for _attempt in 0..3 {
            // A fresh read of the members and of the address's key, at one revision: the
            // conflict checks go by etcd, not by this view.
            let read = Txn::new().and_then([
                TxnOp::get(
                    sh.members_prefix.clone(),
                    Some(GetOptions::new().with_prefix()),
                ),
                TxnOp::get(address_key.clone(), None),
            ]);
            let read = sh.call(client.txn(read)).await?;
            // Taken as they are: `op_responses` already copies the listing once.
            let mut responses = read.op_responses().into_iter();
            let (members, address) = match (responses.next(), responses.next()) {
                (Some(TxnOpResponse::Get(members)), Some(TxnOpResponse::Get(address))) => {
                    (members, address)
                }
                _ => {
                    return Err(MemberError::Unavailable(
                        "etcd answered a read of two keys with something else".into(),
                    ))
                }
            };
            let address_seen = address.kvs().first().map_or(0, |kv| kv.mod_revision());
            // The key's revision even when its value is not a member, so the write below
            // replaces exactly what was read.
            let mut seen = 0;
            let mut existing: Option<Entry> = None;
            let mut holder: Option<String> = None;
            for kv in members.kvs() {
                if kv.key() == key.as_bytes() {
                    seen = kv.mod_revision();
                }
                let Ok((other, entry)) = sh.parse_kv(kv) else {
                    continue;
                };
                if other == id {
                    existing = Some(entry);
                } else if entry.value.addr == reg.addr && holder.is_none() {
                    holder = Some(other);
                }
            }
            if let Some(old) = existing
                .as_ref()
                .filter(|old| lost_race && old.value == value)
            {
                // The write we lost to registered this very member (a client that sent
                // its registration twice at once): it stands, with its lease.
                // The key's own revision: the read's may be a later change of an
                // address's key alone, which the watcher of the members never sees.
                sh.wait_applied(seen, sh.options.settle).await;
                let member =
                    sh.view_of(id, &value, MemberState::Active, sh.ttl_left(id, old.lease));
                return Ok(Registered {
                    created: false,
                    member,
                });
            }
            // In the order `Members::register_at` checks them.
            if let Some(old) = &existing {
                if old.value.addr != reg.addr {
                    return Err(MemberError::IdTaken {
                        id: id.to_string(),
                        addr: old.value.addr,
                    });
                }
            }
            if let Some(other) = holder {
                return Err(MemberError::AddressTaken {
                    addr: reg.addr,
                    by: format!("member {other:?}"),
                });
            }
            if let Some(other) = sh
                .pool
                .sources_of(reg.addr)
                .into_iter()
                .find(|s| *s != Source::Etcd)
            {
                return Err(MemberError::AddressTaken {
                    addr: reg.addr,
                    by: format!("a {other} backend of balancer {:?}", sh.pool.name()),
                });
            }

            let lease = match value.ttl_secs {
                Some(ttl) => sh.call(client.lease_grant(ttl as i64, None)).await?.id(),
                None => 0,
            };
            let put = || match lease {
                0 => None,
                lease => Some(PutOptions::new().with_lease(lease)),
            };
            let txn = Txn::new()
                .when([
                    Compare::mod_revision(key.clone(), CompareOp::Equal, seen),
                    Compare::mod_revision(address_key.clone(), CompareOp::Equal, address_seen),
                ])
                .and_then([
                    TxnOp::put(key.clone(), json.clone(), put()),
                    TxnOp::put(address_key.clone(), id, put()),
                ]);
            let resp = match sh.call(client.txn(txn)).await {
                Ok(resp) => resp,
                Err(e) => {
                    sh.revoke(&mut client, lease).await;
                    return Err(e);
                }
            };
            if !resp.succeeded() {
                // Someone changed the member's key or the address's between the read and
                // the write: read again.
                sh.revoke(&mut client, lease).await;
                lost_race = true;
                continue;
            }
            let revision = resp.header().map_or(0, |h| h.revision());
            if let Some(old) = &existing {
                if old.lease != 0 && old.lease != lease {
                    sh.revoke(&mut client, old.lease).await;
                }
            }
            {
                let mut state = sh.lock();
                state.draining.remove(id);
                match value.ttl() {
                    Some(ttl) => {
                        state.deadlines.insert(
                            id.to_string(),
                            Deadline {
                                lease,
                                at: Instant::now() + ttl,
                            },
                        );
                    }
                    None => {
                        state.deadlines.remove(id);
                    }
                }
            }
            sh.wait_applied(revision, sh.options.settle).await;
            if existing.is_none() {
                tracing::info!(pool = %sh.pool.name(), member = id, addr = %reg.addr, "member registered in etcd");
            }
            let member = sh.view_of(id, &value, MemberState::Active, sh.ttl_left(id, lease));
            return Ok(Registered {
                created: existing.is_none(),
                member,
            });
        }
        Err(MemberError::Contended {
            id: id.to_string(),
            addr: reg.addr,
        })
    }

    async fn heartbeat_inner(
        &self,
        id: &str,
        load: Option<f64>,
    ) -> Result<MemberView, MemberError> {
        if let Some(load) = load {
            check_load(load)?;
        }
        let sh = &self.shared;
        if sh.draining_here(id).is_some() {
            return Err(MemberError::Draining { id: id.to_string() });
        }
        let not_found = || MemberError::NotFound { id: id.to_string() };
        check_id(id).map_err(|_| not_found())?;
        let mut client = sh.client().await?;
        let resp = sh.call(client.get(sh.key_of(id), None)).await?;
        let kv = resp.kvs().first().ok_or_else(not_found)?;
        let (_, entry) = sh.parse_kv(kv).map_err(|e| {
            tracing::warn!(key = %sh.key_of(id), error = %e, "heartbeat for a key that is not a member");
            not_found()
        })?;
        if entry.lease != 0 {
            match sh.call_raw(client.lease_keep_alive(entry.lease)).await {
                Ok(_) => {}
                // The lease lapsed between the read and the renewal: the key is gone too.
                Err(Some(etcd_client::Error::LeaseKeepAliveError(_))) => return Err(not_found()),
                Err(Some(etcd_client::Error::GRpcStatus(s)))
                    if i32::from(s.code()) == GRPC_NOT_FOUND =>
                {
                    return Err(not_found())
                }
                Err(e) => return Err(sh.unavailable(e)),
            }
            if let Some(ttl) = entry.value.ttl() {
                sh.lock().deadlines.insert(
                    id.to_string(),
                    Deadline {
                        lease: entry.lease,
                        at: Instant::now() + ttl,
                    },
                );
            }
        }
        if let Some(load) = load {
            if let Some(ep) = sh.pool.find(entry.value.addr) {
                ep.report_load(clock::now(), load);
            }
        }
        let left = sh.ttl_left(id, entry.lease);
        Ok(sh.view_of(id, &entry.value, MemberState::Active, left))
    }

    async fn drain_inner(&self, id: &str) -> Result<MemberView, MemberError> {
        let sh = &self.shared;
        let not_found = || MemberError::NotFound { id: id.to_string() };
        if check_id(id).is_err() {
            return Err(not_found());
        }
        // Take hold of the endpoint before the watcher lets the pool drop it.
        let held = sh
            .lock()
            .view
            .get(id)
            .and_then(|e| sh.pool.find(e.value.addr));
        let mut client = sh.client().await?;
        sh.mark_draining(&mut client, id).await;
        let resp = sh
            .call(client.delete(sh.key_of(id), Some(DeleteOptions::new().with_prev_key())))
            .await?;
        let Some(kv) = resp.prev_kvs().first() else {
            // Not in etcd: maybe a drain through this balancer still in progress.
            return match sh.draining_here(id) {
                Some(view) => Ok(view),
                None => Err(not_found()),
            };
        };
        let revision = resp.header().map_or(0, |h| h.revision());
        let (_, entry) = sh.parse_kv(kv).map_err(|e| {
            tracing::warn!(key = %sh.key_of(id), error = %e, "drained a key that was not a member");
            not_found()
        })?;
        if entry.lease != 0 {
            // The address's key goes with the lease.
            sh.revoke(&mut client, entry.lease).await;
        } else {
            sh.release_address(&mut client, entry.value.addr, id).await;
        }
        sh.wait_applied(revision, sh.options.settle).await;
        let ep = held
            .filter(|ep| ep.addr() == entry.value.addr)
            .or_else(|| sh.pool.find(entry.value.addr));
        tracing::info!(pool = %sh.pool.name(), member = id, addr = %entry.value.addr, "member drained from etcd");
        let mut state = sh.lock();
        state.deadlines.remove(id);
        let in_flight = ep.as_ref().map_or(0, |ep| ep.in_flight());
        let mut view = sh.view_of(id, &entry.value, MemberState::Draining, None);
        view.in_flight = in_flight;
        match ep {
            Some(ep) if in_flight > 0 => {
                state.draining.insert(id.to_string(), (entry.value, ep));
            }
            _ => view.state = MemberState::Removed,
        }
        Ok(view)
    }

    /// Runs a member operation, and once more when it met a lapsed login token: the
    /// client it used was dropped, so the second logs in again. Each operation reads
    /// etcd before it writes (and writes by comparison), so a second run redoes nothing
    /// the first did.
    async fn logged_in<T, F, Fut>(&self, op: F) -> Result<T, MemberError>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<T, MemberError>>,
    {
        let first = op().await;
        if matches!(first, Err(MemberError::Unavailable(_)))
            && self.shared.token_lapsed.swap(false, Ordering::Relaxed)
        {
            tracing::debug!(pool = %self.shared.pool.name(), "etcd login token lapsed; logging in again");
            return op().await;
        }
        first
    }

    fn list_now(&self) -> Vec<MemberView> {
        let sh = &self.shared;
        let now = Instant::now();
        let mut state = sh.lock();
        state.draining.retain(|_, (_, ep)| ep.in_flight() > 0);
        let mut out: Vec<MemberView> = Vec::with_capacity(state.view.len());
        for (id, entry) in &state.view {
            let left = ttl_left(&state, id, entry.lease, now);
            let view = sh.view_of(id, &entry.value, MemberState::Active, left);
            out.push(view);
        }
        for (id, (value, ep)) in &state.draining {
            if state.view.contains_key(id) {
                continue;
            }
            let mut view = sh.view_of(id, value, MemberState::Draining, None);
            view.in_flight = ep.in_flight();
            out.push(view);
        }
        out.sort_by(|a, b| a.id.cmp(&b.id));
        out
    }
}

fn ttl_left(state: &State, id: &str, lease: i64, now: Instant) -> Option<Duration> {
    let d = state.deadlines.get(id)?;
    // A deadline that passed while the member is still there: another balancer renewed
    // the lease, so this one does not know when it lapses.
    (d.lease == lease && d.at > now).then(|| d.at - now)
}

impl MemberStore for EtcdMembers {
    fn register(&self, id: String, registration: Registration) -> MemberFuture<'_, Registered> {
        Box::pin(self.logged_in(move || {
            let (id, registration) = (id.clone(), registration.clone());
            async move { self.register_inner(&id, registration).await }
        }))
    }

    fn heartbeat(&self, id: String, load: Option<f64>) -> MemberFuture<'_, MemberView> {
        Box::pin(self.logged_in(move || {
            let id = id.clone();
            async move { self.heartbeat_inner(&id, load).await }
        }))
    }

    fn drain(&self, id: String) -> MemberFuture<'_, MemberView> {
        Box::pin(self.logged_in(move || {
            let id = id.clone();
            async move { self.drain_inner(&id).await }
        }))
    }

    fn list(&self) -> Vec<MemberView> {
        self.list_now()
    }
}

impl EtcdState {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn key_of(&self, id: &str) -> String {
        format!("{}{id}", self.members_prefix)
    }

    /// The key that serializes registrations of `addr` (see the module's layout).
    fn address_key(&self, addr: SocketAddr) -> String {
        let prefix = self
            .members_prefix
            .strip_suffix("members/")
            .unwrap_or(&self.members_prefix);
        format!("{prefix}addresses/{addr}")
    }

    /// Deletes `addr`'s key if member `id` holds it. A failure leaves a stale key,
    /// which the next registration of the address writes over.
    async fn release_address(&self, client: &mut Client, addr: SocketAddr, id: &str) {
        let key = self.address_key(addr);
        let txn = Txn::new()
            .when([Compare::value(key.clone(), CompareOp::Equal, id)])
            .and_then([TxnOp::delete(key, None)]);
        if let Err(e) = self.call(client.txn(txn)).await {
            tracing::debug!(%addr, error = %e, "could not delete an address's key in etcd; the next registration writes over it");
        }
    }

    /// The id and member of a key under the prefix.
    fn parse_kv(&self, kv: &KeyValue) -> Result<(String, Entry), ValueError> {
        let key = String::from_utf8_lossy(kv.key());
        let id = key
            .strip_prefix(&self.members_prefix)
            .filter(|id| check_id(id).is_ok())
            .ok_or_else(|| ValueError::Key(key.to_string()))?;
        let value = parse_value(kv.value())?;
        Ok((
            id.to_string(),
            Entry {
                value,
                lease: kv.lease(),
            },
        ))
    }

    /// A client, made on first use and again after the watcher lost the connection (a
    /// fresh channel rather than trusting the old one to recover).
    async fn client(&self) -> Result<Client, MemberError> {
        if let Some(client) = self
            .client
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
        {
            return Ok(client);
        }
        // Logged in as the client is made (etcd-client's `ConnectOptions::with_user`),
        // with the password as it is now.
        let mut options = ConnectOptions::new();
        if let Some(auth) = &self.options.auth {
            let password = (auth.password)().map_err(MemberError::Unavailable)?;
            options = options.with_user(auth.user.clone(), password);
        }
        let client = match &self.options.tls {
            None => {
                let options = options
                    .with_connect_timeout(self.options.op_timeout)
                    .with_keep_alive(KEEP_ALIVE_EVERY, KEEP_ALIVE_TIMEOUT)
                    .with_keep_alive_while_idle(true);
                self.call(Client::connect(self.endpoints.clone(), Some(options)))
                    .await?
            }
            Some(tls) => {
                let channel = self.tls_channel(tls)?;
                self.call(Client::from_channel(channel, Some(options)))
                    .await?
            }
        };
        let mut slot = self.client.lock().unwrap_or_else(|e| e.into_inner());
        Ok(slot.get_or_insert(client).clone())
    }

    /// A gRPC channel to the `https://` endpoints, over connections made with the TLS
    /// files as they are now. It connects on its first request.
    fn tls_channel(&self, tls: &EtcdTls) -> Result<etcd_client::Channel, MemberError> {
        let client = (tls.0)().map_err(MemberError::Unavailable)?;
        let endpoints = self
            .endpoints
            .iter()
            .map(|e| tls::host_port(e))
            .collect::<Result<Vec<_>, _>>()
            .map_err(MemberError::Unavailable)?;
        let first = self.endpoints.first().cloned().unwrap_or_default();
        let endpoint = tonic::transport::Endpoint::from_shared(first)
            .map_err(|e| MemberError::Unavailable(format!("etcd endpoint: {e}")))?
            .http2_keep_alive_interval(KEEP_ALIVE_EVERY)
            .keep_alive_timeout(KEEP_ALIVE_TIMEOUT)
            .keep_alive_while_idle(true);
        let connector = tls::Connector::new(endpoints, client, self.options.op_timeout);
        Ok(etcd_client::Channel::Tonic(
            endpoint.connect_with_connector_lazy(connector),
        ))
    }

    fn forget_client(&self) {
        *self.client.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// Runs one etcd request within `op_timeout`; any failure means etcd is out of
    /// reach for this request, and nothing it would have done is assumed done.
    async fn call<T>(
        &self,
        fut: impl Future<Output = Result<T, etcd_client::Error>>,
    ) -> Result<T, MemberError> {
        self.call_raw(fut).await.map_err(|e| self.unavailable(e))
    }

    /// `Err(None)`: no answer within `op_timeout`.
    async fn call_raw<T>(
        &self,
        fut: impl Future<Output = Result<T, etcd_client::Error>>,
    ) -> Result<T, Option<etcd_client::Error>> {
        match tokio::time::timeout(self.options.op_timeout, fut).await {
            Ok(Ok(v)) => {
                // Only a watcher already waiting wakes (no permit is stored): the
                // watch session's own answers must not cut its next back-off short.
                self.answered.notify_waiters();
                Ok(v)
            }
            Ok(Err(e)) => Err(Some(e)),
            Err(_) => Err(None),
        }
    }

    /// The error for a failed request. A connection-level failure also drops the
    /// client, so the next request opens a fresh channel.
    fn unavailable(&self, e: Option<etcd_client::Error>) -> MemberError {
        let transport = match &e {
            None => true,
            Some(etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_)) => true,
            // A lapsed login token: the next client logs in again.
            Some(etcd_client::Error::GRpcStatus(s))
                if i32::from(s.code()) == GRPC_UNAUTHENTICATED =>
            {
                self.token_lapsed.store(true, Ordering::Relaxed);
                true
            }
            Some(etcd_client::Error::GRpcStatus(s)) => {
                matches!(
                    i32::from(s.code()),
                    GRPC_UNKNOWN | GRPC_DEADLINE_EXCEEDED | GRPC_UNAVAILABLE
                )
            }
            Some(_) => false,
        };
        if transport {
            self.forget_client();
        }
        MemberError::Unavailable(match e {
            Some(e) => self.describe(&e),
            None => format!("etcd did not answer within {:?}", self.options.op_timeout),
        })
    }

    /// Writes member `id`'s value again with `draining` set, on its lease, so every
    /// balancer sees it leave on purpose before the delete that follows. Best effort: a
    /// member that is gone already, or an etcd that refuses, leaves the delete to say
    /// it left (then a balancer may keep it while etcd lists none, as a lapsed one).
    async fn mark_draining(&self, client: &mut Client, id: &str) {
        let Some(mut value) = self.lock().view.get(id).map(|e| e.value.clone()) else {
            return;
        };
        value.draining = true;
        let Ok(bytes) = serde_json::to_vec(&value) else {
            return;
        };
        // Only over the key as it is (ignore_lease fails on a key that is gone).
        let put = client.put(
            self.key_of(id),
            bytes,
            Some(PutOptions::new().with_ignore_lease()),
        );
        if let Err(e) = self.call(put).await {
            tracing::debug!(member = id, error = %e, "could not mark a member draining before its delete");
        }
    }

    /// `describe`, with the likely cause when etcd closed a TLS connection that showed
    /// no client certificate: with TLS 1.3 an etcd that requires one
    /// (`--client-cert-auth`) refuses it after the handshake, and its alert races the
    /// close, so the error often says only "connection closed".
    fn describe(&self, e: &etcd_client::Error) -> String {
        let text = describe(e);
        let Some(tls) = &self.options.tls else {
            return text;
        };
        let showed_none = (tls.0)().is_ok_and(|c| !c.config.client_auth_cert_resolver.has_certs());
        if showed_none && text.contains("connection closed") {
            format!(
                "{text} (etcd closed the TLS connection, to which drover showed no client \
                 certificate: if etcd requires one, --client-cert-auth, give drover one \
                 with --etcd-cert and --etcd-key, or cert and key in [etcd] tls)"
            )
        } else {
            text
        }
    }

    async fn revoke(&self, client: &mut Client, lease: i64) {
        if lease == 0 {
            return;
        }
        if let Err(e) = self.call(client.lease_revoke(lease)).await {
            tracing::debug!(lease, error = %e, "could not revoke an etcd lease; it lapses by itself");
        }
    }

    async fn wait_applied(&self, revision: i64, timeout: Duration) -> bool {
        let mut rx = self.applied.subscribe();
        let reached = tokio::time::timeout(timeout, rx.wait_for(|r| *r >= revision)).await;
        matches!(reached, Ok(Ok(_)))
    }

    /// The view of a member drained here, or None (pruning drains that finished).
    fn draining_here(&self, id: &str) -> Option<MemberView> {
        let mut state = self.lock();
        state.draining.retain(|_, (_, ep)| ep.in_flight() > 0);
        let (value, ep) = state.draining.get(id)?;
        let mut view = self.view_of(id, value, MemberState::Draining, None);
        view.in_flight = ep.in_flight();
        Some(view)
    }

    fn view_of(
        &self,
        id: &str,
        value: &MemberValue,
        state: MemberState,
        ttl_left: Option<Duration>,
    ) -> MemberView {
        MemberView {
            id: id.to_string(),
            address: value.address.clone(),
            addr: value.addr,
            source: Source::Etcd,
            state,
            weight: value.weight,
            ttl: value.ttl(),
            ttl_left,
            meta: value.meta.clone(),
            in_flight: self.pool.find(value.addr).map_or(0, |ep| ep.in_flight()),
        }
    }

    fn ttl_left(&self, id: &str, lease: i64) -> Option<Duration> {
        ttl_left(&self.lock(), id, lease, Instant::now())
    }

    /// Gives the pool the view's members and records the revision: the later one after
    /// events, exactly the listing's after a listing (etcd's revision may have gone back).
    fn publish(&self, state: &mut State, revision: i64, listing: bool) {
        let listed: Vec<(SocketAddr, u32)> = state
            .view
            .values()
            .map(|e| (e.value.addr, e.value.weight))
            .collect();
        let serve = state.last_view.serve(listed, std::time::Instant::now());
        match serve.turned {
            Some(0) => tracing::info!(
                pool = %self.pool.name(),
                "etcd lists members again: serving its list"
            ),
            Some(kept) => tracing::warn!(
                pool = %self.pool.name(),
                kept,
                "etcd lists no member of pool {:?}: serving the {kept} it listed last until \
                 it lists one again (a registry that empties at once is more likely broken \
                 than every app gone: lapsed leases after an auth or network change, an \
                 etcd restored empty); a dead one is ejected as it fails",
                self.pool.name(),
            ),
            None => {}
        }
        self.pool.set_source(Source::Etcd, &serve.members);
        state.status.kept = state.last_view.kept();
        state.status.revision = if listing {
            revision
        } else {
            state.status.revision.max(revision)
        };
        state.status.members = state.view.len();
        let revision = state.status.revision;
        self.applied.send_if_modified(|r| {
            let changed = *r != revision;
            *r = revision;
            changed
        });
    }

    /// Replaces the view with a full listing; logs what differs.
    fn apply_list(&self, kvs: &[KeyValue], revision: i64) {
        let mut view = BTreeMap::new();
        let mut leaving = Vec::new();
        for kv in kvs {
            match self.parse_kv(kv) {
                Ok((_, entry)) if entry.value.draining => leaving.push(entry.value.addr),
                Ok((id, entry)) => {
                    view.insert(id, entry);
                }
                Err(e) => tracing::warn!(
                    key = %String::from_utf8_lossy(kv.key()),
                    error = %e,
                    "skipping a key under the etcd prefix that is not a member"
                ),
            }
        }
        let mut state = self.lock();
        for addr in leaving {
            state.last_view.forget(addr);
        }
        let added: Vec<&String> = view
            .keys()
            .filter(|id| !state.view.contains_key(*id))
            .collect();
        let removed: Vec<&String> = state
            .view
            .keys()
            .filter(|id| !view.contains_key(*id))
            .collect();
        let changed: Vec<&String> = view
            .iter()
            .filter(|(id, e)| state.view.get(*id).is_some_and(|old| old.value != e.value))
            .map(|(id, _)| id)
            .collect();
        if !added.is_empty() || !removed.is_empty() || !changed.is_empty() {
            tracing::info!(
                pool = %self.pool.name(),
                revision,
                ?added,
                ?removed,
                ?changed,
                "etcd members listed"
            );
        }
        for id in view.keys() {
            state.draining.remove(id);
        }
        if state.listed {
            state.status.relists += 1;
        }
        state.listed = true;
        state.view = view;
        self.publish(&mut state, revision, true);
    }

    /// Applies one watch response's events.
    fn apply_events(&self, events: &[etcd_client::Event]) -> i64 {
        let mut state = self.lock();
        let mut revision = state.status.revision;
        for event in events {
            let Some(kv) = event.kv() else { continue };
            revision = revision.max(kv.mod_revision());
            let key = String::from_utf8_lossy(kv.key());
            let Some(id) = key.strip_prefix(&self.members_prefix) else {
                continue;
            };
            match event.event_type() {
                EventType::Delete => {
                    if state.view.remove(id).is_some() {
                        tracing::info!(pool = %self.pool.name(), member = id, "member left etcd");
                    }
                }
                EventType::Put => match self.parse_kv(kv) {
                    Ok((id, entry)) if entry.value.draining => {
                        state.last_view.forget(entry.value.addr);
                        if state.view.remove(&id).is_some() {
                            tracing::info!(pool = %self.pool.name(), member = id, "member leaving etcd (drained)");
                        }
                    }
                    Ok((id, entry)) => {
                        state.draining.remove(&id);
                        state.view.insert(id, entry);
                    }
                    Err(e) => {
                        tracing::warn!(key = %key, error = %e, "skipping a key under the etcd prefix that is not a member");
                        state.view.remove(id);
                    }
                },
            }
        }
        self.publish(&mut state, revision, false);
        revision
    }

    /// Records the connection state; warns once per outage and says when it ends.
    fn set_connected(&self, connected: bool, error: Option<String>) {
        let mut state = self.lock();
        if let Some(e) = &error {
            state.status.last_error = Some(e.clone());
        }
        let pool = self.pool.name();
        if connected {
            if !state.status.connected {
                let was = state.status.since;
                state.status.connected = true;
                state.status.since = SystemTime::now();
                let after = state.status.since.duration_since(was).unwrap_or_default();
                if state.outage_warned {
                    tracing::info!(pool = %pool, outage = ?after, revision = state.status.revision, "etcd reachable again");
                } else {
                    tracing::info!(pool = %pool, revision = state.status.revision, "etcd connected");
                }
            }
            state.outage_warned = false;
            return;
        }
        if state.status.connected {
            state.status.connected = false;
            state.status.since = SystemTime::now();
        }
        if !state.outage_warned {
            state.outage_warned = true;
            tracing::warn!(
                pool = %pool,
                error = %error.unwrap_or_default(),
                members = state.view.len(),
                "etcd unreachable; keeping the last members until it is back"
            );
        }
    }
}

// gRPC status codes (etcd-client does not re-export tonic's `Code`).
const GRPC_UNKNOWN: i32 = 2;
const GRPC_DEADLINE_EXCEEDED: i32 = 4;
const GRPC_NOT_FOUND: i32 = 5;
const GRPC_UNAVAILABLE: i32 = 14;
const GRPC_UNAUTHENTICATED: i32 = 16;

/// HTTP/2 pings on the channel to etcd, so that a connection whose peer vanished (its
/// machine, not its process) is found within `KEEP_ALIVE_EVERY + KEEP_ALIVE_TIMEOUT`.
/// No oftener than etcd takes them: it refuses pings less than
/// `--grpc-keepalive-min-time` (5 s by default) apart, and after a few it closes the
/// connection (ENHANCE_YOUR_CALM). With pings every 2 s, an idle balancer's watch was
/// cut every 8 s, and each cut logged "etcd unreachable" for a healthy etcd.
const KEEP_ALIVE_EVERY: Duration = Duration::from_secs(6);
/// How long a ping may go unanswered (see `KEEP_ALIVE_EVERY`).
const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(3);

fn describe(e: &etcd_client::Error) -> String {
    let (mut text, mut source) = match e {
        etcd_client::Error::GRpcStatus(s) => (
            format!("{:?}: {}", s.code(), s.message()),
            std::error::Error::source(s),
        ),
        e => (e.to_string(), std::error::Error::source(e)),
    };
    // A transport error's own text is "transport error"; why (a refused connection, a
    // certificate etcd's name is not in, a client certificate etcd wants) is in its
    // sources.
    while let Some(inner) = source {
        let more = inner.to_string();
        if !text.contains(&more) {
            text = format!("{text}: {more}");
        }
        source = inner.source();
    }
    text
}

/// How one watch session ended.
enum Ended {
    /// The revision to resume from was compacted: list again.
    Compacted(i64),
    /// etcd's revision is below the one the view reflects: list again.
    Relist,
    /// etcd failed or went away.
    Failed(MemberError),
}

async fn watch_loop(shared: Arc<EtcdState>) {
    let mut need_list = true;
    let mut step = shared.options.backoff_min;
    loop {
        match session(&shared, &mut need_list).await {
            Ended::Compacted(compact) => {
                tracing::warn!(
                    pool = %shared.pool.name(),
                    revision = shared.lock().status.revision,
                    compacted_to = compact,
                    "etcd compacted the revisions the watch needed; listing again"
                );
                need_list = true;
                step = shared.options.backoff_min;
            }
            Ended::Relist => need_list = true,
            Ended::Failed(e) => {
                if shared.lock().status.connected {
                    step = shared.options.backoff_min;
                }
                let why = match e {
                    MemberError::Unavailable(why) => why,
                    e => e.to_string(),
                };
                tracing::debug!(pool = %shared.pool.name(), error = %why, "etcd watch failed");
                shared.set_connected(false, Some(why));
                shared.forget_client();
                tokio::select! {
                    () = tokio::time::sleep(jitter(step)) => {}
                    () = shared.answered.notified() => {
                        tracing::debug!(pool = %shared.pool.name(), "etcd answered a request; watching again now");
                    }
                }
                step = (step * 2).min(shared.options.backoff_max);
            }
        }
    }
}

/// Between half and all of `step`.
fn jitter(step: Duration) -> Duration {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    let frac = (h.finish() % 1000) as f64 / 2000.0;
    step.mul_f64(0.5 + frac)
}

/// Lists if needed, then watches from the last revision + 1 until the stream fails.
async fn session(sh: &EtcdState, need_list: &mut bool) -> Ended {
    let mut client = match sh.client().await {
        Ok(c) => c,
        Err(e) => return Ended::Failed(e),
    };
    if *need_list {
        let resp = match sh
            .call(client.get(
                sh.members_prefix.clone(),
                Some(GetOptions::new().with_prefix()),
            ))
            .await
        {
            Ok(resp) => resp,
            Err(e) => return Ended::Failed(e),
        };
        let revision = resp.header().map_or(0, |h| h.revision());
        sh.apply_list(resp.kvs(), revision);
        *need_list = false;
    }
    if !*need_list {
        // An etcd whose revision went back (restored or rebuilt with new data) would
        // never send the events between: list it again.
        let resp = match sh
            .call(client.get(
                sh.members_prefix.clone(),
                Some(GetOptions::new().with_prefix().with_count_only()),
            ))
            .await
        {
            Ok(resp) => resp,
            Err(e) => return Ended::Failed(e),
        };
        let now = resp.header().map_or(0, |h| h.revision());
        let seen = sh.lock().status.revision;
        if now < seen {
            tracing::warn!(
                pool = %sh.pool.name(),
                revision = now,
                seen,
                "etcd's revision went back; listing again"
            );
            return Ended::Relist;
        }
    }
    let from = sh.lock().status.revision + 1;
    let options = WatchOptions::new().with_prefix().with_start_revision(from);
    let (_watcher, mut stream) = match sh
        .call(client.watch(sh.members_prefix.clone(), Some(options)))
        .await
    {
        Ok(w) => w,
        Err(e) => return Ended::Failed(e),
    };
    sh.set_connected(true, None);
    loop {
        let resp = match stream.message().await {
            Ok(Some(resp)) => resp,
            Ok(None) => {
                return Ended::Failed(MemberError::Unavailable("the watch stream ended".into()))
            }
            Err(e) => return Ended::Failed(MemberError::Unavailable(sh.describe(&e))),
        };
        if resp.canceled() {
            if resp.compact_revision() > 0 {
                return Ended::Compacted(resp.compact_revision());
            }
            return Ended::Failed(MemberError::Unavailable(format!(
                "etcd canceled the watch: {}",
                resp.cancel_reason()
            )));
        }
        if !resp.events().is_empty() {
            sh.apply_events(resp.events());
        }
    }
}
