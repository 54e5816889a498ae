//! The counting filter through the public API: a guard with a feed reader
//! and an in-memory change feed, its builds brought up to date from their
//! scan's position, snapshots that carry it, and what it does when it
//! cannot be sure of a delete.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bloom_guard::feed::Position;
use bloom_guard::{
    feed::{AdoptError, CatchUp, PendingFilter},
    keys::KeyBatch,
    snapshot::Snapshot,
    stats::FilterKind,
    BloomGuard, BuildError, KeyList, KeySource,
};
use futures_util::future::BoxFuture;
use futures_util::stream::{self, BoxStream, StreamExt};

/// A table's changes in commit order: (key, added?). A position is how
/// many of them a filter holds.
#[derive(Clone, Default)]
struct Feed(Arc<Mutex<Vec<(String, bool)>>>);

impl Feed {
    fn add(&self, key: &str) {
        self.0.lock().expect("feed").push((key.to_owned(), true));
    }

    fn delete(&self, key: &str) {
        self.0.lock().expect("feed").push((key.to_owned(), false));
    }

    fn len(&self) -> usize {
        self.0.lock().expect("feed").len()
    }

    /// The rows added and removed after `from`, and the position reached.
    fn read(&self, from: usize) -> (KeyBatch, KeyBatch, usize) {
        let rows = self.0.lock().expect("feed");
        let (mut added, mut removed) = (KeyBatch::default(), KeyBatch::default());
        for (key, add) in &rows[from..] {
            if *add {
                added.push(key.as_bytes());
            } else {
                removed.push(key.as_bytes());
            }
        }
        (added, removed, rows.len())
    }

    /// Applies the feed after `from` to `guard`'s filter in use.
    fn follow(&self, guard: &BloomGuard, from: usize) -> usize {
        let (added, removed, reached) = self.read(from);
        guard.feed().apply(
            &added,
            &removed,
            Some(&Position::from(from.to_string())),
            Some(&Position::from(reached.to_string())),
        );
        reached
    }
}

impl CatchUp for Feed {
    fn catch_up(&self, pending: PendingFilter) -> BoxFuture<'_, Result<u64, BuildError>> {
        Box::pin(async move {
            let from = pending.position().parse().unwrap_or(0);
            let (added, removed, reached) = self.read(from);
            pending.apply(&added, &removed, &reached.to_string());
            pending.promote()
        })
    }
}

/// The table as of its feed's current position, one row per live insert,
/// tagged with that position.
impl KeySource for Feed {
    type Error = std::convert::Infallible;

    async fn count_hint(&self) -> Result<Option<u64>, Self::Error> {
        Ok(None)
    }

    fn keys(&self) -> BoxStream<'static, Result<KeyBatch, Self::Error>> {
        let rows = self.0.lock().expect("feed");
        let mut live: Vec<String> = Vec::new();
        for (key, add) in rows.iter() {
            if *add {
                live.push(key.clone());
            } else if let Some(at) = live.iter().position(|k| k == key) {
                live.remove(at);
            }
        }
        let mut batch: KeyBatch = live.iter().collect();
        batch.set_position(rows.len().to_string());
        stream::iter([Ok(batch)]).boxed()
    }
}

fn guard() -> BloomGuard {
    BloomGuard::builder()
        .name("items")
        .read_barrier(false)
        .write_window(Duration::from_millis(50))
        .build()
}

#[tokio::test]
async fn a_key_is_refused_again_with_its_last_row_and_only_then() {
    let feed = Feed::default();
    feed.add("a");
    feed.add("a");
    feed.add("b");
    let guard = guard();
    let reader = guard.feed().reader();
    reader.catch_up_with(feed.clone());
    guard.rebuild(&feed).await.expect("build");
    assert_eq!(guard.stats().filter_kind, Some(FilterKind::Counting));
    let mut at = feed.len();
    feed.delete("a");
    at = feed.follow(&guard, at);
    assert!(guard.may_contain("a"), "one row of two removed the key");
    feed.delete("a");
    feed.delete("b");
    feed.add("b");
    feed.follow(&guard, at);
    assert!(!guard.may_contain("a"));
    assert!(
        guard.may_contain("b"),
        "deleted and inserted again in one read"
    );
    assert_eq!(guard.stats().deletes_applied, 3);
}

