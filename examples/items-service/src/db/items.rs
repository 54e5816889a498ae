//! The items' rows: read, written and deleted by key.

use std::sync::atomic::Ordering;

use super::{Database, Item, Pool};

impl Database {
    /// The item with `key`, if any.
    ///
    /// # Errors
    ///
    /// If the database fails.
    pub async fn get(&self, key: &str) -> Result<Option<Item>, sqlx::Error> {
        self.lookups.fetch_add(1, Ordering::Relaxed);
        match &self.pool {
            Pool::Postgres(pool) => {
                self.read_postgres(pool, |pool| async move {
                    sqlx::query_as("select key, value from items where key = $1")
                        .bind(key)
                        .fetch_optional(&pool)
                        .await
                })
                .await
            }
            Pool::Sqlite(pool) => {
                sqlx::query_as("select key, value from items where key = ?")
                    .bind(key)
                    .fetch_optional(pool)
                    .await
            }
            Pool::MySql(pool) => {
                sqlx::query_as(
                    "select cast(`key` as char) as `key`, value from items where `key` = ?",
                )
                .bind(key)
                .fetch_optional(pool)
                .await
            }
        }
    }

    /// Inserts an item; `None` if its key exists already.
    ///
    /// # Errors
    ///
    /// If the database fails.
    pub async fn insert(&self, key: &str, value: &str) -> Result<Option<Item>, sqlx::Error> {
        match &self.pool {
            Pool::Postgres(pool) => {
                sqlx::query_as(
                    "insert into items (key, value) values ($1, $2) on conflict (key) do nothing returning key, value",
                )
                .bind(key)
                .bind(value)
                .fetch_optional(pool)
                .await
            }
            Pool::Sqlite(pool) => {
                sqlx::query_as(
                    "insert into items (key, value) values (?, ?) on conflict (key) do nothing returning key, value",
                )
                .bind(key)
                .bind(value)
                .fetch_optional(pool)
                .await
            }
            // No RETURNING on MySQL 8: the row is what was given.
            Pool::MySql(pool) => {
                let inserted = sqlx::query("insert into items (`key`, value) values (?, ?)")
                    .bind(key)
                    .bind(value)
                    .execute(pool)
                    .await;
                match inserted {
                    Ok(_) => Ok(Some(Item {
                        key: key.to_owned(),
                        value: value.to_owned(),
                    })),
                    Err(error) if is_duplicate_key(&error) => Ok(None),
                    Err(error) => Err(error),
                }
            }
        }
    }

    /// Deletes the item with `key`; `false` if there was none.
    ///
    /// # Errors
    ///
    /// If the database fails.
    pub async fn delete(&self, key: &str) -> Result<bool, sqlx::Error> {
        let deleted = match &self.pool {
            Pool::Postgres(pool) => {
                let result = sqlx::query("delete from items where key = $1")
                    .bind(key)
                    .execute(pool)
                    .await?;
                result.rows_affected()
            }
            Pool::Sqlite(pool) => {
                let result = sqlx::query("delete from items where key = ?")
                    .bind(key)
                    .execute(pool)
                    .await?;
                result.rows_affected()
            }
            Pool::MySql(pool) => {
                let result = sqlx::query("delete from items where `key` = ?")
                    .bind(key)
                    .execute(pool)
                    .await?;
                result.rows_affected()
            }
        };
        Ok(deleted > 0)
    }
}

/// Whether `error` is MySQL's duplicate key (error 1062).
fn is_duplicate_key(error: &sqlx::Error) -> bool {
    matches!(error, sqlx::Error::Database(db) if db
        .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
        .is_some_and(|db| db.number() == 1062))
}
