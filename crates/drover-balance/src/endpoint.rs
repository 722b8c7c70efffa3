//! One backend address and its live load state.
//!
//! Every field a request touches is an atomic so the hot path never locks. An `Endpoint`
//! is shared as `Arc<Endpoint>` between successive `EndpointSet` snapshots, so its load
//! state survives membership changes.

use crate::clock::Nanos;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed};

/// Latency assumed for an endpoint that has not answered yet: low enough that a new
/// endpoint is tried, high enough that one request does not make it look idle forever.
pub const DEFAULT_RTT: Nanos = 1_000_000;

/// How quickly the latency estimate forgets a peak (tower and Finagle use ~10 s).
pub const EWMA_DECAY: Nanos = 10_000_000_000;

/// A reported load older than this is ignored: a backend that stops reporting must not
/// keep its last word forever.
pub const REPORT_TTL: Nanos = 5_000_000_000;

/// Adaptive concurrency limit: where it starts, its bounds, and how it moves.
pub const LIMIT_INITIAL: f64 = 4.0;
pub const LIMIT_MIN: f64 = 1.0;
pub const LIMIT_MAX: f64 = 1024.0;
/// A request whose latency is this many times its uncontended cost waited inside the
/// backend behind other work: the endpoint holds more than it serves at once.
const QUEUED_RATIO: f64 = 2.0;
/// A request this close to its uncontended cost did not wait.
const UNQUEUED_RATIO: f64 = 1.5;
/// Multiplicative decrease per queued request, additive increase per unqueued one
/// served at the limit (spread so the limit grows by about 1 per `limit × GROWTH`
/// requests): the limit falls fast when requests queue and creeps up when they don't,
/// as in TCP Vegas and Netflix's concurrency-limits.
const DECREASE: f64 = 0.9;
const GROWTH: f64 = 4.0;
/// Above its learned limit, an adaptive endpoint still takes requests while the work it
/// holds is under this (ns). A backend that serves one request at a time learns a
/// limit near 1, and at 1 it idles while each response travels back through the proxy;
/// a little cheap work in the pipe keeps it busy, and an expensive request (more than
/// this on its own) still never has anything queued behind it.
pub const PIPELINE_BUDGET: Nanos = 2_000_000;

/// The least share a ramping endpoint gets, so slow start never starves it of the
/// traffic it needs to warm up.
const MIN_RAMP: f64 = 0.1;

/// One backend.
#[derive(Debug)]
pub struct Endpoint {
    addr: SocketAddr,
    id: String,
    weight: AtomicU32,
    max_conns: AtomicU32,
    /// When set and `max_conns` is 0, the in-flight cap is learned (`limit`).
    adaptive: AtomicBool,
    /// The learned concurrency limit (f64 bits).
    limit: AtomicU64,
    in_flight: AtomicU32,
    /// Sum of the expected cost (ns) of the requests in flight.
    in_flight_cost: AtomicU64,
    /// Peak-EWMA latency estimate (f64 bits, ns); 0 bits = no observation yet.
    rtt_estimate: AtomicU64,
    rtt_stamp: AtomicU64,
    /// Backend-reported utilisation (f64 bits, 1.0 = saturated) and when it came.
    reported_load: AtomicU64,
    reported_at: AtomicU64,
    /// Active health checks' verdict.
    healthy: AtomicBool,
    /// Passive ejection: not picked before this time.
    ejected_until: AtomicU64,
    /// Slow start: share ramps from `ramp_start` over `ramp_len`.
    ramp_start: AtomicU64,
    ramp_len: AtomicU64,
    /// Passive health: failures in a row, and ejections in a row (the back-off exponent).
    fail_streak: AtomicU32,
    ejections: AtomicU32,
}

impl Endpoint {
    pub fn new(addr: SocketAddr) -> Self {
        Self::with_weight(addr, 1)
    }

