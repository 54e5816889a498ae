//! A rebuild requested by an operator, run once for the fleet.

use bloom_guard::{BloomGuard, BuildError, Stats};

use crate::follow::Rebuild;
#[cfg(feature = "binlog-feed")]
use crate::mysql::log::MySqlLogBackend;
#[cfg(feature = "mysql")]
use crate::mysql::MySqlBackend;
#[cfg(feature = "postgres")]
use crate::postgres::PgBackend;
#[cfg(feature = "log-feed")]
use crate::postgres::PgLogBackend;
#[cfg(feature = "sqlite")]
use crate::sqlite::SqliteBackend;
use crate::watch::Watch;

/// Rebuilds a guard's filter for the whole fleet: under the guard's build
/// lock it scans, then publishes the result as the newest snapshot, which
/// every instance's follower adopts (on Postgres at once, on the wake-up
/// the publication sends; on SQLite at its next check). A request made
/// while another instance's rebuild runs waits for it and scans no more:
/// that rebuild started after the request.
///
/// It reads the keys exactly as the followers' own rebuilds do, whoever
/// asks. A failure shows in the guard's
/// [`Stats::last_error`](bloom_guard::Stats::last_error) as well as in the
/// returned error.
///
/// For an admin endpoint: hand it to
/// `bloom_guard::admin::Admin::guard_with_rebuild`.
///
/// # Example
///
/// ```no_run
/// use bloom_guard::admin::Admin;
/// use bloom_guard_sqlx::{FleetRebuild, Watch};
///
/// # fn run(guard: bloom_guard::BloomGuard, pool: sqlx::PgPool) {
/// let rebuild = FleetRebuild::new(guard.clone(), pool, Watch::table("items").key("key"));
/// let admin: axum::Router = Admin::new("s3cret")
///     .guard_with_rebuild(guard, move || {
///         let rebuild = rebuild.clone();
///         async move { rebuild.rebuild().await }
///     })
///     .into_router();
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct FleetRebuild {
    engine: Engine,
}

#[derive(Debug, Clone)]
enum Engine {
    #[cfg(feature = "postgres")]
    Postgres(Rebuild<PgBackend>),
    #[cfg(feature = "log-feed")]
    PostgresLog(Rebuild<PgLogBackend>),
    #[cfg(feature = "sqlite")]
    Sqlite(Rebuild<SqliteBackend>),
    #[cfg(feature = "mysql")]
    MySql(Rebuild<MySqlBackend>),
    #[cfg(feature = "binlog-feed")]
    MySqlLog(Rebuild<MySqlLogBackend>),
}

impl FleetRebuild {
    /// Rebuilds of `guard`, holding the keys of `watch`'s table in a
    /// Postgres database.
    #[cfg(feature = "postgres")]
    pub fn new(guard: BloomGuard, pool: sqlx::PgPool, watch: Watch) -> Self {
        let backend = PgBackend::new(&guard, pool, watch);
        Self {
            engine: Engine::Postgres(Rebuild::new(guard, backend)),
        }
    }

    /// Rebuilds of `guard`, holding the keys of `watch`'s table on the
    /// Postgres **log feed** (feature `log-feed`), as its
    /// [`postgres::log::Follower`](crate::postgres::log::Follower) rebuilds: the scan meets the
    /// log at one point. `url` is the database's URL with its password,
    /// for the replication connection that point is taken on. A table on
    /// the log feed cannot be rebuilt with [`new`](Self::new), which fails.
    ///
    /// # Example
    ///
    /// ```no_run
    /// use bloom_guard_sqlx::{FleetRebuild, Watch};
    ///
    /// # async fn run(guard: bloom_guard::BloomGuard, pool: sqlx::PgPool, url: String) {
    /// let rebuild = FleetRebuild::log(guard, pool, Watch::table("items").key("key"), url);
    /// let stats = rebuild.rebuild().await;
    /// # }
    /// ```
    #[cfg(feature = "log-feed")]
    pub fn log(
        guard: BloomGuard,
        pool: sqlx::PgPool,
        watch: Watch,
        url: impl Into<String>,
    ) -> Self {
        let backend = PgLogBackend::new(PgBackend::new(&guard, pool, watch), url.into());
        Self {
            engine: Engine::PostgresLog(Rebuild::new(guard, backend)),
        }
    }

