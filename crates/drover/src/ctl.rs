//! `drover ctl`: the admin API from the command line.

use crate::cli::{CtlArgs, CtlCommand};
use drover_admin::{request, Method, Reply, Status};
use std::time::Duration;

/// A status answer is small and immediate.
const STATUS_LIMIT: Duration = Duration::from_secs(10);
/// A reload waits for every worker to be replaced; a slow app (a JVM, say) may take a
/// while per worker, and the server side bounds each step anyway.
const RELOAD_LIMIT: Duration = Duration::from_secs(3600);

pub async fn ctl(args: CtlArgs) -> Result<(), String> {
    let token = args.token.as_deref();
    match args.command {
        CtlCommand::Status { json } => {
            let reply = request(args.admin, token, Method::GET, "/v1/status", STATUS_LIMIT).await?;
            let reply = ok(reply)?;
            if json {
                print!("{}", reply.body);
            } else {
                let status: Status = serde_json::from_str(&reply.body)
                    .map_err(|e| format!("unexpected answer from the admin API: {e}"))?;
                print!("{}", status.to_table());
            }
        }
        CtlCommand::Reload { app } => {
            let path = match &app {
                Some(name) => format!("/v1/reload?app={}", encode(name)),
                None => "/v1/reload".to_string(),
            };
            let reply = ok(request(args.admin, token, Method::POST, &path, RELOAD_LIMIT).await?)?;
            println!("{}", result(reply));
        }
        CtlCommand::Scale { workers, app } => {
            let mut path = format!("/v1/scale?workers={workers}");
            if let Some(name) = &app {
                path.push_str(&format!("&app={}", encode(name)));
            }
            // Growing waits for the new workers to be ready, as a reload does.
            let reply = ok(request(args.admin, token, Method::POST, &path, RELOAD_LIMIT).await?)?;
            println!("{}", result(reply));
        }
    }
    Ok(())
}

/// The `result` line of a successful action, or the whole body if it has none.
fn result(reply: Reply) -> String {
    serde_json::from_str::<serde_json::Value>(&reply.body)
        .ok()
        .and_then(|v| v.get("result").and_then(|r| r.as_str()).map(str::to_string))
        .unwrap_or(reply.body)
}

fn ok(reply: Reply) -> Result<Reply, String> {
    if (200..300).contains(&reply.status) {
        Ok(reply)
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
