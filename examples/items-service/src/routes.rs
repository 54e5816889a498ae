//! The public API and the admin API.

use std::sync::{Arc, Mutex, PoisonError};

use axum::extract::rejection::JsonRejection;
use axum::extract::{DefaultBodyLimit, FromRequestParts, State};
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use bloom_guard::admin::Admin;
use bloom_guard::{BloomGuard, Key, ReadThroughCache};
use bloom_guard_sqlx::{PgCopySource, QuerySource};
use metrics_exporter_prometheus::PrometheusHandle;
use serde::Deserialize;
use serde_json::json;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::db::{Database, Item, Pool};
use crate::error::{not_found, ApiError};
use crate::KEY_QUERY;

/// The longest key, in bytes; the guard refuses longer ones before hashing.
pub const MAX_KEY_LEN: usize = 512;

/// The largest request body accepted, in bytes.
pub const MAX_BODY_BYTES: usize = 16 * 1024;

/// What the handlers share.
#[derive(Debug, Clone)]
pub struct AppState {
    /// The items table.
    pub db: Database,
    /// The read-through cache in front of it.
    pub cache: ReadThroughCache<String, Item>,
    /// The guard, or `None` when run with `BLOOM_GUARD=off`.
    pub guard: Option<BloomGuard>,
    /// Set on shutdown, for the background tasks.
    stop: Arc<watch::Sender<bool>>,
    /// The task keeping the filter true, awaited on shutdown.
    keeper: Arc<Mutex<Option<JoinHandle<()>>>>,
}

impl AppState {
    /// State for `db`, guarded by `guard`, with the service's cache settings.
    pub fn new(db: Database, guard: Option<BloomGuard>) -> Self {
        Self {
            db,
            cache: ReadThroughCache::builder().max_capacity(100_000).build(),
            guard,
            stop: Arc::new(watch::channel(false).0),
            keeper: Arc::default(),
        }
    }

    /// Completes once [`shut_down`](Self::shut_down) is called.
    pub fn stopping(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut stop = self.stop.subscribe();
        async move {
            let _ = stop.wait_for(|stopped| *stopped).await;
        }
    }

    pub(crate) fn keep(&self, task: JoinHandle<()>) {
        *self.keeper.lock().unwrap_or_else(PoisonError::into_inner) = Some(task);
    }

    /// Stops the background tasks (the follower closes its connection) and
    /// closes the database pool.
    pub async fn shut_down(&self) {
        self.stop.send_replace(true);
        let keeper = self
            .keeper
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(keeper) = keeper {
            let _ = keeper.await;
        }
        self.db.close().await;
    }
}

/// The public API: `/items/{key}` behind the guard, `POST /items`, `/readyz`.
pub fn app(state: AppState) -> Router {
    let mut item = Router::new().route("/items/{key}", get(get_item).delete(delete_item));
    if let Some(guard) = &state.guard {
        item = item.route_layer(guard.clone());
    }
    Router::new()
        .merge(item)
        .route("/items", post(create_item))
        .route("/readyz", get(readyz))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}

/// The admin API behind `token`: `GET /admin/bloom`, `POST
/// /admin/bloom/rebuild` and, given a Prometheus handle, `GET /metrics`.
/// Serve it on its own address.
pub fn admin_app(state: &AppState, token: &str, prometheus: Option<PrometheusHandle>) -> Router {
    let Some(guard) = &state.guard else {
        return Router::new();
    };
    let mut admin = Admin::new(guard.clone(), token);
    admin = match state.db.pool().clone() {
        Pool::Postgres(pool) => admin.rebuild_from(PgCopySource::new(pool, KEY_QUERY)),
        Pool::Sqlite(pool) => admin.rebuild_from(QuerySource::new(pool, KEY_QUERY)),
    };
    if let Some(handle) = prometheus {
        admin = admin.prometheus(handle);
    }
    admin.into_router()
}

fn check_key(key: &str) -> Result<(), ApiError> {
    if key.is_empty() {
        return Err(ApiError::bad_request("key must not be empty"));
    }
    if key.len() > MAX_KEY_LEN {
        return Err(ApiError::bad_request("key too long"));
    }
    if key.contains('\0') {
        return Err(ApiError::bad_request("key must not contain NUL"));
    }
    // Clients and proxies rewrite `.` and `..` in paths: such keys could
    // never be requested.
    if key == "." || key == ".." {
        return Err(ApiError::bad_request("malformed key: dot segment"));
    }
    Ok(())
}

/// The `{key}` of `/items/{key}`, decoded by the guard's own canonical
/// function, so the guard and the handlers read every path alike (and
/// refuse the same ones), whether the guard is on or off.
struct ItemKey(String);

impl<S: Send + Sync> FromRequestParts<S> for ItemKey {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        let segment = parts
            .uri
            .path()
            .rsplit_once('/')
            .map_or("", |(_, segment)| segment);
        let key = Key::from_path_segment(segment)
            .map_err(|error| ApiError::bad_request(error.to_string()))?;
        let key = String::from_utf8(key.as_bytes().to_vec())
            .map_err(|_| ApiError::bad_request("key is not valid UTF-8"))?;
        check_key(&key)?;
        Ok(ItemKey(key))
    }
}

async fn get_item(
    State(state): State<AppState>,
    ItemKey(key): ItemKey,
) -> Result<Response, ApiError> {
    let (db, guard, lookup) = (state.db.clone(), state.guard.clone(), key.clone());
    let item = state
        .cache
        .get_or_load(key, || async move {
            let item = db.get(&lookup).await?;
            if let (None, Some(guard)) = (&item, guard) {
                // The guard let an absent key through.
                guard.record_false_positive();
            }
            Ok::<_, sqlx::Error>(item)
        })
        .await?;
    Ok(match item {
        Some(item) => Json(item).into_response(),
        None => not_found(),
    })
}

/// The body of `POST /items`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NewItem {
    key: String,
    #[serde(default)]
    value: String,
}

async fn create_item(
    State(state): State<AppState>,
    body: Result<Json<NewItem>, JsonRejection>,
) -> Result<Response, ApiError> {
    let Json(new) = body?;
    check_key(&new.key)?;
    // Into the filter before the row commits: a failed insert leaves a
    // harmless false positive, never a window where the key is refused.
    if let Some(guard) = &state.guard {
        guard.insert(&new.key);
    }
    let created = state.db.insert(&new.key, &new.value).await?;
    // A negative entry from an earlier lookup would hide the new item.
    state.cache.invalidate(&new.key).await;
    match created {
        Some(item) => Ok((StatusCode::CREATED, Json(item)).into_response()),
        None => Err(ApiError::Conflict),
    }
}

async fn delete_item(
    State(state): State<AppState>,
    ItemKey(key): ItemKey,
) -> Result<Response, ApiError> {
    let deleted = state.db.delete(&key).await?;
    state.cache.invalidate(&key).await;
    Ok(if deleted {
        StatusCode::NO_CONTENT.into_response()
    } else {
        not_found()
    })
}

async fn readyz(State(state): State<AppState>) -> Response {
    let state_name = state
        .guard
        .as_ref()
        .map_or("ready", |g| g.stats().state.as_str());
    let ready = state.guard.as_ref().is_none_or(BloomGuard::is_ready);
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(json!({ "status": state_name }))).into_response()
}
