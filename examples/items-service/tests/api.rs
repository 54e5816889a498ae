//! The items API through `oneshot`, on SQLite always and on Postgres when
//! `DATABASE_URL` is set.

use std::str::FromStr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use items_service::{app, prepare, AppState, Config, Database, Pool};
use sqlx::PgPool;
use tower::ServiceExt;

struct Response {
    status: StatusCode,
    headers: axum::http::HeaderMap,
    body: String,
}

async fn send(app: &Router, request: Request<Body>) -> Response {
    let response = app.clone().oneshot(request).await.expect("infallible");
    let (parts, body) = response.into_parts();
    let body = body.collect().await.expect("body").to_bytes();
    Response {
        status: parts.status,
        headers: parts.headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

async fn get(app: &Router, path: &str) -> Response {
    send(
        app,
        Request::get(path)
            .body(Body::empty())
            .expect("valid request"),
    )
    .await
}

async fn post_json(app: &Router, body: &str) -> Response {
    let request = Request::post("/items")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_owned()))
        .expect("valid request");
    send(app, request).await
}

/// The default configuration without audits: the tests count rejections
/// exactly, and an audit passes one in a thousand on.
fn test_config() -> Config {
    let mut config = Config::from_env().expect("default config");
    config.audit_rate = 0.0;
    config
}

/// A migrated SQLite database in a file of its own, seeded with demo items.
async fn sqlite() -> Database {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let path = std::env::temp_dir().join(format!(
        "items-service-test-{}-{}.db",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::SeqCst)
    ));
    let _ = std::fs::remove_file(&path);
    Database::sqlite(path.to_str().expect("utf-8 temp path"))
        .await
        .expect("sqlite")
}

/// Postgres, migrated by `sqlx::test`, with the demo keys.
async fn postgres(pool: PgPool) -> Database {
    for key in ["apple", "banana", "cherry"] {
        sqlx::query("insert into items (key, value) values ($1, 'fruit')")
            .bind(key)
            .execute(&pool)
            .await
            .expect("seed");
    }
    Database::from_pool(Pool::Postgres(pool))
}

/// MySQL or MariaDB: a database of the test's own on the `MYSQL_URL`
/// server, migrated, with the demo keys.
async fn mysql() -> Database {
    mysql_with_charset("utf8mb4").await
}

/// As [`mysql`], on a database whose default character set is `charset`.
async fn mysql_with_charset(charset: &str) -> Database {
    use sqlx::{ConnectOptions, Connection};
    let url = std::env::var("MYSQL_URL").expect("MYSQL_URL");
    let options = sqlx::mysql::MySqlConnectOptions::from_str(&url).expect("MYSQL_URL");
    let name = format!("items_service_test_{}", fastrand::u64(..));
    let mut admin = options.connect().await.expect("connect to MySQL");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "create database {name} character set {charset}"
    )))
    .execute(&mut admin)
    .await
    .expect("create the test database");
    let _ = admin.close().await;
    let pool = sqlx::MySqlPool::connect_with(options.database(&name))
        .await
        .expect("connect to the test database");
    let db = Database::from_pool(Pool::MySql(pool.clone()));
    db.migrate().await.expect("migrate");
    for key in ["apple", "banana", "cherry"] {
        sqlx::query("insert into items (`key`, value) values (?, 'fruit')")
            .bind(key)
            .execute(&pool)
            .await
            .expect("seed");
    }
    db
}

/// The app, with its guard warm.
async fn ready_app(db: Database) -> (Router, AppState) {
    let guard = items_service::guards(&test_config());
    let state = AppState::new(db, Some(guard));
    prepare(state.clone()).await;
    (app(state.clone()), state)
}

