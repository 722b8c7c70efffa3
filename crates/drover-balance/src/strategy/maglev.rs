//! `hash`: consistent hashing with a Maglev lookup table (Eisenbud et al., NSDI 2016).
//!
//! The same key (a header, cookie, client IP or path) goes to the same endpoint, on
//! every drover instance and after restarts, so per-key caches on the backends stay warm.
//! Maglev is chosen over a hash ring because the lookup is one array index (O(1), no
//! binary search over virtual nodes) and the spread is even by construction: every
//! endpoint owns M/N slots, give or take one, where a ring needs hundreds of virtual nodes
//! per endpoint to come close. When one of N endpoints leaves, about 1/N of the keys move
//! (the ones it owned) plus a small excess that shrinks as M grows past N.
//!
//! The table maps over *all* endpoints of the set, healthy or not, so a health flap does
//! not reshuffle anyone. A key whose endpoint is at its concurrency cap waits for it in
//! drover's queue. A key whose endpoint is down, ejected or excluded (a retry) walks on
//! to the next slots of the table, whose owners are a pseudo-random sample
//! of the others: the down endpoint's keys spread instead of doubling one neighbour's
//! load, and come back when it recovers. Weights are not applied: they change at run
//! time, and the table is only rebuilt when membership does.
//!
//! Tables are built once per set generation (M = 65537 by default: 256 KiB, a few ms to
//! build, comfortably more than 100 slots per endpoint up to ~650 endpoints) and shared
//! through a per-generation cache. Requests without a key use `p2c`.

use super::common::{claim, PerSet};
use super::p2c;
use crate::endpoint::Endpoint;
use crate::hashing::{fnv1a, fnv1a_seeded, key_hash, mix64};
use crate::pick::{no_pick_reason, NoPick, Pick, PickContext};
use crate::set::EndpointSet;
use crate::Balancer;
use std::sync::Arc;

/// The default table size: prime, as Maglev's permutations require.
pub const DEFAULT_TABLE_SIZE: usize = 65_537;

/// Slots walked past an ineligible endpoint before giving up on consistency. With a
/// fraction f of the pool unusable, all of them miss with probability f^32.
const MAX_PROBES: usize = 32;

/// Seed of the second hash family (the permutation's skip).
const SKIP_SEED: u64 = 0x6d61_676c_6576; // "maglev"

#[derive(Debug)]
pub struct Maglev {
    size: usize,
    tables: PerSet<Table>,
}

impl Maglev {
    pub fn new() -> Self {
        Self::with_table_size(DEFAULT_TABLE_SIZE)
    }

    /// A balancer whose tables have the smallest prime number of slots `>= size` (at
    /// least 2). Keep M at least ~100 × the number of endpoints for an even spread.
    pub fn with_table_size(size: usize) -> Self {
        Maglev {
            size: next_prime(size.max(2)),
            tables: PerSet::default(),
        }
    }

    pub fn table_size(&self) -> usize {
        self.size
    }

    /// The lookup table for `set` (built or cached), for inspection and tests.
    pub fn table(&self, set: &EndpointSet) -> Arc<Table> {
        self.tables
            .get(set, |s| Table::build(s.endpoints(), self.size))
    }
}

impl Default for Maglev {
    fn default() -> Self {
        Self::new()
    }
}

impl Balancer for Maglev {
    fn pick(&self, set: &EndpointSet, ctx: &PickContext<'_>) -> Result<Pick, NoPick> {
        let eps = set.endpoints();
        let Some(key) = ctx.hash_key else {
            return claim(set, ctx, || p2c::choose(set, ctx));
        };
        if eps.is_empty() {
            return Err(no_pick_reason(eps, ctx));
        }
        let table = self.table(set);
        let h = key_hash(key);
        // The key's endpoint is the first usable one on its probe sequence. When it is
        // only full, the request waits for it (`AllBusy` queues it): a key moves to
        // another endpoint only when its own is down, never because of load.
        match table.probe(h, |i| ctx.usable(&eps[i])) {
            Some(i) => Pick::try_new(&eps[i], ctx).ok_or(NoPick::AllBusy),
            None => claim(set, ctx, || p2c::choose(set, ctx)),
        }
    }
}

/// A Maglev lookup table: slot → index into the set's endpoints.
pub struct Table {
    slots: Box<[u32]>,
}

impl Table {
    /// Fills `size` slots (prime) from each endpoint's permutation in turn: endpoint i
    /// prefers slots `offset_i, offset_i + skip_i, ...` (mod size), with offset and skip
    /// from two independent hashes of its address, and each takes its next free
    /// preference in round-robin order until the table is full.
    pub fn build(endpoints: &[Arc<Endpoint>], size: usize) -> Table {
        const EMPTY: u32 = u32::MAX;
        let n = endpoints.len();
        if n == 0 {
            return Table {
                slots: Box::new([]),
            };
        }
        let m = size as u64;
        // (next preferred slot, skip) per endpoint.
        let mut cursor: Vec<(u64, u64)> = endpoints
            .iter()
            .map(|e| {
                let name = e.addr().to_string();
                let offset = mix64(fnv1a(name.as_bytes())) % m;
                let skip = mix64(fnv1a_seeded(name.as_bytes(), SKIP_SEED)) % (m - 1) + 1;
                (offset, skip)
            })
            .collect();
        let mut slots = vec![EMPTY; size];
        let mut filled = 0;
        loop {
            for (i, (next, skip)) in cursor.iter_mut().enumerate() {
                // Terminates: skip < m and m is prime, so the walk visits every slot.
                while slots[*next as usize] != EMPTY {
                    *next = (*next + *skip) % m;
                }
                slots[*next as usize] = i as u32;
                *next = (*next + *skip) % m;
                filled += 1;
                if filled == size {
                    return Table {
                        slots: slots.into_boxed_slice(),
                    };
                }
            }
        }
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// The endpoint index that owns the slot of key hash `h`.
    pub fn lookup(&self, h: u64) -> Option<usize> {
        let m = self.slots.len() as u64;
        (m > 0).then(|| self.slots[(h % m) as usize] as usize)
    }

    /// The first endpoint index, from the key's slot onwards, that `ok` accepts.
    fn probe(&self, h: u64, ok: impl Fn(usize) -> bool) -> Option<usize> {
        let m = self.slots.len();
        let start = (h % m as u64) as usize;
        let mut last = None;
        for k in 0..MAX_PROBES.min(m) {
            let i = self.slots[(start + k) % m] as usize;
            // Neighbouring slots often share an owner; check each owner once per run.
            if last != Some(i) {
                if ok(i) {
                    return Some(i);
                }
                last = Some(i);
            }
        }
        None
    }
}

impl std::fmt::Debug for Table {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Table")
            .field("len", &self.slots.len())
            .finish_non_exhaustive()
    }
}