#[tokio::test]
async fn a_build_is_brought_up_to_date_from_its_own_scan_not_from_the_follower() {
    let feed = Feed::default();
    feed.add("a");
    feed.add("b");
    let guard = guard();
    let reader = guard.feed().reader();
    reader.catch_up_with(feed.clone());
    guard.rebuild(&feed).await.expect("first build");
    // The follower stands at 2; "a" is deleted at 2 and the rebuild scans
    // at 3: the delete is in its scan already, and must not be applied
    // again to it (it would take another key's fingerprint with it).
    feed.delete("a");
    feed.add("c");
    guard.rebuild(&feed).await.expect("rebuild");
    let stats = guard.stats();
    assert_eq!((stats.keys, stats.deletes_applied), (2, 0), "{stats:?}");
    feed.delete("b");
    feed.follow(&guard, 4);
    assert!(!guard.may_contain("a") && !guard.may_contain("b") && guard.may_contain("c"));
}

#[tokio::test]
async fn the_write_paths_keys_are_found_for_the_window_and_come_into_the_filter_from_the_feed() {
    let feed = Feed::default();
    let guard = guard();
    let reader = guard.feed().reader();
    reader.catch_up_with(feed.clone());
    guard.rebuild(&feed).await.expect("build");
    guard.insert("new");
    assert!(guard.may_contain("new"), "this instance's own new key");
    assert_eq!(
        guard.stats().keys,
        0,
        "the write path put a copy in the filter"
    );
    // Its transaction rolled back: once the window passes, nothing is left.
    tokio::time::sleep(Duration::from_millis(80)).await;
    assert!(!guard.may_contain("new"));
}

#[tokio::test]
async fn a_snapshot_carries_its_position_and_its_adopter_applies_deletes_from_there() {
    let feed = Feed::default();
    for key in ["a", "b", "c"] {
        feed.add(key);
    }
    let first = guard();
    let reader = first.feed().reader();
    reader.catch_up_with(feed.clone());
    first.rebuild(&feed).await.expect("build");
    let at = feed.len();
    feed.delete("a");
    feed.follow(&first, at);
    // The position passed in is not used: the filter's own is.
    let writer = first
        .feed()
        .snapshot(&"ignored".into(), "q")
        .expect("an exact filter");
    assert_eq!(writer.info().position, "4");
    let bytes: Vec<u8> = writer.chunks(4096).flatten().collect();
    feed.delete("b");

    let second = guard();
    let second_reader = second.feed().reader();
    second_reader.catch_up_with(feed.clone());
    let snapshot = Snapshot::decode(&bytes).expect("intact");
    assert_eq!(snapshot.filter_kind(), FilterKind::Counting);
    let adoption = second
        .feed()
        .begin_adoption(snapshot, "q")
        .await
        .expect("adopt");
    let (added, removed, reached) = feed.read(adoption.info().position.parse().expect("a count"));
    adoption.apply(&added, &removed, &reached.to_string());
    adoption.promote().expect("promote");
    assert!(!second.may_contain("a") && !second.may_contain("b") && second.may_contain("c"));
    assert_eq!(second.stats().filter_kind, Some(FilterKind::Counting));
}

/// A read the follower applies while a snapshot is being adopted is read
/// again by the adoption's catch-up, from the snapshot's position: the
/// adopted filter takes its rows once, and their deletes leave no key.
#[tokio::test]
async fn a_read_during_an_adoption_reaches_the_adopted_filter_once() {
    let feed = Feed::default();
    feed.add("a");
    let first = guard();
    let first_reader = first.feed().reader();
    first_reader.catch_up_with(feed.clone());
    first.rebuild(&feed).await.expect("build");
    let bytes: Vec<u8> = first
        .feed()
        .snapshot(&"ignored".into(), "q")
        .expect("an exact filter")
        .chunks(4096)
        .flatten()
        .collect();

    let second = guard();
    let reader = second.feed().reader();
    reader.catch_up_with(feed.clone());
    second.rebuild(&feed).await.expect("its first filter");
    let mut at = feed.len();
    let adoption = second
        .feed()
        .begin_adoption(Snapshot::decode(&bytes).expect("intact"), "q")
        .await
        .expect("adopt");
    // The follower's read, before the catch-up holds the feed.
    feed.add("b");
    at = feed.follow(&second, at);
    let (added, removed, reached) = feed.read(adoption.info().position.parse().expect("a count"));
    adoption.apply(&added, &removed, &reached.to_string());
    adoption.promote().expect("promote");
    assert!(second.may_contain("b"));
    feed.delete("b");
    feed.follow(&second, at);
    assert!(!second.may_contain("b"), "the row was counted twice");
    assert_eq!(second.stats().deletes_left, 0);
}

