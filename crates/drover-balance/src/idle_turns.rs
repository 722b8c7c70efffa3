//! Whose turn it is among idle endpoints: which free endpoint takes the next request when
//! several have nothing pending.
//!
//! Stride scheduling (Waldspurger and Weihl, 1995), kept as virtual times: an endpoint's
//! next turn lies `1 / share` after its last one (`Endpoint::idle_share`: weight after
//! slow start, less the load it reports), and the earliest turn wins. Over any run of
//! picks each idle endpoint gets its share, to within one turn, in rotation.
//!
//! Why not a weighted coin, as before: a coin gets the shares right only on average, and
//! it sends the next request to the endpoint that has just answered as often as to any
//! other, while another stands idle. Node's cluster module, nginx least_conn and HAProxy
//! leastconn rotate. Two clients opening a connection per request over 4 Node backends
//! on 2 cores (3.3 ms of CPU each): a third of the coin's picks went to the backend that
//! had just answered, and `drover proxy` served 410-430 req/s where nginx served 464-501
//! (0.87 x); in turns, 473-515 against 451-491. Under `drover run -w 4`, 412-434 req/s
//! with the coin, 440-468 in turns, nginx 440-470 (seed 16's quick sweep had this at
//! 0.94 x, sample 16).
//!
//! A pool keeps a virtual clock across its snapshots: the earliest start among the idle
//! endpoints passed over at the last pick. An endpoint whose last turn lies further back
//! (it was busy, saturated or ejected while the others took turns, or has just joined)
//! starts its next turn at the clock, and then takes turns in its share like the rest,
//! instead of every turn it missed in a row.

use crate::endpoint::Endpoint;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// The smallest share a turn is spaced by, so a huge reported load cannot push an
/// endpoint's next turn out of reach (it still comes last among the idle ones).
const MIN_SHARE: f64 = 1e-3;

/// A pool's virtual clock (f64 bits): the earliest start among the idle endpoints of the
/// last pick; and how many turns were taken, to order them. Each endpoint keeps where its
/// own last turn ended and when it took it (`Endpoint::last_idle_turn`).
#[derive(Debug, Default)]
pub struct IdleTurns {
    clock: AtomicU64,
    taken: AtomicU64,
}

/// An endpoint's next turn, from `IdleTurns::next`: it starts where its last one ended,
/// or at the clock if that is later, and ends `1 / share` after.
#[derive(Clone, Copy, Debug)]
pub struct Turn {
    start: f64,
    end: f64,
    stride: f64,
    /// When the endpoint last took a turn (`IdleTurns::taken`; 0: never).
    last_taken: u64,
}

impl Turn {
    /// Whether this turn comes before `other`: it ends earlier, by more than half a
    /// stride; else its endpoint's last turn was taken earlier.
    ///
    /// Why not the end alone: equal shares end their turns together at the end of every
    /// round, and whichever endpoint was found first then won, the one that had just
    /// answered as often as any other. A third of the picks of 2 clients over 4 Node
    /// workers went to the worker whose request had just ended, and `drover run -w 4`
    /// served 428-445 req/s where nginx least_conn served 468-498. In the order of their
    /// last turns, 476-508. Shares that differ a little (the CPU each worker reports) end
    /// apart by that little, and are ordered the same way.
    pub fn is_before(&self, other: &Turn) -> bool {
        let near = 0.5 * self.stride.min(other.stride);
        if (self.end - other.end).abs() < near {
            self.last_taken < other.last_taken
        } else {
            self.end < other.end
        }
    }

    /// Where this turn starts, for `IdleTurns::take`'s `others_start`.
    pub fn start(&self) -> f64 {
        self.start
    }
}

/// How far apart the turns of an endpoint with `share` lie.
fn stride(share: f64) -> f64 {
    1.0 / share.max(MIN_SHARE)
}

impl IdleTurns {
    fn clock(&self) -> f64 {
        f64::from_bits(self.clock.load(Relaxed))
    }

    /// The next turn of `e`, whose share is `share`.
    pub fn next(&self, e: &Endpoint, share: f64) -> Turn {
        let (last_end, last_taken) = e.last_idle_turn();
        let start = last_end.max(self.clock());
        let stride = stride(share);
        Turn {
            start,
            end: start + stride,
            stride,
            last_taken,
        }
    }

    /// `e` takes `turn`, chosen over idle endpoints whose turns start at `others_start`
    /// at the earliest (infinity if there were none). The clock moves up to the earliest
    /// start left among them, so it never passes an idle endpoint that waits for its
    /// turn, and an endpoint that missed turns starts no earlier. Concurrent pickers may
    /// race here: a lost update costs one turn's spacing, not a share.
    pub fn take(&self, e: &Endpoint, turn: Turn, others_start: f64) {
        self.record(e, turn.end);
        let clock = others_start.min(turn.end);
        if clock > self.clock() {
            self.clock.store(clock.to_bits(), Relaxed);
        }
    }

    /// `e` takes `turn` without the others' turns being known (a connection's next
    /// request goes where its last went): it counts as `e`'s turn of the round under
    /// way, and the clock stays.
    ///
    /// At most one turn ahead of the clock: each such request counted a full turn once,
    /// and a keep-alive client's run of them pushed its endpoint's turns thousands of
    /// picks ahead of the others'. After a reload under 4 keep-alive clients, a worker
    /// in slow start (a tenth of its share, so ten times the stride) served one of them
    /// alone, and then was passed over by the next 300 new connections, one at a time,
    /// while it stood idle (`a_pm2_ecosystem_file_runs_its_apps_as_pm2_runs_them`, 4 of
    /// 12 runs, 3 at a time). A client's own connection is its traffic, not a debt
    /// that new clients must repay.
    pub fn take_out_of_turn(&self, e: &Endpoint, share: f64) {
        // The turn starts at the clock, wherever its last one ended.
        self.record(e, self.clock() + stride(share));
    }

