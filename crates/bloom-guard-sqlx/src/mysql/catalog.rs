//! What the MySQL server says about a watched table's triggers: their
//! names, definitions and versions, the writes that bypass them (gaps), and
//! the resync row a (re)install records.

use sqlx::{AssertSqlSafe, MySqlPool};

use super::names::{ident, located};
use crate::digest::row_digest;
use crate::watch::Watch;

/// A row trigger as `information_schema.triggers` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Trigger {
    pub(super) name: String,
    /// `after` or `before`, in lower case.
    pub(super) timing: String,
    /// `insert`, `update` or `delete`, in lower case.
    pub(super) event: String,
    pub(super) statement: String,
}

/// A trigger's name: at most 64 characters, as MySQL allows.
pub(super) fn trigger_name(watch: &Watch, event: &str) -> String {
    let name = format!("bloom_guard_{}_{event}", watch.feed_name());
    if name.len() <= 64 {
        return name;
    }
    let digest = row_digest(&[watch.feed_name()]);
    format!("bloom_guard_{digest}_{event}")
}

/// A reason writes to the watched table could bypass the feed, and
/// whether installing the triggers again mends it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Gap {
    pub(super) reason: String,
    pub(super) repairable: bool,
}

impl Gap {
    fn repairable(reason: String) -> Self {
        Self {
            reason,
            repairable: true,
        }
    }

    fn lasting(reason: String) -> Self {
        Self {
            reason,
            repairable: false,
        }
    }
}

/// The watched table's triggers as the server shows them.
pub(super) async fn stored_triggers(
    pool: &MySqlPool,
    watch: &Watch,
) -> Result<Vec<Trigger>, sqlx::Error> {
    let (schema, table) = located(watch);
    let rows: Vec<(String, String, String, String)> = sqlx::query_as(
        "select cast(trigger_name as char), lower(action_timing), lower(event_manipulation),
                cast(action_statement as char)
           from information_schema.triggers
          where event_object_schema = coalesce(?, database()) and event_object_table = ?",
    )
    .bind(&schema)
    .bind(&table)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(name, timing, event, statement)| Trigger {
            name,
            timing,
            event,
            statement,
        })
        .collect())
}

/// What keeps the feed from being complete: the feed not installed, a
/// trigger missing or not as installed (a table swapped by an online
/// schema change or recreated, a trigger rewritten, a key column's type
/// changed under it), writes that fire no trigger (a cascading foreign key
/// on a key column, a table not in InnoDB), or a server that takes writes
/// it does not run the triggers for (a replica). Empty when all is well.
pub(super) async fn gaps(pool: &MySqlPool, watch: &Watch) -> Result<Vec<Gap>, sqlx::Error> {
    let installed: i64 = sqlx::query_scalar(
        "select count(*) from information_schema.tables
          where table_schema = database() and table_name = 'bloom_guard_changes'",
    )
    .fetch_one(pool)
    .await?;
    if installed == 0 {
        return Ok(vec![Gap::repairable(
            "the change feed is not installed: call Watch::install".to_owned(),
        )]);
    }
    let mut gaps = server_gaps(pool).await?;
    let (schema, table) = located(watch);
    let engine: Option<String> = sqlx::query_scalar(
        "select cast(engine as char) from information_schema.tables
          where table_schema = coalesce(?, database()) and table_name = ?",
    )
    .bind(&schema)
    .bind(&table)
    .fetch_optional(pool)
    .await?
    .flatten();
    if let Some(engine) = engine.filter(|engine| !engine.eq_ignore_ascii_case("innodb")) {
        gaps.push(Gap::lasting(format!(
            "{}: its engine {engine} does not roll back with the feed, and the feed's ids cannot be settled for it; the feed needs InnoDB",
            ident(&table)
        )));
    }
    gaps.extend(cascades(pool, watch, schema.as_deref(), &table).await?);
    let binary: Option<Vec<bool>> = watch.mysql_binary(pool).await?.into_iter().collect();
    let stored = stored_triggers(pool, watch).await?;
    for expected in watch.mysql_expected_triggers(&binary.unwrap_or_default()) {
        match stored.iter().find(|found| found.name == expected.name) {
            None => gaps.push(Gap::repairable(format!(
                "{}: trigger {} is missing (or this user lacks the TRIGGER privilege, without which MySQL shows none)",
                ident(&table),
                expected.name
            ))),
            Some(found) if *found != expected => gaps.push(Gap::repairable(format!(
                "{}: trigger {} is not as Watch::install puts it (rewritten, or a key column's type changed)",
                ident(&table),
                expected.name
            ))),
            Some(_) => {}
        }
    }
    Ok(gaps)
}

