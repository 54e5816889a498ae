//! Writers pay nothing: the triggers only append change rows (no NOTIFY,
//! no lock), one elected instance wakes the others, retention truncates
//! whole slots, and the schema upgrades in place under running writers.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bloom_guard_sqlx::postgres;
use common::{arrives, exec, follower, guard, install, install_version, spawn, wait_until};
use sqlx::PgPool;

/// Writes `items` rows with keys `{prefix}-{n}` on `writers` connections
/// until stopped, with `lock_timeout` set (a write that waits longer on a
/// lock fails). Returns the committed keys and the errors.
struct Writers {
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    committed: Arc<Mutex<Vec<String>>>,
    failed: Arc<Mutex<Vec<String>>>,
}

impl Writers {
    fn start(
        pool: &PgPool,
        prefix: &'static str,
        writers: usize,
        lock_timeout: &'static str,
    ) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let committed = Arc::new(Mutex::new(Vec::new()));
        let failed = Arc::new(Mutex::new(Vec::new()));
        let tasks = (0..writers)
            .map(|writer| {
                let (pool, stop) = (pool.clone(), stop.clone());
                let (committed, failed) = (committed.clone(), failed.clone());
                tokio::spawn(async move {
                    let mut conn = pool.acquire().await.expect("connection");
                    sqlx::query("select set_config('lock_timeout', $1, false)")
                        .bind(lock_timeout)
                        .execute(&mut *conn)
                        .await
                        .expect("lock_timeout");
                    let mut i = 0;
                    while !stop.load(Ordering::SeqCst) {
                        i += 1;
                        let key = format!("{prefix}-{writer}-{i}");
                        match sqlx::query("insert into items (key) values ($1)")
                            .bind(&key)
                            .execute(&mut *conn)
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
        Self {
            stop,
            tasks,
            committed,
            failed,
        }
    }

    async fn finish(self) -> (Vec<String>, Vec<String>) {
        self.stop.store(true, Ordering::SeqCst);
        for task in self.tasks {
            task.await.expect("writer");
        }
        let committed = self.committed.lock().expect("keys").clone();
        let failed = self.failed.lock().expect("errors").clone();
        (committed, failed)
    }
}

/// The feed installed and a follower ready whose every check rotates the
/// slots (retention zero).
async fn rotating(pool: &PgPool) -> (bloom_guard::BloomGuard, common::Running) {
    install(pool).await;
    let guard = guard();
    let task = spawn(
        follower(&guard, pool)
            .check_interval(Duration::from_millis(50))
            .retention(Duration::ZERO),
    );
    wait_until("ready", Duration::from_secs(10), || guard.is_ready()).await;
    (guard, task)
}

/// No function the feed's triggers run sends a notification: a NOTIFY in a
/// writer's transaction takes a database-wide lock at commit.
#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn no_function_the_triggers_run_sends_a_notification(pool: PgPool) {
    install(&pool).await;
    let called: Vec<(String, String)> = sqlx::query_as(
        "select p.proname::text, p.prosrc
           from pg_catalog.pg_trigger t
           join pg_catalog.pg_proc p on p.oid = t.tgfoid
          where t.tgrelid = 'items'::regclass
         union
         select p.proname::text, p.prosrc
           from pg_catalog.pg_proc p join pg_catalog.pg_namespace n on n.oid = p.pronamespace
          where n.nspname = 'bloom_guard' and p.proname in ('key_expression', 'current_slot')",
    )
    .fetch_all(&pool)
    .await
    .expect("the trigger functions");
    assert!(called.len() >= 4, "{called:?}");
    for (name, source) in called {
        let source = source.to_lowercase();
        assert!(
            !source.contains("notify") && !source.contains("advisory"),
            "{name} notifies or locks: {source}"
        );
    }
}

/// Every kind of write arrives without a NOTIFY from the writer: the
/// elected notifier wakes the readers.
#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn writes_arrive_by_the_elected_notifier(pool: PgPool) {
    install(&pool).await;
    exec(
        &pool,
        "insert into items (key) values ('old'), ('upsert-me')",
    )
    .await;
    let guard = guard();
    // Without the notifier, an hour between reads.
    let _task = spawn(follower(&guard, &pool).poll_interval(Duration::from_secs(3600)));
    wait_until("ready", Duration::from_secs(10), || guard.is_ready()).await;
    exec(&pool, "insert into items (key) values ('inserted')").await;
    arrives(&guard, &["inserted"]).await;
    exec(
        &pool,
        "update items set id = default, key = 'renamed' where key = 'old'",
    )
    .await;
    arrives(&guard, &["renamed"]).await;
    exec(
        &pool,
        "insert into items (key) values ('upsert-me') on conflict (key) do update set key = 'upserted'",
    )
    .await;
    arrives(&guard, &["upserted"]).await;
    elected(&pool, &[]).await;
}

/// The elected notifier's connection killed mid-work: another candidate is
/// elected, and no change is lost meanwhile (the readers' interval reads).
#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn a_killed_notifier_is_replaced_and_nothing_is_lost(pool: PgPool) {
    install(&pool).await;
    let (a, b) = (guard(), guard());
    let _a = spawn(follower(&a, &pool));
    let _b = spawn(follower(&b, &pool));
    wait_until("ready", Duration::from_secs(10), || {
        a.is_ready() && b.is_ready()
    })
    .await;
    let writers = Writers::start(&pool, "w", 4, "200ms");
    let mut killed = Vec::new();
    for _ in 0..3 {
        let pid = elected(&pool, &killed).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        let terminated: bool = sqlx::query_scalar("select pg_terminate_backend($1)")
            .bind(pid)
            .fetch_one(&pool)
            .await
            .expect("kill");
        assert!(terminated, "the notifier was gone before it was killed");
        killed.push(pid);
    }
    let (committed, failed) = writers.finish().await;
    assert!(failed.is_empty(), "{failed:?}");
    let keys: Vec<&str> = committed.iter().map(String::as_str).collect();
    wait_until("every key", Duration::from_secs(5), || {
        keys.iter()
            .all(|key| a.may_contain(key) && b.may_contain(key))
    })
    .await;
    elected(&pool, &killed).await;
}

/// A change committed while no instance was the notifier (the last one
/// died after its last look) is announced by the next one elected: it
/// wakes every reader once, whatever it finds.
#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn a_newly_elected_notifier_wakes_the_readers_once(pool: PgPool) {
    install(&pool).await;
    // The election's lock, held here: no instance is elected meanwhile.
    let mut holder = pool.acquire().await.expect("a connection").detach();
    let held: bool =
        sqlx::query_scalar("select pg_try_advisory_lock(hashtext('bloom_guard.notifier'))")
            .fetch_one(&mut holder)
            .await
            .expect("the election's lock");
    assert!(held);
    let guard = guard();
    // Without wake-ups, an hour between reads.
    let _task = spawn(follower(&guard, &pool).poll_interval(Duration::from_secs(3600)));
    wait_until("ready", Duration::from_secs(10), || guard.is_ready()).await;
    // A listener that connects reads once; so may a start's last steps.
    // A key committed after those, which no read brought.
    let mut unannounced = None;
    for attempt in 0..5 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let key = format!("unannounced-{attempt}");
        exec(&pool, &format!("insert into items (key) values ('{key}')")).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        if !guard.may_contain(&key) {
            unannounced = Some(key);
            break;
        }
    }
    let key = unannounced.expect("every key was read without a wake-up");
    sqlx::Connection::close(holder)
        .await
        .expect("the lock let go");
    // Candidates stand every 5 s.
    wait_until("the key", Duration::from_secs(10), || {
        guard.may_contain(&key)
    })
    .await;
    elected(&pool, &[]).await;
}

