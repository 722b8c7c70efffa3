//! The RAII handle for one request's claim on an endpoint.

use crate::clock::Nanos;
use crate::endpoint::Endpoint;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;

/// What a strategy needs to know about the request being placed.
#[derive(Debug, Clone, Copy, Default)]
pub struct PickContext<'a> {
    pub now: Nanos,
    /// Expected cost of this request in ns (0 = unknown: `guess`). Counted in the
    /// endpoint's in-flight work while the pick lives.
    pub cost: Nanos,
    /// What an unknown cost counts as: the same on every endpoint, the typical cost of a
    /// request here (`CostTable::typical`); 0 before anything was timed, and then each
    /// endpoint's latency estimate. Per endpoint, that estimate is a peak over every
    /// route: one 300 ms call timed on worker A and none on worker B counted each new
    /// call as 300 ms on A and 1 ms (the default) on B, and a burst of 100 calls went 1
    /// to A and 99 to B.
    pub guess: Nanos,
    /// The request's route (`CostTable::key`: method and target), 0 when not known: a
    /// later request of the same route answered first does not make an earlier one count
    /// as waiting (see `SendOrder::settled` in endpoint.rs).
    pub route: u64,
    /// Key for `hash`: the header, cookie, client IP or path the balancer hashes on.
    pub hash_key: Option<&'a [u8]>,
    /// The id of the endpoint the request is pinned to (see `strategy::pinned`): from
    /// the sticky cookie, or the endpoint that holds its engine.io session.
    pub pinned: Option<&'a str>,
    /// Endpoints already tried for this request (retries go elsewhere when they can).
    pub exclude: &'a [Arc<Endpoint>],
    /// The endpoint that served the last request of this client connection: taken
    /// again while it has nothing pending (see `strategy::common::least_loaded_of`).
    pub previous: Option<&'a Arc<Endpoint>>,
    /// The idle backend connections the picking thread holds, when it keeps any: a
    /// busy endpoint reached through one of them is preferred over a slightly less
    /// loaded one that needs a new connection (see `strategy::common::least_loaded_of`).
    pub pooled: Option<&'a dyn Pooled>,
}

/// Which endpoints a pick could reach on a connection already open and idle.
pub trait Pooled: Sync {
    fn has_idle(&self, endpoint: &Endpoint) -> bool;
}

impl std::fmt::Debug for dyn Pooled + '_ {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Pooled")
    }
}

impl PickContext<'_> {
    pub fn is_excluded(&self, e: &Arc<Endpoint>) -> bool {
        self.exclude.iter().any(|x| Arc::ptr_eq(x, e))
    }

    /// Whether `e` may serve this request at all: available and not excluded.
    pub fn usable(&self, e: &Arc<Endpoint>) -> bool {
        e.is_available(self.now) && !self.is_excluded(e)
    }

    /// Whether a strategy may choose `e` now: usable and below its cap.
    pub fn eligible(&self, e: &Arc<Endpoint>) -> bool {
        self.usable(e) && e.has_capacity(self.now)
    }
}

/// Why no endpoint was picked. The proxy answers 503 for `NoneAvailable` and queues the
/// request for `AllBusy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoPick {
    /// No endpoint is healthy (or every healthy one was excluded).
    NoneAvailable,
    /// Some endpoint is available but none could be claimed: every one was at its cap
    /// when the strategy looked.
    AllBusy,
}

/// Classifies an empty choice for a strategy: busy if some endpoint may serve the
/// request at all, otherwise none available.
///
/// Whether that endpoint has room *now* does not matter: the strategy found it full a
/// moment ago, and a slot released since then is exactly what a queued request waits
/// for. Re-reading capacity here made a healthy pool look empty whenever a slot freed
/// between the choice and this call, and clients got a 503 `no-healthy-endpoint` from
/// healthy endpoints (issue 11, item 8).
pub fn no_pick_reason(endpoints: &[Arc<Endpoint>], ctx: &PickContext<'_>) -> NoPick {
    if endpoints.iter().any(|e| ctx.usable(e)) {
        NoPick::AllBusy
    } else {
        NoPick::NoneAvailable
    }
}

/// Holds a slot on an endpoint; dropping it gives the slot back.
///
/// `observe`, at the response head, records the latency (time to the head is what the
/// estimate wants) and ends the request's pending part: from then on it counts only as
/// in flight (a streaming body, a tunnel) until dropped.
#[derive(Debug)]
pub struct Pick {
    endpoint: Arc<Endpoint>,
    cost: Nanos,
    /// The cost came from a per-request estimate, not the endpoint's latency.
    cost_known: bool,
    /// Working requests on the endpoint (pending and not overtaken), this one included,
    /// when it was sent.
    pending_at_start: u32,
    /// Its place in the endpoint's send order (0: not tracked).
    seq: u64,
    started: Nanos,
    /// The response head came (`observe` ran), or the request waits (`stop_pending`).
    settled: AtomicBool,
    /// `stop_pending` ran: the time to its answer is no cost of its route.
    waits: AtomicBool,
}

