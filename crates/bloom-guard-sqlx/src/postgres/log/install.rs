//! Putting a table on the log feed: its replica identity checked, the
//! table in the publication, the slot made, and never a table the
//! triggers feed.

use sqlx::PgPool;

use super::publication::{fed_ancestors, inherited, unseen};
use super::stream::LOGGED_MESSAGE;
use crate::postgres::install::{retrying_locks, DDL_LOCK_TIMEOUT};
use crate::watch::Watch;

use crate::postgres::install::published;
pub(crate) use crate::postgres::install::PUBLICATION;

/// The log feed's slot of the database `pool` reaches. Slots are the
/// server's, not a database's: the name carries the database's OID.
pub(crate) async fn slot_name(pool: &PgPool) -> Result<String, sqlx::Error> {
    sqlx::query_scalar(
        "select 'bloom_guard_' operator(pg_catalog.||) d.oid::text from pg_catalog.pg_database d
          where d.datname = pg_catalog.current_database()",
    )
    .fetch_one(pool)
    .await
}

/// The log feed's tables, over the change feed's schema.
const LOG_SQL: &str = include_str!("../../../sql/postgres_log.sql");

/// The comment on `bloom_guard.log_progress` that `LOG_SQL` leaves: the
/// schema is current.
const LOG_SCHEMA: &str = "bloom_guard log feed, schema 6";

