//! A rebuild requested by an operator, run once for the fleet.

use bloom_guard::{BloomGuard, BuildError, Stats};
use sqlx::PgPool;
use tokio::time::Instant;

use crate::pg_copy::PgCopySource;
use crate::pg_snapshot::{self, BuildLock};
use crate::watch::Watch;

/// Rebuilds a guard's filter for the whole fleet: under the guard's build
/// lock it scans, then publishes the result as the newest snapshot, which
/// every instance's [`PgFollower`](crate::PgFollower) adopts on the wake-up
/// the publication sends. A request made while another instance's rebuild
/// runs waits for it and scans no more: that rebuild started after the
/// request.
///
/// For an admin endpoint: hand it to
/// `bloom_guard::admin::Admin::guard_with_rebuild`.
///
/// # Example
///
/// ```no_run
/// use bloom_guard::admin::Admin;
/// use bloom_guard_sqlx::{FleetRebuild, Watch};
///
/// # fn run(guard: bloom_guard::BloomGuard, pool: sqlx::PgPool) {
/// let rebuild = FleetRebuild::new(guard.clone(), pool, Watch::table("items").key("key"));
/// let admin: axum::Router = Admin::new("s3cret")
///     .guard_with_rebuild(guard, move || {
///         let rebuild = rebuild.clone();
///         async move { rebuild.rebuild().await }
///     })
///     .into_router();
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct FleetRebuild {
    guard: BloomGuard,
    pool: PgPool,
    watch: Watch,
}

impl FleetRebuild {
    /// Rebuilds of `guard`, holding the keys of `watch`'s table.
    pub fn new(guard: BloomGuard, pool: PgPool, watch: Watch) -> Self {
        Self { guard, pool, watch }
    }

    /// Rebuilds once for the fleet and returns this instance's stats.
    ///
    /// # Errors
    ///
    /// [`BuildError::Source`] if the database fails; the filter in use
    /// stays.
    pub async fn rebuild(&self) -> Result<Stats, BuildError> {
        let failed = |error: sqlx::Error| BuildError::Source(std::sync::Arc::new(error));
        let query = self
            .watch
            .key_query(&self.pool)
            .await
            .map_err(|error| BuildError::Source(std::sync::Arc::new(error)))?;
        let fingerprint = pg_snapshot::fingerprint(&self.pool, &query)
            .await
            .map_err(failed)?;
        let name = self.guard.name();
        let (_, requested_at) = pg_snapshot::position_now(&self.pool)
            .await
            .map_err(failed)?;
        let build_lock = BuildLock::acquire(&self.pool, name).await.map_err(failed)?;
        let newer = pg_snapshot::newest(&self.pool, name, &fingerprint)
            .await
            .map_err(failed)?
            .is_some_and(|stored| stored.scanned_at >= requested_at);
        let outcome = if newer {
            // Another instance rebuilt after the request; this instance's
            // follower adopts that snapshot on its wake-up.
            tracing::info!(
                guard = name,
                "a rebuild newer than the request was published; not scanning again"
            );
            Ok(self.guard.stats())
        } else {
            match pg_snapshot::position_now(&self.pool).await {
                Ok((position, scanned_at)) => {
                    let source = PgCopySource::new(self.pool.clone(), query);
                    let built = self.guard.rebuild_newer_than(&source, Instant::now()).await;
                    if built.is_ok() {
                        pg_snapshot::publish_filter(
                            &self.pool,
                            &self.guard,
                            &fingerprint,
                            &position,
                            scanned_at,
                        )
                        .await;
                    }
                    built
                }
                Err(error) => Err(failed(error)),
            }
        };
        build_lock.release().await;
        outcome
    }
}
