//! The items service: an axum API guarded by bloom-guard, with a moka
//! read-through cache, on Postgres or an embedded SQLite file.
//!
//! The binary (`src/main.rs`) wires these together; tests drive [`app`]
//! with `oneshot`.

pub mod config;
pub mod db;
pub mod error;
pub mod routes;
pub mod server;

pub use config::Config;
pub use db::{Database, Item, MigrateError, Pool, UrlError, User};
pub use routes::{admin_app, app, AppState, Guards, MAX_KEY_LEN};
pub use server::{serve, Limits};

use std::time::Duration;

use bloom_guard::{BloomGuard, KeyType};
use bloom_guard_sqlx::{PgFollower, SqliteFollower, Watch};

/// The query whose rows are every key the `items` guard must hold, for the
/// admin API's rebuilds (the same keys as [`items_feed`]'s).
pub const KEY_QUERY: &str = "select key from items";

/// The same for the `users` guard, on Postgres and on SQLite.
pub const USER_ID_QUERY: &str = "select cast(id as text) from users";

/// The table and column whose values are every key the guard must hold:
/// its change feed is installed with the migrations and read by every
/// instance.
pub fn items_feed() -> Watch {
    Watch::table("items").key("key")
}

/// The table and column of the `users` guard's keys.
pub fn users_feed() -> Watch {
    Watch::table("users").key("id")
}

/// The guards as the service configures them: `items` (text keys) and
/// `users` (UUID keys), both sized and tuned by the `BLOOM_*` settings.
///
/// # Example
///
/// ```
/// let config = items_service::Config::from_env()?;
/// let guards = items_service::guards(&config);
/// assert!(!guards.items.is_ready(), "fails open until warm");
/// assert_eq!(guards.users.name(), "users");
/// # Ok::<(), items_service::config::ConfigError>(())
/// ```
pub fn guards(config: &Config) -> Guards {
    let guard = |name: &'static str, key_type: KeyType| {
        let mut builder = BloomGuard::builder()
            .name(name)
            .key_type(key_type)
            .expected_items(config.bloom_expected_items)
            .false_positive_rate(config.bloom_fpp)
            .max_key_len(MAX_KEY_LEN)
            .debug_header(config.debug_header)
            .mode(config.mode)
            .audit_rate(config.audit_rate)
            // Back within seconds of the database.
            .max_retry_delay(Duration::from_secs(5));
        if config.rebuild_every_secs > 0 {
            builder = builder.rebuild_interval(Duration::from_secs(config.rebuild_every_secs));
        }
        builder.build()
    };
    Guards {
        items: guard("items", KeyType::Text),
        users: guard("users", KeyType::Uuid),
        snapshots: config.snapshots,
    }
}

/// Brings the database up and the guard warm: applies the migrations and
/// installs the change feed (retrying while the database is unreachable),
/// starts the follower that keeps the filter complete ([`PgFollower`] or
/// [`SqliteFollower`]: warm-up, every key written by any instance or SQL
/// client, scheduled rebuilds), and returns once the guard is ready. The
/// service fails open until then.
pub async fn prepare(state: AppState) {
    let mut delay = Duration::from_millis(200);
    while let Err(error) = state.db.migrate().await {
        tracing::warn!(error = %error, retry_in = ?delay, "database migration failed; retrying");
        if let Some(guards) = &state.guards {
            for guard in guards.all() {
                guard.report_unavailable(&error);
            }
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(10));
    }
    let Some(guards) = state.guards.clone() else {
        return;
    };
    // A key created or deleted elsewhere: its cache entry (a negative one
    // would hide a new item) is stale.
    let cache = state.cache.clone();
    let invalidate = move |key: &str| {
        let (cache, key) = (cache.clone(), key.to_owned());
        tokio::spawn(async move { cache.invalidate(&key).await });
    };
    let all = state.cache.clone();
    let drop_all = move || all.invalidate_all();
    match state.db.pool().clone() {
        Pool::Postgres(pool) => {
            let items = PgFollower::new(guards.items.clone(), pool.clone(), items_feed())
                .snapshots(guards.snapshots)
                .on_key(invalidate)
                .on_catch_up(drop_all);
            state.keep(tokio::spawn(items.run_until(state.stopping())));
            let users = PgFollower::new(guards.users.clone(), pool, users_feed())
                .snapshots(guards.snapshots);
            state.keep(tokio::spawn(users.run_until(state.stopping())));
        }
        Pool::Sqlite(pool) => {
            let items = SqliteFollower::new(guards.items.clone(), pool.clone(), items_feed())
                .snapshots(guards.snapshots)
                .on_key(invalidate)
                .on_catch_up(drop_all);
            state.keep(tokio::spawn(items.run_until(state.stopping())));
            let users = SqliteFollower::new(guards.users.clone(), pool, users_feed())
                .snapshots(guards.snapshots);
            state.keep(tokio::spawn(users.run_until(state.stopping())));
        }
    }
    for guard in guards.all() {
        guard.ready().await;
    }
}

/// The repository README's library example, compiled as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct RepositoryReadme;
