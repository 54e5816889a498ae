//! Tests of `rebuild.rs`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::stream::{self, BoxStream, StreamExt};
use tokio::sync::oneshot;

use crate::{keys::KeyBatch, stats::GuardState, BloomGuard, KeyList, KeySource};

#[derive(Debug, thiserror::Error)]
#[error("database unreachable")]
struct Unreachable;

/// A key list that counts its scans, and scans slowly enough for
/// concurrent callers to overlap.
pub(crate) struct Counting {
    keys: KeyList,
    scans: std::sync::Arc<AtomicUsize>,
}

impl Counting {
    pub(crate) fn new<const N: usize>(keys: [&str; N]) -> Self {
        Self {
            keys: KeyList::new(keys),
            scans: std::sync::Arc::default(),
        }
    }

    pub(crate) fn scans(&self) -> std::sync::Arc<AtomicUsize> {
        std::sync::Arc::clone(&self.scans)
    }
}

impl KeySource for Counting {
    type Error = std::convert::Infallible;

    async fn count_hint(&self) -> Result<Option<u64>, Self::Error> {
        tokio::time::sleep(Duration::from_millis(50)).await;
        self.keys.count_hint().await
    }

    fn keys(&self) -> BoxStream<'static, Result<KeyBatch, Self::Error>> {
        self.scans.fetch_add(1, Ordering::SeqCst);
        self.keys.keys()
    }
}

