//! The producer and a table put on the log feed: each change written
//! once through killed connections, one feed per table.

use std::collections::BTreeMap;

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
async fn standby_producers_wait_in_the_election_without_a_statement_and_take_over_in_turn(
    pool: PgPool,
) {
    use crate::postgres::log::lease::{PRODUCER_APPLICATION_NAME, STANDBY_APPLICATION_NAME};
    let (url, slot) = log_fed_items(&pool).await;
    let mut instances = Vec::new();
    for _ in 0..3 {
        let stop = tokio_util::sync::CancellationToken::new();
        let producer = Producer::new(pool.clone(), &url).await.expect("producer");
        tokio::spawn(producer.run(stop.clone()));
        instances.push(stop);
    }
    exec(&pool, "insert into items (id, key) values (1, 'a')").await;
    until_fed(&pool, "a").await;
    // The elected one's lease and the two standbys waiting for it, each
    // as (pid, the start of its last statement).
    let sessions = || async {
        sqlx::query_as::<_, (String, i32, Option<String>, bool)>(
            // A session that has run no statement yet has no start.
            "select application_name, pid, query_start::text,
                    coalesce(wait_event_type = 'Lock' and wait_event = 'advisory', false)
               from pg_stat_activity
              where datname = current_database() and application_name in ($1, $2)
              order by pid",
        )
        .bind(PRODUCER_APPLICATION_NAME)
        .bind(STANDBY_APPLICATION_NAME)
        .fetch_all(&pool)
        .await
        .expect("sessions")
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let waiting = loop {
        let now = sessions().await;
        let standbys = now
            .iter()
            .filter(|(name, _, _, waits)| name == STANDBY_APPLICATION_NAME && *waits)
            .count();
        let elected = now
            .iter()
            .filter(|(name, ..)| name == PRODUCER_APPLICATION_NAME)
            .count();
        if standbys == 2 && elected == 1 {
            break now;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not one elected and two waiting: {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // Longer than a standby that looked every 5 s would wait: not one
    // statement.
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(sessions().await, waiting, "a standby ran a statement");

    // The elected instance dies (its lease and its reader killed), twice:
    // a standby is elected and streams each time.
    let mut elected = waiting
        .iter()
        .find(|(name, ..)| name == PRODUCER_APPLICATION_NAME)
        .map(|(_, pid, ..)| *pid)
        .expect("an elected producer");
    for (id, key) in [(2, "b"), (3, "c")] {
        sqlx::query("select pg_terminate_backend($1)")
            .bind(elected)
            .execute(&pool)
            .await
            .expect("kill the lease");
        kill_reader(&pool, &slot.name).await;
        exec(
            &pool,
            &format!("insert into items (id, key) values ({id}, '{key}')"),
        )
        .await;
        until_fed(&pool, key).await;
        let next = sessions()
            .await
            .iter()
            .find(|(name, ..)| name == PRODUCER_APPLICATION_NAME)
            .map(|(_, pid, ..)| *pid)
            .expect("a producer elected");
        assert_ne!(next, elected, "the killed lease still holds");
        elected = next;
    }
    assert_eq!(feed_counts(&pool).await, table_counts(&pool).await);
    for stop in instances {
        stop.cancel();
    }
}

#[sqlx::test(migrations = false)]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn a_table_has_one_feed_and_a_key_the_log_cannot_carry_is_refused(pool: PgPool) {
    let (_url, _slot) = log_fed_items(&pool).await;
    let triggers = crate::watch::Watch::table("items")
        .key("key")
        .install(&pool)
        .await;
    assert!(
        matches!(triggers, Err(crate::error::FeedError::LogFed(_))),
        "{triggers:?}"
    );
    exec(
        &pool,
        "create table watched (key text primary key);
         create table by_id (id bigint primary key, key text not null unique);
         create table full_rows (id bigint primary key, key text not null);
         alter table full_rows replica identity full;
         create table parent (key text primary key);
         create table child () inherits (parent);",
    )
    .await;
    crate::watch::Watch::table("watched")
        .key("key")
        .install(&pool)
        .await
        .expect("watch with triggers");
    let log = crate::watch::Watch::table("watched")
        .key("key")
        .install_log(&pool)
        .await;
    assert!(
        matches!(log, Err(crate::error::FeedError::LogFeed(_))),
        "{log:?}"
    );
    let by_id = crate::watch::Watch::table("by_id")
        .key("key")
        .install_log(&pool)
        .await;
    assert!(
        matches!(by_id, Err(crate::error::FeedError::LogFeed(_))),
        "{by_id:?}"
    );
    crate::watch::Watch::table("full_rows")
        .key("key")
        .install_log(&pool)
        .await
        .expect("a full replica identity carries the key");
    // An inheritance child's changes come as its own, and one made later
    // is not in the publication.
    let parent = crate::watch::Watch::table("parent")
        .key("key")
        .install_log(&pool)
        .await;
    assert!(
        matches!(&parent, Err(crate::error::FeedError::LogFeed(why)) if why.contains("inheritance")),
        "{parent:?}"
    );
    // Uninstalled, nothing of the log feed is left on the server.
    crate::postgres::uninstall(&pool).await.expect("uninstall");
    let left: i64 = sqlx::query_scalar(
        "select (select count(*) from pg_replication_slots where database = current_database())
              + (select count(*) from pg_publication)",
    )
    .fetch_one(&pool)
    .await
    .expect("count");
    assert_eq!(left, 0);
}

#[sqlx::test(migrations = false)]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn a_guard_put_on_a_streamed_table_gets_its_rows_from_its_commit_on(pool: PgPool) {
    let (url, _slot) = log_fed_items(&pool).await;
    let stop = tokio_util::sync::CancellationToken::new();
    let producer = Producer::new(pool.clone(), &url).await.expect("producer");
    tokio::spawn(producer.run(stop.clone()));
    exec(&pool, "insert into items (id, key) values (1, 'before')").await;
    until_fed(&pool, "before").await;
    // Put on the log feed while the producer streams the table already:
    // no new relation comes, the message in the log says so.
    let second = crate::watch::Watch::table("items")
        .key("key")
        .name("second");
    second.install_log(&pool).await.expect("a second guard");
    exec(&pool, "insert into items (id, key) values (2, 'after')").await;
    until_fed(&pool, "after").await;
    let second_rows: Vec<String> = sqlx::query_scalar(
        "select key from bloom_guard.log_changes where guard = 'second' order by lsn",
    )
    .fetch_all(&pool)
    .await
    .expect("the second guard's rows");
    assert_eq!(second_rows, ["after"]);
    // Installed again unchanged, the table's place on the feed keeps its
    // version: no start makes the fleet rebuild.
    let versions = super::super::check::versions(&pool, &second)
        .await
        .expect("versions");
    second.install_log(&pool).await.expect("again");
    assert_eq!(
        super::super::check::versions(&pool, &second)
            .await
            .expect("versions"),
        versions
    );
    stop.cancel();
}

#[sqlx::test(migrations = false)]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn producers_that_overlap_write_each_change_once_and_never_go_back(pool: PgPool) {
    let (url, _slot) = log_fed_items(&pool).await;
    let one = Producer::new(pool.clone(), &url).await.expect("producer");
    let two = Producer::new(pool.clone(), &url).await.expect("producer");
    let row = |key: &str| crate::postgres::log::rows::FeedRow {
        guard: "items".into(),
        kind: b'i',
        key: key.into(),
    };
    // The feed starts at the slot's start.
    let start: i64 =
        sqlx::query_scalar("select (applied - '0/0'::pg_lsn)::int8 from bloom_guard.log_progress")
            .fetch_one(&pool)
            .await
            .expect("progress");
    let at = |n: u64| start.unsigned_abs() + n;
    let epoch = crate::postgres::log::slot::epoch(&pool)
        .await
        .expect("epoch");
    // One wrote up to 300 while the other, stalled, still holds 100 to 300.
    one.write(
        &[
            (at(100), row("a")),
            (at(200), row("b")),
            (at(300), row("c")),
        ],
        at(300),
        &epoch,
    )
    .await
    .expect("write");
    two.write(&[(at(200), row("b")), (at(300), row("c"))], at(300), &epoch)
        .await
        .expect("write again");
    two.write(&[(at(100), row("a"))], at(100), &epoch)
        .await
        .expect("write behind");
    assert_eq!(
        feed_counts(&pool).await,
        BTreeMap::from([("a".into(), 1), ("b".into(), 1), ("c".into(), 1)])
    );
    let progress: i64 =
        sqlx::query_scalar("select (applied - '0/0'::pg_lsn)::int8 from bloom_guard.log_progress")
            .fetch_one(&pool)
            .await
            .expect("progress");
    assert_eq!(progress.unsigned_abs(), at(300), "the progress went back");
}

#[sqlx::test(migrations = false)]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn a_slot_made_again_sends_readers_behind_it_to_a_rebuild(pool: PgPool) {
    let (url, slot) = log_fed_items(&pool).await;
    let producer = Producer::new(pool.clone(), &url).await.expect("producer");
    let epoch = crate::postgres::log::slot::epoch(&pool)
        .await
        .expect("epoch");
    let mut connection = pool.acquire().await.expect("a connection");
    let before =
        crate::postgres::log::feed::read(&mut connection, &slot.name, &["items"], 0, None, false)
            .await
            .expect("a read");
    exec(&pool, "insert into items (id, key) values (1, 'lost')").await;
    sqlx::query("select pg_drop_replication_slot($1)")
        .bind(&slot.name)
        .execute(&pool)
        .await
        .expect("drop the slot");
    crate::watch::Watch::table("items")
        .key("key")
        .install_log(&pool)
        .await
        .expect("make the slot again");
    let after = crate::postgres::log::feed::read(
        &mut connection,
        &slot.name,
        &["items"],
        before.position,
        None,
        false,
    )
    .await
    .expect("a read");
    assert!(
        after.horizon > before.position,
        "a reader from before the slot was made again would miss 'lost': {after:?}"
    );
    assert_ne!(after.epoch, before.epoch, "the epoch did not change");
    // A producer still streaming the slot from before writes nothing.
    let row = crate::postgres::log::rows::FeedRow {
        guard: "items".into(),
        kind: b'd',
        key: "lost".into(),
    };
    let stale = producer
        .write(&[(after.horizon + 1000, row)], after.horizon + 1000, &epoch)
        .await;
    assert!(stale.is_err(), "a stale producer wrote: {stale:?}");
    assert_eq!(feed_counts(&pool).await, BTreeMap::new());
    drop(url);
}

