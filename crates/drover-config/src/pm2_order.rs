//! PM2's order of words for a script named alone.
//!
//! `pm2 start app.js -i 4 -- --port 3000` reads the words after the script as PM2's own
//! flags, up to a `--`, and gives the app those after it. `drover run` takes a command
//! as `docker run` does (from the program on, every word is the program's), which a
//! PM2 user's `drover run app.js -i 4` would turn into `node app.js -i 4` on the default
//! number of workers. So where the program is a script named alone (one that gets an
//! interpreter from its extension, `app.js`, not `node app.js`), its words are read in
//! PM2's order, and so are the words after an ecosystem file (`drover run
//! ecosystem.json --env production`). A command that starts with its interpreter, or
//! one placed after `--`, keeps `docker run`'s reading.

/// `argv` (drover's whole command line) rearranged for a second parse: the words after
/// the script up to a `--` move before the program as drover's flags, and the words
/// after that `--` become the script's arguments. `None` when the command is taken as
/// written. `command` is what the first parse took as the program and its arguments,
/// the tail of `argv`.
pub fn rearranged(argv: &[String], command: &[String]) -> Option<Rearranged> {
    let (script, words) = command.split_first()?;
    let before = argv.len().checked_sub(command.len())?;
    if argv[before..] != *command || before == 0 || argv[before - 1] == "--" || words.is_empty() {
        return None;
    }
    // `pm2 start app.js --cwd /srv/api`: the script is where the app runs.
    let cwd = pm2_cwd(words);
    let named_alone = drover_supervisor::with_interpreter(command, cwd.as_deref()).len()
        != command.len()
        || crate::ecosystem::is_ecosystem_file(script)
        || command_string(std::slice::from_ref(script)).is_some();
    let dash = words.iter().position(|w| w == "--");
    // `pm2 start npm --name api -- start`: a program, then PM2's flags up to a `--`,
    // then the program's words. Tried where the word after the program is a flag and
    // a `--` follows; where those are not all drover's, the command is the program's,
    // as `docker run` takes it (`drover run node --inspect -- app.js`).
    let program_then_flags = dash.is_some_and(|at| at > 0) && words[0].starts_with('-');
    if !named_alone && !program_then_flags {
        return None;
    }
    let (flags, app_args) = match dash {
        Some(at) => (&words[..at], &words[at + 1..]),
        None => (words, &[][..]),
    };
    let (flags, pm2) = pm2_flags(flags);
    let mut again = argv[..before].to_vec();
    again.extend_from_slice(&flags);
    again.push("--".into());
    again.push(script.clone());
    again.extend_from_slice(app_args);
    let mut command = vec![script.clone()];
    command.extend_from_slice(app_args);
    Some(Rearranged {
        argv: again,
        command,
        flags,
        pm2,
        strict: named_alone,
    })
}

/// The directory PM2's `--cwd DIR` (or `--cwd=DIR`) names among `words`, the words
/// after a script, before any `--`.
fn pm2_cwd(words: &[String]) -> Option<std::path::PathBuf> {
    let flags = words.split(|w| w == "--").next().unwrap_or_default();
    flags
        .iter()
        .enumerate()
        .find_map(|(i, w)| match w.strip_prefix("--cwd") {
            Some("") => flags.get(i + 1).map(Into::into),
            Some(rest) => rest.strip_prefix('=').map(Into::into),
            None => None,
        })
}

/// One of PM2's own flags on a `drover run` line, where drover has no flag of that
/// name (`--kill-timeout 3000`, `--time`, `--watch`). PM2 reads each into a key of the
/// app it starts, the key an ecosystem file would set, and drover takes it as that key
/// (`crate::ecosystem::apply_pm2_flags`): applied, or named in a note saying why not.
#[derive(Debug, Clone, PartialEq)]
pub struct Pm2Flag {
    /// As written (`--kill-timeout 3000`), for notes and errors.
    pub written: String,
    /// The ecosystem key it sets (`kill_timeout`); empty for a flag that concerns
    /// only PM2's command-line tool (`--force`, `--no-daemon`).
    pub key: &'static str,
    pub value: serde_json::Value,
}

