//! Two instances of the service on one database, through their admin APIs:
//! a mode switched on one is in force on the other, and each lists the
//! fleet, both instances and then one after the other stops.

use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use items_service::{admin_app, prepare, AppState, Config, Database, Pool};
use serde_json::Value;
use sqlx::PgPool;
use tower::ServiceExt;

async fn call(admin: &Router, method: &str, uri: &str, body: &str) -> (StatusCode, Value) {
    let request = Request::builder()
        .method(method)
        .uri(uri)
        .header(header::AUTHORIZATION, "Bearer secret")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_owned()))
        .expect("valid request");
    let response = admin.clone().oneshot(request).await.expect("infallible");
    let status = response.status();
    let bytes = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

/// A ready instance named `name`, and its admin API.
async fn instance(db: Database, name: &str) -> (Router, AppState) {
    let mut config = Config::from_env().expect("default config");
    config.instance = Some(name.to_owned());
    let state = AppState::new(db, Some(items_service::guards(&config)));
    prepare(state.clone()).await;
    (admin_app(&state, "secret", None), state)
}

/// Waits until `check` holds of what `uri` answers on `admin`.
async fn until(admin: &Router, uri: &str, what: &str, check: impl Fn(&Value) -> bool) -> Value {
    until_within(admin, uri, what, Duration::from_secs(5), check).await
}

/// [`until`], waiting up to `limit`.
async fn until_within(
    admin: &Router,
    uri: &str,
    what: &str,
    limit: Duration,
    check: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let (status, body) = call(admin, "GET", uri, "").await;
        if status == StatusCode::OK && check(&body) {
            return body;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: {status} {body}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn ids(view: &Value) -> Vec<&str> {
    view["instances"]
        .as_array()
        .map(|instances| instances.iter().filter_map(|i| i["id"].as_str()).collect())
        .unwrap_or_default()
}

async fn one_switch_and_one_view(first: Database, second: Database) {
    let (one_admin, _one) = instance(first, "one").await;
    let (two_admin, two) = instance(second, "two").await;

    let (status, stats) = call(
        &one_admin,
        "PUT",
        "/admin/bloom/items/mode",
        r#"{"mode":"shadow"}"#,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{stats}");
    until(
        &two_admin,
        "/admin/bloom/items",
        "shadow on the other instance",
        |stats| stats["mode"] == "shadow" && stats["mode_set_by"] == "fleet",
    )
    .await;
    let (_, users) = call(&two_admin, "GET", "/admin/bloom/users", "").await;
    assert_eq!(users["mode"], "enforce", "another guard keeps its mode");

    let view = until(
        &two_admin,
        "/admin/bloom/items/fleet",
        "both instances",
        |view| ids(view) == ["one", "two"],
    )
    .await;
    for instance in view["instances"].as_array().expect("a list") {
        for field in [
            "state",
            "mode",
            "generation",
            "origin",
            "keys",
            "estimated_fpp",
            "passed",
            "rejected",
            "false_negatives",
            "feed_age_ms",
            "seen_ago_ms",
            "version",
        ] {
            assert!(instance.get(field).is_some(), "{field} in {instance}");
        }
    }

    two.shut_down().await;
    // A stopping instance removes its heartbeat, waiting at most 2 s for
    // the database (on a loaded machine a SQLite file's write lock can
    // take longer); a heartbeat not removed expires after 30 s.
    until_within(
        &one_admin,
        "/admin/bloom/items/fleet",
        "one instance after a stop",
        Duration::from_secs(35),
        |view| ids(view) == ["one"],
    )
    .await;
}

#[tokio::test]
async fn sqlite_one_switch_reaches_every_instance_and_the_view_lists_them() {
    let path = std::env::temp_dir().join(format!("items-service-fleet-{}.db", fastrand::u64(..)));
    let path = path.to_str().expect("utf-8 temp path");
    let first = Database::sqlite(path).await.expect("sqlite");
    let second = Database::sqlite(path).await.expect("sqlite");
    one_switch_and_one_view(first, second).await;
    let _ = std::fs::remove_file(path);
}

#[sqlx::test(migrations = "../../migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn postgres_one_switch_reaches_every_instance_and_the_view_lists_them(pool: PgPool) {
    let options = pool.connect_options().as_ref().clone();
    let other = sqlx::postgres::PgPoolOptions::new()
        .max_connections(5)
        .connect_with(options)
        .await
        .expect("a second pool");
    one_switch_and_one_view(
        Database::from_pool(Pool::Postgres(pool)),
        Database::from_pool(Pool::Postgres(other)),
    )
    .await;
}

/// MySQL and MariaDB have no notifications: the wake-up poller sees the
/// stored settings change and announces it to every follower.
#[tokio::test]
#[cfg_attr(not(mysql_database), ignore = "needs MySQL or MariaDB: set MYSQL_URL")]
async fn mysql_one_switch_reaches_every_instance_and_the_view_lists_them() {
    use std::str::FromStr;

    use sqlx::{ConnectOptions, Connection};
    let url = std::env::var("MYSQL_URL").expect("MYSQL_URL");
    let options = sqlx::mysql::MySqlConnectOptions::from_str(&url).expect("MYSQL_URL");
    let name = format!("items_service_fleet_{}", fastrand::u64(..));
    let mut admin = options.connect().await.expect("connect to MySQL");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("create database {name}")))
        .execute(&mut admin)
        .await
        .expect("create the test database");
    let _ = admin.close().await;
    let pool = |options: sqlx::mysql::MySqlConnectOptions| async move {
        sqlx::MySqlPool::connect_with(options)
            .await
            .expect("connect to the test database")
    };
    let first = Database::from_pool(Pool::MySql(pool(options.clone().database(&name)).await));
    first.migrate().await.expect("migrate");
    let second = Database::from_pool(Pool::MySql(pool(options.clone().database(&name)).await));
    one_switch_and_one_view(first, second).await;
}
