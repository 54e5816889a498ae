//! Would-be refusals confirmed in the watched table itself.
//!
//! A refusal's feed read on this feed waits for the producer to write what
//! the log held after the request arrived: while writers keep the log
//! moving, that is the producer's lag, tens of milliseconds a refusal. One
//! indexed statement over the table says as much (no row of the key as of
//! a statement begun after the request), so the guard's would-be refusals
//! wait for that instead ([`KeyLookup`]); the refusals waiting at one
//! moment share it. The statement reads the key column as the scan does,
//! so the guard puts its rows in canonical form as it does a scan's.

use bloom_guard::feed::{KeyLookup, LookupError, LookupKey};
use bloom_guard::keys::KeyBatch;
use bloom_guard::KeyType;
use futures_util::future::BoxFuture;
use sqlx::mysql::{MySqlArguments, MySqlPoolOptions, MySqlRow};
use sqlx::query::Query;
use sqlx::{AssertSqlSafe, MySql, MySqlPool, Row};

use super::super::install::is_binary_string;
use super::super::key_type;
use super::super::names::{ident, located};
use crate::follow::column::Comparison;
use crate::watch::Watch;

/// The most keys one statement takes: a larger lookup is split into
/// chunks of about equal size, looked up at the same time.
const MOST: usize = 256;

/// The numbers of keys a statement is written for: 1, 2, 4, 8, then every
/// multiple of 16 up to [`MOST`]. A chunk is padded to the next (its first
/// key repeated), so twenty statement texts serve every chunk and each
/// stays prepared on its connection, while the padding stays under 16
/// keys: the server converts, sorts and compares every value of the list,
/// padding included (a list of 256 values costs it about twice one of 94).
fn sizes() -> impl Iterator<Item = usize> {
    [1, 2, 4, 8].into_iter().chain((16..=MOST).step_by(16))
}

/// The chunks `keys` is looked up in: as few as [`MOST`] allows, of about
/// equal size (the fewer statements, the less each costs per key).
fn chunks<T>(keys: &[T]) -> impl Iterator<Item = &[T]> {
    let count = keys.len().div_ceil(MOST).max(1);
    keys.chunks(keys.len().div_ceil(count).max(1))
}

/// The connections of a lookup's own pool: the chunks of the largest
/// lookup the guard asks for (1 024 keys) at once.
const CONNECTIONS: u32 = 4;

/// Looks keys up in a watched MySQL table with one key column.
#[derive(Debug)]
pub(crate) struct TableLookup {
    /// Connections of the lookup's own (see [`own_pool`]).
    pool: MySqlPool,
    /// The statements, with their sizes (see [`sizes`]).
    texts: Vec<(usize, String)>,
    /// Keys are bound as the column holds them.
    binding: Binding,
    /// Keys are read weighed under a collation (a `KeyType::Collated`
    /// guard).
    weighed: bool,
}

/// How a key is bound: as the key column holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Binding {
    Integer,
    Bytes,
    Text,
}

