//! The log feed end to end (feature `log-feed`; `DATABASE_URL`'s server
//! with `wal_level=logical`): followers of a table fed by the write-ahead
//! log serve a key committed a moment before through another instance,
//! forget deleted keys exactly once through raw SQL of every kind, and a
//! follower started again (adopting a snapshot or scanning at a point of
//! the log) holds what the table holds, as do a running follower and a new
//! one after `pg_restore --clean` of another log-fed database. A key
//! written to an inheritance child made under the table passes at once.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::log::*;
use common::*;
use http::StatusCode;
use sqlx::PgPool;

#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn a_key_committed_through_one_instance_is_served_by_another_at_once(pool: PgPool) {
    let (url, _slot) = log_fed(&pool).await;
    let (one, _one) = log_followed(&pool, &url).await;
    let (two, _two) = log_followed(&pool, &url).await;
    let mut refused = Vec::new();
    for i in 0..300 {
        let key = format!("created-{i}-{}", fastrand::u32(..));
        one.insert(&key);
        sqlx::query("insert into items (key) values ($1)")
            .bind(&key)
            .execute(&pool)
            .await
            .expect("insert");
        if status(&two, &key).await == StatusCode::NOT_FOUND {
            refused.push(key);
        }
    }
    assert!(refused.is_empty(), "refused: {refused:?}");
    assert!(two.stats().barrier_found > 0, "{:?}", two.stats());
    assert_eq!(status(&two, "never-written").await, StatusCode::NOT_FOUND);
}

#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn raw_sql_of_every_kind_is_forgotten_or_held_exactly_across_restarts(pool: PgPool) {
    let (url, _slot) = log_fed(&pool).await;
    exec(
        &pool,
        "insert into items (key) select 'k' || g from generate_series(0, 199) g",
    )
    .await;
    let mut seen: BTreeSet<String> = (0..200).map(|i| format!("k{i}")).collect();
    let mut rng = seeded("BLOOM_GUARD_SOAK_SEED");
    let (a, _a) = log_followed(&pool, &url).await;
    let (mut b, mut b_task) = log_followed(&pool, &url).await;
    for round in 0..6 {
        for _ in 0..40 {
            random_write(&pool, &mut rng, &mut seen).await;
        }
        tokio::time::sleep(Duration::from_millis(60)).await;
        holds_what_the_table_holds("a", &a, &pool, &seen).await;
        holds_what_the_table_holds("b", &b, &pool, &seen).await;
        if round % 2 == 0 {
            // B starts again while writes go on: it adopts A's snapshot or
            // scans at a point of the log, and catches up from there.
            drop(b_task);
            let writes = tokio::spawn({
                let (pool, mut seen) = (pool.clone(), seen.clone());
                let mut rng = fastrand::Rng::with_seed(rng.u64(..));
                async move {
                    for _ in 0..20 {
                        random_write(&pool, &mut rng, &mut seen).await;
                    }
                    seen
                }
            });
            (b, b_task) = log_followed(&pool, &url).await;
            seen = writes.await.expect("the writes");
        }
    }
    assert!(a.stats().deletes_applied > 0, "{:?}", a.stats());
}

