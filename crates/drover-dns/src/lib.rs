//! Backends from DNS: a pool's [`Source::Dns`] members are the current answers for a
//! list of names, each re-resolved when its answer's TTL lapses.
//!
//! # Why hickory and not the system resolver
//!
//! `getaddrinfo` (what `std::net::ToSocketAddrs` and `tokio::net::lookup_host` call)
//! returns addresses but no TTL, so a caller cannot know when an answer goes stale: it
//! can only poll on a fixed timer, too often for stable names and too rarely for names
//! that move. It also cannot ask for SRV records, and it blocks a thread per lookup.
//! `hickory-resolver` is an asynchronous stub resolver on tokio that hands back the
//! records themselves, TTLs included, for any record type. It reads `/etc/resolv.conf`
//! the way the system resolver does when no name servers are configured, like nginx
//! uses the system's servers unless `resolver` is set.
//!
//! # Model
//!
//! [`DnsSource::start`] spawns one tokio task per pool. The task resolves every
//! [`DnsTarget`], and sets the union of the answers as the pool's [`Source::Dns`]
//! members (the pool keeps the `Arc<Endpoint>` of addresses that stay, so endpoint state
//! survives re-resolution). Each target is then looked up again when its answer expires:
//! the smallest TTL in the answer, clamped to
//! [`min_ttl`, `max_ttl`](ResolverSettings). Targets are independent: a slow or failing
//! name does not delay the others.
//!
//! A failed lookup (timeout, SERVFAIL, NXDOMAIN, an empty answer, an unreachable server)
//! keeps that target's last answer ("fail static", like HAProxy serving its last valid
//! answer) and retries after 1 s, doubling up to `max_ttl`. The first failure of a streak
//! logs a warning, the lookup that ends it logs at info; an answer that changes logs what
//! was added and removed. A failure never removes members: only a successful answer that
//! no longer names an address does.
//!
//! The task stops when the [`DnsSource`] is dropped. It leaves the pool's DNS members as
//! they were (so a replacement source started before the old one is dropped takes over
//! without a gap); a balancer that no longer has DNS targets clears them with
//! `pool.set_source(Source::Dns, &[])`.
//!
//! # Use
//!
//! ```no_run
//! # use std::sync::Arc;
//! # use drover_dns::{DnsSource, DnsTarget, ResolverSettings, SetupError};
//! # use drover_registry::Pool;
//! # async fn wire(pool: Arc<Pool>) -> Result<DnsSource, SetupError> {
//! // `dns:api.internal:80` in a balancer's backends:
//! let targets = vec![DnsTarget::A { host: "api.internal".into(), port: 80 }];
//! // Waits (at most about `timeout`) for the first answers, so the pool starts filled.
//! let source = DnsSource::start(targets, ResolverSettings::default(), pool).await?;
//! for (target, error) in source.first_errors() {
//!     tracing::warn!(%target, %error, "DNS backend does not resolve yet; retrying");
//! }
//! // Keep `source` as long as the balancer runs; dropping it stops re-resolution.
//! # Ok(source)
//! # }
//! ```

use drover_registry::{Pool, Source};
use hickory_resolver::config::{
    ConnectionConfig, LookupIpStrategy, NameServerConfig, ResolveHosts, ResolverConfig,
};
use hickory_resolver::net::{DnsError, NetError};
use hickory_resolver::proto::rr::{Name, RData};
use hickory_resolver::TokioResolver;
use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

/// Weight of the members of an A/AAAA target (the pool's default weight).
pub const DEFAULT_WEIGHT: u32 = 1;
/// SRV weights are clamped into `1..=MAX_SRV_WEIGHT` (an SRV weight of 0 becomes 1).
pub const MAX_SRV_WEIGHT: u32 = 1000;
/// First retry delay after a failed lookup; it doubles per failure, up to `max_ttl`.
pub const RETRY_START: Duration = Duration::from_secs(1);