#[sqlx::test(migrations = false)]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn quiet_watched_tables_on_a_busy_database_pin_no_log(pool: PgPool) {
    let (url, slot) = log_fed_items(&pool).await;
    let stop = tokio_util::sync::CancellationToken::new();
    let producer = Producer::new(pool.clone(), &url).await.expect("producer");
    tokio::spawn(producer.run(stop.clone()));
    exec(&pool, "insert into items (id, key) values (1, 'a')").await;
    until_fed(&pool, "a").await;
    // Busy elsewhere: megabytes of log from a table not on the feed.
    exec(
        &pool,
        "create table busy (n int, pad text);
         insert into busy select g, repeat('x', 200) from generate_series(1, 30000) g",
    )
    .await;
    let written: String = sqlx::query_scalar("select pg_current_wal_lsn()::text")
        .fetch_one(&pool)
        .await
        .expect("the log's position");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (confirmed, restart): (bool, bool) = sqlx::query_as(
            "select confirmed_flush_lsn >= $2::pg_lsn, restart_lsn >= $2::pg_lsn - 1048576
               from pg_replication_slots where slot_name = $1",
        )
        .bind(&slot.name)
        .bind(&written)
        .fetch_one(&pool)
        .await
        .expect("the slot");
        if confirmed && restart {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the slot still keeps the log before {written}: confirmed past it {confirmed}, restart within a megabyte {restart}"
        );
        exec(&pool, "insert into busy values (0, 'tick')").await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    stop.cancel();
}