/// Waits until one instance is the elected notifier, not one of `killed`:
/// its backend's pid.
async fn elected(pool: &PgPool, killed: &[i32]) -> i32 {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let notifiers: Vec<i32> = sqlx::query_scalar(
            "select pid from pg_stat_activity where application_name = $1
                and datname = current_database() and not (pid = any($2))",
        )
        .bind(postgres::NOTIFIER_APPLICATION_NAME)
        .bind(killed)
        .fetch_all(pool)
        .await
        .expect("notifiers");
        match notifiers.as_slice() {
            [pid] => return *pid,
            [] => {}
            more => panic!("{} notifiers at once", more.len()),
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no notifier elected"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A trigger disabled for a bulk load and enabled again, all between two
/// checks: no gap is ever seen, but the trigger's row version changed, so
/// the follower rebuilds and the loaded keys are found.
#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn a_trigger_disabled_and_enabled_between_checks_leads_to_a_rebuild(pool: PgPool) {
    install(&pool).await;
    let guard = guard();
    let _task = spawn(follower(&guard, &pool));
    wait_until("ready", Duration::from_secs(10), || guard.is_ready()).await;
    exec(
        &pool,
        "begin;
         alter table items disable trigger bloom_guard_items_inserted;
         insert into items (key) select 'bulk-' || g from generate_series(1, 100) g;
         alter table items enable always trigger bloom_guard_items_inserted;
         commit",
    )
    .await;
    wait_until("the rebuild", Duration::from_secs(10), || {
        guard.stats().generation >= 2 && common::holds_all(&guard, &["bulk-1", "bulk-100"])
    })
    .await;
}

/// A bulk load with the triggers off, in one transaction, as an adopter ran
/// it: the event trigger records a resync with the ALTER, so the follower
/// lets the loaded keys through as soon as the transaction commits (the
/// read barrier reads it for the first request), long before the trigger
/// check (here an hour away) would have noticed.
#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn a_bulk_load_with_the_triggers_off_is_served_at_once(pool: PgPool) {
    bulk_load_served_at_once(
        &pool,
        "alter table items disable trigger user",
        "alter table items enable trigger user",
    )
    .await;
}

