//! `cargo +nightly fuzz run chunked`: see drover_proxy::fuzzing::chunked for what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| drover_proxy::fuzzing::chunked(data));
