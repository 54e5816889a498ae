//! Putting a table on the binary log feed: the server's log checked (on,
//! in `ROW` format, with the key in every row image a delete or a key
//! change writes), the key columns' types checked (the feed reads their
//! bytes from the log as the triggers would write them), the table
//! registered for the producer, and never a table the triggers feed.

use sqlx::{AssertSqlSafe, MySqlPool};

use super::super::catalog;
use super::super::key_type;
use super::super::names::located;
use super::position::{log_end, SERVER};
use crate::error::FeedError;
use crate::watch::Watch;

/// The binary log feed's tables: its rows, the producer's progress (with
/// the feed's epoch and pruned horizon), and the tables on it. Idempotent.
pub(super) const TABLES: [&str; 3] = [
    "create table if not exists bloom_guard_log_changes (
        id bigint not null auto_increment primary key,
        guard varchar(255) not null,
        kind char(1) not null,
        k blob,
        at bigint not null,
        seq bigint not null,
        pos bigint not null,
        point bigint not null,
        key bloom_guard_log_changes_point (guard, point)
    ) engine = InnoDB",
    "create table if not exists bloom_guard_log_progress (
        id int not null primary key,
        server varchar(600) not null,
        epoch varchar(64) not null,
        file varchar(255) not null,
        seq bigint not null,
        pos bigint not null,
        below_seq bigint not null default 0,
        below_pos bigint not null default 0,
        at bigint not null
    ) engine = InnoDB",
    "create table if not exists bloom_guard_log_tables (
        guard varchar(255) not null primary key,
        table_schema varchar(64) not null,
        table_name varchar(64) not null,
        key_columns text not null,
        installed_at bigint not null
    ) engine = InnoDB",
];

/// The column types whose bytes in the log are the bytes the triggers
/// write: integers, strings in a UTF-8 or ASCII character set, binary
/// strings.
fn logged_type(data_type: &str, charset: Option<&str>) -> bool {
    let data_type = data_type.to_ascii_lowercase();
    let integer = matches!(
        data_type.as_str(),
        "tinyint" | "smallint" | "mediumint" | "int" | "integer" | "bigint"
    );
    let binary = matches!(
        data_type.as_str(),
        "binary" | "varbinary" | "tinyblob" | "blob" | "mediumblob" | "longblob"
    );
    let text = matches!(
        data_type.as_str(),
        "char" | "varchar" | "tinytext" | "text" | "mediumtext" | "longtext"
    ) && matches!(
        charset.map(str::to_ascii_lowercase).as_deref(),
        Some("utf8mb4" | "utf8mb3" | "utf8" | "ascii")
    );
    integer || binary || text
}

/// What the install needs to know of one column.
#[derive(Debug)]
struct Column {
    name: String,
    data_type: String,
    column_type: String,
    charset: Option<String>,
    in_primary_key: i64,
}

async fn table_columns(
    pool: &MySqlPool,
    schema: &str,
    table: &str,
) -> Result<Vec<Column>, sqlx::Error> {
    type Row = (String, i64, String, String, Option<String>, i64);
    let rows: Vec<Row> = sqlx::query_as(
        "select cast(c.column_name as char) as name, cast(c.ordinal_position as signed) as position,
                cast(c.data_type as char) as data_type, cast(c.column_type as char) as column_type,
                cast(c.character_set_name as char) as charset,
                cast(exists (select 1 from information_schema.key_column_usage k
                              where k.table_schema = c.table_schema and k.table_name = c.table_name
                                and k.constraint_name = 'PRIMARY' and k.column_name = c.column_name)
                     as signed) as in_primary_key
           from information_schema.columns c
          where c.table_schema = ? and c.table_name = ?
          order by c.ordinal_position",
    )
    .bind(schema)
    .bind(table)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(
            |(name, _, data_type, column_type, charset, in_primary_key)| Column {
                name,
                data_type,
                column_type,
                charset,
                in_primary_key,
            },
        )
        .collect())
}

async fn schema_of(pool: &MySqlPool, watch: &Watch) -> Result<(String, String), sqlx::Error> {
    let (schema, table) = located(watch);
    let schema = match schema {
        Some(schema) => schema,
        None => sqlx::query_scalar::<_, Option<String>>("select database()")
            .fetch_one(pool)
            .await?
            .unwrap_or_default(),
    };
    Ok((schema, table))
}

