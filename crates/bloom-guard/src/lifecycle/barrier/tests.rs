use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::*;

fn barrier(bound: Duration) -> Arc<Barrier> {
    Arc::new(Barrier::new(Some(bound), ReadPace::default()))
}

/// Waits with a ticket taken now, on a task of its own.
fn wait_now(barrier: &Arc<Barrier>) -> tokio::task::JoinHandle<bool> {
    let ticket = barrier.ticket();
    let barrier = Arc::clone(barrier);
    tokio::spawn(async move { barrier.wait(ticket).await })
}

async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_read_that_began_before_the_request_does_not_pass_the_barrier() {
    let barrier = barrier(Duration::from_millis(100));
    let reader = FeedReader::new(Arc::clone(&barrier));
    let early = reader.begin();
    let wait = wait_now(&barrier);
    settle().await;
    // The early read finishes after the request arrived: not enough.
    reader.done(early);
    settle().await;
    assert!(!wait.is_finished());
    let late = reader.begin();
    reader.done(late);
    assert!(wait.await.expect("the wait runs"));
}

#[tokio::test(start_paused = true)]
async fn without_a_read_the_wait_gives_up_at_the_bound() {
    let barrier = barrier(Duration::from_millis(100));
    let _reader = FeedReader::new(Arc::clone(&barrier));
    let started = Instant::now();
    assert!(!barrier.wait(barrier.ticket()).await);
    let waited = started.elapsed();
    // One clock for every waiter, looked at every eighth of the bound.
    assert!(
        waited >= Duration::from_millis(100) && waited <= Duration::from_millis(126),
        "waited {waited:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn every_waiter_gives_up_within_the_bound_and_two_ticks_of_the_one_clock() {
    let barrier = barrier(Duration::from_millis(80));
    let _reader = FeedReader::new(Arc::clone(&barrier));
    let start = Instant::now();
    let mut waits = Vec::new();
    for i in 0..40u64 {
        let ticket = barrier.ticket();
        let barrier = Arc::clone(&barrier);
        let arrived = Instant::now();
        let wait = tokio::spawn(async move {
            let read = barrier.wait(ticket).await;
            (read, arrived.elapsed())
        });
        // Some waiters leave early (their client went away), the first
        // among them.
        if i % 3 == 0 {
            settle().await;
            wait.abort();
        } else {
            waits.push(wait);
        }
        tokio::time::advance(Duration::from_millis(3)).await;
    }
    for wait in waits {
        let (read, waited) = wait.await.expect("the wait runs");
        assert!(!read);
        assert!(
            waited >= Duration::from_millis(80) && waited <= Duration::from_millis(101),
            "waited {waited:?}"
        );
    }
    assert!(start.elapsed() < Duration::from_secs(1));
}

#[tokio::test(start_paused = true)]
async fn after_a_failed_read_refusals_go_on_at_once_until_one_succeeds() {
    let barrier = barrier(Duration::from_secs(1));
    let reader = FeedReader::new(Arc::clone(&barrier));
    let waiting = wait_now(&barrier);
    settle().await;
    reader.failed();
    let started = Instant::now();
    assert!(
        !waiting.await.expect("the wait runs"),
        "a wait outlived the failure"
    );
    assert!(!barrier.wait(barrier.ticket()).await);
    assert_eq!(
        started.elapsed(),
        Duration::ZERO,
        "waited for a read that cannot come"
    );
    // The database is back: waits wait again.
    reader.done(reader.begin());
    let wait = wait_now(&barrier);
    settle().await;
    reader.done(reader.begin());
    assert!(wait.await.expect("the wait runs"));
}

#[tokio::test(start_paused = true)]
async fn with_two_followers_a_refusal_waits_for_a_read_of_each() {
    let barrier = barrier(Duration::from_secs(1));
    let (items, orders) = (
        FeedReader::new(Arc::clone(&barrier)),
        FeedReader::new(Arc::clone(&barrier)),
    );
    let wait = wait_now(&barrier);
    // Both were asked.
    items.asked().await;
    orders.asked().await;
    items.done(items.begin());
    settle().await;
    assert!(
        !wait.is_finished(),
        "one follower's read proved the other's table"
    );
    orders.done(orders.begin());
    assert!(wait.await.expect("the wait runs"));
    // A follower that stops no longer holds refusals back.
    let wait = wait_now(&barrier);
    settle().await;
    drop(orders);
    settle().await;
    assert!(!wait.is_finished());
    items.done(items.begin());
    assert!(wait.await.expect("the wait runs"));
}

#[tokio::test(start_paused = true)]
async fn a_follower_that_joins_during_a_wait_is_waited_for_too() {
    let barrier = barrier(Duration::from_secs(1));
    let items = FeedReader::new(Arc::clone(&barrier));
    let wait = wait_now(&barrier);
    settle().await;
    let orders = FeedReader::new(Arc::clone(&barrier));
    items.done(items.begin());
    settle().await;
    assert!(!wait.is_finished(), "the new follower's table was not read");
    orders.asked().await;
    orders.done(orders.begin());
    assert!(wait.await.expect("the wait runs"));
}

#[tokio::test(start_paused = true)]
async fn waits_ask_the_reader_once_per_read() {
    let barrier = barrier(Duration::from_secs(1));
    let reader = FeedReader::new(Arc::clone(&barrier));
    assert!(barrier.active());
    let waits: Vec<_> = (0..100).map(|_| wait_now(&barrier)).collect();
    settle().await;
    // Every ask so far is one read: it serves them all.
    reader.asked().await;
    reader.done(reader.begin());
    for wait in waits {
        assert!(wait.await.expect("the wait runs"));
    }
    let no_more = tokio::time::timeout(Duration::from_millis(10), reader.asked()).await;
    assert!(no_more.is_err(), "a second read was asked for");
    drop(reader);
    // The filter follows the table no more: refusals go on at once.
    assert!(barrier.active());
    let started = Instant::now();
    assert!(!barrier.wait(barrier.ticket()).await);
    assert_eq!(started.elapsed(), Duration::ZERO);
    // A reader that joins again takes the waits back.
    let again = FeedReader::new(Arc::clone(&barrier));
    let wait = wait_now(&barrier);
    settle().await;
    again.done(again.begin());
    assert!(wait.await.expect("the wait runs"));
}

#[tokio::test(start_paused = true)]
async fn a_guard_that_never_had_a_reader_has_no_barrier() {
    let barrier = barrier(Duration::from_secs(1));
    assert!(!barrier.active());
}

#[tokio::test(start_paused = true)]
async fn a_lone_refusal_is_read_for_at_once_and_a_flood_shares_reads() {
    let pace = ReadPace::default()
        .refusals_per_read(10)
        .max_gap(Duration::from_millis(20))
        .max_reads_per_sec(1_000_000);
    let barrier = Arc::new(Barrier::new(Some(Duration::from_secs(1)), pace));
    let reader = FeedReader::new(Arc::clone(&barrier));
    tokio::time::advance(Duration::from_secs(1)).await;
    // A lone refusal after a quiet spell.
    let lone = wait_now(&barrier);
    let asked_at = Instant::now();
    reader.asked().await;
    assert_eq!(asked_at.elapsed(), Duration::ZERO);
    reader.done(reader.begin());
    assert!(lone.await.expect("the wait runs"));
    // Two more right after, faster than the quiet rate: they wait for
    // company, at most the gap.
    let next = wait_now(&barrier);
    let _also = wait_now(&barrier);
    reader.asked().await;
    assert_eq!(asked_at.elapsed(), Duration::from_millis(20));
    reader.done(reader.begin());
    assert!(next.await.expect("the wait runs"));
    // Company enough: the read starts at once.
    let started = Instant::now();
    let flood: Vec<_> = (0..10).map(|_| wait_now(&barrier)).collect();
    reader.asked().await;
    assert_eq!(started.elapsed(), Duration::ZERO);
    reader.done(reader.begin());
    for wait in flood {
        assert!(wait.await.expect("the wait runs"));
    }
}

/// The barrier's promise as a model: waiters commit a key to a "database"
/// and then ask; a reader reads the database from a snapshot taken after
/// `begin` and puts it in a "filter". A waiter the barrier releases must
/// find its key in the filter, however the reads and the waiters
/// interleave. Releasing a waiter on a read that began before its request
/// arrived (one read early) fails it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_waiter_is_released_before_a_read_that_holds_its_key() {
    const WAITERS: u64 = 4_000;
    let pace = ReadPace::default()
        .refusals_per_read(8)
        .max_gap(Duration::from_micros(200))
        .max_reads_per_sec(100_000);
    let barrier = Arc::new(Barrier::new(Some(Duration::from_secs(30)), pace));
    let database = Arc::new(AtomicU64::new(0));
    let filter = Arc::new(AtomicU64::new(0));
    let reader = FeedReader::new(Arc::clone(&barrier));
    let reads = Arc::new(AtomicUsize::new(0));
    let reading = tokio::spawn({
        let (database, filter, reads) = (
            Arc::clone(&database),
            Arc::clone(&filter),
            Arc::clone(&reads),
        );
        async move {
            loop {
                reader.asked().await;
                let read = reader.begin();
                let snapshot = database.load(Ordering::SeqCst);
                // Commits land while the read is in flight.
                for _ in 0..fastrand::usize(0..4) {
                    tokio::task::yield_now().await;
                }
                filter.fetch_max(snapshot, Ordering::SeqCst);
                reader.done(read);
                reads.fetch_add(1, Ordering::Relaxed);
            }
        }
    });
    let mut waiters = Vec::new();
    // In waves, each while the reads of the last go on: requests arrive
    // while reads are in flight, whatever the machine's load.
    for wave in 0..WAITERS / 100 {
        for _ in 0..100 {
            let (barrier, database, filter) = (
                Arc::clone(&barrier),
                Arc::clone(&database),
                Arc::clone(&filter),
            );
            waiters.push(tokio::spawn(async move {
                let key = database.fetch_add(1, Ordering::SeqCst) + 1;
                let ticket = barrier.ticket();
                let read = barrier.wait(ticket).await;
                // Released: the key must be in the filter now.
                assert!(
                    !read || filter.load(Ordering::SeqCst) >= key,
                    "key {key} refused"
                );
                read
            }));
            if fastrand::u8(..) < 16 {
                tokio::task::yield_now().await;
            }
        }
        while reads.load(Ordering::Relaxed) <= wave as usize {
            tokio::task::yield_now().await;
        }
    }
    let mut released = 0;
    for waiter in waiters {
        released += usize::from(waiter.await.expect("no waiter was released too early"));
    }
    reading.abort();
    assert_eq!(released, WAITERS as usize, "a waiter gave up");
    let reads = reads.load(Ordering::Relaxed);
    assert!(
        reads > 10,
        "{reads} reads: the waiters never overlapped a read"
    );
    assert!(reads < WAITERS as usize, "{reads} reads: one per waiter");
}