/// Why a table cannot be put on the log feed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LogInstallError {
    #[error("database error")]
    Database(#[from] sqlx::Error),
    #[error(transparent)]
    Slot(#[from] super::error::SlotError),
    #[error("the log feed needs wal_level=logical (it is {0}): `alter system set wal_level = logical` and a restart")]
    WalLevel(String),
    #[error("{0} is fed by the feed's triggers: unwatch it first (switching feeds is a rebuild)")]
    Triggers(String),
    #[error("{0} has inheritance children (not partitions), whose changes the log feed's publication does not follow: use the feed's triggers for it")]
    Inherited(String),
    #[error("{table}: a delete would not carry key column {column}, which is not in the replica identity; make the key the primary key, `alter table {table} replica identity using index` a unique index on it, or `replica identity full` (every update and delete then logs the whole old row)")]
    Identity { table: String, column: String },
    #[error("{table} is a partition of {ancestors}, also on the log feed: the server publishes a partition's changes as its topmost published ancestor only, so {table}'s guard would get none; guard the ancestor, or feed {table} by triggers")]
    UnderFed { table: String, ancestors: String },
    #[error("{table} has partitions on the log feed ({partitions}): the server would publish their changes as {table}'s only, so their guards would get none; take them off the log feed first, or feed {table} by triggers")]
    OverFed { table: String, partitions: String },
    #[error("publication {PUBLICATION} was changed outside install_log ({0}), so changes of the fed tables can miss the feed: `alter publication {PUBLICATION} set (publish = 'insert, update, delete, truncate', publish_via_partition_root = true)`, drop the table from it and call install_log again (a rebuild follows)")]
    Publication(String),
    #[error("{table}: {members} of its partitions (or children) write no log the feed can read (unlogged, or a foreign table whose rows live on another server); make them logged (`alter table ... set logged`), or detach them, or feed the table by triggers")]
    Unseen { table: String, members: String },
}

impl Watch {
    /// `Watch::install_log` on Postgres: the table in the publication and
    /// its replica identity checked, the slot made.
    pub(crate) async fn install_postgres_log(
        &self,
        pool: &PgPool,
    ) -> Result<(), crate::error::FeedError> {
        self.put_on_log(pool).await.map_err(|error| match error {
            LogInstallError::Database(error)
            | LogInstallError::Slot(super::error::SlotError::Database(error)) => {
                crate::error::FeedError::Database(error)
            }
            other => crate::error::FeedError::LogFeed(other.to_string()),
        })
    }

    async fn put_on_log(&self, pool: &PgPool) -> Result<(), LogInstallError> {
        let wal_level: String =
            sqlx::query_scalar("select pg_catalog.current_setting('wal_level')")
                .fetch_one(pool)
                .await?;
        if wal_level != "logical" {
            return Err(LogInstallError::WalLevel(wal_level));
        }
        let triggers: bool = sqlx::query_scalar(
            "select exists (select from bloom_guard.watched where rel = $1::regclass)",
        )
        .bind(&self.table)
        .fetch_one(pool)
        .await?;
        if triggers {
            return Err(LogInstallError::Triggers(self.table.clone()));
        }
        if inherited(pool, &self.table).await? {
            return Err(LogInstallError::Inherited(self.table.clone()));
        }
        self.check_identity(pool).await?;
        // Before the first table, the log feed's tables are not there yet.
        let fed: bool =
            sqlx::query_scalar("select pg_catalog.to_regclass('bloom_guard.logged') is not null")
                .fetch_one(pool)
                .await?;
        let (ancestors, partitions): (Option<String>, Option<String>) = if !fed {
            (None, None)
        } else {
            sqlx::query_as(sqlx::AssertSqlSafe(format!(
                "select {}, (select pg_catalog.string_agg(f.rel::pg_catalog.text, ', ')
                               from bloom_guard.family(pg_catalog.to_regclass($1)) f(rel)
                              where f.rel <> pg_catalog.to_regclass($1)
                                and exists (select from bloom_guard.logged o where o.rel = f.rel))",
                fed_ancestors("pg_catalog.to_regclass($1)")
            )))
            .bind(&self.table)
            .fetch_one(pool)
            .await?
        };
        if let Some(ancestors) = ancestors {
            return Err(LogInstallError::UnderFed {
                table: self.table.clone(),
                ancestors,
            });
        }
        if let Some(partitions) = partitions {
            return Err(LogInstallError::OverFed {
                table: self.table.clone(),
                partitions,
            });
        }
        if let Some(members) = unseen(pool, &self.table).await? {
            return Err(LogInstallError::Unseen {
                table: self.table.clone(),
                members,
            });
        }
        self.warn_subscriptions(pool).await?;
        if !self.on_log_already(pool).await? {
            retrying_locks("install the log feed", || self.log_once(pool)).await?;
        }
        // Outside the transaction above: a slot is made on its own.
        super::slot::ensure(pool, &slot_name(pool).await?).await?;
        let keep: String =
            sqlx::query_scalar("select pg_catalog.current_setting('max_slot_wal_keep_size')")
                .fetch_one(pool)
                .await?;
        if keep == "-1" {
            tracing::warn!("max_slot_wal_keep_size is unlimited: while no instance streams the log feed's slot (the fleet down), the server keeps its write-ahead log until the disk fills; set a limit (a slot past it is made again, and the guards rebuild)");
        }
        Ok(())
    }

    /// `Watch::uninstall_log` on Postgres: the table out of the
    /// publication, and the publication dropped once no guard is left on it.
    pub(crate) async fn uninstall_postgres_log(
        &self,
        pool: &PgPool,
    ) -> Result<(), crate::error::FeedError> {
        retrying_locks("take a table off the log feed", || async {
            let mut tx = install_transaction(pool, "").await?;
            let (name, last): (String, bool) = sqlx::query_as(
                "with gone as (delete from bloom_guard.logged where guard = $1 and rel = $2::regclass)
                 select $2::regclass::text,
                        not exists (select from bloom_guard.logged
                                     where rel = $2::regclass and guard <> $1)",
            )
            .bind(self.feed_name())
            .bind(&self.table)
            .fetch_one(&mut *tx)
            .await?;
            if last && published(&mut *tx, &self.table).await? {
                sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                    "alter publication {PUBLICATION} drop table {name}"
                )))
                .execute(&mut *tx)
                .await?;
            }
            relogged(&mut tx).await?;
            tx.commit().await
        })
        .await?;
        Ok(())
    }

    /// Whether the log feed's schema is current (with its event trigger,
    /// for a superuser) and the table on it with these key columns, in the
    /// publication: nothing to write, no DDL right needed.
    async fn on_log_already(&self, pool: &PgPool) -> Result<bool, sqlx::Error> {
        let current: bool = sqlx::query_scalar(
            "select coalesce(pg_catalog.obj_description(pg_catalog.to_regclass('bloom_guard.log_progress'), 'pg_class') = $1, false)
                and (exists (select from pg_catalog.pg_event_trigger where evtname = 'bloom_guard_alter_logged_table')
                     or not (select r.rolsuper from pg_catalog.pg_roles r where r.rolname = current_user))",
        )
        .bind(LOG_SCHEMA)
        .fetch_one(pool)
        .await?;
        if !current {
            return Ok(false);
        }
        let logged: bool = sqlx::query_scalar(
            "select exists (select from bloom_guard.logged
                             where guard = $1 and rel = $2::regclass and key_columns = $3)",
        )
        .bind(self.feed_name())
        .bind(&self.table)
        .bind(&self.key_columns)
        .fetch_one(pool)
        .await?;
        Ok(logged && published(pool, &self.table).await?)
    }

    /// The tables, the table's row and its place in the publication, in
    /// one transaction under the feed's install lock.
    async fn log_once(&self, pool: &PgPool) -> Result<(), sqlx::Error> {
        let mut tx = install_transaction(
            pool,
            &format!("set local client_min_messages = warning; {LOG_SQL}"),
        )
        .await?;
        // Unchanged, the row is left as it is: its version is part of the
        // guard's fingerprint, and a start must not make the fleet rebuild.
        let changed = sqlx::query(
            "insert into bloom_guard.logged (guard, rel, key_columns) values ($1, $2::regclass, $3)
             on conflict (guard, rel) do update set key_columns = excluded.key_columns
              where bloom_guard.logged.key_columns is distinct from excluded.key_columns",
        )
        .bind(self.feed_name())
        .bind(&self.table)
        .bind(&self.key_columns)
        .execute(&mut *tx)
        .await?
        .rows_affected()
            > 0;
        let name: String = sqlx::query_scalar("select $1::regclass::text")
            .bind(&self.table)
            .fetch_one(&mut *tx)
            .await?;
        let published = published(&mut *tx, &self.table).await?;
        // The name as Postgres prints a regclass: quoted where it must be.
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "do $publication$ begin
                 if not exists (select from pg_catalog.pg_publication where pubname = '{PUBLICATION}') then
                     create publication {PUBLICATION} with (publish_via_partition_root = true);
                 end if;
             end $publication$;
             {add}",
            add = if published {
                String::new()
            } else {
                format!("alter publication {PUBLICATION} add table {name};")
            }
        )))
        .execute(&mut *tx)
        .await?;
        if changed || !published {
            relogged(&mut tx).await?;
        }
        tx.commit().await
    }

    /// Refuses a table whose replica identity lacks a key column: its
    /// deletes would reach the log without their key.
    pub(crate) async fn check_identity(&self, pool: &PgPool) -> Result<(), LogInstallError> {
        let (identity, columns): (String, Vec<String>) = sqlx::query_as(
            "select c.relreplident::pg_catalog.text,
                    coalesce((select pg_catalog.array_agg(a.attname::text)
                                from pg_catalog.pg_index i
                                join pg_catalog.pg_attribute a
                                  on a.attrelid = i.indrelid and a.attnum = any (i.indkey)
                               where i.indrelid = c.oid
                                 and ((c.relreplident = 'd' and i.indisprimary)
                                      or (c.relreplident = 'i' and i.indisreplident))),
                             '{}')
               from pg_catalog.pg_class c where c.oid = $1::regclass",
        )
        .bind(&self.table)
        .fetch_one(pool)
        .await?;
        self.identity_gap(&identity, &columns).map_or(Ok(()), Err)
    }

    /// Warns when the table is a logical replication subscription's target
    /// and its replica identity is not the primary key: the apply worker
    /// finds the rows an UPDATE or DELETE names by that identity, so the
    /// publisher must send its columns in the old rows.
    async fn warn_subscriptions(&self, pool: &PgPool) -> Result<(), sqlx::Error> {
        let subscriptions: Vec<(String, String)> = sqlx::query_as(
            "select s.subname::text, c.relreplident::text
               from pg_catalog.pg_subscription_rel r
               join pg_catalog.pg_subscription s on s.oid = r.srsubid
               join pg_catalog.pg_class c on c.oid = r.srrelid
              where r.srrelid = $1::regclass and c.relreplident <> 'd'",
        )
        .bind(&self.table)
        .fetch_all(pool)
        .await?;
        for (subscription, identity) in subscriptions {
            tracing::warn!(
                table = %self.table,
                subscription,
                identity = if identity == "f" { "full" } else { "using index" },
                "the table is a subscription's target and its replica identity is not its primary key: the apply worker finds updated and deleted rows by that identity, so the publisher must send its columns in old rows (the same replica identity there, or FULL), or the subscription stops or skips those rows"
            );
        }
        Ok(())
    }

    /// The error for a key column outside the replica identity
    /// `identity` (`relreplident`) of `columns`, if any.
    pub(crate) fn identity_gap(
        &self,
        identity: &str,
        columns: &[String],
    ) -> Option<LogInstallError> {
        if identity == "f" {
            return None;
        }
        self.key_columns
            .iter()
            .find(|column| !columns.contains(column))
            .map(|column| LogInstallError::Identity {
                table: self.table.clone(),
                column: column.clone(),
            })
    }
}

