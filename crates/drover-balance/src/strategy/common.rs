//! Pieces every strategy shares: claiming a slot, the least-score scan, and a cache of
//! tables derived from one set snapshot.

use crate::clock::Nanos;
use crate::endpoint::{Endpoint, PIPELINE_BUDGET};
use crate::idle_turns::{IdleTurns, Turn};
use crate::pick::{no_pick_reason, NoPick, Pick, PickContext};
use crate::set::EndpointSet;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};

/// How many endpoints a strategy may choose for one request before it gives up. A claim
/// fails only when another thread filled the endpoint between the eligibility check and
/// `Pick::try_new`; that endpoint is then no longer eligible, so the next choice lands
/// elsewhere, and a few losses in a row mean everything is filling up anyway.
const CLAIM_ATTEMPTS: usize = 4;

/// Runs `choose` until its endpoint can be claimed, then explains an empty choice.
///
/// An endpoint that holds a burst its CPU reports have not judged yet is not claimed
/// while a sibling is full at its learned limit, or on its way (`waits_for_judgement`);
/// nor is one whose limit is lifted for the client connections it serves and that holds
/// more work than its limited siblings (`above_its_held_siblings`). Either way the
/// request waits in drover's queue and goes wherever room opens first.
pub(crate) fn claim<'s>(
    set: &'s EndpointSet,
    ctx: &PickContext<'_>,
    mut choose: impl FnMut() -> Option<&'s Arc<Endpoint>>,
) -> Result<Pick, NoPick> {
    for _ in 0..CLAIM_ATTEMPTS {
        match choose() {
            Some(e) if waits_for_judgement(set, e, ctx.now) => break,
            // Another draw (p2c's) may find a sibling with room.
            Some(e) if above_its_held_siblings(set, e, ctx.now) => continue,
            Some(e) => {
                if let Some(pick) = Pick::try_new(e, ctx) {
                    return Ok(pick);
                }
            }
            None => break,
        }
    }
    Err(no_pick_reason(set.endpoints(), ctx))
}

/// Whether `e` should take no more for now: it holds a burst that no CPU report has
/// judged (`Endpoint::holds_an_unjudged_burst`) while another endpoint of the set is full
/// at its learned limit, or while a member the set expects has not joined yet (a worker
/// starting). Then the request waits in drover's queue, and goes wherever room opens
/// first, instead of behind that burst.
///
/// Why: the learned limit holds requests back only once an endpoint's CPU reads
/// saturated, one 25 ms sample after it got busy. In a burst the endpoint read first is
/// held to its limit (4 at first) and every other request of the burst goes to the
/// endpoints not read yet: 40 gRPC calls of 150 ms at once over two grpc-js workers went
/// 35 / 5, 30 / 10 and 36 / 4 in 3 of 16 runs (`backend_http2.rs`, a debug build beside
/// three CPU hogs), and the worker with 36 answered them 5 s later while the other stood
/// idle; with this rule, 0 of 16. Nothing is held when no endpoint is limited (an
/// I/O-bound app never is), and a report settles it within 50-75 ms.
///
/// A sibling still starting counts too: at a cold start the first worker ready was the
/// only endpoint when 100 requests of 0.33 s came at once (a client that started with
/// drover), and it took all 100 in 8 ms; the second joined 0.4 s later and got only
/// what the queue held after that, while the first's last requests waited 45 s inside
/// it, over twice the 19 s of Node cluster's slowest (`NEW_CONN=1 N=400
/// POINTS=20000000 bash bench/burst.sh`, in 6 of 8 runs). Node's cluster module hands a
/// worker its next connection only once it has taken the last, which a worker busy
/// with CPU work does not, so the second worker got its half there.
fn waits_for_judgement(set: &EndpointSet, e: &Arc<Endpoint>, now: Nanos) -> bool {
    e.holds_an_unjudged_burst(now)
        && (set.awaited() > 0 || a_sibling_is_full_at_its_limit(set, e, now))
}

