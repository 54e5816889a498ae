//! The two filter kinds side by side, in one process: bits per key, guard
//! lookup time (present and absent keys), build time, and for the counting
//! filter the time to apply deletes.
//!
//! ```text
//! cargo run --release -p bloom-guard --example filter_compare -- 1000000 10000000
//! cargo run --release -p bloom-guard --example filter_compare -- churn 1000000 10000000
//! ```
//!
//! `churn N M`: a counting filter of `N` keys takes `M` deletes and `M`
//! inserts of new keys (batches of 10 000, the oldest keys deleted), as a
//! feed would bring them; every `M / 10` its memory, key count, estimated
//! and measured false-positive rates, and whether a rebuild is due.

#![allow(clippy::print_stdout, reason = "a benchmark reports on stdout")]

use std::hint::black_box;
use std::time::Instant;

use bloom_guard::{
    feed::{CatchUp, PendingFilter},
    keys::KeyBatch,
    BloomGuard, BuildError, KeySource,
};
use futures_util::future::BoxFuture;
use futures_util::stream::{self, BoxStream, StreamExt};

/// Keys `0..n`, scanned "at feed position 0".
struct Keys(u64);

impl KeySource for Keys {
    type Error = std::convert::Infallible;

    async fn count_hint(&self) -> Result<Option<u64>, Self::Error> {
        Ok(Some(self.0))
    }

    fn keys(&self) -> BoxStream<'static, Result<KeyBatch, Self::Error>> {
        let n = self.0;
        stream::iter((0..n.div_ceil(8192)).map(move |chunk| {
            let mut batch: KeyBatch = (chunk * 8192..((chunk + 1) * 8192).min(n))
                .map(key)
                .collect();
            if chunk == 0 {
                batch.set_position("0");
            }
            Ok(batch)
        }))
        .boxed()
    }
}

/// A feed with nothing after position 0.
struct Quiet;

impl CatchUp for Quiet {
    fn catch_up(&self, pending: PendingFilter) -> BoxFuture<'_, Result<u64, BuildError>> {
        Box::pin(async move { pending.promote() })
    }
}

const RATE: f64 = 0.001;
const PROBES: u64 = 2_000_000;

fn key(i: u64) -> String {
    format!("user-{i:012}")
}

/// Nanoseconds per `may_contain` over `PROBES` keys from `first`.
fn lookup_ns(guard: &BloomGuard, first: u64, stride: u64) -> f64 {
    let keys: Vec<String> = (0..PROBES)
        .map(|i| key(first + (i * stride) % (u64::MAX / 4)))
        .collect();
    let started = Instant::now();
    let mut found = 0_u64;
    for key in &keys {
        found += u64::from(guard.may_contain(black_box(key)));
    }
    black_box(found);
    started.elapsed().as_nanos() as f64 / PROBES as f64
}

/// A counting filter of `n` keys under `m` deletes and inserts.
async fn churn(n: u64, m: u64) {
    let guard = BloomGuard::builder()
        .expected_items(n)
        .false_positive_rate(RATE)
        .read_barrier(false)
        .build();
    let reader = guard.feed().reader();
    reader.catch_up_with(Quiet);
    guard.rebuild(&Keys(n)).await.expect("build");
    println!("| deletes and inserts | live keys | bits | bits/live key | estimated fpp | measured fpp | deletes applied | rebuild due |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---|");
    let report = |done: u64| {
        let stats = guard.stats();
        let probes = 200_000;
        let hits = (0..probes)
            .filter(|i| guard.may_contain(format!("absent-{i}")))
            .count();
        println!(
            "| {done} | {} | {} | {:.2} | {:.5} | {:.5} | {} | {:?} |",
            stats.keys,
            stats.bits,
            stats.bits as f64 / stats.keys.max(1) as f64,
            stats.estimated_fpp,
            hits as f64 / probes as f64,
            stats.deletes_applied,
            guard.feed().rebuild_due()
        );
    };
    report(0);
    let batch = 10_000;
    let mut oldest = 0;
    let mut done = 0;
    while done < m {
        let removed: KeyBatch = (oldest..oldest + batch).map(key).collect();
        let added: KeyBatch = (n + oldest..n + oldest + batch).map(key).collect();
        guard.feed().apply(&added, &removed, None, None);
        oldest += batch;
        done += batch;
        if done % (m / 10).max(batch) == 0 {
            report(done);
        }
    }
    let started = Instant::now();
    let present = (oldest..oldest + 100_000).all(|i| guard.may_contain(key(i)));
    println!(
        "every live key present: {present} ({:?})",
        started.elapsed()
    );
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("churn") {
        let n = args
            .get(1)
            .and_then(|n| n.parse().ok())
            .unwrap_or(1_000_000);
        let m = args
            .get(2)
            .and_then(|m| m.parse().ok())
            .unwrap_or(10_000_000);
        churn(n, m).await;
        return;
    }
    let sizes: Vec<u64> = std::env::args()
        .skip(1)
        .filter_map(|n| n.parse().ok())
        .collect();
    let sizes = if sizes.is_empty() {
        vec![1_000_000]
    } else {
        sizes
    };
    println!("| keys | filter | bits/key | build s | lookup present ns | lookup absent ns | measured fpp | delete ns |");
    println!("|---:|---|---:|---:|---:|---:|---:|---:|");
    for n in sizes {
        let keys = Keys(n);
        for counting in [false, true] {
            let guard = BloomGuard::builder()
                .expected_items(n)
                .headroom(0.0)
                .false_positive_rate(RATE)
                .read_barrier(false)
                .build();
            // A feed reader makes the guard's filters counting ones.
            let reader = counting.then(|| guard.feed().reader());
            if let Some(reader) = &reader {
                reader.catch_up_with(Quiet);
            }
            let started = Instant::now();
            guard.rebuild(&keys).await.expect("build");
            let build = started.elapsed().as_secs_f64();
            let stats = guard.stats();
            let present = lookup_ns(&guard, 0, 7919 % n.max(1));
            let absent = lookup_ns(&guard, n * 10, 1);
            let false_positives = (0..PROBES)
                .filter(|i| guard.may_contain(key(n * 10 + i)))
                .count();
            let delete_ns = if counting {
                let removed: KeyBatch = (0..n.min(1_000_000)).map(key).collect();
                let started = Instant::now();
                guard
                    .feed()
                    .apply(&KeyBatch::default(), &removed, None, None);
                format!(
                    "{:.0}",
                    started.elapsed().as_nanos() as f64 / removed.len() as f64
                )
            } else {
                "n/a".to_owned()
            };
            println!(
                "| {n} | {} | {:.2} | {build:.2} | {present:.0} | {absent:.0} | {:.5} | {delete_ns} |",
                if counting { "counting (qfilter)" } else { "bloom (fastbloom)" },
                stats.bits as f64 / n as f64,
                false_positives as f64 / PROBES as f64,
            );
        }
    }
}
