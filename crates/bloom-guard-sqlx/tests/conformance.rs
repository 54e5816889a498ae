//! One contract, three databases: every scenario here runs on Postgres,
//! SQLite and MySQL (or MariaDB) through the same code, with only the
//! statements that differ (creating the table, dropping a trigger) written
//! per database. Postgres needs `DATABASE_URL`, MySQL `MYSQL_URL`; each
//! test makes a database of its own there. SQLite uses a file of its own.

mod common;

use std::future::Future;
use std::str::FromStr;
use std::time::Duration;

use bloom_guard::{
    stats::{FilterOrigin, GuardState},
    BloomGuard,
};
use bloom_guard_sqlx::{Follow, Watch};
use common::{spawn, status, wait_until, Running};
use http::StatusCode;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use sqlx::{ConnectOptions, Connection, MySqlPool, PgPool, SqlitePool};

/// What a scenario needs of a database holding `items (id, code)`, the
/// feed installed and watching `code`.
trait Db: Sized + Send + Sync + 'static {
    /// A second handle on the same database: another instance's pool.
    fn another(&self) -> impl Future<Output = Self> + Send;
    /// A follower of `guard`, with the intervals a test wants.
    fn follower(&self, guard: &BloomGuard) -> impl Follow;
    /// Runs statements, as any SQL client would.
    fn exec(&self, sql: &str) -> impl Future<Output = ()> + Send;
    /// Snapshots published.
    fn snapshots(&self) -> impl Future<Output = i64> + Send;
    /// Drops the feed's insert trigger from `items`: writes bypass the feed.
    fn drop_insert_trigger(&self) -> impl Future<Output = ()> + Send;
    /// Watches `items` again, as its owner would after a gap.
    fn watch_again(&self) -> impl Future<Output = ()> + Send;
    /// Ends every other session on the database (a failover, an operator's
    /// kill); how many. SQLite has no sessions to end: 0.
    fn kill_other_sessions(&self) -> impl Future<Output = u64> + Send;
    /// Whether a new filter's catch-up may come before the feed holds what
    /// committed before it: the log feed's producer writes what committed
    /// while no instance ran as it streams, and a catch-up reads what is
    /// written (refusals wait for the producer by the barrier). The
    /// trigger feeds hold every commit at once.
    fn caught_up_by_a_producer(&self) -> bool {
        false
    }
}

fn items() -> Watch {
    Watch::table("items").key("code")
}

fn guard() -> BloomGuard {
    BloomGuard::builder()
        .expected_items(2000)
        .false_positive_rate(0.0001)
        .build()
}

/// A guard followed on `db`, once ready.
async fn followed(db: &impl Db) -> (BloomGuard, Running) {
    let guard = guard();
    let running = spawn(db.follower(&guard));
    wait_until("the warm-up", Duration::from_secs(20), || guard.is_ready()).await;
    (guard, running)
}

fn holds(guard: &BloomGuard, keys: &[&str]) -> bool {
    guard.stats().state == GuardState::Ready && keys.iter().all(|key| guard.may_contain(key))
}

fn forgot(guard: &BloomGuard, keys: &[&str]) -> bool {
    guard.stats().state == GuardState::Ready && keys.iter().all(|key| !guard.may_contain(key))
}

/// `insert into items (code) values ('p0'), ('p1'), …`.
fn insert_codes(prefix: &str, count: usize) -> String {
    let values: Vec<String> = (0..count).map(|i| format!("('{prefix}{i}')")).collect();
    format!("insert into items (code) values {}", values.join(", "))
}

// The scenarios.

/// The warm-up holds every stored key and refuses others.
async fn warms_up_with_every_stored_key(db: impl Db) {
    db.exec(&insert_codes("k", 500)).await;
    let (guard, _running) = followed(&db).await;
    assert_eq!(guard.stats().origin, Some(FilterOrigin::Scan));
    let stored: Vec<String> = (0..500).map(|i| format!("k{i}")).collect();
    assert!(stored.iter().all(|key| guard.may_contain(key)));
    let let_through = (0..500)
        .filter(|i| guard.may_contain(format!("absent-{i}")))
        .count();
    assert!(let_through <= 2, "{let_through} of 500 absent keys");
}

