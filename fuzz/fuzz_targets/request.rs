//! `cargo +nightly fuzz run request`: see drover_proxy::fuzzing::request for what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| drover_proxy::fuzzing::request(data));