/// A transaction under the feed's install lock whose DDL waits for a lock
/// at most [`DDL_LOCK_TIMEOUT`], after `sql` (more statements) ran in it.
async fn install_transaction<'a>(
    pool: &'a PgPool,
    sql: &str,
) -> Result<sqlx::Transaction<'a, sqlx::Postgres>, sqlx::Error> {
    let mut tx = pool.begin().await?;
    sqlx::query(
        "select pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtext('bloom_guard.install'))",
    )
    .execute(&mut *tx)
    .await?;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "set local lock_timeout = '{DDL_LOCK_TIMEOUT}'; {sql}"
    )))
    .execute(&mut *tx)
    .await?;
    Ok(tx)
}

/// Writes to the log, in the transaction's commit order, that the log
/// feed's tables changed: the producer streaming now takes up the tables
/// as they are from this commit on. Its content, the transaction's id:
/// the producer reads the tables once this transaction is visible (the
/// log can be decoded a moment before).
async fn relogged(tx: &mut sqlx::PgConnection) -> Result<(), sqlx::Error> {
    sqlx::query(
        "select pg_catalog.pg_logical_emit_message(true, $1, pg_catalog.pg_current_xact_id()::text)",
    )
    .bind(LOGGED_MESSAGE)
    .execute(tx)
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests;
