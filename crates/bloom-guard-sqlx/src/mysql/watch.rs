//! A table on the trigger feed of a MySQL or MariaDB database: what
//! [`Watch::install`], [`Watch::uninstall`] and [`Watch::key_type`] do
//! there (`install.rs`, `uninstall.rs`, `key_type.rs`).

use crate::error::FeedError;
use crate::watch::{sealed, TriggerFeed, Watch};

impl sealed::Sealed for sqlx::MySql {}

impl TriggerFeed for sqlx::MySql {
    async fn install(watch: &Watch, pool: &sqlx::MySqlPool) -> Result<(), FeedError> {
        watch.install_mysql(pool).await
    }

    async fn uninstall(watch: &Watch, pool: &sqlx::MySqlPool) -> Result<(), FeedError> {
        watch.uninstall_mysql(pool).await
    }

    async fn key_type(
        watch: &Watch,
        pool: &sqlx::MySqlPool,
    ) -> Result<bloom_guard::KeyType, FeedError> {
        watch.key_type_mysql(pool).await
    }
}
