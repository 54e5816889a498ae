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
use bloom_guard_sqlx::{PgCopySource, QuerySource};

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
    BloomGuard::builder()
        .expected_items(config.bloom_expected_items)
        .false_positive_rate(config.bloom_fpp)
        .max_key_len(MAX_KEY_LEN)
        .build()
}

/// Brings the database up and the guard warm, in the background: applies
/// the migrations (retrying while the database is unreachable), then loads
/// every key. The service fails open until this completes.
pub async fn prepare(db: Database, guard: Option<BloomGuard>) {
    let mut delay = Duration::from_millis(200);
    while let Err(error) = db.migrate().await {
        tracing::warn!(error = %error, retry_in = ?delay, "database migration failed; retrying");
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(10));
    }
    let Some(guard) = guard else {
        return;
    };
    match db.pool().clone() {
        Pool::Postgres(pool) => guard.warm(PgCopySource::new(pool, KEY_QUERY)).await,
        Pool::Sqlite(pool) => guard.warm(QuerySource::new(pool, KEY_QUERY)).await,
    }
}