/// The clock runs on a waiter's runtime: when that runtime stops, a waiter
/// on another starts it again, and still gives up at the bound.
#[test]
fn the_clock_starts_again_on_another_runtime() {
    let barrier = barrier(Duration::from_millis(40));
    let reader = FeedReader::new(Arc::clone(&barrier));
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a runtime")
    };
    // A waiter on the first runtime starts the clock; the runtime stops
    // while it waits.
    let first = runtime();
    first.block_on(async {
        let ticket = barrier.ticket();
        let waiting = Arc::clone(&barrier);
        tokio::spawn(async move { waiting.wait(ticket).await });
        tokio::time::sleep(Duration::from_millis(5)).await;
    });
    drop(first);
    // On another, with no read ever coming, the wait still ends.
    let started = std::time::Instant::now();
    let read = runtime().block_on(async { barrier.wait(barrier.ticket()).await });
    assert!(!read);
    assert!(started.elapsed() < Duration::from_secs(2), "no clock");
    drop(reader);
}

/// A read of a wake-up (a write elsewhere) is no reason to hold the next
/// refusal's read back: the pace counts only reads refusals asked for.
#[tokio::test(start_paused = true)]
async fn a_refusal_right_after_a_wake_up_read_is_read_for_at_once() {
    let barrier = barrier(Duration::from_secs(1));
    let reader = FeedReader::new(Arc::clone(&barrier));
    tokio::time::advance(Duration::from_secs(1)).await;
    // The follower reads for a NOTIFY; nobody asked.
    reader.done(reader.begin());
    let wait = wait_now(&barrier);
    let asked_at = Instant::now();
    reader.asked().await;
    assert_eq!(asked_at.elapsed(), Duration::ZERO, "held back by the pace");
    reader.done(reader.begin());
    assert!(wait.await.expect("the wait runs"));
    // One refusal a millisecond after an asked read is no flood.
    tokio::time::advance(Duration::from_millis(1)).await;
    let next = wait_now(&barrier);
    let asked_at = Instant::now();
    reader.asked().await;
    assert_eq!(asked_at.elapsed(), Duration::ZERO, "held back by the pace");
    reader.done(reader.begin());
    assert!(next.await.expect("the wait runs"));
}

