//! How a worker is started so that the Node process running the app becomes drover's
//! cluster worker.
//!
//! A program run directly (`node app.js`, or through `sh -c`) gets Node's own variables:
//! its start-up sets up the channel and the cluster worker before the app's code runs.
//! A package manager (`npm start`) is a Node process itself and would take the channel,
//! and so is a runner that starts the app in a Node process of its own (`tsx app.ts`,
//! TypeScript's usual runner: its loader goes into a child Node). Their apps get
//! drover's names for the same values and a preload (`NODE_OPTIONS --require`) that
//! hands the channel to the first Node process below them that is not such a runner.

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

const PRELOAD: &str = include_str!("preload.cjs");

/// Programs that run an app's script in a Node process of their own (preload.cjs knows
/// them by their scripts): package managers and tsx.
const SCRIPT_RUNNERS: [&str; 8] = [
    "npm", "npx", "yarn", "yarnpkg", "pnpm", "pnpx", "corepack", "tsx",
];

/// Node commands that run the command they are given in a process of their own, as a
/// runner does: NestJS's CLI (`nest start` builds the app and runs `node dist/main`),
/// the wrappers that set the app's environment first, common in `npm start` scripts
/// (`cross-env NODE_ENV=production node app.js`, dotenv-cli's `dotenv -e .env -- node
/// app.js`, `env-cmd`, `dotenvx run`), npm-run-all's `run-s build serve`, and nodemon
/// (`"start": "nodemon app.js"` in many a tutorial's package.json) and ts-node-dev
/// (`"dev": "ts-node-dev --respawn src/index.ts"`, `tsnd` for short), which fork the app
/// with an IPC channel of their own and restart it when a file changes. Their
/// names are not Node's alone (python-dotenv's command is `dotenv` too), so each counts
/// only where its file's `#!` line runs Node (`starts_node`). preload.cjs knows them by
/// their scripts too.
const NODE_WRAPPERS: [&str; 13] = [
    "nest",
    "nodemon",
    "ts-node-dev",
    "tsnd",
    "cross-env",
    "cross-env-shell",
    "dotenv",
    "env-cmd",
    "dotenvx",
    "run-s",
    "run-p",
    "npm-run-all",
    "npm-run-all2",
];

/// The file name of `program` (a path or a name).
fn program_name(program: &str) -> &str {
    Path::new(program)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or(program)
}

/// Whether `program` (a path or a name) is a Node program that runs the app in a Node
/// process below it: a package manager, or tsx.
pub fn is_script_runner(program: &str) -> bool {
    SCRIPT_RUNNERS.contains(&program_name(program))
}

/// JavaScript runtimes that are not Node but read Node's cluster variables as their
/// own: given `NODE_UNIQUE_ID` and a channel, Bun made every worker share a port the
/// app names (`Bun.serve({ port: 3000 })`) past drover, and Deno panicked at start
/// unless allowed to read the environment. They get no channel: `PORT`, as any other
/// program.
const OTHER_JS_RUNTIMES: &[&str] = &["bun", "bunx", "bun.exe", "deno"];

/// Whether `program` (a path or a name) is one of `OTHER_JS_RUNTIMES`.
pub fn is_other_js_runtime(program: &str) -> bool {
    OTHER_JS_RUNTIMES.contains(&program_name(program))
}

/// Whether `program` (a path or a name) is named as a Node command that runs the app
/// below it (`NODE_WRAPPERS`); it is one where its file's `#!` line runs Node.
pub fn is_node_wrapper_name(program: &str) -> bool {
    NODE_WRAPPERS.contains(&program_name(program))
}

/// Whether `program` (a path or a name) is Node itself (`node`, Debian's `nodejs`) or a
/// script runner that starts the app in Node (see `is_script_runner`): its app's
/// `listen()` then comes to drover as a question, with the port it names.
pub fn is_node_program(program: &str) -> bool {
    is_node_itself(program) || is_script_runner(program)
}

