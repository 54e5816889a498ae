//! Least privilege on Postgres: an owner role (not a superuser) installs
//! the feed and watches the table; the runtime role `postgres::grant_runtime` names
//! follows, writes, publishes and adopts snapshots, and cannot change the
//! feed or a watched table's triggers. A superuser's install adds the event
//! trigger to a feed installed without one.

mod common;

use std::time::Duration;

use bloom_guard::{stats::FilterOrigin, BloomGuard};
use bloom_guard_sqlx::postgres;
use common::*;
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;

const OWNER: &str = "bloom_guard_test_owner";
const RUNTIME: &str = "bloom_guard_test_runtime";

/// A pool of the test's database as role `name`, created if missing (roles
/// belong to the cluster, shared by every test database).
async fn as_role(pool: &PgPool, name: &str) -> PgPool {
    exec(
        pool,
        &format!(
            "do $$ begin create role {name} login nosuperuser;
             exception when duplicate_object or unique_violation then null; end $$"
        ),
    )
    .await;
    let options = pool.connect_options().as_ref().clone().username(name);
    PgPoolOptions::new()
        .max_connections(4)
        .connect_with(options)
        .await
        .expect("connect as the role")
}

/// The SQLSTATE of `sql` run on `pool`, if it failed.
async fn refused(pool: &PgPool, sql: &str) -> Option<String> {
    match sqlx::raw_sql(sqlx::AssertSqlSafe(sql)).execute(pool).await {
        Ok(_) => None,
        Err(sqlx::Error::Database(error)) => error.code().map(|code| code.into_owned()),
        Err(error) => panic!("{sql}: {error}"),
    }
}

/// As a DBA who revokes EXECUTE from PUBLIC would have it (the grant
/// names every function the runtime role calls): `postgres::grant_runtime` to
/// `role`, and the application's rights on `items`.
async fn grant_as_a_dba_would(owner: &PgPool, role: &str) {
    exec(
        owner,
        "revoke execute on all functions in schema bloom_guard from public",
    )
    .await;
    postgres::grant_runtime(owner, role).await.expect("grant");
    exec(
        owner,
        &format!("grant select, insert, update, delete on items to {role}"),
    )
    .await;
}

/// The owner installs and watches, as a migration job would.
async fn owner_installs(pool: &PgPool) -> PgPool {
    let owner = as_role(pool, OWNER).await;
    exec(
        pool,
        &format!(
            "do $$ begin execute format('grant create on database %I to {OWNER}', current_database()); end $$;
             alter table items owner to {OWNER}"
        ),
    )
    .await;
    postgres::install(&owner).await.expect("the owner installs");
    items().install(&owner).await.expect("the owner watches");
    owner
}

#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn the_runtime_role_follows_writes_and_publishes_but_cannot_change_the_feed(pool: PgPool) {
    let owner = owner_installs(&pool).await;
    let runtime = as_role(&pool, RUNTIME).await;
    grant_as_a_dba_would(&owner, RUNTIME).await;
    exec(&runtime, "insert into items (key) values ('before')").await;

    // At start the application installs and watches as every instance
    // does: with the feed current, neither needs a right it lacks.
    postgres::install(&runtime)
        .await
        .expect("install is a no-op");
    items().install(&runtime).await.expect("watch is a no-op");
    let guard = guard();
    let task = spawn(
        postgres::Follower::new(guard.clone(), runtime.clone(), items())
            .check_interval(Duration::from_millis(200))
            .snapshot_interval(Duration::ZERO),
    );
    wait_until("ready", Duration::from_secs(20), || guard.is_ready()).await;
    assert!(guard.may_contain("before"));

    // Writers: the triggers record their keys (run as the feed's owner).
    exec(
        &runtime,
        "insert into items (key) values ('new');
         update items set key = 'renamed' where key = 'before'",
    )
    .await;
    arrives(&guard, &["new", "renamed"]).await;
    // Retention, the fleet's view and snapshots.
    exec(&runtime, "select bloom_guard.prune('1 hour')").await;
    published(&pool).await;
    let adopted = BloomGuard::builder().expected_items(1000).build();
    let _other = spawn(postgres::Follower::new(
        adopted.clone(),
        runtime.clone(),
        items(),
    ));
    wait_until("the adoption", Duration::from_secs(20), || {
        adopted.is_ready()
    })
    .await;
    assert_eq!(adopted.stats().origin, Some(FilterOrigin::Snapshot));
    assert!(adopted.may_contain("renamed"));

    // Nothing that changes the feed, or a watched table's triggers.
    for ddl in [
        "create table bloom_guard.other (x int)",
        "drop table bloom_guard.changes",
        "alter table bloom_guard.changes add column x int",
        "truncate bloom_guard.changes",
        "delete from bloom_guard.changes",
        "insert into bloom_guard.changes (guard, kind, key) values ('items', 'd', 'new')",
        "update bloom_guard.horizon set below = '0'",
        "select bloom_guard.watch('items', array['key'], 'other')",
        "select bloom_guard.unwatch('items', 'items')",
        "select bloom_guard.grant_runtime('bloom_guard_test_runtime')",
        "alter table items disable trigger user",
        "drop trigger bloom_guard_items_inserted on items",
        "create or replace function bloom_guard.current_slot() returns smallint language sql as 'select 0::smallint'",
    ] {
        assert_eq!(
            refused(&runtime, ddl).await.as_deref(),
            Some("42501"),
            "the runtime role ran: {ddl}"
        );
    }
    drop(task);
}