impl TableLookup {
    /// The lookup of `watch`'s table for a guard of `key_type`, read as
    /// the scan reads it, or `None` where a lookup cannot be made exact or
    /// would cost more than a feed read:
    ///
    /// - a watch of several key columns (its keys are joined, and a
    ///   request's key is not split back);
    /// - a key column that does not compare keys exactly as the key type
    ///   does (a key type looser than its column, such as `Integer` over a
    ///   byte-exact `varchar`: a stored `007` is the key `7`, which the
    ///   column would not find);
    /// - a key column no B-tree or hash index leads with (each statement
    ///   would read the table).
    pub(crate) async fn prepare(
        pool: &MySqlPool,
        watch: &Watch,
        key_type: KeyType,
    ) -> Result<Option<Self>, sqlx::Error> {
        let [column] = watch.key_columns.as_slice() else {
            return Ok(None);
        };
        let columns = key_type::key_columns(pool, watch).await?;
        let Some(key_column) = columns.first() else {
            return Ok(None);
        };
        if !compares_as(&key_column.comparison, key_type) {
            tracing::info!(
                table = watch.table,
                column,
                ?key_type,
                "the key column compares keys otherwise than the key type: refusals wait for feed reads instead of looking their keys up"
            );
            return Ok(None);
        }
        let data_type = key_type::columns(pool, watch)
            .await?
            .into_iter()
            .find(|(name, ..)| name.eq_ignore_ascii_case(column))
            .map(|(_, data_type, _)| data_type)
            .unwrap_or_default();
        let binding = match key_column.comparison {
            Comparison::Integer => Binding::Integer,
            _ if is_binary_string(&data_type) => Binding::Bytes,
            _ => Binding::Text,
        };
        let (schema, table) = located(watch);
        let indexed: i64 = sqlx::query_scalar(
            "select count(*) from information_schema.statistics
              where table_schema = coalesce(?, database()) and table_name = ?
                and column_name = ? and seq_in_index = 1
                and index_type in ('BTREE', 'HASH')",
        )
        .bind(schema)
        .bind(table)
        .bind(column)
        .fetch_one(pool)
        .await?;
        if indexed == 0 {
            tracing::info!(
                table = watch.table,
                column,
                "no index leads with the key column: refusals wait for feed reads instead of looking their keys up"
            );
            return Ok(None);
        }
        let collation = match key_type {
            KeyType::Collated(collation) => Some(collation.name().to_owned()),
            _ => None,
        };
        let query = watch.mysql_key_query(pool, collation.as_deref()).await?;
        let column = ident(column);
        // On a Galera node, each statement first applies every write set
        // the cluster certified before it (a causal read).
        let galera = sqlx::query_as::<_, (String, String)>("show variables like 'wsrep_on'")
            .fetch_optional(pool)
            .await?
            .is_some_and(|(_, on)| on.eq_ignore_ascii_case("on"));
        let prefix = if galera {
            "set statement wsrep_sync_wait = 1 for "
        } else {
            ""
        };
        // The database the pool's own connections use (set by an
        // `after_connect` `USE` as well as by the URL), and one connection
        // opened now, outside any refusal's wait.
        let database: Option<String> = sqlx::query_scalar("select database()")
            .fetch_one(pool)
            .await?;
        let own = own_pool(pool, database.as_deref());
        drop(own.acquire().await?);
        Ok(Some(Self {
            pool: own,
            texts: sizes()
                .map(|size| {
                    (
                        size,
                        format!("{prefix}{}", statement(&query, &column, size)),
                    )
                })
                .collect(),
            binding,
            weighed: collation.is_some(),
        }))
    }

    /// `key` bound to `query` as the column holds it.
    fn bind<'q>(
        &self,
        query: Query<'q, MySql, MySqlArguments>,
        key: &'q LookupKey,
    ) -> Result<Query<'q, MySql, MySqlArguments>, LookupError> {
        let text = key.text();
        match self.binding {
            Binding::Integer => {
                let number: i64 = std::str::from_utf8(text)
                    .ok()
                    .and_then(|text| text.parse().ok())
                    .ok_or_else(|| {
                        LookupError::new("a key that is no integer for an integer column")
                    })?;
                Ok(query.bind(number))
            }
            Binding::Bytes => Ok(query.bind(text)),
            Binding::Text => {
                let text = std::str::from_utf8(text)
                    .map_err(|_| LookupError::new("a key that is not UTF-8 for a text column"))?;
                Ok(query.bind(text))
            }
        }
    }

    /// The rows of `keys`, a statement per chunk (see [`chunks`]), the
    /// chunks at the same time (each on a connection of its own).
    async fn look_up(&self, keys: &[LookupKey]) -> Result<KeyBatch, LookupError> {
        let chunks = chunks(keys).map(|chunk| self.look_up_chunk(chunk));
        let mut found = KeyBatch::default();
        for rows in futures_util::future::try_join_all(chunks).await? {
            for row in rows {
                // A NULL key names no row.
                if let Some(key) = row
                    .try_get::<Option<&[u8]>, _>(0)
                    .map_err(LookupError::new)?
                {
                    if self.weighed {
                        found.push(key);
                    } else {
                        found.push_text(key);
                    }
                }
            }
        }
        Ok(found)
    }

    /// The rows of `chunk`, at most [`MOST`] keys, in one statement.
    async fn look_up_chunk(&self, chunk: &[LookupKey]) -> Result<Vec<MySqlRow>, LookupError> {
        let Some((size, text)) = self.texts.iter().find(|(size, _)| *size >= chunk.len()) else {
            return Err(LookupError::new("more keys than a statement takes"));
        };
        let Some(first) = chunk.first() else {
            return Ok(Vec::new());
        };
        let mut query = sqlx::query(AssertSqlSafe(text.as_str()));
        for slot in 0..*size {
            query = self.bind(query, chunk.get(slot).unwrap_or(first))?;
        }
        query.fetch_all(&self.pool).await.map_err(LookupError::new)
    }
}

