//! Docs that tests keep true: every `drover …` command line in a `sh` block of the
//! repository's markdown names a subcommand that exists and only flags that subcommand
//! has (checked against its `--help`, which clap writes from the definitions).

mod common;

use common::bin;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn markdown_files(dir: &Path, found: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().to_string();
        if path.is_dir() {
            if !name.starts_with('.') && !["target", "node_modules"].contains(&name.as_str()) {
                markdown_files(&path, found);
            }
        } else if name.ends_with(".md") {
            found.push(path);
        }
    }
}

/// The command lines of `sh` blocks that run `drover` (continuations joined, comments,
/// environment assignments and what follows a pipe or `&&` dropped): each as its line
/// number and its words.
fn drover_commands(text: &str) -> Vec<(usize, Vec<String>)> {
    let mut commands = Vec::new();
    let mut in_sh = false;
    let mut pending: Option<(usize, String)> = None;
    for (i, line) in text.lines().enumerate() {
        let fence = line.trim_start();
        if let Some(info) = fence.strip_prefix("```") {
            in_sh = !in_sh && matches!(info.trim(), "sh" | "bash" | "shell");
            continue;
        }
        if !in_sh {
            continue;
        }
        let code = line.split(" #").next().unwrap_or("").trim_end();
        let (start, mut joined) = pending.take().unwrap_or((i + 1, String::new()));
        joined.push(' ');
        match code.strip_suffix('\\') {
            Some(head) => {
                joined.push_str(head);
                pending = Some((start, joined));
                continue;
            }
            None => joined.push_str(code),
        }
        for part in joined.split(['|', ';']).flat_map(|p| p.split("&&")) {
            let words: Vec<&str> = part
                .split_whitespace()
                .skip_while(|w| w.contains('=') && !w.starts_with('-'))
                .collect();
            if words.first() == Some(&"drover") {
                commands.push((start, words[1..].iter().map(|w| w.to_string()).collect()));
            }
        }
    }
    commands
}

/// `drover PATH… --help`, cached.
fn help<'a>(
    cache: &'a mut HashMap<Vec<String>, Option<String>>,
    path: &[String],
) -> Option<&'a str> {
    cache
        .entry(path.to_vec())
        .or_insert_with(|| {
            let out = Command::new(bin()).args(path).arg("--help").output().ok()?;
            out.status
                .success()
                .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
        })
        .as_deref()
}

/// The subcommands a help text lists under "Commands:".
fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .filter(|c| c != "help")
        .collect()
}

/// Whether `help` documents `flag`: `--name` (or a visible alias, which clap lists as
/// `[aliases: --name]`), or `-x`. A word that is not a flag is an argument.
fn names_flag(help: &str, flag: &str) -> bool {
    if flag.starts_with("--") {
        [" ", "\n", "=", ",", "]"]
            .iter()
            .any(|end| help.contains(&format!("{flag}{end}")))
    } else if flag.len() == 2 && flag.starts_with('-') {
        help.contains(&format!("{flag}, "))
    } else {
        true
    }
}

#[test]
fn every_documented_drover_command_names_real_subcommands_and_flags() {
    let root = root();
    let mut files = Vec::new();
    markdown_files(&root, &mut files);
    files.sort();
    let mut cache = HashMap::new();
    let (mut checked, mut wrong) = (0, Vec::new());
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        let name = file
            .strip_prefix(&root)
            .unwrap_or(file)
            .display()
            .to_string();
        for (line, words) in drover_commands(&text) {
            checked += 1;
            let mut path: Vec<String> = Vec::new();
            let mut rest = words.as_slice();
            while let Some((word, after)) = rest.split_first() {
                let Some(top) = help(&mut cache, &path) else {
                    break;
                };
                if !subcommands(top).contains(word) {
                    break;
                }
                path.push(word.clone());
                rest = after;
            }
            if path.is_empty() {
                wrong.push(format!(
                    "{name}:{line}: `drover {}`: no such subcommand",
                    words.join(" ")
                ));
                continue;
            }
            let own_help = help(&mut cache, &path).unwrap_or_default().to_string();
            let needs_subcommand = own_help
                .lines()
                .find(|l| l.starts_with("Usage:"))
                .is_some_and(|l| l.trim_end().ends_with("<COMMAND>"));
            if needs_subcommand {
                wrong.push(format!(
                    "{name}:{line}: `drover {}`: `drover {}` has no subcommand {:?}",
                    words.join(" "),
                    path.join(" "),
                    rest.first().map_or("", String::as_str)
                ));
                continue;
            }
            // Up to `--`: after it come the worker's program and its own arguments.
            for word in rest.iter().take_while(|w| *w != "--") {
                let flag = word.split('=').next().unwrap_or(word);
                let known = names_flag(&own_help, flag);
                if !known {
                    wrong.push(format!(
                        "{name}:{line}: `drover {}`: {flag} is not a flag of `drover {}`",
                        words.join(" "),
                        path.join(" ")
                    ));
                }
            }
        }
    }
    assert!(checked > 10, "only {checked} drover command lines found");
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn command_lines_are_read_as_a_shell_would_split_them() {
    let text = "x\n```sh\nDROVER_LOG=info drover run -w 2 \\\n  --mode proxy -- node a.js   # c\ncurl x | drover bench -n 5 URL\n```\n```text\ndrover nothing\n```\n";
    let words = |s: &str| s.split(' ').map(str::to_string).collect::<Vec<_>>();
    assert_eq!(
        drover_commands(text),
        vec![
            (3, words("run -w 2 --mode proxy -- node a.js")),
            (5, words("bench -n 5 URL")),
        ]
    );
}