/// Whether `e` should take no more for now: its CPU is saturated but no learned limit
/// holds it back, as it serves client connections of its own
/// (`Endpoint::is_saturated_but_lifted`); some sibling is full at its limit; and `e`
/// already holds the most work any such sibling holds, plus the pipeline budget.
///
/// Why: with every sibling full, the lifted endpoint is the only one with room, and took
/// the whole queue at once. On bursts at 2.8 x capacity over 4 workers on 2 cores
/// (`bench/sweep.sh --seed 14 --only 2`), held to 1 request each, a few connections
/// opened as a burst began were handed to a worker of their own, and that worker then
/// took 191 requests while the other three held one each. It worked through them alone
/// for 1.4 s while the others stood idle: p99 1.1-1.5 s in half the bursts where Node
/// cluster's was 0.85 s. Kept level with its siblings, it takes more as fast as it
/// serves what it holds, and its handed connections' requests wait behind no more.
///
/// The lift stays where every endpoint is lifted or has room (the I/O-bound app it is
/// for), and where `e`'s requests mostly wait. The scan over siblings runs only once `e`
/// holds the pipeline budget's worth.
fn above_its_held_siblings(set: &EndpointSet, e: &Arc<Endpoint>, now: Nanos) -> bool {
    let holds = e.pending_cost();
    if holds < PIPELINE_BUDGET || !e.is_saturated_but_lifted(now) {
        return false;
    }
    set.endpoints()
        .iter()
        .filter(|other| !Arc::ptr_eq(other, e) && other.is_full_at_its_limit(now))
        .map(|other| other.pending_cost())
        .max()
        .is_some_and(|most| holds >= most.saturating_add(PIPELINE_BUDGET))
}

fn a_sibling_is_full_at_its_limit(set: &EndpointSet, e: &Arc<Endpoint>, now: Nanos) -> bool {
    set.endpoints()
        .iter()
        .any(|other| !Arc::ptr_eq(other, e) && other.is_full_at_its_limit(now))
}

/// The eligible endpoint with the lowest `score`, scanning from `start` so that ties do
/// not all go to the first endpoint of the set.
pub(crate) fn least_by<'s>(
    endpoints: &'s [Arc<Endpoint>],
    ctx: &PickContext<'_>,
    start: usize,
    mut score: impl FnMut(&Endpoint) -> f64,
) -> Option<&'s Arc<Endpoint>> {
    if endpoints.is_empty() {
        return None;
    }
    let (tail, head) = endpoints.split_at(start % endpoints.len());
    let mut best: Option<(&Arc<Endpoint>, f64)> = None;
    for e in head.iter().chain(tail).filter(|e| ctx.eligible(e)) {
        let s = score(e);
        if best.is_none_or(|(_, b)| s < b) {
            best = Some((e, s));
        }
    }
    best.map(|(e, _)| e)
}

/// The eligible endpoint of `set` with the least load: a free one (idle, not saturated)
/// if any, whichever's turn it is (`idle_turns`, by `Endpoint::idle_share`), else the one
/// with the least pending work (`Endpoint::pending_score`).
///
/// Free endpoints are not ranked by their latency estimates: with nothing pending those
/// differ by noise (a GC pause, a cold cache), and ranking by them sent light traffic
/// (one request at a time) to one endpoint only, which then was the only one whose
/// estimate was ever refreshed. A restarted worker was never tried. Taking turns among
/// idle endpoints spreads light traffic by weight, as weighted round-robin does, and
/// keeps samples coming from every endpoint; under load nothing is idle and the score
/// decides.
pub(crate) fn least_loaded<'s>(
    set: &'s EndpointSet,
    ctx: &PickContext<'_>,
    start: usize,
) -> Option<&'s Arc<Endpoint>> {
    let endpoints = set.endpoints();
    if endpoints.is_empty() {
        return None;
    }
    let (tail, head) = endpoints.split_at(start % endpoints.len());
    let candidates = head.iter().chain(tail).filter(|e| ctx.eligible(e));
    least_loaded_of(candidates, set.idle_turns(), ctx)
}