/// Whether the file at `path` begins with a `#!` line that runs Node: `#!/usr/bin/node`,
/// `#!/usr/bin/env node`, `#!/usr/bin/env -S node --flag`. Every npm package's command
/// is such a script (`ts-node`, `next`, `react-router-serve` in `node_modules/.bin`), so
/// its app's `listen()` comes to drover as a question, as `node app.js`'s does.
pub fn starts_node(path: &Path) -> bool {
    use std::io::Read;
    let mut head = [0u8; 256];
    let Ok(n) = fs::File::open(path).and_then(|mut f| f.read(&mut head)) else {
        return false;
    };
    let Some(line) = head[..n].strip_prefix(b"#!") else {
        return false;
    };
    let line = line.split(|&b| b == b'\n').next().unwrap_or_default();
    let Ok(line) = std::str::from_utf8(line) else {
        return false;
    };
    let mut words = line.split_whitespace();
    match words.next() {
        Some(first) if is_node_itself(first) => true,
        Some(first) if Path::new(first).file_name() == Some("env".as_ref()) => words
            .find(|w| !w.starts_with('-') && !w.contains('='))
            .is_some_and(is_node_itself),
        _ => false,
    }
}

/// Whether `program` (a path or a name) is Node itself: `node`, or Debian's `nodejs`.
pub(crate) fn is_node_itself(program: &str) -> bool {
    let name = Path::new(program)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or(program);
    name == "node" || name == "nodejs"
}

/// The environment that makes a Node program a cluster worker on `channel_fd`: Node's
/// own start-up reads (and removes) these, so a program that is not Node ignores them.
/// With `preload`, `node_options` (the worker's `NODE_OPTIONS`, if any) gets it added:
/// it lets the worker give its client connections back when drover retires it. And
/// `DROVER_NODE_CHANNEL` tells the preload that the channel is drover's, not that of a
/// primary of the app's own (which a process the app forks has), and goes with it.
pub fn channel_env(
    cluster_id: usize,
    channel_fd: i32,
    preload: Option<&Path>,
    node_options: Option<&str>,
) -> Vec<(String, String)> {
    let mut env = vec![
        // What Node's cluster module makes `cluster.worker.id`.
        ("NODE_UNIQUE_ID".into(), cluster_id.to_string()),
        ("NODE_CHANNEL_FD".into(), channel_fd.to_string()),
        ("NODE_CHANNEL_SERIALIZATION_MODE".into(), "json".into()),
        ("DROVER_NODE_CHANNEL".into(), "1".into()),
    ];
    if let Some(preload) = preload {
        env.push(("NODE_OPTIONS".into(), with_preload(preload, node_options)));
    }
    env
}

/// The Unix sockets drover holds for the app's workers to share, for its preload in a
/// worker that starts now: an app that removes its socket's file before `listen()` (the
/// usual guard against a stale one) removes nothing of them, and its clients never find
/// the path empty. Nothing while drover holds none (the first workers: a stale file is
/// the app's to remove).
pub fn unix_sockets_env(held: &[PathBuf]) -> Option<(String, String)> {
    if held.is_empty() {
        return None;
    }
    let paths: Vec<_> = held.iter().map(|p| p.to_string_lossy()).collect();
    let json = serde_json::to_string(&paths).expect("strings serialize");
    Some(("DROVER_UNIX_SOCKETS".into(), json))
}

/// The largest request head drover reads for the app's workers, for its preload: an
/// app server that reads larger ones (`maxHeaderSize`) is told that drover refuses them.
pub fn head_limit_env(limit: Option<usize>) -> Option<(String, String)> {
    limit.map(|n| ("DROVER_HEAD_LIMIT".into(), n.to_string()))
}

/// The port whose server drover balances, for its preload (`AppSpec::app_port`): the
/// servers on it, not the app's first, are the ones whose clients it counts and gives
/// back.
pub fn app_port_env(port: Option<u16>) -> Option<(String, String)> {
    port.map(|p| ("DROVER_BALANCED_PORT".into(), p.to_string()))
}