async fn existing_and_absent_keys(db: Database) {
    let (app, state) = ready_app(db).await;
    let found = get(&app, "/items/apple").await;
    assert_eq!(found.status, StatusCode::OK);
    assert!(found.body.contains(r#""key":"apple""#), "{}", found.body);

    let lookups = state.db.lookups();
    for i in 0..50 {
        let absent = get(&app, &format!("/items/absent-{i}")).await;
        assert_eq!(absent.status, StatusCode::NOT_FOUND);
        assert_eq!(absent.body, r#"{"error":"not found"}"#);
    }
    assert_eq!(
        state.db.lookups(),
        lookups,
        "an absent key reached the database"
    );
}

/// MariaDB's default collation on the items key: the start reads it
/// (`guards_for`), and the guard finds every spelling the database finds
/// while it still answers absent keys itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(mysql_database), ignore = "needs MySQL or MariaDB: set MYSQL_URL")]
async fn mysql_keys_under_the_default_collation() {
    let db = mysql().await;
    let Pool::MySql(pool) = db.pool().clone() else {
        unreachable!("a MySQL database");
    };
    sqlx::raw_sql(
        "alter table items modify `key` varchar(255) character set utf8mb4 collate utf8mb4_general_ci not null;
         insert into items (`key`, value) values ('Apple-Pie', 'pie'), ('cafe', 'coffee');",
    )
    .execute(&pool)
    .await
    .expect("the column altered");
    // Watching again installs the triggers for the altered column.
    db.migrate().await.expect("migrate");
    let guards = items_service::guards_for(&test_config(), &db)
        .await
        .expect("the key type");
    assert!(
        matches!(guards.items.key_type(), bloom_guard::KeyType::Collated(_)),
        "{:?}",
        guards.items.key_type()
    );
    let state = AppState::new(db, Some(guards));
    prepare(state.clone()).await;
    let app = app(state.clone());
    for (spelling, stored) in [
        ("apple-pie", "Apple-Pie"),
        ("APPLE-PIE", "Apple-Pie"),
        ("Apple-Pie%20", "Apple-Pie"),
        ("caf%C3%A9", "cafe"),
        ("cafe%20", "cafe"),
        ("APPLE", "apple"),
    ] {
        let found = get(&app, &format!("/items/{spelling}")).await;
        assert_eq!(found.status, StatusCode::OK, "{spelling}");
        assert!(found.body.contains(stored), "{spelling}: {}", found.body);
    }
    let lookups = state.db.lookups();
    for i in 0..100 {
        let absent = get(&app, &format!("/items/absent-{i}")).await;
        assert_eq!(absent.status, StatusCode::NOT_FOUND);
    }
    assert!(
        state.db.lookups() - lookups <= 1,
        "{} absent keys reached the database",
        state.db.lookups() - lookups
    );
}

async fn created_key_is_found_at_once(db: Database) {
    let (app, state) = ready_app(db).await;
    // A miss first, so a negative entry could hide the new key.
    state.guards.as_ref().expect("guarded").items.insert("kiwi");
    assert_eq!(get(&app, "/items/kiwi").await.status, StatusCode::NOT_FOUND);

    let created = post_json(&app, r#"{"key":"kiwi","value":"green"}"#).await;
    assert_eq!(created.status, StatusCode::CREATED);
    assert_eq!(created.body, r#"{"key":"kiwi","value":"green"}"#);
    let found = get(&app, "/items/kiwi").await;
    assert_eq!(
        (found.status, found.body.as_str()),
        (StatusCode::OK, r#"{"key":"kiwi","value":"green"}"#)
    );

    let awkward = post_json(&app, r#"{"key":"tab\there/ü"}"#).await;
    assert_eq!(awkward.status, StatusCode::CREATED);
    assert_eq!(
        get(&app, "/items/tab%09here%2F%C3%BC").await.status,
        StatusCode::OK
    );
}

async fn concurrent_requests_share_one_query(db: Database) {
    let (app, state) = ready_app(db).await;
    let before = state.db.lookups();
    let requests = (0..100).map(|_| {
        let app = app.clone();
        tokio::spawn(async move { get(&app, "/items/banana").await.status })
    });
    for status in futures_util::future::join_all(requests).await {
        assert_eq!(status.expect("request task"), StatusCode::OK);
    }
    assert_eq!(state.db.lookups() - before, 1);
}

async fn false_positives_are_negative_cached(db: Database) {
    let (app, state) = ready_app(db).await;
    // In the filter, not in the database: exactly what a false positive is.
    state
        .guards
        .as_ref()
        .expect("guarded")
        .items
        .insert("ghost");
    let before = state.db.lookups();
    for _ in 0..10 {
        assert_eq!(
            get(&app, "/items/ghost").await.status,
            StatusCode::NOT_FOUND
        );
    }
    assert_eq!(state.db.lookups() - before, 1);
    assert_eq!(state.cache.stats().negative_hits, 9);
    let stats = state.guards.as_ref().expect("guarded").items.stats();
    assert_eq!(
        stats.false_positives, 1,
        "the false positive was not reported"
    );
    assert!(stats.observed_fpp > 0.0);
}

#[tokio::test]
async fn sqlite_existing_and_absent_keys() {
    existing_and_absent_keys(sqlite().await).await;
}

#[tokio::test]
async fn sqlite_created_key_is_found_at_once() {
    created_key_is_found_at_once(sqlite().await).await;
}

#[tokio::test]
async fn sqlite_concurrent_requests_share_one_query() {
    concurrent_requests_share_one_query(sqlite().await).await;
}

#[tokio::test]
async fn sqlite_false_positives_are_negative_cached() {
    false_positives_are_negative_cached(sqlite().await).await;
}

#[tokio::test]
#[cfg_attr(not(mysql_database), ignore = "needs MySQL or MariaDB: set MYSQL_URL")]
async fn mysql_existing_and_absent_keys() {
    existing_and_absent_keys(mysql().await).await;
}

#[tokio::test]
#[cfg_attr(not(mysql_database), ignore = "needs MySQL or MariaDB: set MYSQL_URL")]
async fn mysql_created_key_is_found_at_once() {
    created_key_is_found_at_once(mysql().await).await;
}

#[tokio::test]
#[cfg_attr(not(mysql_database), ignore = "needs MySQL or MariaDB: set MYSQL_URL")]
async fn mysql_concurrent_requests_share_one_query() {
    concurrent_requests_share_one_query(mysql().await).await;
}

#[tokio::test]
#[cfg_attr(not(mysql_database), ignore = "needs MySQL or MariaDB: set MYSQL_URL")]
async fn mysql_false_positives_are_negative_cached() {
    false_positives_are_negative_cached(mysql().await).await;
}

#[tokio::test]
#[cfg_attr(not(mysql_database), ignore = "needs MySQL or MariaDB: set MYSQL_URL")]
async fn mysql_the_guard_answers_every_path_as_the_unguarded_service_does() {
    the_guard_answers_every_path_as_the_unguarded_service_does(mysql().await).await;
}

#[tokio::test]
#[cfg_attr(not(mysql_database), ignore = "needs MySQL or MariaDB: set MYSQL_URL")]
async fn mysql_users_have_typed_ids() {
    users_have_typed_ids(mysql().await).await;
}

#[tokio::test]
#[cfg_attr(not(mysql_database), ignore = "needs MySQL or MariaDB: set MYSQL_URL")]
async fn mysql_text_of_any_language_on_a_latin1_database_and_users_written_by_sql() {
    let db = mysql_with_charset("latin1").await;
    let Pool::MySql(pool) = db.pool().clone() else {
        unreachable!("a MySQL database")
    };
    let (app, _state) = ready_app(db).await;
    let created = post_json(&app, r#"{"key":"crab","value":"🦀 ünïcödé 漢字"}"#).await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.body);
    let found = get(&app, "/items/crab").await;
    assert_eq!(found.status, StatusCode::OK);
    assert!(found.body.contains("🦀 ünïcödé 漢字"), "{}", found.body);
    let named = send_json(&app, "POST", "/users", r#"{"name":"Łukasz 🦀"}"#).await;
    assert_eq!(named.status, StatusCode::CREATED, "{}", named.body);
    // A user written by SQL without an id gets one, as on Postgres.
    sqlx::query("insert into users (name) values ('by sql')")
        .execute(&pool)
        .await
        .expect("a user without an id");
    let id: String = sqlx::query_scalar("select cast(id as char) from users where name = 'by sql'")
        .fetch_one(&pool)
        .await
        .expect("its id");
    uuid::Uuid::parse_str(&id).expect("a uuid");
    let found = get(&app, &format!("/users/{id}")).await;
    assert_eq!(found.status, StatusCode::OK, "{}", found.body);
}

#[sqlx::test(migrations = "../../migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn postgres_existing_and_absent_keys(pool: PgPool) {
    existing_and_absent_keys(postgres(pool).await).await;
}

#[sqlx::test(migrations = "../../migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn postgres_created_key_is_found_at_once(pool: PgPool) {
    created_key_is_found_at_once(postgres(pool).await).await;
}

#[sqlx::test(migrations = "../../migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn postgres_concurrent_requests_share_one_query(pool: PgPool) {
    concurrent_requests_share_one_query(postgres(pool).await).await;
}

#[sqlx::test(migrations = "../../migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn postgres_false_positives_are_negative_cached(pool: PgPool) {
    false_positives_are_negative_cached(postgres(pool).await).await;
}

#[tokio::test]
async fn guard_and_database_misses_are_byte_identical() {
    let (app, state) = ready_app(sqlite().await).await;
    state
        .guards
        .as_ref()
        .expect("guarded")
        .items
        .insert("ghost");
    let from_database = get(&app, "/items/ghost").await;
    let from_guard = get(&app, "/items/never-stored").await;
    assert_eq!(
        state
            .guards
            .as_ref()
            .expect("guarded")
            .items
            .stats()
            .rejected,
        1
    );
    assert_eq!(from_guard.status, from_database.status);
    assert_eq!(from_guard.headers, from_database.headers);
    assert_eq!(from_guard.body, from_database.body);
}

#[tokio::test]
async fn bad_input_gets_a_json_4xx() {
    let (app, _) = ready_app(sqlite().await).await;
    let long_key = "k".repeat(513);
    let cases = [
        post_json(&app, "not json").await,
        post_json(&app, r#"{"key": 42}"#).await,
        post_json(&app, r#"{"value": "no key"}"#).await,
        post_json(&app, r#"{"key": ""}"#).await,
        post_json(&app, r#"{"key": "nul\u0000byte"}"#).await,
        post_json(&app, &format!(r#"{{"key": "{long_key}"}}"#)).await,
        post_json(&app, r#"{"key": "apple"}"#).await,
        post_json(
            &app,
            &format!(r#"{{"key": "big", "value": "{}"}}"#, "v".repeat(20_000)),
        )
        .await,
        send(
            &app,
            Request::post("/items")
                .body(Body::empty())
                .expect("valid request"),
        )
        .await,
        get(&app, &format!("/items/{long_key}")).await,
        get(&app, "/items/%FF%FE").await,
    ];
    for (i, response) in cases.iter().enumerate() {
        assert!(
            response.status.is_client_error(),
            "case {i}: {}",
            response.status
        );
        let json: serde_json::Value = serde_json::from_str(&response.body)
            .unwrap_or_else(|_| panic!("case {i}: not JSON: {}", response.body));
        assert!(json["error"].is_string(), "case {i}: {}", response.body);
    }
    assert_eq!(cases[6].status, StatusCode::CONFLICT);
    assert_eq!(cases[7].status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(
        get(&app, "/items/big").await.status,
        StatusCode::NOT_FOUND,
        "a refused body was written"
    );
}

#[tokio::test]
async fn bad_keys_get_a_json_4xx_on_every_item_route() {
    for guarded in [true, false] {
        let db = sqlite().await;
        let guard = guarded.then(|| items_service::guards(&test_config()));
        let state = AppState::new(db, guard);
        prepare(state.clone()).await;
        let app = app(state.clone());
        let long_key = "k".repeat(513);
        let bad_paths = [
            format!("/items/{long_key}"),
            "/items/%FF%FE".to_owned(),
            "/items/nul%00byte".to_owned(),
        ];
        // Odd, but keys like any other: absent, so 404.
        let odd_paths = [
            "/items/%zz",
            "/items/100%",
            "/items/%2E%2E",
            "/items/.",
            "/items/x%2",
        ];
        for path in bad_paths.iter().map(String::as_str).chain(odd_paths) {
            for method in ["GET", "DELETE"] {
                let request = Request::builder()
                    .method(method)
                    .uri(path)
                    .body(Body::empty())
                    .expect("valid request");
                let response = send(&app, request).await;
                let what = format!("{method} {path} (guarded: {guarded})");
                if odd_paths.contains(&path) {
                    assert_eq!(response.status, StatusCode::NOT_FOUND, "{what}");
                } else {
                    // The handler's 400, or the guard's 404 for a key no
                    // row can hold (NUL): a 4xx either way.
                    assert!(
                        response.status.is_client_error(),
                        "{what}: {}",
                        response.status
                    );
                }
                let json: serde_json::Value = serde_json::from_str(&response.body)
                    .unwrap_or_else(|_| panic!("{what}: not JSON: {}", response.body));
                assert!(json["error"].is_string(), "{what}: {}", response.body);
            }
        }
        // Still healthy, nothing written.
        assert_eq!(get(&app, "/readyz").await.status, StatusCode::OK);
        assert_eq!(get(&app, "/items/apple").await.status, StatusCode::OK);
    }
}

#[tokio::test]
async fn delete_removes_the_item_and_its_cache_entry() {
    let (app, _) = ready_app(sqlite().await).await;
    assert_eq!(get(&app, "/items/cherry").await.status, StatusCode::OK);
    let request = Request::delete("/items/cherry")
        .body(Body::empty())
        .expect("valid request");
    assert_eq!(send(&app, request).await.status, StatusCode::NO_CONTENT);
    assert_eq!(
        get(&app, "/items/cherry").await.status,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn readyz_is_503_until_the_guard_is_warm() {
    let db = sqlite().await;
    let guard = items_service::guards(&test_config());
    let state = AppState::new(db, Some(guard));
    let app = app(state.clone());
    let warming = get(&app, "/readyz").await;
    assert_eq!(
        (warming.status, warming.body.as_str()),
        (
            StatusCode::SERVICE_UNAVAILABLE,
            r#"{"guard":"items","reason":"building the first filter","status":"warming"}"#
        )
    );
    // Fail open meanwhile: an existing key is served.
    assert_eq!(get(&app, "/items/apple").await.status, StatusCode::OK);
    assert_eq!(
        get(&app, "/items/absent").await.status,
        StatusCode::NOT_FOUND
    );
    prepare(state).await;
    assert_eq!(get(&app, "/readyz").await.status, StatusCode::OK);
}

#[tokio::test]
async fn without_the_guard_every_miss_reaches_the_database() {
    let db = sqlite().await;
    let state = AppState::new(db, None);
    prepare(state.clone()).await;
    let app = app(state.clone());
    assert_eq!(get(&app, "/readyz").await.status, StatusCode::OK);
    assert_eq!(get(&app, "/items/apple").await.status, StatusCode::OK);
    for i in 0..5 {
        assert_eq!(
            get(&app, &format!("/items/absent-{i}")).await.status,
            StatusCode::NOT_FOUND
        );
    }
    assert_eq!(state.db.lookups(), 6);
}

#[tokio::test]
async fn the_admin_api_is_only_on_the_admin_router() {
    let (app, state) = ready_app(sqlite().await).await;
    let authorized = |uri: &str, method: &str| {
        Request::builder()
            .method(method)
            .uri(uri)
            .header(header::AUTHORIZATION, "Bearer secret")
            .body(Body::empty())
            .expect("valid request")
    };
    for (method, uri) in [
        ("GET", "/admin/bloom"),
        ("POST", "/admin/bloom/rebuild"),
        ("GET", "/metrics"),
    ] {
        assert_eq!(
            send(&app, authorized(uri, method)).await.status,
            StatusCode::NOT_FOUND,
            "{uri} on the public port"
        );
    }
    let admin = items_service::admin_app(&state, "secret", None);
    let stats = send(&admin, authorized("/admin/bloom", "GET")).await;
    assert_eq!(stats.status, StatusCode::OK);
    assert!(stats.body.contains(r#""state":"ready""#), "{}", stats.body);
    let rebuilt = send(&admin, authorized("/admin/bloom/rebuild", "POST")).await;
    assert_eq!(rebuilt.status, StatusCode::OK, "{}", rebuilt.body);
    assert!(
        rebuilt.body.contains(r#""generation":2"#),
        "{}",
        rebuilt.body
    );
    let unauthorized = send(
        &admin,
        Request::get("/admin/bloom")
            .body(Body::empty())
            .expect("valid request"),
    )
    .await;
    assert_eq!(unauthorized.status, StatusCode::UNAUTHORIZED);
    assert!(!unauthorized.body.contains("secret"));
}

/// Writes `key` by plain SQL, as any other client of the database would.
async fn insert_by_sql(db: &Database, key: &str) {
    let sql = "insert into items (key) values ($1)";
    match db.pool() {
        Pool::Postgres(pool) => sqlx::query(sql).bind(key).execute(pool).await,
        Pool::Sqlite(pool) => sqlx::query(sql)
            .bind(key)
            .execute(pool)
            .await
            .map(|_| Default::default()),
        Pool::MySql(pool) => sqlx::query("insert into items (`key`) values (?)")
            .bind(key)
            .execute(pool)
            .await
            .map(|_| Default::default()),
    }
    .expect("insert by SQL");
}

/// The guard never refuses what the same service serves without it: every
/// path is answered as the unguarded service answers it, and every stored
/// key is served: keys the guard once refused (dot segments,
/// malformed escapes) included, written by POST or by plain SQL.
async fn the_guard_answers_every_path_as_the_unguarded_service_does(db: Database) {
    let unguarded = app(AppState::new(db.clone(), None));
    for key in ["100%", "%zz", "tab\there", "ü/🦀", "a+b", "..."] {
        let body = serde_json::json!({ "key": key }).to_string();
        assert_eq!(
            post_json(&unguarded, &body).await.status,
            StatusCode::CREATED
        );
    }
    for key in ["..", ".", "a%ZZ", "x%2", "edg\u{1}ecase"] {
        insert_by_sql(&db, key).await;
    }
    // Longer than the service serves: stored by SQL, refused by the
    // handler alike with and without the guard.
    insert_by_sql(&db, &"k".repeat(600)).await;
    let guarded = {
        let state = AppState::new(db, Some(items_service::guards(&test_config())));
        prepare(state.clone()).await;
        app(state)
    };
    let served = [
        "/items/apple",
        "/items/100%25",
        "/items/%25zz",
        "/items/tab%09here",
        "/items/%C3%BC%2F%F0%9F%A6%80",
        "/items/a+b",
        "/items/...",
        "/items/%2e%2e",
        "/items/%2E",
        "/items/a%ZZ",
        "/items/x%2",
        "/items/100%",
        "/items/edg%01ecase",
    ];
    for path in served {
        let (with, without) = (get(&guarded, path).await, get(&unguarded, path).await);
        assert_eq!(without.status, StatusCode::OK, "{path}: {}", without.body);
        assert_eq!(
            (with.status, with.body),
            (without.status, without.body),
            "{path}"
        );
    }
    let long_key = format!("/items/{}", "k".repeat(600));
    let refused = [
        "/items/absent",
        "/items/%zZ",
        "/items/%FF",
        "/items/%2e%2e%2e%2e",
        &long_key,
    ];
    for path in refused {
        let (with, without) = (get(&guarded, path).await, get(&unguarded, path).await);
        assert!(!without.status.is_success(), "{path}");
        assert_eq!(
            (with.status, with.body),
            (without.status, without.body),
            "{path}"
        );
    }
    // A key no row can hold: the handler's 400 unguarded, the guard's 404
    // (a layer answers before the handler's own checks; `Checked` would not).
    let with = get(&guarded, "/items/nul%00").await.status;
    let without = get(&unguarded, "/items/nul%00").await.status;
    assert!(with.is_client_error() && without.is_client_error());
}

#[tokio::test]
async fn sqlite_the_guard_answers_every_path_as_the_unguarded_service_does() {
    the_guard_answers_every_path_as_the_unguarded_service_does(sqlite().await).await;
}

#[sqlx::test(migrations = "../../migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn postgres_the_guard_answers_every_path_as_the_unguarded_service_does(pool: PgPool) {
    the_guard_answers_every_path_as_the_unguarded_service_does(postgres(pool).await).await;
}

/// An admin request with the token.
fn admin_request(uri: &str, method: &str) -> Request<Body> {
    Request::builder()
        .method(method)
        .uri(uri)
        .header(header::AUTHORIZATION, "Bearer secret")
        .body(Body::empty())
        .expect("valid request")
}

/// A rebuild asked through the admin API reads the keys as the follower
/// does: a BLOB key another SQLite client wrote is left out, not an error.
#[tokio::test]
async fn sqlite_admin_rebuilds_read_keys_as_the_follower_does() {
    let db = sqlite().await;
    let state = AppState::new(db.clone(), Some(items_service::guards(&test_config())));
    prepare(state.clone()).await;
    let Pool::Sqlite(pool) = db.pool() else {
        panic!("a SQLite database");
    };
    sqlx::query("insert into items (key) values (x'ff00')")
        .execute(pool)
        .await
        .expect("a BLOB key");
    let admin = items_service::admin_app(&state, "secret", None);
    let rebuilt = send(&admin, admin_request("/admin/bloom/rebuild", "POST")).await;
    assert_eq!(rebuilt.status, StatusCode::OK, "{}", rebuilt.body);
    let stats = send(&admin, admin_request("/admin/bloom/items", "GET")).await;
    let stats: serde_json::Value = serde_json::from_str(&stats.body).expect("JSON");
    // Left out of the scan (and counted again if the feed brought it too).
    assert!(stats["skipped_keys"].as_u64() >= Some(1), "{stats}");
    assert_eq!(stats["last_error"], serde_json::Value::Null, "{stats}");
    state.shut_down().await;
}

/// A rebuild that fails says why in the guard's stats, which its 503
/// points to.
#[sqlx::test(migrations = "../../migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn postgres_a_failed_admin_rebuild_shows_in_last_error(pool: PgPool) {
    let db = postgres(pool.clone()).await;
    let state = AppState::new(db, Some(items_service::guards(&test_config())));
    prepare(state.clone()).await;
    sqlx::query("alter table items rename to items_elsewhere")
        .execute(&pool)
        .await
        .expect("rename");
    let admin = items_service::admin_app(&state, "secret", None);
    let rebuilt = send(&admin, admin_request("/admin/bloom/items/rebuild", "POST")).await;
    assert_eq!(
        rebuilt.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        rebuilt.body
    );
    let stats = send(&admin, admin_request("/admin/bloom/items", "GET")).await;
    let stats: serde_json::Value = serde_json::from_str(&stats.body).expect("JSON");
    let error = stats["last_error"].as_str().unwrap_or_default();
    assert!(error.contains("items"), "{stats}");
    state.shut_down().await;
}

async fn send_json(app: &Router, method: &str, path: &str, body: &str) -> Response {
    let request = Request::builder()
        .method(method)
        .uri(path)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_owned()))
        .expect("valid request");
    send(app, request).await
}

/// `POST /users`, then `GET /users/{id}` in every form a UUID parser
/// accepts; a random id gets the `users` guard's 404, and only its
/// `rejected` grows.
async fn users_have_typed_ids(db: Database) {
    let (app, state) = ready_app(db).await;
    let created = send_json(&app, "POST", "/users", r#"{"name":"ada"}"#).await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.body);
    let user: serde_json::Value = serde_json::from_str(&created.body).expect("json");
    let id = user["id"].as_str().expect("id").to_owned();
    assert_eq!(user["name"], "ada");
    let uuid = uuid::Uuid::parse_str(&id).expect("a uuid");
    for form in [
        id.clone(),
        id.to_uppercase(),
        uuid.simple().to_string(),
        format!("%7B{id}%7D"),
    ] {
        let found = get(&app, &format!("/users/{form}")).await;
        assert_eq!(found.status, StatusCode::OK, "{form}");
        assert_eq!(found.body, format!(r#"{{"id":"{id}","name":"ada"}}"#));
    }
    let guards = state.guards.clone().expect("guarded");
    let (items_before, lookups) = (guards.items.stats().rejected, state.db.lookups());
    let random = get(&app, &format!("/users/{}", uuid::Uuid::new_v4())).await;
    assert_eq!(random.status, StatusCode::NOT_FOUND);
    assert_eq!(random.body, r#"{"error":"not found"}"#);
    assert_eq!(guards.users.stats().rejected, 1);
    assert_eq!(guards.items.stats().rejected, items_before);
    assert_eq!(
        state.db.lookups(),
        lookups,
        "the guard answered, not the database"
    );
    // Not a UUID: the handler's own 404.
    assert_eq!(
        get(&app, "/users/not-a-uuid").await.status,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn sqlite_users_have_typed_ids() {
    users_have_typed_ids(sqlite().await).await;
}

#[sqlx::test(migrations = "../../migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn postgres_users_have_typed_ids(pool: PgPool) {
    // A user written by plain SQL, in upper case, is found too.
    sqlx::query("insert into users (id) values ('A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11')")
        .execute(&pool)
        .await
        .expect("insert");
    let db = postgres(pool).await;
    let (app, _) = ready_app(db.clone()).await;
    let found = get(&app, "/users/A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11").await;
    assert_eq!(found.status, StatusCode::OK, "{}", found.body);
    users_have_typed_ids(db).await;
}

/// Every method but GET and HEAD gets exactly the unguarded service's
/// answer, on every guarded route, for present, absent and false-positive
/// keys.
#[tokio::test]
async fn only_reads_are_guarded() {
    let db = sqlite().await;
    let unguarded = app(AppState::new(db.clone(), None));
    let (guarded, state) = ready_app(db).await;
    let guards = state.guards.clone().expect("guarded");
    guards.items.insert("false-positive");
    guards.users.insert("6ba7b810-9dad-11d1-80b4-00c04fd430c8");
    let paths = [
        "/items/apple",
        "/items/absent",
        "/items/false-positive",
        "/users/6ba7b810-9dad-11d1-80b4-00c04fd430c8",
        "/users/a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
    ];
    for method in ["PUT", "PATCH", "POST", "OPTIONS", "TRACE"] {
        for path in paths {
            let (with, without) = (
                send_json(&guarded, method, path, "{}").await,
                send_json(&unguarded, method, path, "{}").await,
            );
            assert_eq!(
                (with.status, with.body),
                (without.status, without.body),
                "{method} {path}"
            );
        }
    }
    // DELETE changes data: the same status either way, on a fresh key each.
    for (i, app) in [&guarded, &unguarded].into_iter().enumerate() {
        let key = format!("deletable-{i}");
        post_json(app, &serde_json::json!({ "key": key }).to_string()).await;
        let deleted = send_json(app, "DELETE", &format!("/items/{key}"), "").await;
        assert_eq!(deleted.status, StatusCode::NO_CONTENT);
        let absent = send_json(app, "DELETE", "/items/never-there", "").await;
        assert_eq!(absent.status, StatusCode::NOT_FOUND);
    }
    assert_eq!(guards.items.stats().rejected, 0, "only reads are checked");
}

/// Input the database refuses is the client's to fix: a 4xx, nothing
/// written.
#[tokio::test]
async fn text_the_database_cannot_store_is_a_4xx() {
    let (app, state) = ready_app(sqlite().await).await;
    for (path, body) in [
        ("/items", r#"{"key":"x","value":"a\u0000b"}"#),
        ("/users", r#"{"name":"a\u0000b"}"#),
    ] {
        let response = send_json(&app, "POST", path, body).await;
        assert_eq!(
            response.status,
            StatusCode::BAD_REQUEST,
            "{path}: {}",
            response.body
        );
    }
    assert!(
        state.db.get("x").await.expect("get").is_none(),
        "nothing written"
    );
}

#[tokio::test]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn characters_a_latin1_database_cannot_hold_are_a_4xx() {
    let url = std::env::var("DATABASE_URL").expect("DATABASE_URL");
    let admin = PgPool::connect(&url).await.expect("connect");
    let name = format!("items_latin1_{}", std::process::id());
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "drop database if exists {name}"
    )))
    .execute(&admin)
    .await
    .expect("drop");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "create database {name} encoding 'LATIN1' lc_collate 'C' lc_ctype 'C' template template0"
    )))
    .execute(&admin)
    .await
    .expect("create a LATIN1 database");
    let pool = PgPool::connect_with((*admin.connect_options()).clone().database(&name))
        .await
        .expect("connect");
    let db = Database::from_pool(Pool::Postgres(pool.clone()));
    let (app, _) = ready_app(db.clone()).await;
    for (path, body) in [
        ("/items", r#"{"key":"snow-☃","value":"x"}"#),
        ("/items", r#"{"key":"ok","value":"🦀"}"#),
        ("/users", r#"{"name":"🦀"}"#),
    ] {
        let response = send_json(&app, "POST", path, body).await;
        assert!(
            response.status.is_client_error(),
            "{path} {body}: {}",
            response.status
        );
    }
    assert!(
        db.get("ok").await.expect("get").is_none(),
        "nothing written"
    );
    let fine = send_json(&app, "POST", "/items", r#"{"key":"café","value":"ü"}"#).await;
    assert_eq!(fine.status, StatusCode::CREATED);
    pool.close().await;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "drop database {name} with (force)"
    )))
    .execute(&admin)
    .await
    .expect("drop");
}

/// Rolling out: start in shadow mode, read what the guard would have done,
/// then enforce without a restart.
#[tokio::test]
async fn shadow_first_then_enforce_through_the_admin_api() {
    let mut config = test_config();
    config.mode = bloom_guard::Mode::Shadow;
    let state = AppState::new(sqlite().await, Some(items_service::guards(&config)));
    prepare(state.clone()).await;
    let app = app(state.clone());
    let admin = items_service::admin_app(&state, "secret", None);
    let admin_request = |method: &str, uri: &str, body: &str| {
        Request::builder()
            .method(method)
            .uri(uri)
            .header(header::AUTHORIZATION, "Bearer secret")
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(body.to_owned()))
            .expect("valid request")
    };
    let lookups = state.db.lookups();
    for i in 0..20 {
        assert_eq!(
            get(&app, &format!("/items/absent-{i}")).await.status,
            StatusCode::NOT_FOUND
        );
    }
    assert_eq!(get(&app, "/items/apple").await.status, StatusCode::OK);
    assert_eq!(
        state.db.lookups() - lookups,
        21,
        "shadow mode passes everything on"
    );
    let stats = send(&admin, admin_request("GET", "/admin/bloom/items", "")).await;
    let stats: serde_json::Value = serde_json::from_str(&stats.body).expect("json");
    assert_eq!(stats["mode"], "shadow");
    assert_eq!(stats["shadow_would_reject"], 20);
    assert_eq!(stats["shadow_false_negatives"], 0);

    let switched = send(
        &admin,
        admin_request("PUT", "/admin/bloom/items/mode", r#"{"mode":"enforce"}"#),
    )
    .await;
    assert_eq!(switched.status, StatusCode::OK, "{}", switched.body);
    let lookups = state.db.lookups();
    assert_eq!(
        get(&app, "/items/absent-x").await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        state.db.lookups(),
        lookups,
        "enforcing: answered by the guard"
    );
    let guards = state.guards.clone().expect("guarded");
    assert_eq!(guards.items.stats().rejected, 1);
    assert_eq!(
        guards.users.mode(),
        bloom_guard::Mode::Shadow,
        "one guard at a time"
    );
}

#[sqlx::test(migrations = "../../migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn postgres_demo_items_are_seeded_once_when_asked(pool: PgPool) {
    let db = Database::from_pool(Pool::Postgres(pool.clone()));
    db.seed_if_empty().await.expect("seed");
    db.seed_if_empty().await.expect("seed again");
    let count: i64 = sqlx::query_scalar("select count(*) from items")
        .fetch_one(&pool)
        .await
        .expect("count");
    assert_eq!(count, 5);
    assert!(db.get("apple").await.expect("get").is_some());
}

/// Deletes `key` by plain SQL, as any other client of the database would.
async fn delete_by_sql(db: &Database, key: &str) {
    match db.pool() {
        Pool::Postgres(pool) => sqlx::query("delete from items where key = $1")
            .bind(key)
            .execute(pool)
            .await
            .map(|_| ()),
        Pool::Sqlite(pool) => sqlx::query("delete from items where key = ?")
            .bind(key)
            .execute(pool)
            .await
            .map(|_| ()),
        Pool::MySql(pool) => sqlx::query("delete from items where `key` = ?")
            .bind(key)
            .execute(pool)
            .await
            .map(|_| ()),
    }
    .expect("delete by SQL");
}

/// Keys created through this instance and deleted by another client a
/// moment later are refused once the feed brings the deletes: the write
/// window lets a key go once its row was read, not 60 s after the POST.
async fn keys_created_here_and_deleted_elsewhere_are_refused(db: Database) {
    let (app, state) = ready_app(db.clone()).await;
    let keys: Vec<String> = (0..10).map(|i| format!("short-lived-{i}")).collect();
    for key in &keys {
        let body = serde_json::json!({ "key": key }).to_string();
        assert_eq!(post_json(&app, &body).await.status, StatusCode::CREATED);
        assert_eq!(
            get(&app, &format!("/items/{key}")).await.status,
            StatusCode::OK
        );
    }
    // The rows read by the follower, then deleted elsewhere.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for key in &keys {
        delete_by_sql(&db, key).await;
    }
    let guards = state.guards.clone().expect("guarded");
    // A wake-up that a loaded machine delays leaves the deletes to the
    // next poll of the feed (every 15 s): the bound is beyond it.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(25);
    loop {
        let before = guards.items.stats().rejected;
        let mut missing = 0;
        for key in &keys {
            missing += usize::from(
                get(&app, &format!("/items/{key}")).await.status == StatusCode::NOT_FOUND,
            );
        }
        let refused = guards.items.stats().rejected - before;
        if refused == keys.len() as u64 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{refused} of {} deleted keys refused by the guard ({missing} answered 404)",
            keys.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn sqlite_keys_created_here_and_deleted_elsewhere_are_refused() {
    keys_created_here_and_deleted_elsewhere_are_refused(sqlite().await).await;
}

#[sqlx::test(migrations = "../../migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn postgres_keys_created_here_and_deleted_elsewhere_are_refused(pool: PgPool) {
    keys_created_here_and_deleted_elsewhere_are_refused(postgres(pool).await).await;
}

#[tokio::test]
#[cfg_attr(not(mysql_database), ignore = "needs MySQL or MariaDB: set MYSQL_URL")]
async fn mysql_keys_created_here_and_deleted_elsewhere_are_refused() {
    keys_created_here_and_deleted_elsewhere_are_refused(mysql().await).await;
}
