//! Docs that tests keep true, over every markdown file of the repository:
//! - every `toml` block loads as a drover.toml, as written (a block whose info string
//!   says `toml fragment` is part of one, shown alone, and is not loaded), and so does
//!   the repository's own drover.toml;
//! - every relative link and `#anchor` resolves;
//! - every `drover …` command line of a `sh` block names subcommands that exist and
//!   only flags that its `--help` lists (clap writes it from the definitions);
//! - every documented `drover ctl …` line runs, as written, against a running drover;
//! - the README's drover.toml reference names every key the loader accepts;
//! - the README's Layout names every crate of the workspace.

mod common;

use common::{app_config, bin, port_worker, temp_dir, up_serving};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// One markdown file: its path from the repository's root, and its text.
struct Doc {
    name: String,
    path: PathBuf,
    text: String,
}

/// Every markdown file of the repository, skipping build output, dependencies and
/// VCS data.
fn docs() -> Vec<Doc> {
    fn walk(dir: &Path, found: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().to_string();
            if path.is_dir() {
                if !name.starts_with('.') && !["target", "node_modules"].contains(&name.as_str()) {
                    walk(&path, found);
                }
            } else if name.ends_with(".md") {
                found.push(path);
            }
        }
    }
    let root = root();
    let mut paths = Vec::new();
    walk(&root, &mut paths);
    paths.sort();
    paths
        .into_iter()
        .map(|path| Doc {
            name: path
                .strip_prefix(&root)
                .unwrap_or(&path)
                .display()
                .to_string(),
            text: std::fs::read_to_string(&path).unwrap(),
            path,
        })
        .collect()
}

/// A line of markdown, with the fenced block it sits in.
struct Line<'a> {
    number: usize,
    /// The block's fence line number and info string (`toml`, `sh`, `toml fragment`);
    /// `None` outside blocks. Fence lines themselves are left out.
    block: Option<(usize, &'a str)>,
    text: &'a str,
}

fn lines(text: &str) -> Vec<Line<'_>> {
    let mut out = Vec::new();
    let mut block = None;
    for (i, text) in text.lines().enumerate() {
        if let Some(info) = text.trim_start().strip_prefix("```") {
            block = match block {
                None => Some((i + 1, info.trim())),
                Some(_) => None,
            };
            continue;
        }
        out.push(Line {
            number: i + 1,
            block,
            text,
        });
    }
    out
}

/// A fenced block of markdown: the line its fence opens on, its info string and its
/// content.
#[derive(Debug, PartialEq)]
struct Block {
    line: usize,
    info: String,
    body: String,
}

/// Every fenced `toml` block of `text`.
fn toml_blocks(text: &str) -> Vec<Block> {
    let mut blocks: Vec<Block> = Vec::new();
    for line in lines(text) {
        let Some((start, info)) = line.block else {
            continue;
        };
        if info.split_whitespace().next() != Some("toml") {
            continue;
        }
        if blocks.last().is_none_or(|b| b.line != start) {
            blocks.push(Block {
                line: start,
                info: info.to_string(),
                body: String::new(),
            });
        }
        let body = &mut blocks.last_mut().unwrap().body;
        body.push_str(line.text);
        body.push('\n');
    }
    blocks
}

/// GitHub's anchor for a heading: lower case, punctuation dropped (but `-` and `_`),
/// spaces to `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a markdown text's headings (outside fenced blocks), with GitHub's
/// `-1`, `-2` … for repeated ones.
fn anchors(text: &str) -> Vec<String> {
    let mut seen: Vec<String> = Vec::new();
    for line in lines(text).into_iter().filter(|l| l.block.is_none()) {
        let Some(heading) = line.text.strip_prefix('#') else {
            continue;
        };
        let heading = heading.trim_start_matches('#');
        if !heading.starts_with(' ') {
            continue;
        }
        let base = slug(&heading.replace('`', ""));
        let mut anchor = base.clone();
        let mut n = 0;
        while seen.contains(&anchor) {
            n += 1;
            anchor = format!("{base}-{n}");
        }
        seen.push(anchor);
    }
    seen
}

/// The targets of inline links `[text](target)` outside fenced blocks and code spans.
fn link_targets(text: &str) -> Vec<(usize, String)> {
    let mut targets = Vec::new();
    for line in lines(text).into_iter().filter(|l| l.block.is_none()) {
        // Code spans hold examples, not links.
        let outside_code: String = line
            .text
            .split('`')
            .step_by(2)
            .collect::<Vec<_>>()
            .join(" ");
        let mut rest = outside_code.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else {
                break;
            };
            let target = after[..end].split_whitespace().next().unwrap_or("");
            targets.push((line.number, target.to_string()));
            rest = &after[end..];
        }
    }
    targets
}