/// Waits until the runtime role's follower published a snapshot and a
/// heartbeat (read by the test's superuser pool).
async fn published(pool: &PgPool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let done: bool = sqlx::query_scalar(
            "select exists (select from bloom_guard.snapshots)
                and exists (select from bloom_guard.instances)",
        )
        .fetch_one(pool)
        .await
        .expect("look");
        if done {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no snapshot or heartbeat from the runtime role's follower"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn a_superusers_install_adds_the_event_trigger_to_a_current_feed(pool: PgPool) {
    owner_installs(&pool).await;
    let event_trigger =
        "select count(*) from pg_event_trigger where evtname = 'bloom_guard_alter_table'";
    let count = |pool: PgPool| async move {
        sqlx::query_scalar::<_, i64>(event_trigger)
            .fetch_one(&pool)
            .await
            .expect("count")
    };
    assert_eq!(count(pool.clone()).await, 0, "a non-superuser added one");
    postgres::install(&pool)
        .await
        .expect("the superuser's install");
    assert_eq!(count(pool.clone()).await, 1);
    // The feed is still the owner's, and whole.
    let owner: String = sqlx::query_scalar(
        "select pg_get_userbyid(p.proowner) from pg_proc p
          where p.oid = 'bloom_guard.prune(interval)'::regprocedure",
    )
    .fetch_one(&pool)
    .await
    .expect("owner");
    assert_eq!(owner, OWNER);
}

#[cfg(feature = "log-feed")]
#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn the_runtime_role_streams_follows_and_remakes_the_log_feed_but_cannot_change_it(
    pool: PgPool,
) {
    use bloom_guard_sqlx::postgres;
    use common::log::{
        holds_what_the_table_holds, log_followed_as, random_write, url_of, SlotGuard,
    };
    const LOG_OWNER: &str = "bloom_guard_test_log_owner";
    const LOG_RUNTIME: &str = "bloom_guard_test_log_runtime";
    // The owner puts `items` on the log feed, as a migration job would:
    // making the slot needs REPLICATION, the publication CREATE.
    let owner = as_role(&pool, LOG_OWNER).await;
    let runtime = as_role(&pool, LOG_RUNTIME).await;
    exec(
        &pool,
        &format!(
            "do $$ begin execute format('grant create on database %I to {LOG_OWNER}', current_database()); end $$;
             alter role {LOG_OWNER} replication;
             alter role {LOG_RUNTIME} replication;
             alter table items owner to {LOG_OWNER}"
        ),
    )
    .await;
    let url = url_of(&pool).await;
    let _slot = SlotGuard { url: url.clone() };
    postgres::install(&owner).await.expect("the owner installs");
    exec(
        &owner,
        "alter table items replica identity using index items_key_key",
    )
    .await;
    items()
        .install_log(&owner)
        .await
        .expect("the owner puts items on the log feed");
    grant_as_a_dba_would(&owner, LOG_RUNTIME).await;

    // The runtime role streams the slot (it is the only instance), writes
    // the feed, follows it, and makes the slot again when it is dropped.
    let mut runtime_url = url::Url::parse(&url).expect("the database's URL");
    runtime_url.set_username(LOG_RUNTIME).expect("a user name");
    let runtime_url = runtime_url.to_string();
    postgres::install(&runtime)
        .await
        .expect("install is a no-op");
    items()
        .install_log(&runtime)
        .await
        .expect("install_log is a no-op");
    let (guard, _task) = log_followed_as(|guard| {
        postgres::log::Follower::new(guard, runtime.clone(), items(), runtime_url.clone())
            .check_interval(Duration::from_millis(200))
    })
    .await;
    let mut rng = fastrand::Rng::with_seed(7);
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..40 {
        random_write(&runtime, &mut rng, &mut seen).await;
    }
    holds_what_the_table_holds("runtime role", &guard, &pool, &seen).await;
    let streamer: String = sqlx::query_scalar(
        "select a.usename::text from pg_replication_slots s join pg_stat_activity a on a.pid = s.active_pid
          where s.database = current_database() and not s.temporary",
    )
    .fetch_one(&pool)
    .await
    .expect("the slot's reader");
    assert_eq!(streamer, LOG_RUNTIME);
    exec(
        &pool,
        "select pg_terminate_backend(active_pid) from pg_replication_slots where database = current_database() and active_pid is not null;
         select pg_sleep(0.2);
         select pg_drop_replication_slot(slot_name) from pg_replication_slots where database = current_database() and not temporary",
    )
    .await;
    for _ in 0..40 {
        random_write(&runtime, &mut rng, &mut seen).await;
    }
    common::log::holds_what_the_table_holds_once_closed(
        "after the slot's remaking",
        &guard,
        &pool,
        &seen,
    )
    .await;

    // Nothing that changes the log feed's tables beyond what it writes.
    for ddl in [
        "drop table bloom_guard.log_changes",
        "truncate bloom_guard.log_changes",
        "update bloom_guard.logged set key_columns = array['id']",
        "delete from bloom_guard.logged",
        "alter publication bloom_guard drop table items",
        "alter table items replica identity default",
    ] {
        assert_eq!(
            refused(&runtime, ddl).await.as_deref(),
            Some("42501"),
            "the runtime role ran: {ddl}"
        );
    }
}
