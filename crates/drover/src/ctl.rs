//! `drover ctl`: the admin API from the command line.

use crate::cli::{CtlArgs, CtlCommand, MembersCommand};
use drover_admin::{restarts_log, MemberList, MemberRow, Method, Reply, Status};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// `drover_admin::request`, with its error as the message `drover ctl` prints.
async fn request(
    addr: SocketAddr,
    token: Option<&str>,
    method: Method,
    path: &str,
    body: Option<String>,
    limit: Duration,
) -> Result<Reply, String> {
    drover_admin::request(addr, token, method, path, body, limit)
        .await
        .map_err(|e| e.to_string())
}

/// A status answer is small and immediate.
const STATUS_LIMIT: Duration = Duration::from_secs(10);
/// A reload waits for every worker to be replaced; a slow app (a JVM, say) may take a
/// while per worker, and the server side bounds each step anyway.
const RELOAD_LIMIT: Duration = Duration::from_secs(3600);

/// `GET /v1/status`, answered 200.
async fn fetch_status(admin: SocketAddr, token: Option<&str>) -> Result<Reply, String> {
    let reply = request(admin, token, Method::GET, "/v1/status", None, STATUS_LIMIT).await?;
    ok(reply)
}

/// The file `drover up` reads when it is given none.
const DEFAULT_CONFIG: &str = "drover.toml";
/// `drover run`'s admin API, and `drover ctl`'s when nothing names another.
const DEFAULT_ADMIN: &str = "127.0.0.1:9900";

/// Where `drover ctl` finds the admin API, the token it sends, and where that address
/// came from (for the error when nothing answers there). `--admin` (or `DROVER_ADMIN`)
/// first; then the `[admin]` of `--config`, or of `./drover.toml` as `drover up`
/// reads it with no `-c`. Before, only `--admin` counted: a `drover up` whose file
/// said `listen = "127.0.0.1:24900"` was out of `drover ctl`'s reach until the user
/// found the flag (ops seat).
fn target(args: &CtlArgs) -> Result<(SocketAddr, Option<String>, String), String> {
    if let Some(admin) = args.admin {
        return Ok((admin, args.token.clone(), "--admin or DROVER_ADMIN".into()));
    }
    let (path, named) = match &args.config {
        Some(path) => (path.clone(), true),
        None => (std::path::PathBuf::from(DEFAULT_CONFIG), false),
    };
    if named || path.exists() {
        match drover_config::load(&path) {
            Ok(cfg) => {
                let Some(admin) = cfg.admin else {
                    return Err(format!(
                        "{}: no [admin] table, so that drover serves no admin API; add one \
                         (listen = \"127.0.0.1:9900\") and reload, or name an address with \
                         --admin",
                        path.display()
                    ));
                };
                let token = args.token.clone().or(admin.token);
                let from = format!("[admin] listen of {}", path.display());
                return Ok((admin.listen, token, from));
            }
            Err(e) if named => return Err(e.to_string()),
            // Not the file the user named: the default address, and the error says
            // why the file was not used if nothing answers there.
            Err(e) => {
                let from = format!("the default; {} could not be read: {e}", path.display());
                return Ok((default_admin(), args.token.clone(), from));
            }
        }
    }
    Ok((default_admin(), args.token.clone(), "the default".into()))
}

fn default_admin() -> SocketAddr {
    DEFAULT_ADMIN.parse().expect("a socket address")
}

pub async fn ctl(args: CtlArgs) -> Result<(), String> {
    let (admin, token, from) = target(&args)?;
    let token = token.as_deref();
    let args = Resolved {
        admin,
        command: args.command,
    };
    ctl_at(args, token).await.map_err(|e| {
        if e.starts_with("cannot reach drover's admin API") {
            format!(
                "{e} (the address is {from}; --admin HOST:PORT, DROVER_ADMIN or -c FILE \
                 names another)"
            )
        } else {
            e
        }
    })
}

/// `CtlArgs` with the admin API's address found.
struct Resolved {
    admin: SocketAddr,
    command: CtlCommand,
}

