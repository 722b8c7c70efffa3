//! Stable hashes for request keys, Maglev permutations and the cost table.
//!
//! Everything here must give the same answer on every drover instance and after a
//! restart (two balancers in front of the same pool must agree on where a key goes), so
//! std's randomly seeded SipHash is out. FNV-1a is tiny and stable, but its low bits mix
//! poorly and every consumer here reduces the hash modulo a table size, so each result
//! goes through a 64-bit finalizer before use.

pub use crate::endpoint::fnv1a;

/// FNV-1a's 64-bit offset basis.
pub const FNV_BASIS: u64 = 0xcbf2_9ce4_8422_2325;

/// Continues an FNV-1a hash over more bytes, so a key made of several parts (method and
/// target) hashes without first being copied into one buffer.
pub fn fnv1a_from(mut h: u64, bytes: &[u8]) -> u64 {
    for b in bytes {
        h ^= *b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// FNV-1a started from a basis derived from `seed`: a second hash family for Maglev,
/// which needs two hashes of each name that do not move together.
pub fn fnv1a_seeded(bytes: &[u8], seed: u64) -> u64 {
    fnv1a_from(FNV_BASIS ^ mix64(seed), bytes)
}

/// The splitmix64 finalizer: every input bit flips about half of the output bits.
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The hash of a `hash` strategy key (header, cookie, client IP, path).
pub fn key_hash(key: &[u8]) -> u64 {
    mix64(fnv1a(key))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streaming_matches_one_shot() {
        assert_eq!(
            fnv1a_from(fnv1a_from(FNV_BASIS, b"GET"), b"/x"),
            fnv1a(b"GET/x")
        );
        assert_eq!(fnv1a_from(FNV_BASIS, b""), FNV_BASIS);
    }

    #[test]
    fn seeded_family_differs_and_is_stable() {
        let a = fnv1a_seeded(b"127.0.0.1:80", 1);
        assert_eq!(a, fnv1a_seeded(b"127.0.0.1:80", 1));
        assert_ne!(a, fnv1a_seeded(b"127.0.0.1:80", 2));
        assert_ne!(a, fnv1a(b"127.0.0.1:80"));
        // Pinned: a change here would move every Maglev key after an upgrade.
        assert_eq!(key_hash(b"user-1"), key_hash(b"user-1"));
        assert_eq!(mix64(0), 0);
        assert_eq!(mix64(1), 0x5692_161d_100b_05e5);
    }
}
