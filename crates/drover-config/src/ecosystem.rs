//! PM2's ecosystem file: the apps a PM2 user has already described, run as they are.
//!
//! `pm2 start ecosystem.config.js` is how most PM2 deployments start; `drover run
//! ecosystem.config.js` takes the same file. It is JavaScript (`module.exports = { apps:
//! [...] }`, or `export default` in an ES module), which reads `process.env` and
//! computes values, so Node evaluates it ([`evaluate`]) and hands drover the result as
//! JSON; a `.json` file is read as PM2 reads it, as a JavaScript expression. Each app's
//! keys then map onto an [`AppConfig`] ([`apps`]): PM2's cluster mode becomes drover's
//! default mode with a balancer where the app listens, as PM2's primary listens for it;
//! fork mode, a plain process that binds what it binds itself (or no port at all),
//! becomes background mode. Keys that only concern PM2's own machinery (log files,
//! file watching, cron restarts) are reported as not applied, never an error, so a
//! PM2 user's file runs as written.

use crate::model::{self, AppConfig, Workers};
use serde_json::{Map, Value};
use std::io::Read;
use std::net::{Ipv6Addr, SocketAddr};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Whether `word` names an ecosystem file by PM2's rule (`Common.isConfigFile`): a name
/// ending in `.config.js`, `.config.cjs` or `.config.mjs`, or a JSON or YAML file.
pub fn is_ecosystem_file(word: &str) -> bool {
    [
        ".config.js",
        ".config.cjs",
        ".config.mjs",
        ".json",
        ".yml",
        ".yaml",
    ]
    .iter()
    .any(|ext| word.ends_with(ext))
}

/// What Node runs to read an ecosystem file named by its first argument: the module's
/// export (its `default` in an ES module) or the JSON file's expression, printed as JSON
/// after a marker line, so whatever the file itself prints on stdout is passed over.
/// It exits once printed, so a file that starts a timer or a server cannot keep it
/// alive; one that never finishes is [`EVALUATE_LIMIT`]'s.
const EVALUATE_JS: &str = r#"
const path = require('path'), fs = require('fs'), url = require('url');
const file = path.resolve(process.argv[1]);
(async () => {
  let conf;
  if (file.endsWith('.json')) {
    conf = require('vm').runInThisContext('(' + fs.readFileSync(file, 'utf8') + ')', { filename: file });
  } else {
    const m = await import(url.pathToFileURL(file).href);
    conf = m.default !== undefined ? m.default : Object.assign({}, m);
  }
  process.stdout.write('\n' + MARKER + '\n' + JSON.stringify(conf === undefined ? null : conf) + '\n');
  process.exit(0);
})().catch((e) => { process.stderr.write(String((e && e.stack) || e) + '\n'); process.exit(2); });
"#;

/// How long Node may take to evaluate a file. Past it Node is killed: a timer inside
/// Node could not end a top-level `while (true)`, and that would hang drover's start
/// and every reload.
const EVALUATE_LIMIT: Duration = Duration::from_secs(10);

/// The line before the evaluated file's JSON on Node's stdout.
const MARKER: &str = "--- drover: the ecosystem file as JSON ---";

/// The value `path` exports, evaluated by `node` (the one on `PATH`, as `pm2` runs).
pub fn evaluate(path: &Path) -> Result<Value, String> {
    let shown = path.display();
    if shown.to_string().ends_with(".yml") || shown.to_string().ends_with(".yaml") {
        return Err(format!("{shown}: drover reads PM2's ecosystem files written in JavaScript or JSON, not YAML: write it as ecosystem.config.js (`module.exports = {{ apps: [...] }}`)"));
    }
    if !path.is_file() {
        return Err(format!("{shown}: no such file"));
    }
    let script = EVALUATE_JS.replace("MARKER", &format!("{MARKER:?}"));
    let out = output_within(
        Command::new("node").arg("-e").arg(script).arg(path),
        EVALUATE_LIMIT,
    )
    .map_err(|e| {
        format!("{shown}: cannot run node to read it (an ecosystem file is JavaScript): {e}")
    })?
    .ok_or_else(|| {
        format!(
            "{shown}: node did not finish evaluating it within {} s (a loop or a wait at its top level?)",
            EVALUATE_LIMIT.as_secs()
        )
    })?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let json = stdout
        .rsplit_once(&format!("{MARKER}\n"))
        .map(|(_, json)| json.trim());
    match json {
        Some(json) if out.status.success() => serde_json::from_str(json)
            .map_err(|e| format!("{shown}: what it exports is not plain data: {e}")),
        _ => {
            let stderr = String::from_utf8_lossy(&out.stderr);
            // Node's own frames say nothing of the user's file.
            let lines: Vec<&str> = stderr
                .trim()
                .lines()
                .filter(|l| !l.trim().is_empty() && !l.contains("node:internal/"))
                .take(12)
                .collect();
            Err(format!(
                "{shown}: node could not evaluate it ({}):\n{}",
                out.status,
                lines.join("\n")
            ))
        }
    }
}

/// `cmd`'s output, as [`Command::output`] gives it, or `None` when it ran past `limit`
/// (it is killed then). std has no wait with a deadline, so this polls; evaluating a
/// file takes Node tens of milliseconds, and the polls cost nothing beside that.
/// `cmd` runs in a process group of its own, which is killed once it has ended: a
/// process the file started (a helper that inherited stdout) neither outlives the
/// evaluation nor holds its pipes open. One that left the group (a new session) may
/// keep them open: what was read by [`PIPES_GRACE`] after the end is the output then.
fn output_within(cmd: &mut Command, limit: Duration) -> std::io::Result<Option<Output>> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()?;
    let group = nix::unistd::Pid::from_raw(child.id() as i32);
    let stdout = Drained::start(child.stdout.take());
    let stderr = Drained::start(child.stderr.take());
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break Some(status);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    // No such group once every member has ended: nothing to do then.
    let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
    let closed_by = Instant::now() + PIPES_GRACE;
    Ok(status.map(|status| Output {
        status,
        stdout: stdout.take(closed_by),
        stderr: stderr.take(closed_by),
    }))
}

/// How long the pipes of an evaluation that ended may stay open before drover takes
/// what they gave.
const PIPES_GRACE: Duration = Duration::from_secs(1);

/// A pipe read to its end in a thread of its own (a child that fills one pipe while
/// nobody reads it would never exit), into a buffer that can be taken before the end.
struct Drained {
    bytes: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
    reader: std::thread::JoinHandle<()>,
}

impl Drained {
    fn start<R: Read + Send + 'static>(pipe: Option<R>) -> Drained {
        let bytes = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let into = std::sync::Arc::clone(&bytes);
        let reader = std::thread::spawn(move || {
            let Some(mut pipe) = pipe else { return };
            let mut chunk = [0u8; 8192];
            while let Ok(n @ 1..) = pipe.read(&mut chunk) {
                into.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .extend_from_slice(&chunk[..n]);
            }
        });
        Drained { bytes, reader }
    }

    /// What was read: all of it once the pipe closed, or what came by `deadline`.
    fn take(self, deadline: Instant) -> Vec<u8> {
        while !self.reader.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let mut bytes = self.bytes.lock().unwrap_or_else(|e| e.into_inner());
        std::mem::take(&mut *bytes)
    }
}

/// How `drover run` reads the file: PM2's `--env NAME` and `--only A,B`.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Each app's `env_NAME` goes on top of its `env`.
    pub env: Option<String>,
    /// Only these apps run (by their names in the file).
    pub only: Vec<String>,
    /// Overrides every app's `instances` (PM2's `-i`).
    pub instances: Option<Workers>,
    /// Where every cluster-mode app's workers take their own ports (`--worker-ports`).
    pub worker_ports: Option<drover_supervisor::PortRange>,
}