/// As above with the triggers set to fire for the replica role only (a
/// plain session then fires none of them): any state that leaves a gap
/// records a resync, not only a disabled trigger.
#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn a_bulk_load_with_the_triggers_set_to_replica_is_served_at_once(pool: PgPool) {
    bulk_load_served_at_once(
        &pool,
        "alter table items enable replica trigger bloom_guard_items_inserted",
        "alter table items enable always trigger bloom_guard_items_inserted",
    )
    .await;
}

/// Loads 100 keys between `off` and `on` in one transaction; each is
/// served at once after the commit, long before the trigger check runs.
async fn bulk_load_served_at_once(pool: &PgPool, off: &str, on: &str) {
    install(pool).await;
    let guard = guard();
    let _task = spawn(follower(&guard, pool).check_interval(Duration::from_secs(3600)));
    wait_until("ready", Duration::from_secs(10), || guard.is_ready()).await;
    exec(
        pool,
        &format!(
            "begin;
             {off};
             insert into items (key) select 'bulk-' || g from generate_series(1, 100) g;
             {on};
             commit"
        ),
    )
    .await;
    let app = axum::Router::new()
        .route("/items/{key}", axum::routing::get(|| async { "an item" }))
        .route_layer(guard.layer(bloom_guard::extract::PathParam("key")));
    for i in 1..=100 {
        let request = http::Request::get(format!("/items/bulk-{i}"))
            .body(axum::body::Body::empty())
            .expect("a request");
        let status = tower::ServiceExt::oneshot(app.clone(), request)
            .await
            .expect("infallible")
            .status();
        assert_eq!(
            status,
            http::StatusCode::OK,
            "bulk-{i} refused after its commit"
        );
    }
    // `enable trigger user` left the feed's triggers enabled for the origin
    // role only, not ALWAYS: the trigger check names that gap later and the
    // guard stays open until a watch repairs it and a rebuild follows.
}

