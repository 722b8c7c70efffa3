//! Expected cost of a request, learned per route.
//!
//! The load score counts each in-flight request at its expected cost, so one slow report
//! request weighs as much as fifty cheap ones. The proxy looks the cost up here before a
//! pick (`PickContext::cost`) and records the observed latency after the response.
//!
//! The table is a fixed array of `AtomicU64`, one word per slot holding a key tag and an
//! EWMA together, so a reader never sees one key's tag with another key's value and the
//! hot path never locks or allocates. A collision overwrites: URLs with ids in them are
//! unbounded, any map that kept them all would grow without limit, and the key seen most
//! recently is the one most likely to come again. A lost or evicted entry costs little:
//! `estimate` says `None` and the request counts at `typical`, what any request here
//! costs, the same on every endpoint (see `PickContext::guess`).

use crate::clock::Nanos;
use crate::hashing::{fnv1a_from, mix64, FNV_BASIS};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Slots in a default table: 32 KiB, enough for the distinct routes of most apps.
pub const DEFAULT_CAPACITY: usize = 4096;

/// Low bits of a slot: the estimate in ns, saturating at about 18 minutes.
const VALUE_BITS: u32 = 40;
const VALUE_MAX: u64 = (1 << VALUE_BITS) - 1;

/// The estimate tracks what a request costs when it does not wait inside the backend:
/// a faster sample pulls it halfway down at once, a slower one only 1/16 up. Latency
/// observed under load includes queueing behind other requests, which is not the
/// request's own cost; the low envelope is (and the adaptive concurrency limit compares
/// each latency against it to see queueing).
const DOWN_SHIFT: u32 = 1;
const UP_SHIFT: u32 = 4;

/// A bounded, lock-free table of request-cost estimates.
pub struct CostTable {
    slots: Box<[AtomicU64]>,
    mask: usize,
    /// `typical`'s EWMA (ns; 0: nothing timed yet).
    typical: AtomicU64,
}

/// `typical` moves 1/8 of the way to each sample alone at its endpoint.
const TYPICAL_SHIFT: u32 = 3;

impl CostTable {
    pub fn new() -> Self {
        Self::with_capacity(DEFAULT_CAPACITY)
    }

    /// A table of `capacity` slots, rounded up to a power of two (at least 1).
    pub fn with_capacity(capacity: usize) -> Self {
        let n = capacity.max(1).next_power_of_two();
        CostTable {
            slots: (0..n).map(|_| AtomicU64::new(0)).collect(),
            mask: n - 1,
            typical: AtomicU64::new(0),
        }
    }

    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// The key of a request: its method and request target (path and query).
    pub fn key(method: &[u8], target: &[u8]) -> u64 {
        // The space cannot occur in a method, so ("GE", "T/") and ("GET", "/") differ.
        let h = fnv1a_from(fnv1a_from(FNV_BASIS, method), b" ");
        mix64(fnv1a_from(h, target))
    }

    /// The cost estimate for `key`, if the table holds one.
    pub fn estimate(&self, key: u64) -> Option<Nanos> {
        let word = self.slot(key).load(Relaxed);
        (word != 0 && word >> VALUE_BITS == tag(key)).then_some(word & VALUE_MAX)
    }

    /// What a request of any route costs here: an EWMA of the latencies observed with
    /// no other request pending at the endpoint; `None` before the first.
    pub fn typical(&self) -> Option<Nanos> {
        Some(self.typical.load(Relaxed)).filter(|&t| t != 0)
    }

    /// Folds one latency observed with no other request pending at the endpoint into
    /// the estimate for `key`, and into `typical`.
    pub fn observe(&self, key: u64, latency: Nanos) {
        self.fold(key, latency);
        let sample = latency.clamp(1, VALUE_MAX);
        let next = match self.typical.load(Relaxed) {
            0 => sample,
            typical => step(typical, sample, TYPICAL_SHIFT, TYPICAL_SHIFT),
        };
        // Racing updates lose a sample now and then: fine for an average.
        self.typical.store(next.max(1), Relaxed);
    }

