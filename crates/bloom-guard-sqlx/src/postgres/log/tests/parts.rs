//! A transaction too large to hold whole: written in parts as it arrives,
//! seen by no reader before its last rows, each row once through replays.

use super::*;
use crate::postgres::log::feed::read;
use crate::postgres::log::stream::PART_ROWS;

/// `items` on the log feed, a producer of it, the feed's epoch, and the
/// progress: where the next commit starts.
async fn a_producer_at_the_progress(pool: &PgPool) -> (String, Slot, Producer, String, u64) {
    let (url, slot) = log_fed_items(pool).await;
    let producer = Producer::new(pool.clone(), &url).await.expect("producer");
    let epoch = crate::postgres::log::slot::epoch(pool)
        .await
        .expect("epoch");
    let start: i64 =
        sqlx::query_scalar("select (applied - '0/0'::pg_lsn)::int8 from bloom_guard.log_progress")
            .fetch_one(pool)
            .await
            .expect("progress");
    (url, slot, producer, epoch, start.unsigned_abs())
}

#[sqlx::test(migrations = false)]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn parts_sent_again_are_written_once_and_read_with_their_transaction(pool: PgPool) {
    let (_url, _slot, producer, epoch, start) = a_producer_at_the_progress(&pool).await;
    // The commit starts where the last one ended: its parts must still be
    // past every bound until its end.
    let (begin, end) = (start, start + 100);
    let rows = |from: usize, to: usize| -> Vec<FeedRow> {
        (from..to)
            .map(|n| FeedRow {
                guard: "items".into(),
                kind: b'i',
                key: format!("k{n}"),
            })
            .collect()
    };
    producer
        .write_part(begin, 0, &rows(0, 10), &epoch)
        .await
        .expect("part");
    producer
        .write_part(begin, 10, &rows(10, 20), &epoch)
        .await
        .expect("part");
    // Sent again from its first row (a crash, a killed connection).
    producer
        .write_part(begin, 0, &rows(0, 10), &epoch)
        .await
        .expect("again");
    producer
        .write_part(begin, 10, &rows(10, 20), &epoch)
        .await
        .expect("again");
    producer
        .write_part(begin, 20, &rows(20, 25), &epoch)
        .await
        .expect("part");
    assert_eq!(
        readable(&pool, start).await,
        0,
        "a reader saw a part before its transaction's end"
    );
    // The transaction's last rows, at its end, with the progress.
    producer
        .write(&[(end, rows(25, 30).remove(0))], end, &epoch)
        .await
        .expect("the end");
    assert_eq!(readable(&pool, start).await, 26);
    // All of it sent again: nothing more.
    producer
        .write_part(begin, 0, &rows(0, 10), &epoch)
        .await
        .expect("again");
    producer
        .write(&[(end, rows(25, 30).remove(0))], end, &epoch)
        .await
        .expect("again");
    assert_eq!(readable(&pool, start).await, 26);
    let counts = feed_counts(&pool).await;
    assert_eq!(counts.len(), 26);
    assert!(counts.values().all(|count| *count == 1), "{counts:?}");
}

/// How many rows a follower at `after` reads now.
async fn readable(pool: &PgPool, after: u64) -> usize {
    let slot: String = sqlx::query_scalar("select slot from bloom_guard.log_progress")
        .fetch_one(pool)
        .await
        .expect("slot");
    let mut connection = pool.acquire().await.expect("connection");
    read(&mut connection, &slot, &["items"], after, None, false)
        .await
        .expect("read")
        .rows
        .len()
}

#[sqlx::test(migrations = false)]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn a_transaction_of_many_parts_streams_each_change_once_through_a_killed_reader(
    pool: PgPool,
) {
    let (url, slot) = log_fed_items(&pool).await;
    let stop = tokio_util::sync::CancellationToken::new();
    tokio::spawn(
        Producer::new(pool.clone(), &url)
            .await
            .expect("producer")
            .run(stop.clone()),
    );
    exec(&pool, "insert into items (id, key) values (0, 'before')").await;
    until_fed(&pool, "before").await;
    // One transaction of six parts and more; a key deleted at the end of
    // the sixth part and inserted again after it.
    let rows = 6 * PART_ROWS - 1;
    exec(
        &pool,
        &format!(
            "begin;
             insert into items (id, key) select g, 'bulk-' || g from generate_series(1, {rows}) g;
             delete from items where id = 0;
             insert into items (id, key) values ({rows} + 1, 'before');
             commit"
        ),
    )
    .await;
    // The reader dies once the first parts are written: the slot sends the
    // transaction again from its first row.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let parts: i64 = sqlx::query_scalar("select count(*) from bloom_guard.log_changes")
            .fetch_one(&pool)
            .await
            .expect("count");
        if parts > 1 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no part was written"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    kill_reader(&pool, &slot.name).await;
    exec(&pool, "insert into items (id, key) values (-1, 'after')").await;
    until_fed(&pool, "after").await;
    assert_eq!(feed_counts(&pool).await, table_counts(&pool).await);

    // A transaction of whole parts: nothing left for its end but the
    // progress, which moves past its parts all the same.
    exec(
        &pool,
        &format!(
            "insert into items (id, key)
             select 1000000 + g, 'whole-' || g from generate_series(1, {}) g",
            2 * PART_ROWS
        ),
    )
    .await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let past: bool = sqlx::query_scalar(
            "select applied >= part_at and part_rows = $1 from bloom_guard.log_progress",
        )
        .bind(i64::try_from(2 * PART_ROWS).expect("rows"))
        .fetch_one(&pool)
        .await
        .expect("progress");
        if past {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the progress stays behind a transaction written in whole parts"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(feed_counts(&pool).await, table_counts(&pool).await);
    stop.cancel();
}

/// A transaction written in part, then sent again after its table gained
/// a guard: the rows of the first try are dropped and the transaction is
/// made again under the guards of now, so no row is skipped or repeated.
#[sqlx::test(migrations = false)]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn a_transaction_sent_again_under_other_guards_is_made_again_whole(pool: PgPool) {
    let (_url, _slot, producer, epoch, start) = a_producer_at_the_progress(&pool).await;
    let (begin, end) = (start, start + 100);
    let rows = |guards: &[&str], from: usize, to: usize| -> Vec<FeedRow> {
        (from..to)
            .flat_map(|n| {
                guards.iter().map(move |guard| FeedRow {
                    guard: (*guard).into(),
                    kind: b'i',
                    key: format!("k{n}"),
                })
            })
            .collect()
    };
    // One guard: ten rows written in part.
    producer
        .write_part(begin, 0, &rows(&["items"], 0, 10), &epoch)
        .await
        .expect("part");
    // Sent again with a second guard on the table: twice the rows.
    producer
        .write_part(begin, 0, &rows(&["items", "twin"], 0, 10), &epoch)
        .await
        .expect("again");
    producer
        .write(&[(end, rows(&["items"], 10, 11).remove(0))], end, &epoch)
        .await
        .expect("the end");
    let counts: Vec<(String, i64)> = sqlx::query_as(
        "select guard, count(*) from bloom_guard.log_changes group by guard order by guard",
    )
    .fetch_all(&pool)
    .await
    .expect("rows");
    assert_eq!(
        counts,
        [("items".to_owned(), 11), ("twin".to_owned(), 10)],
        "each row of the transaction once, under the guards of now"
    );
}
