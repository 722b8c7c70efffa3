//! A balancer to start, whether it came from flags or from a drover.toml: the validated
//! model turned into the parts that run it.

use crate::model::{self as config, BackendRef};
use drover_balance::Strategy;
use drover_proxy::backend_tls::Connector as BackendTlsConnector;
use drover_proxy::tls::Certificates;
use drover_proxy::{BackendProtocol, Limits, ProxyOptions, QueueOptions, Timeouts};
use drover_registry::{HealthCheck, PassivePolicy, PoolOptions};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Everything needed to start one balancer.
#[derive(Debug, Clone)]
pub struct BalancerPlan {
    pub proxy: ProxyOptions,
    pub pool: PoolOptions,
    pub strategy: Strategy,
    /// The fixed backend addresses with weights: the pool's static members.
    pub backends: Vec<(SocketAddr, u32)>,
    /// The supervised app whose workers join the pool (`app:NAME` among the backends),
    /// beside the fixed addresses, DNS names and etcd members.
    pub app: Option<String>,
    /// Per-backend concurrency limits that differ from the pool's.
    pub max_conns: Vec<(SocketAddr, u32)>,
    /// Names whose DNS answers are backends.
    pub dns: Vec<drover_dns::DnsTarget>,
    /// The etcd prefix whose members are backends (and where members register).
    pub etcd: Option<String>,
    pub health: Option<HealthCheck>,
    pub drain_timeout: Duration,
}

/// A balancer that validated on its own but cannot be run as it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlanError {
    /// The health check's settings.
    Health {
        balancer: String,
        source: drover_registry::HealthCheckError,
    },
    /// A certificate or key file of `tls` (bad, missing, expired, not the pair).
    Tls {
        balancer: String,
        source: drover_proxy::tls::Error,
    },
    /// A file of `backend_tls` (the CA file, the client certificate or key), or the
    /// system's trust store.
    BackendTls {
        balancer: String,
        source: drover_proxy::backend_tls::Error,
    },
    /// A file of `[etcd] tls` (`--etcd-ca`, `--etcd-cert`, `--etcd-key`), or the
    /// system's trust store.
    EtcdTls {
        source: drover_proxy::backend_tls::Error,
    },
    /// `[etcd] password_file` (`--etcd-password-file`): unreadable, or empty.
    EtcdPassword { path: PathBuf, why: String },
}

impl PlanError {
    /// The setting's key, as `Origins` knows it, when the error is about one file
    /// (`balancer[0].tls.certs[1].key`); `index` is the balancer's.
    pub fn key(&self, index: usize) -> Option<String> {
        match self {
            PlanError::Tls { source, .. } if source.part == drover_proxy::tls::Part::ClientCa => {
                Some(format!("balancer[{index}].tls.client_ca"))
            }
            PlanError::Tls { source, .. } => Some(format!(
                "balancer[{index}].tls.certs[{}].{}",
                source.index,
                source.part.as_str()
            )),
            // No file: the system's trust store, which the table as a whole asked for.
            PlanError::BackendTls { source, .. }
                if source.path.as_os_str().is_empty()
                    && source.part != drover_proxy::backend_tls::Part::ServerName =>
            {
                Some(format!("balancer[{index}].backend_tls"))
            }
            PlanError::BackendTls { source, .. } => Some(format!(
                "balancer[{index}].backend_tls.{}",
                source.part.as_str()
            )),
            PlanError::EtcdTls { source } if source.path.as_os_str().is_empty() => {
                Some("etcd.tls".into())
            }
            PlanError::EtcdTls { source } => Some(format!("etcd.tls.{}", source.part.as_str())),
            PlanError::EtcdPassword { .. } => Some("etcd.password_file".into()),
            PlanError::Health { .. } => None,
        }
    }
}

impl std::fmt::Display for PlanError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PlanError::Health { balancer, source } => {
                write!(f, "balancer {balancer:?}: health: {source}")
            }
            PlanError::Tls { balancer, source } => {
                write!(f, "balancer {balancer:?}: tls: {source}")
            }
            PlanError::BackendTls { balancer, source } => {
                write!(f, "balancer {balancer:?}: backend_tls: {source}")
            }
            PlanError::EtcdTls { source } => write!(f, "etcd: tls: {source}"),
            PlanError::EtcdPassword { path, why } => {
                write!(f, "etcd: password_file {}: {why}", path.display())
            }
        }
    }
}