impl Pick {
    /// Claims a slot on `endpoint`, or `None` when it is at `max_conns`.
    pub fn try_new(endpoint: &Arc<Endpoint>, ctx: &PickContext<'_>) -> Option<Pick> {
        let cost = match (ctx.cost, ctx.guess) {
            (0, 0) => endpoint.rtt_estimate() as Nanos,
            (0, guess) => guess,
            (cost, _) => cost,
        };
        let cost_known = ctx.cost != 0;
        let (pending_at_start, seq) =
            endpoint.try_acquire_as(cost, !cost_known, ctx.route, ctx.now)?;
        Some(Pick {
            endpoint: Arc::clone(endpoint),
            cost,
            cost_known,
            pending_at_start,
            seq,
            started: ctx.now,
            settled: AtomicBool::new(false),
            waits: AtomicBool::new(false),
        })
    }

    pub fn endpoint(&self) -> &Arc<Endpoint> {
        &self.endpoint
    }

    /// Whether no other request awaited an answer at the endpoint when this one was
    /// placed: then its latency is its own cost, not time spent behind others.
    pub fn was_alone(&self) -> bool {
        self.pending_at_start <= 1
    }

    pub fn started(&self) -> Nanos {
        self.started
    }

    /// The response head arrived at `now`: records the time from the pick as a latency
    /// observation, lets an adaptive endpoint learn from it how much it can take at once,
    /// and ends the request's pending part. Only the first call counts.
    pub fn observe(&self, now: Nanos) {
        if self.settled.swap(true, Relaxed) {
            return;
        }
        let latency = now.saturating_sub(self.started);
        self.endpoint.observe_rtt(now, latency);
        if self.cost_known {
            self.endpoint
                .adapt_limit(now, latency, self.cost, self.pending_at_start);
        }
        self.endpoint.settle(self.cost, self.seq, Some(now));
    }

    /// The request is known to wait, not work, however long its answer takes (an event
    /// stream whose app sends its head with the first event, a long-poll that has been
    /// quiet past a request timeout, or a client timeout where there is none): it stops counting as
    /// pending work here, and its answer, when it comes, is no latency observation.
    /// Counted until then, a few hundred such subscriptions weighed as as many ordinary
    /// requests, and the endpoint holding a few more of them got none of the short ones.
    pub fn stop_pending(&self) {
        self.waits.store(true, Relaxed);
        if !self.settled.swap(true, Relaxed) {
            self.endpoint.settle(self.cost, self.seq, None);
        }
    }

    /// Whether `stop_pending` ran: the request waited for news, so the time to its
    /// answer says nothing of what its route costs.
    pub fn waited(&self) -> bool {
        self.waits.load(Relaxed)
    }
}