#[tokio::test]
async fn a_bloom_snapshot_is_refused_by_a_guard_with_a_feed() {
    let bloom = guard();
    bloom.rebuild(&KeyList::new(["a"])).await.expect("build");
    let bytes: Vec<u8> = bloom
        .feed()
        .snapshot(&"1".into(), "q")
        .expect("complete")
        .chunks(4096)
        .flatten()
        .collect();
    let followed = guard();
    let _reader = followed.feed().reader();
    let refused = followed
        .feed()
        .begin_adoption(Snapshot::decode(&bytes).expect("intact"), "q")
        .await;
    assert!(
        matches!(
            refused,
            Err(AdoptError::Mismatch {
                what: "filter kind",
                ..
            })
        ),
        "{refused:?}"
    );
}

#[tokio::test]
async fn without_a_scan_position_deletes_are_left_not_guessed() {
    let guard = guard();
    let _reader = guard.feed().reader();
    // A source that names no feed position: the filter cannot tell which
    // deletes its scan already holds.
    guard
        .rebuild(&KeyList::new(["a", "b"]))
        .await
        .expect("build");
    let removed: KeyBatch = ["a"].into_iter().collect();
    guard
        .feed()
        .apply(&KeyBatch::default(), &removed, None, Some(&"9".into()));
    let stats = guard.stats();
    assert!(guard.may_contain("a"));
    assert_eq!((stats.deletes_applied, stats.deletes_left), (0, 1));
    assert!(
        guard.feed().snapshot(&"9".into(), "q").is_none(),
        "an inexact filter was published"
    );
}

#[tokio::test]
async fn kept_bloom_filters_never_forget() {
    let guard = BloomGuard::builder().forget_deleted_keys(false).build();
    let _reader = guard.feed().reader();
    guard.rebuild(&KeyList::new(["a"])).await.expect("build");
    assert_eq!(guard.stats().filter_kind, Some(FilterKind::Bloom));
    guard.feed().apply(
        &KeyBatch::default(),
        &["a"].into_iter().collect(),
        None,
        None,
    );
    assert!(guard.may_contain("a"));
}

#[tokio::test]
async fn a_snapshot_of_many_shards_read_back_in_odd_chunks_holds_every_key() {
    let feed = Feed::default();
    let keys: Vec<String> = (0..150_000).map(|i| format!("key-{i}")).collect();
    for key in &keys {
        feed.add(key);
    }
    let first = BloomGuard::builder()
        .name("items")
        .expected_items(150_000)
        .read_barrier(false)
        .build();
    let reader = first.feed().reader();
    reader.catch_up_with(feed.clone());
    first.rebuild(&feed).await.expect("build");
    let writer = first.feed().snapshot(&"".into(), "q").expect("exact");
    let len = writer.info().len;
    let bytes: Vec<u8> = writer.chunks(1001).flatten().collect();
    assert_eq!(bytes.len() as u64, len);
    assert_eq!(
        bytes[8..12],
        3_u32.to_le_bytes(),
        "one stage: the format versions before stages read"
    );

    let second = guard();
    let _reader = second.feed().reader();
    let snapshot = Snapshot::decode(&bytes).expect("intact");
    second
        .feed()
        .begin_adoption(snapshot, "q")
        .await
        .expect("adopt")
        .promote()
        .expect("promote");
    assert!(keys.iter().all(|key| second.may_contain(key)));
    assert_eq!(second.stats().keys, 150_000);
}

