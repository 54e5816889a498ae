//! A fleet on one database: a setting switched on one instance reaches
//! every other, also one started later; the fleet view lists the live
//! instances and forgets stopped and dead ones. On Postgres and SQLite.

mod common;

use std::future::Future;
use std::str::FromStr;
use std::time::Duration;

use bloom_guard::{
    fleet::Instance,
    settings::{SetBy, Settings},
    stats::GuardState,
    BloomGuard, Mode,
};
use bloom_guard_sqlx::{postgres, sqlite, Follow, Watch};
use common::{install, wait_until};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use sqlx::{PgPool, SqlitePool};

/// What the scenario needs of a database.
trait FleetDb {
    /// A follower of `guard`, named `id` in the fleet view.
    fn follower(&self, guard: &BloomGuard, id: &str) -> impl Follow;
    /// Makes instance `id`'s heartbeat 31 s old, as if it died then.
    fn age(&self, id: &str) -> impl Future<Output = ()>;
    /// Heartbeat rows kept.
    fn rows(&self) -> impl Future<Output = i64>;
}

/// Runs `follower` until the sender is dropped (a clean stop); the handle
/// aborts it (a crash: no goodbye).
fn spawn(
    follower: impl Follow,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(follower.run_until(async move {
        let _ = stopped.await;
    }));
    (stop, task)
}

fn guard(mode: Mode) -> BloomGuard {
    BloomGuard::builder()
        .expected_items(1000)
        .mode(mode)
        .build()
}

async fn ids(guard: &BloomGuard) -> Vec<String> {
    let instances = guard.fleet().await.expect("the fleet view");
    instances.into_iter().map(|instance| instance.id).collect()
}

