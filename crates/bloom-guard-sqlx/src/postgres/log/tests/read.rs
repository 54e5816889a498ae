//! Reads of the log feed: the barrier holds every commit before it, and
//! a scan at its point with the rows after holds each change once.

use super::*;

#[sqlx::test(migrations = false)]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn a_barrier_read_after_each_commit_holds_exactly_the_table(pool: PgPool) {
    let (url, slot) = log_fed_items(&pool).await;
    let stop = tokio_util::sync::CancellationToken::new();
    let producer = Producer::new(pool.clone(), &url).await.expect("producer");
    tokio::spawn(producer.run(stop.clone()));
    let mut connection = pool.acquire().await.expect("a connection");
    let (mut position, mut counts) = (0, BTreeMap::new());
    let (mut rng, mut next) = (fastrand::Rng::with_seed(7), 0);
    for _ in 0..150 {
        random_write(&pool, &mut rng, &mut next).await;
        let read = crate::postgres::log::read::read(
            &mut connection,
            &slot.name,
            &["items"],
            position,
            Some(Duration::from_secs(10)),
            false,
        )
        .await
        .expect("a barrier read");
        assert!(read.position >= position, "the position went back");
        position = read.position;
        apply(&mut counts, &read.rows);
        assert_eq!(
            counts,
            table_counts(&pool).await,
            "after the read to {position:#x}"
        );
    }
    // Without the barrier, a read can be behind, never ahead or twice.
    let quiet = crate::postgres::log::read::read(
        &mut connection,
        &slot.name,
        &["items"],
        position,
        None,
        false,
    )
    .await
    .expect("a read");
    assert!(quiet.rows.is_empty(), "{:?}", quiet.rows);
    stop.cancel();
}

#[sqlx::test(migrations = false)]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn a_scan_at_its_point_and_the_rows_after_hold_each_change_once(pool: PgPool) {
    let (url, slot) = log_fed_items(&pool).await;
    let stop = tokio_util::sync::CancellationToken::new();
    let producer = Producer::new(pool.clone(), &url).await.expect("producer");
    tokio::spawn(producer.run(stop.clone()));
    // Writes go on while the scans are taken, as in production.
    let writing = tokio_util::sync::CancellationToken::new();
    let writer = tokio::spawn({
        let (pool, writing) = (pool.clone(), writing.clone());
        async move {
            let (mut rng, mut next) = (fastrand::Rng::with_seed(11), 0);
            while !writing.is_cancelled() {
                random_write(&pool, &mut rng, &mut next).await;
            }
        }
    });
    let mut scans = Vec::new();
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(150)).await;
        let point = crate::postgres::log::stream::ScanPoint::take(&url, None)
            .await
            .expect("a scan point");
        let mut tx = pool.begin().await.expect("begin");
        exec_in(&mut tx, "set transaction isolation level repeatable read").await;
        exec_in(
            &mut tx,
            &format!("set transaction snapshot '{}'", point.snapshot),
        )
        .await;
        let keys: Vec<String> = sqlx::query_scalar("select key from items")
            .fetch_all(&mut *tx)
            .await
            .expect("scan");
        tx.commit().await.expect("end the scan");
        scans.push((point.lsn, keys));
    }
    writing.cancel();
    writer.await.expect("the writer");
    let mut connection = pool.acquire().await.expect("a connection");
    let table = table_counts(&pool).await;
    for (lsn, keys) in scans {
        let mut counts: BTreeMap<String, i64> = BTreeMap::new();
        for key in keys {
            *counts.entry(key).or_insert(0) += 1;
        }
        let read = crate::postgres::log::read::read(
            &mut connection,
            &slot.name,
            &["items"],
            lsn,
            Some(Duration::from_secs(10)),
            false,
        )
        .await
        .expect("the rows after the scan");
        apply(&mut counts, &read.rows);
        assert_eq!(counts, table, "a scan at {lsn:#x} and the rows after it");
    }
    stop.cancel();
}