#[sqlx::test(migrations = false)]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn a_backlog_is_written_in_large_batches_with_its_lag(pool: PgPool) {
    let (url, _slot) = log_fed_items(&pool).await;
    // A first producer makes the slot and stops; 1 200 one-row
    // transactions commit while none streams.
    let stop = tokio_util::sync::CancellationToken::new();
    let producer = Producer::new(pool.clone(), &url).await.expect("producer");
    tokio::spawn(producer.run(stop.clone()));
    exec(&pool, "insert into items (id, key) values (1, 'first')").await;
    until_fed(&pool, "first").await;
    stop.cancel();
    tokio::time::sleep(Duration::from_millis(300)).await;
    for id in 2..=1201 {
        sqlx::query("insert into items (id, key) values ($1, 'backlog-' || $1)")
            .bind(id)
            .execute(&pool)
            .await
            .expect("a write");
    }
    let stop = tokio_util::sync::CancellationToken::new();
    let producer = Producer::new(pool.clone(), &url).await.expect("producer");
    tokio::spawn(producer.run(stop.clone()));
    until_fed(&pool, "backlog-1201").await;
    stop.cancel();
    // Written as it was at hand: a write each time the stream looked
    // empty, with the runtime's budget spent (128 receives), took 43
    // transactions at most however many waited.
    let (writes, largest): (i64, i64) = sqlx::query_as(
        "select count(*), max(n) from (select count(*) as n from bloom_guard.log_changes
                                        where key like 'backlog-%' group by xmin::text) w",
    )
    .fetch_one(&pool)
    .await
    .expect("the writes");
    assert!(
        largest > 43,
        "{writes} writes, the largest of {largest} rows"
    );
    // Each write keeps its commit-to-feed lag: here, how long the backlog
    // waited.
    let lag: f64 =
        sqlx::query_scalar("select extract(epoch from lag)::float8 from bloom_guard.log_progress")
            .fetch_one(&pool)
            .await
            .expect("the lag");
    assert!(lag > 0.0 && lag < 60.0, "lag {lag}");
    assert_eq!(feed_counts(&pool).await, table_counts(&pool).await);
}