#[tokio::test]
async fn a_read_that_does_not_start_where_the_filter_stands_removes_nothing() {
    let feed = Feed::default();
    feed.add("a");
    feed.add("a");
    let guard = guard();
    let reader = guard.feed().reader();
    reader.catch_up_with(feed.clone());
    guard.rebuild(&feed).await.expect("build");
    // A follower that restarted reads from its own start, not from where
    // the filter stands: its deletes may be of rows the filter never held.
    feed.delete("a");
    let (added, removed, reached) = feed.read(2);
    guard.feed().apply(
        &added,
        &removed,
        Some(&"1".into()),
        Some(&Position::from(reached.to_string())),
    );
    let stats = guard.stats();
    assert_eq!(
        (stats.deletes_applied, stats.deletes_left),
        (0, 1),
        "{stats:?}"
    );
    assert!(guard.may_contain("a"));
    assert!(
        guard.feed().snapshot(&"".into(), "q").is_none(),
        "an inexact filter was published"
    );
}

#[tokio::test]
async fn a_second_follower_makes_the_filter_keep_deleted_keys() {
    let feed = Feed::default();
    feed.add("a");
    let guard = guard();
    let first = guard.feed().reader();
    first.catch_up_with(feed.clone());
    guard.rebuild(&feed).await.expect("build");
    let _second = guard.feed().reader();
    feed.delete("a");
    feed.follow(&guard, 1);
    assert!(guard.may_contain("a"));
    assert_eq!(guard.stats().deletes_left, 1);
}

#[tokio::test]
async fn a_delete_of_a_key_the_filter_lacks_stops_removals_and_asks_for_a_rebuild() {
    let feed = Feed::default();
    feed.add("a");
    feed.add("b");
    let guard = guard();
    let reader = guard.feed().reader();
    reader.catch_up_with(feed.clone());
    guard.rebuild(&feed).await.expect("build");
    // A row the scan never saw (another table on the feed, a write that
    // bypassed it) is deleted: the filter and the feed disagree.
    let removed: KeyBatch = ["never-scanned", "a"].into_iter().collect();
    guard.feed().apply(
        &KeyBatch::default(),
        &removed,
        Some(&"2".into()),
        Some(&"4".into()),
    );
    assert!(
        guard.may_contain("a"),
        "a delete after the disagreement was applied"
    );
    assert!(guard.feed().rebuild_due().is_some());
}

/// A guard with a 60 s write window, the read barrier on or off, built
/// from `feed` and following it: its reader.
async fn followed_with_window(
    feed: &Feed,
    barrier: bool,
) -> (BloomGuard, bloom_guard::feed::FeedReader) {
    let guard = BloomGuard::builder()
        .name("items")
        .read_barrier(barrier)
        .write_window(Duration::from_secs(60))
        .build();
    let reader = guard.feed().reader();
    reader.catch_up_with(feed.clone());
    guard.rebuild(feed).await.expect("build");
    (guard, reader)
}

/// The write window: a key this instance inserted is never refused before
/// the feed brings its row, and refused as soon as the feed brings another
/// client's delete of it afterwards, not a window later.
#[tokio::test]
async fn a_key_inserted_here_is_kept_until_its_row_is_read_then_refused_once_deleted() {
    use axum::routing::get;
    use axum::Router;
    use tower::ServiceExt;

    let feed = Feed::default();
    feed.add("old");
    let (guard, reader) = followed_with_window(&feed, true).await;
    // The follower: a read whenever a refusal waits, and every 5 ms.
    let (follower_feed, follower_guard) = (feed.clone(), guard.clone());
    let follower = tokio::spawn(async move {
        let mut at = follower_feed.len();
        loop {
            let read = reader.begin();
            at = follower_feed.follow(&follower_guard, at);
            reader.done(read);
            tokio::select! {
                () = reader.asked() => {}
                () = tokio::time::sleep(Duration::from_millis(5)) => {}
            }
        }
    });
    let app = Router::new()
        .route("/items/{key}", get(|| async { "found" }))
        .route_layer(guard.layer(bloom_guard::extract::PathParam("key")));
    let status = |key: &'static str| {
        let app = app.clone();
        async move {
            let request = http::Request::get(format!("/items/{key}"))
                .body(axum::body::Body::empty())
                .expect("request");
            app.oneshot(request).await.expect("infallible").status()
        }
    };
    let reads = || tokio::time::sleep(Duration::from_millis(30));

    // Inserted through this instance, not committed yet: never refused.
    guard.insert("new");
    reads().await;
    assert_eq!(status("new").await, http::StatusCode::OK);
    // Committed, its row read; then deleted by another client.
    feed.add("new");
    reads().await;
    assert_eq!(status("new").await, http::StatusCode::OK);
    feed.delete("new");
    reads().await;
    assert_eq!(
        status("new").await,
        http::StatusCode::NOT_FOUND,
        "a deleted key passed for the write window"
    );
    // Inserted again through this instance: kept until its new row.
    guard.insert("new");
    reads().await;
    assert_eq!(status("new").await, http::StatusCode::OK);
    feed.add("new");
    reads().await;
    feed.delete("new");
    reads().await;
    assert_eq!(status("new").await, http::StatusCode::NOT_FOUND);
    follower.abort();
}

