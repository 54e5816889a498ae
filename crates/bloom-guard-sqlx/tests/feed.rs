//! The change feed on a real Postgres: every way a key gets written reaches
//! the filter, and nothing an ordinary or hostile SQL user does opens a
//! window for a false negative.

mod common;

use std::io::Write as _;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bloom_guard::stats::GuardState;
use bloom_guard_sqlx::Watch;
use common::*;
use sqlx::PgPool;

#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn installing_twice_is_a_no_op_and_watching_twice_rebuilds_nothing(pool: PgPool) {
    install(&pool).await;
    install(&pool).await;
    let resyncs: i64 =
        sqlx::query_scalar("select count(*) from bloom_guard.changes where kind = 'r'")
            .fetch_one(&pool)
            .await
            .expect("count");
    assert_eq!(resyncs, 1, "only the first watch asks readers to rebuild");
    // The feed's five triggers, and nothing else.
    let triggers: Vec<String> = sqlx::query_scalar(
        "select tgname::text from pg_trigger where tgrelid = 'items'::regclass and not tgisinternal order by 1",
    )
    .fetch_all(&pool)
    .await
    .expect("triggers");
    assert_eq!(
        triggers,
        [
            "bloom_guard_items_deleted",
            "bloom_guard_items_inserted",
            "bloom_guard_items_replica",
            "bloom_guard_items_truncated",
            "bloom_guard_items_updated"
        ]
    );
}

#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn keys_written_by_any_sql_reach_the_filter(pool: PgPool) {
    install(&pool).await;
    exec(
        &pool,
        "insert into items (key) values ('old'), ('upsert-me')",
    )
    .await;
    let (guard, _follower) = followed(&pool).await;

    // An update that changes the id and the key: joined by id, it was lost.
    exec(
        &pool,
        "update items set id = default, key = 'renamed' where key = 'old'",
    )
    .await;
    arrives(&guard, &["renamed"]).await;
    // An upsert that rewrites the key of the conflicting row.
    exec(
        &pool,
        "insert into items (key) values ('upsert-me')
         on conflict (key) do update set key = 'upserted', id = default",
    )
    .await;
    arrives(&guard, &["upserted"]).await;
    // MERGE, multi-row insert from a query, and COPY.
    exec(
        &pool,
        "merge into items i using (values ('merged')) v(k) on i.key = v.k
         when not matched then insert (key) values (v.k)",
    )
    .await;
    exec(
        &pool,
        "insert into items (key) select 'series-' || g from generate_series(1, 500) g",
    )
    .await;
    let mut conn = pool.acquire().await.expect("connection");
    let mut copy = conn
        .copy_in_raw("copy items (key) from stdin")
        .await
        .expect("copy");
    copy.send(&b"copied-1\ncopied\\t2\n"[..])
        .await
        .expect("send");
    copy.finish().await.expect("finish");
    drop(conn);
    arrives(
        &guard,
        &["merged", "series-1", "series-500", "copied-1", "copied\t2"],
    )
    .await;
    // A replica session (logical replication's apply worker) and a writer
    // whose search_path is empty (every pg_dump restore).
    exec(
        &pool,
        "set session_replication_role = replica;
         insert into items (key) values ('replicated');
         reset session_replication_role",
    )
    .await;
    exec(
        &pool,
        "set search_path = '';
         insert into public.items (key) values ('no-search-path');
         reset search_path",
    )
    .await;
    arrives(&guard, &["replicated", "no-search-path"]).await;
    assert!(!guard.may_contain("never-written"));
    assert_eq!(guard.stats().generation, 1, "no key needed a rebuild");
}

