//! The read barrier on real databases: a key committed through one
//! instance (or any SQL client) and read through another at once is never
//! refused, on Postgres and on SQLite (two pools on one file, as two
//! processes would have).

mod common;

use std::str::FromStr;
use std::time::Duration;

use bloom_guard::BloomGuard;
use bloom_guard_sqlx::{sqlite, Watch};
use common::*;
use http::StatusCode;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use sqlx::PgPool;

/// Inserts each key through `write` (instance A's write path: its own
/// guard first, then the row) and asks `read` (instance B) at once; the
/// refusals.
async fn refusals<F, Fut>(
    writer: &BloomGuard,
    reader: &BloomGuard,
    rounds: usize,
    write: F,
) -> usize
where
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut refused = 0;
    for i in 0..rounds {
        let key = format!("created-{i}-{}", fastrand::u32(..));
        writer.insert(&key);
        write(key.clone()).await;
        if status(reader, &key).await == StatusCode::NOT_FOUND {
            refused += 1;
        }
    }
    refused
}

#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn postgres_a_key_created_on_one_instance_is_served_by_another_at_once(pool: PgPool) {
    install(&pool).await;
    let (one, _one) = followed(&pool).await;
    let (two, _two) = followed(&pool).await;
    let insert = |key: String| {
        let pool = pool.clone();
        async move {
            sqlx::query("insert into items (key) values ($1)")
                .bind(key)
                .execute(&pool)
                .await
                .expect("insert");
        }
    };
    assert_eq!(refusals(&one, &two, 300, insert).await, 0);
    let stats = two.stats();
    assert!(
        stats.barrier_found > 0,
        "no key needed the barrier: {stats:?}"
    );
    assert_eq!(status(&two, "never-written").await, StatusCode::NOT_FOUND);
}

#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn postgres_without_the_barrier_another_instance_refuses_fresh_keys(pool: PgPool) {
    install(&pool).await;
    let (one, _one) = followed(&pool).await;
    let two = BloomGuard::builder()
        .expected_items(1000)
        .read_barrier(false)
        .build();
    let _two = spawn(follower(&two, &pool));
    wait_until("the second warm-up", Duration::from_secs(10), || {
        two.is_ready()
    })
    .await;
    let insert = |key: String| {
        let pool = pool.clone();
        async move {
            sqlx::query("insert into items (key) values ($1)")
                .bind(key)
                .execute(&pool)
                .await
                .expect("insert");
        }
    };
    // The window the barrier closes: most keys are refused at once.
    assert!(refusals(&one, &two, 50, insert).await > 25);
}

#[tokio::test]
async fn sqlite_a_key_created_through_one_pool_is_served_through_another_at_once() {
    let dir = std::env::temp_dir().join(format!("bloom-guard-barrier-{}", fastrand::u64(..)));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("items.db");
    let open = || async {
        let options = SqliteConnectOptions::from_str(&format!("sqlite://{}", path.display()))
            .expect("options")
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal);
        SqlitePoolOptions::new()
            .max_connections(2)
            .connect_with(options)
            .await
            .expect("open")
    };
    let (first, second) = (open().await, open().await);
    sqlx::raw_sql("create table items (id integer primary key, key text not null unique)")
        .execute(&first)
        .await
        .expect("schema");
    let items = Watch::table("items").key("key");
    items.install(&first).await.expect("install");
    let guards = [BloomGuard::builder().build(), BloomGuard::builder().build()];
    let mut running = Vec::new();
    for (guard, pool) in guards.iter().zip([&first, &second]) {
        let follower = sqlite::Follower::new(guard.clone(), pool.clone(), items.clone());
        running.push(tokio::spawn(follower.run()));
    }
    for guard in &guards {
        wait_until("ready", Duration::from_secs(10), || guard.is_ready()).await;
    }
    let insert = |key: String| {
        let pool = first.clone();
        async move {
            sqlx::query("insert into items (key) values (?)")
                .bind(key)
                .execute(&pool)
                .await
                .expect("insert");
        }
    };
    assert_eq!(refusals(&guards[0], &guards[1], 300, insert).await, 0);
    assert_eq!(
        status(&guards[1], "never-written").await,
        StatusCode::NOT_FOUND
    );
    for task in running {
        task.abort();
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Two guards of one instance on one database, both flooded with absent
/// keys: a read one guard's refusals asked for also reads for the other's
/// (one statement), a key committed before a request is never refused
/// whichever statement read for it, and keys deleted meanwhile are
/// forgotten while the keys left are kept.
#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn postgres_guards_on_one_database_share_reads_and_refuse_no_committed_key(pool: PgPool) {
    install(&pool).await;
    exec(&pool, "create table users (key text primary key)").await;
    let users = Watch::table("users").key("key");
    users.install(&pool).await.expect("watch users");
    let guards = [guard(), guard()];
    let _running = [
        spawn(follower(&guards[0], &pool)),
        spawn(
            bloom_guard_sqlx::postgres::Follower::new(guards[1].clone(), pool.clone(), users)
                .poll_interval(Duration::from_millis(500)),
        ),
    ];
    for guard in &guards {
        wait_until("ready", Duration::from_secs(10), || guard.is_ready()).await;
    }
    flooded_guards_share_reads_and_refuse_no_committed_key(&pool, &guards).await;
}