/// The command lines of `sh` blocks that run `drover` (continuations joined, comments,
/// environment assignments and what follows a pipe or `&&` dropped): each as its line
/// number and its words.
fn drover_commands(text: &str) -> Vec<(usize, Vec<String>)> {
    let mut commands = Vec::new();
    let mut pending: Option<(usize, String)> = None;
    let shell = |info: &str| matches!(info, "sh" | "bash" | "shell");
    for line in lines(text) {
        if !line.block.is_some_and(|(_, info)| shell(info)) {
            continue;
        }
        let code = line.text.split(" #").next().unwrap_or("").trim_end();
        let (start, mut joined) = pending.take().unwrap_or((line.number, String::new()));
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
fn every_toml_block_in_the_docs_loads() {
    let (mut loaded, mut failures) = (0, Vec::new());
    for doc in docs() {
        for block in toml_blocks(&doc.text) {
            if block.info.split_whitespace().any(|w| w == "fragment") {
                continue;
            }
            let origin = format!(
                "{} (the toml block opening at line {})",
                doc.name, block.line
            );
            match drover_config::file::parse(&block.body, &origin) {
                Ok(_) => loaded += 1,
                Err(e) => failures.push(e.to_string()),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    assert!(loaded > 0, "no toml block in the markdown files");
}

/// A balancer with one backend; its tables are places for keys too.
const BALANCER: &str = "[[balancer]]\nlisten = \"127.0.0.1:0\"\nbackends = [\"127.0.0.1:1\"]\n";

/// Every place a key can go in a drover.toml: its key path, and a config that is valid
/// and ends inside that table, so a key added last lands there.
fn key_places() -> Vec<(&'static str, String)> {
    let app = "[[app]]\nname = \"a\"\ncommand = [\"x\"]\n";
    let mut places = vec![
        ("", String::new()),
        ("admin", "[admin]\nlisten = \"127.0.0.1:0\"\n".into()),
        ("resolver", "[resolver]\n".into()),
        (
            "etcd",
            "[etcd]\nendpoints = [\"http://127.0.0.1:2379\"]\n".into(),
        ),
        ("app", app.into()),
        ("app.health", format!("{app}[app.health]\npath = \"/\"\n")),
        ("balancer", BALANCER.into()),
    ];
    for (at, table, setting) in [
        ("balancer.timeouts", "timeouts", ""),
        ("balancer.health", "health", "path = \"/\"\n"),
        ("balancer.passive", "passive", ""),
        ("balancer.queue", "queue", ""),
        ("balancer.limits", "limits", ""),
        ("balancer.hash", "hash", ""),
        ("balancer.sticky", "sticky", ""),
        ("balancer.access_log", "access_log", ""),
        ("balancer.tls", "tls", "cert = \"a.pem\"\n"),
    ] {
        places.push((at, format!("{BALANCER}[balancer.{table}]\n{setting}")));
    }
    places
}

/// The keys the loader accepts at one place, read from its "unknown key" error
/// ("expected `a` or `b`", "expected one of `a`, `b`, …").
fn accepted_keys(config: &str) -> Vec<String> {
    let err = match drover_config::file::parse(config, "probe.toml") {
        Ok(_) => panic!("an unknown key was accepted:\n{config}"),
        Err(e) => e.to_string(),
    };
    let expected = err
        .split("expected")
        .nth(1)
        .unwrap_or_else(|| panic!("no list of expected keys in {err:?}"));
    expected
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

#[test]
fn the_readme_reference_names_every_key_the_loader_accepts() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let reference = readme
        .split("## `drover.toml`")
        .nth(1)
        .and_then(|section| toml_blocks(section).into_iter().next())
        .expect("README.md has a drover.toml section with a toml block")
        .body;
    let mut missing = Vec::new();
    for (at, config) in key_places() {
        for key in accepted_keys(&format!("{config}zz_unknown = 1\n")) {
            let named = reference
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .any(|word| word == key);
            if !named {
                missing.push(format!("{at}.{key}").trim_start_matches('.').to_string());
            }
        }
    }
    // An inline backend's keys.
    let inline = BALANCER.replace(
        "[\"127.0.0.1:1\"]",
        "[{ address = \"127.0.0.1:1\", zz_unknown = 1 }]",
    );
    for key in accepted_keys(&inline) {
        if !reference.contains(&format!("{key} =")) {
            missing.push(format!("balancer.backends[].{key}"));
        }
    }
    assert!(
        missing.is_empty(),
        "README.md's drover.toml reference does not name: {}",
        missing.join(", ")
    );
}

#[test]
fn the_readme_layout_names_every_crate() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let layout = &readme[readme.find("## Layout").expect("a Layout section")..];
    let layout = &layout[..layout.find("\n#").unwrap_or(layout.len())];
    let mut crates: Vec<String> = std::fs::read_dir(root().join("crates"))
        .unwrap()
        .flatten()
        .filter(|e| e.path().join("Cargo.toml").is_file())
        .map(|e| e.file_name().to_string_lossy().to_string())
        .collect();
    crates.sort();
    assert!(crates.len() > 10, "{crates:?}");
    for name in crates {
        assert!(
            layout.contains(&format!("crates/{name} ")),
            "README's Layout does not name crates/{name}"
        );
    }
}

#[test]
fn the_repositorys_drover_toml_loads() {
    drover_config::file::load(&root().join("drover.toml")).unwrap();
}

#[test]
fn every_link_and_anchor_in_the_docs_resolves() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for doc in docs() {
        let (name, file) = (&doc.name, &doc.path);
        for (line, target) in link_targets(&doc.text) {
            if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (path, anchor) = match target.split_once('#') {
                Some((path, anchor)) => (path, Some(anchor)),
                None => (target.as_str(), None),
            };
            let linked = if path.is_empty() {
                file.clone()
            } else {
                file.parent().unwrap().join(path)
            };
            if !linked.exists() {
                broken.push(format!("{name}:{line}: {target}: no such file"));
                continue;
            }
            if let Some(anchor) = anchor {
                let linked_text = if linked.is_file() {
                    std::fs::read_to_string(&linked).unwrap_or_default()
                } else {
                    String::new()
                };
                if !anchors(&linked_text).iter().any(|a| a == anchor) {
                    broken.push(format!(
                        "{name}:{line}: {target}: no heading with that anchor"
                    ));
                }
            }
        }
    }
    assert!(checked > 0, "no link found");
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

#[test]
fn every_documented_drover_command_names_real_subcommands_and_flags() {
    let mut cache = HashMap::new();
    let (mut checked, mut wrong) = (0, Vec::new());
    for doc in docs() {
        let name = &doc.name;
        for (line, words) in drover_commands(&doc.text) {
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

#[tokio::test]
async fn every_documented_ctl_command_runs_against_a_running_drover() {
    // One drover that each line fits: an app behind a balancer (status, restarts,
    // reload, scale), which runtime members may join (members add, heartbeat, list,
    // drain). The lines run in the order the docs give them, as a reader would.
    let worker = port_worker(&temp_dir("docs-ctl-worker"));
    let toml = app_config(&worker, "\"app:web\"", "");
    let (drover, admin, _) = up_serving("docs-ctl", &toml).await;
    let (mut ran, mut failed) = (0, Vec::new());
    for doc in docs() {
        for (line, words) in drover_commands(&doc.text) {
            if words.first().map(String::as_str) != Some("ctl") {
                continue;
            }
            ran += 1;
            let out = tokio::process::Command::new(bin())
                .arg("ctl")
                .args(&words[1..])
                .env("DROVER_ADMIN", admin.to_string())
                .output()
                .await
                .unwrap();
            if !out.status.success() {
                failed.push(format!(
                    "{}:{line}: `drover {}` exited with {}: {}",
                    doc.name,
                    words.join(" "),
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
        }
    }
    drop(drover);
    assert!(ran >= 5, "only {ran} drover ctl lines found");
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

#[test]
fn blocks_are_found_with_their_lines() {
    let text = "a\n```toml\nx = 1\n```\n```sh\n[not toml\n```\n```toml fragment\ny = 2\n```\n";
    let block = |line, info: &str, body: &str| Block {
        line,
        info: info.into(),
        body: body.into(),
    };
    assert_eq!(
        toml_blocks(text),
        vec![
            block(2, "toml", "x = 1\n"),
            block(8, "toml fragment", "y = 2\n")
        ]
    );
}

#[test]
fn anchors_are_githubs() {
    assert_eq!(
        anchors("# drover\n## `drover run`\n```\n# not a heading\n```\n### Busy or hung: health checks under load\n## drover run\n"),
        vec!["drover", "drover-run", "busy-or-hung-health-checks-under-load", "drover-run-1"]
    );
    assert_eq!(
        link_targets("see [a](b.md#c) and `[x](y)` and [d](#e)"),
        vec![(1, "b.md#c".to_string()), (1, "#e".to_string())]
    );
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