/// Inserts, key updates, deletes, and two rows of one key, by plain SQL:
/// the guard follows each within a second, deletes included.
async fn follows_every_kind_of_write(db: impl Db) {
    db.exec("insert into items (code) values ('a'), ('b'), ('c'), ('twice')")
        .await;
    let (guard, _running) = followed(&db).await;
    db.exec("insert into items (code) values ('new'), ('twice')")
        .await;
    db.exec("update items set code = 'renamed' where code = 'a'")
        .await;
    db.exec("delete from items where code = 'b'").await;
    // One of the two rows of 'twice' goes: the other keeps the key.
    db.exec("delete from items where id = (select id from (select max(id) as id from items where code = 'twice') as newest)")
        .await;
    wait_until("the writes", Duration::from_secs(2), || {
        holds(&guard, &["new", "renamed", "c", "twice"])
            && forgot(&guard, &["a", "b"])
            // The second row of 'twice' too, once.
            && guard.stats().deletes_applied == 3
    })
    .await;
    // Deleted and written again in one transaction.
    db.exec(
        "begin; delete from items where code = 'c'; insert into items (code) values ('c'); commit",
    )
    .await;
    db.exec("delete from items where code = 'twice'").await;
    wait_until("the second writes", Duration::from_secs(2), || {
        holds(&guard, &["c"]) && forgot(&guard, &["twice"])
    })
    .await;
}