/// The same over the log feed: the producer waited for once per shared
/// read.
#[cfg(feature = "log-feed")]
#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn postgres_guards_on_the_log_feed_share_reads_and_refuse_no_committed_key(pool: PgPool) {
    let (url, _slot) = common::log::log_fed(&pool).await;
    exec(&pool, "create table users (key text primary key)").await;
    let users = Watch::table("users").key("key");
    users
        .install_log(&pool)
        .await
        .expect("users on the log feed");
    let guards = [common::log::log_guard(), common::log::log_guard()];
    let _running = [
        spawn(bloom_guard_sqlx::postgres::log::Follower::new(
            guards[0].clone(),
            pool.clone(),
            items(),
            url.clone(),
        )),
        spawn(bloom_guard_sqlx::postgres::log::Follower::new(
            guards[1].clone(),
            pool.clone(),
            users,
            url,
        )),
    ];
    for guard in &guards {
        wait_until("ready", Duration::from_secs(20), || guard.is_ready()).await;
    }
    flooded_guards_share_reads_and_refuse_no_committed_key(&pool, &guards).await;
}

/// Both guards flooded with absent keys: a read one guard's refusals
/// asked for also reads for the other's (one statement), a key committed
/// before a request is never refused whichever statement read for it,
/// and keys deleted meanwhile are forgotten while the keys left are kept.
async fn flooded_guards_share_reads_and_refuse_no_committed_key(
    pool: &PgPool,
    guards: &[BloomGuard; 2],
) {
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flood: Vec<_> = (0..64)
        .map(|i| {
            let (guard, stop) = (guards[i % 2].clone(), std::sync::Arc::clone(&stop));
            tokio::spawn(async move {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    // Refused, or a false positive of the filter.
                    let key = format!("absent-{}", fastrand::u64(..));
                    status(&guard, &key).await;
                }
            })
        })
        .collect();
    // Meanwhile keys written by another client, asked for at once; every
    // third round deletes the key written two rounds before.
    let mut refused = Vec::new();
    let (mut kept, mut deleted) = (Vec::new(), Vec::new());
    let guard_of = |table: &str| &guards[usize::from(table == "users")];
    let run = |statement: String, key: String| {
        let pool = pool.clone();
        async move {
            sqlx::query(sqlx::AssertSqlSafe(statement))
                .bind(key)
                .execute(&pool)
                .await
                .expect("a write");
        }
    };
    for i in 0..300 {
        let table = if i % 2 == 0 { "items" } else { "users" };
        let key = format!("created-{i}-{}", fastrand::u32(..));
        run(
            format!("insert into {table} (key) values ($1)"),
            key.clone(),
        )
        .await;
        if status(guard_of(table), &key).await == StatusCode::NOT_FOUND {
            refused.push(key.clone());
        }
        kept.push((table, key));
        if i % 3 == 2 {
            let (table, key) = kept.remove(kept.len() - 3);
            run(format!("delete from {table} where key = $1"), key.clone()).await;
            deleted.push((table, key));
        }
    }
    // After a read that began after the deletes, the deleted keys are
    // forgotten (but for the filter's false positives), the others kept.
    let mut forgotten = 0;
    for (table, key) in &deleted {
        if status(guard_of(table), key).await == StatusCode::NOT_FOUND {
            forgotten += 1;
        }
    }
    for (table, key) in &kept {
        if status(guard_of(table), key).await == StatusCode::NOT_FOUND {
            refused.push(key.clone());
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for task in flood {
        task.await.expect("the flood's requests");
    }
    assert!(refused.is_empty(), "committed keys refused: {refused:?}");
    assert!(
        forgotten * 10 >= deleted.len() * 9,
        "{forgotten} of {} deleted keys forgotten",
        deleted.len()
    );
    let feeds: Vec<_> = guards
        .iter()
        .map(|guard| guard.stats().feed.expect("a feed read"))
        .collect();
    let shared: u64 = feeds.iter().map(|feed| feed.shared_reads).sum();
    assert!(shared > 0, "no read was shared: {feeds:?}");
    for guard in guards {
        let stats = guard.stats();
        assert_eq!(stats.barrier_timeouts, 0, "{stats:?}");
    }
}

/// Every backend of the database terminated three times during a run of
/// absent keys (a restart, a failover, a DBA's `pg_terminate_backend`):
/// a barrier read whose connection died is read again on a new one, so
/// the refusals waiting for it are not let through.
#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn postgres_refusals_hold_through_killed_connections(pool: PgPool) {
    install(&pool).await;
    let (guard, _running) = followed(&pool).await;
    let mut passed = 0;
    for i in 0..1_000 {
        if i % 333 == 100 {
            exec(
                &pool,
                "select pg_terminate_backend(pid) from pg_stat_activity
                  where datname = current_database() and pid <> pg_backend_pid()",
            )
            .await;
        }
        if status(&guard, &format!("absent-{i}")).await != StatusCode::NOT_FOUND {
            passed += 1;
        }
    }
    let stats = guard.stats();
    assert!(
        passed <= 5,
        "{passed} of 1000 absent keys let through: {stats:?}"
    );
    assert!(stats.barrier_waits >= 990, "{stats:?}");
}