/// The smallest prime `>= n` (n >= 2). Trial division: table sizes are small and this
/// runs once per balancer.
pub fn next_prime(n: usize) -> usize {
    let is_prime = |k: usize| {
        k >= 2
            && (2..)
                .take_while(|d| d * d <= k)
                .all(|d| !k.is_multiple_of(d))
    };
    (n..).find(|&k| is_prime(k)).unwrap_or(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::strategy::testing::*;

    fn key_ctx(key: &[u8]) -> PickContext<'_> {
        PickContext {
            hash_key: Some(key),
            ..ctx()
        }
    }

    #[test]
    fn primes() {
        assert_eq!(next_prime(2), 2);
        assert_eq!(next_prime(4), 5);
        assert_eq!(next_prime(65_536), 65_537);
        assert_eq!(Maglev::with_table_size(1000).table_size(), 1009);
        assert_eq!(Maglev::new().table_size(), DEFAULT_TABLE_SIZE);
    }

    #[test]
    fn every_endpoint_owns_an_even_share_of_slots() {
        let s = set_of(&[1; 7]);
        let t = Table::build(s.endpoints(), 1009);
        let mut owned = [0; 7];
        for h in 0..1009 {
            owned[t.lookup(h).unwrap()] += 1;
        }
        assert!(owned.iter().all(|&c| c == 144 || c == 145), "{owned:?}");
    }

    #[test]
    fn same_key_same_endpoint_across_balancers() {
        let s = set_of(&[1; 5]);
        let (a, b) = (Maglev::with_table_size(211), Maglev::with_table_size(211));
        for k in 0..200 {
            let key = format!("user-{k}");
            let pa = a.pick(&s, &key_ctx(key.as_bytes())).unwrap();
            let pb = b.pick(&s, &key_ctx(key.as_bytes())).unwrap();
            assert!(Arc::ptr_eq(pa.endpoint(), pb.endpoint()));
        }
    }

    #[test]
    fn keys_of_a_down_endpoint_spread_and_return() {
        let s = set_of(&[1; 4]);
        let m = Maglev::with_table_size(1009);
        let keys: Vec<String> = (0..2000).map(|k| format!("k{k}")).collect();
        let home: Vec<usize> = keys
            .iter()
            .map(|k| index_of(&s, &m.pick(&s, &key_ctx(k.as_bytes())).unwrap()))
            .collect();
        s.endpoints()[0].set_healthy(false);
        let mut moved_to = [0; 4];
        for (k, &h) in keys.iter().zip(&home) {
            let now = index_of(&s, &m.pick(&s, &key_ctx(k.as_bytes())).unwrap());
            if h == 0 {
                moved_to[now] += 1;
            } else {
                assert_eq!(now, h, "a key of a healthy endpoint moved");
            }
        }
        assert_eq!(moved_to[0], 0);
        assert!(moved_to[1..].iter().all(|&c| c > 80), "{moved_to:?}");
        s.endpoints()[0].set_healthy(true);
        for (k, &h) in keys.iter().zip(&home) {
            assert_eq!(
                index_of(&s, &m.pick(&s, &key_ctx(k.as_bytes())).unwrap()),
                h
            );
        }
    }

    #[test]
    fn no_key_falls_back_to_p2c() {
        let s = set_of(&[1, 1]);
        s.endpoints()[0].report_load(1, 3.0);
        let p = Maglev::with_table_size(101).pick(&s, &ctx()).unwrap();
        assert_eq!(index_of(&s, &p), 1);
    }

    #[test]
    fn honours_eligibility() {
        check_eligibility(&Maglev::with_table_size(101));
    }

    #[test]
    fn a_key_waits_for_its_full_endpoint_and_walks_past_a_down_one() {
        let s = set_of(&[1, 1, 1]);
        let m = Maglev::new();
        let key = PickContext {
            hash_key: Some(b"user-7"),
            ..ctx()
        };
        let own = index_of(&s, &m.pick(&s, &key).unwrap());
        s.endpoints()[own].set_max_conns(1);
        let held = m.pick(&s, &key).unwrap();
        // Full: the request is queued for its endpoint, not sent to another one.
        assert_eq!(m.pick(&s, &key).unwrap_err(), NoPick::AllBusy);
        drop(held);
        assert_eq!(index_of(&s, &m.pick(&s, &key).unwrap()), own);
        // Down: the key moves on, and comes back once its endpoint does.
        s.endpoints()[own].set_healthy(false);
        assert_ne!(index_of(&s, &m.pick(&s, &key).unwrap()), own);
        s.endpoints()[own].set_healthy(true);
        assert_eq!(index_of(&s, &m.pick(&s, &key).unwrap()), own);
    }
}
