//! drover: a load balancer and process supervisor in one binary.

mod balancers;
mod check;
mod cli;
mod control;
mod ctl;
mod follow;
mod serve;
mod systemd;
mod up;
mod watching;

use cli::{Cli, Command};
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = Cli::from_args();
    if let Err(e) = init_logging(cli.log_format) {
        eprintln!("error: {e}");
        return ExitCode::from(2);
    }
    raise_descriptor_limit();
    let result = match cli.command {
        Command::Proxy(args) => proxy(*args).map(|()| None),
        Command::Up(args) => control_runtime().and_then(|rt| rt.block_on(up::up(&args.config))),
        Command::Run(args) => control_runtime().and_then(|rt| rt.block_on(up::run_app(&args))),
        Command::Ctl(args) => control_runtime()
            .and_then(|rt| rt.block_on(ctl::ctl(args)))
            .map(|()| None),
        // Exit 1, not 2, on a config that fails the check: the check itself worked.
        Command::Check(args) => Ok(Some(check::main(&args.config))),
        // Its own exit codes (3: an SLO was breached) and error messages.
        Command::Bench(args) => Ok(Some(drover_bench::cli::main_with(&args))),
    };
    let code = match result {
        Ok(code) => code.unwrap_or(ExitCode::SUCCESS),
        Err(e) => {
            drover_spool::eprintln!("error: {e}");
            ExitCode::from(2)
        }
    };
    // What waits for stderr's reader is written before drover ends (5 s at most).
    drover_spool::flush_stderr();
    code
}

/// rustls warns of each ClientHello that names an IP address as SNI (wrk does, so do
/// scanners): one line per handshake, 2,078 lines in 5 s of wrk, which journald's rate
/// limit answers by dropping drover's own errors too (edge seat). It is ignored, as
/// nginx ignores it silently; the handshake serves the default certificate. Unless
/// `DROVER_LOG` names rustls, only its errors are shown.
const QUIET_RUSTLS: &str = "rustls=error";

fn init_logging(format: cli::LogFormat) -> Result<(), String> {
    let directives = match std::env::var("DROVER_LOG") {
        Ok(set) if !set.trim().is_empty() => log_directives(&set)?,
        _ => format!("warn,{QUIET_RUSTLS}"),
    };
    let filter = tracing_subscriber::EnvFilter::try_new(&directives)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(format!("warn,{QUIET_RUSTLS}")));
    // Colours only for a terminal: in a file, a pipe or journald they are escape codes
    // in every line (`^[[33m WARN`); NO_COLOR turns them off on a terminal too.
    let colours = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let log = tracing_subscriber::fmt()
        .with_env_filter(filter)
        // Through the stderr spool: a stderr nobody reads costs lines, not drover.
        .with_writer(|| drover_spool::Stderr);
    match format {
        cli::LogFormat::Text => log.with_ansi(colours).init(),
        cli::LogFormat::Json => {
            // Before any line: worker lines and messages take the same form.
            drover_spool::use_json_lines();
            log.json().flatten_event(true).init();
        }
    }
    Ok(())
}

const LEVELS: [&str; 6] = ["trace", "debug", "info", "warn", "error", "off"];

/// `DROVER_LOG` as tracing's filter, checked: each directive is a level, `TARGET=LEVEL`
/// or a module path (`drover_proxy`). A typo is refused by name: tracing reads a bare
/// `dbug` as a target, and with no level for the rest, hid every warning (crash loops
/// among them). With no bare level, the rest stays at `warn`.
fn log_directives(set: &str) -> Result<String, String> {
    let mut has_level = false;
    for directive in set.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        let level = match directive.rsplit_once('=') {
            Some((_, level)) => level,
            None if LEVELS.contains(&directive.to_ascii_lowercase().as_str()) => {
                has_level = true;
                continue;
            }
            None if directive.contains('_') || directive.contains("::") => continue,
            None => directive,
        };
        if !LEVELS.contains(&level.trim().to_ascii_lowercase().as_str()) {
            return Err(format!(
                "DROVER_LOG={set:?}: {directive:?} is not a level ({}) nor TARGET=LEVEL (drover_proxy=debug)",
                LEVELS.join(", ")
            ));
        }
    }
    let base = if has_level { "" } else { "warn," };
    Ok(match set.contains("rustls") {
        true => format!("{base}{set}"),
        false => format!("{base}{set},{QUIET_RUSTLS}"),
    })
}