#[tokio::test]
async fn concurrent_rebuilds_run_one_scan() {
    let guard = BloomGuard::builder().build();
    let source = Counting::new(["a"]);
    let rebuilds = (0..10).map(|_| guard.rebuild(&source));
    for outcome in futures_util::future::join_all(rebuilds).await {
        assert_eq!(outcome.expect("rebuild").generation, 1);
    }
    assert_eq!(source.scans().load(Ordering::SeqCst), 1);
    // Once it is over, the next call scans again.
    assert_eq!(guard.rebuild(&source).await.expect("rebuild").generation, 2);
    assert_eq!(source.scans().load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn joiners_of_a_cancelled_rebuild_are_told() {
    let guard = BloomGuard::builder().build();
    let source = Counting::new(["a"]);
    let leader = guard.rebuild(&source);
    let joiner = async {
        tokio::task::yield_now().await;
        guard.rebuild(&source).await
    };
    let leader = async {
        // Dropped after its first poll, mid-build.
        let _ = tokio::time::timeout(Duration::from_millis(10), leader).await;
    };
    let ((), joined) = tokio::join!(leader, joiner);
    assert!(
        matches!(joined, Err(crate::BuildError::Cancelled)),
        "{joined:?}"
    );
    assert_eq!(guard.rebuild(&source).await.expect("rebuild").generation, 1);
}

#[tokio::test(start_paused = true)]
async fn maintain_rebuilds_on_schedule_and_when_outgrown() {
    let guard = BloomGuard::builder()
        .expected_items(100)
        .headroom(0.1)
        .rebuild_interval(Duration::from_secs(60))
        .check_interval(Duration::from_secs(1))
        .build();
    let source = Counting::new(["a"]);
    guard.rebuild(&source).await.expect("first build");
    assert_eq!(guard.feed().rebuild_due(), None);
    tokio::spawn(guard.clone().maintain(Counting::new(["a"])));

    tokio::time::sleep(Duration::from_secs(61)).await;
    assert_eq!(guard.stats().generation, 2, "scheduled rebuild");

    // 2 000 keys into a filter sized for 110: it grows sub-filters of
    // 220, 440, 880 and 1 760 keys and keeps its rate, until it has more
    // sub-filters than compact_above (4) allows.
    for i in 0..2000 {
        guard.insert(format!("new-{i}"));
    }
    let grown = guard.stats();
    assert_eq!(grown.sub_filters, 5, "{grown:?}");
    // Each full sub-filter's realized rate scatters around its share;
    // the compound stays well within twice the target.
    assert!(grown.estimated_fpp <= 1.5 * grown.target_fpp, "{grown:?}");
    assert_eq!(
        guard.feed().rebuild_due(),
        Some("the filter grew more sub-filters than compact_above")
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let stats = guard.stats();
    assert_eq!(stats.generation, 3, "a compaction");
    assert_eq!(stats.sub_filters, 1, "{stats:?}");
    assert!(stats.estimated_fpp < stats.target_fpp, "{stats:?}");
    assert!((0..2000).all(|i| guard.may_contain(format!("new-{i}"))));
}

#[tokio::test]
async fn ready_means_protecting_and_stays_ready() {
    let guard = BloomGuard::builder().build();
    let hold = guard.fail_open();
    guard
        .rebuild(&KeyList::new(["a"]))
        .await
        .expect("first build");
    let stats = guard.stats();
    assert!(!guard.is_ready(), "a filter that may lack keys");
    assert_eq!(stats.state, GuardState::Warming);
    assert!(stats.reason.is_some(), "{stats:?}");
    assert!(guard.may_contain("absent"), "fails open meanwhile");

    let ready = tokio::spawn({
        let guard = guard.clone();
        async move { guard.ready().await }
    });
    tokio::task::yield_now().await;
    assert!(!ready.is_finished());
    drop(hold);
    ready.await.expect("ready");
    assert!(guard.is_ready());
    assert_eq!(
        (guard.stats().state, guard.stats().reason),
        (GuardState::Ready, None)
    );
    assert!(!guard.may_contain("absent"));

    // After the first ready, a degradation shows in the state only.
    let hold = guard.feed().fail_open_because("a gap in the feed");
    let stats = guard.stats();
    assert_eq!(stats.state, GuardState::Degraded);
    assert_eq!(stats.reason.as_deref(), Some("a gap in the feed"));
    assert!(guard.is_ready());
    guard.ready().await;
    drop(hold);
}

/// Fails its first `failures` scans, then yields `keys`.
struct Flaky {
    failures: usize,
    attempts: AtomicUsize,
    keys: KeyList,
}

impl KeySource for Flaky {
    type Error = Unreachable;

    async fn count_hint(&self) -> Result<Option<u64>, Unreachable> {
        Ok(None)
    }

    fn keys(&self) -> BoxStream<'static, Result<KeyBatch, Unreachable>> {
        if self.attempts.fetch_add(1, Ordering::SeqCst) < self.failures {
            stream::iter([Err(Unreachable)]).boxed()
        } else {
            self.keys
                .keys()
                .map(|batch| batch.map_err(|never| match never {}))
                .boxed()
        }
    }
}

#[tokio::test(start_paused = true)]
async fn warm_up_retries_and_stays_open_meanwhile() {
    let guard = BloomGuard::builder().build();
    let source = Flaky {
        failures: 3,
        attempts: AtomicUsize::new(0),
        keys: KeyList::new(["a"]),
    };
    let warming = tokio::spawn(guard.clone().warm(source));
    tokio::time::sleep(Duration::from_millis(50)).await;
    let stats = guard.stats();
    assert_eq!(stats.state, GuardState::Degraded);
    assert_eq!(
        stats.last_error.as_deref(),
        Some("the key source failed: database unreachable")
    );
    assert!(
        guard.may_contain("anything"),
        "a degraded guard must fail open"
    );

    warming.await.expect("warm-up task");
    let stats = guard.stats();
    assert_eq!(
        (stats.state, stats.generation, stats.last_error),
        (GuardState::Ready, 1, None)
    );
    assert!(!guard.may_contain("anything"));
}

#[tokio::test(start_paused = true)]
async fn retry_pauses_grow_up_to_the_cap() {
    let guard = BloomGuard::builder()
        .max_retry_delay(Duration::from_secs(2))
        .build();
    let source = Flaky {
        failures: 8,
        attempts: AtomicUsize::new(0),
        keys: KeyList::new(["a"]),
    };
    let started = tokio::time::Instant::now();
    guard.clone().warm(source).await;
    // Pauses of 0.1, 0.2, 0.4, 0.8, 1.6, 2, 2, 2 s, each lengthened by
    // jitter of less than itself (and the timer's millisecond each).
    let elapsed = started.elapsed();
    assert!(elapsed >= Duration::from_secs_f64(9.1), "{elapsed:?}");
    assert!(
        elapsed < Duration::from_secs_f64(9.1 * 2.0 + 0.01),
        "{elapsed:?}"
    );
}

#[test]
fn retry_pauses_start_at_100_ms_and_double_up_to_the_cap() {
    let cap = Duration::from_secs(2);
    let mut unjittered = Duration::from_millis(100);
    for pause in super::retry_pauses(cap).take(12) {
        // The doubling is computed in f32: allow it a microsecond.
        let floor = unjittered.saturating_sub(Duration::from_micros(1));
        assert!(pause >= floor, "{pause:?} < {unjittered:?}");
        assert!(pause < unjittered * 2, "{pause:?} >= 2 x {unjittered:?}");
        unjittered = (unjittered * 2).min(cap);
    }
}

/// Yields one batch, then waits for a signal before the next: the window
/// in which a write lands during the scan.
struct Paused {
    resume: std::sync::Mutex<Option<oneshot::Receiver<()>>>,
    scanning: std::sync::Mutex<Option<oneshot::Sender<()>>>,
}

impl KeySource for Paused {
    type Error = Unreachable;

    async fn count_hint(&self) -> Result<Option<u64>, Unreachable> {
        Ok(Some(2))
    }

    fn keys(&self) -> BoxStream<'static, Result<KeyBatch, Unreachable>> {
        let resume = self.resume.lock().unwrap().take().expect("scanned once");
        let scanning = self.scanning.lock().unwrap().take().expect("scanned once");
        let first = stream::iter([Ok(["old"].into_iter().collect::<KeyBatch>())]);
        let second = stream::once(async move {
            let _ = scanning.send(());
            let _ = resume.await;
            Ok(["also-old"].into_iter().collect::<KeyBatch>())
        });
        first.chain(second).boxed()
    }
}

#[tokio::test]
async fn writes_during_a_scan_reach_the_new_filter() {
    let guard = BloomGuard::builder().write_window(Duration::ZERO).build();
    guard
        .rebuild(&KeyList::new(["old"]))
        .await
        .expect("first build");
    let (resume_tx, resume_rx) = oneshot::channel();
    let (scanning_tx, scanning_rx) = oneshot::channel();
    let source = Paused {
        resume: std::sync::Mutex::new(Some(resume_rx)),
        scanning: std::sync::Mutex::new(Some(scanning_tx)),
    };
    let rebuild = {
        let guard = guard.clone();
        tokio::spawn(async move { guard.rebuild(&source).await.map(|s| s.generation) })
    };
    scanning_rx.await.expect("scan started");
    // The row commits after the scan's snapshot: only the double write
    // (or the feed, on other instances) brings it into the new filter.
    guard.insert("written-during-scan");
    resume_tx.send(()).expect("resume");
    assert_eq!(rebuild.await.expect("rebuild task").expect("rebuild"), 2);
    assert!(guard.may_contain("written-during-scan"));
    assert!(guard.may_contain("also-old"));
}

#[tokio::test]
async fn writes_shortly_before_a_build_are_replayed_into_it() {
    let guard = BloomGuard::builder().build();
    guard
        .rebuild(&KeyList::new(["a"]))
        .await
        .expect("first build");
    // Inserted, but its row is not in the source yet (still committing).
    guard.insert("committing");
    guard
        .rebuild(&KeyList::new(["a"]))
        .await
        .expect("second build");
    assert!(guard.may_contain("committing"));

    let forgetful = BloomGuard::builder().write_window(Duration::ZERO).build();
    forgetful
        .rebuild(&KeyList::new(["a"]))
        .await
        .expect("first build");
    forgetful.insert("committing");
    std::thread::sleep(Duration::from_millis(2));
    forgetful
        .rebuild(&KeyList::new(["a"]))
        .await
        .expect("second build");
    assert!(
        !forgetful.may_contain("committing"),
        "the window bounds the replay"
    );
}

#[tokio::test]
async fn keys_from_a_feed_are_not_journaled() {
    let guard = BloomGuard::builder().build();
    guard
        .rebuild(&KeyList::new(["a"]))
        .await
        .expect("first build");
    // Committed keys: the next scan has their rows, or they were deleted.
    guard.insert_batch(&["committed"].into_iter().collect());
    assert!(guard.may_contain("committed"));
    guard
        .rebuild(&KeyList::new(["a"]))
        .await
        .expect("second build");
    assert!(!guard.may_contain("committed"));
}

#[tokio::test]
async fn a_failed_rebuild_keeps_the_filter_in_use() {
    let guard = BloomGuard::builder().build();
    guard
        .rebuild(&KeyList::new(["kept"]))
        .await
        .expect("first build");
    let failing = Flaky {
        failures: 1,
        attempts: AtomicUsize::new(0),
        keys: KeyList::new(["other"]),
    };
    assert!(guard.rebuild(&failing).await.is_err());
    let stats = guard.stats();
    assert_eq!((stats.state, stats.generation), (GuardState::Ready, 1));
    assert!(stats.last_error.is_some());
    assert!(guard.may_contain("kept"));
    assert!(!guard.may_contain("other"));
}

#[tokio::test]
async fn an_undercounted_source_is_scanned_once() {
    let keys: Vec<String> = (0..20_000).map(|i| i.to_string()).collect();
    struct Undercounted(KeyList);
    impl KeySource for Undercounted {
        type Error = std::convert::Infallible;
        async fn count_hint(&self) -> Result<Option<u64>, Self::Error> {
            Ok(Some(1_000))
        }
        fn keys(&self) -> BoxStream<'static, Result<KeyBatch, Self::Error>> {
            self.0.keys()
        }
    }
    let guard = BloomGuard::builder().expected_items(1).build();
    guard.clone().warm(Undercounted(KeyList::new(&keys))).await;
    let stats = guard.stats();
    assert_eq!(stats.generation, 1, "one scan");
    // 1 250, 2 500, 5 000, 10 000 and 20 000 keys of room.
    assert_eq!(stats.sub_filters, 5, "{stats:?}");
    assert!(stats.estimated_fpp <= stats.target_fpp, "{stats:?}");
    assert!(keys.iter().all(|key| guard.may_contain(key)));
    assert!(guard.is_ready());
}
