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
use sqlx::mysql::MySqlArguments;
use sqlx::query::Query;
use sqlx::{AssertSqlSafe, MySql, MySqlPool, Row};
use tokio::sync::OnceCell;

use super::super::names::ident;
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
    watch: Watch,
    /// The collation of a `KeyType::Collated` guard: keys are read weighed.
    collation: Option<String>,
    /// The guard's keys are integers: bound as numbers.
    integers: bool,
    settled: Arc<Settled>,
    statements: OnceCell<Statements>,
}

/// The statements of each size, and how keys are bound to them.
#[derive(Debug)]
struct Statements {
    /// By [`SIZES`].
    texts: Vec<String>,
    /// The key column holds binary strings: keys are bound as bytes.
    binary: bool,
}

impl TableLookup {
    /// The lookup of `watch`'s table, or `None` for a watch of several key
    /// columns (its keys are joined, and a request's key is not split
    /// back).
    pub(crate) fn new(
        pool: MySqlPool,
        watch: Watch,
        collation: Option<String>,
        integers: bool,
        settled: Arc<Settled>,
    ) -> Option<Self> {
        (watch.key_columns.len() == 1).then(|| Self {
            pool,
            watch,
            collation,
            integers,
            settled,
            statements: OnceCell::new(),
        })
    }

    async fn statements(&self) -> Result<&Statements, sqlx::Error> {
        self.statements
            .get_or_try_init(|| async {
                let query = self
                    .watch
                    .mysql_key_query(&self.pool, self.collation.as_deref())
                    .await?;
                let binary = self
                    .watch
                    .mysql_binary(&self.pool)
                    .await?
                    .first()
                    .copied()
                    .flatten()
                    .unwrap_or(false);
                let column = self
                    .watch
                    .key_columns
                    .first()
                    .map_or_else(String::new, |c| ident(c));
                let texts = SIZES
                    .iter()
                    .map(|&size| statement(&query, &column, size))
                    .collect();
                Ok(Statements { texts, binary })
            })
            .await
    }

    /// `key` bound to `query` as the column compares it.
    fn bind<'q>(
        &self,
        query: Query<'q, MySql, MySqlArguments>,
        key: &LookupKey,
        binary: bool,
    ) -> Result<Query<'q, MySql, MySqlArguments>, LookupError> {
        let text = key.text();
        if self.integers {
            let number: i64 = std::str::from_utf8(text)
                .ok()
                .and_then(|text| text.parse().ok())
                .ok_or_else(|| LookupError::new("an integer key that is not one"))?;
            return Ok(query.bind(number));
        }
        if binary {
            return Ok(query.bind(text.to_vec()));
        }
        let text = std::str::from_utf8(text)
            .map_err(|_| LookupError::new("a key that is not UTF-8 for a text column"))?;
        Ok(query.bind(text.to_owned()))
    }

    async fn look_up(&self, keys: &[LookupKey]) -> Result<KeyBatch, LookupError> {
        let statements = self.statements().await.map_err(LookupError::new)?;
        let mut found = KeyBatch::default();
        for chunk in keys.chunks(SIZES[SIZES.len() - 1]) {
            let Some((index, &size)) = SIZES
                .iter()
                .enumerate()
                .find(|(_, &size)| size >= chunk.len())
            else {
                continue;
            };
            let mut text = statements.texts[index].as_str();
            let causal;
            if self.settled.known_galera() {
                // Every write set certified before it is applied first.
                causal = format!("set statement wsrep_sync_wait = 1 for {text}");
                text = &causal;
            }
            let mut query = sqlx::query(AssertSqlSafe(text));
            for slot in 0..size {
                let key = chunk.get(slot).unwrap_or(&chunk[0]);
                query = self.bind(query, key, statements.binary)?;
            }
            let rows = query
                .fetch_all(&self.pool)
                .await
                .map_err(LookupError::new)?;
            for row in rows {
                // A NULL key names no row.
                if let Some(key) = row
                    .try_get::<Option<&[u8]>, _>(0)
                    .map_err(LookupError::new)?
                {
                    if self.collation.is_some() {
                        found.push(key);
                    } else {
                        found.push_text(key);
                    }
                }
            }
        }
        Ok(found)
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
