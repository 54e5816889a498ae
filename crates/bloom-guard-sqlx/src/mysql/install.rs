//! Installing the change feed in a MySQL or MariaDB database: the feed,
//! snapshot and fleet tables, and row triggers on the watched table.

use std::sync::atomic::{AtomicBool, Ordering};

use sqlx::{AssertSqlSafe, MySqlPool};

use super::catalog::{self, Trigger};
use super::key_type;
use super::names::{ident, literal, table_ident, table_parts};
use super::uninstall::{ddl_connection, lock_wait_timed_out, DDL_LOCK_WAIT, TABLE_NAMES};
use crate::error::FeedError;
use crate::watch::Watch;

/// The feed's, the snapshots' and the fleet's tables. Idempotent.
pub(super) const TABLES: [&str; 9] = [
    "create table if not exists bloom_guard_changes (
        id bigint not null auto_increment primary key,
        guard varchar(255) not null,
        kind char(1) not null,
        k blob,
        at bigint not null
    ) engine = InnoDB",
    "create table if not exists bloom_guard_horizon (below bigint not null) engine = InnoDB",
    "insert into bloom_guard_horizon (below)
     select 0 from dual where not exists (select 1 from bloom_guard_horizon)",
    "create table if not exists bloom_guard_snapshots (
        id bigint not null auto_increment primary key,
        guard varchar(255) not null,
        format int not null,
        fingerprint varchar(255) not null,
        position longtext not null,
        scanned_at bigint not null,
        created_at double not null,
        len bigint not null,
        `keys` bigint not null,
        key bloom_guard_snapshots_guard (guard, id)
    ) engine = InnoDB",
    "create table if not exists bloom_guard_snapshot_chunks (
        snapshot bigint not null,
        seq int not null,
        data longblob not null,
        primary key (snapshot, seq)
    ) engine = InnoDB",
    "create table if not exists bloom_guard_settings (
        guard varchar(255) not null primary key,
        mode varchar(16),
        audit_rate double,
        updated_at bigint not null,
        check (mode in ('enforce', 'shadow', 'off')),
        check (audit_rate >= 0 and audit_rate <= 1)
    ) engine = InnoDB",
    "create table if not exists bloom_guard_instances (
        guard varchar(255) not null,
        id varchar(255) not null,
        seen_at bigint not null,
        report longtext not null,
        primary key (guard, id)
    ) engine = InnoDB",
    "create table if not exists bloom_guard_identity (id varchar(64) not null) engine = InnoDB",
    "insert into bloom_guard_identity (id)
     select replace(uuid(), '-', '') from dual where not exists (select 1 from bloom_guard_identity)",
];

/// Whether every table of [`TABLES`] exists with its one row where it has
/// one: then a start creates nothing (one read instead of nine
/// statements). Any error (a table missing) says no.
async fn tables_in_place(pool: &MySqlPool) -> bool {
    let names: Vec<String> = TABLE_NAMES.iter().map(|name| literal(name)).collect();
    sqlx::query_scalar::<_, i64>(AssertSqlSafe(format!(
        "select (select count(*) from information_schema.tables
                  where table_schema = database() and table_name in ({})) = {}
                and exists (select 1 from bloom_guard_horizon)
                and exists (select 1 from bloom_guard_identity)",
        names.join(", "),
        TABLE_NAMES.len()
    )))
    .fetch_one(pool)
    .await
    .is_ok_and(|in_place| in_place == 1)
}

/// The database file's identity, written at install (empty before):
/// snapshot fingerprints include it, so a snapshot restored into another
/// server is not taken for this one's.
pub(super) async fn identity(pool: &MySqlPool) -> Result<String, sqlx::Error> {
    let identity = sqlx::query_scalar::<_, String>(
        "select cast(coalesce(max(id), '') as char) from bloom_guard_identity",
    )
    .fetch_one(pool)
    .await;
    match identity {
        Ok(identity) => Ok(identity),
        // Not installed yet.
        Err(sqlx::Error::Database(error)) if error.code().as_deref() == Some("42S02") => {
            Ok(String::new())
        }
        Err(error) => Err(error),
    }
}

/// Whether a column of `data_type` holds binary strings, its key their
/// bytes.
pub(super) fn is_binary_string(data_type: &str) -> bool {
    matches!(
        data_type.to_ascii_lowercase().as_str(),
        "binary" | "varbinary" | "tinyblob" | "blob" | "mediumblob" | "longblob"
    )
}

