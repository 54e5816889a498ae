//! Helpers shared by the database tests.

#![allow(dead_code, reason = "each test file uses its own part")]

pub(crate) mod cluster;
#[cfg(feature = "log-feed")]
pub(crate) mod log;
#[cfg(feature = "mysql")]
pub(crate) mod mysql;
pub(crate) mod spellings;

use std::time::Duration;

use bloom_guard::{stats::GuardState, BloomGuard};
use bloom_guard_sqlx::{postgres, Watch};
use sqlx::PgPool;

pub(crate) fn guard() -> BloomGuard {
    BloomGuard::builder().expected_items(1000).build()
}

pub(crate) fn items() -> Watch {
    Watch::table("items").key("key")
}

/// Installs the feed and watches `items`.
pub(crate) async fn install(pool: &PgPool) {
    bloom_guard_sqlx::postgres::install(pool)
        .await
        .expect("install the feed");
    items().install(pool).await.expect("watch items");
}

/// Installs an earlier version of the feed from its script (a fixture),
/// in one transaction, and watches `items` with that version's `watch`.
pub(crate) async fn install_version(pool: &PgPool, script: &str) {
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("begin; {script}; commit;")))
        .execute(pool)
        .await
        .expect("the earlier version");
    exec(
        pool,
        "select bloom_guard.watch('items', array['key'], 'items')",
    )
    .await;
}

/// A follower with fast checks, as a test wants it.
pub(crate) fn follower(guard: &BloomGuard, pool: &PgPool) -> postgres::Follower {
    postgres::Follower::new(guard.clone(), pool.clone(), items())
        .check_interval(Duration::from_millis(200))
        .poll_interval(Duration::from_millis(500))
        .min_read_gap(Duration::from_millis(5))
}

/// A follower running on a task of its own; dropped, it stops and closes
/// its connections, so the test's database can be dropped after it.
pub(crate) struct Running {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// Runs `follower` until the returned value is dropped.
pub(crate) fn spawn(follower: impl bloom_guard_sqlx::Follow) -> Running {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(follower.run_until(async move {
        let _ = stopped.await;
    }));
    Running { stop: Some(stop) }
}

/// A guard kept complete by a follower, once warm.
pub(crate) async fn followed(pool: &PgPool) -> (BloomGuard, Running) {
    let guard = guard();
    let task = spawn(follower(&guard, pool));
    wait_until("the first warm-up", Duration::from_secs(10), || {
        guard.is_ready()
    })
    .await;
    (guard, task)
}

pub(crate) async fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + limit;
    while !done() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Whether the guard answers from its filter (not failing open) and holds
/// every key.
pub(crate) fn holds_all(guard: &BloomGuard, keys: &[&str]) -> bool {
    guard.stats().state == GuardState::Ready && keys.iter().all(|key| guard.may_contain(key))
}

/// Waits until the guard holds `keys`, answering from its filter: within
/// a second, the feed's promise.
pub(crate) async fn arrives(guard: &BloomGuard, keys: &[&str]) {
    wait_until(
        &format!("{keys:?} to arrive"),
        Duration::from_secs(1),
        || holds_all(guard, keys),
    )
    .await;
}

pub(crate) async fn kill_listeners(pool: &PgPool) -> u64 {
    sqlx::query(
        "select pg_terminate_backend(pid) from pg_stat_activity
         where application_name = $1 and datname = current_database()",
    )
    .bind(postgres::LISTENER_APPLICATION_NAME)
    .execute(pool)
    .await
    .expect("terminate listeners")
    .rows_affected()
}

pub(crate) async fn exec(pool: &PgPool, sql: &str) {
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
        .execute(pool)
        .await
        .unwrap_or_else(|error| panic!("{sql}: {error}"));
}

/// A `psql` command line for the test's database.
pub(crate) async fn psql(pool: &PgPool) -> std::process::Command {
    let database: String = sqlx::query_scalar("select current_database()")
        .fetch_one(pool)
        .await
        .expect("database name");
    let options = pool.connect_options();
    let mut command = std::process::Command::new("psql");
    command
        .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-h"])
        .arg(options.get_host())
        .args(["-p", &options.get_port().to_string(), "-U"])
        .arg(options.get_username())
        .arg(database);
    command
}

/// Runs `command` to its end off the test's runtime thread, as another
/// client of the database: blocking that thread would stall a follower in
/// the middle of a transaction whose locks the command may wait for.
pub(crate) async fn run(mut command: std::process::Command) -> std::process::ExitStatus {
    tokio::task::spawn_blocking(move || command.status())
        .await
        .expect("the command's thread")
        .expect("the command on PATH")
}

/// Another database on `pool`'s server, for a dump to restore: its name,
/// and a pool of it whose `items` holds `restored-1` to `restored-2000`.
pub(crate) async fn restore_source(pool: &PgPool) -> (String, PgPool) {
    let source = format!("bloom_guard_dump_{}", fastrand::u32(..));
    exec(pool, &format!("create database {source}")).await;
    let other = PgPool::connect_with((*pool.connect_options()).clone().database(&source))
        .await
        .expect("connect to the source");
    exec(
        &other,
        "create table items (id bigint generated always as identity primary key,
                             key text not null unique, value text not null default '');
         insert into items (key) select 'restored-' || g from generate_series(1, 2000) g",
    )
    .await;
    (source, other)
}