/// Retention by truncation: with writers running through many rotations
/// (retention zero, so every check rotates), no writer waits on a lock of
/// ours, and every key committed reaches the reader (read, or rebuilt when
/// the reader fell behind the horizon).
#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn rotations_under_writers_block_no_writer_and_lose_nothing(pool: PgPool) {
    let (guard, _task) = rotating(&pool).await;
    let writers = Writers::start(&pool, "r", 4, "200ms");
    for _ in 0..40 {
        exec(&pool, "select bloom_guard.prune('0 s')").await;
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let (committed, failed) = writers.finish().await;
    assert!(failed.is_empty(), "writers waited on our locks: {failed:?}");
    assert!(committed.len() > 100, "the writers barely ran");
    let horizon: String = sqlx::query_scalar("select below::text from bloom_guard.horizon")
        .fetch_one(&pool)
        .await
        .expect("horizon");
    assert_ne!(horizon, "0", "no slot was emptied");
    let keys: Vec<&str> = committed.iter().map(String::as_str).collect();
    wait_until("every key", Duration::from_secs(20), || {
        common::holds_all(&guard, &keys)
    })
    .await;
    // Statistics reach the view within a second of a session going idle.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let dead: i64 = sqlx::query_scalar(
        "select coalesce(sum(n_dead_tup + n_tup_del), 0)::int8 from pg_stat_user_tables
          where schemaname = 'bloom_guard' and relname like 'changes%'",
    )
    .fetch_one(&pool)
    .await
    .expect("dead tuples");
    assert_eq!(dead, 0, "the feed left dead tuples");
}

/// Version 2 (a plain change table, NOTIFY in the triggers) upgraded to 3
/// by `install` while writers and a follower run: no change is lost, and
/// installing again is a no-op.
#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn the_upgrade_from_version_2_loses_no_change_under_writers(pool: PgPool) {
    upgrade_under_writers(&pool, include_str!("fixtures/postgres_v2.sql")).await;
}

#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn the_upgrade_from_version_3_adds_the_replica_trigger_under_writers(pool: PgPool) {
    upgrade_under_writers(&pool, include_str!("fixtures/postgres_v3.sql")).await;
    let replica: String = sqlx::query_scalar(
        "select tgenabled::text from pg_trigger where tgrelid = 'items'::regclass and tgname = 'bloom_guard_items_replica'",
    )
    .fetch_one(&pool)
    .await
    .expect("the replica row trigger");
    assert_eq!(replica, "R");
    let gaps: i64 = sqlx::query_scalar("select count(*) from bloom_guard.gaps('items')")
        .fetch_one(&pool)
        .await
        .expect("gaps");
    assert_eq!(gaps, 0);
}

#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn the_upgrade_from_version_4_adds_the_fleet_tables_under_writers(pool: PgPool) {
    upgrade_under_writers(&pool, include_str!("fixtures/postgres_v4.sql")).await;
    let tables: i64 = sqlx::query_scalar(
        "select count(*) from pg_tables where schemaname = 'bloom_guard' and tablename in ('settings', 'instances')",
    )
    .fetch_one(&pool)
    .await
    .expect("the fleet tables");
    assert_eq!(tables, 2);
}

/// Version 5, the first released one (fleet settings and heartbeats),
/// upgraded under writers: no change lost, its settings kept.
#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn the_upgrade_from_version_5_the_first_released_loses_no_change_under_writers(pool: PgPool) {
    install_version(&pool, include_str!("fixtures/postgres_v5.sql")).await;
    exec(
        &pool,
        "insert into bloom_guard.settings (guard, mode, audit_rate, updated_at)
         values ('other', 'shadow', 0.01, pg_catalog.now())",
    )
    .await;
    upgrade_under_writers(&pool, "").await;
    let mode: String =
        sqlx::query_scalar("select mode from bloom_guard.settings where guard = 'other'")
            .fetch_one(&pool)
            .await
            .expect("the stored mode");
    assert_eq!(mode, "shadow");
}

/// Version 6 (the event trigger's resync) upgraded under writers.
#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn the_upgrade_from_version_6_loses_no_change_under_writers(pool: PgPool) {
    upgrade_under_writers(&pool, include_str!("fixtures/postgres_v6.sql")).await;
}

