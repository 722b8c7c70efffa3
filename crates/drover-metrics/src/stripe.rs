//! Per-thread stripes of counters.
//!
//! Every serving thread counts every request. One shared atomic per counter would move
//! its cache line between cores on each increment; a stripe per thread (up to
//! `MAX_STRIPES`) keeps each thread's increments on a line no other thread writes, and a
//! reader sums the stripes. A thread is given a stripe the first time it counts; threads
//! beyond the stripe count share stripes, which is still correct, only less cheap.

use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::OnceLock;

/// More stripes than this costs memory on every endpoint for little gain.
pub const MAX_STRIPES: usize = 4;

/// Aligned to two cache lines so that neighbouring stripes never share one (adjacent-line
/// prefetch pulls lines in pairs on x86).
#[repr(align(128))]
#[derive(Debug, Default)]
pub struct Padded<T>(pub T);

/// How many stripes each striped value has: one per core, at most `MAX_STRIPES`.
pub fn stripes() -> usize {
    static STRIPES: OnceLock<usize> = OnceLock::new();
    *STRIPES.get_or_init(|| {
        std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .clamp(1, MAX_STRIPES)
    })
}

/// This thread's stripe: always below `stripes()`.
#[inline]
pub fn stripe() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static MINE: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    MINE.with(|mine| {
        let s = mine.get();
        if s != usize::MAX {
            return s;
        }
        let s = NEXT.fetch_add(1, Relaxed) % stripes();
        mine.set(s);
        s
    })
}

/// One `T` per stripe.
#[derive(Debug)]
pub struct Striped<T> {
    stripes: Box<[Padded<T>]>,
}

impl<T: Default> Default for Striped<T> {
    fn default() -> Self {
        Striped {
            stripes: (0..stripes()).map(|_| Padded(T::default())).collect(),
        }
    }
}

impl<T> Striped<T> {
    /// The calling thread's stripe, to count on. Every `Striped` has `stripes()`
    /// stripes and `stripe()` is below that, so no division is needed here (one per
    /// count was a measurable part of what recording cost).
    #[inline]
    pub fn local(&self) -> &T {
        &self.stripes[stripe()].0
    }

    /// Every stripe, to sum.
    pub fn all(&self) -> impl Iterator<Item = &T> {
        self.stripes.iter().map(|p| &p.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;
    use std::sync::Arc;

    #[test]
    fn counts_from_many_threads_all_add_up() {
        let counter: Arc<Striped<AtomicU64>> = Arc::new(Striped::default());
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let counter = Arc::clone(&counter);
                std::thread::spawn(move || {
                    for _ in 0..1000 {
                        counter.local().fetch_add(1, Relaxed);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let total: u64 = counter.all().map(|c| c.load(Relaxed)).sum();
        assert_eq!(total, 8000);
        assert!(counter.all().count() <= MAX_STRIPES);
    }
}
