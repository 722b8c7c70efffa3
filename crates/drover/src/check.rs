//! `drover check`: everything `drover up` would refuse, found without starting anything.
//!
//! The file and its values (`drover_config::load_with_origins`), every balancer's plan and
//! every app's program (`preflight::prepare`, which `up` and a reload run too), then each
//! address drover would bind. An address in use is fine when the drover that runs this
//! very file holds it, which its admin API (the file's `[admin] listen`) tells: checking
//! the file of a running drover before `drover ctl reload` is the common case.
//!
//! Under socket activation, systemd holds the addresses until it starts drover and
//! hands them over, so they are in use while drover does not run yet; checking the file
//! then is as common. Such an address is fine too, known two ways: systemd passed it to
//! `drover check` itself (`LISTEN_FDS`, e.g. a unit that runs the check with the
//! sockets), matched to its listener as `drover up` would match it; or the process
//! that listens there is systemd (or `systemd-socket-activate`), as /proc tells
//! (`preflight::listening_holder`). The second needs the right to read the holder's
//! descriptors: as an unprivileged user, systemd's sockets show as in use, and the
//! error says to run the check as root.

use drover_admin::{Method, Status};
use drover_config::preflight::{self, ListenAddress, Listener};
use drover_config::{Config, Origins};
use std::io::ErrorKind;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

/// How long the running drover's admin API may take to say what it holds.
const STATUS_LIMIT: Duration = Duration::from_secs(5);

/// Prints what was checked and exits 0, or every error and exits 1.
pub fn main(path: &Path) -> ExitCode {
    match check(path) {
        Ok(summary) => {
            println!("{summary}");
            ExitCode::SUCCESS
        }
        Err(errors) => {
            for e in &errors {
                eprintln!("error: {e}");
            }
            eprintln!(
                "{}: {} error(s); check failed",
                path.display(),
                errors.len()
            );
            ExitCode::from(1)
        }
    }
}

fn check(path: &Path) -> Result<String, Vec<String>> {
    let (cfg, origins) = drover_config::load_with_origins(path).map_err(|e| vec![e.to_string()])?;
    if cfg.apps.is_empty() && cfg.balancers.is_empty() {
        return Err(vec![format!(
            "{}: nothing to run: no [[app]] or [[balancer]]",
            path.display()
        )]);
    }
    let (mut errors, soon) = match preflight::prepare(&cfg, &origins) {
        Ok(prepared) => (Vec::new(), expiring(&prepared)),
        Err(errors) => (errors, Vec::new()),
    };
    let (taken, held) = probe_addresses(&cfg, &origins);
    errors.extend(taken);
    if !errors.is_empty() {
        return Err(errors);
    }
    let mut summary = format!(
        "{}: ok: {} balancer(s), {} app(s)",
        path.display(),
        cfg.balancers.len(),
        cfg.apps.len()
    );
    if held.by_drover > 0 {
        summary.push_str(&format!(
            "; {} address(es) held by the drover running this file",
            held.by_drover
        ));
    }
    if !held.for_activation.is_empty() {
        summary.push_str(&format!(
            "; held by systemd for socket activation, drover takes them when it starts: {}",
            held.for_activation.join(", ")
        ));
    }
    for warning in soon {
        eprintln!("warning: {}: {warning}", path.display());
    }
    Ok(summary)
}

/// Each TLS certificate that expires within `tls::EXPIRY_WARNING`, as drover would warn
/// of it at start.
fn expiring(prepared: &preflight::Prepared) -> Vec<String> {
    let now = std::time::SystemTime::now();
    let mut soon = Vec::new();
    for plan in &prepared.plans {
        let Some(certs) = &plan.proxy.tls else {
            continue;
        };
        for c in certs.expiring(now) {
            let when = if certs.expired(now).any(|e| e.path == c.path) {
                "expired on"
            } else {
                "expires on"
            };
            soon.push(format!(
                "balancer {:?}: tls: {} {when} {}: renew it (drover reads renewed files by itself)",
                plan.proxy.name,
                c.path,
                c.not_after_text()
            ));
        }
    }
    soon
}