/// Version 8 reads each guard's rows by an index that leads with the
/// guard: the upgrade builds it concurrently (writers never wait for the
/// build) over a feed that holds a bulk load's rows.
#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn the_upgrade_from_version_7_indexes_the_feed_by_guard_under_writers(pool: PgPool) {
    install_version(&pool, include_str!("fixtures/postgres_v7.sql")).await;
    exec(
        &pool,
        "insert into items (key) select 'bulk-' || g from generate_series(1, 20000) g",
    )
    .await;
    assert!(!feed_indexed_by_guard(&pool).await);
    upgrade_under_writers(&pool, "").await;
    assert!(feed_indexed_by_guard(&pool).await);
    // Another guard's reads from a position before the bulk load no
    // longer walk its rows.
    exec(&pool, "analyze bloom_guard.changes").await;
    let plan: Vec<String> = sqlx::query_scalar(
        "explain select from bloom_guard.changes c where c.guard = 'users' and c.xid >= '1'",
    )
    .fetch_all(&pool)
    .await
    .expect("the plan");
    assert!(
        plan.iter().any(|line| line.contains("_guard_xid")),
        "{plan:#?}"
    );
}

/// Version 9 adds `bloom_guard.grant_runtime`: upgraded from 8 under
/// writers, no change lost.
#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn the_upgrade_from_version_8_adds_the_runtime_grant_under_writers(pool: PgPool) {
    upgrade_under_writers(&pool, include_str!("fixtures/postgres_v8.sql")).await;
    let granting: Option<String> =
        sqlx::query_scalar("select to_regprocedure('bloom_guard.grant_runtime(regrole)')::text")
            .fetch_one(&pool)
            .await
            .expect("the function");
    assert!(granting.is_some());
}

/// An index build that stopped half way (an instance killed during
/// CREATE INDEX CONCURRENTLY leaves an invalid index) is finished by the
/// next install.
#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn an_index_build_that_stopped_half_way_is_finished_by_the_next_install(pool: PgPool) {
    install(&pool).await;
    assert!(feed_indexed_by_guard(&pool).await);
    exec(&pool, "drop index bloom_guard.changes_guard_xid").await;
    exec(
        &pool,
        "create index changes_0_guard_xid on bloom_guard.changes_0 (guard, xid)",
    )
    .await;
    exec(
        &pool,
        "create index changes_1_guard_xid on bloom_guard.changes_1 (guard, xid)",
    )
    .await;
    exec(
        &pool,
        "update pg_catalog.pg_index set indisvalid = false
          where indexrelid = 'bloom_guard.changes_1_guard_xid'::regclass",
    )
    .await;
    assert!(!feed_indexed_by_guard(&pool).await);
    bloom_guard_sqlx::postgres::install(&pool)
        .await
        .expect("install");
    assert!(feed_indexed_by_guard(&pool).await);
}

/// Whether the feed's index by guard is valid, with every partition's
/// index valid and attached.
async fn feed_indexed_by_guard(pool: &PgPool) -> bool {
    sqlx::query_scalar(
        "select coalesce((select i.indisvalid from pg_index i
                           where i.indexrelid = to_regclass('bloom_guard.changes_guard_xid')), false)
            and (select count(*) from pg_inherits h join pg_index i on i.indexrelid = h.inhrelid
                  where h.inhparent = to_regclass('bloom_guard.changes_guard_xid') and i.indisvalid) = 3",
    )
    .fetch_one(pool)
    .await
    .expect("the feed's indexes")
}

