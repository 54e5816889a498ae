//! The schema at start: the service's migrations and the guards' change
//! feeds, each applied only if the database lacks it.

use sqlx::migrate::Migrator;
use sqlx::{Database as Backend, Executor, IntoArguments, Pool as SqlxPool};

use super::{Database, MigrateError, Pool};
use crate::config::Feed;

static POSTGRES: Migrator = sqlx::migrate!("../../migrations");
static SQLITE: Migrator = sqlx::migrate!("./sqlite");
static MYSQL: Migrator = sqlx::migrate!("./mysql");

impl Database {
    /// Applies the migrations of this kind of database and installs the
    /// guards' change feeds. A database that has them all costs one read
    /// for the migrations (not sqlx's lock and `CREATE TABLE IF NOT
    /// EXISTS`) and one per feed, the feeds' side by side.
    ///
    /// # Errors
    ///
    /// If the database is unreachable or a migration fails.
    pub async fn migrate(&self) -> Result<(), MigrateError> {
        self.migrate_for(Feed::Triggers).await
    }

    /// As [`migrate`](Self::migrate), with a Postgres, MySQL or MariaDB
    /// database's tables put on `feed`: the triggers' or the database's
    /// log's ([`Watch::install_log`](bloom_guard_sqlx::Watch::install_log)).
    ///
    /// # Errors
    ///
    /// As [`migrate`](Self::migrate); and for the log feed, a server whose
    /// log cannot feed the tables (`wal_level` not `logical`, a binary log
    /// off or not in `ROW` format) or tables the triggers feed
    /// ([`FeedError::LogFeed`](bloom_guard_sqlx::FeedError::LogFeed)).
    pub async fn migrate_for(&self, feed: Feed) -> Result<(), MigrateError> {
        let (items, users) = (crate::items_feed(), crate::users_feed());
        match self.pool.clone() {
            Pool::Postgres(pool) => {
                run_if_needed(&POSTGRES, &pool).await?;
                bloom_guard_sqlx::postgres::install(&pool).await?;
                // Each checks its table in one statement; side by side.
                match feed {
                    Feed::Triggers => {
                        tokio::try_join!(items.install(&pool), users.install(&pool))?;
                    }
                    Feed::Log => {
                        tokio::try_join!(items.install_log(&pool), users.install_log(&pool))?;
                    }
                }
            }
            Pool::Sqlite(pool) => {
                run_if_needed(&SQLITE, &pool).await?;
                items.install(&pool).await?;
                users.install(&pool).await?;
            }
            Pool::MySql(pool) => {
                run_if_needed(&MYSQL, &pool).await?;
                match feed {
                    Feed::Triggers => {
                        items.install(&pool).await?;
                        users.install(&pool).await?;
                    }
                    Feed::Log => {
                        items.install_log(&pool).await?;
                        users.install_log(&pool).await?;
                    }
                }
            }
        }
        Ok(())
    }
}

/// Runs `migrator` unless the database records exactly its migrations, each
/// applied with the same checksum; otherwise sqlx's own checks (a changed,
/// failed or unknown migration) say what is wrong. The table is sqlx's
/// default, the one `sqlx::migrate!` uses.
async fn run_if_needed<DB>(migrator: &Migrator, pool: &SqlxPool<DB>) -> Result<(), MigrateError>
where
    DB: Backend,
    DB::Connection: sqlx::migrate::Migrate,
    for<'c> &'c SqlxPool<DB>: Executor<'c, Database = DB>,
    <DB as Backend>::Arguments: IntoArguments<DB>,
    (i64, Vec<u8>, bool): for<'r> sqlx::FromRow<'r, DB::Row>,
{
    // A database without the table (a new one) fails here: sqlx creates it.
    let applied: Vec<(i64, Vec<u8>, bool)> =
        sqlx::query_as("select version, checksum, success from _sqlx_migrations")
            .fetch_all(pool)
            .await
            .unwrap_or_default();
    if is_current(migrator, &applied) {
        tracing::debug!("the migrations are applied");
        return Ok(());
    }
    migrator.run(pool).await?;
    Ok(())
}

/// Whether `applied` (version, checksum, success) is exactly `migrator`'s
/// migrations, each applied with its checksum.
fn is_current(migrator: &Migrator, applied: &[(i64, Vec<u8>, bool)]) -> bool {
    let mut ups = migrator
        .iter()
        .filter(|migration| migration.migration_type.is_up_migration());
    let count = ups.clone().count();
    applied.len() == count
        && ups.all(|migration| {
            applied.iter().any(|(version, checksum, success)| {
                *success && *version == migration.version && checksum[..] == migration.checksum[..]
            })
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_changed_failed_or_unknown_migration_is_not_current() {
        let all: Vec<(i64, Vec<u8>, bool)> = POSTGRES
            .iter()
            .map(|migration| (migration.version, migration.checksum.to_vec(), true))
            .collect();
        assert!(!all.is_empty());
        assert!(is_current(&POSTGRES, &all));
        assert!(!is_current(&POSTGRES, &all[1..]), "missing");
        let mut changed = all.clone();
        changed[0].1[0] ^= 1;
        assert!(!is_current(&POSTGRES, &changed), "changed");
        let mut failed = all.clone();
        failed[0].2 = false;
        assert!(!is_current(&POSTGRES, &failed), "failed");
        let mut newer = all.clone();
        newer.push((i64::MAX, vec![1], true));
        assert!(!is_current(&POSTGRES, &newer), "a newer binary's");
        assert!(!is_current(&POSTGRES, &[]));
    }
}