/// A restart adopts the published snapshot and replays what was written
/// while no instance ran, deletes included.
async fn a_restart_adopts_the_snapshot_and_replays_the_feed(db: impl Db) {
    db.exec(&insert_codes("k", 200)).await;
    let (first, running) = followed(&db).await;
    for _ in 0..500 {
        if db.snapshots().await > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(db.snapshots().await > 0, "no snapshot was published");
    assert_eq!(first.stats().origin, Some(FilterOrigin::Scan));
    drop(running);
    db.exec("insert into items (code) values ('while-down')")
        .await;
    db.exec("delete from items where code = 'k7'").await;
    let other = db.another().await;
    let (second, _running) = followed(&other).await;
    assert_eq!(second.stats().origin, Some(FilterOrigin::Snapshot));
    let replayed = || holds(&second, &["while-down", "k0", "k199"]) && forgot(&second, &["k7"]);
    if other.caught_up_by_a_producer() {
        wait_until("the producer's replay", Duration::from_secs(5), replayed).await;
    } else {
        assert!(replayed(), "ready before the catch-up held the feed");
    }
}

/// Instances started together scan the table once between them.
async fn a_fleet_started_together_scans_once(db: impl Db) {
    db.exec(&insert_codes("k", 1000)).await;
    let others = [db.another().await, db.another().await];
    let guards = [guard(), guard(), guard()];
    let _running: Vec<Running> = [&db, &others[0], &others[1]]
        .iter()
        .zip(&guards)
        .map(|(db, guard)| spawn(db.follower(guard)))
        .collect();
    wait_until("three warm-ups", Duration::from_secs(30), || {
        guards.iter().all(BloomGuard::is_ready)
    })
    .await;
    let origins: Vec<_> = guards.iter().map(|g| g.stats().origin).collect();
    let scans = origins
        .iter()
        .filter(|origin| **origin == Some(FilterOrigin::Scan))
        .count();
    assert_eq!(scans, 1, "{origins:?}");
    for guard in &guards {
        assert!(holds(guard, &["k0", "k999"]));
    }
}

/// A key committed by any client is never refused by an instance asked
/// at once: the read barrier.
async fn a_key_committed_elsewhere_is_never_refused(db: impl Db) {
    let other = db.another().await;
    let (_writer, _one) = followed(&db).await;
    let (reader, _two) = followed(&other).await;
    let mut refused = Vec::new();
    for i in 0..200 {
        let key = format!("fresh-{i}");
        db.exec(&format!("insert into items (code) values ('{key}')"))
            .await;
        if status(&reader, &key).await == StatusCode::NOT_FOUND {
            refused.push(key);
        }
    }
    assert!(refused.is_empty(), "refused: {refused:?}");
    assert_eq!(
        status(&reader, "never-written").await,
        StatusCode::NOT_FOUND
    );
}

/// Writes while a feed trigger is missing: once the trigger check sees
/// the gap (Postgres's event trigger at once, SQLite and MySQL at the next
/// check), the guard lets every request through until the table is
/// watched again (SQLite and MySQL followers put the triggers back
/// themselves where they may), then rebuilds with the keys written
/// meanwhile.
async fn a_missing_trigger_fails_open_until_rebuilt(db: impl Db) {
    db.exec("insert into items (code) values ('before')").await;
    let (guard, _running) = followed(&db).await;
    db.drop_insert_trigger().await;
    db.exec("insert into items (code) values ('in-the-gap')")
        .await;
    wait_until("the gap to be seen", Duration::from_secs(5), || {
        guard.stats().state != GuardState::Ready
    })
    .await;
    for _ in 0..20 {
        assert_ne!(status(&guard, "in-the-gap").await, StatusCode::NOT_FOUND);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    db.watch_again().await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        assert_ne!(
            status(&guard, "in-the-gap").await,
            StatusCode::NOT_FOUND,
            "a key written without the trigger was refused"
        );
        if holds(&guard, &["in-the-gap", "before"]) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not rebuilt: {:?}",
            guard.stats()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    db.exec("insert into items (code) values ('after-the-repair')")
        .await;
    assert_ne!(
        status(&guard, "after-the-repair").await,
        StatusCode::NOT_FOUND
    );
    refuses_again(&guard).await;
}

/// Waits until the guard refuses an absent key again: the hold of a gap,
/// a resync or a failed read ends at the follower's next check or read,
/// a moment after the keys it waited for are in the filter.
async fn refuses_again(guard: &BloomGuard) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while status(guard, "never-written").await != StatusCode::NOT_FOUND {
        assert!(
            std::time::Instant::now() < deadline,
            "the guard did not refuse an absent key again: {:?}",
            guard.stats()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Sessions killed between writes and reads: no key is refused, each
/// arrives once the follower has connected again.
async fn killed_sessions_lose_no_key(db: impl Db) {
    let other = db.another().await;
    let (guard, _running) = followed(&other).await;
    let mut killed = 0;
    for i in 0..20 {
        let key = format!("across-a-kill-{i}");
        db.exec(&format!("insert into items (code) values ('{key}')"))
            .await;
        killed += db.kill_other_sessions().await;
        assert_ne!(
            status(&guard, &key).await,
            StatusCode::NOT_FOUND,
            "{key} was refused after the sessions were killed"
        );
    }
    let keys: Vec<String> = (0..20).map(|i| format!("across-a-kill-{i}")).collect();
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    wait_until("every key after the kills", Duration::from_secs(20), || {
        holds(&guard, &keys)
    })
    .await;
    db.exec("insert into items (code) values ('after-the-kills')")
        .await;
    assert_ne!(
        status(&guard, "after-the-kills").await,
        StatusCode::NOT_FOUND
    );
    // Protection comes back: a read on a connection killed last fails once
    // and lets that moment's refusals through (failing open), the next
    // read reconnects.
    refuses_again(&guard).await;
    eprintln!("{killed} sessions killed");
}

macro_rules! conformance {
    ($($scenario:ident),* $(,)?) => {
        mod postgres {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                #[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
                async fn $scenario() {
                    super::$scenario(Postgres::fresh().await).await;
                }
            )*
        }
        #[cfg(feature = "log-feed")]
        mod postgres_log {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                #[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
                async fn $scenario() {
                    super::$scenario(PostgresLog::fresh().await).await;
                }
            )*
        }
        mod sqlite {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    super::$scenario(Sqlite::fresh().await).await;
                }
            )*
        }
        #[cfg(feature = "binlog-feed")]
        mod mysql_log {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                #[cfg_attr(not(mysql_database), ignore = "needs MySQL or MariaDB: set MYSQL_URL")]
                async fn $scenario() {
                    super::$scenario(MySqlLog::fresh().await).await;
                }
            )*
        }
        mod mysql {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                #[cfg_attr(not(mysql_database), ignore = "needs MySQL or MariaDB: set MYSQL_URL")]
                async fn $scenario() {
                    super::$scenario(MySql::fresh().await).await;
                }
            )*
        }
    };
}

