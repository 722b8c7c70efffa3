//! Docs that tests keep true: every `toml` block in the repository's markdown loads as a
//! drover.toml, as written (a block whose info string says `toml fragment` is part of
//! one, shown alone, and is not loaded), and so does the repository's own drover.toml.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Markdown files under `dir`, skipping build output, dependencies and VCS data.
fn markdown_files(dir: &Path, found: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().to_string();
        if path.is_dir() {
            let skipped =
                name.starts_with('.') || ["target", "node_modules"].contains(&name.as_str());
            if !skipped {
                markdown_files(&path, found);
            }
        } else if name.ends_with(".md") {
            found.push(path);
        }
    }
}

/// A fenced block of markdown: the line its fence opens on, its info string (`toml`,
/// `toml fragment`) and its content.
#[derive(Debug, PartialEq)]
struct Block {
    line: usize,
    info: String,
    body: String,
}

/// Every fenced `toml` block of `text`.
fn toml_blocks(text: &str) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut open: Option<Block> = None;
    for (i, line) in text.lines().enumerate() {
        let fence = line.trim_start();
        match open.take() {
            None => {
                if let Some(info) = fence.strip_prefix("```") {
                    open = Some(Block {
                        line: i + 1,
                        info: info.trim().to_string(),
                        body: String::new(),
                    });
                }
            }
            Some(block) if fence.starts_with("```") => {
                if block.info.split_whitespace().next() == Some("toml") {
                    blocks.push(block);
                }
            }
            Some(mut block) => {
                block.body.push_str(line);
                block.body.push('\n');
                open = Some(block);
            }
        }
    }
    blocks
}

#[test]
fn every_toml_block_in_the_docs_loads() {
    let root = root();
    let mut files = Vec::new();
    markdown_files(&root, &mut files);
    files.sort();
    let (mut loaded, mut failures) = (0, Vec::new());
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        let name = file
            .strip_prefix(&root)
            .unwrap_or(file)
            .display()
            .to_string();
        for block in toml_blocks(&text) {
            if block.info.split_whitespace().any(|w| w == "fragment") {
                continue;
            }
            let origin = format!("{name} (the toml block opening at line {})", block.line);
            match drover_config::file::parse(&block.body, &origin) {
                Ok(_) => loaded += 1,
                Err(e) => failures.push(e.to_string()),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    assert!(
        loaded > 0,
        "no toml block in {} markdown files",
        files.len()
    );
}

#[test]
fn the_repositorys_drover_toml_loads() {
    drover_config::file::load(&root().join("drover.toml")).unwrap();
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
    let mut in_block = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_block = !in_block;
            continue;
        }
        if in_block {
            continue;
        }
        let Some(heading) = line.strip_prefix('#') else {
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
    let mut in_block = false;
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            in_block = !in_block;
            continue;
        }
        if in_block {
            continue;
        }
        // Code spans hold examples, not links.
        let outside_code: String = line
            .split('`')
            .enumerate()
            .filter(|(n, _)| n % 2 == 0)
            .map(|(_, part)| part)
            .collect::<Vec<_>>()
            .join(" ");
        let mut rest = outside_code.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else {
                break;
            };
            let target = after[..end].split_whitespace().next().unwrap_or("");
            targets.push((i + 1, target.to_string()));
            rest = &after[end..];
        }
    }
    targets
}

#[test]
fn every_link_and_anchor_in_the_docs_resolves() {
    let root = root();
    let mut files = Vec::new();
    markdown_files(&root, &mut files);
    files.sort();
    let mut broken = Vec::new();
    let mut checked = 0;
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        let name = file
            .strip_prefix(&root)
            .unwrap_or(file)
            .display()
            .to_string();
        for (line, target) in link_targets(&text) {
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