#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn an_unprivileged_notify_flood_wakes_reads_but_changes_nothing(pool: PgPool) {
    install(&pool).await;
    exec(&pool, "insert into items (key) values ('a')").await;
    let (guard, _follower) = followed(&pool).await;
    exec(
        &pool,
        "drop role if exists bloom_guard_stranger; create role bloom_guard_stranger login",
    )
    .await;
    let stranger = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .connect_with(
            (*pool.connect_options())
                .clone()
                .username("bloom_guard_stranger"),
        )
        .await
        .expect("connect as a stranger");
    let flood = {
        let stranger = stranger.clone();
        tokio::spawn(async move {
            for i in 0..2000 {
                for payload in ["items", "c", "kinjected", "r"] {
                    sqlx::query("select pg_notify('bloom_guard', $1)")
                        .bind(format!("{payload}{i}"))
                        .execute(&stranger)
                        .await
                        .expect("notify");
                }
            }
        })
    };
    while !flood.is_finished() {
        let stats = guard.stats();
        assert_eq!(
            stats.state,
            GuardState::Ready,
            "the flood failed the guard open"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    flood.await.expect("flood");
    stranger.close().await;
    exec(&pool, "drop role bloom_guard_stranger").await;
    let stats = guard.stats();
    assert_eq!(stats.generation, 1, "the flood caused a rebuild");
    assert!(!guard.may_contain("injected0") && !guard.may_contain("injected"));
    // The stranger cannot write to the feed either.
    assert!(guard.may_contain("a"));
}

#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn killed_listeners_open_no_window(pool: PgPool) {
    install(&pool).await;
    let (guard, _follower) = followed(&pool).await;
    let stop = Arc::new(AtomicBool::new(false));
    let committed = Arc::new(Mutex::new(Vec::<String>::new()));
    let writer = {
        let (pool, stop, committed) = (pool.clone(), stop.clone(), committed.clone());
        tokio::spawn(async move {
            let mut i = 0;
            while !stop.load(Ordering::SeqCst) {
                let key = format!("written-{i}");
                i += 1;
                sqlx::query("insert into items (key) values ($1)")
                    .bind(&key)
                    .execute(&pool)
                    .await
                    .expect("insert");
                committed.lock().expect("keys").push(key);
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
    };
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(kill_listeners(&pool).await >= 1, "no listener to kill");
        // The guard keeps answering absent keys throughout.
        for _ in 0..30 {
            let stats = guard.stats();
            assert_eq!(stats.state, GuardState::Ready, "{stats:?}");
            assert!(!guard.may_contain("absent-key"));
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    stop.store(true, Ordering::SeqCst);
    writer.await.expect("writer");
    let committed = committed.lock().expect("keys").clone();
    assert!(
        committed.len() > 100,
        "the writer barely ran: {}",
        committed.len()
    );
    let keys: Vec<&str> = committed.iter().map(String::as_str).collect();
    arrives(&guard, &keys).await;
    assert_eq!(
        guard.stats().generation,
        1,
        "a lost listener caused a rebuild"
    );
}

#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn a_bypassed_trigger_fails_open_names_the_table_and_rebuilds_after_repair(pool: PgPool) {
    install(&pool).await;
    let (guard, _follower) = followed(&pool).await;
    exec(
        &pool,
        "alter table items disable trigger bloom_guard_items_inserted",
    )
    .await;
    // Failing open, and, by the next check, naming the trigger (the
    // trigger-version check may see the ALTER first).
    wait_until(
        "the gap to fail the guard open and be named",
        Duration::from_secs(2),
        || {
            let stats = guard.stats();
            stats.state == GuardState::Degraded
                && stats.last_error.is_some_and(|error| {
                    error.contains("items") && error.contains("bloom_guard_items_inserted")
                })
        },
    )
    .await;
    exec(&pool, "insert into items (key) values ('while-disabled')").await;
    assert!(guard.may_contain("while-disabled"), "failing open");
    assert!(guard.may_contain("anything"), "failing open");

    // The repair: the keys written meanwhile come from a rebuild.
    Watch::table("items")
        .key("key")
        .install(&pool)
        .await
        .expect("watch again");
    wait_until(
        "the rebuild after the repair",
        Duration::from_secs(3),
        || guard.stats().state == GuardState::Ready,
    )
    .await;
    assert!(guard.may_contain("while-disabled"));
    assert!(!guard.may_contain("anything"));
    assert!(guard.stats().generation >= 2);
}

#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn a_child_table_is_a_gap_until_watched(pool: PgPool) {
    install(&pool).await;
    let (guard, _follower) = followed(&pool).await;
    // A child table: the key query reads its rows, its own inserts fire
    // only its own triggers.
    exec(&pool, "create table archived_items () inherits (items)").await;
    // Failing open, and, by the next check, naming the child (the
    // trigger-version check may see the new family member first).
    wait_until(
        "the new child to fail the guard open and be named",
        Duration::from_secs(2),
        || {
            let stats = guard.stats();
            stats.state == GuardState::Degraded
                && stats
                    .last_error
                    .is_some_and(|error| error.contains("archived_items"))
        },
    )
    .await;
    exec(
        &pool,
        "insert into archived_items (id, key) values (1000, 'archived')",
    )
    .await;
    items()
        .install(&pool)
        .await
        .expect("watch the family again");
    wait_until(
        "the rebuild after the repair",
        Duration::from_secs(3),
        || guard.stats().state == GuardState::Ready,
    )
    .await;
    assert!(guard.may_contain("archived"));
    exec(
        &pool,
        "insert into archived_items (id, key) values (1001, 'archived-later')",
    )
    .await;
    arrives(&guard, &["archived-later"]).await;
}

#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn a_reader_behind_the_pruned_horizon_rebuilds(pool: PgPool) {
    install(&pool).await;
    let guard = guard();
    // After a read that finds nothing the reader pauses for the gap: the
    // test writes and prunes inside that pause, so the reader's next read
    // finds its position behind the pruned horizon.
    let follower = follower(&guard, &pool)
        .poll_interval(Duration::from_secs(3600))
        .min_read_gap(Duration::from_secs(3))
        .retention(Duration::ZERO);
    let _task = spawn(follower);
    wait_until("the first read", Duration::from_secs(10), || {
        guard.is_ready() && guard.stats().feed.is_some()
    })
    .await;
    exec(&pool, "insert into items (key) values ('pruned-away')").await;
    // Pruning needs a mark older than the retention and the prune lock
    // (the follower prunes too): prune until the change is gone.
    for _ in 0..100 {
        exec(&pool, "select bloom_guard.prune('0 s')").await;
        let left: i64 = sqlx::query_scalar(
            "select count(*) from bloom_guard.changes where key = 'pruned-away'",
        )
        .fetch_one(&pool)
        .await
        .expect("count");
        if left == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let read = guard.stats().feed.map(|feed| feed.changes);
    assert_eq!(
        read,
        Some(0),
        "the reader read the change before it was pruned"
    );
    exec(&pool, "select pg_notify('bloom_guard', 'items')").await;
    wait_until("the catch-up rebuild", Duration::from_secs(10), || {
        holds_all(&guard, &["pruned-away"])
    })
    .await;
    assert!(guard.stats().generation >= 2, "caught up by a rebuild");
}

#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn a_data_only_restore_into_a_watched_database_is_found(pool: PgPool) {
    install(&pool).await;
    let (guard, _follower) = followed(&pool).await;
    // What `pg_dump --data-only` writes: an empty search_path, then COPY.
    let dump = "SELECT pg_catalog.set_config('search_path', '', false);\n\
                COPY public.items (key, value) FROM stdin;\n\
                restored-1\tone\nrestored-2\ttwo\n\\.\n";
    let mut psql = psql(&pool).await;
    let mut child = psql
        .stdin(Stdio::piped())
        .spawn()
        .expect("psql (the Postgres client) on PATH");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(dump.as_bytes())
        .expect("write dump");
    assert!(child.wait().expect("psql").success(), "the restore failed");
    arrives(&guard, &["restored-1", "restored-2"]).await;
}

#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn deleted_and_renamed_keys_reach_the_key_hook(pool: PgPool) {
    install(&pool).await;
    exec(
        &pool,
        "insert into items (key) values ('doomed'), ('before')",
    )
    .await;
    let guard = guard();
    let seen = Arc::new(Mutex::new(Vec::<String>::new()));
    let truncated = Arc::new(AtomicBool::new(false));
    let (hook, all) = (seen.clone(), truncated.clone());
    let follower = follower(&guard, &pool)
        .on_key(move |key| hook.lock().expect("keys").push(key.to_owned()))
        .on_catch_up(move || all.store(true, Ordering::SeqCst));
    let _task = spawn(follower);
    wait_until("the first warm-up", Duration::from_secs(10), || {
        guard.is_ready()
    })
    .await;
    exec(&pool, "delete from items where key = 'doomed'").await;
    exec(&pool, "update items set key = 'after' where key = 'before'").await;
    wait_until("the hooks", Duration::from_secs(1), || {
        let seen = seen.lock().expect("keys");
        ["doomed", "before", "after"]
            .iter()
            .all(|k| seen.iter().any(|s| s == k))
    })
    .await;
    exec(&pool, "truncate items").await;
    wait_until("the truncate", Duration::from_secs(1), || {
        truncated.load(Ordering::SeqCst)
    })
    .await;
}

