//! Every way rows appear, driven by a DBA's own commands: a table swap
//! migration, a schema put first in the `search_path`, and `pg_restore
//! --clean` of another database's dump, each with a follower running. Each
//! test passes only if every key the table holds is served through the
//! guard within the documented window: the check interval (200 ms here)
//! and one rebuild.

mod common;

use std::time::Duration;

use bloom_guard::stats::GuardState;
use common::*;
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;

/// Within the check interval and one rebuild, with room for a slow machine.
const WINDOW: Duration = Duration::from_secs(10);

async fn served(guard: &bloom_guard::BloomGuard, what: &str, keys: &[String]) {
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    wait_until(what, WINDOW, || holds_all(guard, &keys)).await;
    assert!(
        !guard.may_contain("never-written"),
        "{what}: answering again"
    );
}

fn keys(prefix: &str, count: usize) -> Vec<String> {
    (1..=count).map(|i| format!("{prefix}-{i}")).collect()
}

#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn a_table_swap_migration_is_watched_and_rebuilt(pool: PgPool) {
    install(&pool).await;
    exec(
        &pool,
        "insert into items (key) select 'old-' || i from generate_series(1, 20) i",
    )
    .await;
    let (guard, _task) = followed(&pool).await;
    exec(
        &pool,
        "create table items_new (like items including all);
         insert into items_new (key, value) select key, value from items;
         alter table items rename to items_old;
         alter table items_new rename to items;
         insert into items (key) select 'swapped-' || i from generate_series(1, 40) i",
    )
    .await;
    served(&guard, "the swapped table's keys", &keys("swapped", 40)).await;
    served(&guard, "the copied keys", &keys("old", 20)).await;
    // Watched from now on: once the rebuilds the repair asked for are done,
    // a later write arrives through the feed.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let generation = guard.stats().generation;
    exec(&pool, "insert into items (key) values ('after-the-swap')").await;
    arrives(&guard, &["after-the-swap"]).await;
    assert_eq!(guard.stats().generation, generation);
}

#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn a_schema_first_in_the_search_path_is_watched_and_rebuilt(pool: PgPool) {
    install(&pool).await;
    // The app's pool, whose connections come and go: new ones take the
    // database's search_path.
    let app = PgPoolOptions::new()
        .max_lifetime(Duration::from_millis(300))
        .idle_timeout(Duration::from_millis(100))
        .connect_with((*pool.connect_options()).clone())
        .await
        .expect("the app's pool");
    let guard = guard();
    let _task = spawn(follower(&guard, &app));
    wait_until("ready", WINDOW, || guard.is_ready()).await;
    let database: String = sqlx::query_scalar("select current_database()")
        .fetch_one(&pool)
        .await
        .expect("database");
    exec(
        &pool,
        &format!(
            "create schema shadow;
             create table shadow.items (like public.items including all);
             insert into shadow.items (key) select 'shadowed-' || i from generate_series(1, 20) i;
             alter database \"{database}\" set search_path = shadow, public"
        ),
    )
    .await;
    // The app now reads and writes shadow.items.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let resolved: String = sqlx::query_scalar(
        "select relnamespace::regnamespace::text from pg_class where oid = 'items'::regclass",
    )
    .fetch_one(&app)
    .await
    .expect("resolve");
    assert_eq!(resolved, "shadow");
    exec(
        &app,
        "insert into items (key) select 'written-' || i from generate_series(1, 20) i",
    )
    .await;
    served(&guard, "the shadowing table's keys", &keys("shadowed", 20)).await;
    served(&guard, "the keys written to it", &keys("written", 20)).await;
    assert_eq!(guard.stats().state, GuardState::Ready);
}