/// Why the server's binary log cannot feed `watch`'s table, if it cannot.
pub(super) async fn log_settings_gap(
    pool: &MySqlPool,
    watch: &Watch,
) -> Result<Option<String>, sqlx::Error> {
    let (log_bin, format, image): (i64, String, String) = sqlx::query_as(
        "select cast(@@global.log_bin as signed), cast(@@global.binlog_format as char),
                cast(@@global.binlog_row_image as char)",
    )
    .fetch_one(pool)
    .await?;
    let galera: Option<(String, String)> = sqlx::query_as("show variables like 'wsrep_on'")
        .fetch_optional(pool)
        .await?;
    if galera.is_some_and(|(_, on)| on.eq_ignore_ascii_case("ON")) {
        return Ok(Some(
            "the server is a Galera node (wsrep_on): each node writes a binary log of its own and its instances elect their reader apart, so one node's log can miss what another commits: follow Galera with the trigger feed (Watch::install)"
                .to_owned(),
        ));
    }
    if log_bin == 0 {
        return Ok(Some(
            "the server writes no binary log: start it with log_bin (and binlog_format=ROW)"
                .to_owned(),
        ));
    }
    if !format.eq_ignore_ascii_case("ROW") {
        return Ok(Some(format!(
            "binlog_format is {format}: the feed reads rows, so it must be ROW"
        )));
    }
    if image.eq_ignore_ascii_case("FULL") {
        return Ok(None);
    }
    // MINIMAL and NOBLOB images hold the primary key (every column without
    // one): the key must be in it.
    let (schema, table) = schema_of(pool, watch).await?;
    let columns = table_columns(pool, &schema, &table).await?;
    let has_primary_key = columns.iter().any(|column| column.in_primary_key != 0);
    let outside: Vec<&String> = watch
        .key_columns
        .iter()
        .filter(|key| {
            has_primary_key
                && !columns.iter().any(|column| {
                    column.name.eq_ignore_ascii_case(key) && column.in_primary_key != 0
                })
        })
        .collect();
    Ok((!outside.is_empty()).then(|| {
        format!(
            "binlog_row_image is {image}, so a delete reaches the log with the primary key only, and {outside:?} is not in it: set binlog_row_image=FULL, or watch a primary key"
        )
    }))
}

impl Watch {
    /// Puts the table on the binary log feed (`Watch::install_log` on a
    /// MySQL or MariaDB pool).
    pub(crate) async fn install_mysql_log(&self, pool: &MySqlPool) -> Result<(), FeedError> {
        crate::follow::column::comparable(&self.table, &key_type::key_columns(pool, self).await?)?;
        if let Some(gap) = log_settings_gap(pool, self).await? {
            return Err(FeedError::LogFeed(gap));
        }
        let (schema, table) = schema_of(pool, self).await?;
        let columns = table_columns(pool, &schema, &table).await?;
        for key in &self.key_columns {
            let column = columns
                .iter()
                .find(|column| column.name.eq_ignore_ascii_case(key))
                .ok_or_else(|| {
                    FeedError::LogFeed(format!("{}: no key column {key}", self.table))
                })?;
            if !logged_type(&column.data_type, column.charset.as_deref()) {
                return Err(FeedError::LogFeed(format!(
                    "{}.{key} is {} ({}): the binary log feed takes integer keys, binary strings, and strings in utf8mb4, utf8mb3 or ascii; watch it with the triggers",
                    self.table,
                    column.column_type,
                    column.charset.as_deref().unwrap_or("no character set"),
                )));
            }
        }
        // One producer per table.
        if !catalog::stored_triggers(pool, self).await?.is_empty() {
            return Err(FeedError::LogFeed(format!(
                "{} is fed by the feed's triggers: take it off them first (Watch::uninstall); switching feeds is a rebuild",
                self.table
            )));
        }
        for statement in super::super::install::TABLES.iter().chain(TABLES.iter()) {
            sqlx::query(AssertSqlSafe(*statement)).execute(pool).await?;
        }
        // The feed starts here, at the log's end, unless it started before.
        let mut connection = pool.acquire().await?;
        let end = log_end(&mut connection)
            .await
            .map_err(|error| FeedError::LogFeed(crate::error::error_chain(&error)))?;
        let seq = end.sequence().unwrap_or(0);
        sqlx::query(AssertSqlSafe(format!(
            "insert ignore into bloom_guard_log_progress (id, server, epoch, file, seq, pos, below_seq, below_pos, at)
             values (1, {SERVER}, ?, ?, ?, ?, ?, ?, cast(unix_timestamp(now(6)) * 1000000 as signed))"
        )))
        .bind(format!("{:016x}", fastrand::u64(..)))
        .bind(&end.file)
        .bind(seq)
        .bind(end.pos)
        .bind(seq)
        .bind(end.pos)
        .execute(&mut *connection)
        .await?;
        let keys = serde_json::to_string(&self.key_columns)
            .map_err(|error| FeedError::LogFeed(error.to_string()))?;
        sqlx::query(
            "insert into bloom_guard_log_tables (guard, table_schema, table_name, key_columns, installed_at)
             values (?, ?, ?, ?, cast(unix_timestamp(now(6)) * 1000000 as signed))
             on duplicate key update table_schema = values(table_schema), table_name = values(table_name),
                                     key_columns = values(key_columns), installed_at = values(installed_at)",
        )
        .bind(self.feed_name())
        .bind(&schema)
        .bind(&table)
        .bind(&keys)
        .execute(pool)
        .await?;
        Ok(())
    }

    /// Takes the table off the binary log feed; its rows stay until pruned.
    pub(crate) async fn uninstall_mysql_log(&self, pool: &MySqlPool) -> Result<(), FeedError> {
        let gone = sqlx::query("delete from bloom_guard_log_tables where guard = ?")
            .bind(self.feed_name())
            .execute(pool)
            .await;
        match gone {
            Ok(_) => Ok(()),
            // Never installed.
            Err(sqlx::Error::Database(error)) if error.code().as_deref() == Some("42S02") => Ok(()),
            Err(error) => Err(error.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::logged_type;

    #[test]
    fn only_types_whose_logged_bytes_are_the_triggers_bytes_are_taken() {
        assert!(logged_type("bigint", None));
        assert!(logged_type("VARCHAR", Some("utf8mb4")));
        assert!(logged_type("varbinary", None));
        assert!(!logged_type("varchar", Some("latin1")));
        assert!(!logged_type("decimal", None));
        assert!(!logged_type("uuid", None));
        assert!(!logged_type("datetime", None));
    }
}