/// Installs an earlier version's SQL (none: installed already) and
/// watches `items`, starts a
/// follower and writers, upgrades under them: no writer fails and every
/// committed key reaches the guard.
async fn upgrade_under_writers(pool: &PgPool, earlier: &str) {
    let pool = pool.clone();
    if !earlier.is_empty() {
        install_version(&pool, earlier).await;
    }
    exec(&pool, "insert into items (key) values ('before')").await;
    let guard = guard();
    let _task = spawn(follower(&guard, &pool));
    wait_until("ready", Duration::from_secs(10), || guard.is_ready()).await;
    // The upgrade's DDL makes writers wait (not fail) for its transaction.
    let writers = Writers::start(&pool, "u", 4, "0");
    tokio::time::sleep(Duration::from_millis(300)).await;
    bloom_guard_sqlx::postgres::install(&pool)
        .await
        .expect("the upgrade");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (committed, failed) = writers.finish().await;
    assert!(failed.is_empty(), "{failed:?}");
    let version: i32 = sqlx::query_scalar("select version from bloom_guard.schema_version")
        .fetch_one(&pool)
        .await
        .expect("version");
    assert_eq!(version, bloom_guard_sqlx::postgres::SCHEMA_VERSION);
    let mut keys: Vec<&str> = committed.iter().map(String::as_str).collect();
    keys.push("before");
    wait_until("every key", Duration::from_secs(10), || {
        common::holds_all(&guard, &keys)
    })
    .await;
    bloom_guard_sqlx::postgres::install(&pool)
        .await
        .expect("a no-op");
    let partitions: i64 = sqlx::query_scalar(
        "select count(*) from pg_inherits where inhparent = 'bloom_guard.changes'::regclass",
    )
    .fetch_one(&pool)
    .await
    .expect("partitions");
    assert_eq!(partitions, 3);
}

/// `Watch::uninstall` and `uninstall` leave the table as it was: writes
/// succeed, and the feed is gone.
#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn unwatching_and_uninstalling_leave_writes_working(pool: PgPool) {
    install(&pool).await;
    common::items().uninstall(&pool).await.expect("unwatch");
    let triggers: i64 = sqlx::query_scalar(
        "select count(*) from pg_trigger where tgrelid = 'items'::regclass and not tgisinternal",
    )
    .fetch_one(&pool)
    .await
    .expect("triggers");
    assert_eq!(triggers, 0);
    exec(&pool, "insert into items (key) values ('unwatched')").await;
    common::items().install(&pool).await.expect("watch again");
    bloom_guard_sqlx::postgres::uninstall(&pool)
        .await
        .expect("uninstall");
    exec(&pool, "insert into items (key) values ('uninstalled')").await;
    let schema: Option<String> =
        sqlx::query_scalar("select nspname::text from pg_namespace where nspname = 'bloom_guard'")
            .fetch_optional(&pool)
            .await
            .expect("schema");
    assert_eq!(schema, None);
}

/// A transaction that writes a key and commits seconds later, across reads
/// and rotations: its slot cannot be emptied while it runs (it holds the
/// slot's lock), and its key arrives once it commits.
#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn a_late_commit_across_rotations_arrives(pool: PgPool) {
    let (guard, _task) = rotating(&pool).await;
    let mut late = pool.begin().await.expect("begin");
    sqlx::query("insert into items (key) values ('late')")
        .execute(&mut *late)
        .await
        .expect("insert");
    for _ in 0..20 {
        exec(&pool, "select bloom_guard.prune('0 s')").await;
        exec(
            &pool,
            "insert into items (key) select 'meanwhile-' || pg_catalog.gen_random_uuid()",
        )
        .await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        !guard.may_contain("late") || guard.stats().state != bloom_guard::stats::GuardState::Ready
    );
    late.commit().await.expect("commit");
    wait_until("the late key", Duration::from_secs(10), || {
        common::holds_all(&guard, &["late"])
    })
    .await;
}

/// Two tables watched under one guard with different key columns each get
/// the functions of their own key, and a database whose default isolation
/// is REPEATABLE READ changes nothing: the follower reads and prunes at
/// READ COMMITTED.
#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn one_guard_over_two_tables_with_different_keys(pool: PgPool) {
    install(&pool).await;
    exec(
        &pool,
        "create table codes (code text primary key, label text);
         select bloom_guard.watch('codes', array['code'], 'items');
         do $$ begin
             execute format('alter database %I set default_transaction_isolation = %L',
                            current_database(), 'repeatable read');
         end $$",
    )
    .await;
    let guard = guard();
    let _task = spawn(follower(&guard, &pool));
    wait_until("ready", Duration::from_secs(10), || guard.is_ready()).await;
    exec(&pool, "insert into items (key) values ('an-item')").await;
    exec(
        &pool,
        "insert into codes (code, label) values ('a-code', 'not-a-key')",
    )
    .await;
    arrives(&guard, &["an-item", "a-code"]).await;
    assert!(!guard.may_contain("not-a-key"));
}
