//! Installing the change feed in a SQLite database: the feed and snapshot
//! tables, and row triggers on the watched table.

use sqlx::{AssertSqlSafe, SqlitePool};

use super::names::{ident, literal};
use super::store::{fleet, snapshot};
use crate::error::FeedError;
use crate::watch::Watch;

pub(super) const FEED_TABLE: &str = "
create table if not exists bloom_guard_changes (
    id integer primary key autoincrement,
    guard text not null,
    kind text not null,
    key,
    at integer not null default (cast(strftime('%s', 'now') as integer))
);
create table if not exists bloom_guard_horizon (below integer not null);
insert into bloom_guard_horizon (below) select 0 where not exists (select 1 from bloom_guard_horizon);
create table if not exists bloom_guard_identity (id text not null);
insert into bloom_guard_identity (id)
select lower(hex(randomblob(16))) where not exists (select 1 from bloom_guard_identity);
";

/// The database file's identity, written at install (empty before):
/// snapshot fingerprints include it.
pub(super) async fn identity(pool: &SqlitePool) -> Result<String, sqlx::Error> {
    let installed: bool = sqlx::query_scalar(
        "select exists(select 1 from sqlite_master where type = 'table' and name = 'bloom_guard_identity')",
    )
    .fetch_one(pool)
    .await?;
    if !installed {
        return Ok(String::new());
    }
    sqlx::query_scalar("select coalesce((select id from bloom_guard_identity limit 1), '')")
        .fetch_one(pool)
        .await
}

impl Watch {
    /// The canonical key of row `alias` in SQLite: as for Postgres (see
    /// [`Watch`]), a BLOB left as it is, for the reader to skip.
    fn sqlite_key(&self, alias: &str) -> String {
        let part = |column: &String| format!("{alias}.{}", ident(column));
        match self.key_columns.as_slice() {
            [one] => format!(
                "case typeof({0}) when 'blob' then {0} else cast({0} as text) end",
                part(one)
            ),
            columns => columns
                .iter()
                .map(|c| {
                    format!(
                        "cast(length(cast(cast({0} as text) as blob)) as text) || ':' || cast({0} as text)",
                        part(c)
                    )
                })
                .collect::<Vec<_>>()
                .join(" || "),
        }
    }

    /// The key type a guard over this table needs, from its key column's
    /// declared type and collation: `Integer` for `INTEGER` affinity,
    /// `CaseInsensitiveText` for `COLLATE NOCASE`, `SpacePaddedText` for
    /// `COLLATE RTRIM`, `Text` otherwise; composite keys are `Text`.
    ///
    /// # Errors
    ///
    /// [`FeedError::Uncomparable`] for a column no key type compares as
    /// SQLite does (numeric affinity, an application's collation);
    /// [`FeedError::Database`] if the table cannot be read or lacks a key
    /// column.
    pub(crate) async fn key_type_sqlite(
        &self,
        pool: &SqlitePool,
    ) -> Result<bloom_guard::KeyType, FeedError> {
        let columns = super::feed::key_columns(pool, self).await?;
        crate::follow::column::key_type_for(&self.table, &columns, self.key_columns.len())?.map_err(
            |collation| FeedError::Uncomparable(format!("{}: collation {collation}", self.table)),
        )
    }

    /// Installs the feed's table and this table's triggers in a SQLite
    /// database: every key written by any client (another instance, the
    /// `sqlite3` shell) reaches [`sqlite::Follower`](crate::sqlite::Follower)s. Idempotent:
    /// over a feed whose tables and triggers are current it is one read,
    /// with no write lock and no schema change, so every instance may call
    /// it at start.
    ///
    /// # Errors
    ///
    /// [`FeedError::Database`] if the table or a column does not exist.
    pub(crate) async fn install_sqlite(&self, pool: &SqlitePool) -> Result<(), FeedError> {
        crate::follow::column::comparable(
            &self.table,
            &super::feed::key_columns(pool, self).await?,
        )?;
        let triggers = self.sqlite_triggers();
        if installed(pool, &triggers).await? {
            tracing::debug!(table = %self.table, "the feed and the table's triggers are in place");
            return Ok(());
        }
        let (snapshot_tables, fleet_tables) = (snapshot::TABLES, fleet::TABLES);
        let mut script = format!("{FEED_TABLE}\n{snapshot_tables}\n{fleet_tables}\n");
        for (name, create) in &triggers {
            script.push_str(&format!(
                "drop trigger if exists {};\n{create};\n",
                ident(name)
            ));
        }
        run_script(pool, script).await?;
        Ok(())
    }

