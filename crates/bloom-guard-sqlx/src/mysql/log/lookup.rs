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

use std::sync::Arc;

use bloom_guard::feed::{KeyLookup, LookupError, LookupKey};
use bloom_guard::keys::KeyBatch;
use futures_util::future::BoxFuture;
use sqlx::mysql::{MySqlArguments, MySqlRow};
use sqlx::query::Query;
use sqlx::{AssertSqlSafe, MySql, MySqlPool, Row};

use super::super::install::is_binary_string;
use super::super::key_type;
use super::super::names::{ident, located};
use super::super::settle::Settled;
use crate::watch::Watch;

/// The numbers of keys a statement is written for: a batch is padded to
/// the next (its first key repeated), so a few statement texts serve every
/// batch and each stays prepared on its connection.
const SIZES: [usize; 4] = [1, 8, 64, 256];

/// Looks keys up in a watched MySQL table with one key column.
#[derive(Debug)]
pub(crate) struct TableLookup {
    pool: MySqlPool,
    /// The statements by [`SIZES`].
    texts: Vec<String>,
    /// Keys are bound as the column holds them.
    binding: Binding,
    /// Keys are read weighed under a collation (a `KeyType::Collated`
    /// guard).
    weighed: bool,
    settled: Arc<Settled>,
}

/// How a key is bound: as the key column holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Binding {
    Integer,
    Bytes,
    Text,
}

/// The integer types of MySQL and MariaDB.
const INTEGER_TYPES: [&str; 6] = [
    "tinyint",
    "smallint",
    "mediumint",
    "int",
    "integer",
    "bigint",
];

impl TableLookup {
    /// The lookup of `watch`'s table read as the scan reads it (weighed
    /// under `collation`, if any), or `None` where a lookup cannot be made
    /// or would cost more than a feed read: a watch of several key columns
    /// (its keys are joined, and a request's key is not split back), a key
    /// column no index leads with (each statement would read the table).
    pub(crate) async fn prepare(
        pool: &MySqlPool,
        watch: &Watch,
        collation: Option<&str>,
        settled: Arc<Settled>,
    ) -> Result<Option<Self>, sqlx::Error> {
        let [column] = watch.key_columns.as_slice() else {
            return Ok(None);
        };
        let columns = key_type::columns(pool, watch).await?;
        let Some((_, data_type, _)) = columns
            .iter()
            .find(|(name, ..)| name.eq_ignore_ascii_case(column))
        else {
            return Ok(None);
        };
        let data_type = data_type.to_ascii_lowercase();
        let binding = if INTEGER_TYPES.contains(&data_type.as_str()) {
            Binding::Integer
        } else if is_binary_string(&data_type) {
            Binding::Bytes
        } else {
            Binding::Text
        };
        let (schema, table) = located(watch);
        let indexed: i64 = sqlx::query_scalar(
            "select count(*) from information_schema.statistics
              where table_schema = coalesce(?, database()) and table_name = ?
                and column_name = ? and seq_in_index = 1",
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
        let query = watch.mysql_key_query(pool, collation).await?;
        let column = ident(column);
        Ok(Some(Self {
            pool: pool.clone(),
            texts: SIZES
                .iter()
                .map(|&size| statement(&query, &column, size))
                .collect(),
            binding,
            weighed: collation.is_some(),
            settled,
        }))
    }

    /// `key` bound to `query` as the column holds it.
    fn bind<'q>(
        &self,
        query: Query<'q, MySql, MySqlArguments>,
        key: &LookupKey,
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
            Binding::Bytes => Ok(query.bind(text.to_vec())),
            Binding::Text => {
                let text = std::str::from_utf8(text)
                    .map_err(|_| LookupError::new("a key that is not UTF-8 for a text column"))?;
                Ok(query.bind(text.to_owned()))
            }
        }
    }

    /// The rows of `keys`, a statement per [`SIZES`]-long chunk, the
    /// chunks at the same time (each on a connection of its own).
    async fn look_up(&self, keys: &[LookupKey]) -> Result<KeyBatch, LookupError> {
        let chunks = keys
            .chunks(SIZES[SIZES.len() - 1])
            .map(|chunk| self.look_up_chunk(chunk));
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

    /// The rows of `chunk`, at most the largest of [`SIZES`] keys, in one
    /// statement.
    async fn look_up_chunk(&self, chunk: &[LookupKey]) -> Result<Vec<MySqlRow>, LookupError> {
        let Some((index, &size)) = SIZES
            .iter()
            .enumerate()
            .find(|(_, &size)| size >= chunk.len())
        else {
            return Err(LookupError::new("more keys than a statement takes"));
        };
        let Some(first) = chunk.first() else {
            return Ok(Vec::new());
        };
        let mut text = self.texts[index].as_str();
        let causal;
        if self.settled.known_galera() {
            // Every write set certified before it is applied first.
            causal = format!("set statement wsrep_sync_wait = 1 for {text}");
            text = &causal;
        }
        let mut query = sqlx::query(AssertSqlSafe(text));
        for slot in 0..size {
            query = self.bind(query, chunk.get(slot).unwrap_or(first))?;
        }
        query.fetch_all(&self.pool).await.map_err(LookupError::new)
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
    fn a_statement_restricts_the_key_query_to_its_keys() {
        assert_eq!(
            statement("select t.`k` as k from `items` as t", "`k`", 3),
            "select t.`k` as k from `items` as t where t.`k` in (?, ?, ?)"
        );
    }
}
