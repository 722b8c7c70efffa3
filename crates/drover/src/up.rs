//! `drover up` and `drover run`: apps, balancers and the admin API a config describes.

use crate::balancers::{self, RunningBalancer, Sockets, StartError};
use crate::control::Controller;
use crate::follow::{
    says_if_its_own_port_is_unserved, says_no_balancer_serves_it, speaks_http,
    where_the_app_listens, FollowApp, Followed,
};
use crate::serve;
use crate::systemd;
use drover_admin::AdminServer;
use drover_config::flags::{self, RunArgs};
use drover_config::model::Protocol;
use drover_config::plan::BalancerPlan;
use drover_config::preflight::{self, Prepared};
use drover_config::{self as config, Config, Origins};
use drover_proxy::H2Probe;
use drover_registry::{Pool, PoolOptions, WrapProbe};
use drover_supervisor::{stderr_sink, Mode, Place, SharedListener, Supervisor};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

/// Loads `path`, checks all of it, then starts apps and balancers; runs until a signal.
/// Nothing starts when any part of the config is wrong. `Some` exit code: drover
/// stopped by itself (every app errored).
pub async fn up(path: &Path) -> Result<Option<ExitCode>, String> {
    if config::ecosystem::is_ecosystem_file(&path.to_string_lossy()) {
        return Err(format!(
            "{}: a PM2 ecosystem file, not a drover.toml: run its apps with `drover run {}`",
            path.display(),
            path.display()
        ));
    }
    let (cfg, origins) = config::load_with_origins(path).map_err(|e| e.to_string())?;
    if cfg.apps.is_empty() && cfg.balancers.is_empty() {
        return Err(format!(
            "{}: nothing to run: no [[app]] or [[balancer]]",
            path.display()
        ));
    }
    run_config(cfg, &origins, Reread::File(path), Admin::Required, &[]).await
}

/// `drover run -w N -- CMD`: one app and a balancer in front of it (or, in shared
/// mode, a socket per worker on the listen address), from flags.
pub async fn run_app(args: &RunArgs) -> Result<Option<ExitCode>, String> {
    let run = flags::run_config(args).map_err(|e| e.to_string())?;
    for note in &run.notes {
        drover_spool::eprintln!("drover: note: {note}");
    }
    // Asked for: it must start. Not asked for: the default port, if it is free.
    let admin_mode = if run.admin_asked {
        Admin::Required
    } else {
        Admin::IfFree
    };
    let source = match run.ecosystem {
        Some(file) => Reread::Ecosystem(file),
        None => Reread::Nothing,
    };
    run_config(run.config, &run.origins, source, admin_mode, &run.follow).await
}

/// What a reload reads again.
pub(crate) enum Reread<'a> {
    /// Nothing: the flags' config stays; the apps reload as they are.
    Nothing,
    /// The drover.toml the config came from.
    File(&'a Path),
    /// The PM2 ecosystem file the apps came from.
    Ecosystem(config::ecosystem::Source),
}

/// Whether failing to bind the admin API stops the start-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admin {
    /// It was configured: a taken port is an error.
    Required,
    /// It is `drover run`'s default: a taken port (another drover) gets a warning.
    IfFree,
}