conformance!(
    warms_up_with_every_stored_key,
    follows_every_kind_of_write,
    a_restart_adopts_the_snapshot_and_replays_the_feed,
    a_fleet_started_together_scans_once,
    a_key_committed_elsewhere_is_never_refused,
    a_missing_trigger_fails_open_until_rebuilt,
    killed_sessions_lose_no_key,
);

// The databases.

fn fast(follower: impl Follow) -> impl Follow {
    follower
        .check_interval(Duration::from_millis(200))
        .poll_interval(Duration::from_millis(500))
}

/// A database name of its own for one test.
fn database_name() -> String {
    format!("bloom_guard_conformance_{}", fastrand::u64(..))
}

struct Postgres(PgPool);

/// A database of its own on `DATABASE_URL`'s server, holding `items` and
/// the feed.
async fn fresh_postgres() -> PgPool {
    let url = std::env::var("DATABASE_URL").expect("DATABASE_URL");
    let options = sqlx::postgres::PgConnectOptions::from_str(&url).expect("DATABASE_URL");
    let name = database_name();
    let mut admin = options.connect().await.expect("connect to Postgres");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("create database {name}")))
        .execute(&mut admin)
        .await
        .expect("create the test database");
    let _ = admin.close().await;
    let pool = PgPool::connect_with(options.database(&name))
        .await
        .expect("connect to the test database");
    let db = Postgres(pool);
    db.exec("create table items (id bigserial primary key, code text not null)")
        .await;
    bloom_guard_sqlx::postgres::install(&db.0)
        .await
        .expect("install");
    db.0
}

impl Postgres {
    async fn fresh() -> Self {
        let pool = fresh_postgres().await;
        items().install(&pool).await.expect("watch items");
        Self(pool)
    }
}

/// Postgres with `items` on the log feed (its replica identity `FULL`: the
/// code is not unique). Its gap is the table out of the publication.
#[cfg(feature = "log-feed")]
struct PostgresLog {
    db: Postgres,
    url: String,
    _slot: std::sync::Arc<common::log::SlotGuard>,
}

#[cfg(feature = "log-feed")]
impl PostgresLog {
    async fn fresh() -> Self {
        let db = Postgres(fresh_postgres().await);
        db.exec("alter table items replica identity full").await;
        let url = common::log::url_of(&db.0).await;
        let slot = std::sync::Arc::new(common::log::SlotGuard { url: url.clone() });
        items()
            .install_log(&db.0)
            .await
            .expect("items on the log feed");
        Self {
            db,
            url,
            _slot: slot,
        }
    }
}

#[cfg(feature = "log-feed")]
impl Db for PostgresLog {
    fn caught_up_by_a_producer(&self) -> bool {
        true
    }

    async fn another(&self) -> Self {
        Self {
            db: self.db.another().await,
            url: self.url.clone(),
            _slot: self._slot.clone(),
        }
    }

    fn follower(&self, guard: &BloomGuard) -> impl Follow {
        fast(bloom_guard_sqlx::postgres::log::Follower::new(
            guard.clone(),
            self.db.0.clone(),
            items(),
            &self.url,
        ))
    }

    async fn exec(&self, sql: &str) {
        self.db.exec(sql).await;
    }

    async fn snapshots(&self) -> i64 {
        self.db.snapshots().await
    }

