//! A port of its own for each worker's inspector. `node --inspect app.js` opens the
//! debugger at 9229; N workers of it would all ask for 9229, and all but the first
//! would log `Starting inspector on 127.0.0.1:9229 failed: address already in use`.
//! Node's cluster module (and so PM2) gives each worker it forks the next port after
//! the primary's (`--inspect-port=9230`, 9231, …, one more for every fork, restarts
//! too, so a replacement never asks for the port its predecessor still holds); drover
//! does the same.

/// Node's default inspector port.
const DEFAULT_INSPECT_PORT: u16 = 9229;

/// `command` (a `node` command line) with `--inspect-port=PORT` added after its last
/// inspector option: `PORT` is the inspector's port it asked for (9229 unless
/// `--inspect=[HOST:]PORT` or `--inspect-port` says) plus `nth()`, which counts the
/// workers started with an inspector (1 for the first), as Node's cluster module
/// counts its forks. `None` (and `nth` not called) when the command opens no inspector
/// before its script, or is not `node`.
pub fn with_inspector_port(command: &[String], nth: impl FnOnce() -> u32) -> Option<Vec<String>> {
    let mut last = None;
    let mut base = DEFAULT_INSPECT_PORT;
    for (i, arg) in crate::node_command::options_before_script(command)? {
        let (name, value) = match arg.split_once('=') {
            Some((name, value)) => (name, Some(value)),
            None => (arg, None),
        };
        if let "--inspect" | "--inspect-brk" | "--inspect-wait" | "--inspect-port"
        | "--debug-port" = name
        {
            if let Some(port) = value.and_then(port_of) {
                base = port;
            }
            // `--inspect-port` alone opens nothing; after an option that does, ours
            // goes after it, so that ours is the last.
            let opens = !matches!(name, "--inspect-port" | "--debug-port");
            if opens || last.is_some() {
                last = Some(i);
            }
        }
    }
    let port = offset(base, nth());
    let mut out = command.to_vec();
    out.insert(last? + 1, format!("--inspect-port={port}"));
    Some(out)
}

/// The port of an inspector option's value: `PORT`, `HOST:PORT` or `[IPv6]:PORT`.
fn port_of(value: &str) -> Option<u16> {
    let port = value.rsplit_once(':').map_or(value, |(_, port)| port);
    port.parse().ok()
}

/// `base + nth`, wrapped into the unprivileged ports past 65535.
fn offset(base: u16, nth: u32) -> u16 {
    const FIRST: u32 = 1024;
    let span = u32::from(u16::MAX) - FIRST + 1;
    let at = u32::from(base).max(FIRST) - FIRST + nth % span;
    (FIRST + at % span) as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(line: &str) -> Vec<String> {
        line.split(' ').map(String::from).collect()
    }

    fn with(line: &str, nth: u32) -> Option<String> {
        with_inspector_port(&words(line), || nth).map(|c| c.join(" "))
    }

    #[test]
    fn each_worker_gets_the_next_port_after_the_one_asked_for() {
        assert_eq!(
            with("node --inspect app.js", 1).as_deref(),
            Some("node --inspect --inspect-port=9230 app.js")
        );
        assert_eq!(
            with(
                "/usr/bin/nodejs --inspect-brk=0.0.0.0:9400 app.js --inspect",
                3
            )
            .as_deref(),
            Some("/usr/bin/nodejs --inspect-brk=0.0.0.0:9400 --inspect-port=9403 app.js --inspect")
        );
        assert_eq!(
            with("node -r dotenv/config --inspect=[::1]:9500 app.js", 2).as_deref(),
            Some("node -r dotenv/config --inspect=[::1]:9500 --inspect-port=9502 app.js")
        );
        // A port given by --inspect-port is the base, and ours comes after it (the last wins).
        assert_eq!(
            with("node --inspect-port=9600 --inspect app.js", 1).as_deref(),
            Some("node --inspect-port=9600 --inspect --inspect-port=9601 app.js")
        );
        assert_eq!(
            with("node --inspect --inspect-port=9600 app.js", 1).as_deref(),
            Some("node --inspect --inspect-port=9600 --inspect-port=9601 app.js")
        );
        // Past the last port: back among the unprivileged ones.
        assert_eq!(offset(65535, 1), 1024);
        assert_eq!(
            u32::from(offset(9229, 65535)),
            9229 + 65535 - (65535 - 1024 + 1)
        );
    }

    #[test]
    fn no_inspector_before_the_script_changes_nothing() {
        for line in [
            "node app.js",
            "node app.js --inspect",
            "node -r --inspect app.js",
            "node --inspect-port=9300 app.js",
            "npm start --inspect",
            "python3 --inspect app.py",
            "node -- --inspect",
        ] {
            assert_eq!(with(line, 1), None, "{line}");
        }
    }
}