impl Watch {
    /// The canonical key of row `alias` in MySQL, as bytes: as for
    /// Postgres (see [`Watch`]), a value's text as UTF-8 (numbers in
    /// decimal, a UUID with hyphens), a binary string as its bytes.
    /// `binary` says, per key column, whether it holds binary strings.
    fn mysql_key(&self, alias: &str, binary: &[bool]) -> String {
        let part = |index: usize, column: &String| {
            let column = format!("{alias}.{}", ident(column));
            if binary.get(index).copied().unwrap_or(false) {
                format!("cast({column} as binary)")
            } else {
                // Not `cast(x as binary)` alone: a MariaDB `uuid` gives its
                // 16 bytes that way, and a latin1 string its latin1 bytes.
                format!("cast(convert({column} using utf8mb4) as binary)")
            }
        };
        match self.key_columns.as_slice() {
            [one] => part(0, one),
            columns => {
                let parts: Vec<String> = columns
                    .iter()
                    .enumerate()
                    .map(|(index, column)| {
                        let value = part(index, column);
                        format!("cast(octet_length({value}) as binary), ':', {value}")
                    })
                    .collect();
                format!("concat({})", parts.join(", "))
            }
        }
    }

    /// Whether each key column, in the watch's order, holds binary strings
    /// (`None` for a column the table lacks).
    pub(super) async fn mysql_binary(
        &self,
        pool: &MySqlPool,
    ) -> Result<Vec<Option<bool>>, sqlx::Error> {
        let columns = key_type::columns(pool, self).await?;
        Ok(self
            .key_columns
            .iter()
            .map(|key| {
                columns
                    .iter()
                    .find(|(name, ..)| name.eq_ignore_ascii_case(key))
                    .map(|(_, data_type, _)| is_binary_string(data_type))
            })
            .collect())
    }

    /// The key query of a scan: every row's key, as bytes, or as the
    /// server weighs it under `collation` ([`Collation::weighed`](bloom_guard::keys::Collation::weighed)).
    pub(super) async fn mysql_key_query(
        &self,
        pool: &MySqlPool,
        collation: Option<&str>,
    ) -> Result<String, sqlx::Error> {
        let binary: Vec<bool> = self
            .mysql_binary(pool)
            .await?
            .into_iter()
            .map(|binary| binary.unwrap_or(false))
            .collect();
        let key = self.mysql_key("t", &binary);
        let key = match collation {
            Some(collation) => super::collation::weighed(&key, collation),
            None => key,
        };
        Ok(format!(
            "select {key} as k from {} as t",
            table_ident(&self.table)
        ))
    }

    /// The bodies of this table's three feed triggers, by event.
    pub(super) fn mysql_triggers(
        &self,
        binary: &[bool],
    ) -> [(&'static str, &'static str, String); 3] {
        let name = literal(self.feed_name());
        let (new, old) = (self.mysql_key("new", binary), self.mysql_key("old", binary));
        let insert = |kind: &str, key: &str| {
            format!(
                "insert into bloom_guard_changes (guard, kind, k, at) values ({name}, '{kind}', {key}, unix_timestamp())"
            )
        };
        [
            (
                "inserted",
                "insert",
                format!("if ({new}) is not null then {}; end if", insert("i", &new)),
            ),
            (
                "updated",
                "update",
                format!(
                    "if not (({new}) <=> ({old})) then
    if ({old}) is not null then {}; end if;
    if ({new}) is not null then {}; end if;
end if",
                    insert("d", &old),
                    insert("i", &new)
                ),
            ),
            (
                "deleted",
                "delete",
                format!("if ({old}) is not null then {}; end if", insert("d", &old)),
            ),
        ]
    }

    /// Installs the feed's tables and this table's triggers in a MySQL (8.0
    /// or later) or MariaDB (10.6 or later) database: every key written by
    /// any client (another instance, the `mysql` shell, `LOAD DATA`)
    /// reaches [`mysql::Follower`](crate::mysql::Follower)s. Idempotent: a
    /// trigger already as it should be is left alone; one of another
    /// version is replaced, and every follower rebuilds (writes between
    /// the drop and the create are in no feed).
    ///
    /// Needs the `CREATE` and `TRIGGER` privileges (with binary logging
    /// on, `SUPER` or `log_bin_trust_function_creators`). Followers need
    /// `PROCESS`, to read `information_schema.innodb_trx`, and `TRIGGER`
    /// on the watched table: MySQL shows a table's triggers only to users
    /// who have it, and a follower that sees none holds its guard open.
    ///
    /// # Errors
    ///
    /// [`FeedError::Database`] if the table or a column does not exist, or
    /// a privilege is missing; [`FeedError::Uncomparable`] for a key column
    /// no key type compares as the server does (see
    /// [`key_type_mysql`](Self::key_type_mysql)), with nothing installed.
    ///
    /// Each try of the triggers' DDL waits at most a second for the table's
    /// metadata lock (`lock_wait_timeout`), so writers never queue behind
    /// it longer, and is tried again until the transaction in its way
    /// ends.
    pub(crate) async fn install_mysql(&self, pool: &MySqlPool) -> Result<(), FeedError> {
        // One producer per table.
        #[cfg(feature = "binlog-feed")]
        if super::log::registry::is_logged(pool, self).await? {
            return Err(FeedError::LogFed(self.table.clone()));
        }
        crate::follow::column::comparable(&self.table, &key_type::key_columns(pool, self).await?)?;
        // One resync before the first drop, however many tries it takes.
        let resynced = AtomicBool::new(false);
        crate::ddl::retrying_locks("watch", DDL_LOCK_WAIT, lock_wait_timed_out, || {
            self.install_mysql_once(pool, &resynced)
        })
        .await?;
        Ok(())
    }

