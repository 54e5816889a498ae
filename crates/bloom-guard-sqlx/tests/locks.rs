//! The feed's DDL on a user's table (`watch`, `unwatch`, the schema
//! upgrade) behind a transaction that holds the table: writers are held
//! back at most about the lock timeout at a time, and the DDL completes
//! once that transaction ends.

mod common;

use std::time::{Duration, Instant};

use common::*;
use sqlx::{Connection, PgPool};

/// Longer than the DDL's lock timeout (500 ms) plus a loaded machine's
/// slack, far shorter than the open transaction.
const WRITER_BOUND: Duration = Duration::from_secs(2);

/// How long the open transaction stays open.
const HELD: Duration = Duration::from_secs(4);

/// Runs `ddl` while a transaction that ran `holding` stays open for
/// [`HELD`], and one-row inserts run meanwhile: none of them waits longer
/// than [`WRITER_BOUND`], and `ddl` completes only after the transaction.
async fn behind_an_open_transaction<F>(pool: &PgPool, holding: &str, ddl: F)
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    let mut holder = pool.acquire().await.expect("a connection").detach();
    let mut open = holder.begin().await.expect("begin");
    sqlx::raw_sql(sqlx::AssertSqlSafe(holding.to_owned()))
        .execute(&mut *open)
        .await
        .expect("the open transaction's statement");
    let started = Instant::now();
    let ddl = tokio::spawn(ddl);
    let mut slowest = Duration::ZERO;
    let mut writes = 0;
    let run = fastrand::u64(..);
    while started.elapsed() < HELD {
        let at = Instant::now();
        let insert = sqlx::query("insert into items (key) values ($1)")
            .bind(format!("writer-{run}-{writes}"))
            .execute(pool);
        // Without the lock timeout the insert would wait for the open
        // transaction, which waits for this loop: fail, not hang.
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
    tokio::time::timeout(Duration::from_secs(15), ddl)
        .await
        .expect("the DDL completes once the transaction ended")
        .expect("no panic");
    let _ = holder.close().await;
}

async fn triggers(pool: &PgPool) -> i64 {
    sqlx::query_scalar(
        "select count(*) from pg_trigger where tgrelid = 'items'::regclass and not tgisinternal",
    )
    .fetch_one(pool)
    .await
    .expect("triggers")
}

#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn watch_behind_a_writer_and_unwatch_behind_a_reader_never_stall_writers(pool: PgPool) {
    bloom_guard_sqlx::postgres::install(&pool)
        .await
        .expect("install");
    let watching = {
        let pool = pool.clone();
        async move { items().install(&pool).await.expect("watch") }
    };
    behind_an_open_transaction(&pool, "insert into items (key) values ('held')", watching).await;
    assert_eq!(triggers(&pool).await, 5);

    let unwatching = {
        let pool = pool.clone();
        async move { items().uninstall(&pool).await.expect("unwatch") }
    };
    behind_an_open_transaction(&pool, "select count(*) from items", unwatching).await;
    assert_eq!(triggers(&pool).await, 0);
}

#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn the_upgrade_behind_a_reader_never_stalls_writers(pool: PgPool) {
    install_version(&pool, include_str!("fixtures/postgres_v3.sql")).await;
    let upgrading = {
        let pool = pool.clone();
        async move {
            bloom_guard_sqlx::postgres::install(&pool)
                .await
                .expect("the upgrade");
        }
    };
    behind_an_open_transaction(&pool, "select count(*) from items", upgrading).await;
    let version: i32 = sqlx::query_scalar("select version from bloom_guard.schema_version")
        .fetch_one(&pool)
        .await
        .expect("version");
    assert_eq!(version, bloom_guard_sqlx::postgres::SCHEMA_VERSION);
}

/// A partition added to a watched tree gets its triggers from `watch`
/// without the rest of the tree being locked again: a transaction open on
/// another partition holds nothing up.
#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn a_new_partition_is_watched_without_locking_the_others(pool: PgPool) {
    bloom_guard_sqlx::postgres::install(&pool)
        .await
        .expect("install");
    exec(
        &pool,
        "create table parts (k text not null) partition by list (k);
         create table parts_a partition of parts for values in ('a');
         select bloom_guard.watch('parts', array['k'], 'parts');
         create table parts_b partition of parts for values in ('b')",
    )
    .await;
    let gaps = || async {
        sqlx::query_scalar::<_, String>("select problem from bloom_guard.gaps('parts')")
            .fetch_all(&pool)
            .await
            .expect("gaps")
    };
    assert!(!gaps().await.is_empty(), "the new partition has no trigger");
    // A reader of the old partition: dropping and creating its triggers
    // again would wait for it.
    let mut holder = pool.acquire().await.expect("a connection").detach();
    let mut open = holder.begin().await.expect("begin");
    sqlx::raw_sql("select count(*) from parts_a")
        .execute(&mut *open)
        .await
        .expect("read");
    let parts = bloom_guard_sqlx::Watch::table("parts")
        .key("k")
        .name("parts");
    tokio::time::timeout(Duration::from_secs(5), parts.install(&pool))
        .await
        .expect("watch waited for the old partition's reader")
        .expect("watch");
    assert_eq!(gaps().await, Vec::<String>::new());
    exec(&pool, "insert into parts values ('b')").await;
    let recorded: i64 = sqlx::query_scalar(
        "select count(*) from bloom_guard.changes where guard = 'parts' and kind = 'i' and key = 'b'",
    )
    .fetch_one(&pool)
    .await
    .expect("feed");
    assert_eq!(recorded, 1);
    open.commit().await.expect("commit");
    let _ = holder.close().await;
}