/// One name whose answer becomes pool members.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum DnsTarget {
    /// Every A and AAAA record of `host` (IPv4 and IPv6 both), each on `port`, weight 1.
    A { host: String, port: u16 },
    /// SRV records of `name` (e.g. `_http._tcp.api.internal`): each record gives a target
    /// host and port; the host's A/AAAA records become members on that port, weighted by
    /// the SRV weight clamped to `1..=1000` (0 becomes 1).
    ///
    /// Only the records with the lowest priority value are used: drover balances across
    /// one priority level and does not fail over to the next one when those backends are
    /// down (health checks and passive ejection act within the level). A target of `.`
    /// ("service not available here") is skipped. A target host that does not exist or
    /// has no addresses is skipped when other targets resolve; any other failure (time
    /// out, server error) fails the whole lookup, which then keeps its last answer.
    Srv { name: String },
}

impl DnsTarget {
    /// The name looked up first (the host of an A target, the SRV name).
    pub fn name(&self) -> &str {
        match self {
            DnsTarget::A { host, .. } => host,
            DnsTarget::Srv { name } => name,
        }
    }
}

impl fmt::Display for DnsTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DnsTarget::A { host, port } => write!(f, "{host}:{port}"),
            DnsTarget::Srv { name } => write!(f, "SRV {name}"),
        }
    }
}

/// Where and how to resolve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolverSettings {
    /// Name servers to ask, over UDP with TCP for truncated answers. `None` reads
    /// `/etc/resolv.conf` (servers, `search`, `ndots`), as the system resolver does.
    /// `/etc/hosts` is never consulted: its entries carry no TTL, and a DNS target means
    /// DNS.
    pub nameservers: Option<Vec<SocketAddr>>,
    /// Lower bound on the time between lookups of one target. Default 1 s: a TTL of 0
    /// ("do not cache") would otherwise mean a query per request; one per second still
    /// follows a change within a second, and nginx and HAProxy do not go lower by default
    /// either.
    pub min_ttl: Duration,
    /// Upper bound on the time an answer is used before it is looked up again, and on the
    /// retry back-off. Default 300 s: long TTLs (hours are common for names that "never"
    /// change) would otherwise hide a move for that long; five minutes bounds it at the
    /// cost of one query per target per five minutes (nginx `valid=` is commonly set to
    /// this range; HAProxy's `hold valid` defaults to 10 s).
    pub max_ttl: Duration,
    /// Bound on one target's lookup (for SRV, including its hosts' addresses). Default
    /// 2 s. [`DnsSource::start`] waits at most about this long for the first answers.
    pub timeout: Duration,
}

impl Default for ResolverSettings {
    fn default() -> Self {
        ResolverSettings {
            nameservers: None,
            min_ttl: Duration::from_secs(1),
            max_ttl: Duration::from_secs(300),
            timeout: Duration::from_secs(2),
        }
    }
}

/// Why a lookup gave no usable answer.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum LookupError {
    /// The name does not exist (NXDOMAIN).
    NxDomain,
    /// The name exists but has no records of the type asked for (or, for SRV, none of
    /// the targets has an address).
    NoRecords,
    /// The server answered with an error code (SERVFAIL = 2, REFUSED = 5, ...).
    Server { rcode: u16, reason: &'static str },
    /// No answer within the timeout.
    Timeout,
    /// The server could not be reached.
    Io(Arc<std::io::Error>),
    /// Any other resolver failure.
    Resolver(Arc<dyn std::error::Error + Send + Sync>),
}

impl fmt::Display for LookupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LookupError::NxDomain => f.write_str("name does not exist (NXDOMAIN)"),
            LookupError::NoRecords => f.write_str("no records"),
            LookupError::Server { rcode, reason } => {
                write!(f, "server error {rcode} ({reason})")
            }
            LookupError::Timeout => f.write_str("timed out"),
            LookupError::Io(e) => write!(f, "i/o error: {e}"),
            LookupError::Resolver(e) => write!(f, "resolver error: {e}"),
        }
    }
}