#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn composite_and_typed_keys_are_canonical_text(pool: PgPool) {
    bloom_guard_sqlx::postgres::install(&pool)
        .await
        .expect("install");
    exec(
        &pool,
        "create table orders (tenant int not null, number text not null, id uuid primary key default gen_random_uuid());
         insert into orders (tenant, number, id) values (7, 'a:1', 'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11')",
    )
    .await;
    let by_number = Watch::table("orders")
        .key("tenant")
        .key("number")
        .name("orders");
    let by_id = Watch::table("orders").key("id").name("order_ids");
    by_number.install(&pool).await.expect("watch");
    by_id.install(&pool).await.expect("watch");
    let numbers = guard();
    // A uuid column: any spelling of a UUID finds its row.
    let ids = bloom_guard::BloomGuard::builder()
        .key_type(bloom_guard::KeyType::Uuid)
        .build();
    let _a = spawn(bloom_guard_sqlx::postgres::Follower::new(
        numbers.clone(),
        pool.clone(),
        by_number,
    ));
    let _b = spawn(bloom_guard_sqlx::postgres::Follower::new(
        ids.clone(),
        pool.clone(),
        by_id,
    ));
    wait_until("warm-up", Duration::from_secs(10), || {
        numbers.is_ready() && ids.is_ready()
    })
    .await;
    assert!(numbers.may_contain("1:73:a:1"));
    assert!(ids.may_contain("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"));
    assert!(ids.may_contain("{A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11}"));
    exec(
        &pool,
        "insert into orders (tenant, number) values (12, 'b')",
    )
    .await;
    arrives(&numbers, &["2:121:b"]).await;
    assert!(!numbers.may_contain("1:121:b"));
}