/// What a PM2 flag takes after it.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Takes {
    Value,
    /// A value if the next word is not a flag (`--watch [paths]`).
    MaybeValue,
    /// Nothing: the key is `true`.
    On,
    /// Nothing: a `--no-KEY` flag, the key is `false`.
    Off,
}

/// `pm2 start`'s flags (lib/binaries/CLI.js) that drover has none of its own for, with
/// the ecosystem key each sets. Short forms only where the letter is not drover's
/// (PM2's `-s`, `-m`, `-w` and `-c` mean drover's strategy, mode, workers and config;
/// `-l` is PM2's log file only where no address follows it, see `pm2_flags`). `--name`/`-n`, `-i`, `--env`, `--only`, `--max-memory-restart` and
/// `--wait-ready` are drover's flags too, and mean the same.
const PM2_FLAGS: [(&str, Option<char>, &str, Takes); 56] = [
    ("kill-timeout", Some('k'), "kill_timeout", Takes::Value),
    ("listen-timeout", None, "listen_timeout", Takes::Value),
    ("node-args", None, "node_args", Takes::Value),
    ("interpreter-args", None, "node_args", Takes::Value),
    ("interpreter", None, "exec_interpreter", Takes::Value),
    ("cwd", None, "cwd", Takes::Value),
    ("output", Some('o'), "out_file", Takes::Value),
    ("error", Some('e'), "error_file", Takes::Value),
    ("log", None, "log_file", Takes::MaybeValue),
    ("pid", Some('p'), "pid_file", Takes::Value),
    ("time", None, "time", Takes::On),
    ("log-date-format", None, "log_date_format", Takes::Value),
    ("log-type", None, "log_type", Takes::Value),
    ("merge-logs", None, "merge_logs", Takes::On),
    ("disable-logs", None, "disable_logs", Takes::On),
    ("watch", None, "watch", Takes::MaybeValue),
    ("ignore-watch", None, "ignore_watch", Takes::Value),
    ("watch-delay", None, "watch_delay", Takes::Value),
    ("ext", None, "watch_options", Takes::Value),
    ("no-autorestart", None, "autorestart", Takes::Off),
    ("max-restarts", None, "max_restarts", Takes::MaybeValue),
    ("restart-delay", None, "restart_delay", Takes::Value),
    (
        "exp-backoff-restart-delay",
        None,
        "exp_backoff_restart_delay",
        Takes::Value,
    ),
    ("cron", None, "cron_restart", Takes::Value),
    ("cron-restart", None, "cron_restart", Takes::Value),
    ("stop-exit-codes", None, "stop_exit_codes", Takes::Value),
    ("no-treekill", None, "treekill", Takes::Off),
    (
        "shutdown-with-message",
        None,
        "shutdown_with_message",
        Takes::On,
    ),
    ("uid", None, "uid", Takes::Value),
    ("user", Some('u'), "uid", Takes::Value),
    ("gid", None, "gid", Takes::Value),
    ("namespace", None, "namespace", Takes::Value),
    ("source-map-support", None, "source_map_support", Takes::On),
    (
        "disable-source-map-support",
        None,
        "disable_source_map_support",
        Takes::On,
    ),
    ("filter-env", None, "filter_env", Takes::MaybeValue),
    ("execute-command", Some('x'), "execute_command", Takes::On),
    ("no-pmx", None, "pmx", Takes::Off),
    ("no-vizion", None, "vizion", Takes::Off),
    ("no-automation", None, "automation", Takes::Off),
    ("no-autostart", None, "autostart", Takes::Off),
    ("trace", None, "trace", Takes::On),
    ("disable-trace", None, "disable_trace", Takes::On),
    ("v8", None, "v8", Takes::On),
    (
        "event-loop-inspector",
        None,
        "event_loop_inspector",
        Takes::On,
    ),
    ("deep-monitoring", None, "deep_monitoring", Takes::On),
    ("update-env", Some('a'), "", Takes::On),
    ("force", Some('f'), "", Takes::On),
    ("silent", None, "", Takes::On),
    ("no-daemon", None, "", Takes::On),
    ("no-color", None, "", Takes::On),
    ("attach", None, "", Takes::On),
    ("mini-list", None, "", Takes::On),
    ("parallel", None, "", Takes::Value),
    ("wait-ip", None, "", Takes::On),
    ("hp", None, "", Takes::Value),
    ("service-name", None, "", Takes::Value),
];

