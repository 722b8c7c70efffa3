//! What a `node` command line asks of Node before its script: the options drover acts
//! on (an inspector per worker, `--watch`).

/// Options of `node` that take the next word as their value, so that word is not the
/// script: the ones seen before a script in practice.
const TAKES_A_VALUE: [&str; 11] = [
    "-r",
    "--require",
    "--import",
    "--loader",
    "--experimental-loader",
    "--env-file",
    "--title",
    "-C",
    "--conditions",
    "--input-type",
    "--watch-path",
];

/// The options of `command` before its script, each with its index in `command`, when
/// the program is Node itself (`node`, Debian's `nodejs`); `None` for any other program.
pub(crate) fn options_before_script(command: &[String]) -> Option<Vec<(usize, &str)>> {
    let (program, args) = command.split_first()?;
    if !crate::launch::is_node_itself(program) {
        return None;
    }
    let mut options = Vec::new();
    let mut value_next = false;
    for (i, arg) in args.iter().enumerate() {
        if value_next {
            value_next = false;
            continue;
        }
        if arg == "--" || !arg.starts_with('-') {
            break;
        }
        value_next = !arg.contains('=') && TAKES_A_VALUE.contains(&arg.as_str());
        options.push((i + 1, arg.as_str()));
    }
    Some(options)
}

/// The option of a `node` command that turns on Node's watch mode (`--watch`,
/// `--watch-path=DIR`), if any: Node then runs the app in a child process of its own
/// and restarts it on a change, and that child is no cluster worker of drover's.
pub fn watch_mode_option(command: &[String]) -> Option<String> {
    options_before_script(command)?
        .into_iter()
        .map(|(_, option)| option)
        .find(|option| {
            let name = option.split_once('=').map_or(*option, |(name, _)| name);
            name == "--watch" || name == "--watch-path"
        })
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(line: &str) -> Vec<String> {
        line.split(' ').map(String::from).collect()
    }

    #[test]
    fn options_end_at_the_script_and_skip_the_values_they_take() {
        let options = |line: &str| {
            options_before_script(&words(line)).map(|o| {
                o.into_iter()
                    .map(|(i, o)| format!("{i}:{o}"))
                    .collect::<Vec<_>>()
            })
        };
        assert_eq!(
            options("node -r dotenv/config --inspect app.js --x").unwrap(),
            ["1:-r", "3:--inspect"]
        );
        assert_eq!(
            options("/usr/bin/nodejs app.js --inspect").unwrap(),
            Vec::<String>::new()
        );
        assert_eq!(
            options("node --require=a.js -- --inspect").unwrap(),
            ["1:--require=a.js"]
        );
        assert_eq!(options("npm start"), None);
    }

    #[test]
    fn watch_mode_is_found_before_the_script_only() {
        let watch = |line: &str| watch_mode_option(&words(line));
        assert_eq!(watch("node --watch app.js").as_deref(), Some("--watch"));
        assert_eq!(
            watch("node --env-file .env --watch-path=src app.js").as_deref(),
            Some("--watch-path=src")
        );
        assert_eq!(
            watch("node --watch-path src app.js").as_deref(),
            Some("--watch-path")
        );
        for line in [
            "node app.js --watch",
            "node --watch-preserve-output app.js",
            "npm run dev",
        ] {
            assert_eq!(watch(line), None, "{line}");
        }
    }
}
