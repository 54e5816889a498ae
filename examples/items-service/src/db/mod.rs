//! The items table, on Postgres, MySQL or MariaDB, or an embedded SQLite
//! file: the connection and its schema here, the rows in `items.rs` and
//! `users.rs`.

mod items;
mod migrate;
mod users;

use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};
use sqlx::postgres::{PgPoolOptions, PgSslMode};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use sqlx::{MySqlPool, PgPool, SqlitePool};

/// An item as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub struct Item {
    /// The item's key, unique.
    pub key: String,
    /// The item's value.
    pub value: String,
}

/// A user as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub struct User {
    /// The user's id: a UUID, lower case with hyphens.
    pub id: String,
    /// The user's name.
    pub name: String,
}

/// Demo items seeded into a new SQLite database.
const DEMO_ITEMS: &[(&str, &str)] = &[
    ("apple", "a red fruit"),
    ("banana", "a yellow fruit"),
    ("cherry", "a small red fruit"),
    ("hello world", "a key with a space"),
    ("a/b", "a key with a slash"),
];

/// The database behind the service, with a count of the item lookups it
/// served (what the guard exists to save).
#[derive(Debug, Clone)]
pub struct Database {
    pool: Pool,
    /// A Postgres replica the reads by key go to first.
    replica: Option<PgPool>,
    lookups: Arc<AtomicU64>,
}

/// Why the schema could not be brought up to date.
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    /// The database could not be opened or queried.
    #[error("database error")]
    Database(#[from] sqlx::Error),
    /// A migration failed.
    #[error("migration failed")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// The change feed could not be installed.
    #[error("cannot install the change feed")]
    Feed(#[from] bloom_guard_sqlx::FeedError),
}

/// Why a database URL cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum UrlError {
    /// The URL names a database this service does not speak.
    #[error("DATABASE_URL must start with postgres://, postgresql://, mysql:// or mariadb:// (unset, an embedded SQLite file is used); it starts with {scheme:?}")]
    UnknownKind {
        /// What the URL starts with, up to its `://`.
        scheme: String,
    },
    /// The URL has no `://`: not a database URL. Not repeated in the
    /// message, where it could show a password.
    #[error("DATABASE_URL must start with postgres://, postgresql://, mysql:// or mariadb:// (unset, an embedded SQLite file is used); it has no `://`")]
    NoScheme,
    /// The MySQL URL does not parse; fix it, in the form
    /// `mysql://user:password@host:port/database`.
    #[error("invalid MySQL URL: {0}")]
    InvalidMySql(sqlx::Error),
    /// The URL does not parse; fix it, in the form
    /// `postgres://user:password@host:port/database?sslmode=require`, or
    /// with several servers
    /// `postgres://user@host1:port1,host2:port2/database?target_session_attrs=read-write`.
    #[error(transparent)]
    Invalid(bloom_guard_sqlx::postgres::ServersError),
    /// `DATABASE_REPLICA_URL` is read with a Postgres `DATABASE_URL` only,
    /// and must itself be a Postgres URL.
    #[error(
        "DATABASE_REPLICA_URL needs a postgres:// DATABASE_URL and is a postgres:// URL itself"
    )]
    ReplicaNeedsPostgres,
    /// The URL asks for TLS and this build has no TLS: build with the `tls`
    /// feature (on by default), or connect without TLS.
    #[error(
        "the Postgres URL asks for TLS (sslmode={sslmode}) but this build has no TLS: \
         build items-service with the `tls` feature"
    )]
    TlsUnavailable {
        /// The URL's `sslmode`.
        sslmode: &'static str,
    },
}

/// The pool of either kind of database.
#[derive(Debug, Clone)]
pub enum Pool {
    /// Postgres.
    Postgres(PgPool),
    /// An embedded SQLite database.
    Sqlite(SqlitePool),
    /// MySQL or MariaDB.
    MySql(MySqlPool),
}

