//! `cargo +nightly fuzz run proxy_header`: see drover_proxy::fuzzing::proxy_header for what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| drover_proxy::fuzzing::proxy_header(data));