/// Without the read barrier nothing but the window retires a journaled
/// key: a read of another client's row of the key (inserted and deleted)
/// may come before this instance's row commits, and then only the window
/// keeps it found.
#[tokio::test]
async fn without_the_barrier_a_journaled_key_lasts_the_window() {
    let feed = Feed::default();
    feed.add("old");
    let (guard, reader) = followed_with_window(&feed, false).await;
    let mut at = feed.len();
    guard.insert("new");
    // Another client's row of the key, inserted and deleted, read.
    feed.add("new");
    feed.delete("new");
    let read = reader.begin();
    at = feed.follow(&guard, at);
    reader.done(read);
    assert!(
        guard.may_contain("new"),
        "this instance's row is not read yet"
    );
    feed.add("new");
    feed.delete("new");
    let read = reader.begin();
    feed.follow(&guard, at);
    reader.done(read);
    assert!(
        guard.may_contain("new"),
        "the window keeps it without a barrier"
    );
}

/// With the barrier, a read that brings a row of the key and its delete
/// retires nothing: the row may have been another client's.
#[tokio::test]
async fn a_read_that_inserts_and_deletes_a_key_retires_no_entry_of_it() {
    let feed = Feed::default();
    feed.add("old");
    let (guard, reader) = followed_with_window(&feed, true).await;
    let at = feed.len();
    guard.insert("new");
    feed.add("new");
    feed.delete("new");
    let read = reader.begin();
    feed.follow(&guard, at);
    reader.done(read);
    assert!(guard.may_contain("new"), "retired by another client's row");
}

/// The share of `keys` the guard lets through.
fn passed<'a>(guard: &BloomGuard, keys: impl Iterator<Item = &'a String>) -> f64 {
    let (mut passed, mut all) = (0_usize, 0_usize);
    for key in keys {
        all += 1;
        passed += usize::from(guard.may_contain(key));
    }
    passed as f64 / all.max(1) as f64
}