/// Waits until `guard`'s fleet view lists exactly `expected`.
async fn listed(guard: &BloomGuard, expected: &[&str]) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let now = ids(guard).await;
        if now == expected {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "listed {now:?}, expected {expected:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Settings switched on `a` are in force on `b` within 2 s (3 s allowed
/// for a loaded machine); the scenario of both databases.
async fn a_fleet_shares_its_settings_and_lists_its_instances(db: impl FleetDb) {
    let (a, b) = (guard(Mode::Enforce), guard(Mode::Enforce));
    let (_stop_a, _task_a) = spawn(db.follower(&a, "a"));
    let (stop_b, _task_b) = spawn(db.follower(&b, "b"));
    wait_until("two warm-ups", Duration::from_secs(10), || {
        a.is_ready() && b.is_ready()
    })
    .await;
    assert_eq!(
        (b.mode(), b.stats().mode_set_by),
        (Mode::Enforce, SetBy::Default)
    );

    // One switch for the fleet.
    a.set_mode(Mode::Shadow).await.expect("stored");
    assert_eq!(
        (a.mode(), a.stats().mode_set_by),
        (Mode::Shadow, SetBy::Fleet)
    );
    let within = Duration::from_secs(3);
    wait_until("shadow on b", within, || b.mode() == Mode::Shadow).await;
    assert_eq!(b.stats().mode_set_by, SetBy::Fleet);
    a.set_audit_rate(0.5).await.expect("stored");
    wait_until("the audit rate on b", within, || b.audit_rate() == 0.5).await;
    assert_eq!(b.mode(), Mode::Shadow, "the stored mode is kept");

    // An override is b's own, whatever the fleet's.
    b.override_settings(Settings::new().mode(Mode::Off))
        .expect("valid");
    a.set_mode(Mode::Enforce).await.expect("stored");
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(
        (b.mode(), b.stats().mode_set_by),
        (Mode::Off, SetBy::Instance)
    );
    b.clear_overrides();
    assert_eq!(
        (b.mode(), b.stats().mode_set_by),
        (Mode::Enforce, SetBy::Fleet)
    );

    // An instance started later comes up in the fleet's mode, not in its
    // builder's.
    let c = guard(Mode::Off);
    let (_stop_c, task_c) = spawn(db.follower(&c, "c"));
    wait_until("c's warm-up", Duration::from_secs(10), || c.is_ready()).await;
    assert_eq!((c.mode(), c.audit_rate()), (Mode::Enforce, 0.5));

    // The fleet view: every live instance, as its heartbeat reported it.
    listed(&a, &["a", "b", "c"]).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    let instances: Vec<Instance> = loop {
        let instances = b.fleet().await.expect("the fleet view");
        // Heartbeats after c's warm-up and b's override was dropped.
        if instances.iter().all(|i| {
            (i.state, i.mode, i.mode_set_by) == (GuardState::Ready, Mode::Enforce, SetBy::Fleet)
        }) {
            break instances;
        }
        assert!(tokio::time::Instant::now() < deadline, "{instances:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    for instance in &instances {
        assert!(
            instance.generation >= 1 && instance.origin.is_some(),
            "{instance:?}"
        );
        assert!(instance.feed_age_ms.is_some(), "{instance:?}");
        assert!(instance.seen_ago_ms < 30_000, "{instance:?}");
        assert_eq!(instance.version, env!("CARGO_PKG_VERSION"));
    }

    // Forgetting the fleet's settings: every instance back to its builder's.
    a.reset_settings().await.expect("reset");
    wait_until("c back to its builder's mode", within, || {
        c.mode() == Mode::Off
    })
    .await;
    wait_until("b back to its builder's audit rate", within, || {
        b.audit_rate() == 0.0
    })
    .await;
    assert_eq!(
        (b.mode(), b.stats().mode_set_by),
        (Mode::Enforce, SetBy::Default)
    );

    // A clean stop leaves at once; a crash is forgotten 30 s after its
    // last heartbeat, and its row deleted.
    drop(stop_b);
    listed(&a, &["a", "c"]).await;
    task_c.abort();
    let _ = task_c.await;
    assert_eq!(
        ids(&a).await,
        ["a", "c"],
        "a crashed instance stays listed until its heartbeat ages"
    );
    db.age("c").await;
    assert_eq!(ids(&a).await, ["a"]);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while db.rows().await != 1 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the dead instance's row was not deleted"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

struct Postgres(PgPool);

impl FleetDb for Postgres {
    fn follower(&self, guard: &BloomGuard, id: &str) -> impl Follow {
        postgres::Follower::new(guard.clone(), self.0.clone(), common::items())
            .check_interval(Duration::from_millis(200))
            .heartbeat_interval(Duration::from_millis(200))
            .instance_id(id)
    }

    async fn age(&self, id: &str) {
        sqlx::query("update bloom_guard.instances set seen_at = now() - interval '31 seconds' where id = $1")
            .bind(id)
            .execute(&self.0)
            .await
            .expect("age the heartbeat");
    }

    async fn rows(&self) -> i64 {
        sqlx::query_scalar("select count(*) from bloom_guard.instances")
            .fetch_one(&self.0)
            .await
            .expect("count")
    }
}

#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn on_postgres_one_switch_reaches_the_fleet_and_the_view_lists_it(pool: PgPool) {
    install(&pool).await;
    common::exec(&pool, "insert into items (key) values ('k1'), ('k2')").await;
    a_fleet_shares_its_settings_and_lists_its_instances(Postgres(pool)).await;
}

struct Sqlite(SqlitePool);

impl FleetDb for Sqlite {
    fn follower(&self, guard: &BloomGuard, id: &str) -> impl Follow {
        sqlite::Follower::new(
            guard.clone(),
            self.0.clone(),
            Watch::table("items").key("key"),
        )
        .check_interval(Duration::from_millis(200))
        .heartbeat_interval(Duration::from_millis(200))
        .instance_id(id)
    }

    async fn age(&self, id: &str) {
        sqlx::query("update bloom_guard_instances set seen_at = seen_at - 31000 where id = ?1")
            .bind(id)
            .execute(&self.0)
            .await
            .expect("age the heartbeat");
    }

    async fn rows(&self) -> i64 {
        sqlx::query_scalar("select count(*) from bloom_guard_instances")
            .fetch_one(&self.0)
            .await
            .expect("count")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_sqlite_one_switch_reaches_the_fleet_and_the_view_lists_it() {
    let dir = std::env::temp_dir().join(format!("bloom-guard-fleet-{}", fastrand::u64(..)));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let options =
        SqliteConnectOptions::from_str(&format!("sqlite://{}", dir.join("items.db").display()))
            .expect("options")
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .busy_timeout(Duration::from_secs(10));
    let pool = SqlitePoolOptions::new()
        .max_connections(4)
        .connect_with(options)
        .await
        .expect("open");
    sqlx::raw_sql(
        "create table items (id integer primary key, key text not null unique);
                   insert into items (key) values ('k1'), ('k2');",
    )
    .execute(&pool)
    .await
    .expect("schema");
    Watch::table("items")
        .key("key")
        .install(&pool)
        .await
        .expect("install");
    a_fleet_shares_its_settings_and_lists_its_instances(Sqlite(pool.clone())).await;
    pool.close().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// An instance whose role may not use the fleet's tables (an older grant
/// script, say) serves with the settings it has, says why the fleet's
/// cannot be stored, and follows the fleet once granted.
#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn without_rights_on_the_fleet_tables_an_instance_serves_and_joins_once_granted(
    pool: PgPool,
) {
    install(&pool).await;
    common::exec(&pool, "insert into items (key) values ('k1')").await;
    let role = format!("bloom_guard_fleetless_{}", fastrand::u32(..));
    common::exec(
        &pool,
        &format!(
            "create role {role} login;
             grant usage on schema bloom_guard to {role};
             grant select, insert, update, delete on all tables in schema bloom_guard to {role};
             grant usage on all sequences in schema bloom_guard to {role};
             grant execute on all functions in schema bloom_guard to {role};
             grant select on items to {role};
             revoke all on bloom_guard.settings, bloom_guard.instances from {role};"
        ),
    )
    .await;
    let limited = sqlx::postgres::PgPoolOptions::new()
        .max_connections(5)
        .connect_with((*pool.connect_options()).clone().username(&role))
        .await
        .expect("connect as the limited role");
    let db = Postgres(pool.clone());
    let (a, b) = (guard(Mode::Enforce), guard(Mode::Enforce));
    let (_stop_a, _task_a) = spawn(db.follower(&a, "a"));
    let (stop_b, task_b) = spawn(Postgres(limited.clone()).follower(&b, "b"));
    wait_until("two warm-ups", Duration::from_secs(10), || {
        a.is_ready() && b.is_ready()
    })
    .await;
    a.set_mode(Mode::Shadow).await.expect("stored");

    let refused = b.set_mode(Mode::Off).await;
    assert!(
        matches!(refused, Err(bloom_guard::settings::SettingsError::Fleet(_))),
        "{refused:?}"
    );
    assert_eq!(b.mode(), Mode::Enforce, "nothing changed on b");
    assert!(b.fleet().await.is_err());
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(b.mode(), Mode::Enforce, "b keeps the settings it has");
    assert!(b.may_contain("k1") && !b.may_contain("absent"), "b serves");
    assert_eq!(ids(&a).await, ["a"]);

    common::exec(
        &pool,
        &format!("grant select, insert, update, delete on bloom_guard.settings, bloom_guard.instances to {role}"),
    )
    .await;
    wait_until("b in the fleet's mode", Duration::from_secs(3), || {
        b.mode() == Mode::Shadow
    })
    .await;
    listed(&a, &["a", "b"]).await;

    drop(stop_b);
    let _ = task_b.await;
    limited.close().await;
    common::exec(&pool, &format!("drop owned by {role}; drop role {role}")).await;
}