/// A model of the log feed's barrier while the server writes. Eight
/// writers commit raw SQL of every kind to `items` (one-row and multi-row
/// inserts, upserts, MERGE, COPY, key updates, a delete and re-insert in
/// one transaction, deletes); four more write an unwatched table, moving
/// the log with nothing for the feed; a flood of absent keys keeps the
/// barrier's reads going. Right after each commit, its writer asks a guard
/// that never saw the write for every key it holds: none is refused. Each
/// writer owns its keys, so what it holds is the table's answer for them.
#[cfg(feature = "log-feed")]
#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn postgres_on_the_log_feed_no_committed_key_is_refused_while_the_server_writes(
    pool: PgPool,
) {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    let (url, _slot) = common::log::log_fed(&pool).await;
    exec(
        &pool,
        "create table noise (id bigserial primary key, body text)",
    )
    .await;
    let guard = common::log::log_guard();
    let _running = spawn(bloom_guard_sqlx::postgres::log::Follower::new(
        guard.clone(),
        pool.clone(),
        items(),
        url,
    ));
    wait_until("ready", Duration::from_secs(20), || guard.is_ready()).await;
    let stop = Arc::new(AtomicBool::new(false));
    let mut background = Vec::new();
    for _ in 0..8 {
        let (guard, stop) = (guard.clone(), Arc::clone(&stop));
        background.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                status(&guard, &format!("absent-{}", fastrand::u64(..))).await;
            }
        }));
    }
    for _ in 0..4 {
        let (pool, stop) = (pool.clone(), Arc::clone(&stop));
        background.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                sqlx::query("insert into noise (body) values (repeat('x', 200))")
                    .execute(&pool)
                    .await
                    .expect("a write elsewhere");
            }
        }));
    }
    let writers: Vec<_> = (0..8)
        .map(|writer| {
            tokio::spawn(owned_keys_never_refused(
                pool.clone(),
                guard.clone(),
                writer,
            ))
        })
        .collect();
    let mut refused = Vec::new();
    for writer in writers {
        refused.extend(writer.await.expect("a writer"));
    }
    stop.store(true, Ordering::Relaxed);
    for task in background {
        task.await.expect("the background load");
    }
    let stats = guard.stats();
    assert!(
        refused.is_empty(),
        "committed keys refused: {refused:?}; {stats:?}"
    );
    assert!(
        stats.barrier_found > 0,
        "no request needed the barrier: {stats:?}"
    );
    assert_eq!(stats.barrier_timeouts, 0, "{stats:?}");
    // Each read reports the producer's commit-to-feed lag.
    let lag = stats.feed.as_ref().and_then(|feed| feed.lag_ms);
    assert!(lag.is_some_and(|lag| lag < 60_000), "{stats:?}");
}

