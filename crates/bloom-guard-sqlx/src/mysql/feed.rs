//! Reading the MySQL change feed without skipping a late commit, pruning
//! it, checking its triggers and the key columns.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use futures_util::TryStreamExt;
use sqlx::mysql::MySqlRow;
use sqlx::{AssertSqlSafe, Connection, MySqlConnection, MySqlPool, Row as _};

use super::cursor::{Cursor, OpenIds};
use super::install::{ident, table_parts, Trigger};
use super::settle::Settled;
use crate::digest::row_digest;
use crate::follow::changes::Changes;
use crate::follow::column::{Comparison, KeyColumn};
use crate::follow::Read;
use crate::kept::KeptConnection;
use crate::watch::Watch;

/// Open ids asked for by value; more are read as a range and filtered.
const OPEN_BY_VALUE: u64 = 1000;

/// A feed row: id, guard, kind, key, time.
type Row = (i64, String, String, Option<Vec<u8>>, i64);

const COLUMNS: &str = "id, guard, kind, k, at";

/// The digest of a feed row, as a cursor keeps it.
fn digest_of((id, guard, kind, key, at): &Row) -> String {
    let key = key.as_deref().map(hex).unwrap_or_default();
    row_digest(&[&id.to_string(), guard, kind, &key, &at.to_string()])
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// The transaction every read of the feed runs in: one snapshot, taken
/// at its start, in `REPEATABLE READ` whatever the server's or the
/// session's default (under `READ COMMITTED` each statement would see
/// another moment; under `SERIALIZABLE` reads would lock).
pub(super) const SNAPSHOT: &str = "set transaction isolation level repeatable read; start transaction with consistent snapshot, read only";

/// The feed's position as `conn`'s snapshot sees it, ids up to `settled`
/// settled: the highest row, and the ids below it not visible yet.
pub(super) async fn position_in(
    conn: &mut MySqlConnection,
    settled: i64,
) -> Result<Cursor, sqlx::Error> {
    let below = horizon(&mut *conn).await?;
    let lower = settled.max(below - 1).max(0);
    let mut ids =
        sqlx::query_scalar::<_, i64>("select id from bloom_guard_changes where id > ? order by id")
            .bind(lower)
            .fetch(&mut *conn);
    let mut open = OpenIds::new();
    let mut high = lower;
    while let Some(id) = ids.try_next().await? {
        open.insert_run(high + 1, id - 1);
        high = id;
    }
    drop(ids);
    if high > lower {
        if let Some(row) = row_at(&mut *conn, high).await? {
            return Ok(Cursor {
                high,
                digest: Some(digest_of(&row)),
                open,
            });
        }
    }
    // Nothing visible above `lower`: the ids up to it are settled (those
    // not visible never commit) or below the horizon. The highest row at
    // or below it anchors the position, if pruning left one in reach.
    let anchor: Option<Row> = sqlx::query_as(AssertSqlSafe(format!(
        "select {COLUMNS} from bloom_guard_changes where id <= ? order by id desc limit 1"
    )))
    .bind(lower)
    .fetch_optional(&mut *conn)
    .await?;
    Ok(match anchor {
        Some(row) if row.0 + 1 >= below => Cursor {
            high: row.0,
            digest: Some(digest_of(&row)),
            open: OpenIds::new(),
        },
        // Pruned empty: the position holds while the horizon stays above.
        _ if below > 1 => Cursor {
            high: below - 1,
            digest: None,
            open: OpenIds::new(),
        },
        _ => Cursor::START,
    })
}

async fn row_at(conn: &mut MySqlConnection, id: i64) -> Result<Option<Row>, sqlx::Error> {
    sqlx::query_as(AssertSqlSafe(format!(
        "select {COLUMNS} from bloom_guard_changes where id = ?"
    )))
    .bind(id)
    .fetch_optional(conn)
    .await
}

async fn horizon(conn: &mut MySqlConnection) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("select cast(coalesce(max(below), 0) as signed) from bloom_guard_horizon")
        .fetch_one(conn)
        .await
}