impl Drop for Pick {
    fn drop(&mut self) {
        self.endpoint
            .release(self.cost, self.seq, *self.settled.get_mut());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::endpoint::PIPELINE_BUDGET;

    #[test]
    fn drop_releases_the_slot_and_cost() {
        let e = Arc::new(Endpoint::new("127.0.0.1:1".parse().unwrap()));
        let ctx = PickContext {
            now: 1,
            cost: 700,
            ..Default::default()
        };
        let p = Pick::try_new(&e, &ctx).unwrap();
        assert_eq!((e.in_flight(), e.pending(), e.pending_cost()), (1, 1, 700));
        drop(p);
        assert_eq!((e.in_flight(), e.pending(), e.pending_cost()), (0, 0, 0));
    }

    #[test]
    fn an_unknown_cost_counts_as_the_guess_on_every_endpoint() {
        // A timed a 300 ms call; B timed nothing (its estimate is the 1 ms default).
        let a = Arc::new(Endpoint::new("127.0.0.1:1".parse().unwrap()));
        let b = Arc::new(Endpoint::new("127.0.0.1:2".parse().unwrap()));
        a.observe_rtt(1, 300_000_000);
        let guessed = PickContext {
            now: 2,
            guess: 5_000_000,
            ..Default::default()
        };
        let (pa, pb) = (
            Pick::try_new(&a, &guessed).unwrap(),
            Pick::try_new(&b, &guessed).unwrap(),
        );
        assert_eq!((a.pending_cost(), b.pending_cost()), (5_000_000, 5_000_000));
        drop((pa, pb));
        // Nothing timed anywhere yet: each endpoint's own estimate.
        let unknown = PickContext {
            now: 2,
            ..Default::default()
        };
        let _pb = Pick::try_new(&b, &unknown).unwrap();
        assert_eq!(b.pending_cost(), b.rtt_estimate() as Nanos);
    }

    #[test]
    fn requests_counted_at_a_guess_do_not_fit_the_pipeline_budget_once_it_proved_wrong() {
        const MS: Nanos = 1_000_000;
        let e = Arc::new(Endpoint::new("127.0.0.1:1".parse().unwrap()));
        e.set_adaptive(true);
        // A burst at a cold start, its route not timed: each counts at the guess, what
        // the health checks cost.
        let cold = PickContext {
            now: 1,
            guess: MS / 2,
            ..Default::default()
        };
        let burst: Vec<Pick> = (0..50).map(|_| Pick::try_new(&e, &cold).unwrap()).collect();
        e.report_load(2, 1.0);
        let at = |now| PickContext {
            now,
            cost: 300 * MS,
            ..Default::default()
        };
        assert!(
            Pick::try_new(&e, &at(3)).is_none(),
            "saturated, over its limit"
        );
        // Nine left: 4.5 ms at the guess, under the budget, yet 2.7 s of work. Within
        // the budget's time the guess may still be right...
        let mut left = burst;
        for p in left.drain(9..) {
            p.observe(4);
        }
        assert!(e.working_cost() < PIPELINE_BUDGET);
        let early = Pick::try_new(&e, &at(PIPELINE_BUDGET / 2)).expect("within the budget");
        drop(early);
        // ...but pending for longer than the whole budget, it was wrong.
        let late = 3_000 * MS;
        e.report_load(late, 1.0);
        assert!(
            Pick::try_new(&e, &at(late)).is_none(),
            "the guess proved wrong"
        );
        // Below the learned limit the request goes in, as any does.
        for p in left.drain(1..) {
            p.observe(late);
        }
        let next = Pick::try_new(&e, &at(late)).expect("below the limit");
        drop((left, next));
        // Requests of timed routes fill the budget, however long they are pending.
        let cheap = PickContext {
            now: late,
            cost: MS,
            ..Default::default()
        };
        let held: Vec<Pick> = (0..9).map(|_| Pick::try_new(&e, &cheap).unwrap()).collect();
        e.report_load(late + 100 * MS, 1.0);
        assert!(Pick::try_new(
            &e,
            &PickContext {
                now: late + 100 * MS,
                ..cheap
            }
        )
        .is_some());
        drop(held);
    }

    #[test]
    fn a_request_known_to_wait_stops_counting_as_pending_work() {
        let e = Arc::new(Endpoint::new("127.0.0.1:1".parse().unwrap()));
        let ctx = PickContext {
            now: 1,
            cost: 700,
            ..Default::default()
        };
        let rtt = e.rtt_estimate();
        let p = Pick::try_new(&e, &ctx).unwrap();
        p.stop_pending();
        p.stop_pending();
        assert!(p.waited());
        assert_eq!((e.in_flight(), e.pending(), e.pending_cost()), (1, 0, 0));
        // Its answer, minutes later, teaches nothing.
        p.observe(600_000_000_000);
        assert_eq!(e.rtt_estimate(), rtt);
        drop(p);
        assert_eq!((e.in_flight(), e.pending(), e.pending_cost()), (0, 0, 0));
    }

    #[test]
    fn a_response_head_ends_the_pending_part_once() {
        let e = Arc::new(Endpoint::new("127.0.0.1:1".parse().unwrap()));
        let ctx = PickContext {
            now: 1,
            cost: 700,
            ..Default::default()
        };
        let p = Pick::try_new(&e, &ctx).unwrap();
        p.observe(2);
        p.observe(3);
        // A streaming body or a tunnel: still in flight, no longer pending work.
        assert_eq!((e.in_flight(), e.pending(), e.pending_cost()), (1, 0, 0));
        assert!(e.is_idle());
        drop(p);
        assert_eq!((e.in_flight(), e.pending(), e.pending_cost()), (0, 0, 0));
    }

    #[test]
    fn reason_distinguishes_busy_from_down() {
        let a = Arc::new(Endpoint::new("127.0.0.1:1".parse().unwrap()));
        a.set_max_conns(1);
        let ctx = PickContext {
            now: 1,
            ..Default::default()
        };
        let set = vec![Arc::clone(&a)];
        let _held = Pick::try_new(&a, &ctx).unwrap();
        assert_eq!(no_pick_reason(&set, &ctx), NoPick::AllBusy);
        // A fixed cap counts the exchange until it ends, even once the head is in.
        _held.observe(2);
        assert_eq!(no_pick_reason(&set, &ctx), NoPick::AllBusy);
        a.set_healthy(false);
        assert_eq!(no_pick_reason(&set, &ctx), NoPick::NoneAvailable);
    }

    #[test]
    fn a_slot_freed_after_an_empty_choice_leaves_the_request_busy_not_homeless() {
        // The interleaving behind spurious 503 no-healthy-endpoint (issue 11, item 8): a
        // strategy finds the only endpoint full, its slot frees, then the empty choice is
        // explained. The request must queue (and will get that slot), not fail.
        let a = Arc::new(Endpoint::new("127.0.0.1:1".parse().unwrap()));
        a.set_max_conns(1);
        let ctx = PickContext {
            now: 1,
            ..Default::default()
        };
        let set = vec![Arc::clone(&a)];
        let held = Pick::try_new(&a, &ctx).unwrap();
        assert!(!ctx.eligible(&a), "the choice sees it full");
        drop(held);
        assert_eq!(no_pick_reason(&set, &ctx), NoPick::AllBusy);
        // Excluded (already tried by this request) is not waitable: none available.
        let tried = [Arc::clone(&a)];
        let retry = PickContext {
            exclude: &tried,
            ..ctx
        };
        assert_eq!(no_pick_reason(&set, &retry), NoPick::NoneAvailable);
    }
}