#[tokio::test]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn keys_that_are_not_utf8_are_skipped_and_the_guard_is_ready() {
    // A SQL_ASCII database stores any bytes; no request can name them.
    let url = std::env::var("DATABASE_URL").expect("DATABASE_URL");
    let admin = PgPool::connect(&url).await.expect("connect");
    let name = format!("bloom_guard_ascii_{}", fastrand::u32(..));
    exec(&admin, &format!("create database {name} encoding 'SQL_ASCII' lc_collate 'C' lc_ctype 'C' template template0")).await;
    let options = (*admin.connect_options()).clone().database(&name);
    let pool = PgPool::connect_with(options).await.expect("connect");
    exec(&pool, "create table items (id bigint generated always as identity primary key, key text not null unique)").await;
    install(&pool).await;
    exec(
        &pool,
        "insert into items (key) values ('plain'), (E'bad\\377key')",
    )
    .await;
    let (guard, task) = followed(&pool).await;
    assert_eq!(guard.stats().skipped_keys, 1);
    assert!(guard.may_contain("plain"));
    exec(
        &pool,
        "insert into items (key) values (E'worse\\376'), ('fine')",
    )
    .await;
    arrives(&guard, &["fine"]).await;
    wait_until("the second skip", Duration::from_secs(1), || {
        guard.stats().skipped_keys == 2
    })
    .await;
    drop(task);
    pool.close().await;
    exec(&admin, &format!("drop database {name} with (force)")).await;
}

