//! The fuzz target's harness (`fuzz/fuzz_targets/node_message.rs`), also run over the
//! committed corpus on stable by `tests/fuzz_corpus.rs`: whatever a worker writes on its
//! channel, one line at a time, parsing never panics, and an answer to any listen query
//! it parses can be built.

use crate::message::{self, FromWorker};

pub fn node_message(data: &[u8]) {
    for line in data.split(|&b| b == b'\n') {
        if let FromWorker::QueryServer(query) = message::parse(line) {
            let _ = message::cluster(1, message::listening_without_socket(&query));
            let _ = message::cluster(2, message::answer(&query, -98));
        }
    }
}