    async fn drop_insert_trigger(&self) {
        self.exec("alter publication bloom_guard drop table items")
            .await;
    }

    async fn watch_again(&self) {
        items()
            .install_log(&self.db.0)
            .await
            .expect("items on the log feed");
    }

    async fn kill_other_sessions(&self) -> u64 {
        // The producer's replication connection too.
        self.db.kill_other_sessions().await
    }
}

impl Db for Postgres {
    async fn another(&self) -> Self {
        Self(
            PgPool::connect_with((*self.0.connect_options()).clone())
                .await
                .expect("connect"),
        )
    }

    fn follower(&self, guard: &BloomGuard) -> impl Follow {
        fast(bloom_guard_sqlx::postgres::Follower::new(
            guard.clone(),
            self.0.clone(),
            items(),
        ))
    }

    async fn exec(&self, sql: &str) {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
            .execute(&self.0)
            .await
            .unwrap_or_else(|error| panic!("{sql}: {error}"));
    }

    async fn snapshots(&self) -> i64 {
        sqlx::query_scalar("select count(*) from bloom_guard.snapshots")
            .fetch_one(&self.0)
            .await
            .expect("count")
    }

    async fn drop_insert_trigger(&self) {
        let name: String = sqlx::query_scalar(
            "select tgname::text from pg_trigger
              where tgrelid = 'items'::regclass and not tgisinternal
                and tgtype & 4 <> 0 order by tgname limit 1",
        )
        .fetch_one(&self.0)
        .await
        .expect("the insert trigger");
        self.exec(&format!("drop trigger \"{name}\" on items"))
            .await;
    }

    async fn watch_again(&self) {
        items().install(&self.0).await.expect("watch items");
    }

    async fn kill_other_sessions(&self) -> u64 {
        sqlx::query(
            "select pg_terminate_backend(pid) from pg_stat_activity
              where datname = current_database() and pid <> pg_backend_pid()",
        )
        .execute(&self.0)
        .await
        .expect("kill sessions")
        .rows_affected()
    }
}

struct Sqlite(SqlitePool, std::path::PathBuf);

impl Sqlite {
    async fn fresh() -> Self {
        let dir = std::env::temp_dir().join(database_name());
        std::fs::create_dir_all(&dir).expect("temp dir");
        let db = Self::open(dir.join("items.db")).await;
        db.exec("create table items (id integer primary key, code text not null)")
            .await;
        items().install(&db.0).await.expect("install");
        db
    }

    async fn open(path: std::path::PathBuf) -> Self {
        let options = SqliteConnectOptions::from_str(&format!("sqlite://{}", path.display()))
            .expect("options")
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .busy_timeout(Duration::from_secs(10));
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(options)
            .await
            .expect("open");
        Self(pool, path)
    }
}

impl Db for Sqlite {
    async fn another(&self) -> Self {
        Self::open(self.1.clone()).await
    }

    fn follower(&self, guard: &BloomGuard) -> impl Follow {
        fast(bloom_guard_sqlx::sqlite::Follower::new(
            guard.clone(),
            self.0.clone(),
            items(),
        ))
    }

    async fn exec(&self, sql: &str) {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
            .execute(&self.0)
            .await
            .unwrap_or_else(|error| panic!("{sql}: {error}"));
    }

    async fn snapshots(&self) -> i64 {
        sqlx::query_scalar("select count(*) from bloom_guard_snapshots")
            .fetch_one(&self.0)
            .await
            .expect("count")
    }

    async fn drop_insert_trigger(&self) {
        self.exec("drop trigger bloom_guard_items_inserted").await;
    }

    async fn watch_again(&self) {
        items().install(&self.0).await.expect("watch items");
    }

    async fn kill_other_sessions(&self) -> u64 {
        0
    }
}

struct MySql(MySqlPool);

impl MySql {
    async fn fresh() -> Self {
        Self(common::mysql::fresh(8).await)
    }
}

