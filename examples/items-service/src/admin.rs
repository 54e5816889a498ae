//! The admin API's wiring: every guard, its rebuilds and the metrics.

use axum::Router;
use bloom_guard::admin::Admin;
use bloom_guard::BloomGuard;
use bloom_guard_sqlx::FleetRebuild;
use metrics_exporter_prometheus::PrometheusHandle;

use crate::db::Pool;
use crate::feeds::{items_feed, users_feed};
use crate::state::AppState;

/// The admin API behind `token`: `GET /admin/bloom` and
/// `/admin/bloom/{guard}`, `POST /admin/bloom/rebuild` and
/// `/admin/bloom/{guard}/rebuild`, `PUT /admin/bloom/{guard}/mode`, and,
/// given a Prometheus handle, `GET /metrics`. Serve it on its own address.
///
/// A rebuild reads the keys as the followers do, on either database; with
/// snapshots, one asked of any instance scans once and every instance
/// adopts it.
pub fn admin_app(state: &AppState, token: &str, prometheus: Option<PrometheusHandle>) -> Router {
    let Some(guards) = &state.guards else {
        return Router::new();
    };
    let rebuild = |guard: &BloomGuard, watch| match (state.db.pool().clone(), &guards.log_feed) {
        (Pool::Postgres(pool), Some(url)) => FleetRebuild::log(guard.clone(), pool, watch, url),
        (Pool::Postgres(pool), None) => FleetRebuild::new(guard.clone(), pool, watch),
        (Pool::Sqlite(pool), _) => FleetRebuild::sqlite(guard.clone(), pool, watch),
        (Pool::MySql(pool), Some(url)) => FleetRebuild::mysql_log(guard.clone(), pool, watch, url),
        (Pool::MySql(pool), None) => FleetRebuild::mysql(guard.clone(), pool, watch),
    };
    let mut admin = Admin::new(token);
    for (guard, watch) in [(&guards.items, items_feed()), (&guards.users, users_feed())] {
        let rebuild = rebuild(guard, watch).snapshots(guards.snapshots);
        admin = admin.guard_with_rebuild(guard.clone(), move || {
            let rebuild = rebuild.clone();
            async move { rebuild.rebuild().await }
        });
    }
    if let Some(handle) = prometheus {
        admin = admin.metrics(move || handle.render());
    }
    admin.into_router()
}
