//! `cargo +nightly fuzz run node_message`: see drover_node::fuzzing::node_message.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| drover_node::fuzzing::node_message(data));