#[tokio::test(start_paused = true)]
async fn a_read_made_for_another_guard_serves_the_refusals_that_asked_before_it() {
    let barrier = barrier(Duration::from_secs(1));
    let reader = FeedReader::new(Arc::clone(&barrier));
    // No refusal waits: no read on its behalf.
    assert!(reader.begin_if_asked().is_none());
    let before = wait_now(&barrier);
    settle().await;
    let shared = reader.begin_if_asked().expect("a refusal waits");
    // Asked once, read once: no second read on its behalf.
    assert!(reader.begin_if_asked().is_none());
    let after = wait_now(&barrier);
    settle().await;
    reader.done(shared);
    assert!(before.await.expect("the wait runs"));
    settle().await;
    // The read began before the second request arrived: not enough.
    assert!(!after.is_finished());
    // The reader's own loop is asked for the second only.
    reader.asked().await;
    reader.done(reader.begin());
    assert!(after.await.expect("the wait runs"));
}

#[tokio::test(start_paused = true)]
async fn an_ask_another_guard_read_for_does_not_wake_the_reader_again() {
    let pace = ReadPace::default()
        .refusals_per_read(10)
        .max_gap(Duration::from_millis(20))
        .quiet_below(0);
    let barrier = Arc::new(Barrier::new(Some(Duration::from_secs(1)), pace));
    let reader = FeedReader::new(Arc::clone(&barrier));
    let first = wait_now(&barrier);
    reader.asked().await;
    reader.done(reader.begin());
    assert!(first.await.expect("the wait runs"));
    // A flood: the next read waits for company or the gap.
    let wait = wait_now(&barrier);
    let asked = tokio::time::timeout(Duration::from_millis(5), reader.asked());
    let shared = async {
        settle().await;
        let read = reader.begin_if_asked().expect("a refusal waits");
        reader.done(read);
    };
    let (asked, ()) = tokio::join!(asked, shared);
    assert!(wait.await.expect("the wait runs"));
    assert!(
        asked.is_err(),
        "the reader was asked for a read already made"
    );
    // Nor after the gap, with no refusal since.
    let asked = tokio::time::timeout(Duration::from_millis(50), reader.asked()).await;
    assert!(
        asked.is_err(),
        "the reader was asked for a read already made"
    );
}

