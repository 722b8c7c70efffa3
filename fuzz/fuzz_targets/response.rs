//! `cargo +nightly fuzz run response`: see drover_proxy::fuzzing::response for what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| drover_proxy::fuzzing::response(data));