/// An ecosystem file and how `drover run` read it: what a reload reads again, as
/// `pm2 reload ecosystem.config.js` reads the file again.
#[derive(Debug, Clone)]
pub struct Source {
    /// As the user named it (messages show it so).
    pub file: PathBuf,
    /// Where relative `cwd`s start.
    pub base: PathBuf,
    pub options: Options,
    /// Serving threads of each cluster-mode app's balancer (`drover run --threads`),
    /// for the apps a reload starts too.
    pub threads: usize,
}

impl Source {
    /// The file's apps as it says now, with the notes on what drover does not apply.
    pub fn read(&self) -> Result<(Vec<EcosystemApp>, Vec<String>), String> {
        let conf = evaluate(&self.file)?;
        apps(
            &self.file.display().to_string(),
            &conf,
            &self.base,
            &self.options,
        )
    }
}

/// One app of the file, as drover runs it.
#[derive(Debug, Clone)]
pub struct EcosystemApp {
    pub app: AppConfig,
    /// PM2's cluster mode: a balancer serves the app's clients where its workers'
    /// `listen()` says, as PM2's primary does. `None`: fork mode (background).
    pub clients: Option<Clients>,
}

/// Where a cluster-mode app's clients connect when its `listen()` names no port of its
/// own (it listens on the `PORT` drover gives each worker).
#[derive(Debug, Clone, PartialEq)]
pub struct Clients {
    pub default_listen: SocketAddr,
    /// Where `default_listen` came from, for an error that cannot bind it.
    pub default_from: String,
}

/// The apps of an evaluated ecosystem file, and a note for every key drover does not
/// apply. `file` names the file in messages; `base` is where relative `cwd`s start
/// (drover's own directory, as PM2's).
pub fn apps(
    file: &str,
    conf: &Value,
    base: &Path,
    options: &Options,
) -> Result<(Vec<EcosystemApp>, Vec<String>), String> {
    let list: Vec<&Value> = match conf {
        Value::Object(o) => match o.get("apps") {
            Some(Value::Array(a)) => a.iter().collect(),
            Some(app @ Value::Object(_)) => vec![app],
            Some(other) => {
                return Err(format!(
                    "{file}: apps is {}, not a list of apps",
                    kind(other)
                ))
            }
            None if o.contains_key("script") => vec![conf],
            None => return Err(format!("{file}: no apps: it exports no `apps` list")),
        },
        Value::Array(a) => a.iter().collect(),
        other => {
            return Err(format!(
                "{file}: it exports {}, not {{ apps: [...] }}",
                kind(other)
            ))
        }
    };
    if list.is_empty() {
        return Err(format!("{file}: no apps: its `apps` list is empty"));
    }
    let mut out: Vec<EcosystemApp> = Vec::new();
    let mut notes = Vec::new();
    let mut on_default = 0;
    for (i, raw) in list.into_iter().enumerate() {
        let Value::Object(raw) = raw else {
            return Err(format!("{file}: apps[{i}] is {}, not an app", kind(raw)));
        };
        let keys = Keys::new(raw);
        let mut one = App {
            at: format!("{file}: apps[{i}]"),
            keys,
            notes: Vec::new(),
        };
        let Some(app) = one.map(base, options)? else {
            notes.append(&mut one.notes);
            continue;
        };
        if !options.only.is_empty() && !options.only.contains(&app.app.spec.name) {
            continue;
        }
        if out.iter().any(|a| a.app.spec.name == app.app.spec.name) {
            return Err(format!(
                "{}: a second app named {:?}: drover runs each name once (give each app its own `name`)",
                one.at, app.app.spec.name
            ));
        }
        let mut app = app;
        if let Some(clients) = app
            .clients
            .as_mut()
            .filter(|c| c.default_from == DEFAULT_FROM)
        {
            // Apps that all listen on drover's PORT cannot all have the default: the
            // next ones get the ports after it, as the start-up line says.
            let port = crate::flags::DEFAULT_RUN_LISTEN
                .port()
                .saturating_add(on_default);
            clients.default_listen.set_port(port);
            on_default += 1;
        }
        notes.append(&mut one.notes);
        out.push(app);
    }
    for name in &options.only {
        if !out.iter().any(|a| &a.app.spec.name == name) {
            return Err(format!(
                "--only {name:?}: {file} has no app of that name (it has {})",
                names(conf).join(", ")
            ));
        }
    }
    if let Some(env) = &options.env {
        let key = format!("env_{env}");
        let has = |v: &Value| v.as_object().is_some_and(|o| o.contains_key(&key));
        let any = match conf.get("apps") {
            Some(Value::Array(a)) => a.iter().any(has),
            Some(app) => has(app),
            None => conf.as_array().is_some_and(|a| a.iter().any(has)) || has(conf),
        };
        if !any {
            notes.push(format!(
                "{file}: --env {env}: no app has `{key}`; each runs with its `env`"
            ));
        }
    }
    Ok((out, notes))
}

/// What a cluster-mode app's clients get when neither its `listen()` nor its `env`
/// names a port: `drover run`'s default.
const DEFAULT_FROM: &str =
    "drover run's default, as the app's env names no PORT; set `env: { PORT: ... }` in the file";

/// The names of the apps in `conf`, for a message.
fn names(conf: &Value) -> Vec<String> {
    let list: Vec<&Value> = match conf.get("apps") {
        Some(Value::Array(a)) => a.iter().collect(),
        Some(app) => vec![app],
        None => conf
            .as_array()
            .map(|a| a.iter().collect())
            .unwrap_or_default(),
    };
    list.iter()
        .filter_map(|app| {
            app.get("name")
                .and_then(Value::as_str)
                .map(String::from)
                .or_else(|| app.get("script").and_then(Value::as_str).map(script_name))
        })
        .map(|n| drover_name(&n))
        .collect()
}

/// A JSON value's kind, for a message.
fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// An app's keys by PM2's canonical names: camelCase (`maxMemoryRestart`) and PM2's
/// aliases (`exec`, `interpreter`, `out`...) read as the names they stand for.
struct Keys {
    keys: Vec<(String, String, Value)>,
}

impl Keys {
    fn new(raw: &Map<String, Value>) -> Keys {
        let keys = raw
            .iter()
            .map(|(written, v)| {
                let snake = if written.starts_with("env_") {
                    written.clone()
                } else {
                    snake_case(written)
                };
                let canonical = ALIASES
                    .iter()
                    .find(|(alias, _)| *alias == snake)
                    .map_or(snake, |(_, key)| key.to_string());
                (canonical, written.clone(), v.clone())
            })
            .collect();
        Keys { keys }
    }

    /// The value of `key`, and the name it was written as; `None` for `undefined`.
    fn get(&self, key: &str) -> Option<(&str, &Value)> {
        self.keys
            .iter()
            .find(|(k, _, _)| k == key)
            .map(|(_, written, v)| (written.as_str(), v))
    }
}

/// PM2's aliases (lib/API/schema.json), alias first.
const ALIASES: [(&str, &str); 17] = [
    ("exec", "script"),
    ("command", "script"),
    ("cmd", "script"),
    ("interpreter", "exec_interpreter"),
    ("interpreter_args", "node_args"),
    ("out", "out_file"),
    ("output", "out_file"),
    ("out_log", "out_file"),
    ("error", "error_file"),
    ("err", "error_file"),
    ("err_file", "error_file"),
    ("err_log", "error_file"),
    ("log", "log_file"),
    ("pid", "pid_file"),
    ("combine_logs", "merge_logs"),
    ("cron", "cron_restart"),
    ("user", "uid"),
];