/// One writer of the barrier's model: 40 random statements on keys of its
/// own, each followed by a request for every key it holds; the keys
/// refused.
#[cfg(feature = "log-feed")]
async fn owned_keys_never_refused(pool: PgPool, guard: BloomGuard, writer: u64) -> Vec<String> {
    let mut rng = fastrand::Rng::with_seed(writer);
    let (mut held, mut refused, mut made) = (Vec::<String>::new(), Vec::new(), 0);
    let mut fresh = || {
        made += 1;
        format!("w{writer}-{made}-{}", fastrand::u32(..))
    };
    let run = |sql: &'static str, keys: Vec<String>| {
        let pool = pool.clone();
        async move {
            let mut query = sqlx::query(sql);
            for key in keys {
                query = query.bind(key);
            }
            query.execute(&pool).await.expect("a write");
        }
    };
    for _ in 0..40 {
        match rng.u8(..9) {
            1 => {
                let keys = vec![fresh(), fresh(), fresh()];
                sqlx::query("insert into items (key) select unnest($1::text[])")
                    .bind(&keys)
                    .execute(&pool)
                    .await
                    .expect("a multi-row insert");
                held.extend(keys);
            }
            2 => {
                let key = fresh();
                run(
                    "insert into items (key) values ($1) on conflict (key) do update set key = excluded.key",
                    vec![key.clone()],
                )
                .await;
                held.push(key);
            }
            3 => {
                let key = fresh();
                run(
                    "merge into items t using (select $1::text as key) s on t.key = s.key
                      when not matched then insert (key) values (s.key)",
                    vec![key.clone()],
                )
                .await;
                held.push(key);
            }
            4 => {
                let keys = [fresh(), fresh()];
                let mut connection = pool.acquire().await.expect("a connection");
                let mut copy = connection
                    .copy_in_raw("copy items (key) from stdin")
                    .await
                    .expect("copy");
                copy.send(format!("{}\n{}\n", keys[0], keys[1]).into_bytes())
                    .await
                    .expect("copy rows");
                copy.finish().await.expect("copy done");
                held.extend(keys);
            }
            5 if !held.is_empty() => {
                let at = rng.usize(..held.len());
                let key = fresh();
                run(
                    "update items set key = $2 where key = $1",
                    vec![held[at].clone(), key.clone()],
                )
                .await;
                held[at] = key;
            }
            6 if !held.is_empty() => {
                let key = held[rng.usize(..held.len())].clone();
                let mut tx = pool.begin().await.expect("begin");
                for sql in [
                    "delete from items where key = $1",
                    "insert into items (key) values ($1)",
                ] {
                    sqlx::query(sql)
                        .bind(&key)
                        .execute(&mut *tx)
                        .await
                        .expect("a write");
                }
                tx.commit().await.expect("commit");
            }
            7 if held.len() > 2 => {
                let key = held.swap_remove(rng.usize(..held.len()));
                run("delete from items where key = $1", vec![key]).await;
            }
            _ => {
                let key = fresh();
                run("insert into items (key) values ($1)", vec![key.clone()]).await;
                held.push(key);
            }
        }
        for key in &held {
            if status(&guard, key).await == StatusCode::NOT_FOUND {
                refused.push(key.clone());
            }
        }
    }
    refused
}
