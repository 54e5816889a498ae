//! A table on the trigger feed of a SQLite database: what
//! [`Watch::install`], [`Watch::uninstall`] and [`Watch::key_type`] do
//! there (`install.rs`).

use crate::error::FeedError;
use crate::watch::{sealed, TriggerFeed, Watch};

impl sealed::Sealed for sqlx::Sqlite {}

impl TriggerFeed for sqlx::Sqlite {
    async fn install(watch: &Watch, pool: &sqlx::SqlitePool) -> Result<(), FeedError> {
        watch.install_sqlite(pool).await
    }

    async fn uninstall(watch: &Watch, pool: &sqlx::SqlitePool) -> Result<(), FeedError> {
        watch.uninstall_sqlite(pool).await
    }

    async fn key_type(
        watch: &Watch,
        pool: &sqlx::SqlitePool,
    ) -> Result<bloom_guard::KeyType, FeedError> {
        watch.key_type_sqlite(pool).await
    }
}