/// A busy endpoint this thread holds no idle connection to counts its pending work this
/// many times (see `least_loaded_of`).
///
/// Why: a new connection to a busy backend waits longer than its pending work. A Node
/// server busy with CPU work accepts about one connection per turn of its event loop
/// and reads a new connection's request a turn after that, while it serves every
/// connection it already reads each turn. With 94 requests in each of 4 Node backends
/// (a turn of ~0.3 s), 8 connections opened at once to one of them were answered 4.2 to
/// 5.5 s later, and 8 opened 3 s before their requests in 0.19 s. Balancing by pending
/// work alone moves each endpoint's share up and down, and each rise past what the
/// thread's pool holds opened connections into such a wait: `drover proxy` over 4 Node
/// backends, 375 keep-alive clients (`bench/sweep.sh --seed 13 --only 10`), opened ~1
/// connection a second per backend under steady load, and requests that took one
/// waited up to 10 s; p99 3.2-8.5 s against HAProxy leastconn's 0.66-0.79 s, which keeps
/// each backend's count, and so its connections, steady. Twice the pending work is one
/// turn more, the least a new connection costs.
pub const NEW_CONNECTION_FACTOR: f64 = 2.0;

/// The least loaded of `candidates` (all eligible), by the rule of `least_loaded`, idle
/// ones taking `turns`; `p2c` calls it with its two draws.
///
/// Among busy endpoints, one the picking thread holds an idle connection to (`pooled`)
/// is taken over a less loaded one it would have to connect to anew, unless the latter
/// has less than 1 / `NEW_CONNECTION_FACTOR` of its pending work.
pub(crate) fn least_loaded_of<'s>(
    candidates: impl IntoIterator<Item = &'s Arc<Endpoint>>,
    turns: &IdleTurns,
    ctx: &PickContext<'_>,
) -> Option<&'s Arc<Endpoint>> {
    let now = ctx.now;
    let mut idle: Option<(&Arc<Endpoint>, Turn)> = None;
    // The earliest start among the idle endpoints not (or no longer) chosen.
    let mut others_start = f64::INFINITY;
    let mut best: Option<(&Arc<Endpoint>, f64)> = None;
    // The least loaded busy endpoint reached on an idle connection, when `best` is not.
    let mut best_pooled: Option<(&Arc<Endpoint>, f64)> = None;
    for e in candidates {
        // With nothing pending, the endpoint that served this connection's last request
        // is as good as any other idle one, and it may hold what the app keeps of this
        // client (an in-memory session, as express-session's default store keeps it):
        // Node's cluster module never moves a connection. Drawn among the idle ones, one
        // browser tab's pages after its login were placed on the other worker, logged
        // out. Its CPU may read saturated, from that very request (a first request's
        // compiling), and that moved one page in a hundred. Under load nothing is idle
        // and the score decides. (The pointer first: most picks have no previous, and
        // need no load of a pending count for it.) It counts as its turn.
        if ctx.previous.is_some_and(|p| Arc::ptr_eq(p, e)) && e.is_idle() {
            turns.take_out_of_turn(e, e.idle_share(now));
            return Some(e);
        }
        if e.is_free(now) {
            let turn = turns.next(e, e.idle_share(now));
            match idle {
                Some((_, first)) if !turn.is_before(&first) => {
                    others_start = others_start.min(turn.start());
                }
                _ => {
                    if let Some((_, passed)) = idle {
                        others_start = others_start.min(passed.start());
                    }
                    idle = Some((e, turn));
                }
            }
        } else if idle.is_none() {
            let s = e.pending_score(now, ctx.guess);
            // The pool is looked up only for a score that could win with it.
            let could_win = best_pooled.is_none_or(|(_, p)| s < p)
                && best.is_none_or(|(_, b)| s < b * NEW_CONNECTION_FACTOR);
            if could_win && ctx.pooled.is_some_and(|p| p.has_idle(e)) {
                best_pooled = Some((e, s));
            }
            if best.is_none_or(|(_, b)| s < b) {
                best = Some((e, s));
            }
        }
    }
    if let Some((e, turn)) = idle {
        turns.take(e, turn, others_start);
        return Some(e);
    }
    match (best, best_pooled) {
        (Some((_, b)), Some((p, s))) if s <= b * NEW_CONNECTION_FACTOR => Some(p),
        _ => best.map(|(e, _)| e),
    }
}