    /// Folds one observed latency into the estimate for `key`.
    fn fold(&self, key: u64, latency: Nanos) {
        let slot = self.slot(key);
        let sample = latency.clamp(1, VALUE_MAX);
        let old = slot.load(Relaxed);
        let value = if old != 0 && old >> VALUE_BITS == tag(key) {
            step(old & VALUE_MAX, sample, UP_SHIFT, DOWN_SHIFT)
        } else {
            sample
        };
        let new = tag(key) << VALUE_BITS | value.max(1);
        // One attempt: if another request updated the slot meanwhile, its sample is as
        // good as ours, and a retry loop is not worth it for an estimate.
        let _ = slot.compare_exchange(old, new, Relaxed, Relaxed);
    }

    /// Folds in a latency observed while other requests awaited an answer at the same
    /// endpoint. It includes waiting behind them, so it bounds the request's own cost
    /// from above: it may lower the estimate, never raise it (a first sample is taken
    /// as it is). Under a standing queue no request is ever alone, and folding these in
    /// raised a cheap route's estimate to a low percentile of its queueing delay (ms for
    /// a 20 µs request): pending work then no longer told cheap from expensive, and p2c
    /// did worse than counting requests (matrix cpu-mixed-closed: p99 1.08 × nginx's,
    /// drover's own least-conn 1.01 ×).
    pub fn observe_beside_others(&self, key: u64, latency: Nanos) {
        match self.estimate(key) {
            Some(prev) if latency >= prev => {}
            _ => self.fold(key, latency),
        }
    }

    fn slot(&self, key: u64) -> &AtomicU64 {
        &self.slots[key as usize & self.mask]
    }
}

/// `prev` moved towards `sample` by 1/2^`up` of the gap when the sample is higher, by
/// 1/2^`down` when lower.
fn step(prev: u64, sample: u64, up: u32, down: u32) -> u64 {
    if sample >= prev {
        prev + ((sample - prev) >> up)
    } else {
        prev - ((prev - sample) >> down)
    }
}

/// The high 24 bits of the key, which the slot index (low bits) does not use; forced
/// odd so that a used slot is never 0, the empty word.
fn tag(key: u64) -> u64 {
    (key >> VALUE_BITS) | 1
}

impl Default for CostTable {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for CostTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CostTable")
            .field("capacity", &self.capacity())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_key_has_no_estimate() {
        let t = CostTable::new();
        assert_eq!(t.capacity(), DEFAULT_CAPACITY);
        assert_eq!(t.estimate(CostTable::key(b"GET", b"/")), None);
    }

    #[test]
    fn the_typical_cost_averages_every_route() {
        let t = CostTable::new();
        assert_eq!(t.typical(), None);
        t.observe(CostTable::key(b"GET", b"/slow"), 80_000);
        assert_eq!(t.typical(), Some(80_000));
        t.observe(CostTable::key(b"GET", b"/fast"), 16_000);
        assert_eq!(t.typical(), Some(72_000));
        t.observe(CostTable::key(b"GET", b"/slow"), 80_000);
        assert_eq!(t.typical(), Some(73_000));
        // Latencies beside others bound a route's cost; they are not a request's own.
        let new = CostTable::key(b"GET", b"/new");
        t.observe_beside_others(new, 1_000_000);
        assert_eq!(
            (t.estimate(new), t.typical()),
            (Some(1_000_000), Some(73_000))
        );
    }

    #[test]
    fn first_sample_is_taken_then_smoothed() {
        let t = CostTable::new();
        let k = CostTable::key(b"GET", b"/report?year=2024");
        t.observe(k, 40_000);
        assert_eq!(t.estimate(k), Some(40_000));
        t.observe(k, 80_000);
        assert_eq!(t.estimate(k), Some(42_500));
        t.observe(k, 10_000);
        assert_eq!(t.estimate(k), Some(26_250));
    }