/// `pg_dump -Fc` of the database `source` on `pool`'s server, restored
/// into `pool`'s database with `pg_restore --clean --if-exists
/// --no-owner`, as a DBA restores a dump in place.
pub(crate) async fn restore_clean(pool: &PgPool, source: &str) {
    let dump = std::env::temp_dir().join(format!("{source}.dump"));
    let options = pool.connect_options();
    let (host, port, user) = (
        options.get_host().to_owned(),
        options.get_port().to_string(),
        options.get_username().to_owned(),
    );
    let mut pg_dump = std::process::Command::new("pg_dump");
    pg_dump
        .args(["-Fc", "-h", &host, "-p", &port, "-U", &user, "-f"])
        .arg(&dump)
        .arg(source);
    assert!(run(pg_dump).await.success(), "pg_dump");
    let database: String = sqlx::query_scalar("select current_database()")
        .fetch_one(pool)
        .await
        .expect("database");
    let mut pg_restore = std::process::Command::new("pg_restore");
    pg_restore
        .args([
            "--clean",
            "--if-exists",
            "--no-owner",
            "-h",
            &host,
            "-p",
            &port,
        ])
        .args(["-U", &user, "-d"])
        .arg(&database)
        .arg(&dump);
    assert!(run(pg_restore).await.success(), "pg_restore");
    let _ = std::fs::remove_file(&dump);
}

/// The status of `GET /items/{key}` through `guard`, in front of a handler
/// that finds every key: 404 is the guard's refusal.
pub(crate) async fn status(guard: &BloomGuard, key: &str) -> http::StatusCode {
    use tower::ServiceExt as _;
    let app = axum::Router::new()
        .route("/items/{key}", axum::routing::get(|| async { "an item" }))
        .route_layer(guard.layer(bloom_guard::extract::PathParam("key")));
    let request = http::Request::get(format!("/items/{key}"))
        .body(axum::body::Body::empty())
        .expect("a request");
    app.oneshot(request).await.expect("infallible").status()
}

/// A random key of up to four characters that a trailing-space-ignoring
/// comparison may confuse (letters of both cases, a space, a tab, a
/// no-break space), then up to two trailing spaces.
pub(crate) fn spelling(rng: &mut fastrand::Rng) -> String {
    const CHARS: [char; 5] = ['a', 'A', ' ', '\t', '\u{a0}'];
    let mut key: String = (0..rng.usize(..=4))
        .map(|_| CHARS[rng.usize(..CHARS.len())])
        .collect();
    key.extend(std::iter::repeat_n(' ', rng.usize(..=2)));
    key
}

/// `key` with every byte percent-encoded, for a request path.
pub(crate) fn encoded(key: &str) -> String {
    key.bytes().map(|byte| format!("%{byte:02X}")).collect()
}

/// A seeded random generator; the seed is printed as `variable=seed`, and
/// that environment variable replays one.
pub(crate) fn seeded(variable: &str) -> fastrand::Rng {
    let seed = std::env::var(variable)
        .ok()
        .and_then(|seed| seed.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..));
    eprintln!("{variable}={seed}");
    fastrand::Rng::with_seed(seed)
}

/// A key type's model check against its column, on a guard that is ready
/// over a table of random keys ([`spelling`]): two rounds of 150 random
/// spellings, each asked of the table (`found`) and through the guard
/// (`status`, given the key percent-encoded), with 20 more keys written
/// (`insert`) between them, for the feed to bring. A spelling the table
/// finds is never refused, and some absent one is.
pub(crate) async fn answers_as_the_table(
    rng: &mut fastrand::Rng,
    guard: &BloomGuard,
    mut insert: impl AsyncFnMut(String),
    mut found: impl AsyncFnMut(&str) -> bool,
    mut status: impl AsyncFnMut(&str) -> http::StatusCode,
) {
    let mut refused = 0;
    for round in 0..2 {
        if round == 1 {
            for _ in 0..20 {
                insert(spelling(rng)).await;
            }
        }
        for _ in 0..150 {
            let key = spelling(rng);
            if key.is_empty() {
                continue; // no path names it
            }
            let stored = found(&key).await;
            let before = guard.stats().rejected;
            let answer = status(&encoded(&key)).await;
            if stored {
                assert_eq!(answer, http::StatusCode::OK, "{key:?} is stored");
            } else if guard.stats().rejected > before {
                refused += 1;
            }
        }
    }
    assert!(refused > 0, "no absent spelling was refused");
}