#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn a_partitioned_table_is_followed_through_its_root(pool: PgPool) {
    let (url, _slot) = log_fed(&pool).await;
    exec(
        &pool,
        "create table parts (key text primary key, note text) partition by range (key);
         create table parts_a partition of parts for values from ('a') to ('b');
         create table parts_b partition of parts for values from ('b') to ('c');
         insert into parts (key) values ('a1'), ('a2'), ('b1')",
    )
    .await;
    let parts = bloom_guard_sqlx::Watch::table("parts").key("key");
    parts
        .install_log(&pool)
        .await
        .expect("put parts on the log feed");
    // No check within the test: the attach must reach the guard through
    // the log, not through the check's fingerprint.
    let (guard, _task) = log_followed_as(|guard| {
        bloom_guard_sqlx::postgres::log::Follower::new(guard, pool.clone(), parts, &url)
            .check_interval(Duration::from_secs(3600))
    })
    .await;
    // A key moved across partitions, a partition attached with rows, a
    // delete through a partition, and rows written to a partition itself.
    exec(
        &pool,
        "update parts set key = 'b2' where key = 'a1';
         create table parts_c (key text primary key, note text);
         insert into parts_c (key) values ('c1'), ('c2');
         alter table parts attach partition parts_c for values from ('c') to ('d');
         insert into parts (key) values ('c3');
         delete from parts_a where key = 'a2';
         insert into parts_b (key) values ('b3');",
    )
    .await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let mut wrong = Vec::new();
        for (key, stored) in [
            ("a1", false),
            ("a2", false),
            ("b1", true),
            ("b2", true),
            ("b3", true),
            ("c1", true),
            ("c2", true),
            ("c3", true),
        ] {
            let refused = status(&guard, key).await == StatusCode::NOT_FOUND;
            if stored == refused {
                wrong.push((key, stored));
            }
            assert!(
                !(stored && refused),
                "a false negative for {key}: {:?}",
                guard.stats()
            );
        }
        if wrong.is_empty() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "deleted keys still held: {wrong:?}; {:?}",
            guard.stats()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A new partition brings no rows: no resync, and the guard refuses on.
    let resyncs = || async {
        sqlx::query_scalar::<_, i64>(
            "select count(*) from bloom_guard.log_changes where guard = 'parts' and kind::text = 'r'",
        )
        .fetch_one(&pool)
        .await
        .expect("resyncs")
    };
    let before = resyncs().await;
    exec(
        &pool,
        "create table parts_d partition of parts for values from ('d') to ('e');
         insert into parts (key) values ('d1')",
    )
    .await;
    assert_ne!(status(&guard, "d1").await, StatusCode::NOT_FOUND);
    assert_eq!(status(&guard, "never-written").await, StatusCode::NOT_FOUND);
    assert_eq!(resyncs().await, before, "a new partition recorded a resync");
}

#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn a_table_switched_between_the_feeds_is_rebuilt_and_never_fed_twice(pool: PgPool) {
    let (url, _slot) = log_fed(&pool).await;
    let mut rng = fastrand::Rng::with_seed(11);
    let mut seen = BTreeSet::new();
    // Its follower runs on: the slot stays streamed all along.
    let (on_log, _log_task) = log_followed(&pool, &url).await;
    for _ in 0..30 {
        random_write(&pool, &mut rng, &mut seen).await;
    }
    holds_what_the_table_holds("on the log feed", &on_log, &pool, &seen).await;

    // Off the log feed: its follower lets everything through, and the
    // table leaves the publication.
    items()
        .uninstall_log(&pool)
        .await
        .expect("off the log feed");
    items().uninstall_log(&pool).await.expect("idempotent");
    wait_until("the log follower open", Duration::from_secs(10), || {
        on_log.stats().state != bloom_guard::stats::GuardState::Ready
    })
    .await;
    let off: String = sqlx::query_scalar("select pg_current_wal_lsn()::text")
        .fetch_one(&pool)
        .await
        .expect("position");
    let published: i64 = sqlx::query_scalar(
        "select count(*) from pg_publication_tables where pubname = 'bloom_guard'",
    )
    .fetch_one(&pool)
    .await
    .expect("published");
    assert_eq!(published, 0);

    // On the triggers: a rebuild, and each change once (a producer still
    // streaming the slot writes none of this table's).
    items().install(&pool).await.expect("on the triggers");
    let (on_triggers, triggers_task) = followed(&pool).await;
    for _ in 0..60 {
        random_write(&pool, &mut rng, &mut seen).await;
    }
    holds_what_the_table_holds("on the triggers", &on_triggers, &pool, &seen).await;
    let now: String = sqlx::query_scalar("select pg_current_wal_lsn()::text")
        .fetch_one(&pool)
        .await
        .expect("position");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !sqlx::query_scalar::<_, bool>(
        "select coalesce(bool_and(confirmed_flush_lsn >= $1::pg_lsn), false)
           from pg_replication_slots where database = current_database() and not temporary",
    )
    .bind(&now)
    .fetch_one(&pool)
    .await
    .expect("slot")
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the slot never passed the writes"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let logged_since: i64 =
        sqlx::query_scalar("select count(*) from bloom_guard.log_changes where lsn > $1::pg_lsn")
            .bind(&off)
            .fetch_one(&pool)
            .await
            .expect("log rows");
    assert_eq!(logged_since, 0, "the log feed wrote rows of a table off it");

    // And back to the log feed: a rebuild again.
    drop(triggers_task);
    items().uninstall(&pool).await.expect("off the triggers");
    items()
        .install_log(&pool)
        .await
        .expect("back on the log feed");
    let (back, _back) = log_followed(&pool, &url).await;
    for _ in 0..60 {
        random_write(&pool, &mut rng, &mut seen).await;
    }
    holds_what_the_table_holds("back on the log feed", &back, &pool, &seen).await;
}