    #[test]
    fn tracks_the_uncontended_cost_not_queueing() {
        // Mostly fast, sometimes stuck behind other work: the estimate stays near the
        // fast figure, which is what the request itself costs.
        let t = CostTable::new();
        let k = CostTable::key(b"GET", b"/cheap");
        for i in 0..200 {
            t.observe(k, if i % 5 == 4 { 10_000_000 } else { 60_000 });
        }
        let est = t.estimate(k).unwrap();
        assert!(est < 1_000_000, "{est}");
    }

    #[test]
    fn latency_beside_others_only_lowers_the_estimate() {
        let t = CostTable::new();
        let k = CostTable::key(b"GET", b"/cheap");
        t.observe_beside_others(k, 5_000_000);
        assert_eq!(t.estimate(k), Some(5_000_000), "a first sample is taken");
        t.observe(k, 20_000);
        t.observe(k, 20_000);
        let alone = t.estimate(k).unwrap();
        // A standing queue: every sample is queueing delay, none raises the estimate.
        for _ in 0..1000 {
            t.observe_beside_others(k, 8_000_000);
        }
        assert_eq!(t.estimate(k), Some(alone));
        t.observe_beside_others(k, alone / 2);
        assert!(t.estimate(k).unwrap() < alone);
    }

    #[test]
    fn converges_to_a_steady_cost() {
        let t = CostTable::new();
        let k = CostTable::key(b"POST", b"/render");
        t.observe(k, 1_000);
        for _ in 0..200 {
            t.observe(k, 5_000_000);
        }
        let est = t.estimate(k).unwrap();
        assert!((4_990_000..=5_000_000).contains(&est), "{est}");
    }

    #[test]
    fn keys_separate_method_target_and_query() {
        let a = CostTable::key(b"GET", b"/a");
        assert_ne!(a, CostTable::key(b"POST", b"/a"));
        assert_ne!(a, CostTable::key(b"GET", b"/a?x=1"));
        assert_ne!(CostTable::key(b"GE", b"T/a"), CostTable::key(b"GET", b"/a"));
        assert_eq!(a, CostTable::key(b"GET", b"/a"));
    }

    #[test]
    fn collisions_overwrite_and_never_misattribute() {
        let t = CostTable::with_capacity(1);
        let (a, b) = (CostTable::key(b"GET", b"/a"), CostTable::key(b"GET", b"/b"));
        t.observe(a, 100);
        t.observe(b, 900);
        assert_eq!(t.estimate(b), Some(900));
        assert_eq!(t.estimate(a), None);
    }

    #[test]
    fn huge_and_zero_latencies_saturate() {
        let t = CostTable::with_capacity(3);
        assert_eq!(t.capacity(), 4);
        let k = CostTable::key(b"GET", b"/slow");
        t.observe(k, u64::MAX);
        assert_eq!(t.estimate(k), Some(VALUE_MAX));
        let z = CostTable::key(b"GET", b"/fast");
        t.observe(z, 0);
        assert_eq!(t.estimate(z), Some(1));
    }

    #[test]
    fn concurrent_observers_keep_the_table_sane() {
        let t = CostTable::with_capacity(64);
        std::thread::scope(|s| {
            for w in 0..4u64 {
                let t = &t;
                s.spawn(move || {
                    for i in 0..10_000u64 {
                        let k = CostTable::key(b"GET", format!("/{}", i % 100).as_bytes());
                        t.observe(k, 1_000 * (w + 1));
                    }
                });
            }
        });
        for i in 0..100 {
            let k = CostTable::key(b"GET", format!("/{i}").as_bytes());
            if let Some(v) = t.estimate(k) {
                assert!((1_000..=4_000).contains(&v), "{v}");
            }
        }
    }
}