async fn ctl_at(args: Resolved, token: Option<&str>) -> Result<(), String> {
    match args.command {
        CtlCommand::Status { json } => {
            let reply = fetch_status(args.admin, token).await?;
            if json {
                print!("{}", reply.body);
            } else {
                let status: Status = parse(&reply)?;
                print!("{}", status.to_table());
            }
        }
        CtlCommand::Restarts { app, json } => {
            // Served from the status: the records are part of each app's status.
            let status: Status = parse(&fetch_status(args.admin, token).await?)?;
            let rows = status.restarts(app.as_deref()).map_err(|e| e.to_string())?;
            if json {
                let text = serde_json::to_string_pretty(&rows)
                    .map_err(|e| format!("cannot write the records as JSON: {e}"))?;
                println!("{text}");
            } else {
                print!("{}", restarts_log(&rows));
            }
        }
        CtlCommand::Reload { app } => {
            let path = match &app {
                Some(name) => format!("/v1/reload?app={}", encode(name)),
                None => "/v1/reload".to_string(),
            };
            let reply =
                ok(request(args.admin, token, Method::POST, &path, None, RELOAD_LIMIT).await?)?;
            println!("{}", result(reply));
        }
        CtlCommand::Scale { target, app } => {
            let (app, workers) = scale_target(&target, app)?;
            let mut path = format!("/v1/scale?workers={workers}");
            if let Some(name) = &app {
                path.push_str(&format!("&app={}", encode(name)));
            }
            // Growing waits for the new workers to be ready, as a reload does.
            let reply =
                ok(request(args.admin, token, Method::POST, &path, None, RELOAD_LIMIT).await?)?;
            println!("{}", result(reply));
        }
        CtlCommand::Members { balancer, command } => {
            members(args.admin, token, balancer, command).await?;
        }
    }
    Ok(())
}

/// `drover ctl members ...`.
async fn members(
    admin: SocketAddr,
    token: Option<&str>,
    balancer: Option<String>,
    command: MembersCommand,
) -> Result<(), String> {
    let balancer = match balancer {
        Some(b) => b,
        None => only_balancer(admin, token).await?,
    };
    let base = format!("/v1/balancers/{}/members", encode(&balancer));
    let call = |method: Method, path: String, body: Option<String>| async move {
        ok(request(admin, token, method, &path, body, STATUS_LIMIT).await?)
    };
    match command {
        MembersCommand::List { json } => {
            let reply = call(Method::GET, base, None).await?;
            if json {
                print!("{}", reply.body);
            } else {
                let list: MemberList = parse(&reply)?;
                print!("{}", list.to_table());
            }
        }
        MembersCommand::Add {
            id,
            address,
            ttl,
            weight,
            meta,
        } => {
            let mut labels = serde_json::Map::new();
            for kv in &meta {
                let (k, v) = kv
                    .split_once('=')
                    .ok_or_else(|| format!("--meta {kv:?}: expected KEY=VALUE"))?;
                labels.insert(k.to_string(), v.into());
            }
            let mut body = serde_json::json!({ "address": address, "meta": labels });
            if let Some(ttl) = ttl {
                body["ttl"] = ttl.into();
            }
            if let Some(weight) = weight {
                body["weight"] = weight.into();
            }
            let path = format!("{base}/{}", encode(&id));
            let reply = call(Method::PUT, path, Some(body.to_string())).await?;
            let m: MemberRow = parse(&reply)?;
            let verb = if reply.status == 201 {
                "added"
            } else {
                "updated"
            };
            println!("{verb} member {} ({}) to balancer {balancer}", m.id, m.addr);
        }
        MembersCommand::Heartbeat { id, load } => {
            let body = load.map(|l| serde_json::json!({ "load": l }).to_string());
            let path = format!("{base}/{}/heartbeat", encode(&id));
            let m: MemberRow = parse(&call(Method::PUT, path, body).await?)?;
            match m.ttl_left_secs {
                Some(left) => println!("member {} alive for {left:.1}s", m.id),
                None => println!("member {} has no TTL", m.id),
            }
        }
        MembersCommand::Drain { id } => {
            let path = format!("{base}/{}", encode(&id));
            let m: MemberRow = parse(&call(Method::DELETE, path, None).await?)?;
            println!("{}", drain_line(&m));
        }
        MembersCommand::Remove { id, timeout } => {
            let path = format!("{base}/{}", encode(&id));
            let started = Instant::now();
            let m: MemberRow = parse(&call(Method::DELETE, path, None).await?)?;
            if m.state != "removed" {
                println!("{}", drain_line(&m));
                loop {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    let list: MemberList = parse(&call(Method::GET, base.clone(), None).await?)?;
                    if !list
                        .members
                        .iter()
                        .any(|r| r.id == id && r.state == "draining")
                    {
                        break;
                    }
                    if started.elapsed() >= timeout {
                        return Err(format!(
                            "member {id} is still draining after {timeout:?}; it is removed once its requests finish"
                        ));
                    }
                }
            }
            println!(
                "member {id} removed from balancer {balancer} after {:.1}s",
                started.elapsed().as_secs_f64()
            );
        }
    }
    Ok(())
}

