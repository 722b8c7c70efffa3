//! Replays the committed fuzz corpus (fuzz/corpus/node_message/*) through the harness
//! the `cargo fuzz` target runs, so the corpus is a regression suite on stable Rust.

#[test]
fn node_message_corpus() {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/node_message");
    let mut files = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let data = std::fs::read(entry.unwrap().path()).unwrap();
        drover_node::fuzzing::node_message(&data);
        files += 1;
    }
    assert!(files > 0, "no corpus in {}", dir.display());
}