/// The environment for a script runner's app (npm's, tsx's): drover's names for the channel, and
/// `node_options` (the worker's `NODE_OPTIONS`, if any) with the preload added.
pub fn runner_env(
    cluster_id: usize,
    channel_fd: i32,
    preload: &Path,
    node_options: Option<&str>,
) -> Vec<(String, String)> {
    vec![
        ("DROVER_NODE_UNIQUE_ID".into(), cluster_id.to_string()),
        ("DROVER_NODE_CHANNEL_FD".into(), channel_fd.to_string()),
        ("NODE_OPTIONS".into(), with_preload(preload, node_options)),
    ]
}

/// Where drover reaches a worker: its own loopback `port`, as `DROVER_WORKER_PORT` (the
/// preload tells drover's connections there from clients'). Where the app reads the
/// user's `PORT` (`users_port`: `Some`, with the user's value if there is one), also
/// `DROVER_APP_PORT`: the preload puts it back as `PORT` below a script runner (which
/// has drover's, for what it starts may not be Node), and gives drover's port to a first
/// `listen()` that names none (`listen(process.env.PORT)` with no `PORT`), which is then
/// served at drover's address as before. An empty value is none.
pub fn port_env(port: u16, users_port: Option<&Option<String>>) -> Vec<(String, String)> {
    let mut env = vec![("DROVER_WORKER_PORT".into(), port.to_string())];
    if let Some(users) = users_port {
        env.push(("DROVER_APP_PORT".into(), users.clone().unwrap_or_default()));
    }
    env
}

/// The environment for a Node program with no channel (a background worker): the
/// preload alone, for what it does outside a cluster worker (a SIGTERM reaches an app
/// that listens only to SIGINT, as PM2 stops it).
pub fn preload_env(preload: &Path, node_options: Option<&str>) -> Vec<(String, String)> {
    vec![("NODE_OPTIONS".into(), with_preload(preload, node_options))]
}

/// The environment for a Node program in shared mode: the preload, and where it finds
/// the listening socket drover passed (`socket_fd`), which the app's first `listen()`
/// then serves whatever port it names.
pub fn shared_socket_env(
    socket_fd: i32,
    preload: &Path,
    node_options: Option<&str>,
) -> Vec<(String, String)> {
    let mut env = preload_env(preload, node_options);
    env.push(("DROVER_SHARED_FD".into(), socket_fd.to_string()));
    env
}

/// `node_options` with `--require preload` added.
fn with_preload(preload: &Path, node_options: Option<&str>) -> String {
    // NODE_OPTIONS is split like a shell's words; a double-quoted path may hold spaces.
    let quoted = preload
        .display()
        .to_string()
        .replace('\\', "\\\\")
        .replace('"', "\\\"");
    let require = format!("--require \"{quoted}\"");
    match node_options {
        Some(existing) if !existing.trim().is_empty() => format!("{existing} {require}"),
        _ => require,
    }
}

/// Where `write_preload` puts the preload in `dir`: a name of its own for each version
/// of it. drovers of two versions on one machine share `dir`, and with one name the
/// second to start replaced the first's preload, whose workers then loaded one that
/// did not speak their drover's messages (no client counts: `auto` handed no connection
/// to a worker of its own).
pub fn preload_path(dir: &Path) -> PathBuf {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    PRELOAD.hash(&mut h);
    dir.join(format!("node-cluster-worker-{:016x}.cjs", h.finish()))
}