/// The next eligible index in rotation, from a shared counter.
///
/// When the counter's slot is not eligible, the counter is advanced past the slots it
/// skipped too. Without that the endpoint after a dead one would inherit the dead one's
/// turns and take twice its share; with it, each counter value is consumed once and the
/// eligible endpoints share evenly.
pub(crate) fn rotate(
    counter: &AtomicUsize,
    endpoints: &[Arc<Endpoint>],
    ctx: &PickContext<'_>,
) -> Option<usize> {
    let n = endpoints.len();
    if n == 0 {
        return None;
    }
    let start = counter.fetch_add(1, Relaxed) % n;
    let skipped = (0..n).position(|k| ctx.eligible(&endpoints[(start + k) % n]))?;
    if skipped > 0 {
        counter.fetch_add(skipped, Relaxed);
    }
    Some((start + skipped) % n)
}

/// A random start index for `least_by`: a thread-local draw, so concurrent pickers do
/// not contend on a shared counter just to break ties.
pub(crate) fn random_start(len: usize) -> usize {
    if len == 0 {
        0
    } else {
        fastrand::usize(..len)
    }
}

/// Tables derived from a set snapshot (Maglev, the sticky id index), built once per
/// generation and shared by every pick on that snapshot.
///
/// Two entries, because while the registry swaps in a new set, requests that loaded the
/// old snapshot a moment earlier still pick from it; with one entry the two generations
/// would evict each other and rebuild on every pick. The lock is held only to compare a
/// generation and clone an `Arc`; a build (rare) happens under it so that concurrent
/// pickers wait for one build instead of each doing their own.
#[derive(Debug)]
pub(crate) struct PerSet<T> {
    entries: Mutex<[Entry<T>; 2]>,
}

/// A table and the generation it was built for.
type Entry<T> = Option<(u64, Arc<T>)>;

impl<T> Default for PerSet<T> {
    fn default() -> Self {
        PerSet {
            entries: Mutex::new([None, None]),
        }
    }
}

impl<T> PerSet<T> {
    pub(crate) fn get(&self, set: &EndpointSet, build: impl FnOnce(&EndpointSet) -> T) -> Arc<T> {
        let generation = set.generation();
        let mut entries = lock(&self.entries);
        if let Some((_, t)) = entries.iter().flatten().find(|(g, _)| *g == generation) {
            return Arc::clone(t);
        }
        let table = Arc::new(build(set));
        // Replace the empty or older entry, keeping the newest generation seen.
        let victim = match &*entries {
            [None, _] => 0,
            [_, None] => 1,
            [Some((a, _)), Some((b, _))] => usize::from(a > b),
        };
        entries[victim] = Some((generation, Arc::clone(&table)));
        table
    }
}

