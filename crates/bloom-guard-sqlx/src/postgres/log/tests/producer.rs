//! The producer and a table put on the log feed: each change written
//! once through killed connections, one feed per table.

use super::*;

#[sqlx::test(migrations = false)]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn two_producers_write_each_change_once_through_killed_connections(pool: PgPool) {
    let (url, slot) = log_fed_items(&pool).await;
    let stop = tokio_util::sync::CancellationToken::new();
    for _ in 0..2 {
        let producer = Producer::new(pool.clone(), &url).await.expect("producer");
        tokio::spawn(producer.run(stop.clone()));
    }
    for (n, sql) in RAW_SQL.iter().enumerate() {
        exec(&pool, sql).await;
        until_fed(&pool, "a").await;
        // The reader goes down mid-stream, before the server heard of
        // what was written: the slot sends it again, to either producer.
        if n % 3 == 2 {
            kill_reader(&pool, &slot.name).await;
        }
    }
    exec(&pool, "insert into items (id, key) values (100, 'end')").await;
    until_fed(&pool, "end").await;
    assert_eq!(feed_counts(&pool).await, table_counts(&pool).await);

    // Both stopped, their reader killed before the server heard of the
    // last acknowledgement: a producer started again is sent what the
    // server did not hear of, and writes only what is new.
    stop.cancel();
    tokio::time::sleep(Duration::from_millis(300)).await;
    kill_reader(&pool, &slot.name).await;
    let stop = tokio_util::sync::CancellationToken::new();
    let producer = Producer::new(pool.clone(), &url).await.expect("producer");
    tokio::spawn(producer.run(stop.clone()));
    exec(&pool, "insert into items (id, key) values (101, 'after')").await;
    until_fed(&pool, "after").await;
    assert_eq!(feed_counts(&pool).await, table_counts(&pool).await);
    stop.cancel();
}

#[sqlx::test(migrations = false)]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn a_table_has_one_feed_and_a_key_the_log_cannot_carry_is_refused(pool: PgPool) {
    let (_url, _slot) = log_fed_items(&pool).await;
    let triggers = crate::Watch::table("items").key("key").install(&pool).await;
    assert!(
        matches!(triggers, Err(crate::FeedError::LogFed(_))),
        "{triggers:?}"
    );
    exec(
        &pool,
        "create table watched (key text primary key);
         create table by_id (id bigint primary key, key text not null unique);
         create table full_rows (id bigint primary key, key text not null);
         alter table full_rows replica identity full;",
    )
    .await;
    crate::Watch::table("watched")
        .key("key")
        .install(&pool)
        .await
        .expect("watch with triggers");
    let log = crate::Watch::table("watched")
        .key("key")
        .install_log(&pool)
        .await;
    assert!(matches!(log, Err(crate::FeedError::LogFeed(_))), "{log:?}");
    let by_id = crate::Watch::table("by_id")
        .key("key")
        .install_log(&pool)
        .await;
    assert!(
        matches!(by_id, Err(crate::FeedError::LogFeed(_))),
        "{by_id:?}"
    );
    crate::Watch::table("full_rows")
        .key("key")
        .install_log(&pool)
        .await
        .expect("a full replica identity carries the key");
    // Uninstalled, nothing of the log feed is left on the server.
    crate::uninstall(&pool).await.expect("uninstall");
    let left: i64 = sqlx::query_scalar(
        "select (select count(*) from pg_replication_slots where database = current_database())
              + (select count(*) from pg_publication)",
    )
    .fetch_one(&pool)
    .await
    .expect("count");
    assert_eq!(left, 0);
}