/// A mutation that lets `begin_if_asked` number a read before the asks it
/// takes (one read early) must fail this: many waiters, reads for them by
/// a reader that records which requests' keys it saw.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_made_for_another_guard_never_release_a_waiter_that_arrived_after_they_began() {
    let barrier = barrier(Duration::from_secs(30));
    let reader = Arc::new(FeedReader::new(Arc::clone(&barrier)));
    // Requests "commit" key n, then wait; the read sees every key committed
    // before it began.
    let committed = Arc::new(AtomicU64::new(0));
    let filter = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reads = {
        let (reader, committed, filter, stop) = (
            Arc::clone(&reader),
            Arc::clone(&committed),
            Arc::clone(&filter),
            Arc::clone(&stop),
        );
        tokio::spawn(async move {
            while !stop.load(Ordering::Acquire) {
                let Some(read) = reader.begin_if_asked() else {
                    tokio::task::yield_now().await;
                    continue;
                };
                let seen = committed.load(Ordering::SeqCst);
                tokio::task::yield_now().await;
                filter.fetch_max(seen, Ordering::SeqCst);
                reader.done(read);
            }
        })
    };
    let late = Arc::new(AtomicUsize::new(0));
    let waiters: Vec<_> = (0..2_000)
        .map(|_| {
            let (barrier, committed, filter, late) = (
                Arc::clone(&barrier),
                Arc::clone(&committed),
                Arc::clone(&filter),
                Arc::clone(&late),
            );
            tokio::spawn(async move {
                let key = committed.fetch_add(1, Ordering::SeqCst) + 1;
                let ticket = barrier.ticket();
                assert!(barrier.wait(ticket).await, "the wait timed out");
                if filter.load(Ordering::SeqCst) < key {
                    late.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for waiter in waiters {
        waiter.await.expect("the waiter runs");
    }
    stop.store(true, Ordering::Release);
    reads.await.expect("the reads run");
    assert_eq!(late.load(Ordering::Relaxed), 0, "waiters released early");
}

#[tokio::test(start_paused = true)]
async fn refusals_waiting_on_guards_that_share_reads_make_company_together() {
    let pace = ReadPace::default()
        .refusals_per_read(10)
        .max_gap(Duration::from_millis(50))
        .quiet_below(0);
    let items = Arc::new(Barrier::new(Some(Duration::from_secs(1)), pace.clone()));
    let users = Arc::new(Barrier::new(Some(Duration::from_secs(1)), pace));
    let (first, second) = (
        FeedReader::new(Arc::clone(&items)),
        FeedReader::new(Arc::clone(&users)),
    );
    // A first read of each: from now on a flood, paced.
    for (barrier, reader) in [(&items, &first), (&users, &second)] {
        let wait = wait_now(barrier);
        reader.asked().await;
        reader.done(reader.begin());
        assert!(wait.await.expect("the wait runs"));
    }
    // Six refusals on each: neither has company enough alone, together they do.
    let waits: Vec<_> = (0..6)
        .flat_map(|_| [wait_now(&items), wait_now(&users)])
        .collect();
    settle().await;
    let alone = tokio::time::timeout(Duration::from_millis(10), first.asked()).await;
    assert!(alone.is_err(), "six refusals made company enough alone");
    // The reader that joined first leads; the other does not read too.
    let started = Instant::now();
    first.asked_with(&[&second]).await;
    assert!(
        started.elapsed() <= Duration::from_millis(2),
        "{:?}",
        started.elapsed()
    );
    let follows =
        tokio::time::timeout(Duration::from_millis(5), second.asked_with(&[&first])).await;
    assert!(follows.is_err(), "both readers led");
    // One statement for both: the leader's read and one made for the other.
    let own = first.begin();
    let shared = second
        .begin_if_asked()
        .expect("refusals wait on the other guard");
    first.done(own);
    second.done(shared);
    for wait in waits {
        assert!(wait.await.expect("the wait runs"));
    }
}