/// `flags` without PM2's own flags (and their values), and those flags as keys.
fn pm2_flags(flags: &[String]) -> (Vec<String>, Vec<Pm2Flag>) {
    let (mut kept, mut pm2) = (Vec::new(), Vec::new());
    let mut words = flags.iter().peekable();
    while let Some(word) = words.next() {
        let (name, inline) = match word.split_once('=') {
            Some((name, value)) if word.starts_with("--") => (name, Some(value)),
            _ => (word.as_str(), None),
        };
        // PM2's `-l [path]` (its log file) is drover's `-l ADDR`: one followed by no
        // address is PM2's. A word with a `:` is meant as an address (`localhost:3000`
        // gets drover's error naming what --listen takes), never a log file.
        let an_address = |w: &&String| w.contains(':');
        if word == "-l" && !words.peek().is_some_and(an_address) {
            let (written, value) = match words.next_if(|w| !w.starts_with('-')) {
                Some(path) => (format!("-l {path}"), path.as_str().into()),
                None => ("-l".to_string(), true.into()),
            };
            pm2.push(Pm2Flag {
                written,
                key: "log_file",
                value,
            });
            continue;
        }
        let known = PM2_FLAGS.iter().find(|(long, short, _, _)| {
            name.strip_prefix("--") == Some(long)
                || short.is_some_and(|c| name.len() == 2 && name == format!("-{c}"))
        });
        let Some(&(_, _, key, takes)) = known else {
            kept.push(word.clone());
            continue;
        };
        let next_is_value = words.peek().is_some_and(|w| !w.starts_with('-'));
        let (written, value) = match (takes, inline) {
            (Takes::Value | Takes::MaybeValue, Some(v)) => (word.clone(), v.into()),
            (Takes::Value, None) | (Takes::MaybeValue, None) if next_is_value => {
                let v = words.next().cloned().unwrap_or_default();
                (format!("{word} {v}"), v.into())
            }
            (Takes::Value, None) => (word.clone(), serde_json::Value::Null),
            (Takes::MaybeValue | Takes::On, _) => (word.clone(), true.into()),
            (Takes::Off, _) => (word.clone(), false.into()),
        };
        pm2.push(Pm2Flag {
            written,
            key,
            value,
        });
    }
    (kept, pm2)
}

/// `pm2 start "npm run dev"`: a command given as one word with white space in it (and
/// no file of that name), as PM2 takes it. Plain words run directly, split at white
/// space (so a runner such as npm is still seen as one); a line with shell syntax
/// (quotes, `&&`, `|`, `$VAR`, a redirection) runs under `bash -c`, as PM2 runs it, or
/// `sh -c` where there is no bash. `None` for any other command.
pub fn command_string(command: &[String]) -> Option<Vec<String>> {
    let [line] = command else {
        return None;
    };
    if !line.trim().contains(char::is_whitespace) || std::path::Path::new(line).exists() {
        return None;
    }
    const SHELL: &str = "|&;<>()$`\\\"'*?[]{}~#!=";
    if line.contains(|c| SHELL.contains(c)) {
        let shell = if std::path::Path::new("/bin/bash").exists() {
            "bash"
        } else {
            "sh"
        };
        return Some(vec![shell.into(), "-c".into(), line.clone()]);
    }
    Some(line.split_whitespace().map(String::from).collect())
}