#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn the_trigger_feeds_follower_and_rebuild_refuse_a_table_on_the_log_feed(pool: PgPool) {
    let (url, _slot) = log_fed(&pool).await;
    exec(&pool, "insert into items (key) values ('stored')").await;
    // A scan placed by the triggers' positions would not meet the log's
    // rows: the follower names the follower to use and never refuses.
    let wrong = guard();
    let _wrong = spawn(bloom_guard_sqlx::postgres::Follower::new(
        wrong.clone(),
        pool.clone(),
        items(),
    ));
    wait_until("the refusal named", Duration::from_secs(20), || {
        wrong
            .stats()
            .last_error
            .is_some_and(|error| error.contains("postgres::log::Follower"))
    })
    .await;
    assert_ne!(wrong.stats().state, bloom_guard::stats::GuardState::Ready);
    assert_ne!(status(&wrong, "never-written").await, StatusCode::NOT_FOUND);
    let rebuilt = bloom_guard_sqlx::FleetRebuild::new(guard(), pool.clone(), items())
        .rebuild()
        .await;
    assert!(rebuilt.is_err(), "{rebuilt:?}");
    // The log feed's own rebuild does it.
    let (right, _right) = log_followed(&pool, &url).await;
    bloom_guard_sqlx::FleetRebuild::log(right.clone(), pool.clone(), items(), url)
        .rebuild()
        .await
        .expect("the log feed's rebuild");
    assert_ne!(status(&right, "stored").await, StatusCode::NOT_FOUND);
    assert_eq!(status(&right, "never-written").await, StatusCode::NOT_FOUND);
}

#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn a_pg_restore_clean_of_another_log_fed_database_is_followed_here(pool: PgPool) {
    let (url, _slot) = log_fed(&pool).await;
    exec(
        &pool,
        "insert into items (key) select 'here-' || g from generate_series(1, 10) g",
    )
    .await;
    let (running, _running) = log_followed(&pool, &url).await;
    // Another database with `items` on the log feed, and its own keys;
    // its slot dropped once dumped (a slot keeps its database).
    let (source, other) = restore_source(&pool).await;
    log_fed(&other).await;
    other.close().await;
    restore_clean(&pool, &source).await;
    exec(
        &pool,
        &format!(
            "select pg_drop_replication_slot(slot_name) from pg_replication_slots
              where database = '{source}'"
        ),
    )
    .await;
    exec(&pool, &format!("drop database {source}")).await;
    let mut seen: BTreeSet<String> = (1..=10)
        .map(|i| format!("here-{i}"))
        .chain((1..=2000).map(|i| format!("restored-{i}")))
        .collect();
    for i in 0..20 {
        let key = format!("after-{i}");
        exec(&pool, &format!("insert into items (key) values ('{key}')")).await;
        seen.insert(key);
    }
    exec(&pool, "delete from items where key = 'restored-7'").await;
    holds_what_the_table_holds_once_closed("the running instance", &running, &pool, &seen).await;
    let (later, _later) = log_followed(&pool, &url).await;
    holds_what_the_table_holds_once_closed("an instance started since", &later, &pool, &seen).await;
}

