//! Replays the committed fuzz corpus (fuzz/corpus/TARGET/*) through the same harnesses
//! the `cargo fuzz` targets run, so the corpus is a regression suite on stable Rust.

use std::path::Path;

fn replay(target: &str, harness: fn(&[u8])) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus")
        .join(target);
    let mut files = 0;
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        let data = std::fs::read(&path).unwrap();
        // Name the input if the harness panics on it.
        let run = std::panic::catch_unwind(|| harness(&data));
        assert!(run.is_ok(), "{target}: {} fails", path.display());
        files += 1;
    }
    assert!(files > 0, "no corpus for {target} in {}", dir.display());
}

#[test]
fn request_corpus() {
    replay("request", drover_proxy::fuzzing::request);
}

#[test]
fn request_httparse_corpus() {
    replay(
        "request_httparse",
        drover_proxy::fuzzing::request_vs_httparse,
    );
}

#[test]
fn response_corpus() {
    replay("response", drover_proxy::fuzzing::response);
}

#[test]
fn chunked_corpus() {
    replay("chunked", drover_proxy::fuzzing::chunked);
}

#[test]
fn proxy_header_corpus() {
    replay("proxy_header", drover_proxy::fuzzing::proxy_header);
}