/// What holds the addresses in use that are not in the way.
#[derive(Debug, Default)]
struct Held {
    /// By the drover that runs this file.
    by_drover: usize,
    /// By systemd for socket activation: each as "balancer \"x\" on ADDR (by NAME, pid N)".
    for_activation: Vec<String>,
}

/// Binds each address drover would bind, and lets it go. Returns the errors, and what
/// holds the addresses in use that drover will get.
fn probe_addresses(cfg: &Config, origins: &Origins) -> (Vec<String>, Held) {
    let mut errors = Vec::new();
    let mut held = Held::default();
    // The sockets systemd passed to this very check: the addresses drover will serve.
    let passed = match passed_keys(cfg) {
        Ok(keys) => keys,
        Err(e) => {
            errors.push(e);
            Vec::new()
        }
    };
    // Asked once, and only when an address is in use.
    let mut running: Option<Option<Status>> = None;
    for a in preflight::listen_addresses(cfg) {
        if passed.contains(&a.key) {
            held.for_activation.push(format!(
                "{} on {} (passed to this check, LISTEN_FDS)",
                a.owner, a.addr
            ));
            continue;
        }
        let e = match std::net::TcpListener::bind(a.addr) {
            Ok(_) => continue,
            Err(e) => e,
        };
        let mut hint = "";
        if e.kind() == ErrorKind::AddrInUse {
            let status = running.get_or_insert_with(|| running_status(cfg));
            if status.as_ref().is_some_and(|s| holds(s, &a)) {
                held.by_drover += 1;
                continue;
            }
            match preflight::listening_holder(a.addr) {
                Some(h) if h.is_socket_activation() => {
                    held.for_activation.push(format!(
                        "{} on {} (by {}, pid {})",
                        a.owner, a.addr, h.name, h.pid
                    ));
                    continue;
                }
                Some(h) => {
                    errors.push(origins.error(
                        &a.key,
                        format!(
                            "{}: cannot listen on {}: {e}, by {} (pid {})",
                            a.owner, a.addr, h.name, h.pid
                        ),
                    ));
                    continue;
                }
                // Another user's process: systemd's, perhaps, which only root may see.
                None if !running_as_root() => {
                    hint = " (by a process this user cannot see: if systemd holds it for socket activation, run drover check as root to tell)";
                }
                None => {}
            }
        }
        errors.push(origins.error(
            &a.key,
            format!("{}: cannot listen on {}: {e}{hint}", a.owner, a.addr),
        ));
    }
    (errors, held)
}

/// The keys of the listen settings the sockets systemd passed to this process serve
/// (none when it was not socket-activated); an error names a socket no listener takes.
fn passed_keys(cfg: &Config) -> Result<Vec<String>, String> {
    let passed = crate::systemd::passed_listeners()?;
    let sockets: Vec<_> = passed.iter().map(|p| p.socket.clone()).collect();
    let owners = preflight::assign_passed(cfg, &sockets).map_err(|errors| {
        let text: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
        text.join("\nerror: ")
    })?;
    Ok(owners.into_iter().map(|o| o.key).collect())
}

/// Whether this process runs as root (and so can read every process's descriptors).
fn running_as_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|ids| ids.split_whitespace().nth(1))
            == Some("0")
    })
}

/// The status of the drover at this file's admin address, if one answers there.
fn running_status(cfg: &Config) -> Option<Status> {
    let admin = cfg.admin.as_ref()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .ok()?;
    let reply = rt
        .block_on(drover_admin::request(
            admin.listen,
            admin.token.as_deref(),
            Method::GET,
            "/v1/status",
            None,
            STATUS_LIMIT,
        ))
        .ok()?;
    if reply.status != 200 {
        return None;
    }
    serde_json::from_str(&reply.body).ok()
}

/// Whether the running drover `status` holds `a`: its admin API answered (that is the
/// admin address), a balancer of it listens there, or it runs the shared-mode app.
fn holds(status: &Status, a: &ListenAddress) -> bool {
    match &a.owner {
        Listener::AdminApi => true,
        Listener::Balancer(_) => {
            let addr = a.addr.to_string();
            status.balancers.iter().any(|b| b.listen == addr)
        }
        Listener::App(name) => status
            .apps
            .iter()
            .any(|app| &app.name == name && app.mode == "shared"),
    }
}