/// A key written to an inheritance child made under `items` by `ddl`,
/// asked at once of a guard whose check would not run for ten minutes:
/// only the DDL's own record in the log can open the guard in time.
async fn a_childs_key_passes_at_once(pool: &PgPool, ddl: &str) {
    let (url, _slot) = log_fed(pool).await;
    exec(pool, "insert into items (key) values ('parent-1')").await;
    let (guard, _task) = log_followed_as(|guard| {
        bloom_guard_sqlx::postgres::log::Follower::new(guard, pool.clone(), items(), &*url)
            .check_interval(Duration::from_secs(600))
    })
    .await;
    assert_eq!(status(&guard, "never-written").await, StatusCode::NOT_FOUND);
    exec(pool, ddl).await;
    exec(
        pool,
        "insert into items_child (id, key) values (1000000, 'child-1')",
    )
    .await;
    let through_the_parent: i64 =
        sqlx::query_scalar("select count(*) from items where key = 'child-1'")
            .fetch_one(pool)
            .await
            .expect("the parent's rows");
    assert_eq!(through_the_parent, 1);
    assert_ne!(
        status(&guard, "child-1").await,
        StatusCode::NOT_FOUND,
        "a key of the child refused; {:?}",
        guard.stats()
    );
    assert_ne!(status(&guard, "parent-1").await, StatusCode::NOT_FOUND);
}

#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn a_child_made_with_inherits_opens_the_guard_at_its_commit(pool: PgPool) {
    a_childs_key_passes_at_once(&pool, "create table items_child () inherits (items)").await;
}

#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn a_table_altered_to_inherit_opens_the_guard_at_its_commit(pool: PgPool) {
    a_childs_key_passes_at_once(
        &pool,
        "create table items_child (like items including defaults); alter table items_child inherit items",
    )
    .await;
}

/// A partition whose rows the log never carries, made under a table on
/// the log feed while its guard runs (its check ten minutes away): every
/// key written there is served, never refused, from the DDL on.
async fn an_unseen_partitions_keys_pass(pool: &PgPool, ddl: &str, prefix: &str) {
    let (url, _slot) = log_fed(pool).await;
    exec(pool, PARTS).await;
    a_made_partitions_keys_pass(pool, &url, ddl, prefix).await;
}

/// `parts`, partitioned by key, with two partitions and a key in each.
const PARTS: &str = "create table parts (key text primary key, note text) partition by range (key);
     create table parts_a partition of parts for values from ('a') to ('b');
     create table parts_b partition of parts for values from ('b') to ('c');
     insert into parts (key) values ('a1'), ('b1')";

/// `parts` without a unique index (a foreign partition cannot have one),
/// its whole row the replica identity.
const PARTS_UNINDEXED: &str =
    "create table parts (key text not null, note text) partition by range (key);
     alter table parts replica identity full;
     create table parts_a partition of parts for values from ('a') to ('b');
     create table parts_b partition of parts for values from ('b') to ('c');
     alter table parts_a replica identity full;
     alter table parts_b replica identity full;
     insert into parts (key) values ('a1'), ('b1')";

/// `parts` made already: put on the log feed and followed, then `ddl`
/// makes a partition whose rows the log never carries.
async fn a_made_partitions_keys_pass(pool: &PgPool, url: &str, ddl: &str, prefix: &str) {
    let parts = bloom_guard_sqlx::Watch::table("parts").key("key");
    parts
        .install_log(pool)
        .await
        .expect("put parts on the log feed");
    let (guard, _task) = log_followed_as(|guard| {
        bloom_guard_sqlx::postgres::log::Follower::new(guard, pool.clone(), parts, url)
            .check_interval(Duration::from_secs(600))
    })
    .await;
    assert_eq!(status(&guard, "b-never").await, StatusCode::NOT_FOUND);
    exec(pool, ddl).await;
    // An ALTER TABLE of the family records a resync, which rebuilds the
    // guard and checks it; a new partition records nothing. Either way,
    // from the DDL on no key written there may be refused.
    let mut refused = Vec::new();
    for i in 0..50 {
        let key = format!("{prefix}-unseen-{i}");
        sqlx::query("insert into parts (key) values ($1)")
            .bind(&key)
            .execute(pool)
            .await
            .expect("insert into the partition");
        if status(&guard, &key).await == StatusCode::NOT_FOUND {
            refused.push(key);
        }
    }
    assert!(
        refused.is_empty(),
        "refused: {refused:?}; {:?}",
        guard.stats()
    );
    assert_ne!(status(&guard, "a1").await, StatusCode::NOT_FOUND);
}