/// Writes the preload into `dir` (created private to this user) and returns its path.
/// The file is code every app's Node process loads, so the directory must be ours and
/// closed to others: in a shared `/tmp`, another user could otherwise put their own.
pub fn write_preload(dir: &Path) -> io::Result<PathBuf> {
    match fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let meta = fs::symlink_metadata(dir)?;
    let uid = nix::unistd::Uid::effective().as_raw();
    if !meta.is_dir() || meta.uid() != uid || meta.permissions().mode() & 0o077 != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{} must be a directory of user {uid} that no one else can open (mode 700)",
                dir.display()
            ),
        ));
    }
    let path = preload_path(dir);
    // Already there, as this drover would write it (the directory is this user's
    // alone): a read-only filesystem holding it, a container's image built with it,
    // serves as it is.
    if fs::read(&path).is_ok_and(|there| there == PRELOAD.as_bytes()) {
        return Ok(path);
    }
    let partial = dir.join(format!(".node-cluster-worker.{}.cjs", std::process::id()));
    fs::write(&partial, PRELOAD)?;
    fs::rename(&partial, &path)?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn script_runners_by_name_or_path() {
        assert!(is_script_runner("npm"));
        assert!(is_script_runner("/usr/bin/yarn"));
        assert!(is_script_runner("node_modules/.bin/tsx"));
        assert!(!is_script_runner("node_modules/.bin/nest"));
        assert!(is_node_wrapper_name("node_modules/.bin/nest"));
        assert!(is_node_wrapper_name("/usr/local/bin/nodemon"));
        assert!(is_node_wrapper_name("node_modules/.bin/ts-node-dev"));
        assert!(is_node_wrapper_name("tsnd"));
        assert!(is_node_wrapper_name("cross-env") && is_node_wrapper_name("/usr/bin/dotenv"));
        assert!(!is_node_wrapper_name("npm") && !is_node_wrapper_name("node"));
        assert!(!is_script_runner("node"));
        assert!(!is_script_runner("/opt/npm-tools/node"));
    }

    #[test]
    fn node_programs_by_name_or_path() {
        assert!(is_node_program("node"));
        assert!(is_node_program("/usr/bin/nodejs"));
        assert!(is_node_program("npm"));
        assert!(is_node_program("node_modules/.bin/tsx"));
        assert!(!is_node_program("python3"));
        assert!(!is_node_program("sh"));
        assert!(!is_node_program("/opt/node/bin/gunicorn"));
    }

    #[test]
    fn a_script_starts_node_when_its_first_line_says_so() {
        let dir = std::env::temp_dir().join(format!("drover-shebang-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        for (name, head, node) in [
            (
                "env-node",
                &b"#!/usr/bin/env node\nrequire('./app')\n"[..],
                true,
            ),
            ("usr-bin-node", b"#!/usr/bin/node\n", true),
            (
                "nodejs",
                b"#! /usr/bin/nodejs --max-old-space-size=100\n",
                true,
            ),
            (
                "env-s",
                b"#!/usr/bin/env -S node --enable-source-maps\n",
                true,
            ),
            (
                "env-var",
                b"#!/usr/bin/env NODE_ENV=production node\n",
                true,
            ),
            ("sh", b"#!/bin/sh\nexec node app.js\n", false),
            ("python", b"#!/usr/bin/env python3\n", false),
            ("env-nodemon", b"#!/usr/bin/env nodemon\n", false),
            ("elf", b"\x7fELF\x02\x01\x01\0", false),
            ("empty", b"", false),
            ("no-line", b"#!", false),
        ] {
            fs::write(dir.join(name), head).unwrap();
            assert_eq!(starts_node(&dir.join(name)), node, "{name}");
        }
        assert!(!starts_node(&dir.join("missing")));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_preload_joins_the_apps_own_node_options() {
        let env = runner_env(
            2,
            3,
            Path::new("/run/d r\"x/p.cjs"),
            Some("--max-old-space-size=512"),
        );
        assert_eq!(
            env[2].1,
            "--max-old-space-size=512 --require \"/run/d r\\\"x/p.cjs\""
        );
        let env = runner_env(2, 3, Path::new("/p.cjs"), None);
        assert_eq!(env[2].1, "--require \"/p.cjs\"");
    }

    #[test]
    fn the_preload_directory_must_be_private() {
        let dir =
            std::env::temp_dir().join(format!("drover-node-preload-test-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let path = write_preload(&dir).unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap(), PRELOAD);
        // Written again on the next start, over the old one.
        write_preload(&dir).unwrap();
        // Another version's preload beside it is left as it is.
        let other = dir.join("node-cluster-worker-0000000000000000.cjs");
        fs::write(&other, "// another version").unwrap();
        assert_eq!(write_preload(&dir).unwrap(), path);
        assert_ne!(path, other);
        assert_eq!(fs::read_to_string(&other).unwrap(), "// another version");
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).unwrap();
        let e = write_preload(&dir).unwrap_err();
        assert!(e.to_string().contains("mode 700"), "{e}");
        fs::remove_dir_all(&dir).unwrap();
    }
}
