//! The testkit Backend as its own process, so tests can `kill -9` it.
//!
//! Usage: testkit-backend [--listen ADDR] [--name NAME]
//! Prints exactly one line `listening on ADDR` to stdout once bound.

use drover_testkit::Backend;
use std::io::Write;
use std::net::SocketAddr;
use std::process::ExitCode;

const USAGE: &str = "usage: testkit-backend [--listen ADDR] [--name NAME]";

#[derive(Debug)]
struct Args {
    listen: SocketAddr,
    name: Option<String>,
}

fn parse_args(mut args: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut out = Args {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        name: None,
    };
    while let Some(flag) = args.next() {
        let mut value = |flag: &str| {
            args.next()
                .ok_or_else(|| format!("flag {flag} needs a value"))
        };
        match flag.as_str() {
            "--listen" => {
                let v = value("--listen")?;
                out.listen = v
                    .parse()
                    .map_err(|e| format!("flag --listen: {v:?} is not an IP:PORT address ({e})"))?;
            }
            "--name" => out.name = Some(value("--name")?),
            "-h" | "--help" => return Err(USAGE.to_string()),
            other => return Err(format!("unknown flag {other:?}")),
        }
    }
    Ok(out)
}

fn main() -> ExitCode {
    let args = match parse_args(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(msg) => {
            eprintln!("testkit-backend: {msg}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("testkit-backend: cannot start runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        let builder = match &args.name {
            Some(name) => Backend::named(name),
            None => Default::default(),
        };
        let backend = match builder.start_on(args.listen).await {
            Ok(b) => b,
            Err(e) => {
                eprintln!("testkit-backend: cannot listen on {}: {e}", args.listen);
                return ExitCode::FAILURE;
            }
        };
        println!("listening on {}", backend.addr());
        let _ = std::io::stdout().flush();
        // Serve until killed; SIGTERM/SIGINT end it cleanly.
        let _ = tokio::signal::ctrl_c().await;
        drop(backend);
        ExitCode::SUCCESS
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Args, String> {
        parse_args(args.iter().map(|s| s.to_string()))
    }

    #[test]
    fn args() {
        let a = parse(&["--listen", "127.0.0.1:5000", "--name", "b1"]).unwrap();
        assert_eq!(a.listen, "127.0.0.1:5000".parse().unwrap());
        assert_eq!(a.name.as_deref(), Some("b1"));
        assert!(parse(&["--listen"]).unwrap_err().contains("--listen"));
        assert!(parse(&["--listen", "nope"])
            .unwrap_err()
            .contains("--listen"));
        assert!(parse(&["--bogus"]).unwrap_err().contains("--bogus"));
    }
}