    pub fn with_weight(addr: SocketAddr, weight: u32) -> Self {
        Endpoint {
            addr,
            id: stable_id(&addr.to_string()),
            weight: AtomicU32::new(weight.max(1)),
            max_conns: AtomicU32::new(0),
            adaptive: AtomicBool::new(false),
            limit: AtomicU64::new(LIMIT_INITIAL.to_bits()),
            in_flight: AtomicU32::new(0),
            in_flight_cost: AtomicU64::new(0),
            rtt_estimate: AtomicU64::new(0),
            rtt_stamp: AtomicU64::new(0),
            reported_load: AtomicU64::new(0),
            reported_at: AtomicU64::new(0),
            healthy: AtomicBool::new(true),
            ejected_until: AtomicU64::new(0),
            ramp_start: AtomicU64::new(0),
            ramp_len: AtomicU64::new(0),
            fail_streak: AtomicU32::new(0),
            ejections: AtomicU32::new(0),
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A short id that stays the same across restarts of drover (used in sticky cookies).
    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn weight(&self) -> u32 {
        self.weight.load(Relaxed)
    }

    pub fn set_weight(&self, weight: u32) {
        self.weight.store(weight.max(1), Relaxed);
    }

    /// 0 means no limit.
    pub fn max_conns(&self) -> u32 {
        self.max_conns.load(Relaxed)
    }

    pub fn set_max_conns(&self, max: u32) {
        self.max_conns.store(max, Relaxed);
    }

    pub fn in_flight(&self) -> u32 {
        self.in_flight.load(Relaxed)
    }

    pub fn in_flight_cost(&self) -> Nanos {
        self.in_flight_cost.load(Relaxed)
    }

    /// Learns the concurrency limit from latency instead of a fixed `max_conns`.
    pub fn set_adaptive(&self, on: bool) {
        self.adaptive.store(on, Relaxed);
    }

    pub fn is_adaptive(&self) -> bool {
        self.adaptive.load(Relaxed) && self.max_conns() == 0
    }

    /// The learned limit, fractional (it moves in small steps).
    pub fn learned_limit(&self) -> f64 {
        f64::from_bits(self.limit.load(Relaxed))
    }

    /// The in-flight cap in force: `max_conns` when set, the learned limit when
    /// adaptive, 0 (none) otherwise.
    pub fn concurrency_cap(&self) -> u32 {
        match self.max_conns() {
            0 if self.adaptive.load(Relaxed) => self.learned_limit() as u32,
            max => max,
        }
    }

    pub fn has_capacity(&self) -> bool {
        self.admits(self.in_flight())
    }

    fn admits(&self, in_flight: u32) -> bool {
        let cap = self.concurrency_cap();
        cap == 0
            || in_flight < cap
            || (self.is_adaptive() && self.in_flight_cost() < PIPELINE_BUDGET)
    }

    /// Takes an in-flight slot unless the endpoint is at its cap; returns the in-flight
    /// count including this one. Only `Pick` calls it.
    pub(crate) fn try_acquire(&self, cost: Nanos) -> Option<u32> {
        let before = self
            .in_flight
            .fetch_update(Relaxed, Relaxed, |n| self.admits(n).then_some(n + 1))
            .ok()?;
        self.in_flight_cost.fetch_add(cost, Relaxed);
        Some(before + 1)
    }

    /// Adapts the learned limit after a request whose uncontended cost was known.
    /// `in_flight_at_start` is how many requests the endpoint held with this one.
    ///
    /// Only a request that filled the endpoint exactly to its limit may raise it: an
    /// idle endpoint serving quickly says nothing about how much more it could take,
    /// and one let in above the limit on the pipeline budget says nothing either.
    pub fn adapt_limit(&self, latency: Nanos, expected: Nanos, in_flight_at_start: u32) {
        if !self.is_adaptive() || expected == 0 {
            return;
        }
        let ratio = latency as f64 / expected as f64;
        let limit = self.learned_limit();
        let next = if ratio >= QUEUED_RATIO {
            (limit * DECREASE).max(LIMIT_MIN)
        } else if ratio <= UNQUEUED_RATIO && in_flight_at_start == limit as u32 {
            (limit + 1.0 / (limit * GROWTH)).min(LIMIT_MAX)
        } else {
            return;
        };
        self.limit.store(next.to_bits(), Relaxed);
    }

    pub(crate) fn release(&self, cost: Nanos) {
        self.in_flight.fetch_sub(1, Relaxed);
        self.in_flight_cost.fetch_sub(cost, Relaxed);
    }

    /// The latency estimate in ns, or `DEFAULT_RTT` before the first observation.
    pub fn rtt_estimate(&self) -> f64 {
        match self.rtt_estimate.load(Relaxed) {
            0 => DEFAULT_RTT as f64,
            bits => f64::from_bits(bits),
        }
    }

    /// Peak-EWMA: a slower response than the estimate replaces it at once; a faster one
    /// pulls it down with a weight that grows with the time since the last observation.
    /// Concurrent updates may lose one observation; the estimate stays sane.
    pub fn observe_rtt(&self, now: Nanos, rtt: Nanos) {
        let rtt = rtt as f64;
        let prev_bits = self.rtt_estimate.load(Relaxed);
        let next = if prev_bits == 0 {
            rtt
        } else {
            let prev = f64::from_bits(prev_bits);
            if rtt > prev {
                rtt
            } else {
                let elapsed = now.saturating_sub(self.rtt_stamp.load(Relaxed)) as f64;
                let w = (-elapsed / EWMA_DECAY as f64).exp();
                prev * w + rtt * (1.0 - w)
            }
        };
        self.rtt_estimate.store(next.max(1.0).to_bits(), Relaxed);
        self.rtt_stamp.store(now, Relaxed);
    }

    /// Records the backend's own utilisation report (1.0 = saturated).
    pub fn report_load(&self, now: Nanos, load: f64) {
        if load.is_finite() && load >= 0.0 {
            self.reported_load.store(load.to_bits(), Relaxed);
            self.reported_at.store(now, Relaxed);
        }
    }

    /// The last reported load, or 0 when none came within `REPORT_TTL`.
    pub fn reported_load(&self, now: Nanos) -> f64 {
        let at = self.reported_at.load(Relaxed);
        if at == 0 || now.saturating_sub(at) > REPORT_TTL {
            0.0
        } else {
            f64::from_bits(self.reported_load.load(Relaxed))
        }
    }

    pub fn is_healthy(&self) -> bool {
        self.healthy.load(Relaxed)
    }

    pub fn set_healthy(&self, healthy: bool) {
        self.healthy.store(healthy, Relaxed);
    }

    /// Passive ejection: keep the endpoint out of rotation until `until`.
    pub fn eject_until(&self, until: Nanos) {
        self.ejected_until.store(until, Relaxed);
    }

    pub fn ejected_until(&self) -> Nanos {
        self.ejected_until.load(Relaxed)
    }

    pub fn is_available(&self, now: Nanos) -> bool {
        self.is_healthy() && now >= self.ejected_until.load(Relaxed)
    }

    /// A request succeeded: the failure streak ends. Reads first so the common case
    /// (no streak) does not write a shared cache line on every request.
    pub fn note_success(&self) {
        if self.fail_streak.load(Relaxed) != 0 {
            self.fail_streak.store(0, Relaxed);
        }
    }

    /// A request failed; returns the streak including this failure.
    pub fn note_failure(&self) -> u32 {
        self.fail_streak.fetch_add(1, Relaxed) + 1
    }

    pub fn fail_streak(&self) -> u32 {
        self.fail_streak.load(Relaxed)
    }

    /// Ejections in a row without a healthy spell between them (the back-off exponent).
    pub fn ejections(&self) -> u32 {
        self.ejections.load(Relaxed)
    }

    pub fn set_ejections(&self, n: u32) {
        self.ejections.store(n, Relaxed);
    }

    /// Starts slow start: the endpoint's share ramps from `MIN_RAMP` to full over `len`.
    pub fn start_ramp(&self, now: Nanos, len: Nanos) {
        self.ramp_len.store(len, Relaxed);
        self.ramp_start.store(now, Relaxed);
    }

    /// The slow-start factor in (0, 1]; 1 when not ramping.
    pub fn ramp(&self, now: Nanos) -> f64 {
        let len = self.ramp_len.load(Relaxed);
        let start = self.ramp_start.load(Relaxed);
        if len == 0 || start == 0 {
            return 1.0;
        }
        let done = now.saturating_sub(start) as f64 / len as f64;
        done.clamp(MIN_RAMP, 1.0)
    }

    /// Weight after slow start, as used by every weight-aware strategy.
    pub fn effective_weight(&self, now: Nanos) -> f64 {
        self.weight() as f64 * self.ramp(now)
    }

    /// The load score that `p2c`, `peak-ewma` and the queue use; lower is better.
    ///
    /// Outstanding work is the expected cost of the requests already in flight plus one
    /// more request at the latency estimate (so an idle endpoint still ranks by latency).
    /// A backend that reports itself busy scales that up; weight and slow start scale it
    /// down, so a heavier endpoint takes proportionally more.
    pub fn load_score(&self, now: Nanos) -> f64 {
        let work = self.in_flight_cost() as f64 + self.rtt_estimate();
        let busy = 1.0 + self.reported_load(now);
        work * busy / self.effective_weight(now)
    }
}

/// FNV-1a, 64 bit: stable across Rust versions and machines (unlike `DefaultHasher`), so
/// ids in cookies and Maglev tables stay the same after a restart.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= *b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

fn stable_id(name: &str) -> String {
    format!("{:012x}", fnv1a(name.as_bytes()) >> 16)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep() -> Endpoint {
        Endpoint::new("127.0.0.1:8001".parse().unwrap())
    }

    #[test]
    fn acquire_respects_max_conns() {
        let e = ep();
        e.set_max_conns(2);
        assert_eq!(e.try_acquire(10), Some(1));
        assert_eq!(e.try_acquire(10), Some(2));
        assert_eq!(e.try_acquire(10), None);
        assert_eq!(e.in_flight_cost(), 20);
        e.release(10);
        assert_eq!(e.try_acquire(5), Some(2));
        assert_eq!(e.in_flight(), 2);
    }

    #[test]
    fn adaptive_limit_falls_when_requests_queue_and_creeps_up_when_not() {
        let e = ep();
        // Not adaptive: nothing moves and there is no cap.
        e.adapt_limit(100, 1, 1);
        assert_eq!((e.learned_limit(), e.concurrency_cap()), (LIMIT_INITIAL, 0));
        e.set_adaptive(true);
        assert_eq!(e.concurrency_cap(), LIMIT_INITIAL as u32);
        // Cheap requests stuck behind expensive ones: down to one at a time.
        for _ in 0..30 {
            e.adapt_limit(10_000_000, 60_000, 2);
        }
        assert_eq!(e.learned_limit(), LIMIT_MIN);
        assert_eq!(e.concurrency_cap(), 1);
        // Served at the limit without queueing: it grows, slowly.
        let steps = (1..100)
            .find(|_| {
                e.adapt_limit(60_000, 60_000, 1);
                e.concurrency_cap() == 2
            })
            .unwrap();
        assert!((4..=8).contains(&steps), "{steps} steps from 1 to 2");
        // Served below the limit: no evidence, no growth.
        let before = e.learned_limit();
        e.adapt_limit(60_000, 60_000, 1);
        assert_eq!(e.learned_limit(), before);
        // A fixed max_conns overrides learning.
        e.set_max_conns(7);
        assert_eq!(e.concurrency_cap(), 7);
        assert!(!e.is_adaptive());
    }

    #[test]
    fn peak_ewma_takes_peaks_and_decays_slowly() {
        let e = ep();
        e.observe_rtt(1, 1_000);
        e.observe_rtt(2, 50_000);
        assert_eq!(e.rtt_estimate(), 50_000.0);
        // A fast answer right after barely moves the estimate...
        e.observe_rtt(3, 1_000);
        assert!(e.rtt_estimate() > 49_000.0);
        // ...one long after mostly replaces it.
        e.observe_rtt(3 + 10 * EWMA_DECAY, 1_000);
        assert!(e.rtt_estimate() < 1_100.0);
    }

    #[test]
    fn reported_load_expires() {
        let e = ep();
        e.report_load(10, 0.5);
        assert_eq!(e.reported_load(11), 0.5);
        assert_eq!(e.reported_load(11 + REPORT_TTL), 0.0);
        e.report_load(12, f64::NAN);
        assert_eq!(e.reported_load(13), 0.5);
    }

    #[test]
    fn ejection_and_health_gate_availability() {
        let e = ep();
        assert!(e.is_available(5));
        e.eject_until(100);
        assert!(!e.is_available(99));
        assert!(e.is_available(100));
        e.set_healthy(false);
        assert!(!e.is_available(200));
    }

    #[test]
    fn slow_start_ramps_share() {
        let e = ep();
        e.start_ramp(1_000, 1_000);
        assert_eq!(e.ramp(1_000), MIN_RAMP);
        assert!((e.ramp(1_500) - 0.5).abs() < 1e-9);
        assert_eq!(e.ramp(3_000), 1.0);
    }

    #[test]
    fn score_prefers_less_work_and_more_weight() {
        let a = ep();
        let b = Endpoint::with_weight("127.0.0.1:8002".parse().unwrap(), 2);
        assert!(b.load_score(1) < a.load_score(1));
        assert!(a.try_acquire(5_000_000).is_some());
        let c = ep();
        assert!(a.load_score(1) > c.load_score(1));
    }

    #[test]
    fn ids_are_stable_and_distinct() {
        let a = ep();
        let b = Endpoint::new("127.0.0.1:8002".parse().unwrap());
        assert_eq!(a.id(), ep().id());
        assert_ne!(a.id(), b.id());
        assert_eq!(a.id().len(), 12);
    }
}
