//! The feed's DDL on a MySQL or MariaDB table (`Watch::install`, and
//! `mysql::uninstall`) behind a transaction that holds the table: writers
//! are held back at most about the lock wait (1 s) at a time, and the DDL
//! completes once that transaction ends. And the uninstall: a table's
//! triggers, then the whole feed.

mod common;

use std::time::{Duration, Instant};

use bloom_guard_sqlx::{mysql, Watch};
use common::mysql::{fresh, items};
use sqlx::{Connection, MySqlPool};

/// Longer than the DDL's lock wait (1 s) plus a loaded machine's slack,
/// far shorter than the open transaction.
const WRITER_BOUND: Duration = Duration::from_secs(3);

/// How long the open transaction stays open.
const HELD: Duration = Duration::from_secs(5);

/// Runs `ddl` while a transaction that wrote to `items` stays open for
/// [`HELD`], and one-row inserts run meanwhile: none of them waits longer
/// than [`WRITER_BOUND`], and `ddl` completes only after the transaction.
async fn behind_an_open_writer<F>(pool: &MySqlPool, ddl: F)
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    let mut holder = pool.acquire().await.expect("a connection").detach();
    let mut open = holder.begin().await.expect("begin");
    sqlx::query("insert into items (code) values (?)")
        .bind(format!("held-{}", fastrand::u64(..)))
        .execute(&mut *open)
        .await
        .expect("the open transaction's write");
    let started = Instant::now();
    let ddl = tokio::spawn(ddl);
    let mut slowest = Duration::ZERO;
    let mut writes = 0;
    while started.elapsed() < HELD {
        let at = Instant::now();
        let insert = sqlx::query("insert into items (code) values (?)")
            .bind(format!("writer-{}", fastrand::u64(..)))
            .execute(pool);
        tokio::time::timeout(2 * WRITER_BOUND, insert)
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "a writer waited over {:?} behind the feed's DDL",
                    2 * WRITER_BOUND
                )
            })
            .expect("a writer's insert");
        slowest = slowest.max(at.elapsed());
        writes += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        slowest < WRITER_BOUND,
        "a writer waited {slowest:?} behind the feed's DDL"
    );
    assert!(writes > 5, "{writes} writes");
    assert!(
        !ddl.is_finished(),
        "the DDL did not wait for the open transaction"
    );
    open.commit().await.expect("commit");
    tokio::time::timeout(Duration::from_secs(20), ddl)
        .await
        .expect("the DDL completes once the transaction ended")
        .expect("no panic");
    let _ = holder.close().await;
}

/// The feed's triggers of the database whose names start with `prefix`.
async fn triggers(pool: &MySqlPool, prefix: &str) -> i64 {
    sqlx::query_scalar(
        "select count(*) from information_schema.triggers
          where trigger_schema = database() and trigger_name like concat(?, '%')",
    )
    .bind(prefix)
    .fetch_one(pool)
    .await
    .expect("triggers")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(mysql_database), ignore = "needs MySQL or MariaDB: set MYSQL_URL")]
async fn watching_and_unwatching_behind_a_writer_never_stall_writers() {
    let pool = fresh(8).await;
    let other = Watch::table("items").key("code").name("other");
    let watching = {
        let (pool, other) = (pool.clone(), other.clone());
        async move { other.install(&pool).await.expect("watch") }
    };
    behind_an_open_writer(&pool, watching).await;
    assert_eq!(triggers(&pool, "bloom_guard_other_").await, 3);

    let unwatching = {
        let (pool, other) = (pool.clone(), other.clone());
        async move { other.uninstall(&pool).await.expect("unwatch") }
    };
    behind_an_open_writer(&pool, unwatching).await;
    assert_eq!(triggers(&pool, "bloom_guard_other_").await, 0);
    assert_eq!(triggers(&pool, "bloom_guard_items_").await, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(mysql_database), ignore = "needs MySQL or MariaDB: set MYSQL_URL")]
async fn uninstall_removes_a_tables_triggers_then_the_whole_feed() {
    let pool = fresh(4).await;
    let feed_rows = || async {
        sqlx::query_scalar::<_, i64>("select count(*) from bloom_guard_changes")
            .fetch_one(&pool)
            .await
            .expect("feed rows")
    };
    sqlx::raw_sql("insert into items (code) values ('recorded')")
        .execute(&pool)
        .await
        .expect("insert");
    let recorded = feed_rows().await;
    assert!(recorded > 0);
    items().uninstall(&pool).await.expect("unwatch");
    assert_eq!(triggers(&pool, "bloom_guard_").await, 0);
    sqlx::raw_sql("insert into items (code) values ('unrecorded')")
        .execute(&pool)
        .await
        .expect("insert");
    assert_eq!(feed_rows().await, recorded, "a write reached the feed");

    items().install(&pool).await.expect("watch again");
    assert_eq!(triggers(&pool, "bloom_guard_").await, 3);
    mysql::uninstall(&pool).await.expect("uninstall");
    let left: i64 = sqlx::query_scalar(
        "select (select count(*) from information_schema.tables
                  where table_schema = database() and table_name like 'bloom\\_guard\\_%')
              + (select count(*) from information_schema.triggers
                  where trigger_schema = database() and trigger_name like 'bloom\\_guard\\_%')",
    )
    .fetch_one(&pool)
    .await
    .expect("what is left");
    assert_eq!(left, 0);
    // The application's table is untouched, and writable.
    sqlx::raw_sql("insert into items (code) values ('after')")
        .execute(&pool)
        .await
        .expect("insert after the uninstall");
    // Installing again starts afresh.
    items().install(&pool).await.expect("install again");
    assert_eq!(triggers(&pool, "bloom_guard_").await, 3);
}

/// A key column whose collation equates spellings no key type reproduces
/// (a language's collation, whose contractions of letters the guard does
/// not weigh) is refused at watch, naming the column, its collation and
/// what to use instead; nothing is installed on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(mysql_database), ignore = "needs MySQL or MariaDB: set MYSQL_URL")]
async fn a_key_column_no_key_type_compares_is_refused_at_watch() {
    let pool = fresh(2).await;
    sqlx::raw_sql(
        "create table names (id bigint auto_increment primary key,
                             name varchar(100) character set utf8mb4 collate utf8mb4_spanish2_ci not null)",
    )
    .execute(&pool)
    .await
    .expect("create names");
    let watched = Watch::table("names").key("name").install(&pool).await;
    let Err(bloom_guard_sqlx::FeedError::Uncomparable(why)) = watched else {
        panic!("{watched:?}");
    };
    for named in [
        "names.name",
        "utf8mb4_spanish2_ci",
        "utf8mb4_general_ci",
        "utf8mb4_nopad_bin",
    ] {
        assert!(why.contains(named), "{named} not in: {why}");
    }
    assert_eq!(triggers(&pool, "bloom_guard_names_").await, 0);
}