impl Database {
    /// A Postgres database. Connects lazily, so the service starts while
    /// Postgres is down; call [`migrate`](Self::migrate) before use.
    ///
    /// With `sslmode=require`, `verify-ca` or `verify-full` in the URL the
    /// connections use TLS; `sslrootcert=` names a private CA's certificate.
    /// A URL may list several servers, as libpq's does
    /// (`postgres://app@db1,db2/shop?target_session_attrs=read-write`): the
    /// pool connects to the first of the kind asked for and follows it
    /// across failovers ([`postgres::Servers`](bloom_guard_sqlx::postgres::Servers)).
    ///
    /// # Errors
    ///
    /// If `url` is not a valid Postgres URL, or it asks for TLS and the build
    /// has none.
    pub async fn postgres(url: &str) -> Result<Self, UrlError> {
        let servers = bloom_guard_sqlx::postgres::Servers::parse(url).map_err(UrlError::Invalid)?;
        for server in servers.servers() {
            check_tls(server.get_ssl_mode(), cfg!(feature = "tls"))?;
        }
        let pool = servers
            .pool(
                PgPoolOptions::new()
                    .max_connections(16)
                    .acquire_timeout(Duration::from_secs(3)),
            )
            .await;
        Ok(Self::from_pool(Pool::Postgres(pool)))
    }

    /// The database `url` names: Postgres (`postgres://`, `postgresql://`)
    /// or MySQL and MariaDB (`mysql://`, `mariadb://`). Connects lazily.
    ///
    /// # Errors
    ///
    /// If the URL names another kind of database or does not parse: a
    /// clear error at start, never an endless retry.
    pub async fn connect(url: &str) -> Result<Self, UrlError> {
        let Some((scheme, _)) = url.split_once("://") else {
            return Err(UrlError::NoScheme);
        };
        match scheme.to_ascii_lowercase().as_str() {
            "postgres" | "postgresql" => Self::postgres(url).await,
            "mysql" => Self::mysql(url),
            "mariadb" => Self::mysql(&format!("mysql{}", &url[scheme.len()..])),
            _ => Err(UrlError::UnknownKind {
                scheme: scheme.chars().take(32).collect(),
            }),
        }
    }

    /// A MySQL or MariaDB database. Connects lazily, so the service starts
    /// while the server is down; call [`migrate`](Self::migrate) before
    /// use. The followers need the `PROCESS` privilege (see the library's
    /// `mysql::Follower`).
    ///
    /// # Errors
    ///
    /// If `url` is not a valid MySQL URL.
    pub fn mysql(url: &str) -> Result<Self, UrlError> {
        let options = MySqlConnectOptions::from_str(url).map_err(UrlError::InvalidMySql)?;
        let pool = MySqlPoolOptions::new()
            .max_connections(16)
            .acquire_timeout(Duration::from_secs(3))
            .connect_lazy_with(options);
        Ok(Self::from_pool(Pool::MySql(pool)))
    }