    /// One try of [`install_mysql`](Self::install_mysql) (a running
    /// follower's repair tries once per check). `resynced`: an earlier try
    /// recorded the resync that opens a replacement.
    pub(super) async fn install_mysql_once(
        &self,
        pool: &MySqlPool,
        resynced: &AtomicBool,
    ) -> Result<(), sqlx::Error> {
        if !tables_in_place(pool).await {
            for statement in TABLES {
                sqlx::query(statement).execute(pool).await?;
            }
        }
        let binary: Option<Vec<bool>> = self.mysql_binary(pool).await?.into_iter().collect();
        let binary = match binary {
            Some(binary) if !binary.is_empty() => binary,
            _ => {
                return Err(sqlx::Error::ColumnNotFound(format!(
                    "{}: the table or a key column (the watch names {:?})",
                    self.table, self.key_columns
                )))
            }
        };
        let (schema, _) = table_parts(&self.table);
        let table_sql = table_ident(&self.table);
        let stored = catalog::stored_triggers(pool, self).await?;
        let expected = self.mysql_expected_triggers(&binary);
        let missing: Vec<&Trigger> = expected
            .iter()
            .filter(|expected| !stored.contains(expected))
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        let ours = stored
            .iter()
            .any(|found| expected.iter().any(|expected| expected.name == found.name));
        // Replacing a trigger, or creating one beside others (an earlier
        // try dropped it and could not create it again): writes between
        // the drop and the create are in no feed. Every follower holds open
        // from the first record until it rebuilt after the second, below.
        let replacing = ours || resynced.load(Ordering::Acquire);
        if replacing && !resynced.swap(true, Ordering::AcqRel) {
            catalog::record_resync(pool, self.feed_name()).await?;
        }
        // One connection at a time: the DDL's, then the pool's again.
        let mut ddl = ddl_connection(pool).await?;
        for expected in missing {
            let qualified = match &schema {
                Some(schema) => format!("{}.{}", ident(schema), ident(&expected.name)),
                None => ident(&expected.name),
            };
            // Trigger DDL as plain text: MySQL prepares no CREATE TRIGGER.
            sqlx::raw_sql(AssertSqlSafe(format!("drop trigger if exists {qualified}")))
                .execute(&mut *ddl)
                .await?;
            sqlx::raw_sql(AssertSqlSafe(format!(
                "create trigger {qualified} {} {} on {table_sql} for each row {}",
                expected.timing, expected.event, expected.statement
            )))
            .execute(&mut *ddl)
            .await?;
        }
        drop(ddl);
        if replacing {
            catalog::record_resync(pool, self.feed_name()).await?;
        }
        Ok(())
    }

    /// The feed triggers this table should have, given which key columns
    /// hold binary strings.
    pub(super) fn mysql_expected_triggers(&self, binary: &[bool]) -> Vec<Trigger> {
        self.mysql_triggers(binary)
            .into_iter()
            .map(|(event, verb, body)| Trigger {
                name: catalog::trigger_name(self, event),
                timing: "after".to_owned(),
                event: verb.to_owned(),
                statement: format!("begin\n{body};\nend"),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn composite_keys_prefix_each_part_with_its_length() {
        let watch = Watch::table("orders").key("tenant").key("number");
        let key = watch.mysql_key("new", &[false, true]);
        assert_eq!(
            key,
            "concat(cast(octet_length(cast(convert(new.`tenant` using utf8mb4) as binary)) as binary), ':', cast(convert(new.`tenant` using utf8mb4) as binary), cast(octet_length(cast(new.`number` as binary)) as binary), ':', cast(new.`number` as binary))"
        );
    }
}
