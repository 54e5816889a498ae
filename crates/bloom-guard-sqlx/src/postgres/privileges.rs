//! The runtime role's rights on the Postgres feed.

use crate::error::FeedError;

/// Grants `role` what an application needs to follow the feed, and nothing
/// that changes it: reading the feed, publishing and adopting snapshots,
/// the fleet's settings and view, and pruning (`bloom_guard.prune`, which
/// runs as the feed's owner). `role` cannot alter the feed's schema, watch
/// or unwatch a table, or change a watched table's triggers. Writers need
/// nothing from it: the trigger functions run as the feed's owner.
///
/// Run it as the feed's owner (the role that ran [`postgres::install`](crate::postgres::install)),
/// after `postgres::install`, and again after an upgrade that names new tables. The
/// same as `select bloom_guard.grant_runtime('role')` in psql. The
/// application's own rights on its tables (`SELECT` for the warm-up's
/// scan) are the application's to grant.
///
/// # Errors
///
/// [`FeedError::Database`] if `role` does not exist or the caller does not
/// own the feed.
///
/// # Example
///
/// ```no_run
/// use bloom_guard_sqlx::{postgres, Watch};
///
/// # async fn run(owner: sqlx::PgPool) -> Result<(), bloom_guard_sqlx::FeedError> {
/// // As the owner, once per deploy (a migration job):
/// postgres::install(&owner).await?;
/// Watch::table("items").key("key").install(&owner).await?;
/// postgres::grant_runtime(&owner, "app").await?;
/// // The application connects as `app` and only follows.
/// # Ok(()) }
/// ```
pub async fn grant_runtime(pool: &sqlx::PgPool, role: &str) -> Result<(), FeedError> {
    sqlx::query("select bloom_guard.grant_runtime($1::text::regrole)")
        .bind(role)
        .execute(pool)
        .await?;
    tracing::info!(
        role,
        "granted the runtime role its rights on the change feed"
    );
    Ok(())
}