/// Connections for lookups alone, with `pool`'s options as they are now,
/// to `database`: each statement is a transaction of its own (autocommit,
/// whatever the server's default), so its snapshot is the statement's, and
/// no other code of the process can leave one of them inside a
/// transaction. One a chunk of the largest lookup, the first kept open
/// (connecting, with TLS to a distant server, could take longer than a
/// refusal waits), the others opened when a flood needs them; not pinged before each use (a statement on a lost connection fails,
/// and its keys go on).
fn own_pool(pool: &MySqlPool, database: Option<&str>) -> MySqlPool {
    let options = pool.connect_options().as_ref().clone();
    let options = match database {
        Some(database) => options.database(database),
        None => options,
    };
    MySqlPoolOptions::new()
        .max_connections(CONNECTIONS)
        .min_connections(1)
        .test_before_acquire(false)
        .after_connect(|connection, _| {
            Box::pin(async move {
                sqlx::raw_sql(
                    "set session autocommit = 1; set session transaction isolation level read committed",
                )
                .execute(connection)
                .await
                .map(|_| ())
            })
        })
        .connect_lazy_with(options)
}

/// Whether a column compared as `comparison` finds exactly the rows whose
/// keys `key_type` calls equal to a key's canonical form.
fn compares_as(comparison: &Comparison, key_type: KeyType) -> bool {
    match (comparison, key_type) {
        (Comparison::Exact, KeyType::Text)
        | (Comparison::PadSpace, KeyType::SpacePaddedText)
        | (Comparison::Integer, KeyType::Integer)
        | (Comparison::Uuid, KeyType::Uuid) => true,
        (Comparison::Collated(name), KeyType::Collated(collation)) => {
            collation.name().eq_ignore_ascii_case(name)
        }
        _ => false,
    }
}

/// The key query `query` restricted to `size` keys of `column`.
fn statement(query: &str, column: &str, size: usize) -> String {
    let marks = vec!["?"; size].join(", ");
    format!("{query} where t.{column} in ({marks})")
}