    /// `e`'s last turn, taken now, ends at `end`.
    fn record(&self, e: &Endpoint, end: f64) {
        let taken = self.taken.fetch_add(1, Relaxed) + 1;
        e.set_last_idle_turn(end, taken);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint(i: u8) -> Endpoint {
        Endpoint::new(format!("10.0.0.{i}:80").parse().unwrap())
    }

    /// Takes `n` turns among `shares` (all idle at every pick); the index of each.
    fn turns(clock: &IdleTurns, eps: &[Endpoint], shares: &[f64], n: usize) -> Vec<usize> {
        (0..n)
            .map(|_| {
                let next: Vec<Turn> = eps
                    .iter()
                    .zip(shares)
                    .map(|(e, &s)| clock.next(e, s))
                    .collect();
                let mut i = 0;
                for (k, t) in next.iter().enumerate() {
                    if t.is_before(&next[i]) {
                        i = k;
                    }
                }
                let others = next
                    .iter()
                    .enumerate()
                    .filter(|&(k, _)| k != i)
                    .map(|(_, t)| t.start())
                    .fold(f64::INFINITY, f64::min);
                clock.take(&eps[i], next[i], others);
                i
            })
            .collect()
    }

    #[test]
    fn equal_shares_rotate() {
        let clock = IdleTurns::default();
        let eps: Vec<_> = (1..=4).map(endpoint).collect();
        let order = turns(&clock, &eps, &[1.0; 4], 40);
        for window in order.chunks(4) {
            let mut seen = window.to_vec();
            seen.sort();
            assert_eq!(seen, [0, 1, 2, 3], "{order:?}");
        }
    }

    #[test]
    fn unequal_shares_are_kept_to_within_a_turn_at_every_point() {
        let clock = IdleTurns::default();
        let eps: Vec<_> = (1..=3).map(endpoint).collect();
        let shares = [1.0, 3.0, 1.0 / 1.8];
        let total: f64 = shares.iter().sum();
        let order = turns(&clock, &eps, &shares, 1_000);
        for (i, &share) in shares.iter().enumerate() {
            for upto in [10, 100, 1_000] {
                let got = order[..upto].iter().filter(|&&k| k == i).count() as f64;
                let due = upto as f64 * share / total;
                assert!(
                    (got - due).abs() <= 1.5,
                    "{i} got {got} of {upto}, due {due}"
                );
            }
        }
    }

    #[test]
    fn the_endpoint_that_just_answered_waits_behind_the_others() {
        // Two clients in a closed loop over 4 endpoints: at each pick one endpoint is
        // busy with the other client's request, and the one that answered last is idle
        // again. Its turn ends with the others' at the end of each round, or a little
        // apart where shares differ a little (the CPU each worker reports); it waits.
        for shares in [[1.0; 4], [1.0, 1.02, 0.97, 1.01]] {
            let clock = IdleTurns::default();
            let eps: Vec<_> = (1..=4).map(endpoint).collect();
            let (mut busy, mut just_answered) = (None, None);
            for _ in 0..100 {
                // Scanned from the one that just answered: a tie would go to it.
                let first = just_answered.unwrap_or(0);
                let idle: Vec<(usize, Turn)> = (0..4)
                    .map(|k| (k + first) % 4)
                    .filter(|&k| Some(k) != busy)
                    .map(|k| (k, clock.next(&eps[k], shares[k])))
                    .collect();
                let (i, turn) = idle
                    .iter()
                    .copied()
                    .reduce(|a, b| if b.1.is_before(&a.1) { b } else { a })
                    .unwrap();
                assert_ne!(Some(i), just_answered, "{shares:?}");
                let others = idle.iter().filter(|(k, _)| *k != i).map(|(_, t)| t.start());
                clock.take(&eps[i], turn, others.fold(f64::INFINITY, f64::min));
                just_answered = busy;
                busy = Some(i);
            }
        }
    }

    #[test]
    fn a_run_of_requests_out_of_turn_counts_as_one_turn() {
        // At its full share, and in slow start (a tenth of it: one turn is ten rounds).
        for (share, rounds) in [(1.0, 1), (0.1, 10)] {
            let clock = IdleTurns::default();
            let eps: Vec<_> = (1..=3).map(endpoint).collect();
            turns(&clock, &eps, &[1.0; 3], 30);
            // Endpoint 0 serves a keep-alive client's 1,000 requests while the others
            // stand idle.
            for _ in 0..1_000 {
                clock.take_out_of_turn(&eps[0], share);
            }
            // Its share back, it waits out that one turn, then takes its turns again.
            let order = turns(&clock, &eps, &[1.0; 3], 60);
            let back = order.iter().position(|&k| k == 0);
            assert!(back.is_some_and(|i| i <= 2 * rounds), "{share}: {order:?}");
            for window in order[back.unwrap() + 1..].chunks_exact(3) {
                assert_eq!(window.iter().filter(|&&k| k == 0).count(), 1, "{order:?}");
            }
        }
    }

    #[test]
    fn an_endpoint_that_missed_turns_rejoins_at_the_clock() {
        let clock = IdleTurns::default();
        let eps: Vec<_> = (1..=3).map(endpoint).collect();
        // Endpoint 2 is busy for 300 picks while the others take turns.
        turns(&clock, &eps[..2], &[1.0; 2], 300);
        // Back, it takes one turn of the next three, not the 100 it missed.
        let order = turns(&clock, &eps, &[1.0; 3], 30);
        for window in order.chunks(3) {
            assert_eq!(window.iter().filter(|&&k| k == 2).count(), 1, "{order:?}");
        }
    }
}
