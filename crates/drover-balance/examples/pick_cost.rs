//! ns per pick (and drop) for each strategy and pool size.
//!
//! cargo run --release -p drover-balance --example pick_cost

use drover_balance::{clock, Endpoint, EndpointSet, PickContext, Strategy};
use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

const PICKS: usize = 200_000;
const RUNS: usize = 5;

fn main() {
    let sizes = [2, 10, 100, 1000];
    print!("{:<12}", "strategy");
    for n in sizes {
        print!("{:>10}", format!("N={n}"));
    }
    println!("  1000÷10   (ns per pick+drop, median of {RUNS} runs)");
    let keys: Vec<String> = (0..1024).map(|i| format!("user-{i}")).collect();
    for s in Strategy::ALL {
        print!("{:<12}", s.to_string());
        let mut medians = Vec::new();
        for n in sizes {
            let set = EndpointSet::new(
                (0..n)
                    .map(|i| {
                        let addr = format!("10.2.{}.{}:80", i / 250, i % 250 + 1);
                        Arc::new(Endpoint::with_weight(
                            addr.parse().unwrap(),
                            1 + i as u32 % 3,
                        ))
                    })
                    .collect(),
            );
            let b = s.build();
            // Only `sticky`'s requests carry a pin (its cookie): under any other
            // strategy a pin would be a socket.io session's, and every pick would take
            // the pinned endpoint without the strategy's choice.
            let sticky = (s == Strategy::Sticky).then(|| set.endpoints()[n / 2].id().to_string());
            let now = clock::now();
            let mut runs: Vec<f64> = (0..=RUNS)
                .map(|_| {
                    let start = Instant::now();
                    for i in 0..PICKS {
                        let ctx = PickContext {
                            now,
                            hash_key: Some(keys[i % keys.len()].as_bytes()),
                            pinned: sticky.as_deref(),
                            ..Default::default()
                        };
                        drop(black_box(b.pick(black_box(&set), &ctx)));
                    }
                    start.elapsed().as_nanos() as f64 / PICKS as f64
                })
                .skip(1) // warm-up: table builds, caches
                .collect();
            runs.sort_by(f64::total_cmp);
            print!("{:>10.1}", runs[RUNS / 2]);
            medians.push(runs[RUNS / 2]);
        }
        // The membership target: a pool of 1,000 costs at most twice a pool of 10.
        println!("{:>9.2}", medians[3] / medians[1]);
    }
}