#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn a_partition_set_unlogged_never_has_its_keys_refused(pool: PgPool) {
    an_unseen_partitions_keys_pass(&pool, "alter table parts_b set unlogged", "b").await;
}

#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn a_new_unlogged_partition_never_has_its_keys_refused(pool: PgPool) {
    an_unseen_partitions_keys_pass(
        &pool,
        "create unlogged table parts_c partition of parts for values from ('c') to ('d')",
        "c",
    )
    .await;
}

/// `install_log` refuses a table with an unlogged partition, naming it.
#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn a_table_with_an_unlogged_partition_is_refused_naming_it(pool: PgPool) {
    let (_url, _slot) = log_fed(&pool).await;
    exec(
        &pool,
        "create table parts (key text primary key) partition by range (key);
         create table parts_a partition of parts for values from ('a') to ('b');
         create unlogged table parts_u partition of parts for values from ('u') to ('v')",
    )
    .await;
    let error = bloom_guard_sqlx::Watch::table("parts")
        .key("key")
        .install_log(&pool)
        .await
        .expect_err("an unlogged partition")
        .to_string();
    assert!(error.contains("parts_u"), "{error}");
    assert!(error.contains("unlogged"), "{error}");
}

/// The publication changed by hand so that inserts are no longer published
/// (or a row filter, a column list): the guard lets those keys through,
/// from the change on, and its check names the change.
#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn a_publication_changed_by_hand_never_has_its_keys_refused(pool: PgPool) {
    let (url, _slot) = log_fed(&pool).await;
    let (guard, _task) = log_followed_as(|guard| {
        bloom_guard_sqlx::postgres::log::Follower::new(guard, pool.clone(), items(), &*url)
            .check_interval(Duration::from_secs(600))
    })
    .await;
    assert_eq!(status(&guard, "never-written").await, StatusCode::NOT_FOUND);
    exec(
        &pool,
        "alter publication bloom_guard set (publish = 'update, delete, truncate')",
    )
    .await;
    let mut refused = Vec::new();
    for i in 0..30 {
        let key = format!("unpublished-{i}");
        sqlx::query("insert into items (key) values ($1)")
            .bind(&key)
            .execute(&pool)
            .await
            .expect("insert");
        if status(&guard, &key).await == StatusCode::NOT_FOUND {
            refused.push(key);
        }
    }
    assert!(refused.is_empty(), "refused: {refused:?}");
    exec(
        &pool,
        "alter publication bloom_guard set (publish = 'insert, update, delete, truncate')",
    )
    .await;
}