    /// An embedded SQLite database in the file at `path`, created if missing,
    /// migrated, and seeded with demo items when empty.
    ///
    /// # Errors
    ///
    /// If the file cannot be opened or migrated.
    pub async fn sqlite(path: &str) -> Result<Self, MigrateError> {
        let options = SqliteConnectOptions::from_str(&format!("sqlite://{path}"))?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal);
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(options)
            .await?;
        let db = Self::from_pool(Pool::Sqlite(pool));
        db.migrate().await?;
        db.seed_if_empty().await?;
        Ok(db)
    }

    /// Wraps a pool.
    pub fn from_pool(pool: Pool) -> Self {
        Self {
            pool,
            replica: None,
            lookups: Arc::default(),
        }
    }

    /// Sends the reads by key to `url`, a hot standby of the Postgres
    /// database: a row found there is served; a row not found is looked for
    /// on the primary, so a replica behind the primary never answers "not
    /// found" for a row committed before the request (and the guard, which
    /// refuses most absent keys, keeps those lookups few). Writes,
    /// migrations and the followers' own writes stay on the primary.
    ///
    /// # Errors
    ///
    /// [`UrlError::ReplicaNeedsPostgres`] unless both are Postgres; the
    /// URL's own errors as for [`postgres`](Self::postgres).
    pub async fn with_replica(mut self, url: &str) -> Result<Self, UrlError> {
        if !matches!(self.pool, Pool::Postgres(_)) {
            return Err(UrlError::ReplicaNeedsPostgres);
        }
        let Pool::Postgres(replica) = Self::postgres(url).await?.pool else {
            return Err(UrlError::ReplicaNeedsPostgres);
        };
        self.replica = Some(replica);
        Ok(self)
    }

    /// The replica reads by key go to first, if any.
    pub fn replica(&self) -> Option<&PgPool> {
        self.replica.as_ref()
    }

    /// Runs `read` on the replica, and on the primary if the replica found
    /// nothing (or there is none).
    async fn read_postgres<T, F, Fut>(
        &self,
        primary: &PgPool,
        read: F,
    ) -> Result<Option<T>, sqlx::Error>
    where
        F: Fn(PgPool) -> Fut,
        Fut: std::future::Future<Output = Result<Option<T>, sqlx::Error>>,
    {
        if let Some(replica) = &self.replica {
            if let Some(found) = read(replica.clone()).await? {
                return Ok(Some(found));
            }
        }
        read(primary.clone()).await
    }

    /// The pool.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// Inserts the demo items if the table is empty (always for a new
    /// SQLite file; on Postgres or MySQL when `SEED_DEMO` asks for it). They go
    /// through the change feed like any other write.
    ///
    /// # Errors
    ///
    /// If the database fails.
    pub async fn seed_if_empty(&self) -> Result<(), sqlx::Error> {
        let count: i64 = match &self.pool {
            Pool::Postgres(pool) => {
                sqlx::query_scalar("select count(*) from items")
                    .fetch_one(pool)
                    .await?
            }
            Pool::Sqlite(pool) => {
                sqlx::query_scalar("select count(*) from items")
                    .fetch_one(pool)
                    .await?
            }
            Pool::MySql(pool) => {
                sqlx::query_scalar("select count(*) from items")
                    .fetch_one(pool)
                    .await?
            }
        };
        if count > 0 {
            return Ok(());
        }
        for (key, value) in DEMO_ITEMS {
            match &self.pool {
                Pool::Postgres(pool) => {
                    sqlx::query(
                        "insert into items (key, value) values ($1, $2) on conflict do nothing",
                    )
                    .bind(key)
                    .bind(value)
                    .execute(pool)
                    .await?;
                }
                Pool::Sqlite(pool) => {
                    sqlx::query(
                        "insert into items (key, value) values (?, ?) on conflict do nothing",
                    )
                    .bind(key)
                    .bind(value)
                    .execute(pool)
                    .await?;
                }
                Pool::MySql(_) => {
                    self.insert(key, value).await?;
                }
            }
        }
        tracing::info!(
            items = DEMO_ITEMS.len(),
            "seeded the database with demo items"
        );
        Ok(())
    }

    /// Closes the pool: waits for the connections in use, then closes every
    /// connection cleanly.
    pub async fn close(&self) {
        match &self.pool {
            Pool::Postgres(pool) => pool.close().await,
            Pool::Sqlite(pool) => pool.close().await,
            Pool::MySql(pool) => pool.close().await,
        }
    }

    /// How many item lookups reached the database.
    pub fn lookups(&self) -> u64 {
        self.lookups.load(Ordering::Relaxed)
    }
}

/// Refuses an `sslmode` that needs TLS when the build has none: every
/// connection would fail the same way, and the service would retry forever.
fn check_tls(mode: PgSslMode, tls_available: bool) -> Result<(), UrlError> {
    let sslmode = match mode {
        PgSslMode::Require => "require",
        PgSslMode::VerifyCa => "verify-ca",
        PgSslMode::VerifyFull => "verify-full",
        PgSslMode::Disable | PgSslMode::Allow | PgSslMode::Prefer => return Ok(()),
    };
    if tls_available {
        Ok(())
    } else {
        Err(UrlError::TlsUnavailable { sslmode })
    }
}

#[cfg(test)]
mod tests;