/// Every client connection and every backend connection is a descriptor: run under the
/// hard limit, not the soft default meant for programs that use `select()`.
fn raise_descriptor_limit() {
    match drover_proxy::descriptors::raise_soft_limit() {
        Ok(limit) => tracing::debug!(limit, "descriptor limit (soft) raised to the hard limit"),
        Err(e) => tracing::debug!("cannot raise the descriptor limit: {e}"),
    }
}

fn proxy(args: drover_config::flags::ProxyArgs) -> Result<(), String> {
    let (cfg, origins) = match &args.config {
        Some(path) => {
            let (cfg, origins) =
                drover_config::load_with_origins(path).map_err(|e| e.to_string())?;
            if !cfg.apps.is_empty() {
                return Err(format!(
                    "{}: [[app]] tables describe supervised workers, which `drover proxy` does not run; start this file with `drover up`",
                    path.display()
                ));
            }
            (cfg, origins)
        }
        None => {
            let cfg = drover_config::flags::proxy_config(&args).map_err(|e| e.to_string())?;
            let mut origins = drover_config::Origins::default()
                .with_flag("balancer[0].listen", "--listen")
                .with_flag("balancer[0].access_log.path", "--access-log-path")
                .with_flag("admin.listen", "--admin")
                .with_flag("etcd.tls.ca", "--etcd-ca")
                .with_flag("etcd.password_file", "--etcd-password-file")
                .with_flag("etcd.tls.cert", "--etcd-cert")
                .with_flag(
                    "etcd.tls.key",
                    if args.etcd_key.is_some() {
                        "--etcd-key"
                    } else {
                        "--etcd-cert"
                    },
                );
            if let Some(b) = cfg.balancers.first() {
                origins = drover_config::flags::with_tls_flags(origins, b);
            }
            (cfg, origins)
        }
    };
    let balancers = &cfg.balancers;
    if balancers.is_empty() {
        return Err("nothing to run: the config has no [[balancer]]".into());
    }
    let plans = balancers
        .iter()
        .enumerate()
        .map(|(i, b)| {
            drover_config::plan::BalancerPlan::from_config(b).map_err(|e| match e.key(i) {
                Some(key) => origins.error(&key, e.to_string()),
                None => e.to_string(),
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    if let Some(p) = plans.iter().find(|p| p.app.is_some()) {
        return Err(format!(
            "balancer {:?} balances over a supervised app; start it with `drover up`",
            p.proxy.name
        ));
    }
    control_runtime()?
        .block_on(up::run_config(
            cfg,
            &origins,
            args.config
                .as_deref()
                .map_or(up::Reread::Nothing, up::Reread::File),
            up::Admin::Required,
            &[],
        ))
        // No app behind `drover proxy`: it never stops by itself.
        .map(|_| ())
}

/// The control plane (signals, health checks) runs on its own small event loop, apart
/// from the serving threads.
fn control_runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the event loop: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drover_log_keeps_the_rest_at_warn_unless_it_names_a_level() {
        assert_eq!(log_directives("info").unwrap(), "info,rustls=error");
        assert_eq!(
            log_directives("drover_proxy=debug").unwrap(),
            "warn,drover_proxy=debug,rustls=error"
        );
        assert_eq!(
            log_directives("warn,rustls=debug").unwrap(),
            "warn,rustls=debug"
        );
        assert_eq!(
            log_directives("drover_proxy").unwrap(),
            "warn,drover_proxy,rustls=error"
        );
        assert!(log_directives("dbug").is_err());
        assert!(log_directives("info,drover=loud").is_err());
    }
}