fn snake_case(key: &str) -> String {
    let mut out = String::with_capacity(key.len() + 4);
    for c in key.chars() {
        if c.is_ascii_uppercase() {
            out.push('_');
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// Keys drover applies its own way, or that concern only PM2's machinery: accepted
/// with no note (PM2's monitoring, its process list, versions).
const NO_EFFECT: [&str; 22] = [
    "namespace",
    "vizion",
    "source_map_support",
    "disable_source_map_support",
    "force",
    "username",
    "windows_hide",
    "pmx",
    "automation",
    "trace",
    "disable_trace",
    "v8",
    "event_loop_inspector",
    "deep_monitoring",
    "io",
    "filter_env",
    "merge_logs",
    "disable_logs",
    "kill_retry_time",
    "execute_command",
    "write",
    "install_url",
];

/// Keys that name PM2's log files: drover prints every worker's output on its own.
const LOG_FILES: [&str; 4] = ["out_file", "error_file", "log_file", "pid_file"];

/// One app's keys being mapped, with the notes on what is not applied.
struct App {
    at: String,
    keys: Keys,
    notes: Vec<String>,
}

impl App {
    fn note(&mut self, what: String) {
        self.notes.push(format!("{}: {what}", self.at));
    }

    fn error(&self, what: String) -> String {
        format!("{}: {what}", self.at)
    }

    /// A string key's value; an error for another kind.
    fn string(&self, key: &str) -> Result<Option<String>, String> {
        match self.keys.get(key) {
            None | Some((_, Value::Null)) => Ok(None),
            Some((_, Value::String(s))) => Ok(Some(s.clone())),
            Some((written, v)) => {
                Err(self.error(format!("{written} is {}, not a string", kind(v))))
            }
        }
    }

    /// A list of words, given as a list or as one string PM2 splits.
    fn words(&self, key: &str) -> Result<Vec<String>, String> {
        match self.keys.get(key) {
            None | Some((_, Value::Null)) => Ok(Vec::new()),
            Some((_, Value::String(s))) => Ok(split_words(s)),
            Some((written, Value::Array(items))) => items
                .iter()
                .map(|v| match v {
                    Value::String(s) => Ok(s.clone()),
                    Value::Number(n) => Ok(n.to_string()),
                    Value::Bool(b) => Ok(b.to_string()),
                    other => {
                        Err(self.error(format!("{written} holds {}, not a word", kind(other))))
                    }
                })
                .collect(),
            Some((written, v)) => {
                Err(self.error(format!("{written} is {}, not a list or a string", kind(v))))
            }
        }
    }

    /// A time in milliseconds (PM2's unit), or a string such as "5s" or "2m".
    fn millis(&self, key: &str) -> Result<Option<Duration>, String> {
        match self.keys.get(key) {
            None | Some((_, Value::Null)) => Ok(None),
            Some((written, Value::Number(n))) => match n.as_f64() {
                Some(ms) if ms >= 0.0 && ms.is_finite() => {
                    Ok(Some(Duration::from_secs_f64(ms / 1000.0)))
                }
                _ => Err(self.error(format!(
                    "{written} = {n}: a time in milliseconds, 0 or more"
                ))),
            },
            Some((written, Value::String(s))) => {
                let t = s.trim();
                if let Ok(ms) = t.parse::<u64>() {
                    return Ok(Some(Duration::from_millis(ms)));
                }
                drover_units::duration(t)
                    .map(Some)
                    .map_err(|e| self.error(format!("{written}: {e}")))
            }
            Some((written, v)) => Err(self.error(format!(
                "{written} is {}, not a time in milliseconds",
                kind(v)
            ))),
        }
    }

    /// The environment: `env`, with `env_NAME` on top when `--env NAME`, and `port` (PM2's
    /// shortcut for `PORT`) on top of both.
    fn env(
        &self,
        name: Option<&str>,
    ) -> Result<std::collections::BTreeMap<String, String>, String> {
        let mut env = std::collections::BTreeMap::new();
        let mut layers = vec!["env".to_string()];
        layers.extend(name.map(|n| format!("env_{n}")));
        for layer in layers {
            let vars = match self.keys.get(&layer) {
                None | Some((_, Value::Null)) => continue,
                Some((_, Value::Object(vars))) => vars,
                Some((written, v)) => {
                    return Err(self.error(format!(
                        "{written} is {}, not an object of variables",
                        kind(v)
                    )))
                }
            };
            for (var, v) in vars {
                let value = match v {
                    Value::String(s) => s.clone(),
                    Value::Number(n) => n.to_string(),
                    Value::Bool(b) => b.to_string(),
                    Value::Null => continue,
                    other => {
                        return Err(self.error(format!(
                            "{layer}.{var} is {}: a variable's value is a string",
                            kind(other)
                        )))
                    }
                };
                if var.is_empty() || var.contains('=') || var.contains('\0') || value.contains('\0')
                {
                    return Err(self.error(format!(
                        "{layer}: {var:?} cannot be an environment variable"
                    )));
                }
                env.insert(var.clone(), value);
            }
        }
        match self.keys.get("port") {
            None | Some((_, Value::Null)) => {}
            Some((_, Value::Number(n))) => {
                env.insert("PORT".into(), n.to_string());
            }
            Some((_, Value::String(s))) => {
                env.insert("PORT".into(), s.clone());
            }
            Some((written, v)) => {
                return Err(self.error(format!("{written} is {}, not a port", kind(v))))
            }
        }
        Ok(env)
    }

    /// The app as drover runs it; `None` for one PM2 would not start (`autostart: false`).
    fn map(&mut self, base: &Path, options: &Options) -> Result<Option<EcosystemApp>, String> {
        let Some(script) = self.string("script")? else {
            return Err(self.error(
                "no `script`: the program or file PM2 would start (script: 'app.js')".into(),
            ));
        };
        if script.trim().is_empty() {
            return Err(self.error("`script` is empty".into()));
        }
        let written_name = self.string("name")?.unwrap_or_else(|| script_name(&script));
        let name = drover_name(&written_name);
        self.at = format!("{} ({written_name})", self.at);
        if name != written_name {
            self.note(format!(
                "runs as {name:?} in drover (`drover ctl`, /metrics and its output's [NAME/ID] prefix): {}",
                crate::NAME_RULE
            ));
        }
        if self
            .keys
            .get("autostart")
            .is_some_and(|(_, v)| v == &Value::Bool(false))
        {
            self.note("autostart is false: not started, as PM2 starts it not".into());
            return Ok(None);
        }

        let cwd = match self.string("cwd")? {
            Some(dir) => base.join(dir),
            None => base.to_path_buf(),
        };
        let interpreter = self.string("exec_interpreter")?;
        let interpreter_args = self.words("node_args")?;
        let args = self.words("args")?;
        let line = match cwd.join(&script).exists() {
            true => None,
            false => crate::pm2_order::command_string(std::slice::from_ref(&script)),
        };
        let path: PathBuf = cwd
            .join(&script)
            .components()
            .filter(|c| *c != std::path::Component::CurDir)
            .collect();
        // A word with no '/' and no extension that names no file here is a program on
        // PATH, as PM2 runs `script: 'npm', args: 'start'`; anything else is a file.
        let on_path = !path.exists() && !script.contains('/') && !script.contains('.');
        if line.is_none() && !on_path && !path.exists() {
            return Err(self.error(format!(
                "script {script:?}: no such file ({})",
                path.display()
            )));
        }
        let program = if on_path {
            script.clone()
        } else {
            path.display().to_string()
        };
        let interpreter = match interpreter.as_deref() {
            Some("none") => None,
            Some(i) => Some(i.to_string()),
            None if !path.is_file() => None,
            None => {
                let with =
                    drover_supervisor::with_interpreter(std::slice::from_ref(&program), None);
                match with.len() {
                    2 => Some(with[0].clone()),
                    // An executable of no known kind runs itself; PM2 runs the rest
                    // under node.
                    _ if is_executable(&path) => None,
                    _ => Some("node".into()),
                }
            }
        };
        let mut command: Vec<String> = Vec::new();
        match &interpreter {
            // `script: 'npm run start'`, as PM2 runs it (see `command_string`).
            _ if line.is_some() => {}
            Some(i) => {
                command.push(i.clone());
                command.extend(interpreter_args);
            }
            None if !interpreter_args.is_empty() => {
                self.note(format!(
                    "node_args: {script} runs with no interpreter to give them to; not applied"
                ));
            }
            None => {}
        }
        match line {
            Some(line) if line[1] == "-c" => {
                if !args.is_empty() {
                    self.note("args: a script that is a shell command line takes none (PM2 drops them too); not applied".into());
                }
                command = line;
            }
            Some(line) => {
                command = line;
                command.extend(args);
            }
            None => {
                command.push(program);
                command.extend(args);
            }
        }

        let runs_node = command
            .first()
            .is_some_and(|p| drover_node::is_node_program(p) || drover_node::is_script_runner(p));
        let instances_given = self
            .keys
            .get("instances")
            .is_some_and(|(_, v)| !v.is_null());
        let cluster = match self.string("exec_mode")?.as_deref() {
            Some("cluster" | "cluster_mode") => true,
            Some("fork" | "fork_mode") => false,
            Some(other) => {
                return Err(self.error(format!(
                    "exec_mode {other:?}: PM2's modes are \"cluster\" and \"fork\""
                )))
            }
            // PM2's rule (Common.sink.determineExecMode): instances and a Node app make
            // cluster mode; anything else runs as a plain process.
            None => instances_given && runs_node,
        };
        if cluster && !runs_node {
            return Err(self.error(format!(
                "exec_mode cluster runs a Node app (PM2 starts each instance with node's cluster module), and this one runs {}: set exec_mode: 'fork'",
                command[0]
            )));
        }
        let workers = match options.instances {
            Some(w) => w,
            None => self.instances()?,
        };

        let mut app = AppConfig::new(name, command);
        let spec = &mut app.spec;
        spec.workers = workers;
        spec.cwd = Some(cwd);
        spec.env = self.env(options.env.as_deref())?;
        spec.mode = if cluster {
            model::Mode::default()
        } else {
            model::Mode::Background
        };
        // Its balancer follows the app's listen(): the app reads this file's PORT (or
        // the user's), not drover's, as under PM2.
        spec.users_port = cluster;
        if cluster {
            spec.worker_ports = options.worker_ports;
        }
        // Its balancer's limits are the defaults (`ecosystem_balancers`).
        spec.head_limit = cluster.then(|| model::LimitsConfig::default().max_header_bytes);
        if let Some((written, v)) = self.keys.get("max_memory_restart") {
            let bytes = match v {
                Value::Number(n) => n.as_u64().filter(|b| *b > 0),
                Value::String(s) => crate::flags::byte_size(s).ok(),
                _ => None,
            };
            spec.max_memory = Some(bytes.ok_or_else(|| {
                self.error(format!(
                    "{written} = {v}: a size such as \"300M\" or \"1G\", or a number of bytes"
                ))
            })?);
        }
        self.timings(spec)?;
        self.watching(spec)?;
        if let Some(var) = self.string("increment_var")? {
            if cluster && var == "PORT" {
                self.note("increment_var: PORT: in cluster mode the workers share the app's one PORT, as under PM2, and clients reach every instance there; not applied".into());
            } else {
                spec.increment_var = Some(var);
            }
        }
        if let Some(var) = self.string("instance_var")? {
            spec.instance_var = (var != "NODE_APP_INSTANCE").then_some(var);
        }
        if spec.wait_ready && !cluster {
            spec.wait_ready = false;
            self.note("wait_ready: a fork-mode app runs in drover's background mode, which opens no cluster channel to send 'ready' on; it is up once it has run 1 s; not applied".into());
        }
        self.note_the_rest(&script);

        let clients =
            cluster.then(
                || match spec.env.get("PORT").and_then(|p| p.parse::<u16>().ok()) {
                    // PM2's primary listens where the app's listen(PORT) asks: every address.
                    Some(port) if port > 0 => Clients {
                        default_listen: SocketAddr::from((Ipv6Addr::UNSPECIFIED, port)),
                        default_from: "the PORT in the app's env".into(),
                    },
                    _ => Clients {
                        default_listen: crate::flags::DEFAULT_RUN_LISTEN,
                        default_from: DEFAULT_FROM.into(),
                    },
                },
            );
        Ok(Some(EcosystemApp { app, clients }))
    }

    /// `instances`: a count, 0 or "max" for one per core, -N for all cores but N.
    fn instances(&self) -> Result<Workers, String> {
        let Some((written, v)) = self.keys.get("instances").filter(|(_, v)| !v.is_null()) else {
            return Ok(Workers::Count(1));
        };
        let n = match v {
            Value::String(s) if s.trim() == "max" => return Ok(Workers::Auto),
            Value::String(s) => s.trim().parse::<i64>().ok(),
            Value::Number(n) => n.as_i64(),
            _ => None,
        };
        match n.and_then(Workers::pm2_instances) {
            Some(workers) => Ok(workers),
            None => Err(self.error(format!(
                "{written} = {v}: a number of instances, \"max\" (one per core) or -N (all cores but N)"
            ))),
        }
    }

    /// `kill_timeout`, `listen_timeout` and `min_uptime` (PM2's milliseconds), and
    /// `wait_ready`: how a worker starts and stops.
    fn timings(&self, spec: &mut drover_supervisor::AppSpec) -> Result<(), String> {
        if let Some(t) = self.millis("kill_timeout")? {
            spec.stop_timeout = t;
        }
        if let Some(t) = self.millis("listen_timeout")? {
            if t.is_zero() {
                let written = self.keys.get("listen_timeout").map_or("", |(w, _)| w);
                return Err(self.error(format!("{written} must be more than 0")));
            }
            spec.ready_timeout = t;
        }
        if let Some(t) = self.millis("min_uptime")? {
            spec.restart.min_uptime = t;
        }
        // PM2's default (16) is not taken: where the file says nothing, a worker is
        // restarted for as long as drover runs.
        match self.keys.get("max_restarts") {
            None | Some((_, Value::Null)) => {}
            Some((written, v)) => {
                let n = match v {
                    Value::Number(n) => n.as_u64().and_then(|n| u32::try_from(n).ok()),
                    Value::String(s) => s.trim().parse::<u32>().ok(),
                    _ => None,
                };
                match n {
                    Some(n) => spec.restart.max_restarts = Some(n),
                    None => {
                        return Err(
                            self.error(format!("{written} = {v}: a number of restarts, 0 or more"))
                        )
                    }
                }
            }
        }
        match self.keys.get("wait_ready") {
            None | Some((_, Value::Null)) => {}
            Some((_, Value::Bool(on))) => spec.wait_ready = *on,
            Some((written, v)) => {
                return Err(self.error(format!("{written} is {}, not true or false", kind(v))))
            }
        }
        Ok(())
    }

    /// PM2's `watch` (true: the app's directory; a path; a list of paths),
    /// `ignore_watch` (a name or relative path, or a list of them) and `watch_delay`
    /// (milliseconds): the app is reloaded when its files change.
    fn watching(&self, spec: &mut drover_supervisor::AppSpec) -> Result<(), String> {
        let strings =
            |written: &str, v: &Value, what: &str| -> Result<Vec<String>, String> {
                match v {
                    Value::String(s) => Ok(vec![s.clone()]),
                    Value::Array(items) => items
                        .iter()
                        .enumerate()
                        .map(|(i, item)| match item {
                            Value::String(s) => Ok(s.clone()),
                            other => Err(self
                                .error(format!("{written}[{i}] is {}, not {what}", kind(other)))),
                        })
                        .collect(),
                    other => Err(self.error(format!(
                        "{written} is {}, not {what} or a list of them",
                        kind(other)
                    ))),
                }
            };
        let paths = match self.keys.get("watch") {
            None | Some((_, Value::Null | Value::Bool(false))) => return Ok(()),
            Some((_, Value::Bool(true))) => vec![".".to_string()],
            Some((_, Value::Array(items))) if items.is_empty() => vec![".".to_string()],
            Some((written, v)) => strings(written, v, "true, false, a path")?,
        };
        let ignore = match self.keys.get("ignore_watch") {
            None | Some((_, Value::Null)) => Vec::new(),
            Some((written, v)) => strings(written, v, "a name or relative path")?,
        };
        let mut watch = drover_supervisor::watch::WatchSpec::new(
            paths.into_iter().map(std::path::PathBuf::from).collect(),
        );
        watch.ignore = ignore;
        if let Some(delay) = self.millis("watch_delay")? {
            watch.delay = delay;
        }
        spec.watch = Some(watch);
        Ok(())
    }

    /// Notes for the keys drover does not apply, once each.
    fn note_the_rest(&mut self, script: &str) {
        const USED: [&str; 21] = [
            "watch",
            "ignore_watch",
            "watch_delay",
            "wait_ready",
            "increment_var",
            "instance_var",
            "name",
            "script",
            "args",
            "exec_interpreter",
            "node_args",
            "instances",
            "exec_mode",
            "cwd",
            "env",
            "port",
            "max_memory_restart",
            "kill_timeout",
            "listen_timeout",
            "min_uptime",
            "max_restarts",
        ];
        let keys: Vec<(String, String, Value)> = self.keys.keys.clone();
        let mut logs = Vec::new();
        for (key, written, v) in keys {
            if USED.contains(&key.as_str())
                || key.starts_with("env_")
                || NO_EFFECT.contains(&key.as_str())
            {
                continue;
            }
            if LOG_FILES.contains(&key.as_str()) {
                logs.push(written);
                continue;
            }
            let why = match (key.as_str(), &v) {
                ("autorestart" | "autostart" | "treekill", Value::Bool(true)) => continue,
                ("shutdown_with_message" | "append_env_to_name", Value::Bool(false)) => continue,
                ("autorestart", _) => "drover restarts every worker that exits (with back-off); a program meant to run once is not a worker",
                ("watch_options", _) => {
                    "drover watches with inotify and takes watch, ignore_watch and watch_delay; chokidar's options do not apply"
                }
                ("cron_restart", _) => "drover has no scheduled restarts: run `drover ctl reload` from cron",
                ("time", Value::Bool(false)) => continue,
                ("time" | "log_date_format", _) => {
                    "drover's lines of worker output carry no timestamp as text (journald and docker logs stamp each line); with --log-format json (DROVER_LOG_FORMAT=json) each has one"
                }
                ("log_type", _) => {
                    "drover writes its own and every worker's lines as JSON with --log-format json (DROVER_LOG_FORMAT=json), for all its apps"
                }
                ("restart_delay" | "exp_backoff_restart_delay", _) => {
                    "drover restarts a crashed worker with back-off (0.1 s doubling to 30 s) and reports a crash loop, for as long as it runs"
                }
                ("stop_exit_codes", _) => "drover restarts a worker whatever its exit code",
                ("uid" | "gid", _) => "drover runs its workers as its own user",
                ("shutdown_with_message", _) => {
                    "drover stops a worker with SIGTERM (passed to the app's SIGINT listeners)"
                }
                ("treekill", _) => "drover stops a worker's whole process group",
                ("autostart", _) => "drover starts the app it is given (PM2's --no-autostart only registers it in PM2's list)",
                ("post_update" | "append_env_to_name" | "name_prefix", _) => "a PM2 feature drover has not",
                _ => "not a key of PM2's that drover knows",
            };
            self.note(format!("{written}: {why}; not applied"));
        }
        if !logs.is_empty() {
            self.note(format!(
                "{}: drover prints every worker's output, each line prefixed [NAME/ID], on its own stderr (redirect it, or run under systemd's journal); not applied to {script}",
                logs.join(", ")
            ));
        }
    }
}

/// PM2's own flags on a `drover run` line (crate::pm2_order::Pm2Flag), applied to
/// `app` as the ecosystem keys they stand for, as PM2 reads its flags into the same
/// keys: `--kill-timeout`, `--listen-timeout`, `--interpreter`, `--node-args` and
/// `--cwd` change how the app runs; the others are named in the notes returned, with
/// why drover does not apply them, exactly as in a file.
pub fn apply_pm2_flags(
    app: &mut AppConfig,
    flags: &[crate::pm2_order::Pm2Flag],
) -> Result<Vec<String>, String> {
    if let Some(f) = flags.iter().find(|f| f.value.is_null()) {
        return Err(format!("{}: PM2's flag takes a value", f.written));
    }
    let keys = flags
        .iter()
        .filter(|f| !f.key.is_empty())
        .map(|f| (f.key.to_string(), f.written.clone(), f.value.clone()))
        .collect();
    let mut a = App {
        at: "PM2's flag".into(),
        keys: Keys { keys },
        notes: Vec::new(),
    };
    a.timings(&mut app.spec)?;
    a.watching(&mut app.spec)?;
    if let Some(dir) = a.string("cwd")? {
        app.spec.cwd = Some(base_dir().join(dir));
    }
    let interpreter = a.string("exec_interpreter")?;
    let interpreter_args = a.words("node_args")?;
    let command = app.spec.command.clone();
    let script = command[0].clone();
    match interpreter.as_deref() {
        // The program runs itself, as it would with no interpreter known for it.
        Some("none") if interpreter_args.is_empty() => {}
        Some("none") => a.note(format!(
            "{}: {} runs with no interpreter to give them to; not applied",
            flags_for(flags, "node_args"),
            command[0]
        )),
        Some(i) => {
            app.spec.command = [i.to_string()]
                .into_iter()
                .chain(interpreter_args)
                .chain(command)
                .collect();
        }
        None if interpreter_args.is_empty() => {}
        None => {
            let with = drover_supervisor::with_interpreter(&command, app.spec.cwd.as_deref());
            let runs_node = drover_node::is_node_program(&command[0]);
            if with.len() > command.len() || runs_node {
                let (program, rest) = with.split_first().expect("a command has a program");
                app.spec.command = std::iter::once(program.clone())
                    .chain(interpreter_args)
                    .chain(rest.iter().cloned())
                    .collect();
            } else {
                a.note(format!(
                    "{}: {} runs with no interpreter to give them to; not applied",
                    flags_for(flags, "node_args"),
                    command[0]
                ));
            }
        }
    }
    a.note_the_rest(&script);
    Ok(a.notes)
}

/// The flags as written that set `key`.
fn flags_for(flags: &[crate::pm2_order::Pm2Flag], key: &str) -> String {
    flags
        .iter()
        .filter(|f| f.key == key)
        .map(|f| f.written.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// PM2's default name: the script's file name without its extension.
fn script_name(script: &str) -> String {
    let file = Path::new(script)
        .file_name()
        .map_or(script.to_string(), |f| f.to_string_lossy().into_owned());
    match file.split_once('.') {
        Some((stem, _)) if !stem.is_empty() => stem.to_string(),
        _ => file,
    }
}

/// A PM2 name as a drover name (`NAME_RULE`): lower case, and each run of other
/// characters one '-' ("API Server" runs as "api-server").
fn drover_name(name: &str) -> String {
    let mut out = String::new();
    for c in name.chars() {
        let c = c.to_ascii_lowercase();
        if c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-' {
            out.push(c);
        } else if !out.ends_with('-') {
            out.push('-');
        }
    }
    let out = out.trim_matches('-');
    let out: String = out.chars().take(64).collect();
    if out.is_empty() {
        "app".into()
    } else {
        out
    }
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.permissions().mode() & 0o111 != 0)
}

/// A string of arguments split as PM2 splits one (lib/tools/Config.js): at white space,
/// except inside quotes; a word quoted whole loses its quotes, and `--key="a b"` keeps
/// them, as PM2 keeps them.
fn split_words(s: &str) -> Vec<String> {
    let chars: Vec<char> = s.chars().collect();
    let mut words = Vec::new();
    let mut i = 0;
    let to_space = |from: usize| {
        (from..chars.len())
            .find(|&j| chars[j].is_whitespace())
            .unwrap_or(chars.len())
    };
    while i < chars.len() {
        if chars[i].is_whitespace() {
            i += 1;
            continue;
        }
        let q = chars[i];
        if q == '"' || q == '\'' {
            if let Some(close) = (i + 1..chars.len()).find(|&j| chars[j] == q) {
                words.push(chars[i + 1..close].iter().collect());
                i = close + 1;
                continue;
            }
        }
        let key_end = (i..chars.len())
            .find(|&j| chars[j].is_whitespace() || matches!(chars[j], '"' | '\'' | '='))
            .unwrap_or(chars.len());
        if key_end > i && chars.get(key_end) == Some(&'=') {
            if let Some(&q) = chars.get(key_end + 1).filter(|c| matches!(c, '"' | '\'')) {
                if let Some(close) = (key_end + 2..chars.len()).find(|&j| chars[j] == q) {
                    words.push(chars[i..=close].iter().collect());
                    i = close + 1;
                    continue;
                }
            }
        }
        let end = to_space(i);
        words.push(chars[i..end].iter().collect());
        i = end;
    }
    words.retain(|w: &String| !w.trim().is_empty());
    words
}

/// The directory relative `cwd`s start from: drover's own.
pub fn base_dir() -> PathBuf {
    std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A file that starts a process at its top level, which inherits Node's stdout:
    /// before, drover waited for that pipe to close, so a helper that never ends held
    /// drover's start (and every reload) for good. Now one in Node's process group is
    /// killed once the evaluation ended, and one that left it (`detached: true`, a
    /// session of its own) holds the pipes only `PIPES_GRACE` longer.
    #[test]
    fn a_process_the_file_starts_neither_holds_the_evaluation_nor_outlives_it() {
        let scratch = tempfile::Builder::new()
            .prefix("drover-ecosystem-helper-")
            .tempdir()
            .unwrap();
        let dir = scratch.path();
        let alive = |pid: i32| {
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok()
                && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
                    .is_ok_and(|s| s.contains(") Z "))
        };
        for detached in [false, true] {
            let file = dir.join(format!("ecosystem-{detached}.config.js"));
            let pids = dir.join(format!("pid-{detached}"));
            std::fs::write(
                &file,
                format!(
                    "const h = require('child_process').spawn(process.execPath, ['-e', 'setInterval(() => {{}}, 1000)'], {{ stdio: 'inherit', detached: {detached} }});\nrequire('fs').writeFileSync({:?}, String(h.pid));\nmodule.exports = {{ apps: [{{ name: 'a', script: 'a.js' }}] }};\n",
                    pids.display().to_string()
                ),
            )
            .unwrap();
            let (tx, rx) = std::sync::mpsc::channel();
            let path = file.clone();
            std::thread::spawn(move || tx.send(evaluate(&path)));
            let read = rx
                .recv_timeout(EVALUATE_LIMIT + Duration::from_secs(10))
                .expect("the evaluation hung on its helper's pipe");
            assert_eq!(
                read.unwrap()["apps"][0]["name"],
                "a",
                "detached: {detached}"
            );
            let helper: i32 = std::fs::read_to_string(&pids)
                .unwrap()
                .trim()
                .parse()
                .unwrap();
            if detached {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(helper),
                    nix::sys::signal::Signal::SIGKILL,
                );
            } else {
                assert!(
                    !alive(helper),
                    "the file's helper {helper} outlived its evaluation"
                );
            }
        }
    }

    thread_local! {
        /// This test's `base()`: each test runs on a thread of its own, and the directory
        /// goes when the thread ends.
        static BASE: tempfile::TempDir = tempfile::Builder::new()
            .prefix("drover-ecosystem-")
            .tempdir()
            .unwrap();
    }

    /// A directory with the scripts the tests' files name.
    fn base() -> PathBuf {
        let dir = BASE.with(|d| d.path().to_path_buf());
        for file in [
            "server.js",
            "mailer.js",
            "two.js",
            "app.py",
            "app.js",
            "api/app.js",
            "a.js",
            "b.js",
            "w.js",
            "b/a.js",
        ] {
            let path = dir.join(file);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, "").unwrap();
        }
        dir
    }

    fn at(file: &str) -> String {
        base().join(file).display().to_string()
    }

    fn map(conf: Value, options: &Options) -> Result<(Vec<EcosystemApp>, Vec<String>), String> {
        apps("ecosystem.config.js", &conf, &base(), options)
    }

    #[test]
    fn pm2_names_for_ecosystem_files() {
        for yes in [
            "ecosystem.config.js",
            "a/pm2.config.cjs",
            "x.config.mjs",
            "ecosystem.json",
            "e.yml",
        ] {
            assert!(is_ecosystem_file(yes), "{yes}");
        }
        for no in ["app.js", "server.mjs", "config.js", "app.py"] {
            assert!(!is_ecosystem_file(no), "{no}");
        }
    }

    #[test]
    fn args_split_as_pm2_splits_them() {
        assert_eq!(split_words("--port 3000  -v"), ["--port", "3000", "-v"]);
        assert_eq!(split_words(r#"run "a b" 'c d'"#), ["run", "a b", "c d"]);
        assert_eq!(split_words(r#"--name="a b" x"#), [r#"--name="a b""#, "x"]);
        assert_eq!(split_words(r#""" x"#), ["x"]);
        assert_eq!(split_words(r#"unclosed "a b"#), ["unclosed", "\"a", "b"]);
    }

    #[test]
    fn cluster_and_fork_modes_follow_pm2s_rule() {
        let conf = json!({"apps": [
            {"name": "api", "script": "server.js", "instances": "max", "env": {"PORT": 3000, "DEBUG": false}},
            {"name": "mailer", "script": "mailer.js"},
            {"name": "two", "script": "two.js", "instances": 2, "exec_mode": "fork"},
            {"name": "py", "script": "app.py", "interpreter": "python3", "args": "--port 5000"},
            {"script": "npm", "args": "start", "exec_mode": "cluster", "instances": -1},
        ]});
        let (apps, notes) = map(conf, &Options::default()).unwrap();
        assert!(notes.is_empty(), "{notes:?}");
        let api = &apps[0];
        assert_eq!(api.app.spec.mode, model::Mode::Auto);
        assert_eq!(api.app.spec.workers, Workers::Auto);
        assert_eq!(api.app.spec.command, ["node".to_string(), at("server.js")]);
        assert_eq!(api.app.spec.env["PORT"], "3000");
        assert_eq!(api.app.spec.env["DEBUG"], "false");
        assert_eq!(
            api.clients.as_ref().unwrap().default_listen,
            "[::]:3000".parse().unwrap()
        );
        // A cluster-mode app reads that PORT itself, as under PM2; a fork-mode one its
        // env's as written (background mode gives none of drover's).
        assert!(api.app.spec.users_port);
        assert!(!apps[1].app.spec.users_port);
        let mailer = &apps[1];
        assert_eq!(mailer.app.spec.mode, model::Mode::Background);
        assert_eq!(mailer.app.spec.workers, Workers::Count(1));
        assert!(mailer.clients.is_none());
        assert_eq!(apps[2].app.spec.mode, model::Mode::Background);
        assert_eq!(apps[2].app.spec.workers, Workers::Count(2));
        assert_eq!(
            apps[3].app.spec.command,
            [
                "python3".to_string(),
                at("app.py"),
                "--port".into(),
                "5000".into()
            ]
        );
        assert_eq!(apps[3].app.spec.mode, model::Mode::Background);
        let npm = &apps[4];
        assert_eq!(npm.app.spec.name, "npm");
        assert_eq!(npm.app.spec.command, ["npm", "start"]);
        assert_eq!(npm.app.spec.mode, model::Mode::Auto);
        assert_eq!(
            npm.clients.as_ref().unwrap().default_listen,
            crate::flags::DEFAULT_RUN_LISTEN
        );
    }

    #[test]
    fn env_layers_port_and_settings_map_onto_the_app() {
        let conf = json!({"apps": [{
            "name": "API Server", "script": "app.js", "instances": 2,
            "env": {"NODE_ENV": "development", "PORT": 3000},
            "env_production": {"NODE_ENV": "production"},
            "port": 4000,
            "maxMemoryRestart": "300M", "kill_timeout": 1600, "listen_timeout": "8s",
            "min_uptime": 2000, "cwd": "api", "node_args": "--max-old-space-size=200",
            "out_file": "/var/log/api.out", "error": "/var/log/api.err",
            "watch": true, "max_restarts": 10, "merge_logs": true, "colour": 1,
            "wait_ready": true, "instance_var": "INSTANCE_ID",
            "exp_backoff_restart_delay": 100, "time": true, "log_date_format": "YYYY",
            "log_type": "json",
        }, {"name": "consumer", "script": "mailer.js", "wait_ready": true,
            "instance_var": "NODE_APP_INSTANCE", "time": false}]});
        let options = Options {
            env: Some("production".into()),
            ..Options::default()
        };
        let (apps, notes) = map(conf, &options).unwrap();
        let spec = &apps[0].app.spec;
        assert_eq!(spec.name, "api-server");
        assert_eq!(spec.env["NODE_ENV"], "production");
        assert_eq!(spec.env["PORT"], "4000");
        assert_eq!(spec.max_memory, Some(300 << 20));
        assert_eq!(spec.stop_timeout, Duration::from_millis(1600));
        assert_eq!(spec.ready_timeout, Duration::from_secs(8));
        assert_eq!(spec.restart.min_uptime, Duration::from_secs(2));
        assert_eq!(spec.restart.max_restarts, Some(10));
        assert_eq!(spec.cwd, Some(base().join("api")));
        assert!(spec.wait_ready);
        assert!(!apps[1].app.spec.wait_ready);
        assert_eq!(spec.instance_var.as_deref(), Some("INSTANCE_ID"));
        assert_eq!(apps[1].app.spec.instance_var, None);
        assert_eq!(
            spec.command,
            [
                "node".to_string(),
                "--max-old-space-size=200".into(),
                at("api/app.js")
            ]
        );
        let text = notes.join("\n");
        for needle in [
            "apps[0] (API Server): runs as \"api-server\"",
            "colour: not a key of PM2's that drover knows",
            "error, out_file: drover prints every worker's output",
            "apps[1] (consumer): wait_ready: a fork-mode app runs in drover's background mode",
            "exp_backoff_restart_delay: drover restarts a crashed worker with back-off",
            "time: drover's lines of worker output carry no timestamp",
            "log_date_format: drover's lines of worker output carry no timestamp",
            "with --log-format json (DROVER_LOG_FORMAT=json) each has one",
            "log_type: drover writes its own and every worker's lines as JSON with --log-format json",
        ] {
            assert!(text.contains(needle), "{needle:?} in\n{text}");
        }
        // What applies (merge_logs: every worker's output is one stream already) or asks
        // for what drover does anyway is not noted.
        for quiet in ["merge_logs", "instance_var", "(consumer): time"] {
            assert!(!text.contains(quiet), "{quiet:?} in\n{text}");
        }
    }

    #[test]
    fn a_script_that_is_a_command_line_runs_as_pm2_runs_it() {
        let conf = json!({"apps": [
            {"name": "web", "script": "npm run start", "args": "--", "instances": 2},
            {"name": "shell", "cmd": "cd api && node app.js", "args": "x"},
        ]});
        let (apps, notes) = map(conf, &Options::default()).unwrap();
        assert_eq!(apps[0].app.spec.command, ["npm", "run", "start", "--"]);
        assert_eq!(apps[0].app.spec.mode, model::Mode::Auto);
        assert_eq!(
            apps[1].app.spec.command[1..],
            ["-c", "cd api && node app.js"]
        );
        assert_eq!(apps[1].app.spec.mode, model::Mode::Background);
        assert!(
            notes
                .join("\n")
                .contains("apps[1] (shell): args: a script that is a shell command line"),
            "{notes:?}"
        );
    }

    #[test]
    fn pm2s_flags_apply_as_the_keys_they_stand_for() {
        let flag = |written: &str, key: &'static str, value: Value| crate::pm2_order::Pm2Flag {
            written: written.into(),
            key,
            value,
        };
        let scratch = tempfile::Builder::new()
            .prefix("drover-pm2-flags-")
            .tempdir()
            .unwrap();
        let dir = scratch.path().to_path_buf();
        std::fs::write(dir.join("app.js"), "").unwrap();
        let cwd = dir.display().to_string();
        let mut app = AppConfig::new("api", vec!["app.js".into(), "8080".into()]);
        let notes = apply_pm2_flags(
            &mut app,
            &[
                flag("-k 3000", "kill_timeout", json!("3000")),
                flag("--listen-timeout 8s", "listen_timeout", json!("8s")),
                flag(
                    "--node-args=--inspect --no-warnings",
                    "node_args",
                    json!("--inspect --no-warnings"),
                ),
                flag("--cwd DIR", "cwd", json!(cwd)),
                flag("--time", "time", json!(true)),
                flag("--watch", "watch", json!(true)),
                flag("--force", "", json!(true)),
            ],
        )
        .unwrap();
        assert_eq!(app.spec.stop_timeout, Duration::from_secs(3));
        assert_eq!(app.spec.ready_timeout, Duration::from_secs(8));
        assert_eq!(app.spec.cwd, Some(dir.clone()));
        assert_eq!(
            app.spec.command,
            ["node", "--inspect", "--no-warnings", "app.js", "8080"]
        );
        assert_eq!(
            app.spec.watch,
            Some(drover_supervisor::watch::WatchSpec::new(vec![".".into()]))
        );
        // `--time` is noted, with why: before, it went by with nothing said.
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(
            notes[0].contains("--time: drover's lines of worker output carry no timestamp"),
            "{notes:?}"
        );

        let mut app = AppConfig::new("api", vec!["app.py".into()]);
        apply_pm2_flags(
            &mut app,
            &[flag(
                "--interpreter python3.11",
                "exec_interpreter",
                json!("python3.11"),
            )],
        )
        .unwrap();
        assert_eq!(app.spec.command, ["python3.11", "app.py"]);
        let mut app = AppConfig::new("api", vec!["./server".into()]);
        let notes = apply_pm2_flags(
            &mut app,
            &[flag("--node-args -x", "node_args", json!("-x"))],
        )
        .unwrap();
        assert_eq!(app.spec.command, ["./server"]);
        assert!(
            notes[0].contains("--node-args -x: ./server runs with no interpreter"),
            "{notes:?}"
        );
        for (bad, needle) in [
            (
                flag("--kill-timeout", "kill_timeout", Value::Null),
                "--kill-timeout: PM2's flag takes a value",
            ),
            (
                flag("--kill-timeout soon", "kill_timeout", json!("soon")),
                "PM2's flag: --kill-timeout soon: ",
            ),
            (
                flag("--listen-timeout 0", "listen_timeout", json!("0")),
                "--listen-timeout 0 must be more than 0",
            ),
        ] {
            let mut app = AppConfig::new("api", vec!["app.js".into()]);
            let before = app.spec.clone();
            let e = apply_pm2_flags(&mut app, &[bad]).unwrap_err();
            assert!(e.contains(needle), "{e}");
            assert_eq!(app.spec.stop_timeout, before.stop_timeout);
        }
    }

    #[test]
    fn only_and_instances_override() {
        let conf = json!([
            {"name": "api", "script": "a.js", "instances": 4},
            {"name": "worker", "script": "w.js"},
        ]);
        let options = Options {
            only: vec!["worker".into()],
            instances: Some(Workers::Count(3)),
            ..Options::default()
        };
        let (apps, _) = map(conf.clone(), &options).unwrap();
        assert_eq!(apps.len(), 1);
        assert_eq!(apps[0].app.spec.workers, Workers::Count(3));
        let options = Options {
            only: vec!["nope".into()],
            ..Options::default()
        };
        let err = map(conf, &options).unwrap_err();
        assert!(
            err.contains(
                "--only \"nope\": ecosystem.config.js has no app of that name (it has api, worker)"
            ),
            "{err}"
        );
    }

    #[test]
    fn watch_ignore_watch_and_watch_delay_apply_as_pm2_reads_them() {
        use drover_supervisor::watch::WatchSpec;
        let conf = json!({"apps": [
            {"name": "a", "script": "a.js", "watch": true},
            {"name": "b", "script": "b.js", "watch": ["src", "config.json"], "ignore_watch": ["logs", "src/tmp"], "watch_delay": 250},
            {"name": "c", "script": "w.js", "watch": "lib", "ignore_watch": "fixtures"},
            {"name": "d", "script": "app.js", "watch": false, "ignore_watch": ["x"]},
        ]});
        let (apps, notes) = map(conf, &Options::default()).unwrap();
        assert!(notes.is_empty(), "{notes:?}");
        assert_eq!(
            apps[0].app.spec.watch,
            Some(WatchSpec::new(vec![".".into()]))
        );
        let b = apps[1].app.spec.watch.clone().unwrap();
        assert_eq!(
            b.paths,
            [PathBuf::from("src"), PathBuf::from("config.json")]
        );
        assert_eq!(b.ignore, ["logs", "src/tmp"]);
        assert_eq!(b.delay, Duration::from_millis(250));
        let c = apps[2].app.spec.watch.clone().unwrap();
        assert_eq!(
            (c.paths, c.ignore),
            (vec![PathBuf::from("lib")], vec!["fixtures".to_string()])
        );
        assert_eq!(apps[3].app.spec.watch, None);
    }

    #[test]
    fn bad_files_are_refused_naming_the_app_and_key() {
        let cases = [
            (json!(42), "it exports a number, not { apps: [...] }"),
            (
                json!({"apps": "api"}),
                "apps is a string, not a list of apps",
            ),
            (json!({"apps": []}), "its `apps` list is empty"),
            (json!({"deploy": {}}), "it exports no `apps` list"),
            (json!({"apps": [{"name": "x"}]}), "apps[0]: no `script`"),
            (
                json!({"apps": [{"script": "a.js"}, 7]}),
                "apps[1] is a number, not an app",
            ),
            (
                json!({"apps": [{"script": "a.js", "instances": "many"}]}),
                "apps[0] (a): instances = \"many\": a number of instances",
            ),
            (
                json!({"apps": [{"script": "a.js", "exec_mode": "cluster-ish"}]}),
                "exec_mode \"cluster-ish\"",
            ),
            (
                json!({"apps": [{"script": "app.py", "interpreter": "python3", "exec_mode": "cluster"}]}),
                "exec_mode cluster runs a Node app",
            ),
            (
                json!({"apps": [{"script": "a.js", "env": {"A": {"b": 1}}}]}),
                "env.A is an object",
            ),
            (
                json!({"apps": [{"script": "a.js", "env": "PORT=1"}]}),
                "env is a string, not an object",
            ),
            (
                json!({"apps": [{"script": "a.js", "max_memory_restart": "lots"}]}),
                "max_memory_restart = \"lots\"",
            ),
            (
                json!({"apps": [{"script": "a.js", "kill_timeout": -5}]}),
                "kill_timeout = -5",
            ),
            (
                json!({"apps": [{"script": "a.js", "max_restarts": -1}]}),
                "max_restarts = -1: a number of restarts, 0 or more",
            ),
            (
                json!({"apps": [{"script": "a.js", "args": {"a": 1}}]}),
                "args is an object",
            ),
            (
                json!({"apps": [{"script": "a.js"}, {"script": "b/a.js"}]}),
                "apps[1] (a): a second app named \"a\"",
            ),
            (
                json!({"apps": [{"script": "gone.js"}]}),
                "apps[0] (gone): script \"gone.js\": no such file",
            ),
            (
                json!({"apps": [{"script": "a.js", "watch": 1}]}),
                "apps[0] (a): watch is a number, not true, false, a path or a list of them",
            ),
            (
                json!({"apps": [{"script": "a.js", "watch": ["src", 2]}]}),
                "watch[1] is a number, not true, false, a path",
            ),
            (
                json!({"apps": [{"script": "a.js", "watch": true, "ignore_watch": {"a": 1}}]}),
                "ignore_watch is an object, not a name or relative path",
            ),
            (
                json!({"apps": [{"script": "a.js", "watch": true, "watch_delay": "soon"}]}),
                "watch_delay: invalid duration \"soon\"",
            ),
        ];
        for (conf, needle) in cases {
            let err = map(conf.clone(), &Options::default()).unwrap_err();
            assert!(err.contains(needle), "{conf}: {needle:?} in {err}");
            assert!(err.starts_with("ecosystem.config.js"), "{err}");
        }
    }

    #[test]
    fn two_apps_on_drovers_port_get_defaults_of_their_own() {
        let conf = json!({"apps": [
            {"name": "a", "script": "a.js", "instances": 2},
            {"name": "b", "script": "b.js", "instances": 2},
        ]});
        let (apps, _) = map(conf, &Options::default()).unwrap();
        let at: Vec<SocketAddr> = apps
            .iter()
            .map(|a| a.clients.as_ref().unwrap().default_listen)
            .collect();
        assert_eq!(at[0], crate::flags::DEFAULT_RUN_LISTEN);
        assert_ne!(at[0], at[1]);
    }

    #[test]
    fn autostart_false_is_not_started_and_env_without_its_layer_is_noted() {
        let conf = json!({"apps": [
            {"name": "a", "script": "a.js"},
            {"name": "b", "script": "b.js", "autostart": false},
        ]});
        let options = Options {
            env: Some("staging".into()),
            ..Options::default()
        };
        let (apps, notes) = map(conf, &options).unwrap();
        assert_eq!(apps.len(), 1);
        let text = notes.join("\n");
        assert!(text.contains("apps[1] (b): autostart is false"), "{text}");
        assert!(
            text.contains("--env staging: no app has `env_staging`"),
            "{text}"
        );
    }
}