impl std::error::Error for LookupError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            LookupError::Io(e) => Some(&**e),
            LookupError::Resolver(e) => Some(&**e),
            _ => None,
        }
    }
}

impl From<NetError> for LookupError {
    fn from(e: NetError) -> Self {
        if e.is_nx_domain() {
            return LookupError::NxDomain;
        }
        if e.is_no_records_found() {
            return LookupError::NoRecords;
        }
        match e {
            NetError::Dns(DnsError::ResponseCode(code)) => LookupError::Server {
                rcode: u16::from(code),
                reason: code.to_str(),
            },
            NetError::Timeout => LookupError::Timeout,
            NetError::Io(io) => LookupError::Io(io),
            other => LookupError::Resolver(Arc::new(other)),
        }
    }
}

/// Why a [`DnsSource`] could not start.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum SetupError {
    /// `/etc/resolv.conf` could not be read or parsed (only with `nameservers: None`).
    SystemConfig(Arc<dyn std::error::Error + Send + Sync>),
    /// A target's name is not a valid DNS name.
    InvalidName {
        target: DnsTarget,
        source: Arc<dyn std::error::Error + Send + Sync>,
    },
    /// `min_ttl` is above `max_ttl`.
    TtlBounds { min: Duration, max: Duration },
    /// `timeout` is zero.
    ZeroTimeout,
    /// The resolver could not be built.
    Resolver(Arc<dyn std::error::Error + Send + Sync>),
}

impl fmt::Display for SetupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SetupError::SystemConfig(e) => {
                write!(f, "reading the system resolver configuration: {e}")
            }
            SetupError::InvalidName { target, source } => {
                write!(f, "invalid DNS name in {target}: {source}")
            }
            SetupError::TtlBounds { min, max } => {
                write!(f, "DNS min_ttl {min:?} is above max_ttl {max:?}")
            }
            SetupError::ZeroTimeout => f.write_str("DNS timeout must be above zero"),
            SetupError::Resolver(e) => write!(f, "building the DNS resolver: {e}"),
        }
    }
}

impl std::error::Error for SetupError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SetupError::SystemConfig(e) | SetupError::Resolver(e) => Some(&**e),
            SetupError::InvalidName { source, .. } => Some(&**source),
            _ => None,
        }
    }
}

/// One target's state, for the admin API and tests.
#[derive(Debug, Clone)]
pub struct TargetStatus {
    pub target: DnsTarget,
    /// The last successful answer as `(address, weight)`, sorted; empty before the first.
    /// These stay members through failures.
    pub members: Vec<(SocketAddr, u32)>,
    /// When the last successful answer arrived.
    pub resolved_at: Option<Instant>,
    /// The smallest TTL in that answer, as the server gave it (before clamping).
    pub ttl: Option<Duration>,
    /// When that answer expires: `resolved_at` + TTL clamped to [min_ttl, max_ttl].
    pub expires_at: Option<Instant>,
    /// When the next lookup is due (expiry, or the retry after a failure).
    pub next_lookup: Instant,
    /// The error of the last lookup, if it failed; `None` once one succeeds.
    pub last_error: Option<LookupError>,
    /// Consecutive failed lookups (0 when the last one succeeded).
    pub failures: u32,
    /// Lookups finished so far (successes and failures).
    pub lookups: u64,
}

impl TargetStatus {
    /// The member addresses, without weights.
    pub fn addrs(&self) -> Vec<SocketAddr> {
        self.members.iter().map(|m| m.0).collect()
    }

    /// Time left before the last answer expires (zero once it has, `None` before any).
    pub fn expires_in(&self) -> Option<Duration> {
        Some(self.expires_at?.saturating_duration_since(Instant::now()))
    }

    /// The last lookup succeeded.
    pub fn is_ok(&self) -> bool {
        self.failures == 0 && self.resolved_at.is_some()
    }
}