    /// Rebuilds of `guard`, holding the keys of `watch`'s table in a
    /// SQLite database.
    #[cfg(feature = "sqlite")]
    pub fn sqlite(guard: BloomGuard, pool: sqlx::SqlitePool, watch: Watch) -> Self {
        Self {
            engine: Engine::Sqlite(Rebuild::new(guard, SqliteBackend::new(pool, watch))),
        }
    }

    /// Rebuilds of `guard`, holding the keys of `watch`'s table in a MySQL
    /// or MariaDB database.
    #[cfg(feature = "mysql")]
    pub fn mysql(guard: BloomGuard, pool: sqlx::MySqlPool, watch: Watch) -> Self {
        let backend = MySqlBackend::new(&guard, pool, watch);
        Self {
            engine: Engine::MySql(Rebuild::new(guard, backend)),
        }
    }

    /// Rebuilds of `guard`, holding the keys of `watch`'s table on the
    /// **binary log feed** of a MySQL or MariaDB database (feature
    /// `binlog-feed`), as its `mysql::log::Follower` rebuilds: the scan
    /// meets the log at one point. `url` is the database's URL, as the
    /// follower's. A table on the binary log feed cannot be rebuilt with
    /// [`mysql`](Self::mysql), which fails.
    ///
    /// # Example
    ///
    /// ```no_run
    /// use bloom_guard_sqlx::{FleetRebuild, Watch};
    ///
    /// # async fn run(guard: bloom_guard::BloomGuard, pool: sqlx::MySqlPool, url: String) {
    /// let items = Watch::table("items").key("code");
    /// let stats = FleetRebuild::mysql_log(guard, pool, items, url).rebuild().await;
    /// # }
    /// ```
    #[cfg(feature = "binlog-feed")]
    pub fn mysql_log(
        guard: BloomGuard,
        pool: sqlx::MySqlPool,
        watch: Watch,
        url: impl Into<String>,
    ) -> Self {
        let backend = MySqlLogBackend::new(MySqlBackend::new(&guard, pool, watch), url.into());
        Self {
            engine: Engine::MySqlLog(Rebuild::new(guard, backend)),
        }
    }

    /// Whether the rebuild is shared through a snapshot (default on, as
    /// the followers' [`snapshots`](crate::postgres::Follower::snapshots)). Off, it
    /// rebuilds this instance's filter only, from the same keys.
    #[must_use]
    pub fn snapshots(mut self, enabled: bool) -> Self {
        match &mut self.engine {
            #[cfg(feature = "postgres")]
            Engine::Postgres(engine) => engine.snapshots = enabled,
            #[cfg(feature = "log-feed")]
            Engine::PostgresLog(engine) => engine.snapshots = enabled,
            #[cfg(feature = "sqlite")]
            Engine::Sqlite(engine) => engine.snapshots = enabled,
            #[cfg(feature = "mysql")]
            Engine::MySql(engine) => engine.snapshots = enabled,
            #[cfg(feature = "binlog-feed")]
            Engine::MySqlLog(engine) => engine.snapshots = enabled,
        }
        self
    }

    /// Rebuilds once for the fleet and returns this instance's stats.
    ///
    /// # Errors
    ///
    /// [`BuildError::Source`] if the database fails; the filter in use
    /// stays.
    pub async fn rebuild(&self) -> Result<Stats, BuildError> {
        match &self.engine {
            #[cfg(feature = "postgres")]
            Engine::Postgres(engine) => engine.rebuild().await,
            #[cfg(feature = "log-feed")]
            Engine::PostgresLog(engine) => engine.rebuild().await,
            #[cfg(feature = "sqlite")]
            Engine::Sqlite(engine) => engine.rebuild().await,
            #[cfg(feature = "mysql")]
            Engine::MySql(engine) => engine.rebuild().await,
            #[cfg(feature = "binlog-feed")]
            Engine::MySqlLog(engine) => engine.rebuild().await,
        }
    }
}