/// Why this server's feed cannot be complete or ordered: it is read-only
/// (a replica: its primary's writes arrive late, and replicated row
/// events fire no trigger), or it replicates from another server. A
/// Galera node is neither: every node runs the triggers of its own
/// writes, and the feed is settled over every node (`galera.rs`).
async fn server_gaps(pool: &MySqlPool) -> Result<Vec<Gap>, sqlx::Error> {
    let mut gaps = Vec::new();
    let read_only: i64 = sqlx::query_scalar("select cast(@@global.read_only as signed)")
        .fetch_one(pool)
        .await?;
    if read_only != 0 {
        gaps.push(Gap::lasting(
            "the server is read-only (a replica?): writes on its primary reach this feed late, so a refusal here could miss a key just written there; follow the primary".to_owned(),
        ));
    }
    // Needs REPLICATION CLIENT (MySQL) or SLAVE MONITOR (MariaDB); without
    // it, this is not known.
    for statement in ["show replica status", "show slave status"] {
        match sqlx::raw_sql(statement).fetch_optional(pool).await {
            Ok(Some(_)) => {
                gaps.push(Gap::lasting(
                    "the server replicates from another (SHOW REPLICA STATUS): replicated writes fire no trigger and arrive late; follow the primary".to_owned(),
                ));
                break;
            }
            Ok(None) => break,
            Err(sqlx::Error::Database(_)) => {}
            Err(error) => return Err(error),
        }
    }
    Ok(gaps)
}

/// Foreign keys that update a key column by `ON UPDATE CASCADE`: MySQL
/// fires no trigger for a cascaded change, so the new key would be in no
/// feed.
async fn cascades(
    pool: &MySqlPool,
    watch: &Watch,
    schema: Option<&str>,
    table: &str,
) -> Result<Vec<Gap>, sqlx::Error> {
    let cascading: Vec<(String, String)> = sqlx::query_as(
        "select cast(k.constraint_name as char), cast(k.column_name as char)
           from information_schema.key_column_usage k
           join information_schema.referential_constraints r
             on r.constraint_schema = k.constraint_schema
            and r.constraint_name = k.constraint_name
            and r.table_name = k.table_name
          where k.table_schema = coalesce(?, database()) and k.table_name = ?
            and k.referenced_table_name is not null
            and r.update_rule = 'CASCADE'",
    )
    .bind(schema)
    .bind(table)
    .fetch_all(pool)
    .await?;
    Ok(cascading
        .into_iter()
        .filter(|(_, column)| {
            watch
                .key_columns
                .iter()
                .any(|key| key.eq_ignore_ascii_case(column))
        })
        .map(|(constraint, column)| {
            Gap::lasting(format!(
                "{}: foreign key {constraint} changes key column {column} by ON UPDATE CASCADE, which fires no trigger; make it ON UPDATE RESTRICT",
                ident(table)
            ))
        })
        .collect())
}

