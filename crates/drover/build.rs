//! Links the drover binary with its relative relocations packed (`-z
//! pack-relative-relocs`, DT_RELR), where the C library it runs on can load them.
//!
//! drover is a position-independent executable. Its ~23,000 relative relocations took
//! 553 KiB as RELA entries, which the loader reads in full at every start, and the
//! pages they land on stay in drover's RSS: packed, they take 6 KiB. Measured with
//! `drover run -w 2 -- node examples/pi-server.js` under wrk, the primary's RSS went
//! from 12.2–13.0 MB to 11.2–11.6 MB (3 rounds each, alternating), where Node's cluster
//! primary holds about 42 MB.
//!
//! glibc loads DT_RELR from 2.36 on (the linker adds a dependency on its
//! `GLIBC_ABI_DT_RELR` version, so an older glibc would refuse the binary). The build
//! asks the glibc it runs on (`getconf GNU_LIBC_VERSION`) and packs only for that
//! same machine; a cross build, musl or another OS links as before. A linker too old
//! for the option (GNU ld before 2.38) warns and ignores it.

use std::env;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let target = env::var("TARGET").unwrap_or_default();
    let host = env::var("HOST").unwrap_or_default();
    if target == host && target.ends_with("-linux-gnu") && glibc_loads_relr() {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
}

/// Whether this machine's glibc is 2.36 or later.
fn glibc_loads_relr() -> bool {
    let Ok(out) = Command::new("getconf").arg("GNU_LIBC_VERSION").output() else {
        return false;
    };
    // "glibc 2.36"
    let text = String::from_utf8_lossy(&out.stdout);
    let Some(version) = text.trim().strip_prefix("glibc ") else {
        return false;
    };
    let mut parts = version.split('.').map(|p| p.parse::<u32>().ok());
    matches!(
        (parts.next().flatten(), parts.next().flatten()),
        (Some(major), Some(minor)) if (major, minor) >= (2, 36)
    )
}