/// Starts what `cfg` describes and serves until a signal. Errors about a setting that
/// only fails now (a taken address, a missing program) say where `origins` has it.
/// Nothing is left running after an error: what started is stopped again. The
/// balancers of `follow` (`drover run` of a Node app without `--listen`, an ecosystem
/// file's cluster-mode apps) start once their app's first `listen()` is heard
/// (`where_the_app_listens`).
pub(crate) async fn run_config(
    cfg: Config,
    origins: &Origins,
    source: Reread<'_>,
    admin_mode: Admin,
    follow: &[flags::FollowListen],
) -> Result<Option<ExitCode>, String> {
    let Prepared { plans, specs } =
        preflight::prepare(&cfg, origins).map_err(|errors| errors.join("\nerror: "))?;
    // The parent of last resort of what the workers start (a daemon among them), and a
    // container's first process everyone's.
    drover_supervisor::adopt_orphans(!cfg.apps.is_empty());

    // Sockets systemd passed (socket activation) serve the listeners they name or are
    // bound for; drover binds the others itself.
    let mut passed = passed_by_key(&cfg)?;

    // Every address drover itself binds is taken before anything starts, so a taken
    // port stops the start-up with nothing to undo.
    let mut shared_sockets = BTreeMap::new();
    for (i, app) in cfg.apps.iter().enumerate() {
        if let Some(listen) = app.listen {
            let socket = SharedListener::bind(listen).map_err(|e| {
                origins.error(
                    &format!("app[{i}].listen"),
                    format!(
                        "app {:?}: cannot listen on {listen}: {e}{}",
                        app.spec.name,
                        drover_config::preflight::held_by(listen, &e)
                    ),
                )
            })?;
            shared_sockets.insert(app.spec.name.clone(), socket);
        }
    }
    // Watched before anything starts: a path that cannot be watched stops the start-up.
    let watched = crate::watching::watch_files(cfg.apps.iter().map(|a| &a.spec))?;
    let admin_listener = match &cfg.admin {
        Some(_) if passed.contains_key(ADMIN_KEY) => {
            let listener = passed.remove(ADMIN_KEY).expect("looked up");
            Some(
                tokio::net::TcpListener::from_std(listener).map_err(|e| {
                    format!("admin API: cannot serve the socket systemd passed: {e}")
                })?,
            )
        }
        Some(admin) => match tokio::net::TcpListener::bind(admin.listen).await {
            Ok(l) => Some(l),
            Err(e) if admin_mode == Admin::IfFree => {
                drover_spool::eprintln!(
                    "drover: warning: no admin API (`drover ctl` will not reach this drover): cannot listen on {}: {e}; pass --admin ADDR",
                    admin.listen
                );
                None
            }
            Err(e) => {
                return Err(origins.error(
                    "admin.listen",
                    format!(
                        "admin API: cannot listen on {}: {e}{}",
                        admin.listen,
                        drover_config::preflight::held_by(admin.listen, &e)
                    ),
                ))
            }
        },
        None => None,
    };

    // An app's pool takes its balancing options, and its fixed backends, from the
    // balancer in front of it.
    let mut pools = pools_of(&plans);

    // Balancers before workers: a balancer whose address is taken then stops the
    // start-up before any worker ran. Until workers are ready their pools are empty.
    let mut balancers: Vec<Arc<RunningBalancer>> = Vec::new();
    let mut follows_app = Vec::new();
    for (i, (config, plan)) in cfg.balancers.iter().zip(plans).enumerate() {
        let pool = match &plan.app {
            Some(app) => Arc::clone(&pools[app]),
            None => balancers::static_pool(&plan),
        };
        let key = format!("balancer[{i}].listen");
        if let Some(f) = follow.iter().find(|f| f.balancer == i) {
            if !passed.contains_key(&key) {
                follows_app.push((config.clone(), plan, pool, f.clone()));
                continue;
            }
        }
        let (name, listen) = (plan.proxy.name.clone(), plan.proxy.listen);
        let socket = passed.remove(&key);
        match RunningBalancer::start(
            config.clone(),
            plan,
            balancers::discovery(&cfg),
            pool,
            None,
            socket.map_or(Sockets::Bind, Sockets::Passed),
        )
        .await
        {
            Ok(b) => balancers.push(Arc::new(b)),
            Err(e) => {
                abandon(&balancers, &[]).await;
                return Err(match e {
                    StartError::Bind(e) => origins.error(
                        &format!("balancer[{i}].listen"),
                        format!(
                            "balancer {name:?}: cannot listen on {}: {e}{}",
                            listen.map_or("-".to_string(), |a| a.to_string()),
                            listen
                                .map(|a| drover_config::preflight::held_by(a, &e))
                                .unwrap_or_default()
                        ),
                    ),
                    e @ StartError::Dns(_) => format!("balancer {name:?}: {e}"),
                });
            }
        }
    }
    balancers::wire_routes(&balancers);
    let mut apps = Vec::new();
    for spec in specs {
        let serving = match shared_sockets.remove(&spec.name) {
            Some(socket) => Serving::Shared(socket),
            None => Serving::Pool(app_pool(&mut pools, &spec.name)),
        };
        let started = start_app(spec, serving);
        match started {
            Ok(sup) => apps.push(Arc::new(sup)),
            Err(e) => {
                abandon(&balancers, &apps).await;
                return Err(e);
            }
        }
    }
    let token = cfg.admin.as_ref().and_then(|a| a.token.clone());
    let discovery_cfg = cfg.clone();
    // A drover.toml's balancers: no --listen to leave out.
    let from_file = matches!(source, Reread::File(_));
    let path = match &source {
        Reread::File(path) => Some(path.to_path_buf()),
        Reread::Nothing | Reread::Ecosystem(_) => None,
    };
    let mut controller = Controller::new(path, cfg, apps.clone(), pools, balancers.clone());
    if let Reread::Ecosystem(file) = source {
        controller = controller.reading_ecosystem(file);
    }
    let controller = Arc::new(controller);
    controller.watches.start(&controller, watched);
    let _admin = match admin_listener {
        Some(listener) => {
            let server = match AdminServer::serve(listener, token, controller.clone()) {
                Ok(server) => server,
                Err(e) => {
                    abandon(&balancers, &apps).await;
                    return Err(format!("admin API: {e}"));
                }
            };
            drover_spool::eprintln!("drover: admin API listening on {}", server.local_addr());
            Some(server)
        }
        None => None,
    };
    let mut late_starts = Vec::new();
    // Apps whose balancer binds the port their workers' listen() names, once they do
    // (`drover run` without --listen).
    let followed: Vec<String> = follows_app
        .iter()
        .filter_map(|(_, plan, _, _)| plan.app.clone())
        .collect();
    for (config, plan, pool, listen) in follows_app {
        let Some(app) = apps.iter().find(|a| plan.app.as_deref() == Some(a.name())) else {
            continue;
        };
        let follow = FollowApp {
            config,
            plan,
            pool,
            app: Arc::clone(app),
            discovery: discovery_cfg.clone(),
            listen,
        };
        let control = Arc::clone(&controller);
        late_starts.push(Box::pin(async move {
            if let Followed::Balancer(started) = where_the_app_listens(follow).await? {
                control.add_balancer(Arc::from(started));
            }
            Ok(())
        }) as serve::LateStart);
    }
    // A balancer that reads HTTP, started before its app listened (`--listen`, a
    // drover.toml): a server that speaks something else stops drover, saying why.
    for b in &balancers {
        let app = b
            .app()
            .and_then(|name| apps.iter().find(|a| a.name() == name));
        if let (Some(app), Protocol::Http) = (app, b.config().mode) {
            let check = speaks_http(Arc::clone(app), Arc::clone(b));
            late_starts.push(Box::pin(check) as serve::LateStart);
        }
    }
    // An app that names a port of its own behind balancers listening elsewhere.
    let served: Vec<std::net::SocketAddr> = balancers.iter().filter_map(|b| b.listen).collect();
    for app in &apps {
        let front = balancers
            .iter()
            .find(|b| b.app().as_deref() == Some(app.name()));
        if let Some(front) = front {
            let note = says_if_its_own_port_is_unserved(
                Arc::clone(app),
                served.clone(),
                front.name.clone(),
                from_file,
            );
            late_starts.push(Box::pin(note) as serve::LateStart);
        } else if !followed.iter().any(|name| name == app.name())
            && !matches!(app.spec().mode, Mode::Background | Mode::Shared)
        {
            let note = says_no_balancer_serves_it(Arc::clone(app));
            late_starts.push(Box::pin(note) as serve::LateStart);
        }
    }
    let late_start = (!late_starts.is_empty()).then(|| serve::all(late_starts));
    serve::serve_until_signal(controller, late_start).await
}