#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn a_pg_restore_clean_of_another_database_is_rebuilt_here_and_on_a_new_instance(
    pool: PgPool,
) {
    install(&pool).await;
    exec(
        &pool,
        "insert into items (key) select 'here-' || i from generate_series(1, 10) i",
    )
    .await;
    let (guard, _task) = followed(&pool).await;
    // Another database, watched the same way, with its own keys.
    let (source, other) = restore_source(&pool).await;
    install(&other).await;
    other.close().await;
    restore_clean(&pool, &source).await;
    exec(&pool, &format!("drop database {source}")).await;

    let restored = keys("restored", 2000);
    served(
        &guard,
        "the restored keys on the running instance",
        &restored,
    )
    .await;
    // An instance started afterwards, which may adopt what the running one
    // publishes.
    let (later, _later) = followed(&pool).await;
    served(&later, "the restored keys on a new instance", &restored).await;
}

#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn renaming_the_key_column_under_writers_fails_no_write_and_no_key(pool: PgPool) {
    install(&pool).await;
    rename_under_writers(&pool).await;
}

#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn a_key_column_dropped_by_a_cascade_fails_no_write(pool: PgPool) {
    // No ALTER TABLE names the column: dropping its type takes it along.
    exec(
        &pool,
        "create domain item_key as text;
         create table things (id bigint generated always as identity primary key, code item_key unique)",
    )
    .await;
    bloom_guard_sqlx::postgres::install(&pool)
        .await
        .expect("install");
    bloom_guard_sqlx::Watch::table("things")
        .key("code")
        .install(&pool)
        .await
        .expect("watch");
    exec(&pool, "insert into things (code) values ('before')").await;
    exec(&pool, "drop domain item_key cascade").await;
    exec(&pool, "insert into things default values").await;
    let kinds: Vec<String> = sqlx::query_scalar(
        "select kind::text from bloom_guard.changes where guard = 'things' order by xid",
    )
    .fetch_all(&pool)
    .await
    .expect("feed");
    assert_eq!(kinds.last().map(String::as_str), Some("r"), "{kinds:?}");
}

/// Renames `items.key` under four writers, then back: no write fails, the
/// guard fails open meanwhile and names the column, and serves every key
/// once the name is back.
async fn rename_under_writers(pool: &PgPool) {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    let pool = pool.clone();
    let (guard, _task) = followed(&pool).await;
    // Writers that name no column, so the rename does not break their SQL:
    // only a trigger could.
    let stop = Arc::new(AtomicBool::new(false));
    let committed = Arc::new(Mutex::new(Vec::new()));
    let failed = Arc::new(Mutex::new(Vec::new()));
    let writers: Vec<_> = (0..4)
        .map(|writer| {
            let (pool, stop) = (pool.clone(), stop.clone());
            let (committed, failed) = (committed.clone(), failed.clone());
            tokio::spawn(async move {
                let mut i = 0;
                while !stop.load(Ordering::SeqCst) {
                    i += 1;
                    let key = format!("w{writer}-{i}");
                    match sqlx::query("insert into items values (default, $1, default)")
                        .bind(&key)
                        .execute(&pool)
                        .await
                    {
                        Ok(_) => committed.lock().expect("keys").push(key),
                        Err(error) => failed.lock().expect("errors").push(error.to_string()),
                    }
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    exec(&pool, "alter table items rename column key to k").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Every committed key is answered "maybe": the guard fails open.
    let during: Vec<String> = committed.lock().expect("keys").clone();
    let missing: Vec<&String> = during
        .iter()
        .filter(|key| !guard.may_contain(key))
        .collect();
    assert!(missing.is_empty(), "{missing:?} {:?}", guard.stats());
    assert_eq!(guard.stats().state, GuardState::Degraded);
    // The trigger check names the column.
    wait_until("the check to name the column", WINDOW, || {
        guard
            .stats()
            .reason
            .is_some_and(|why| why.contains("key column key is gone"))
    })
    .await;
    exec(&pool, "alter table items rename column k to key").await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, Ordering::SeqCst);
    for writer in writers {
        writer.await.expect("writer");
    }
    let failed = failed.lock().expect("errors").clone();
    assert!(failed.is_empty(), "writes failed: {failed:?}");
    let committed = committed.lock().expect("keys").clone();
    assert!(committed.len() > during.len());
    served(
        &guard,
        "every committed key, once the name is back",
        &committed,
    )
    .await;
}