fn drain_line(m: &MemberRow) -> String {
    if m.state == "removed" {
        format!("member {} removed (nothing was in flight)", m.id)
    } else {
        format!(
            "member {} draining: no new requests, {} in flight",
            m.id, m.in_flight
        )
    }
}

/// The name of the only balancer, for commands that may leave it out.
async fn only_balancer(admin: SocketAddr, token: Option<&str>) -> Result<String, String> {
    let reply = ok(request(admin, token, Method::GET, "/v1/status", None, STATUS_LIMIT).await?)?;
    let status: Status = parse(&reply)?;
    match status.balancers.as_slice() {
        [only] => Ok(only.name.clone()),
        [] => Err("this drover runs no balancer".into()),
        many => Err(format!(
            "several balancers run ({}): name one with --balancer",
            many.iter()
                .map(|b| b.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

fn parse<T: serde::de::DeserializeOwned>(reply: &Reply) -> Result<T, String> {
    serde_json::from_str(&reply.body)
        .map_err(|e| format!("unexpected answer from the admin API: {e} ({NOT_ADMIN_HINT})"))
}

/// The `result` line of a successful action, or the whole body if it has none.
fn result(reply: Reply) -> String {
    serde_json::from_str::<serde_json::Value>(&reply.body)
        .ok()
        .and_then(|v| v.get("result").and_then(|r| r.as_str()).map(str::to_string))
        .unwrap_or(reply.body)
}

/// What an answer that is not drover's JSON says of the address it came from.
const NOT_ADMIN_HINT: &str = "is the address drover's [admin] listen, not a balancer's listen?";

fn ok(reply: Reply) -> Result<Reply, String> {
    if (200..300).contains(&reply.status) {
        Ok(reply)
    } else if serde_json::from_str::<serde_json::Value>(&reply.body).is_err() {
        // drover's admin API answers every error in JSON: this is someone else's.
        let first = reply.body.lines().next().unwrap_or_default();
        Err(format!(
            "{} answered, not as drover's admin API does ({first:.80}): {NOT_ADMIN_HINT}",
            reply.status
        ))
    } else if reply.status == 401 {
        // The API's words are for any client; ctl's own way to send the token is a flag.
        Err(format!(
            "admin API answered 401: {}: pass --token TOKEN (or DROVER_ADMIN_TOKEN, or -c drover.toml with its [admin] token)",
            reply.error_message()
        ))
    } else {
        Err(format!(
            "admin API answered {}: {}",
            reply.status,
            reply.error_message()
        ))
    }
}

/// Percent-encodes everything but unreserved characters, for a query value.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// `drover ctl scale`'s words: `WORKERS`, or `APP WORKERS` as `pm2 scale` takes them.
fn scale_target(words: &[String], app: Option<String>) -> Result<(Option<String>, usize), String> {
    let (named, count) = match words {
        [count] => (None, count),
        [name, count] => (Some(name.clone()), count),
        _ => return Err("drover ctl scale takes WORKERS, or APP WORKERS".to_string()),
    };
    let workers = count
        .parse::<usize>()
        .map_err(|_| format!("drover ctl scale: {count:?} is not a number of workers"))?;
    match (named, app) {
        (Some(a), Some(b)) if a != b => Err(format!(
            "drover ctl scale: two apps named, {a:?} and --app {b:?}"
        )),
        (named, app) => Ok((named.or(app), workers)),
    }
}

#[cfg(test)]
mod scale_tests {
    use super::scale_target;

    #[test]
    fn scale_takes_a_count_or_an_app_then_a_count() {
        let w = |words: &[&str]| words.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(scale_target(&w(&["3"]), None), Ok((None, 3)));
        assert_eq!(
            scale_target(&w(&["3"]), Some("api".into())),
            Ok((Some("api".into()), 3))
        );
        assert_eq!(
            scale_target(&w(&["api", "4"]), None),
            Ok((Some("api".into()), 4))
        );
        assert!(scale_target(&w(&["api"]), None)
            .unwrap_err()
            .contains("\"api\" is not a number of workers"));
        assert!(scale_target(&w(&["api", "4"]), Some("web".into()))
            .unwrap_err()
            .contains("two apps named"));
    }
}