/// Where an app's workers take their clients from.
pub(crate) enum Serving {
    /// Each worker accepts on its own socket of this `SO_REUSEPORT` group (shared mode).
    Shared(SharedListener),
    /// Each worker joins this pool once ready; a balancer in front places the clients.
    Pool(Arc<Pool>),
}

/// Starts the workers of `spec`, serving as `serving` says. At start, and for an app a
/// reload adds.
pub(crate) fn start_app(
    spec: drover_supervisor::AppSpec,
    serving: Serving,
) -> Result<Supervisor, String> {
    let (name, workers, app_port) = (spec.name.clone(), spec.workers.resolve(), spec.app_port);
    match serving {
        Serving::Shared(socket) => {
            let addr = socket.local_addr();
            let sup =
                Supervisor::start_shared(spec, socket, stderr_sink()).map_err(|e| e.to_string())?;
            // Scripts and tests read this line to learn the port when listening on :0.
            drover_spool::eprintln!(
                "drover: app {name:?} listening on {addr} (shared socket, {})",
                drover_units::count(workers, "worker")
            );
            Ok(sup)
        }
        Serving::Pool(pool) => {
            // Workers that speak only HTTP/2 (`h2c`) are probed with streams, as the
            // balancer's requests reach them.
            let http2 = Arc::new(H2Probe { tls: None }) as Arc<dyn WrapProbe>;
            let sup = Supervisor::start_probing(spec, pool, stderr_sink(), Some(http2))
                .map_err(|e| e.to_string())?;
            drover_spool::eprintln!(
                "drover: app {name:?} starting {}",
                drover_units::count(workers, "worker")
            );
            say_shared_ports(name, app_port, sup.shared_ports_bound());
            Ok(sup)
        }
    }
}

