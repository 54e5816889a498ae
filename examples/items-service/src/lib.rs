//! The items service: an axum API guarded by bloom-guard, with a moka
//! read-through cache, on Postgres or an embedded SQLite file.
//!
//! The binary (`src/main.rs`) wires these together; tests drive [`app`]
//! with `oneshot`.

pub mod config;
pub mod db;
pub mod error;
pub mod routes;

pub use config::Config;
pub use db::{Database, Item, Pool};
pub use routes::{admin_app, app, AppState, MAX_KEY_LEN};

use std::time::Duration;

use bloom_guard::BloomGuard;
use bloom_guard_sqlx::{PgFollower, QuerySource};

/// The query whose rows are every key the guard must hold.
pub const KEY_QUERY: &str = "select key from items";

/// The guard as the service configures it.
///
/// # Example
///
/// ```
/// let config = items_service::Config::from_env()?;
/// let guard = items_service::guard(&config);
/// assert!(!guard.is_ready(), "fails open until warm");
/// # Ok::<(), items_service::config::ConfigError>(())
/// ```
pub fn guard(config: &Config) -> BloomGuard {
    let mut builder = BloomGuard::builder()
        .name("items")
        .expected_items(config.bloom_expected_items)
        .false_positive_rate(config.bloom_fpp)
        .max_key_len(MAX_KEY_LEN)
        .debug_header(config.debug_header)
        // Back within seconds of the database.
        .max_retry_delay(Duration::from_secs(5));
    if config.rebuild_every_secs > 0 {
        builder = builder.rebuild_interval(Duration::from_secs(config.rebuild_every_secs));
    }
    builder.build()
}

/// Brings the database up and the guard warm: applies the migrations
/// (retrying while the database is unreachable), starts what keeps the
/// filter true (on Postgres a [`PgFollower`]: warm-up, NOTIFY from every
/// instance and SQL client, catch-up, scheduled rebuilds; on SQLite a
/// warm-up and scheduled rebuilds), and returns once the guard is ready.
/// The service fails open until then.
pub async fn prepare(state: AppState) {
    let mut delay = Duration::from_millis(200);
    while let Err(error) = state.db.migrate().await {
        tracing::warn!(error = %error, retry_in = ?delay, "database migration failed; retrying");
        if let Some(guard) = &state.guard {
            guard.report_unavailable(&error);
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(10));
    }
    let Some(guard) = state.guard.clone() else {
        return;
    };
    match state.db.pool().clone() {
        Pool::Postgres(pool) => {
            let (cache, all) = (state.cache.clone(), state.cache.clone());
            let follower = PgFollower::new(guard.clone(), pool, KEY_QUERY)
                .on_key(move |key| {
                    // A key created elsewhere: its negative entry would hide it.
                    let (cache, key) = (cache.clone(), key.to_owned());
                    tokio::spawn(async move { cache.invalidate(&key).await });
                })
                // Keys created unannounced: any negative entry may be stale.
                .on_catch_up(move || all.invalidate_all());
            let keeper = tokio::spawn(follower.run_until(state.stopping()));
            state.keep(keeper);
            while !guard.is_ready() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        Pool::Sqlite(pool) => {
            let source = QuerySource::new(pool, KEY_QUERY);
            guard.clone().warm(source.clone()).await;
            let stopping = state.stopping();
            let keeper = tokio::spawn(async move {
                tokio::select! {
                    () = guard.maintain(source) => {}
                    () = stopping => {}
                }
            });
            state.keep(keeper);
        }
    }
}

/// Serves `app` on `listener` until `shutdown` completes, then stops
/// accepting and lets the requests in flight finish.
///
/// # Errors
///
/// If accepting connections fails.
pub async fn serve(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}