/// The rows after `since` (the ids above its highest, and its open ones):
/// the condition on `{table}id` and its values.
fn after(since: &Cursor, table: &str) -> (String, Vec<i64>) {
    let open = &since.open;
    match open.first() {
        None => (format!("{table}id > ?"), vec![since.high]),
        Some(_) if open.len() <= OPEN_BY_VALUE => {
            let marks = vec!["?"; open.ids().count()].join(", ");
            let mut values = vec![since.high];
            values.extend(open.ids());
            (format!("({table}id > ? or {table}id in ({marks}))"), values)
        }
        // Many open ids (a long transaction held them): the range from the
        // first, filtered as it is read.
        Some(first) => (format!("{table}id >= ?"), vec![first]),
    }
}

/// The session a follower's kept connection reads in: `REPEATABLE READ`
/// whatever the server's or the pool's default (a read is one statement,
/// which reads one consistent view under it; under `READ UNCOMMITTED` it
/// would see rows that may yet roll back).
pub(super) const READ_SESSION: &str = "set session transaction isolation level repeatable read";

/// The connection a follower keeps for its feed reads.
pub(super) fn feed_connection(pool: &MySqlPool) -> KeptConnection<MySqlConnection> {
    KeptConnection::new(pool.connect_options().as_ref().clone(), Some(READ_SESSION))
}

/// Reads the changes of feed `name` after `since`, in one statement on
/// the kept connection: the rows after the cursor (every feed's: the
/// cursor follows ids), the horizon and the row at the cursor, in one
/// consistent view. A read that failed closes the connection.
pub(super) async fn read_since(
    kept: &KeptConnection<MySqlConnection>,
    settled: &Arc<Settled>,
    pool: &MySqlPool,
    name: &str,
    since: &Cursor,
) -> Result<Read<Cursor>, sqlx::Error> {
    // Settled before the statement's view: an id up to it that this read
    // does not see never commits. A position with open ids moves the
    // method on.
    let settled = if since.open.is_empty() {
        settled.now()
    } else {
        settled.advance(pool)
    };
    let (condition, values) = after(since, "c.");
    let statement = format!(
        "select h.below, m.id, m.guard, m.kind, m.k, m.at, c.id, c.guard, c.kind, c.k, c.at
         from (select cast(coalesce(max(below), 0) as signed) as below from bloom_guard_horizon) h
         left join bloom_guard_changes m on m.id = ?
         left join bloom_guard_changes c on {condition}
         order by c.id"
    );
    let mut query = sqlx::query(AssertSqlSafe(statement)).bind(since.high);
    for value in values {
        query = query.bind(value);
    }
    let mut lease = kept.lease().await?;
    let read =
        crate::kept::within_timeout(read_rows(query, lease.connection(), since, name)).await?;
    lease.keep();
    let (first, changes, seen, last) = read;
    let (below, at_high) = first.ok_or(sqlx::Error::RowNotFound)?;
    // Pruning moves the horizon before it deletes: rows this reader still
    // needs may be gone once it passed them.
    if since.high + 1 < below || since.open.first().is_some_and(|first| first < below) {
        return Ok(Read::Pruned);
    }
    // The row at the position must still be the one it was taken at, or
    // gone by pruning: otherwise the feed was rewritten under the reader.
    if since.high > 0 {
        match at_high {
            Some(row) if Some(digest_of(&row)) == since.digest => {}
            None if since.high < below => {}
            _ => return Ok(Read::Pruned),
        }
    }
    let mut reached = since.clone();
    if let Some(row) = last.filter(|row| row.0 > since.high) {
        reached.open.insert_run(since.high + 1, row.0 - 1);
        reached.high = row.0;
        reached.digest = Some(digest_of(&row));
    }
    reached.open.remove_up_to(settled);
    for id in seen {
        reached.open.remove(id);
    }
    Ok(Read::Changes {
        position: reached,
        changes,
    })
}

