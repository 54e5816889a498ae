//! The service with `BLOOM_FEED=log` on Postgres (`wal_level=logical`) and
//! on MySQL or MariaDB (the binary log in `ROW` format): its tables go on
//! the log feed at start, with no trigger on them; a key written by any
//! SQL client is served at once, and a deleted one refused.

use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use items_service::config::Feed;
use items_service::{app, prepare, AppState, Config, Database, Pool};
use sqlx::PgPool;
use tower::ServiceExt;

/// Drops the test database's slots when the test ends, also when it
/// fails: a slot left behind keeps the server's log and its database.
struct Slots {
    url: String,
}

impl Drop for Slots {
    fn drop(&mut self) {
        let sql = "select pg_terminate_backend(active_pid) from pg_replication_slots \
                    where database = current_database() and active_pid is not null; \
                   select pg_sleep(0.3); \
                   select pg_drop_replication_slot(slot_name) from pg_replication_slots \
                    where database = current_database();";
        let _ = std::process::Command::new("psql")
            .arg(&self.url)
            .args(["-qAt", "-c", sql])
            .output();
    }
}

/// `DATABASE_URL` naming the test's database.
async fn url_of(pool: &PgPool) -> String {
    let database: String = sqlx::query_scalar("select current_database()")
        .fetch_one(pool)
        .await
        .expect("database name");
    let url = std::env::var("DATABASE_URL").expect("DATABASE_URL");
    let base = url.split_once('?').map_or(&*url, |(base, _)| base);
    let server = base.rsplit_once('/').map_or(base, |(server, _)| server);
    format!("{server}/{database}")
}

async fn status(app: &axum::Router, path: &str) -> StatusCode {
    let request = Request::get(path).body(Body::empty()).expect("request");
    app.clone()
        .oneshot(request)
        .await
        .expect("infallible")
        .status()
}

#[sqlx::test(migrations = "../../migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn keys_written_by_sql_reach_the_guard_through_the_log(pool: PgPool) {
    let url = url_of(&pool).await;
    let _slots = Slots { url: url.clone() };
    let mut config = Config::from_env().expect("config");
    config.audit_rate = 0.0;
    config.database_url = Some(url);
    config.feed = Feed::Log;
    sqlx::query("insert into items (key) values ('apple')")
        .execute(&pool)
        .await
        .expect("seed");
    let guards = items_service::guards(&config);
    let state = AppState::new(
        Database::from_pool(Pool::Postgres(pool.clone())),
        Some(guards),
    );
    prepare(state.clone()).await;
    let app = app(state.clone());
    let triggers: i64 = sqlx::query_scalar(
        "select count(*) from pg_trigger where tgrelid in ('items'::regclass, 'users'::regclass)
            and not tgisinternal",
    )
    .fetch_one(&pool)
    .await
    .expect("triggers");
    assert_eq!(
        triggers, 0,
        "a table on the log feed has no trigger of ours"
    );
    assert_eq!(status(&app, "/items/apple").await, StatusCode::OK);
    assert_eq!(status(&app, "/items/never").await, StatusCode::NOT_FOUND);
    for i in 0..50 {
        let key = format!("by-sql-{i}");
        sqlx::query("insert into items (key) values ($1)")
            .bind(&key)
            .execute(&pool)
            .await
            .expect("insert");
        assert_eq!(
            status(&app, &format!("/items/{key}")).await,
            StatusCode::OK,
            "{key}"
        );
    }
    sqlx::query("delete from items where key = 'apple'")
        .execute(&pool)
        .await
        .expect("delete");
    let guards = state.guards.clone().expect("guarded");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let before = guards.items.stats().rejected;
        let _ = status(&app, "/items/apple").await;
        if guards.items.stats().rejected > before {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the deleted key still passes"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[sqlx::test(migrations = "../../migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn an_unguarded_instance_on_the_log_feed_starts_beside_a_guarded_one(pool: PgPool) {
    let url = url_of(&pool).await;
    let _slots = Slots { url: url.clone() };
    let mut config = Config::from_env().expect("config");
    config.database_url = Some(url);
    config.feed = Feed::Log;
    let guarded = AppState::new(
        Database::from_pool(Pool::Postgres(pool.clone())),
        Some(items_service::guards(&config)),
    );
    prepare(guarded).await;
    // BLOOM_GUARD=off with BLOOM_FEED=log: it installs the log feed too,
    // not the triggers the log-fed tables refuse (which stopped it).
    let unguarded =
        AppState::new(Database::from_pool(Pool::Postgres(pool.clone())), None).with_feed(Feed::Log);
    tokio::time::timeout(Duration::from_secs(30), prepare(unguarded))
        .await
        .expect("the unguarded instance starts");
    let triggers: i64 = sqlx::query_scalar(
        "select count(*) from pg_trigger where tgrelid = 'items'::regclass and not tgisinternal",
    )
    .fetch_one(&pool)
    .await
    .expect("triggers");
    assert_eq!(triggers, 0);
}

/// A database of its own on `MYSQL_URL`'s server, and its URL.
async fn mysql_database() -> (sqlx::MySqlPool, String) {
    use sqlx::{ConnectOptions as _, Connection as _};
    let url = std::env::var("MYSQL_URL").expect("MYSQL_URL");
    let options: sqlx::mysql::MySqlConnectOptions = url.parse().expect("MYSQL_URL");
    let name = format!("items_service_binlog_{}", fastrand::u64(..));
    let mut admin = options.connect().await.expect("connect to MySQL");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("create database {name}")))
        .execute(&mut admin)
        .await
        .expect("create the test database");
    let _ = admin.close().await;
    let pool = sqlx::MySqlPool::connect_with(options.database(&name))
        .await
        .expect("connect to the test database");
    let (server, _) = url.rsplit_once('/').expect("a database in MYSQL_URL");
    (pool, format!("{server}/{name}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(mysql_database), ignore = "needs MySQL or MariaDB: set MYSQL_URL")]
async fn on_mysql_keys_written_by_sql_reach_the_guard_through_the_binary_log() {
    let (pool, url) = mysql_database().await;
    let mut config = Config::from_env().expect("config");
    config.audit_rate = 0.0;
    config.database_url = Some(url);
    config.feed = Feed::Log;
    let state = AppState::new(
        Database::from_pool(Pool::MySql(pool.clone())),
        Some(items_service::guards(&config)),
    );
    tokio::time::timeout(Duration::from_secs(60), prepare(state.clone()))
        .await
        .expect("the service starts on the binary log feed");
    let app = app(state.clone());
    let triggers: i64 = sqlx::query_scalar(
        "select count(*) from information_schema.triggers where trigger_schema = database()",
    )
    .fetch_one(&pool)
    .await
    .expect("triggers");
    assert_eq!(triggers, 0, "a table on the binary log feed has no trigger");
    assert_eq!(status(&app, "/items/never").await, StatusCode::NOT_FOUND);
    for i in 0..50 {
        let key = format!("by-sql-{i}");
        sqlx::query("insert into items (`key`) values (?)")
            .bind(&key)
            .execute(&pool)
            .await
            .expect("insert");
        assert_eq!(
            status(&app, &format!("/items/{key}")).await,
            StatusCode::OK,
            "{key}"
        );
    }
    sqlx::query("delete from items where `key` = 'by-sql-0'")
        .execute(&pool)
        .await
        .expect("delete");
    let guards = state.guards.clone().expect("guarded");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let before = guards.items.stats().rejected;
        let _ = status(&app, "/items/by-sql-0").await;
        if guards.items.stats().rejected > before {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the deleted key still passes"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
