//! A Node worker with no health check whose event loop stops turning while its main
//! thread computes, for `LOOP_HANG` of computing: an endless loop, found hung.
//!
//! Without `--health-path`, nothing asked whether a worker still served: a Node worker
//! that entered `for (;;);` on one request kept its slot for good, every request sent
//! to it timed out, and the app ran on one worker fewer until someone noticed (PM2 and
//! Node's cluster module do the same; Bun/Deno seat #5). drover's preload answers a ping
//! from the worker's event loop, so a loop that no longer turns is seen without a probe
//! the app has to serve. Busy is not hung: a loop that turns between requests, however
//! heavy they are, answers; one that is stopped or waits (a deadlock, `Atomics.wait`)
//! computes nothing, and is left alone as before, having no check to fail. Only a main
//! thread that ran `LOOP_HANG` (not wall time: a worker starved of a core is judged on
//! the time it ran) with its loop silent all along is hung, far past what any request
//! computes without yielding (`--health-path` finds it sooner, with its own timings).

use crate::cpu;
use crate::health::Unhealthy;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;

/// How much a main thread computes with its event loop silent before it is hung.
pub(crate) const LOOP_HANG: Duration = Duration::from_secs(30);

/// How often the main thread's CPU is read, and a silent loop's spell looked at.
const LOOK: Duration = Duration::from_secs(2);

/// The share of a look the main thread must have run for a spell to begin: an endless
/// loop runs all of it.
const SPINS: f64 = 0.5;

/// What the watch needs of a serving Node worker.
pub(crate) struct LoopWatched<'a> {
    /// The worker's process; its app's is the one the preload names (below a runner
    /// such as `npm start`).
    pub pid: u32,
    /// Its session with drover's preload, which answers pings from the event loop.
    pub event_loop: &'a drover_node::Inbox,
    /// One per app: taken by the worker about to be restarted (see `health`).
    pub restarts: &'a Arc<Semaphore>,
}

/// A spell in which the event loop answered no ping.
struct Spell {
    /// When the spell's ping went: an answer after it ends the spell.
    pinged: Instant,
    /// The main thread's run time then.
    ran_ns: u64,
}

/// The main thread's run time and its read and write calls, at one look.
#[derive(Clone, Copy)]
struct Look {
    ran_ns: u64,
    io_calls: u64,
}

impl Look {
    fn of(pid: u32) -> Option<Look> {
        Some(Look {
            ran_ns: cpu::main_thread_run_ns(pid)?,
            io_calls: cpu::main_thread_io_calls(pid)?,
        })
    }
}

/// Returns once the worker's event loop has been silent while its main thread ran for
/// `LOOP_HANG`, and the app's restart permit is free (one worker at a time, as for
/// health restarts). Never returns for a worker without drover's preload: it cannot be
/// asked.
pub(crate) async fn until_loop_hangs(w: LoopWatched<'_>) -> Unhealthy {
    let mut before: Option<Look> = None;
    let mut spell: Option<Spell> = None;
    let mut waiting_logged = false;
    loop {
        tokio::time::sleep(LOOK).await;
        let pid = w.event_loop.app_pid().unwrap_or(w.pid);
        let Some(now) = Look::of(pid) else {
            continue;
        };
        let then = before.replace(now);
        if !w.event_loop.answers_pings() {
            spell = None;
            continue;
        }
        // Its loop turned, or its main thread read or wrote (a batch of requests that
        // arrived together is computed in one turn of the loop, each answer written as
        // it is done, on connections handed to it where drover sees none): not hung.
        let turned = spell
            .as_ref()
            .is_some_and(|s| w.event_loop.event_loop_answered_since(s.pinged));
        let did_io = then.is_some_and(|t| now.io_calls != t.io_calls);
        if turned || did_io {
            spell = None;
        }
        let Some(s) = &spell else {
            let share = then.map_or(0.0, |t| {
                now.ran_ns.saturating_sub(t.ran_ns) as f64 / LOOK.as_nanos() as f64
            });
            if share >= SPINS && !did_io {
                spell = Some(Spell {
                    pinged: Instant::now(),
                    ran_ns: now.ran_ns,
                });
                w.event_loop.ping();
            }
            continue;
        };
        let computed = Duration::from_nanos(now.ran_ns.saturating_sub(s.ran_ns));
        if computed < LOOP_HANG {
            continue;
        }
        match Arc::clone(w.restarts).try_acquire_owned() {
            Ok(permit) => {
                let reason = format!(
                    "hung: its event loop answered no ping for {:.1}s while its main thread \
                     computed {:.1}s (an endless loop? a request that blocks the loop this \
                     long is found sooner with --health-path, which also sets how long: \
                     --fall, --health-interval)",
                    s.pinged.elapsed().as_secs_f64(),
                    computed.as_secs_f64(),
                );
                return Unhealthy {
                    reason,
                    hung: true,
                    stopped: false,
                    permit,
                };
            }
            Err(_) => {
                if !waiting_logged {
                    tracing::warn!(
                        pid,
                        "worker's event loop silent while it computes; waiting for the app's \
                         other replacement to be ready before restarting it"
                    );
                    waiting_logged = true;
                }
            }
        }
    }
}
