//! A table on a feed of a MySQL or MariaDB database: what
//! [`Watch::install`], [`Watch::uninstall`] and [`Watch::key_type`] do
//! there (`install.rs`, `uninstall.rs`, `key_type.rs`), and
//! `Watch::install_log` and `Watch::uninstall_log` on the binary log feed
//! (`log/install.rs`).

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

#[cfg(feature = "binlog-feed")]
impl crate::watch::log_sealed::Sealed for sqlx::MySql {}

#[cfg(feature = "binlog-feed")]
impl crate::watch::LogFeed for sqlx::MySql {
    async fn install_log(watch: &Watch, pool: &sqlx::MySqlPool) -> Result<(), FeedError> {
        watch.install_mysql_log(pool).await
    }

    async fn uninstall_log(watch: &Watch, pool: &sqlx::MySqlPool) -> Result<(), FeedError> {
        watch.uninstall_mysql_log(pool).await
    }
}
