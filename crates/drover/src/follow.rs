//! A balancer that starts where its app listens: `drover run` of a Node app without
//! `--listen`, and an ecosystem file's cluster-mode apps, at start and when a reload
//! adds one.

use crate::balancers::{self, RunningBalancer, Sockets, StartError};
use drover_config::flags;
use drover_config::model::{BalancerConfig, CheckKind, Protocol};
use drover_config::plan::BalancerPlan;
use drover_config::Config;
use drover_registry::Pool;
use drover_supervisor::{FirstListen, Speaks, Supervisor};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

/// What `where_the_app_listens` started.
pub(crate) enum Followed {
    /// The balancer, where the app listens.
    Balancer(Box<RunningBalancer>),
    /// None: the app listens on a Unix socket, which its workers share.
    UnixSocket,
    /// None: the app stopped before any worker listened (drover is shutting down).
    Stopped,
}

/// `drover run`'s balancer for a Node app, with no `--listen`: what it needs to start
/// once the app's first worker listens.
pub(crate) struct FollowApp {
    pub config: BalancerConfig,
    pub plan: BalancerPlan,
    pub pool: Arc<Pool>,
    pub app: Arc<Supervisor>,
    /// The config the balancer's discovery settings come from.
    pub discovery: Config,
    /// Where `config.listen` came from, and how to choose another address.
    pub listen: flags::FollowListen,
}

/// Starts the balancer of `follow` where Node's cluster primary would listen for the
/// app: at the port the first worker's `listen()` names (`listen(3000)` and
/// `listen(process.argv[2] || 8000)` alike), on the address it names, or on `[::]`
/// (then `0.0.0.0`, where the machine has no IPv6) for none; an app that listens on
/// its `PORT` gets the balancer's own address (the default, or the `PORT` an ecosystem
/// file gives the app; `[::]` falls back to `0.0.0.0` there too). So clients reach the app where it says it
/// listens, as under PM2. Until then a client is refused, as under Node's cluster
/// module before its first worker listens. An address that cannot be bound is an error.
/// An app that listens on a Unix socket gets none: its workers share the socket, as
/// under Node's cluster module, and its clients (nginx in front) connect there.
pub(crate) async fn where_the_app_listens(follow: FollowApp) -> Result<Followed, String> {
    let FollowApp {
        mut config,
        mut plan,
        pool,
        app,
        discovery,
        listen,
    } = follow;
    let elsewhere = |what: &str| {
        listen
            .elsewhere
            .as_ref()
            .map(|how| format!("; pass {how} {what}"))
            .unwrap_or_default()
    };
    let mut first = app.first_listen();
    let Ok(seen) = first.wait_for(Option::is_some).await.map(|seen| *seen) else {
        return Ok(Followed::Stopped);
    };
    let seen = seen.unwrap_or(FirstListen::own_port());
    if seen.unix {
        return Ok(Followed::UnixSocket);
    }
    let chosen = seen.asked.or(config.listen);
    let candidates = match chosen {
        Some(addr) if addr.ip() == IpAddr::V6(Ipv6Addr::UNSPECIFIED) => {
            vec![addr, SocketAddr::from((Ipv4Addr::UNSPECIFIED, addr.port()))]
        }
        other => other.into_iter().collect(),
    };
    let asked = seen.asked.is_some();
    let name = plan.proxy.name.clone();
    if config.mode == Protocol::Http && !reads(&config, seen.speaks) {
        // Node's cluster module hands every connection over alike; drover reads HTTP to
        // place requests, which such a server's clients do not send.
        let spec = app.spec();
        if let Some(CheckKind::Http { .. } | CheckKind::Grpc { .. }) =
            spec.health.as_ref().map(|h| &h.kind)
        {
            return Err(format!(
                "app {:?}: its server speaks {}, not HTTP/1.1, and its health check asks it for an HTTP answer (--health-path, health.path): drop the check (drover then checks that each worker listens and its event loop turns)",
                app.name(),
                seen.speaks
            ));
        }
        if seen.speaks == Speaks::Tls && config.tls.is_some() {
            // TCP mode would end the clients' TLS at drover and relay plain bytes to a
            // server that waits for a ClientHello.
            return Err(format!(
                "app {:?}: its server speaks {}, not HTTP/1.1, and ends TLS itself with its own certificate; drover would end the clients' TLS first (--tls-cert, tls) and hand it plain bytes: drop --tls-cert, or serve plain HTTP from the app",
                app.name(),
                seen.speaks
            ));
        }
        config.serve_unread().map_err(|e| {
            format!(
                "app {:?}: its server speaks {}, not HTTP/1.1, so drover serves its clients in TCP mode, and {e}",
                app.name(),
                seen.speaks
            )
        })?;
        plan = BalancerPlan::from_config(&config).map_err(|e| format!("balancer {name:?}: {e}"))?;
        if config.tls.is_some() {
            drover_spool::eprintln!(
                "drover: the app's server speaks {}, not HTTP/1.1: drover ends the clients' TLS (--tls-cert, tls) and relays what each session carries to a worker (TCP mode)",
                seen.speaks
            );
        } else {
            drover_spool::eprintln!(
                "drover: the app's server speaks {}, not HTTP/1.1: drover hands each connection to a worker unread, as Node's cluster module does (TCP mode)",
                seen.speaks
            );
        }
    }
    let mut failed = None;
    for addr in candidates {
        config.listen = Some(addr);
        plan.proxy.listen = Some(addr);
        let sockets = match loopback_twin(addr).filter(|_| asked) {
            Some(twin) => match drover_proxy::listener(twin) {
                Ok(socket) => Sockets::BindAlso(vec![socket]),
                // No IPv6 here, or another program holds the other loopback's port:
                // drover serves the address the app named, as Fastify goes on when
                // its second address cannot be had.
                Err(e) => {
                    tracing::info!("not serving the app's clients at {twin} too: {e}");
                    Sockets::Bind
                }
            },
            None => Sockets::Bind,
        };
        let started = RunningBalancer::start(
            config.clone(),
            plan.clone(),
            balancers::discovery(&discovery),
            Arc::clone(&pool),
            None,
            sockets,
        )
        .await;
        match started {
            Ok(b) => {
                if asked {
                    drover_spool::eprintln!(
                        "drover: the app listens on port {}: clients connect there, as under Node's cluster module and PM2{}",
                        addr.port(),
                        elsewhere("to choose another address")
                    );
                }
                return Ok(Followed::Balancer(Box::new(b)));
            }
            // No IPv6 here: Node's primary falls back to IPv4 the same way.
            Err(StartError::Bind(e))
                if addr.is_ipv6() && e.kind() != std::io::ErrorKind::AddrInUse =>
            {
                failed = Some(format!("{addr}: {e}"));
            }
            Err(StartError::Bind(e)) => {
                let whose = if asked {
                    format!(
                        "the port the app's listen() names{}",
                        elsewhere("to serve its clients elsewhere")
                    )
                } else {
                    listen.default_from.clone()
                };
                return Err(format!(
                    "balancer {name:?}: cannot listen on {addr} ({whose}): {e}{}",
                    drover_config::preflight::held_by(addr, &e)
                ));
            }
            Err(e @ StartError::Dns(_)) => return Err(format!("balancer {name:?}: {e}")),
        }
    }
    Err(format!(
        "balancer {name:?}: cannot listen on {}",
        failed.unwrap_or_else(|| "any address".into())
    ))
}