/// The running DNS source of one pool. Dropping it stops the re-resolution task.
#[derive(Debug)]
pub struct DnsSource {
    status: Arc<Mutex<Vec<TargetStatus>>>,
    task: JoinHandle<()>,
}

impl Drop for DnsSource {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl DnsSource {
    /// Starts resolving `targets` into `pool`'s [`Source::Dns`] members, and waits until
    /// every target's first lookup has finished, so a balancer starts with its members
    /// when DNS works. The wait is bounded by `settings.timeout` (plus a little). A target
    /// that does not resolve does not fail the start: check [`DnsSource::status`] (or
    /// [`DnsSource::first_errors`]) to report it; it is retried with back-off.
    ///
    /// Must be called within a tokio runtime.
    pub async fn start(
        targets: Vec<DnsTarget>,
        settings: ResolverSettings,
        pool: Arc<Pool>,
    ) -> Result<DnsSource, SetupError> {
        if settings.min_ttl > settings.max_ttl {
            return Err(SetupError::TtlBounds {
                min: settings.min_ttl,
                max: settings.max_ttl,
            });
        }
        if settings.timeout.is_zero() {
            return Err(SetupError::ZeroTimeout);
        }
        let mut names = Vec::with_capacity(targets.len());
        for target in &targets {
            let name = Name::from_utf8(target.name()).map_err(|e| SetupError::InvalidName {
                target: target.clone(),
                source: Arc::new(e),
            })?;
            names.push(name);
        }
        let resolver = build_resolver(&settings)?;

        let now = Instant::now();
        let status: Vec<TargetStatus> = targets
            .iter()
            .map(|t| TargetStatus {
                target: t.clone(),
                members: Vec::new(),
                resolved_at: None,
                ttl: None,
                expires_at: None,
                next_lookup: now,
                last_error: None,
                failures: 0,
                lookups: 0,
            })
            .collect();
        let status = Arc::new(Mutex::new(status));
        let (first_tx, mut first_rx) = watch::channel(targets.is_empty());
        let worker = Refresher {
            targets: targets.into_iter().zip(names).collect(),
            settings: settings.clone(),
            resolver,
            pool,
            status: Arc::clone(&status),
            applied: None,
            first_tx,
        };
        let task = tokio::spawn(worker.run());
        let source = DnsSource { status, task };
        let bound = settings.timeout + Duration::from_millis(250);
        // Either way the source runs on; the wait only decides when start returns.
        let _ = tokio::time::timeout(bound, first_rx.wait_for(|done| *done)).await;
        Ok(source)
    }