/// Locks, ignoring poison: every state kept behind these locks is valid at every step,
/// so a panic elsewhere while holding one leaves nothing half-done.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(n: usize) -> EndpointSet {
        EndpointSet::new(
            (0..n)
                .map(|i| {
                    Arc::new(Endpoint::new(
                        format!("127.0.0.1:{}", 1000 + i).parse().unwrap(),
                    ))
                })
                .collect(),
        )
    }

    #[test]
    fn a_burst_no_report_judged_waits_while_a_sibling_is_full_at_its_limit() {
        use crate::endpoint::{JUDGED_AFTER, JUDGEMENT_WAIT_MAX, LIMIT_INITIAL};
        use crate::strategy::p2c::P2c;
        use crate::Balancer;
        // 150 ms calls: above the pipeline budget, so a limit is strict.
        let at = |now| PickContext {
            now,
            cost: 150_000_000,
            ..Default::default()
        };
        // Two CPU-reported endpoints; A read saturated first and holds its limit of
        // working requests.
        let a_full_at_its_limit = || {
            let s = set(2);
            let a = s.endpoints()[0].clone();
            for e in s.endpoints() {
                e.set_adaptive(true);
                e.report_load(1, 0.1);
            }
            a.report_load(2, 1.0);
            let on_a: Vec<Pick> = (0..LIMIT_INITIAL as usize)
                .map(|_| Pick::try_new(&a, &at(3)).unwrap())
                .collect();
            assert!(a.limit_in_force(3) && !a.has_capacity(3));
            (s, on_a)
        };
        let (s, _on_a) = a_full_at_its_limit();
        let b = &s.endpoints()[1];
        // B, not read since it got busy, takes as many, then waits for a report.
        let t = 4;
        let on_b: Vec<Pick> = (0..LIMIT_INITIAL as usize)
            .map(|_| P2c::new().pick(&s, &at(t)).unwrap())
            .collect();
        assert!(on_b.iter().all(|p| Arc::ptr_eq(p.endpoint(), b)));
        assert_eq!(
            P2c::new().pick(&s, &at(t + 1)).unwrap_err(),
            NoPick::AllBusy
        );
        // A report from wholly inside its busy spell, not saturated: it takes more.
        b.report_load(t + JUDGED_AFTER, 0.5);
        let p = P2c::new().pick(&s, &at(t + JUDGED_AFTER)).unwrap();
        assert!(Arc::ptr_eq(p.endpoint(), b));
        // With no report at all, the hold ends after JUDGEMENT_WAIT_MAX.
        let (s, _on_a) = a_full_at_its_limit();
        let _on_b: Vec<Pick> = (0..LIMIT_INITIAL as usize)
            .map(|_| P2c::new().pick(&s, &at(t)).unwrap())
            .collect();
        assert!(P2c::new().pick(&s, &at(t + 1)).is_err());
        assert!(P2c::new().pick(&s, &at(t + JUDGEMENT_WAIT_MAX)).is_ok());
    }

    #[test]
    fn a_worker_serving_clients_is_kept_level_with_siblings_full_at_their_limits() {
        use crate::endpoint::LIMIT_INITIAL;
        use crate::strategy::p2c::P2c;
        use crate::Balancer;
        let at = |now| PickContext {
            now,
            cost: 50_000_000,
            ..Default::default()
        };
        // Two saturated workers of 50 ms requests. B was handed a client connection, so
        // its learned limit is lifted, while A is held to its own, and full.
        let s = set(2);
        let (a, b) = (s.endpoints()[0].clone(), s.endpoints()[1].clone());
        for e in s.endpoints() {
            e.set_adaptive(true);
            e.report_load(1, 1.0);
        }
        b.note_handed_connection();
        assert_eq!(b.concurrency_cap(2), 0, "lifted");
        let mut on_a: Vec<Pick> = (0..LIMIT_INITIAL as usize)
            .map(|_| Pick::try_new(&a, &at(2)).unwrap())
            .collect();
        assert!(a.is_full_at_its_limit(2));
        let mut on_b = Vec::new();
        while let Ok(p) = P2c::new().pick(&s, &at(3)) {
            assert!(Arc::ptr_eq(p.endpoint(), &b));
            on_b.push(p);
            assert!(on_b.len() <= 100, "B took the whole queue");
        }
        // As much work as A holds (4 x 50 ms), and the pipeline budget's worth more.
        assert_eq!(on_b.len(), LIMIT_INITIAL as usize + 1);
        // Room at A: the next goes there. B takes more as it answers.
        on_a.pop();
        on_a.push(P2c::new().pick(&s, &at(4)).unwrap());
        assert!(Arc::ptr_eq(on_a.last().unwrap().endpoint(), &a));
        assert!(P2c::new().pick(&s, &at(4)).is_err());
        on_b.truncate(2);
        assert!(Arc::ptr_eq(
            P2c::new().pick(&s, &at(4)).unwrap().endpoint(),
            &b
        ));

        // With no sibling held to a limit (both serve clients), nothing is held.
        let s = set(2);
        for e in s.endpoints() {
            e.set_adaptive(true);
            e.report_load(1, 1.0);
            e.note_handed_connection();
        }
        let all: Vec<Pick> = (0..40)
            .map(|_| P2c::new().pick(&s, &at(5)).unwrap())
            .collect();
        assert_eq!(all.len(), 40);
    }

    #[test]
    fn a_burst_goes_on_where_no_sibling_is_held_to_a_limit() {
        use crate::strategy::p2c::P2c;
        use crate::Balancer;
        // Neither endpoint read saturated (an I/O-bound app): nothing waits for a report.
        let s = set(2);
        for e in s.endpoints() {
            e.set_adaptive(true);
            e.report_load(1, 0.1);
        }
        let ctx = PickContext {
            now: 2,
            cost: 150_000_000,
            ..Default::default()
        };
        let held: Vec<Pick> = (0..40)
            .map(|_| P2c::new().pick(&s, &ctx).unwrap())
            .collect();
        assert_eq!(held.len(), 40);
    }

    #[test]
    fn a_burst_no_report_judged_waits_while_a_member_is_on_its_way() {
        use crate::endpoint::{JUDGED_AFTER, LIMIT_INITIAL};
        use crate::strategy::p2c::P2c;
        use crate::Balancer;
        let at = |now| PickContext {
            now,
            cost: 150_000_000,
            ..Default::default()
        };
        // The first of two workers is the only endpoint yet (a cold start).
        let s = set(1).awaiting(1);
        assert_eq!(s.awaited(), 1);
        let a = &s.endpoints()[0];
        a.set_adaptive(true);
        a.report_load(1, 0.1);
        let on_a: Vec<Pick> = (0..LIMIT_INITIAL as usize)
            .map(|_| P2c::new().pick(&s, &at(2)).unwrap())
            .collect();
        assert_eq!(
            P2c::new().pick(&s, &at(3)).unwrap_err(),
            NoPick::AllBusy,
            "the rest of the burst waits in drover's queue"
        );
        // Judged not saturated (it mostly waits on I/O, say): it takes the rest.
        a.report_load(2 + JUDGED_AFTER, 0.3);
        assert!(P2c::new().pick(&s, &at(2 + JUDGED_AFTER)).is_ok());
        drop(on_a);
        // A worker with no CPU report yet (it just joined) holds a burst as well.
        let s = set(1).awaiting(1);
        let a = &s.endpoints()[0];
        a.set_adaptive(true);
        a.set_worker_life(crate::WorkerLife::Running);
        let on_a: Vec<Pick> = (0..LIMIT_INITIAL as usize)
            .map(|_| P2c::new().pick(&s, &at(2)).unwrap())
            .collect();
        assert!(P2c::new().pick(&s, &at(3)).is_err());
        drop(on_a);
        // With every expected member here, nothing waits for a report.
        let s = set(2);
        assert_eq!(s.awaited(), 0);
        let a = &s.endpoints()[0];
        a.set_adaptive(true);
        a.report_load(1, 0.1);
        let on_a: Vec<Pick> = (0..LIMIT_INITIAL as usize + 1)
            .map(|_| Pick::try_new(a, &at(2)).unwrap())
            .collect();
        assert!(a.holds_an_unjudged_burst(3));
        assert!(!waits_for_judgement(&s, a, 3));
        drop(on_a);
    }

    #[test]
    fn least_by_breaks_ties_from_start() {
        let s = set(3);
        let ctx = PickContext::default();
        for start in 0..6 {
            let e = least_by(s.endpoints(), &ctx, start, |_| 1.0).unwrap();
            assert!(Arc::ptr_eq(e, &s.endpoints()[start % 3]));
        }
        assert!(least_by(&[], &ctx, 0, |_| 1.0).is_none());
    }

    #[test]
    fn per_set_builds_once_per_generation_and_survives_a_swap() {
        let cache = PerSet::<u64>::default();
        let (a, b, c) = (set(1), set(2), set(3));
        let mut builds = 0;
        let mut get = |s: &EndpointSet| {
            *cache.get(s, |s| {
                builds += 1;
                s.len() as u64
            })
        };
        assert_eq!(get(&a), 1);
        assert_eq!(get(&b), 2);
        assert_eq!(get(&a), 1);
        assert_eq!(get(&b), 2);
        assert_eq!(get(&c), 3); // evicts a, the oldest
        assert_eq!(get(&b), 2);
        assert_eq!(builds, 3);
    }
}