/// A name as InnoDB's table list spells it: ASCII letters, digits and
/// `_` as they are, other ASCII as `@` and four hex digits; `None` for
/// other characters, which it spells in ways not reproduced here.
fn innodb_name(name: &str) -> Option<String> {
    let mut spelled = String::with_capacity(name.len());
    for character in name.chars() {
        match character {
            'a'..='z' | 'A'..='Z' | '0'..='9' | '_' => spelled.push(character),
            other if other.is_ascii() => spelled.push_str(&format!("@{:04x}", u32::from(other))),
            _ => return None,
        }
    }
    Some(spelled)
}

/// The watched table's identity and its feed triggers' definitions and
/// creation times: it changes when writes may have bypassed the feed. The
/// identity is InnoDB's ids of the table, or of each of its partitions:
/// a table truncated or rebuilt, or a partition exchanged with another
/// table, gets new ones.
pub(super) async fn trigger_versions(
    pool: &MySqlPool,
    watch: &Watch,
) -> Result<String, sqlx::Error> {
    let (schema, table) = located(watch);
    let triggers: Option<String> = sqlx::query_scalar(
        "select group_concat(concat(trigger_name, '@', cast(created as char), '#', md5(action_statement))
                order by trigger_name separator ';')
           from information_schema.triggers
          where event_object_schema = coalesce(?, database()) and event_object_table = ?",
    )
    .bind(&schema)
    .bind(&table)
    .fetch_one(pool)
    .await?;
    let schema = match schema {
        Some(schema) => schema,
        None => sqlx::query_scalar::<_, Option<String>>("select database()")
            .fetch_one(pool)
            .await?
            .unwrap_or_default(),
    };
    let identity = match (innodb_name(&schema), innodb_name(&table)) {
        (Some(schema), Some(table)) => innodb_ids(pool, &format!("{schema}/{table}")).await?,
        _ => None,
    };
    Ok(format!(
        "{}|{}",
        identity.unwrap_or_default(),
        triggers.unwrap_or_default()
    ))
}

/// InnoDB's ids of table `inner_name` (`schema/table` as InnoDB spells
/// it) and of its partitions (`schema/table#P#p0`), in order.
async fn innodb_ids(pool: &MySqlPool, inner_name: &str) -> Result<Option<String>, sqlx::Error> {
    let partitions = format!("{inner_name}#");
    // MariaDB and MySQL 8 name InnoDB's table list differently.
    for list in ["innodb_sys_tables", "innodb_tables"] {
        let found = sqlx::query_scalar::<_, Option<String>>(AssertSqlSafe(format!(
            "select group_concat(cast(table_id as char) order by name separator ',')
               from information_schema.{list}
              where cast(name as binary) = cast(? as binary)
                 or left(cast(name as binary), ?) = cast(? as binary)"
        )))
        .bind(inner_name)
        .bind(i64::try_from(partitions.len()).unwrap_or(i64::MAX))
        .bind(&partitions)
        .fetch_one(pool)
        .await;
        match found {
            Ok(ids) => return Ok(ids),
            // No such table in this server's information schema: the other.
            Err(sqlx::Error::Database(error)) if error.code().as_deref() == Some("42S02") => {}
            Err(error) => return Err(error),
        }
    }
    Ok(None)
}

/// Records that writes bypassed feed `name`: every reader rebuilds.
///
/// The row's transaction modifies another row first, a transient one in
/// the horizon table: a transaction is counted as a holder of feed ids
/// once it modified rows (see `settle.rs`), and a trigger's feed row
/// always follows its table row, but this row has none to follow.
pub(super) async fn record_resync(pool: &MySqlPool, name: &str) -> Result<(), sqlx::Error> {
    let mut tx = pool.begin().await?;
    sqlx::query("insert into bloom_guard_horizon (below) values (-1)")
        .execute(&mut *tx)
        .await?;
    sqlx::query(
        "insert into bloom_guard_changes (guard, kind, k, at) values (?, 'r', '', unix_timestamp())",
    )
    .bind(name)
    .execute(&mut *tx)
    .await?;
    // The horizon is the greatest mark: gone again, the row changed nothing.
    sqlx::query("delete from bloom_guard_horizon where below = -1")
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(())
}
