//! `cargo +nightly fuzz run request_httparse`: see drover_proxy::fuzzing::request_vs_httparse for what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| drover_proxy::fuzzing::request_vs_httparse(data));