/// Tells the user of each port the app's workers listen on after their first, as it
/// is bound: drover shares it among them (`drover_node::SharedPorts`).
fn say_shared_ports(
    app: String,
    app_port: Option<u16>,
    mut bound: tokio::sync::watch::Receiver<Vec<Place>>,
) {
    let balanced = match app_port {
        Some(port) => format!("port {port} (app_port)"),
        None => "the port it listened on first (app_port names another: --app-port)".into(),
    };
    tokio::spawn(async move {
        let mut said = 0;
        while bound.changed().await.is_ok() {
            let places = bound.borrow_and_update().clone();
            for place in places.iter().skip(said) {
                match place {
                    Place::Port { address, port } => {
                        let at = address
                            .map_or_else(|| "every address".to_string(), |ip| ip.to_string());
                        drover_spool::eprintln!(
                            "drover: app {app:?} also listens on port {port} ({at}): its workers \
                             share it as under Node's cluster module, each new connection to the \
                             worker with the fewest not yet taken up; drover balances by load \
                             {balanced}"
                        );
                    }
                    Place::Path(path) => drover_spool::eprintln!(
                        "drover: app {app:?} listens on the Unix socket {}: drover binds it once \
                         and its workers share it as under Node's cluster module, each new \
                         connection to the worker with the fewest not yet taken up",
                        path.display()
                    ),
                }
            }
            said = places.len();
        }
    });
}

/// The pool of app `name` in `pools`; a new one with the default options where no
/// balancer in front of the app gave it its options.
pub(crate) fn app_pool(pools: &mut BTreeMap<String, Arc<Pool>>, name: &str) -> Arc<Pool> {
    let pool = pools
        .entry(name.to_string())
        .or_insert_with(|| Arc::new(Pool::new(name.to_string(), &[], PoolOptions::default())));
    Arc::clone(pool)
}

/// The pools of the apps balancers of `plans` balance over, with each balancer's
/// options and fixed backends (the config allows one balancer per app).
pub(crate) fn pools_of(plans: &[BalancerPlan]) -> BTreeMap<String, Arc<Pool>> {
    let mut pools = BTreeMap::new();
    for plan in plans {
        if let Some(app) = &plan.app {
            let pool = Pool::new(app.clone(), &plan.backends, plan.pool.clone());
            pools.insert(app.clone(), Arc::new(pool));
        }
    }
    pools
}

/// The setting key of the admin API's listen address.
const ADMIN_KEY: &str = "admin.listen";

/// The sockets systemd passed, by the key of the listen setting each serves
/// (`balancer[0].listen`, `admin.listen`); none when drover was not socket-activated.
fn passed_by_key(cfg: &Config) -> Result<BTreeMap<String, std::net::TcpListener>, String> {
    let passed = systemd::passed_listeners()?;
    if passed.is_empty() {
        return Ok(BTreeMap::new());
    }
    let sockets: Vec<_> = passed.iter().map(|p| p.socket.clone()).collect();
    let owners = preflight::assign_passed(cfg, &sockets).map_err(|errors| {
        let text: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
        text.join("\nerror: ")
    })?;
    let mut by_key = BTreeMap::new();
    for (owner, p) in owners.into_iter().zip(passed) {
        // Scripts and tests read this line to learn which socket serves what.
        drover_spool::eprintln!(
            "drover: {} serves the socket systemd passed as {:?} ({})",
            owner.owner,
            p.socket.name,
            p.socket.addr
        );
        by_key.insert(owner.key, p.listener);
    }
    Ok(by_key)
}

/// Undoes a start-up that failed half-way: the balancers stop accepting and the apps'
/// workers are stopped, so nothing drover started outlives the error.
async fn abandon(balancers: &[Arc<RunningBalancer>], apps: &[Arc<Supervisor>]) {
    for b in balancers {
        b.proxy.begin_shutdown();
    }
    for app in apps {
        app.shutdown().await;
    }
}
