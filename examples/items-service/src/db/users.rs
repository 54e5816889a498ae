//! The users' rows: read and written by id.

use std::sync::atomic::Ordering;

use super::{Database, Pool, User};

impl Database {
    /// The user with `id`, if any.
    ///
    /// # Errors
    ///
    /// If the database fails.
    pub async fn get_user(&self, id: uuid::Uuid) -> Result<Option<User>, sqlx::Error> {
        self.lookups.fetch_add(1, Ordering::Relaxed);
        let id = id.hyphenated().to_string();
        match &self.pool {
            Pool::Postgres(pool) => {
                self.read_postgres(pool, |pool| {
                    let id = id.clone();
                    async move {
                        sqlx::query_as("select id::text as id, name from users where id = $1::uuid")
                            .bind(id)
                            .fetch_optional(&pool)
                            .await
                    }
                })
                .await
            }
            Pool::Sqlite(pool) => {
                sqlx::query_as("select id, name from users where id = ?")
                    .bind(id)
                    .fetch_optional(pool)
                    .await
            }
            Pool::MySql(pool) => {
                sqlx::query_as("select cast(id as char) as id, name from users where id = ?")
                    .bind(id)
                    .fetch_optional(pool)
                    .await
            }
        }
    }

    /// Inserts a user.
    ///
    /// # Errors
    ///
    /// If the database fails.
    pub async fn insert_user(&self, id: uuid::Uuid, name: &str) -> Result<User, sqlx::Error> {
        let id = id.hyphenated().to_string();
        match &self.pool {
            Pool::Postgres(pool) => sqlx::query_as(
                "insert into users (id, name) values ($1::uuid, $2) returning id::text as id, name",
            )
            .bind(id)
            .bind(name)
            .fetch_one(pool)
            .await,
            Pool::Sqlite(pool) => {
                sqlx::query_as("insert into users (id, name) values (?, ?) returning id, name")
                    .bind(id)
                    .bind(name)
                    .fetch_one(pool)
                    .await
            }
            Pool::MySql(pool) => {
                sqlx::query("insert into users (id, name) values (?, ?)")
                    .bind(&id)
                    .bind(name)
                    .execute(pool)
                    .await?;
                Ok(User {
                    id,
                    name: name.to_owned(),
                })
            }
        }
    }
}