    /// Every target's state, in the order given to `start`.
    pub fn status(&self) -> Vec<TargetStatus> {
        self.status
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Targets whose last lookup failed, with the error (for start-up reports).
    pub fn first_errors(&self) -> Vec<(DnsTarget, LookupError)> {
        self.status()
            .into_iter()
            .filter_map(|s| Some((s.target, s.last_error?)))
            .collect()
    }
}

fn build_resolver(settings: &ResolverSettings) -> Result<TokioResolver, SetupError> {
    let mut builder = match &settings.nameservers {
        None => {
            TokioResolver::builder_tokio().map_err(|e| SetupError::SystemConfig(Arc::new(e)))?
        }
        Some(servers) => {
            let configs = servers
                .iter()
                .map(|s| {
                    let mut udp = ConnectionConfig::udp();
                    udp.port = s.port();
                    let mut tcp = ConnectionConfig::tcp();
                    tcp.port = s.port();
                    NameServerConfig::new(s.ip(), true, vec![udp, tcp])
                })
                .collect();
            TokioResolver::builder_with_config(
                ResolverConfig::from_name_servers(configs),
                Default::default(),
            )
        }
    };
    let opts = builder.options_mut();
    opts.ip_strategy = LookupIpStrategy::Ipv4AndIpv6;
    opts.use_hosts_file = ResolveHosts::Never;
    opts.timeout = settings.timeout;
    opts.attempts = 1;
    builder
        .build()
        .map_err(|e| SetupError::Resolver(Arc::new(e)))
}

/// A successful answer: members and the smallest TTL.
struct Answer {
    members: Vec<(SocketAddr, u32)>,
    ttl: Duration,
}

struct Refresher {
    targets: Vec<(DnsTarget, Name)>,
    settings: ResolverSettings,
    resolver: TokioResolver,
    pool: Arc<Pool>,
    status: Arc<Mutex<Vec<TargetStatus>>>,
    /// The union last given to the pool (`None` before the first).
    applied: Option<Vec<(SocketAddr, u32)>>,
    first_tx: watch::Sender<bool>,
}

impl Refresher {
    async fn run(mut self) {
        let n = self.targets.len();
        if n == 0 {
            return;
        }
        let mut in_flight = vec![false; n];
        let mut lookups: JoinSet<(usize, Result<Answer, LookupError>)> = JoinSet::new();
        let mut ids: HashMap<tokio::task::Id, usize> = HashMap::new();
        loop {
            let now = Instant::now();
            let due: Vec<(usize, Instant)> = {
                let status = self.lock();
                status
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| !in_flight[*i])
                    .map(|(i, s)| (i, s.next_lookup))
                    .collect()
            };
            for &(i, at) in &due {
                if at <= now {
                    in_flight[i] = true;
                    let resolver = self.resolver.clone();
                    let (target, name) = self.targets[i].clone();
                    let timeout = self.settings.timeout;
                    let handle = lookups.spawn(async move {
                        // Every lookup asks the server: the answer's TTL is our schedule.
                        resolver.clear_cache();
                        let result =
                            tokio::time::timeout(timeout, resolve(&resolver, &target, name))
                                .await
                                .unwrap_or(Err(LookupError::Timeout));
                        (i, result)
                    });
                    ids.insert(handle.id(), i);
                }
            }
            let next = due
                .iter()
                .filter(|(i, _)| !in_flight[*i])
                .map(|&(_, at)| at)
                .min();
            let sleep = async {
                match next {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                Some(joined) = lookups.join_next_with_id() => {
                    let (i, result) = match joined {
                        Ok((id, (i, result))) => {
                            ids.remove(&id);
                            (i, result)
                        }
                        Err(e) => {
                            // A lookup task panicked: count it as a failure and retry.
                            tracing::error!(error = %e, "DNS lookup task failed");
                            let Some(i) = ids.remove(&e.id()) else { continue };
                            (i, Err(LookupError::Resolver(Arc::new(e))))
                        }
                    };
                    in_flight[i] = false;
                    self.finish(i, result);
                }
                () = sleep => {}
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<TargetStatus>> {
        self.status.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records one lookup's outcome, schedules the next and updates the pool.
    fn finish(&mut self, i: usize, result: Result<Answer, LookupError>) {
        let now = Instant::now();
        let (min_ttl, max_ttl) = (self.settings.min_ttl, self.settings.max_ttl);
        let union = {
            let mut status = self.lock();
            let s = &mut status[i];
            s.lookups += 1;
            match result {
                Ok(mut answer) => {
                    answer.members.sort_unstable();
                    answer.members.dedup_by_key(|m| m.0);
                    let old: BTreeSet<SocketAddr> = s.members.iter().map(|m| m.0).collect();
                    let new: BTreeSet<SocketAddr> = answer.members.iter().map(|m| m.0).collect();
                    let added: Vec<_> = new.difference(&old).collect();
                    let removed: Vec<_> = old.difference(&new).collect();
                    if s.failures > 0 {
                        tracing::info!(
                            target_name = %s.target,
                            failures = s.failures,
                            "DNS lookup recovered"
                        );
                    }
                    if s.resolved_at.is_none() {
                        tracing::info!(target_name = %s.target, members = ?new, ttl = ?answer.ttl, "DNS resolved");
                    } else if !added.is_empty() || !removed.is_empty() {
                        tracing::info!(
                            target_name = %s.target,
                            ?added,
                            ?removed,
                            "DNS answer changed"
                        );
                    }
                    let hold = answer.ttl.clamp(min_ttl, max_ttl);
                    s.members = answer.members;
                    s.resolved_at = Some(now);
                    s.ttl = Some(answer.ttl);
                    s.expires_at = Some(now + hold);
                    s.next_lookup = now + hold;
                    s.last_error = None;
                    s.failures = 0;
                }
                Err(e) => {
                    s.failures = s.failures.saturating_add(1);
                    let delay = retry_delay(s.failures, max_ttl);
                    if s.failures == 1 {
                        tracing::warn!(
                            target_name = %s.target,
                            error = %e,
                            kept = s.members.len(),
                            retry_in = ?delay,
                            "DNS lookup failed; keeping the last answer"
                        );
                    } else {
                        tracing::debug!(target_name = %s.target, error = %e, failures = s.failures, "DNS lookup failed again");
                    }
                    s.next_lookup = now + delay;
                    s.last_error = Some(e);
                }
            }
            status
                .iter()
                .flat_map(|s| s.members.iter().copied())
                .collect::<Vec<_>>()
        };

        // Do not hand the pool an empty list before anything resolved: a failure must not
        // clear members that a previous source for this pool left.
        let changed = self.applied.as_ref() != Some(&union);
        if changed && (self.applied.is_some() || !union.is_empty()) {
            self.pool.set_source(Source::Dns, &union);
            self.applied = Some(union);
        }
        if !*self.first_tx.borrow() && self.lock().iter().all(|s| s.lookups > 0) {
            let _ = self.first_tx.send(true);
        }
    }
}

/// Back-off after `failures` consecutive failures: 1 s, 2 s, 4 s ... up to `cap`.
fn retry_delay(failures: u32, cap: Duration) -> Duration {
    let exp = failures.saturating_sub(1).min(20);
    RETRY_START
        .saturating_mul(1 << exp)
        .min(cap.max(RETRY_START))
}

async fn resolve(
    resolver: &TokioResolver,
    target: &DnsTarget,
    name: Name,
) -> Result<Answer, LookupError> {
    match target {
        DnsTarget::A { port, .. } => {
            let (ips, ttl) = lookup_addrs(resolver, name).await?;
            Ok(Answer {
                members: ips
                    .into_iter()
                    .map(|ip| (SocketAddr::new(ip, *port), DEFAULT_WEIGHT))
                    .collect(),
                ttl,
            })
        }
        DnsTarget::Srv { .. } => resolve_srv(resolver, name).await,
    }
}

/// The A and AAAA addresses of `name` and the smallest TTL of the answer.
async fn lookup_addrs(
    resolver: &TokioResolver,
    name: Name,
) -> Result<(Vec<IpAddr>, Duration), LookupError> {
    let lookup = resolver.lookup_ip(name).await?;
    let ips: Vec<IpAddr> = lookup.iter().collect();
    if ips.is_empty() {
        return Err(LookupError::NoRecords);
    }
    Ok((ips, min_ttl_of(lookup.as_lookup().answers())))
}

fn min_ttl_of(records: &[hickory_resolver::proto::rr::Record]) -> Duration {
    Duration::from_secs(u64::from(records.iter().map(|r| r.ttl).min().unwrap_or(0)))
}

async fn resolve_srv(resolver: &TokioResolver, name: Name) -> Result<Answer, LookupError> {
    let lookup = resolver.srv_lookup(name).await?;
    let mut ttl = min_ttl_of(lookup.answers());
    let srvs: Vec<_> = lookup
        .answers()
        .iter()
        .filter_map(|r| match &r.data {
            RData::SRV(srv) => Some(srv.clone()),
            _ => None,
        })
        .filter(|srv| !srv.target.is_root())
        .collect();
    let Some(priority) = srvs.iter().map(|s| s.priority).min() else {
        return Err(LookupError::NoRecords);
    };
    let mut members = Vec::new();
    for srv in srvs.iter().filter(|s| s.priority == priority) {
        let weight = u32::from(srv.weight).clamp(1, MAX_SRV_WEIGHT);
        match lookup_addrs(resolver, srv.target.clone()).await {
            Ok((ips, t)) => {
                ttl = ttl.min(t);
                members.extend(
                    ips.into_iter()
                        .map(|ip| (SocketAddr::new(ip, srv.port), weight)),
                );
            }
            Err(LookupError::NxDomain | LookupError::NoRecords) => {
                tracing::debug!(srv_target = %srv.target, "SRV target has no addresses; skipped");
            }
            Err(e) => return Err(e),
        }
    }
    if members.is_empty() {
        return Err(LookupError::NoRecords);
    }
    Ok(Answer { members, ttl })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_backs_off_to_the_cap() {
        let cap = Duration::from_secs(10);
        let d: Vec<u64> = (1..=6).map(|n| retry_delay(n, cap).as_secs()).collect();
        assert_eq!(d, [1, 2, 4, 8, 10, 10]);
        assert_eq!(retry_delay(u32::MAX, cap), cap);
        // A cap below the first retry does not make retries faster than 1 s.
        assert_eq!(retry_delay(1, Duration::from_millis(10)), RETRY_START);
    }

    #[test]
    fn resolver_errors_map_to_kinds() {
        use hickory_resolver::net::NoRecords;
        use hickory_resolver::proto::op::{Query, ResponseCode};
        use hickory_resolver::proto::rr::RecordType;
        let query = Query::query(Name::from_utf8("x.test").unwrap(), RecordType::A);
        let no_records = |code| {
            NetError::Dns(DnsError::NoRecordsFound(NoRecords::new(
                query.clone(),
                code,
            )))
        };
        assert!(matches!(
            LookupError::from(no_records(ResponseCode::NXDomain)),
            LookupError::NxDomain
        ));
        assert!(matches!(
            LookupError::from(no_records(ResponseCode::NoError)),
            LookupError::NoRecords
        ));
        assert!(matches!(
            LookupError::from(NetError::Dns(DnsError::ResponseCode(
                ResponseCode::ServFail
            ))),
            LookupError::Server { rcode: 2, .. }
        ));
        assert!(matches!(
            LookupError::from(NetError::Timeout),
            LookupError::Timeout
        ));
    }

    #[tokio::test]
    async fn bad_settings_and_names_are_refused_at_start() {
        let pool = Arc::new(Pool::new("p", &[], Default::default()));
        let local = ResolverSettings {
            nameservers: Some(vec![SocketAddr::from(([127, 0, 0, 1], 9))]),
            ..ResolverSettings::default()
        };
        let start = |targets: Vec<DnsTarget>, settings| {
            DnsSource::start(targets, settings, Arc::clone(&pool))
        };
        let err = start(
            vec![],
            ResolverSettings {
                min_ttl: Duration::from_secs(10),
                max_ttl: Duration::from_secs(5),
                ..local.clone()
            },
        )
        .await
        .unwrap_err();
        assert!(matches!(err, SetupError::TtlBounds { .. }), "{err}");
        let err = start(
            vec![],
            ResolverSettings {
                timeout: Duration::ZERO,
                ..local.clone()
            },
        )
        .await
        .unwrap_err();
        assert!(matches!(err, SetupError::ZeroTimeout), "{err}");
        let bad = DnsTarget::A {
            host: "a..b".into(),
            port: 80,
        };
        let err = start(vec![bad.clone()], local.clone()).await.unwrap_err();
        assert!(
            matches!(&err, SetupError::InvalidName { target, .. } if *target == bad),
            "{err}"
        );
        // No targets: starts, resolves nothing, leaves the pool alone.
        let source = start(vec![], local).await.unwrap();
        assert!(source.status().is_empty());
    }
}