#[tokio::test]
async fn a_guard_started_on_an_empty_table_grows_through_churn_without_a_rescan() {
    let target = 0.01;
    let feed = Feed::default();
    let guard = BloomGuard::builder()
        .name("items")
        .false_positive_rate(target)
        .read_barrier(false)
        .build();
    let reader = guard.feed().reader();
    reader.catch_up_with(feed.clone());
    guard.rebuild(&feed).await.expect("build");
    let generation = guard.stats().generation;

    let mut at = 0;
    let mut live: Vec<String> = Vec::new();
    let mut deleted: Vec<String> = Vec::new();
    let mut next = 0_u32;
    let mut add = |feed: &Feed, live: &mut Vec<String>, count: u32| {
        for _ in 0..count {
            let key = format!("row-{next}");
            next += 1;
            feed.add(&key);
            live.push(key);
        }
    };
    for _ in 0..50 {
        add(&feed, &mut live, 1_000);
        at = feed.follow(&guard, at);
    }
    for round in 0..5 {
        for key in live.drain(..10_000) {
            feed.delete(&key);
            deleted.push(key);
        }
        add(&feed, &mut live, 10_000);
        at = feed.follow(&guard, at);
        assert_eq!(guard.feed().rebuild_due(), None, "round {round}");
    }
    let stats = guard.stats();
    assert_eq!(stats.generation, generation, "a rescan: {stats:?}");
    assert!(stats.sub_filters > 1, "{stats:?}");
    assert!(
        live.iter().all(|key| guard.may_contain(key)),
        "a live key refused"
    );
    let deleted_passed = passed(&guard, deleted.iter());
    assert!(
        deleted_passed <= 2.0 * target,
        "deleted keys passed: {deleted_passed}"
    );
    let never: Vec<String> = (0..100_000).map(|i| format!("never-{i}")).collect();
    let never_passed = passed(&guard, never.iter());
    assert!(
        never_passed <= 2.0 * target,
        "never-seen keys passed: {never_passed}"
    );

    // Its snapshot carries every stage: the adopter answers alike and
    // applies the next deletes.
    let writer = guard.feed().snapshot(&"".into(), "q").expect("exact");
    assert_eq!(writer.info().sub_filters, stats.sub_filters);
    let bytes: Vec<u8> = writer.chunks(4096).flatten().collect();
    assert_eq!(
        bytes[8..12],
        bloom_guard::snapshot::SNAPSHOT_FORMAT.to_le_bytes()
    );
    let second = BloomGuard::builder()
        .name("items")
        .false_positive_rate(target)
        .read_barrier(false)
        .build();
    let _reader = second.feed().reader();
    let adoption = second
        .feed()
        .begin_adoption(Snapshot::decode(&bytes).expect("intact"), "q")
        .await
        .expect("adopt");
    let last = live.pop().expect("rows");
    feed.delete(&last);
    let (added, removed, reached) = feed.read(at);
    adoption.apply(&added, &removed, &reached.to_string());
    adoption.promote().expect("promote");
    assert!(live.iter().all(|key| second.may_contain(key)));
    let adopted = second.stats();
    assert_eq!(adopted.sub_filters, stats.sub_filters);
    assert_eq!(adopted.deletes_applied + adopted.deletes_left, 1);
    // One copy per live row, and one per delete left in (a key several
    // stages matched).
    assert_eq!(
        adopted.keys,
        live.len() as u64 + stats.deletes_left + adopted.deletes_left
    );
}

/// A snapshot holds the filter of its moment, though the feed goes on
/// changing the filter before its chunks are made: its adopter replays
/// those changes from the snapshot's position, each delete once, and
/// keeps every live key.
#[tokio::test]
async fn a_snapshot_is_its_moment_though_the_filter_changes_before_its_chunks() {
    let feed = Feed::default();
    let keys: Vec<String> = (0..100_000).map(|i| format!("k{i}")).collect();
    for key in &keys {
        feed.add(key);
    }
    let first = guard();
    let reader = first.feed().reader();
    reader.catch_up_with(feed.clone());
    first.rebuild(&feed).await.expect("build");
    let writer = first
        .feed()
        .snapshot(&"ignored".into(), "q")
        .expect("an exact filter");
    // After the moment, before any chunk: a third of the keys deleted
    // (in every shard), new ones added.
    let at = feed.len();
    for key in keys.iter().step_by(3) {
        feed.delete(key);
    }
    for i in 0..10_000 {
        feed.add(&format!("n{i}"));
    }
    feed.follow(&first, at);
    assert_eq!(first.stats().deletes_left, 0);
    let bytes: Vec<u8> = writer.chunks(1 << 16).flatten().collect();

    let second = guard();
    let second_reader = second.feed().reader();
    second_reader.catch_up_with(feed.clone());
    let adoption = second
        .feed()
        .begin_adoption(Snapshot::decode(&bytes).expect("intact"), "q")
        .await
        .expect("adopt");
    assert_eq!(adoption.info().position, at.to_string());
    let (added, removed, reached) = feed.read(at);
    adoption.apply(&added, &removed, &reached.to_string());
    adoption.promote().expect("promote");
    let stats = second.stats();
    assert_eq!(
        (stats.deletes_left, stats.keys),
        (0, 100_000 - 33_334 + 10_000)
    );
    let live = keys
        .iter()
        .enumerate()
        .filter(|(i, _)| i % 3 != 0)
        .map(|(_, key)| key.clone())
        .chain((0..10_000).map(|i| format!("n{i}")));
    assert!(live.into_iter().all(|key| second.may_contain(&key)));
    let gone = keys
        .iter()
        .step_by(3)
        .filter(|key| second.may_contain(key))
        .count();
    assert!(gone < 200, "{gone} deleted keys still found");
}