impl Db for MySql {
    async fn another(&self) -> Self {
        Self(
            MySqlPool::connect_with((*self.0.connect_options()).clone())
                .await
                .expect("connect"),
        )
    }

    fn follower(&self, guard: &BloomGuard) -> impl Follow {
        fast(bloom_guard_sqlx::mysql::Follower::new(
            guard.clone(),
            self.0.clone(),
            items(),
        ))
    }

    async fn exec(&self, sql: &str) {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
            .execute(&self.0)
            .await
            .unwrap_or_else(|error| panic!("{sql}: {error}"));
    }

    async fn snapshots(&self) -> i64 {
        sqlx::query_scalar("select count(*) from bloom_guard_snapshots")
            .fetch_one(&self.0)
            .await
            .expect("count")
    }

    async fn drop_insert_trigger(&self) {
        self.exec("drop trigger bloom_guard_items_inserted").await;
    }
    async fn watch_again(&self) {
        items().install(&self.0).await.expect("watch items");
    }

    async fn kill_other_sessions(&self) -> u64 {
        let ids: Vec<i64> = sqlx::query_scalar(
            "select cast(id as signed) from information_schema.processlist
              where db = database() and id <> connection_id()",
        )
        .fetch_all(&self.0)
        .await
        .expect("sessions");
        let mut killed = 0;
        for id in ids {
            // A session may end by itself meanwhile.
            if sqlx::raw_sql(sqlx::AssertSqlSafe(format!("kill {id}")))
                .execute(&self.0)
                .await
                .is_ok()
            {
                killed += 1;
            }
        }
        killed
    }
}

/// MySQL or MariaDB with `items` on the binary log feed. Its gap is the
/// table taken off the feed.
#[cfg(feature = "binlog-feed")]
struct MySqlLog {
    db: MySql,
    url: String,
}

#[cfg(feature = "binlog-feed")]
impl MySqlLog {
    async fn fresh() -> Self {
        let url = std::env::var("MYSQL_URL").expect("MYSQL_URL");
        let options = sqlx::mysql::MySqlConnectOptions::from_str(&url).expect("MYSQL_URL");
        let name = database_name();
        let mut admin = options.connect().await.expect("connect to MySQL");
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("create database {name}")))
            .execute(&mut admin)
            .await
            .expect("create the test database");
        let _ = admin.close().await;
        let pool = MySqlPool::connect_with(options.database(&name))
            .await
            .expect("connect to the test database");
        let db = MySql(pool);
        db.exec(
            "create table items (id bigint auto_increment primary key,
                                 code varchar(200) collate utf8mb4_nopad_bin not null)",
        )
        .await;
        items()
            .install_log(&db.0)
            .await
            .expect("items on the binary log feed");
        let (base, _) = url.rsplit_once('/').expect("a database in MYSQL_URL");
        Self {
            db,
            url: format!("{base}/{name}"),
        }
    }
}

#[cfg(feature = "binlog-feed")]
impl Db for MySqlLog {
    fn caught_up_by_a_producer(&self) -> bool {
        true
    }

    async fn another(&self) -> Self {
        Self {
            db: self.db.another().await,
            url: self.url.clone(),
        }
    }

    fn follower(&self, guard: &BloomGuard) -> impl Follow {
        fast(bloom_guard_sqlx::mysql::log::Follower::new(
            guard.clone(),
            self.db.0.clone(),
            items(),
            &self.url,
        ))
    }

    async fn exec(&self, sql: &str) {
        self.db.exec(sql).await;
    }

    async fn snapshots(&self) -> i64 {
        self.db.snapshots().await
    }

    async fn drop_insert_trigger(&self) {
        items()
            .uninstall_log(&self.db.0)
            .await
            .expect("items off the binary log feed");
    }

    async fn watch_again(&self) {
        items()
            .install_log(&self.db.0)
            .await
            .expect("items on the binary log feed");
    }

    async fn kill_other_sessions(&self) -> u64 {
        // The producer's stream and its election's connection too.
        self.db.kill_other_sessions().await
    }
}