impl KeyLookup for TableLookup {
    fn find<'a>(&'a self, keys: &'a [LookupKey]) -> BoxFuture<'a, Result<KeyBatch, LookupError>> {
        Box::pin(self.look_up(keys))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_are_as_few_as_a_statement_allows_and_about_equal() {
        let lengths = |keys: usize| chunks(&vec![0; keys]).map(<[_]>::len).collect::<Vec<_>>();
        assert_eq!(lengths(94), [94]);
        assert_eq!(lengths(256), [256]);
        assert_eq!(lengths(300), [150, 150]);
        assert_eq!(lengths(1024), [256; 4]);
        assert_eq!(lengths(1000), [250, 250, 250, 250]);
        // Every chunk fits a statement, padded by fewer than 16 keys.
        let sizes: Vec<usize> = sizes().collect();
        assert_eq!(sizes.len(), 20);
        for keys in 1..=MOST {
            let size = sizes.iter().find(|&&size| size >= keys).copied();
            assert!(
                size.is_some_and(|size| size - keys < 16),
                "{keys}: {size:?}"
            );
        }
    }

    #[test]
    fn only_a_column_that_compares_as_the_key_type_is_looked_up() {
        assert!(compares_as(&Comparison::Exact, KeyType::Text));
        assert!(compares_as(&Comparison::Integer, KeyType::Integer));
        assert!(compares_as(&Comparison::PadSpace, KeyType::SpacePaddedText));
        // Looser key types fit their columns, but the column would not find
        // every stored spelling of the canonical form.
        for looser in [
            KeyType::Integer,
            KeyType::Uuid,
            KeyType::SpacePaddedText,
            KeyType::CaseInsensitiveText,
        ] {
            assert!(!compares_as(&Comparison::Exact, looser), "{looser:?}");
        }
        assert!(!compares_as(&Comparison::Integer, KeyType::Uuid));
        assert!(!compares_as(
            &Comparison::Collated("utf8mb4_general_ci".into()),
            KeyType::Text
        ));
    }

    /// A pool of one connection to a new table `name` of the server of
    /// `MYSQL_URL`, made by `create`.
    async fn table(create: &str) -> (MySqlPool, Watch) {
        let url = std::env::var("MYSQL_URL").expect("MYSQL_URL");
        let pool = sqlx::mysql::MySqlPoolOptions::new()
            .max_connections(1)
            .connect(&url)
            .await
            .expect("connect to MySQL");
        let name = format!("lookup_{}", fastrand::u64(..));
        sqlx::raw_sql(AssertSqlSafe(create.replace("{name}", &name)))
            .execute(&pool)
            .await
            .expect("create the table");
        (pool, Watch::table(name).key("code"))
    }

    async fn found(lookup: &TableLookup, keys: &[&str]) -> Vec<Vec<u8>> {
        let keys: Vec<LookupKey> = keys
            .iter()
            .map(|key| LookupKey::new(key.as_bytes(), None))
            .collect();
        let rows = lookup.find(&keys).await.expect("a lookup");
        rows.iter().map(|key| key.as_bytes().to_vec()).collect()
    }

    #[tokio::test]
    #[cfg_attr(not(mysql_database), ignore = "needs MySQL or MariaDB: set MYSQL_URL")]
    async fn a_connection_left_in_a_transaction_does_not_hide_a_row() {
        let (pool, watch) =
            table("create table {name} (code varchar(50) collate utf8mb4_nopad_bin primary key)")
                .await;
        let lookup = TableLookup::prepare(&pool, &watch, KeyType::Text)
            .await
            .expect("the column's facts")
            .expect("a lookup");
        // The pool's one connection goes back with a snapshot open.
        {
            let mut connection = pool.acquire().await.expect("the connection");
            sqlx::raw_sql(AssertSqlSafe(format!(
                "start transaction with consistent snapshot; select count(*) from {}",
                watch.table
            )))
            .execute(&mut *connection)
            .await
            .expect("a snapshot");
        }
        let url = std::env::var("MYSQL_URL").expect("MYSQL_URL");
        let mut other = <sqlx::MySqlConnection as sqlx::Connection>::connect(&url)
            .await
            .expect("another connection");
        sqlx::query(AssertSqlSafe(format!(
            "insert into {} (code) values ('late')",
            watch.table
        )))
        .execute(&mut other)
        .await
        .expect("insert");
        assert_eq!(found(&lookup, &["late", "never"]).await, [b"late".to_vec()]);
    }

    #[tokio::test]
    #[cfg_attr(not(mysql_database), ignore = "needs MySQL or MariaDB: set MYSQL_URL")]
    async fn no_lookup_where_it_could_miss_a_row_or_read_the_table() {
        let (pool, exact) =
            table("create table {name} (code varchar(50) collate utf8mb4_nopad_bin primary key)")
                .await;
        // `Integer` fits a byte-exact column (it compares more loosely),
        // but the column would not find `007` for the key `7`.
        assert!(TableLookup::prepare(&pool, &exact, KeyType::Integer)
            .await
            .expect("the column's facts")
            .is_none());
        let (pool, unindexed) = table(
            "create table {name} (id bigint primary key, code varchar(50) collate utf8mb4_nopad_bin, fulltext key (code))",
        )
        .await;
        assert!(TableLookup::prepare(&pool, &unindexed, KeyType::Text)
            .await
            .expect("the column's facts")
            .is_none());
        let (pool, numbers) = table("create table {name} (code bigint primary key)").await;
        let lookup = TableLookup::prepare(&pool, &numbers, KeyType::Integer)
            .await
            .expect("the column's facts")
            .expect("a lookup");
        sqlx::query(AssertSqlSafe(format!(
            "insert into {} values (7)",
            numbers.table
        )))
        .execute(&pool)
        .await
        .expect("insert");
        assert_eq!(found(&lookup, &["7", "8"]).await, [b"7".to_vec()]);
    }

    #[tokio::test]
    #[cfg_attr(not(mysql_database), ignore = "needs MySQL or MariaDB: set MYSQL_URL")]
    async fn every_key_of_a_lookup_is_looked_up_however_it_is_chunked_and_padded() {
        let (pool, watch) =
            table("create table {name} (code varchar(50) collate utf8mb4_nopad_bin primary key)")
                .await;
        sqlx::query(AssertSqlSafe(format!(
            "insert into {} (code) select concat('k', seq) from seq_0_to_1199 where seq % 3 = 0",
            watch.table
        )))
        .execute(&pool)
        .await
        .expect("insert");
        let lookup = TableLookup::prepare(&pool, &watch, KeyType::Text)
            .await
            .expect("the column's facts")
            .expect("a lookup");
        let mut all: Vec<String> = (0..1200).map(|i| format!("k{i}")).collect();
        fastrand::shuffle(&mut all);
        for count in [1, 2, 3, 9, 17, 100, 255, 256, 257, 600, 1024] {
            let asked: Vec<&str> = all[..count].iter().map(String::as_str).collect();
            let mut rows = found(&lookup, &asked).await;
            rows.sort();
            let mut stored: Vec<Vec<u8>> = asked
                .iter()
                .filter(|key| key[1..].parse::<u32>().is_ok_and(|i| i % 3 == 0))
                .map(|key| key.as_bytes().to_vec())
                .collect();
            stored.sort();
            assert_eq!(rows, stored, "{count} keys");
        }
    }

    #[test]
    fn a_statement_restricts_the_key_query_to_its_keys() {
        assert_eq!(
            statement("select t.`k` as k from `items` as t", "`k`", 3),
            "select t.`k` as k from `items` as t where t.`k` in (?, ?, ?)"
        );
    }
}