/// A command line in PM2's order, to be parsed again.
#[derive(Debug, Clone, PartialEq)]
pub struct Rearranged {
    pub argv: Vec<String>,
    /// What the second parse must take as the program and its arguments.
    pub command: Vec<String>,
    /// The words read as drover's flags.
    pub flags: Vec<String>,
    /// PM2's own flags among the words, taken out of `flags`.
    pub pm2: Vec<Pm2Flag>,
    /// The program is a script named alone (or an ecosystem file, or a command line in
    /// one word): words that are not drover's flags are refused. Otherwise (a program
    /// with flags and a `--` after it) such words keep `docker run`'s reading.
    pub strict: bool,
}

impl Rearranged {
    /// Why the words after the script are not all drover's flags: `reason` is the
    /// parser's, `stray` the first word it did not take (an unknown flag, or a word
    /// that no flag takes as its value). From that word on, the words are most likely
    /// the app's, so the message shows the two ways to give them to it.
    pub fn refused(&self, reason: &str, stray: Option<&str>) -> String {
        let script = &self.command[0];
        let words = self.flags.join(" ");
        let read_as = format!(
            "`{words}` after {script}: drover reads the words that follow a script named \
             alone, up to a `--`, as its own flags, as `pm2 start {script} -i 4` does"
        );
        let at = stray.and_then(|stray| {
            self.flags
                .iter()
                .position(|w| w == stray || w.starts_with(&format!("{stray}=")))
        });
        let Some(at) = at else {
            return format!("{read_as}: {reason}");
        };
        let ours: String = self.flags[..at].iter().map(|w| format!(" {w}")).collect();
        let theirs = self.flags[at..].join(" ");
        let interpreter = drover_supervisor::with_interpreter(&self.command, None)
            .first()
            .cloned()
            .unwrap_or_default();
        format!(
            "{read_as}, and `{stray}` is not one ({reason}). Give the app its arguments \
             after `--` (drover run {script}{ours} -- {theirs}), or name its interpreter \
             first, and every word after it is the app's, as `docker run` takes a command \
             (drover run{ours} {interpreter} {script} {theirs})",
            stray = self.flags[at],
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    /// A script in a temporary directory, named by its full path without an execute
    /// bit (so it gets an interpreter); returns the directory, removed when dropped.
    fn script(name: &str) -> (tempfile::TempDir, String) {
        let dir = tempfile::Builder::new()
            .prefix(&format!("drover-pm2-order-{name}-"))
            .tempdir()
            .unwrap();
        let path = dir.path().join(name);
        std::fs::write(&path, "").unwrap();
        (dir, path.to_string_lossy().into_owned())
    }

    #[test]
    fn flags_after_a_script_are_drovers_and_words_after_a_double_dash_the_apps() {
        let (_dir, app) = script("app.js");
        let argv = words(&format!(
            "drover run -l 127.0.0.1:0 {app} -i 4 -- --port 3000"
        ));
        let command = argv[4..].to_vec();
        let r = rearranged(&argv, &command).unwrap();
        assert_eq!(
            r.argv,
            words(&format!(
                "drover run -l 127.0.0.1:0 -i 4 -- {app} --port 3000"
            ))
        );
        assert_eq!(r.command, words(&format!("{app} --port 3000")));
        assert_eq!(r.flags, words("-i 4"));
        // Only arguments for the app: the `--` itself is not the app's.
        let argv = words(&format!("drover run {app} -- 8080"));
        let r = rearranged(&argv, &argv[2..]).unwrap();
        assert_eq!(r.argv, words(&format!("drover run -- {app} 8080")));
        assert!(r.flags.is_empty());
    }

    /// `pm2 start app.js --cwd /srv/api -i 2`: the script is found under `--cwd`, as
    /// PM2 finds it. Before, drover looked for it in its own directory, took the words
    /// as a program's (`app.js --cwd ... -i 2`) and ran that.
    #[test]
    fn a_script_that_is_only_under_its_cwd_is_named_alone_too() {
        let (dir, _) = script("only-there.js");
        let dir = dir.path().display().to_string();
        for line in [
            format!("drover run only-there.js --cwd {dir} -i 2"),
            format!("drover run only-there.js -i 2 --cwd={dir}"),
        ] {
            let argv = words(&line);
            let r = rearranged(&argv, &argv[2..]).expect(&line);
            assert_eq!(r.command, words("only-there.js"), "{line}");
            assert!(r.strict, "{line}");
        }
        // Not a script under that directory either: the words stay the program's.
        let argv = words(&format!("drover run elsewhere.js --cwd {dir} -i 2"));
        assert_eq!(rearranged(&argv, &argv[2..]), None);
    }

    #[test]
    fn a_command_with_its_interpreter_or_after_a_double_dash_is_taken_as_written() {
        let (_dir, app) = script("server.js");
        for line in [
            format!("drover run node {app} -w 4"),
            format!("drover run -w 2 -- {app} -w 4"),
            format!("drover run -w 2 {app}"),
            "drover run no-such-script.js -w 4".to_string(),
        ] {
            let argv = words(&line);
            let at = argv
                .iter()
                .position(|w| w == "node" || w.ends_with(".js"))
                .unwrap();
            assert_eq!(rearranged(&argv, &argv[at..]), None, "{line}");
        }
    }

    #[test]
    fn a_program_with_flags_and_a_double_dash_is_tried_in_pm2s_order() {
        let argv = words("drover run npm --name api -i 2 -- start");
        let r = rearranged(&argv, &argv[2..]).unwrap();
        assert_eq!(r.argv, words("drover run --name api -i 2 -- npm start"));
        assert_eq!(r.command, words("npm start"));
        assert!(!r.strict);
        for line in [
            "drover run npm run build -- --watch",
            "drover run npm start",
            "drover run node --inspect app.js",
            "drover run -- npm --name api -- start",
        ] {
            let argv = words(line);
            let at = argv.iter().position(|w| w == "npm" || w == "node").unwrap();
            assert_eq!(rearranged(&argv, &argv[at..]), None, "{line}");
        }
    }

    #[test]
    fn pm2s_own_flags_are_taken_out_with_their_values() {
        let (_dir, app) = script("app.js");
        let argv = words(&format!(
            "drover run {app} -i 2 -k 3000 --node-args=--inspect --time -n api --watch --no-autorestart -o out.log --log -- --port 3000"
        ));
        let r = rearranged(&argv, &argv[2..]).unwrap();
        assert_eq!(
            r.argv,
            words(&format!("drover run -i 2 -n api -- {app} --port 3000"))
        );
        assert_eq!(r.flags, words("-i 2 -n api"));
        let got: Vec<(&str, &str, serde_json::Value)> = r
            .pm2
            .iter()
            .map(|f| (f.written.as_str(), f.key, f.value.clone()))
            .collect();
        assert_eq!(
            got,
            [
                ("-k 3000", "kill_timeout", "3000".into()),
                ("--node-args=--inspect", "node_args", "--inspect".into()),
                ("--time", "time", true.into()),
                ("--watch", "watch", true.into()),
                ("--no-autorestart", "autorestart", false.into()),
                ("-o out.log", "out_file", "out.log".into()),
                ("--log", "log_file", true.into()),
            ]
        );
        // PM2's -l (its log file) where no address follows; drover's -l where one does.
        let argv = words(&format!(
            "drover run {app} -l app.log -l 127.0.0.1:0 -i 2 -l"
        ));
        let r = rearranged(&argv, &argv[2..]).unwrap();
        assert_eq!(r.flags, words("-l 127.0.0.1:0 -i 2"));
        let logs: Vec<(&str, serde_json::Value)> = r
            .pm2
            .iter()
            .map(|f| (f.written.as_str(), f.value.clone()))
            .collect();
        assert_eq!(
            logs,
            [("-l app.log", "app.log".into()), ("-l", true.into())]
        );
        assert!(r.pm2.iter().all(|f| f.key == "log_file"));
        let argv = words(&format!("drover run {app} -l localhost:3000"));
        let r = rearranged(&argv, &argv[2..]).unwrap();
        assert_eq!(r.flags, words("-l localhost:3000"));
        assert!(r.pm2.is_empty());
        // A flag that needs a value and has none keeps a null, which is refused later.
        let argv = words(&format!("drover run {app} --kill-timeout -i 2"));
        let r = rearranged(&argv, &argv[2..]).unwrap();
        assert_eq!(r.pm2[0].value, serde_json::Value::Null);
        assert_eq!(r.flags, words("-i 2"));
    }

    /// Every option of `pm2 start` (lib/binaries/CLI.js) that is not drover's too is
    /// taken as PM2's: none is left for drover to refuse as unknown.
    #[test]
    fn every_option_of_pm2_start_is_known() {
        let (_dir, app) = script("app.js");
        let options = "--ext js --interpreter node --interpreter-args x --node-args x -o a -e b \
            --filter-env API_ --log-type json --log-date-format x --time --disable-logs -a -f \
            --parallel 2 --shutdown-with-message -p x -k 1 --listen-timeout 1 --restart-delay 1 \
            --exp-backoff-restart-delay 1 -x --max-restarts 1 -u root --user root --uid 0 \
            --gid 0 --namespace n --hp /root --wait-ip --service-name s --cron c \
            --cron-restart c --no-daemon --source-map-support --disable-source-map-support \
            --merge-logs --watch --ignore-watch x --watch-delay 1 --no-color --no-vizion \
            --no-autostart --no-autorestart --stop-exit-codes 0 --no-treekill --no-pmx \
            --no-automation --trace --disable-trace --attach --v8 --event-loop-inspector \
            --deep-monitoring --silent --mini-list --log";
        let argv = words(&format!("drover run {app} {options}"));
        let r = rearranged(&argv, &argv[2..]).unwrap();
        assert!(r.flags.is_empty(), "left for drover: {:?}", r.flags);
        assert_eq!(r.pm2.len(), 56);
    }

    #[test]
    fn a_command_line_in_one_word_runs_as_pm2_runs_it() {
        let one = |s: &str| command_string(&[s.to_string()]);
        assert_eq!(one("npm run dev"), Some(words("npm run dev")));
        assert_eq!(one("  node  app.js 3000 "), Some(words("node app.js 3000")));
        let shell = one("cd api && node app.js").unwrap();
        assert_eq!(
            shell[1..],
            ["-c".to_string(), "cd api && node app.js".into()]
        );
        assert!(shell[0] == "bash" || shell[0] == "sh");
        assert_eq!(one("PORT=3 node app.js").unwrap()[1], "-c");
        assert_eq!(one("app.js"), None);
        assert_eq!(command_string(&words("npm run dev")), None);
        let (_dir, spaced) = script("my app.js");
        assert_eq!(one(&spaced), None);
        let argv = vec![
            "drover".to_string(),
            "run".into(),
            "npm start".into(),
            "-i".into(),
            "2".into(),
        ];
        let r = rearranged(&argv, &argv[2..]).unwrap();
        assert_eq!(r.command, ["npm start"]);
        assert_eq!(r.flags, words("-i 2"));
        assert!(r.strict);
    }

    #[test]
    fn a_refusal_names_the_word_and_both_ways_to_give_the_rest_to_the_app() {
        let (_dir, app) = script("api.py");
        let argv = words(&format!("drover run {app} -i 2 --port=3000 -v"));
        let r = rearranged(&argv, &argv[2..]).unwrap();
        let message = r.refused("unexpected argument '--port' found", Some("--port"));
        assert!(
            message.starts_with("`-i 2 --port=3000 -v` after "),
            "{message}"
        );
        assert!(message.contains("`--port=3000` is not one"), "{message}");
        assert!(
            message.contains(&format!("drover run {app} -i 2 -- --port=3000 -v")),
            "{message}"
        );
        assert!(
            message.contains(&format!("drover run -i 2 python3 {app} --port=3000 -v")),
            "{message}"
        );
        // A bad value of drover's own flag: only the reason, no word is the app's.
        let message = r.refused("invalid value 'x' for '--workers'", Some("x"));
        assert!(
            message.ends_with(": invalid value 'x' for '--workers'"),
            "{message}"
        );
    }
}