/// The other address of `localhost` for an app that listens at one of them: where
/// /etc/hosts names both (Debian's does), Node's `listen(3000, 'localhost')` binds the
/// first it gets (`::1`), and Fastify, which listens at `localhost` by default, binds
/// both. Loopback is loopback, so drover serves the app's clients at both: a client of
/// `127.0.0.1:3000` (`ab`, `curl -4`) reaches it as a client of `[::1]:3000` does.
fn loopback_twin(addr: SocketAddr) -> Option<SocketAddr> {
    match addr.ip() {
        IpAddr::V4(ip) if ip == Ipv4Addr::LOCALHOST => {
            Some(SocketAddr::from((Ipv6Addr::LOCALHOST, addr.port())))
        }
        IpAddr::V6(ip) if ip == Ipv6Addr::LOCALHOST => {
            Some(SocketAddr::from((Ipv4Addr::LOCALHOST, addr.port())))
        }
        _ => None,
    }
}

/// Whether a balancer in HTTP mode with `config`'s settings can speak to a worker whose
/// server speaks `speaks`: HTTP/2 ones need `backend_protocol = "h2c"`, TLS ones
/// `backend_tls`; a protocol of its own, never.
fn reads(config: &BalancerConfig, speaks: Speaks) -> bool {
    match speaks {
        Speaks::Http => true,
        Speaks::H2c => config.backend_protocol == drover_proxy::BackendProtocol::H2c,
        Speaks::Tls => config.backend_tls.is_some(),
        Speaks::Tcp => false,
    }
}