    /// This table's feed triggers, by name, each as the statement that
    /// creates it, in the words SQLite keeps in `sqlite_master` (it writes
    /// the first two keywords in capitals).
    fn sqlite_triggers(&self) -> Vec<(String, String)> {
        let table = ident(&self.table);
        let name = literal(self.feed_name());
        let (new_key, old_key) = (self.sqlite_key("new"), self.sqlite_key("old"));
        let [inserted, updated, deleted] = super::feed::trigger_names(self);
        vec![
            (
                format!(
                    "CREATE TRIGGER {} after insert on {table} when ({new_key}) is not null begin
                insert into bloom_guard_changes (guard, kind, key) values ({name}, 'i', {new_key});
            end",
                    ident(&inserted)
                ),
                inserted,
            ),
            (
                format!(
                    "CREATE TRIGGER {} after update on {table} when ({new_key}) is not ({old_key}) begin
                insert into bloom_guard_changes (guard, kind, key)
                select {name}, 'd', {old_key} where ({old_key}) is not null;
                insert into bloom_guard_changes (guard, kind, key)
                select {name}, 'i', {new_key} where ({new_key}) is not null;
            end",
                    ident(&updated)
                ),
                updated,
            ),
            (
                format!(
                    "CREATE TRIGGER {} after delete on {table} when ({old_key}) is not null begin
                insert into bloom_guard_changes (guard, kind, key) values ({name}, 'd', {old_key});
            end",
                    ident(&deleted)
                ),
                deleted,
            ),
        ]
        .into_iter()
        .map(|(create, name)| (name, create))
        .collect()
    }

    /// Stops recording this table's keys: drops the feed's triggers from
    /// it. A follower of the guard that still runs reports the gap and lets
    /// every request through (or puts the triggers back at its next check,
    /// as it does for a table rebuilt without them: stop the followers
    /// first).
    ///
    /// # Errors
    ///
    /// [`FeedError::Database`] if the database refuses the DDL.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn run(pool: sqlx::SqlitePool) -> Result<(), bloom_guard_sqlx::FeedError> {
    /// bloom_guard_sqlx::Watch::table("items").key("key").uninstall(&pool).await?;
    /// # Ok(()) }
    /// ```
    pub(crate) async fn uninstall_sqlite(&self, pool: &SqlitePool) -> Result<(), FeedError> {
        let script: String = super::feed::trigger_names(self)
            .iter()
            .map(|name| format!("drop trigger if exists {};", ident(name)))
            .collect();
        run_script(pool, script).await?;
        Ok(())
    }

    pub(super) fn sqlite_key_query(&self) -> String {
        format!(
            "select {} from {} as t",
            self.sqlite_key("t"),
            ident(&self.table)
        )
    }
}

/// The feed's tables, each of which `install_sqlite` creates.
const FEED_TABLES: [&str; 8] = [
    "bloom_guard_changes",
    "bloom_guard_horizon",
    "bloom_guard_identity",
    "bloom_guard_snapshots",
    "bloom_guard_snapshot_chunks",
    "bloom_guard_locks",
    "bloom_guard_settings",
    "bloom_guard_instances",
];

/// Whether every table of the feed exists and every one of `triggers` is
/// stored exactly as written: then installing again changes nothing, and
/// takes no write lock. One read.
async fn installed(pool: &SqlitePool, triggers: &[(String, String)]) -> Result<bool, sqlx::Error> {
    let stored: Vec<(String, String, Option<String>)> = sqlx::query_as(
        "select type, name, sql from sqlite_master
          where (type = 'table' or type = 'trigger') and name like 'bloom\\_guard\\_%' escape '\\'",
    )
    .fetch_all(pool)
    .await?;
    let has_table = |table: &str| {
        stored
            .iter()
            .any(|(kind, name, _)| kind == "table" && name == table)
    };
    let has_trigger = |(trigger, create): &(String, String)| {
        stored.iter().any(|(kind, name, sql)| {
            kind == "trigger" && name == trigger && sql.as_deref() == Some(create.as_str())
        })
    };
    Ok(FEED_TABLES.iter().all(|table| has_table(table)) && triggers.iter().all(has_trigger))
}

/// Runs `script` in one transaction that holds the write lock from its
/// start: an install running beside another (a follower putting triggers
/// back while an operator watches the table) waits for it, within the busy
/// timeout, instead of meeting its triggers half-made.
async fn run_script(pool: &SqlitePool, script: String) -> Result<(), sqlx::Error> {
    let mut tx = pool.begin_with("begin immediate").await?;
    sqlx::raw_sql(AssertSqlSafe(script))
        .execute(&mut *tx)
        .await?;
    tx.commit().await
}