/// What one read statement brought: the horizon and the row at the
/// cursor, the changes of feed `name`, the ids seen, the last row.
type ReadRows = (
    Option<(i64, Option<Row>)>,
    Changes,
    BTreeSet<i64>,
    Option<Row>,
);

/// Runs the read statement and gathers its rows.
async fn read_rows(
    query: sqlx::query::Query<'_, sqlx::MySql, sqlx::mysql::MySqlArguments>,
    connection: &mut MySqlConnection,
    since: &Cursor,
    name: &str,
) -> Result<ReadRows, sqlx::Error> {
    let mut rows = query.fetch(connection);
    let mut changes = Changes::default();
    let mut seen = BTreeSet::new();
    let mut last: Option<Row> = None;
    let mut first = None;
    while let Some(row) = rows.try_next().await? {
        if first.is_none() {
            let below: i64 = row.try_get(0)?;
            first = Some((below, row_from(&row, 1)?));
        }
        let Some(row) = row_from(&row, 6)? else {
            continue; // the one row of a read that found nothing
        };
        let id = row.0;
        if id <= since.high && !since.open.contains(id) {
            continue;
        }
        seen.insert(id);
        if row.1 == name {
            changes.record(&row.2, row.3.as_deref());
        }
        last = Some(row);
    }
    Ok((first, changes, seen, last))
}

/// The feed row in the five columns from `from`, if it is not null.
fn row_from(row: &MySqlRow, from: usize) -> Result<Option<Row>, sqlx::Error> {
    let Some(id) = row.try_get::<Option<i64>, _>(from)? else {
        return Ok(None);
    };
    Ok(Some((
        id,
        row.try_get(from + 1)?,
        row.try_get(from + 2)?,
        row.try_get(from + 3)?,
        row.try_get(from + 4)?,
    )))
}

/// Counts the rows of feed `name` after `since`, up to `limit`.
pub(super) async fn pending(
    pool: &MySqlPool,
    name: &str,
    since: &Cursor,
    limit: u64,
) -> Result<u64, sqlx::Error> {
    let (condition, values) = after(since, "");
    let mut query = sqlx::query_scalar::<_, i64>(AssertSqlSafe(format!(
        "select cast(count(*) as signed) from (
            select 1 from bloom_guard_changes where guard = ? and {condition} limit ?) as pending"
    )))
    .bind(name);
    for value in values {
        query = query.bind(value);
    }
    let count = query
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_one(pool)
        .await?;
    Ok(count.max(0) as u64)
}

/// Rows deleted by one statement of a prune: short locks.
const PRUNE_BATCH: i64 = 5000;

/// Moves the horizon past the rows older than the retention, never past
/// `settled` (an id above it may still commit), then deletes them; how
/// many. One instance at a time: the others find the lock taken.
pub(super) async fn prune(
    pool: &MySqlPool,
    settled: i64,
    retention: Duration,
) -> Result<i64, sqlx::Error> {
    let mut conn = pool.acquire().await?;
    let locked: Option<i64> = sqlx::query_scalar(
        "select get_lock(concat('bloom_guard.prune.', left(sha2(database(), 256), 40)), 0)",
    )
    .fetch_one(&mut *conn)
    .await?;
    if locked != Some(1) {
        return Ok(0);
    }
    let pruned = prune_locked(&mut conn, settled, retention).await;
    let released = sqlx::query(
        "select release_lock(concat('bloom_guard.prune.', left(sha2(database(), 256), 40)))",
    )
    .execute(&mut *conn)
    .await;
    if released.is_err() {
        // The lock goes with the session.
        drop(conn.detach());
    }
    pruned
}