#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn two_instances_raw_writers_killed_listeners_and_rebuilds_lose_nothing(pool: PgPool) {
    install(&pool).await;
    exec(
        &pool,
        "insert into items (key) select 'filler-' || g from generate_series(1, 20000) g",
    )
    .await;
    let (a, _fa) = followed(&pool).await;
    let (b, _fb) = followed(&pool).await;
    let stop = Arc::new(AtomicBool::new(false));
    let committed = Arc::new(Mutex::new(Vec::<String>::new()));
    let mut tasks = Vec::new();
    for writer in 0..3 {
        let (pool, stop, committed, guard) = (
            pool.clone(),
            stop.clone(),
            committed.clone(),
            [a.clone(), b.clone()][writer % 2].clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut i = 0;
            while !stop.load(Ordering::SeqCst) {
                i += 1;
                let key = format!("w{writer}-{i}");
                match i % 3 {
                    // An instance's write path: into its guard, then a slow commit.
                    0 => {
                        guard.insert(&key);
                        let mut tx = pool.begin().await.expect("begin");
                        sqlx::query("insert into items (key) values ($1)")
                            .bind(&key)
                            .execute(&mut *tx)
                            .await
                            .expect("insert");
                        tokio::time::sleep(Duration::from_millis(fastrand::u64(0..5))).await;
                        tx.commit().await.expect("commit");
                    }
                    // Raw SQL: an id-changing rename of a key written earlier.
                    1 => {
                        sqlx::query("insert into items (key) values ($1)")
                            .bind(format!("{key}-old"))
                            .execute(&pool)
                            .await
                            .expect("insert");
                        sqlx::query("update items set id = default, key = $1 where key = $2")
                            .bind(&key)
                            .bind(format!("{key}-old"))
                            .execute(&pool)
                            .await
                            .expect("rename");
                    }
                    // COPY.
                    _ => {
                        let mut conn = pool.acquire().await.expect("connection");
                        let mut copy = conn
                            .copy_in_raw("copy items (key) from stdin")
                            .await
                            .expect("copy");
                        copy.send(format!("{key}\n").into_bytes())
                            .await
                            .expect("send");
                        copy.finish().await.expect("finish");
                    }
                }
                committed.lock().expect("keys").push(key);
            }
        }));
    }
    let watcher = {
        let (a, b, stop) = (a.clone(), b.clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                for guard in [&a, &b] {
                    assert_eq!(
                        guard.stats().state,
                        GuardState::Ready,
                        "failed open after warm-up"
                    );
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
    };
    let source = bloom_guard_sqlx::postgres::CopySource::new(pool.clone(), "select key from items");
    // Six rounds at least, and until the writers have committed enough to
    // matter, however slow the machine.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    let mut round = 0;
    while round < 6 || committed.lock().expect("keys").len() <= 100 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the writers stalled"
        );
        if round % 2 == 0 {
            kill_listeners(&pool).await;
        }
        a.rebuild(&source).await.expect("rebuild");
        tokio::time::sleep(Duration::from_millis(100)).await;
        round += 1;
    }
    stop.store(true, Ordering::SeqCst);
    for task in tasks {
        task.await.expect("writer");
    }
    watcher.await.expect("the guards stayed ready");
    let committed = committed.lock().expect("keys").clone();
    assert!(
        committed.len() > 100,
        "the writers barely ran: {}",
        committed.len()
    );
    let keys: Vec<&str> = committed.iter().map(String::as_str).collect();
    arrives(&a, &keys).await;
    arrives(&b, &keys).await;
}

#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn a_key_longer_than_a_notification_arrives(pool: PgPool) {
    install(&pool).await;
    let (guard, _follower) = followed(&pool).await;
    let long = "k".repeat(10_000);
    sqlx::query("insert into items (key) values ($1)")
        .bind(&long)
        .execute(&pool)
        .await
        .expect("insert");
    arrives(&guard, &[long.as_str()]).await;
}

#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn a_gap_found_at_start_holds_the_first_filter_open(pool: PgPool) {
    install(&pool).await;
    exec(
        &pool,
        "alter table items disable trigger bloom_guard_items_updated",
    )
    .await;
    let guard = guard();
    let _task = spawn(follower(&guard, &pool));
    wait_until("the warm-up", Duration::from_secs(10), || {
        guard.stats().generation == 1
    })
    .await;
    let stats = guard.stats();
    // Never ready while it may lack keys: still warming, and saying why.
    assert_eq!(stats.state, GuardState::Warming, "{stats:?}");
    assert!(
        stats
            .reason
            .as_deref()
            .is_some_and(|why| why.contains("bypass")),
        "{stats:?}"
    );
    assert!(!guard.is_ready());
    assert!(guard.may_contain("anything"), "failing open");
}

