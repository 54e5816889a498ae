//! A counter that many threads bump without sharing a cache line.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

const STRIPES: usize = 16;

/// One stripe on a cache line of its own (128 bytes: two lines, against
/// adjacent-line prefetching).
#[derive(Debug, Default)]
#[repr(align(128))]
struct Stripe(AtomicU64);

/// A counter striped over cache lines: each thread adds to its own stripe,
/// so request-path increments never contend; reads sum the stripes.
#[derive(Debug, Default)]
pub(crate) struct Counter {
    stripes: [Stripe; STRIPES],
}

thread_local! {
    static STRIPE: Cell<usize> = const { Cell::new(usize::MAX) };
}

/// Hands threads their stripes round-robin.
static NEXT_STRIPE: AtomicUsize = AtomicUsize::new(0);

fn stripe() -> usize {
    STRIPE.with(|stripe| {
        let mut index = stripe.get();
        if index == usize::MAX {
            index = NEXT_STRIPE.fetch_add(1, Ordering::Relaxed) % STRIPES;
            stripe.set(index);
        }
        index
    })
}

impl Counter {
    #[inline]
    pub(crate) fn increment(&self) {
        self.stripes[stripe()].0.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn get(&self) -> u64 {
        self.stripes
            .iter()
            .map(|s| s.0.load(Ordering::Relaxed))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn sums_increments_from_every_thread() {
        let counter = Arc::new(Counter::default());
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let counter = Arc::clone(&counter);
                std::thread::spawn(move || (0..1000).for_each(|_| counter.increment()))
            })
            .collect();
        for thread in threads {
            thread.join().expect("thread");
        }
        assert_eq!(counter.get(), 8000);
    }
}