async fn prune_locked(
    conn: &mut MySqlConnection,
    settled: i64,
    retention: Duration,
) -> Result<i64, sqlx::Error> {
    // A plain read: no locks in the writers' way.
    let old: Option<i64> = sqlx::query_scalar(
        "select cast(max(id) as signed) from bloom_guard_changes where at < unix_timestamp() - ?",
    )
    .bind(i64::try_from(retention.as_secs()).unwrap_or(i64::MAX))
    .fetch_one(&mut *conn)
    .await?;
    let Some(old) = old else {
        return Ok(0);
    };
    sqlx::query("update bloom_guard_horizon set below = greatest(below, ?)")
        .bind((old + 1).min(settled + 1))
        .execute(&mut *conn)
        .await?;
    let below = horizon(&mut *conn).await?;
    let mut deleted = 0;
    loop {
        // Row locks only, no gap locks: writers append meanwhile.
        let mut tx = conn
            .begin_with("set transaction isolation level read committed; start transaction")
            .await?;
        let batch = sqlx::query("delete from bloom_guard_changes where id < ? order by id limit ?")
            .bind(below)
            .bind(PRUNE_BATCH)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        tx.commit().await?;
        deleted += i64::try_from(batch).unwrap_or(i64::MAX);
        if batch < PRUNE_BATCH.unsigned_abs() {
            return Ok(deleted);
        }
    }
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

/// The watched table's schema, if the watch names one (else the
/// connection's database: queries ask `coalesce(?, database())`), and
/// its name.
fn located(watch: &Watch) -> (Option<String>, String) {
    table_parts(&watch.table)
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
/// on a key column, a table not in InnoDB), a server that takes writes it
/// does not run the triggers for, or cannot order them (a replica, a
/// Galera node). Empty when all is well.
pub(super) async fn gaps(pool: &MySqlPool, watch: &Watch) -> Result<Vec<Gap>, sqlx::Error> {
    let installed: i64 = sqlx::query_scalar(
        "select count(*) from information_schema.tables
          where table_schema = database() and table_name = 'bloom_guard_changes'",
    )
    .fetch_one(pool)
    .await?;
    if installed == 0 {
        return Ok(vec![Gap::repairable(
            "the change feed is not installed: call Watch::install_mysql".to_owned(),
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
                "{}: trigger {} is not as Watch::install_mysql puts it (rewritten, or a key column's type changed)",
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
/// events fire no trigger), it replicates from another server, or it is a
/// Galera node (other nodes' writes arrive late, with interleaved ids).
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
    match sqlx::query_scalar::<_, i64>("select cast(@@global.wsrep_on as signed)")
        .fetch_one(pool)
        .await
    {
        Ok(0) => {}
        Ok(_) => gaps.push(Gap::lasting(
            "the server is a Galera node (wsrep_on): writes on other nodes reach this feed late and out of id order; the MySQL feed needs one primary".to_owned(),
        )),
        // Not MariaDB: no such variable.
        Err(sqlx::Error::Database(_)) => {}
        Err(error) => return Err(error),
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

/// Whether the watched table has every key column.
pub(super) async fn has_key_columns(pool: &MySqlPool, watch: &Watch) -> Result<bool, sqlx::Error> {
    let columns = columns(pool, watch).await?;
    Ok(watch.key_columns.iter().all(|key| {
        columns
            .iter()
            .any(|(column, ..)| column.eq_ignore_ascii_case(key))
    }))
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

/// The watched table's columns: name, data type, collation (none for
/// numbers and binary strings).
pub(super) async fn columns(
    pool: &MySqlPool,
    watch: &Watch,
) -> Result<Vec<(String, String, Option<String>)>, sqlx::Error> {
    let (schema, table) = located(watch);
    sqlx::query_as(
        "select cast(column_name as char), cast(data_type as char), cast(collation_name as char)
           from information_schema.columns
          where table_schema = coalesce(?, database()) and table_name = ?
          order by ordinal_position",
    )
    .bind(schema)
    .bind(table)
    .fetch_all(pool)
    .await
}

/// The watched key columns, in the watch's order.
pub(super) async fn key_columns(
    pool: &MySqlPool,
    watch: &Watch,
) -> Result<Vec<KeyColumn>, sqlx::Error> {
    let columns = columns(pool, watch).await?;
    Ok(watch
        .key_columns
        .iter()
        .filter_map(|key| {
            let (name, data_type, collation) = columns
                .iter()
                .find(|(name, ..)| name.eq_ignore_ascii_case(key))?;
            Some(KeyColumn {
                name: name.clone(),
                comparison: comparison(data_type, collation.as_deref()),
            })
        })
        .collect())
}

/// How MySQL compares a key column of `data_type` under `collation`.
pub(super) fn comparison(data_type: &str, collation: Option<&str>) -> Comparison {
    let data_type = data_type.to_ascii_lowercase();
    match data_type.as_str() {
        "tinyint" | "smallint" | "mediumint" | "int" | "integer" | "bigint" => {
            return Comparison::Integer
        }
        "uuid" => return Comparison::Uuid,
        // Bytes as they are; `binary(n)` pads with zero bytes, which no
        // request carries.
        "varbinary" | "tinyblob" | "blob" | "mediumblob" | "longblob" => return Comparison::Exact,
        _ => {}
    }
    let Some(collation) = collation.map(str::to_ascii_lowercase) else {
        return Comparison::Unmatched(format!(
            "a {data_type} column compares its values, not their text"
        ));
    };
    let no_pad = collation.contains("nopad") || collation.contains("0900");
    let binary = collation.ends_with("_bin") || collation == "binary";
    match (binary, no_pad, data_type.as_str()) {
        (true, true, "varchar" | "tinytext" | "text" | "mediumtext" | "longtext") => {
            Comparison::Exact
        }
        (true, _, "char") => Comparison::Unmatched(
            "a char column pads its values with spaces; use varchar with a NO PAD binary collation".to_owned(),
        ),
        (true, false, _) => Comparison::Unmatched(format!(
            "its collation {collation} ignores trailing spaces (PAD SPACE): `abc ` finds `abc`; use a NO PAD binary collation (utf8mb4_nopad_bin on MariaDB, utf8mb4_0900_bin on MySQL) or varbinary"
        )),
        _ => Comparison::Unmatched(format!(
            "its collation {collation} equates spellings no key type reproduces (case, accents, trailing spaces); use a NO PAD binary collation (utf8mb4_nopad_bin on MariaDB, utf8mb4_0900_bin on MySQL) or varbinary"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_byte_exact_columns_compare_as_text() {
        assert_eq!(comparison("bigint", None), Comparison::Integer);
        assert_eq!(comparison("varbinary", None), Comparison::Exact);
        assert_eq!(
            comparison("varchar", Some("utf8mb4_nopad_bin")),
            Comparison::Exact
        );
        assert_eq!(
            comparison("VARCHAR", Some("utf8mb4_0900_bin")),
            Comparison::Exact
        );
        for (data_type, collation) in [
            ("varchar", Some("utf8mb4_bin")),
            ("varchar", Some("utf8mb4_general_ci")),
            ("varchar", Some("utf8mb4_0900_ai_ci")),
            ("char", Some("utf8mb4_nopad_bin")),
            ("date", None),
        ] {
            assert!(
                matches!(comparison(data_type, collation), Comparison::Unmatched(_)),
                "{data_type} {collation:?}"
            );
        }
    }

    #[test]
    fn reads_ask_for_open_ids_by_value_up_to_a_bound() {
        let mut since = Cursor {
            high: 10,
            digest: None,
            open: [3, 7].into_iter().collect(),
        };
        assert_eq!(
            after(&since, ""),
            ("(id > ? or id in (?, ?))".to_owned(), vec![10, 3, 7])
        );
        since.open = (1..=2000).collect();
        since.high = 3000;
        assert_eq!(after(&since, ""), ("id >= ?".to_owned(), vec![1]));
        since.open = OpenIds::new();
        assert_eq!(after(&since, ""), ("id > ?".to_owned(), vec![3000]));
    }
}