#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn a_long_guard_name_and_a_partitioned_table_are_watched_whole(pool: PgPool) {
    bloom_guard_sqlx::postgres::install(&pool)
        .await
        .expect("install");
    // A guard name too long for a trigger or function name with its event,
    // and a partitioned table (its partitions get their own row triggers).
    let long = "g".repeat(45);
    exec(
        &pool,
        &format!(
            "create table parts (k text not null) partition by list (k);
             create table parts_a partition of parts for values in ('a');
             create table parts_b partition of parts for values in ('b');
             select bloom_guard.watch('items', array['key'], '{long}');
             select bloom_guard.watch('parts', array['k'], 'parts');
             insert into items (key) values ('x');
             insert into parts values ('a'), ('b');
             update items set key = 'y' where key = 'x';"
        ),
    )
    .await;
    let mut long_kinds: Vec<String> = sqlx::query_scalar(
        "select kind::text || ':' || key from bloom_guard.changes where guard = $1 and kind <> 'r'",
    )
    .bind(&long)
    .fetch_all(&pool)
    .await
    .expect("feed");
    long_kinds.sort();
    assert_eq!(long_kinds, ["d:x", "i:x", "i:y"]);
    let parts: i64 = sqlx::query_scalar(
        "select count(*) from bloom_guard.changes where guard = 'parts' and kind = 'i'",
    )
    .fetch_one(&pool)
    .await
    .expect("feed");
    assert_eq!(parts, 2);
    for guard in [long.as_str(), "parts"] {
        let gaps: Vec<String> = sqlx::query_scalar("select problem from bloom_guard.gaps($1)")
            .bind(guard)
            .fetch_all(&pool)
            .await
            .expect("gaps");
        assert!(gaps.is_empty(), "{guard}: {gaps:?}");
    }
}

/// Counts the events of Postgres notices that sqlx logs.
struct Notices(Arc<std::sync::atomic::AtomicUsize>);

impl tracing::Subscriber for Notices {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        if event
            .metadata()
            .target()
            .starts_with("sqlx::postgres::notice")
        {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn installing_and_watching_log_no_notice(pool: PgPool) {
    let notices = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let _quiet = tracing::subscriber::set_default(Notices(Arc::clone(&notices)));
    install(&pool).await;
    install(&pool).await;
    items().uninstall(&pool).await.expect("unwatch");
    items().install(&pool).await.expect("watch again");
    assert_eq!(notices.load(Ordering::Relaxed), 0, "a start logged notices");
}

/// Every row is recorded once, whoever writes it: a plain session through
/// the statement triggers, a replica session (where the row trigger fires
/// too) through the row trigger alone. A delete recorded twice would make
/// a counting filter remove another key's fingerprint.
#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn each_row_is_recorded_once_in_plain_and_replica_sessions(pool: PgPool) {
    install(&pool).await;
    let rows = |kind: &'static str, key: &'static str| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(
                "select count(*) from bloom_guard.changes where kind = $1 and key = $2",
            )
            .bind(kind)
            .bind(key)
            .fetch_one(&pool)
            .await
            .expect("count")
        }
    };
    exec(
        &pool,
        "set session_replication_role = replica;
         insert into items (key) values ('a'), ('b');
         update items set key = 'c' where key = 'b';
         reset session_replication_role;
         insert into items (key) values ('d');
         delete from items where key in ('a', 'd');
         set session_replication_role = replica;
         delete from items where key = 'c';
         reset session_replication_role",
    )
    .await;
    for (kind, key) in [
        ("i", "a"),
        ("i", "b"),
        ("d", "b"),
        ("i", "c"),
        ("i", "d"),
        ("d", "a"),
        ("d", "d"),
        ("d", "c"),
    ] {
        assert_eq!(rows(kind, key).await, 1, "{kind} {key}");
    }
}