impl std::error::Error for PlanError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            PlanError::Health { source, .. } => Some(source),
            PlanError::Tls { source, .. } => Some(source),
            PlanError::BackendTls { source, .. } => Some(source),
            PlanError::EtcdTls { source } => Some(source),
            PlanError::EtcdPassword { .. } => None,
        }
    }
}

impl BalancerPlan {
    /// Translates a validated config entry into the parts that run it. The `tls`
    /// files are read and checked here, each time: a reload reads them again.
    pub fn from_config(b: &config::BalancerConfig) -> Result<BalancerPlan, PlanError> {
        let mut backends = Vec::new();
        let mut max_conns = Vec::new();
        let mut app = None;
        let (mut dns, mut etcd) = (Vec::new(), None);
        for backend in &b.backends {
            match backend {
                BackendRef::Addr {
                    addr,
                    weight,
                    max_conns: own,
                } => {
                    backends.push((*addr, *weight));
                    if let Some(m) = own {
                        max_conns.push((*addr, *m));
                    }
                }
                BackendRef::App(name) => app = Some(name.clone()),
                BackendRef::Dns(target) => dns.push(target.clone()),
                BackendRef::Etcd(prefix) => etcd = Some(prefix.clone()),
            }
        }
        let health = b.health.clone();
        if let Some(h) = &health {
            h.validate().map_err(|source| PlanError::Health {
                balancer: b.name.clone(),
                source,
            })?;
        }
        let tls = match &b.tls {
            Some(settings) => Some(Arc::new(Certificates::load(settings).map_err(
                |source| PlanError::Tls {
                    balancer: b.name.clone(),
                    source,
                },
            )?)),
            None => None,
        };
        let backend_tls = match &b.backend_tls {
            Some(settings) => {
                let mut settings = settings.clone();
                // The endpoints' host name, when they have one: every backend a `dns:`
                // name, the same one (nginx's proxy_ssl_name defaults to the host of
                // proxy_pass). Otherwise each endpoint's IP address is verified.
                if settings.server_name.is_none() {
                    settings.server_name = one_host_name(&b.backends);
                }
                let connector = BackendTlsConnector::load(&settings).map_err(|source| {
                    PlanError::BackendTls {
                        balancer: b.name.clone(),
                        source,
                    }
                })?;
                Some(Arc::new(if b.mode == drover_proxy::Protocol::Tcp {
                    connector.for_tcp()
                } else if b.backend_protocol == BackendProtocol::H2 {
                    connector.for_http2()
                } else {
                    connector
                }))
            }
            None => None,
        };
        let passive = PassivePolicy {
            connect_failures: if b.passive.failures == 0 { 0 } else { 1 },
            consecutive_5xx: b.passive.failures,
            base_ejection: b.passive.ejection,
            max_ejection: b.passive.max_ejection,
            slow_start: b.slow_start,
            ..PassivePolicy::default()
        };
        Ok(BalancerPlan {
            proxy: ProxyOptions {
                name: b.name.clone(),
                listen: b.listen,
                threads: b.threads.unwrap_or_else(default_threads),
                retries: b.retries,
                timeouts: Timeouts {
                    connect: b.timeouts.connect,
                    header_read: b.timeouts.header_read,
                    request: b.timeouts.request,
                    idle: b.timeouts.idle,
                    client: b.timeouts.client,
                    body: b.timeouts.body,
                    body_min_rate: b.timeouts.body_min_rate,
                    half_close: b.timeouts.half_close,
                },
                limits: Limits {
                    max_header_bytes: b.limits.max_header_bytes,
                    max_uri_bytes: b.limits.max_uri_bytes,
                    max_headers: b.limits.max_headers,
                    max_body_bytes: b.limits.max_body_bytes,
                },
                queue: QueueOptions {
                    max: b.queue.max.as_usize(),
                    // A request that waits here would have waited inside a busy backend
                    // anyway; by default it may wait as long as a backend may take, and
                    // with no bound on that, as long as one may by default: past
                    // capacity, the queue must still shed.
                    timeout: b.queue.timeout.unwrap_or(
                        b.timeouts
                            .request
                            .unwrap_or(drover_proxy::DEFAULT_REQUEST_TIMEOUT),
                    ),
                },
                hash_key: b.hash.clone(),
                sticky_cookie: b.sticky.as_ref().map(|s| s.cookie.clone()),
                handoff: b.handoff,
                connection_affinity: b.connection_affinity,
                proxy_protocol: b.proxy_protocol.clone(),
                send_proxy_protocol: b.send_proxy_protocol,
                forwarded_headers_from: b.forwarded_headers.clone(),
                access_log: b.access_log.clone(),
                protocol: b.mode,
                tls,
                redirect_to_https: b.redirect_to_https,
                http2: b.http2,
                h2c: b.h2c,
                http2_max_streams: b.http2_max_streams,
                backend_tls,
                backend_protocol: b.backend_protocol,
                ..ProxyOptions::default()
            },
            pool: PoolOptions {
                slow_start: b.slow_start,
                max_conns: match b.max_conns {
                    crate::ConnLimit::Auto => 0,
                    crate::ConnLimit::Fixed(n) => n,
                },
                adaptive_limit: b.max_conns == crate::ConnLimit::Auto,
                initially_unhealthy: false,
                passive,
                // An app's workers are always on their way: at a cold start, and
                // after each restart. Requests wait for them rather than fail, also
                // when fixed backends beside them are down.
                expects_members: app.is_some(),
            },
            strategy: b.strategy,
            backends,
            app,
            max_conns,
            dns,
            etcd,
            health,
            drain_timeout: b.drain_timeout,
        })
    }
}

