//! Warm-up from real databases: every stored key passes the request path,
//! and absent keys are rejected at the target rate.

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use bloom_guard::{extract::PathParam, BloomGuard, KeySource};
use bloom_guard_sqlx::{postgres, QuerySource};
use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};
use proptest::prelude::*;
use sqlx::{PgPool, SqlitePool};
use tower::ServiceExt;

const TARGET_FPP: f64 = 0.001;
const KEYS: usize = 100_000;

/// Keys whose bytes COPY escapes or URLs encode.
const AWKWARD_KEYS: &[&str] = &[
    "tab\there",
    "new\nline",
    "carriage\rreturn",
    "back\\slash",
    "\\N",
    "\\.",
    "\\x41",
    "\u{8}\u{c}\u{b}",
    "a/b/c",
    "100%",
    "%2F",
    "plus+sign",
    "space key",
    "?query#fragment",
    "ü ünïcödé 🦀",
    "\u{1}\u{7f}",
];

fn generated_key(i: usize) -> String {
    format!("item-{i:06}")
}

fn absent_key(i: usize) -> String {
    format!("absent-{i:06}")
}

fn guard() -> BloomGuard {
    BloomGuard::builder()
        .false_positive_rate(TARGET_FPP)
        .build()
}

/// The guard in front of a handler that always finds the item.
fn app(guard: &BloomGuard) -> Router {
    Router::new()
        .route("/items/{key}", get(|| async { "found" }))
        .route_layer(guard.layer(PathParam("key")))
}

async fn status(app: &Router, key: &str) -> u16 {
    let uri = format!("/items/{}", utf8_percent_encode(key, NON_ALPHANUMERIC));
    let request = http::Request::get(uri)
        .body(Body::empty())
        .expect("valid request");
    app.clone()
        .oneshot(request)
        .await
        .expect("infallible")
        .status()
        .as_u16()
}

/// Warms a guard from `source` and checks every stored key and 100k absent ones.
async fn check_warm_up(source: impl KeySource, stored: Vec<String>) {
    let guard = guard();
    guard.clone().warm(source).await;
    let stats = guard.stats();
    assert_eq!(stats.generation, 1);
    assert!(stats.keys as usize >= stored.len() * 99 / 100, "{stats:?}");

    let false_negatives = stored
        .iter()
        .filter(|key| !guard.may_contain(key.as_str()))
        .count();
    assert_eq!(false_negatives, 0);
    let app = app(&guard);
    for key in AWKWARD_KEYS {
        assert_eq!(
            status(&app, key).await,
            200,
            "stored key {key:?} refused on the request path"
        );
    }

    let false_positives = (0..KEYS)
        .filter(|&i| guard.may_contain(absent_key(i)))
        .count();
    let rate = false_positives as f64 / KEYS as f64;
    assert!(
        rate <= 1.5 * TARGET_FPP,
        "false-positive rate {rate} over 1.5x the target {TARGET_FPP}"
    );
}

fn all_keys() -> Vec<String> {
    (0..KEYS)
        .map(generated_key)
        .chain(AWKWARD_KEYS.iter().map(|k| (*k).to_owned()))
        .collect()
}

async fn fill_postgres(pool: &PgPool, keys: &[String]) {
    sqlx::query("insert into items (key) select * from unnest($1::text[])")
        .bind(keys)
        .execute(pool)
        .await
        .expect("insert keys");
    sqlx::query("analyze items")
        .execute(pool)
        .await
        .expect("analyze");
}

async fn sqlite_with(keys: &[String]) -> SqlitePool {
    let pool = SqlitePool::connect("sqlite::memory:")
        .await
        .expect("in-memory sqlite");
    sqlx::query("create table items (key text not null unique)")
        .execute(&pool)
        .await
        .expect("create table");
    let mut tx = pool.begin().await.expect("begin");
    for key in keys {
        sqlx::query("insert into items (key) values (?)")
            .bind(key)
            .execute(&mut *tx)
            .await
            .expect("insert key");
    }
    tx.commit().await.expect("commit");
    pool
}

#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn postgres_copy_warm_up_has_no_false_negatives(pool: PgPool) {
    let keys = all_keys();
    fill_postgres(&pool, &keys).await;
    check_warm_up(
        postgres::CopySource::new(pool, "select key from items"),
        keys,
    )
    .await;
}

#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn postgres_query_warm_up_has_no_false_negatives(pool: PgPool) {
    let keys = all_keys();
    fill_postgres(&pool, &keys).await;
    check_warm_up(QuerySource::new(pool, "select key from items"), keys).await;
}

#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn postgres_count_hints_size_the_filter(pool: PgPool) {
    fill_postgres(&pool, &all_keys()).await;
    let estimate = postgres::CopySource::new(pool.clone(), "select key from items")
        .count_hint()
        .await;
    let estimate = estimate.expect("explain").expect("a row estimate");
    assert!(
        estimate.abs_diff(all_keys().len() as u64) < 5_000,
        "{estimate}"
    );
    let exact = postgres::CopySource::new(pool, "select key from items")
        .count_query("select count(*) from items")
        .count_hint()
        .await;
    assert_eq!(exact.expect("count"), Some(all_keys().len() as u64));
}

#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn postgres_bad_key_query_fails_and_the_guard_stays_open(pool: PgPool) {
    fill_postgres(&pool, &["a".to_owned()]).await;
    let guard = guard();
    let result = guard
        .rebuild(&postgres::CopySource::new(
            pool,
            "select key, value from items",
        ))
        .await;
    assert!(result.is_err());
    assert!(!guard.is_ready() && guard.may_contain("anything"));
    assert!(guard.stats().last_error.is_some());
}

#[tokio::test]
async fn sqlite_warm_up_has_no_false_negatives() {
    let keys = all_keys();
    let pool = sqlite_with(&keys).await;
    check_warm_up(QuerySource::new(pool, "select key from items"), keys).await;
}

/// Any text a path can carry: no NUL (Postgres text cannot hold it), and not
/// the dot segments `.` and `..`, which clients rewrite and the guard
/// refuses.
fn requestable_key() -> impl Strategy<Value = String> {
    "[^\u{0}]{1,24}".prop_filter("dot segment", |k| k != "." && k != "..")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// Any key that warm-up loads is accepted by the request path.
    #[test]
    fn any_loaded_key_passes_the_request_path(
        keys in proptest::collection::hash_set(requestable_key(), 1..40)
    ) {
        let keys: Vec<String> = keys.into_iter().collect();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        runtime.block_on(async {
            let pool = sqlite_with(&keys).await;
            let guard = guard();
            guard.clone().warm(QuerySource::new(pool, "select key from items")).await;
            let app = app(&guard);
            for key in &keys {
                prop_assert_eq!(status(&app, key).await, 200, "key {:?}", key);
            }
            Ok(())
        })?;
    }
}

#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn postgres_copy_loads_any_key_the_request_path_accepts(pool: PgPool) {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;

    let strategy = proptest::collection::hash_set(requestable_key(), 1..60);
    let mut runner = TestRunner::default();
    for _ in 0..16 {
        let keys: Vec<String> = strategy
            .new_tree(&mut runner)
            .expect("keys")
            .current()
            .into_iter()
            .collect();
        sqlx::query("truncate items")
            .execute(&pool)
            .await
            .expect("truncate");
        fill_postgres(&pool, &keys).await;
        let guard = guard();
        guard
            .clone()
            .warm(postgres::CopySource::new(
                pool.clone(),
                "select key from items",
            ))
            .await;
        let app = app(&guard);
        for key in &keys {
            assert_eq!(status(&app, key).await, 200, "key {key:?}");
        }
    }
}