/// The check beside a balancer that reads HTTP in front of `app` and was started before
/// the app listened (`drover run --listen`, a drover.toml): once the first worker
/// listens, an error (which stops drover) if its server speaks what the balancer cannot
/// speak to it; its clients would get drover's 400s or 502s.
pub(crate) async fn speaks_http(
    app: Arc<Supervisor>,
    balancer: Arc<RunningBalancer>,
) -> Result<(), String> {
    let mut first = app.first_listen();
    let Ok(seen) = first.wait_for(Option::is_some).await.map(|seen| *seen) else {
        return Ok(());
    };
    let Some(speaks) = seen.map(|s| s.speaks) else {
        return Ok(());
    };
    if reads(&balancer.config(), speaks) {
        return Ok(());
    }
    let or = match speaks {
        Speaks::H2c => "pass --backend-protocol h2c (backend_protocol = \"h2c\"), and drover places each of its streams",
        Speaks::Tls => "give the balancer backend_tls, and drover speaks TLS to it",
        _ => "put a mode = \"tcp\" balancer in front of it",
    };
    Err(format!(
        "app {:?}: its server speaks {speaks}, not HTTP/1.1, and balancer {:?} reads HTTP requests and sends them on as HTTP/1.1: run it without --listen (clients then connect where the app listens, and drover hands each connection over unread, as Node's cluster module does), or {or}",
        app.name(),
        balancer.name,
    ))
}

/// The note beside balancers in front of `app` that were started before it listened
/// (`drover run --listen`, a drover.toml), once its first worker listens: where its
/// `listen()` names a port of its own (`listen(3000)`, not its `PORT`) at which no
/// balancer of drover's listens (`served`: their ports), nothing serves that port. An
/// app that calls itself there (server-side rendering that fetches
/// `http://localhost:3000/api`) then gets "connection refused", where under PM2 and
/// Node's cluster module the primary serves the port the app named. `from_file`: the
/// balancers are a drover.toml's, where `drover run` without --listen is no way out.
pub(crate) async fn says_if_its_own_port_is_unserved(
    app: Arc<Supervisor>,
    served: Vec<SocketAddr>,
    front: String,
    from_file: bool,
) -> Result<(), String> {
    let mut first = app.first_listen();
    let Ok(seen) = first.wait_for(Option::is_some).await.map(|seen| *seen) else {
        return Ok(());
    };
    let Some(asked) = seen.and_then(|s| s.asked) else {
        return Ok(());
    };
    if served.iter().any(|addr| addr.port() == asked.port()) {
        return Ok(());
    }
    let at: Vec<String> = served.iter().map(ToString::to_string).collect();
    let port = asked.port();
    let without_listen = if from_file {
        String::new()
    } else {
        format!("drover run without --listen (clients then connect at port {port}), or ")
    };
    drover_spool::eprintln!(
        "drover: app {:?} listens on port {port} (its own choice, not its PORT), and its clients connect at {}: nothing serves port {port}, so a call the app makes to itself there (http://localhost:{port}/...) is refused, where PM2 serves it. To serve it: {without_listen}in drover.toml a balancer with listen = \"{asked}\", backends = [] and routes = [{{ path_prefix = \"/\", balancer = {front:?} }}]",
        app.name(),
        at.join(", "),
    );
    Ok(())
}

/// Says, once the first worker of `app` (which no balancer is in front of) listened,
/// that nothing serves its clients. Its workers' `listen()` is answered by drover, as
/// under `drover run`, but under `drover up` only a `[[balancer]]` binds an address:
/// the app said "listening on 3000", its status said ready, and a client was refused
/// at 3000 with nothing said.
pub(crate) async fn says_no_balancer_serves_it(app: Arc<Supervisor>) -> Result<(), String> {
    let mut first = app.first_listen();
    let Ok(seen) = first.wait_for(Option::is_some).await.map(|seen| *seen) else {
        return Ok(());
    };
    let listened = match seen.and_then(|s| s.asked) {
        Some(asked) => format!("listens on port {}", asked.port()),
        None => "listens on its PORT".to_string(),
    };
    let listen = seen
        .and_then(|s| s.asked)
        .map_or_else(|| "127.0.0.1:8000".to_string(), |asked| asked.to_string());
    drover_spool::eprintln!(
        "drover: warning: app {name:?} {listened}, and no [[balancer]] is in front of it: nothing serves its clients (each worker's listen() is answered by drover, which binds no address for it). Add [[balancer]] with listen = \"{listen}\" and backends = [\"app:{name}\"], or give the app mode = \"background\" if it serves no port",
        name = app.name(),
    );
    Ok(())
}