/// A table on the log feed attached as a partition of another table on
/// it: the server publishes its changes as the root's only, so its own
/// guard lets its keys through from the attach on; and `install_log`
/// refuses a partition under a fed root, and a root over a fed partition.
#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn a_fed_table_attached_under_a_fed_root_never_has_its_keys_refused(pool: PgPool) {
    let (url, _slot) = log_fed(&pool).await;
    exec(
        &pool,
        "create table parts (key text primary key) partition by range (key);
         create table parts_a partition of parts for values from ('a') to ('b');
         create table parts_b (key text primary key);
         insert into parts_b values ('b1')",
    )
    .await;
    let parts = bloom_guard_sqlx::Watch::table("parts").key("key");
    let parts_b = bloom_guard_sqlx::Watch::table("parts_b").key("key");
    parts
        .install_log(&pool)
        .await
        .expect("parts on the log feed");
    parts_b
        .install_log(&pool)
        .await
        .expect("parts_b on the log feed");
    let (guard, _task) = log_followed_as(|guard| {
        bloom_guard_sqlx::postgres::log::Follower::new(guard, pool.clone(), parts_b.clone(), &*url)
            .check_interval(Duration::from_secs(600))
    })
    .await;
    assert_eq!(status(&guard, "b-never").await, StatusCode::NOT_FOUND);
    exec(
        &pool,
        "alter table parts attach partition parts_b for values from ('b') to ('c')",
    )
    .await;
    let mut refused = Vec::new();
    for i in 0..30 {
        let key = format!("b-attached-{i}");
        sqlx::query("insert into parts_b (key) values ($1)")
            .bind(&key)
            .execute(&pool)
            .await
            .expect("insert into the partition");
        if status(&guard, &key).await == StatusCode::NOT_FOUND {
            refused.push(key);
        }
    }
    assert!(refused.is_empty(), "refused: {refused:?}");

    // Installs that would make such a pair are refused, naming the other.
    exec(
        &pool,
        "create table parts_c partition of parts for values from ('c') to ('d')",
    )
    .await;
    let under = bloom_guard_sqlx::Watch::table("parts_c")
        .key("key")
        .install_log(&pool)
        .await
        .expect_err("a partition under a fed root")
        .to_string();
    assert!(under.contains("parts_c is a partition of parts"), "{under}");
    exec(
        &pool,
        "create table roots (key text primary key) partition by range (key);
         create table roots_a partition of roots for values from ('a') to ('b')",
    )
    .await;
    bloom_guard_sqlx::Watch::table("roots_a")
        .key("key")
        .install_log(&pool)
        .await
        .expect("roots_a on the log feed");
    let over = bloom_guard_sqlx::Watch::table("roots")
        .key("key")
        .install_log(&pool)
        .await
        .expect_err("a root over a fed partition")
        .to_string();
    assert!(over.contains("roots_a"), "{over}");
}

/// A foreign table on this server, reached through `postgres_fdw`: made
/// as `parts_c`, a partition of `parts` for keys from `c` to `d`, whose
/// rows land in the plain table `remote_c` (not on the feed).
async fn foreign_partition_ddl(pool: &PgPool) -> String {
    let url = url::Url::parse(&common::log::url_of(pool).await).expect("the database's URL");
    let database = url.path().trim_start_matches('/').to_owned();
    let host = url.host_str().unwrap_or("127.0.0.1").to_owned();
    let port = url.port().unwrap_or(5432);
    let user = match url.username() {
        "" => "postgres".to_owned(),
        user => user.to_owned(),
    };
    let password = url
        .password()
        .map(|password| format!(", password '{password}'"))
        .unwrap_or_default();
    exec(
        pool,
        &format!(
            "create extension if not exists postgres_fdw;
             create server here foreign data wrapper postgres_fdw
                 options (host '{host}', port '{port}', dbname '{database}');
             create user mapping for current_user server here options (user '{user}'{password});
             create table remote_c (key text primary key, note text);"
        ),
    )
    .await;
    "create foreign table parts_c partition of parts for values from ('c') to ('d')
         server here options (table_name 'remote_c')"
        .to_owned()
}

/// A foreign-table partition made under a table on the log feed: its rows
/// go to another table (here through a loopback server), never into this
/// table's log, so its keys are served, never refused.
#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn a_new_foreign_partition_never_has_its_keys_refused(pool: PgPool) {
    let (url, _slot) = log_fed(&pool).await;
    exec(&pool, PARTS_UNINDEXED).await;
    let ddl = foreign_partition_ddl(&pool).await;
    a_made_partitions_keys_pass(&pool, &url, &ddl, "c").await;
}

/// `install_log` refuses a table with a foreign-table partition, naming it.
#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn a_table_with_a_foreign_partition_is_refused_naming_it(pool: PgPool) {
    let (_url, _slot) = log_fed(&pool).await;
    exec(&pool, PARTS_UNINDEXED).await;
    let ddl = foreign_partition_ddl(&pool).await;
    exec(&pool, &ddl).await;
    let error = bloom_guard_sqlx::Watch::table("parts")
        .key("key")
        .install_log(&pool)
        .await
        .expect_err("a foreign partition")
        .to_string();
    assert!(error.contains("parts_c"), "{error}");
    assert!(!error.contains("parts_a"), "{error}");
}
