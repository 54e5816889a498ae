//! Tests of `cache.rs`.

use super::*;
use std::sync::atomic::AtomicUsize;

fn cache() -> ReadThroughCache<String, u32> {
    ReadThroughCache::builder().build()
}

#[tokio::test]
async fn caches_found_and_missing_values() {
    let cache = cache();
    let loads = AtomicUsize::new(0);
    for _ in 0..3 {
        let found = cache
            .get_or_load("a".into(), || async {
                loads.fetch_add(1, Ordering::SeqCst);
                Ok::<_, ()>(Some(1))
            })
            .await;
        assert_eq!(found, Ok(Some(1)));
        let missing = cache
            .get_or_load("b".into(), || async {
                loads.fetch_add(1, Ordering::SeqCst);
                Ok::<_, ()>(None)
            })
            .await;
        assert_eq!(missing, Ok(None));
    }
    assert_eq!(loads.load(Ordering::SeqCst), 2);
    let stats = cache.stats();
    assert_eq!((stats.loads, stats.hits, stats.negative_hits), (2, 2, 2));
}

#[tokio::test]
async fn errors_are_not_cached() {
    let cache = cache();
    let failed = cache
        .get_or_load("a".into(), || async { Err::<Option<u32>, _>("down") })
        .await;
    assert_eq!(failed.map_err(|e| *e), Err("down"));
    let found = cache
        .get_or_load("a".into(), || async { Ok::<_, &str>(Some(7)) })
        .await;
    assert_eq!(found, Ok(Some(7)));
    assert_eq!(cache.stats().load_errors, 1);
}

#[tokio::test]
async fn concurrent_lookups_share_one_load() {
    let cache = cache();
    let loads = Arc::new(AtomicUsize::new(0));
    let lookups = (0..100).map(|_| {
        let (cache, loads) = (cache.clone(), Arc::clone(&loads));
        tokio::spawn(async move {
            cache
                .get_or_load("k".into(), || async move {
                    loads.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    Ok::<_, ()>(Some(5))
                })
                .await
        })
    });
    for lookup in futures_util::future::join_all(lookups).await {
        assert_eq!(lookup.expect("lookup task"), Ok(Some(5)));
    }
    assert_eq!(loads.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn invalidate_drops_a_negative_entry() {
    let cache = cache();
    let _ = cache
        .get_or_load("k".into(), || async { Ok::<_, ()>(None) })
        .await;
    cache.invalidate("k").await;
    let found = cache
        .get_or_load("k".into(), || async { Ok::<_, ()>(Some(1)) })
        .await;
    assert_eq!(found, Ok(Some(1)));
}

#[tokio::test]
async fn a_miss_loaded_across_an_invalidation_is_not_kept() {
    let cache = cache();
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let (finish_tx, finish_rx) = tokio::sync::oneshot::channel::<()>();
    // A load reads "not found"; the key is created and invalidated
    // before that load stores its answer.
    let load = {
        let cache = cache.clone();
        tokio::spawn(async move {
            cache
                .get_or_load("k".into(), || async move {
                    let _ = started_tx.send(());
                    let _ = finish_rx.await;
                    Ok::<_, ()>(None)
                })
                .await
        })
    };
    started_rx.await.expect("load started");
    cache.invalidate("k").await;
    finish_tx.send(()).expect("finish");
    assert_eq!(load.await.expect("load task"), Ok(None));
    let after = cache
        .get_or_load("k".into(), || async { Ok::<_, ()>(Some(1)) })
        .await;
    assert_eq!(
        after,
        Ok(Some(1)),
        "a stale negative entry hides the created key"
    );
}

#[tokio::test]
async fn invalidate_all_drops_negative_entries() {
    let cache = cache();
    let _ = cache
        .get_or_load("k".into(), || async { Ok::<_, ()>(None) })
        .await;
    cache.invalidate_all();
    let found = cache
        .get_or_load("k".into(), || async { Ok::<_, ()>(Some(1)) })
        .await;
    assert_eq!(found, Ok(Some(1)));
}

#[test]
fn expiry_is_jittered_within_bounds() {
    let expiry = JitteredExpiry {
        ttl: Duration::from_secs(100),
        negative_ttl: Duration::from_secs(10),
        jitter: 0.1,
    };
    let now = Instant::now();
    let ttls: Vec<Duration> = (0..1000)
        .filter_map(|_| {
            Expiry::<(), Entry<()>>::expire_after_create(&expiry, &(), &Entry::Found(()), now)
        })
        .collect();
    let (min, max) = (ttls.iter().min().copied(), ttls.iter().max().copied());
    assert!(min >= Some(Duration::from_secs(90)) && max <= Some(Duration::from_secs(110)));
    assert!(
        max.zip(min)
            .is_some_and(|(max, min)| max - min > Duration::from_secs(10)),
        "no spread"
    );
    let negative = Expiry::<(), Entry<()>>::expire_after_create(&expiry, &(), &Entry::Missing, now);
    assert!(negative.is_some_and(|ttl| ttl <= Duration::from_secs(11)));
}
