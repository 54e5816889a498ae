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
        let read = crate::postgres::log::feed::read(
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
    let quiet = crate::postgres::log::feed::read(
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
        let read = crate::postgres::log::feed::read(
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

#[sqlx::test(migrations = false)]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn an_insert_position_after_a_page_header_reaches_back_to_the_page(pool: PgPool) {
    let end =
        |insert: u64| {
            let pool = pool.clone();
            async move {
                let sql =
                    format!(
                "select ({} operator(pg_catalog.-) '0/0'::pg_catalog.pg_lsn)::pg_catalog.int8",
                super::super::feed::record_end_at_or_before(
                    &format!("'{}'::pg_catalog.pg_lsn", super::super::feed::lsn_text(insert)),
                    "8192::pg_catalog.int8"
                )
            );
                let end: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
                    .fetch_one(&pool)
                    .await
                    .expect("the expression");
                end.unsigned_abs()
            }
        };
    assert_eq!(end(8192 * 3 + 24).await, 8192 * 3);
    assert_eq!(end(16 << 20 | 40).await, 16 << 20);
    assert_eq!(end(8192 * 3 + 200).await, 8192 * 3 + 200);
    assert_eq!(end((5 << 32) + 8192 + 24).await, (5 << 32) + 8192);
}

/// The look at the slot and the read are one statement: the read must take
/// its snapshot after the look, or a write the producer confirmed between
/// the statement's start and its look would be counted as read and never
/// be. `bloom_guard.log_read` sees what committed after its caller began.
#[sqlx::test(migrations = false)]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn a_read_sees_what_committed_after_its_statement_began(pool: PgPool) {
    let (_url, slot) = log_fed_items(&pool).await;
    let writer = {
        let (pool, slot) = (pool.clone(), slot.name.clone());
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let mut tx = pool.begin().await.expect("a transaction");
            sqlx::query("insert into bloom_guard.log_changes (lsn, guard, kind, key) values ('FFFF/10', 'items', 'i', 'late')")
                .execute(&mut *tx)
                .await
                .expect("a feed row");
            sqlx::query(
                "insert into bloom_guard.log_progress (slot, applied) values ($1, 'FFFF/10')
                 on conflict (slot) do update set applied = excluded.applied",
            )
            .bind(slot)
            .execute(&mut *tx)
            .await
            .expect("the progress");
            tx.commit().await.expect("commit");
        })
    };
    // The statement begins (its snapshot), sleeps past the write's commit,
    // then reads.
    let keys: Vec<String> = sqlx::query_scalar(
        "select r.r_key
           from (select 1 from pg_catalog.pg_sleep(1.5)) w(x)
          cross join lateral bloom_guard.log_read(
                    $1, case when w.x = 1 then '0/0'::pg_catalog.pg_lsn end,
                    array['items'], array['0/0'::pg_catalog.pg_lsn]) r
          where r.r_key is not null",
    )
    .bind(&slot.name)
    .fetch_all(&pool)
    .await
    .expect("a read");
    writer.await.expect("the writer");
    assert_eq!(keys, ["late"], "the read took its caller's snapshot");
}