/// The TLS of `[etcd]`'s `https://` endpoints (`EtcdConfig::tls`), read and checked:
/// the CA file (or the system's trust store) and the client certificate and key,
/// offering HTTP/2 by ALPN as gRPC needs. Read at start and at each reload, and again
/// by the etcd client at each new connection.
pub fn load_etcd_tls(
    settings: &config::BackendTlsConfig,
) -> Result<BackendTlsConnector, PlanError> {
    BackendTlsConnector::load(settings)
        .map(BackendTlsConnector::for_http2)
        .map_err(|source| PlanError::EtcdTls { source })
}

/// The password of `[etcd]`'s user, read from its file: at start, at each reload, and
/// by the etcd client at each login. One trailing newline (`echo` writes one) is not
/// part of it; an empty password is refused (etcd refuses to log in with one).
pub fn read_etcd_password(auth: &config::EtcdAuthConfig) -> Result<String, PlanError> {
    let fail = |why: String| PlanError::EtcdPassword {
        path: auth.password_file.clone(),
        why,
    };
    let text = std::fs::read_to_string(&auth.password_file).map_err(|e| fail(e.to_string()))?;
    let password = text
        .strip_suffix("\r\n")
        .or_else(|| text.strip_suffix('\n'))
        .unwrap_or(&text);
    if password.is_empty() {
        return Err(fail(format!(
            "the file is empty: write the password of etcd user {:?} in it",
            auth.user
        )));
    }
    Ok(password.to_string())
}

/// The host name of `backends` when every one is `dns:HOST:PORT` of one HOST.
fn one_host_name(backends: &[BackendRef]) -> Option<String> {
    let mut host: Option<&String> = None;
    for b in backends {
        match b {
            BackendRef::Dns(drover_dns::DnsTarget::A { host: h, .. })
                if host.is_none_or(|seen| seen == h) =>
            {
                host = Some(h);
            }
            _ => return None,
        }
    }
    host.cloned()
}

/// One serving thread per core, as nginx's `worker_processes auto`.
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_dns::DnsTarget;

    #[test]
    fn backends_of_one_dns_name_are_verified_for_that_name() {
        let dns = |host: &str| {
            BackendRef::Dns(DnsTarget::A {
                host: host.into(),
                port: 443,
            })
        };
        let addr = BackendRef::Addr {
            addr: "127.0.0.1:443".parse().unwrap(),
            weight: 1,
            max_conns: None,
        };
        assert_eq!(
            one_host_name(&[dns("api.example.com"), dns("api.example.com")]),
            Some("api.example.com".into())
        );
        // Two names, or an address beside the name: each endpoint's IP is verified.
        assert_eq!(
            one_host_name(&[dns("a.example.com"), dns("b.example.com")]),
            None
        );
        assert_eq!(one_host_name(&[dns("api.example.com"), addr.clone()]), None);
        assert_eq!(one_host_name(&[addr]), None);
        assert_eq!(
            one_host_name(&[BackendRef::Dns(DnsTarget::Srv {
                name: "_https._tcp.api.example.com".into()
            })]),
            None
        );
    }
}
