//! The service's guards and how the configuration builds them.

use std::time::Duration;

use bloom_guard::{feed::ReadPace, BloomGuard, KeyType};
use bloom_guard_sqlx::FeedError;

use crate::config::{Config, MAX_KEY_LEN};
use crate::db::{Database, Pool};

/// The service's guards, one per resource.
#[derive(Debug, Clone)]
pub struct Guards {
    /// `items`, text keys.
    pub items: BloomGuard,
    /// `users`, UUID keys.
    pub users: BloomGuard,
    /// Whether their followers share filters through snapshots in the
    /// database (`BLOOM_SNAPSHOTS`).
    pub snapshots: bool,
    /// This instance's name in the fleet view.
    pub instance: String,
    /// Where their followers read the changes (`BLOOM_FEED`): the log
    /// feed's (Postgres, MySQL, MariaDB) with the database's URL, for its
    /// replication connection.
    pub log_feed: Option<String>,
}

impl Guards {
    /// Both guards.
    pub fn all(&self) -> [&BloomGuard; 2] {
        [&self.items, &self.users]
    }
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
    guards_with(config, KeyType::Text)
}

/// As [`guards`], with the `items` key type read from its key column where
/// the database compares keys otherwise than byte for byte: on MySQL and
/// MariaDB a column altered to a case- and accent-insensitive collation
/// (`utf8mb4_general_ci`) gets [`KeyType::Collated`], so `Apple-Pie` is
/// found as `apple-pie`, as the database finds it. The example's own
/// schema stores keys as `varbinary`: `Text`.
///
/// # Errors
///
/// [`FeedError::Uncomparable`] for a column no key type compares as the
/// database does; [`FeedError::Database`] if the column cannot be read
/// (the database down, or the table not created yet).
pub async fn guards_for(config: &Config, db: &Database) -> Result<Guards, FeedError> {
    let items = match db.pool() {
        Pool::MySql(pool) => crate::items_feed().key_type(pool).await?,
        Pool::Postgres(_) | Pool::Sqlite(_) => KeyType::Text,
    };
    Ok(guards_with(config, items))
}

fn guards_with(config: &Config, items: KeyType) -> Guards {
    // One ceiling on barrier reads for the instance, whichever guard a
    // flood hits.
    let pace = ReadPace::default();
    let guard = |name: &'static str, key_type: KeyType| {
        let mut builder = BloomGuard::builder()
            .name(name)
            .key_type(key_type)
            .expected_items(config.bloom_expected_items)
            .false_positive_rate(config.bloom_fpp)
            .max_key_len(MAX_KEY_LEN)
            .debug_header(config.debug_header)
            .read_barrier(config.read_barrier)
            .read_pace(pace.clone())
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
        items: guard("items", items),
        users: guard("users", KeyType::Uuid),
        snapshots: config.snapshots,
        instance: config
            .instance
            .clone()
            .unwrap_or_else(bloom_guard::fleet::instance_id),
        log_feed: match config.feed {
            crate::config::Feed::Log => config.database_url.clone(),
            crate::config::Feed::Triggers => None,
        },
    }
}
