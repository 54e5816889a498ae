//! The public API: items and users behind their guards, and readiness.

use axum::extract::rejection::JsonRejection;
use axum::extract::{DefaultBodyLimit, FromRequestParts, Path, State};
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use bloom_guard::{extract::PathParam, keys::KeyError};
use serde::Deserialize;
use serde_json::json;

use crate::config::MAX_KEY_LEN;
use crate::error::{not_found, ApiError};
use crate::state::AppState;

/// The largest request body accepted, in bytes.
pub const MAX_BODY_BYTES: usize = 16 * 1024;

/// The public API: `/items/{key}` and `/users/{id}` behind their guards
/// (only `GET` and `HEAD` are checked), `POST /items`, `POST /users`,
/// `/readyz`.
pub fn app(state: AppState) -> Router {
    let mut item = Router::new().route("/items/{key}", get(get_item).delete(delete_item));
    let mut user = Router::new().route("/users/{id}", get(get_user));
    if let Some(guards) = &state.guards {
        item = item.route_layer(guards.items.layer(PathParam("key")));
        user = user.route_layer(guards.users.layer(PathParam("id")));
    }
    Router::new()
        .merge(item)
        .merge(user)
        .route("/items", post(create_item))
        .route("/users", post(create_user))
        .route("/readyz", get(readyz))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}

fn check_key(key: &str) -> Result<(), ApiError> {
    if key.is_empty() {
        return Err(ApiError::bad_request("key must not be empty"));
    }
    if key.len() > MAX_KEY_LEN {
        return Err(KeyError::TooLong {
            len: key.len(),
            max: MAX_KEY_LEN,
        }
        .into());
    }
    if key.contains('\0') {
        return Err(ApiError::bad_request("key must not contain NUL"));
    }
    Ok(())
}

/// The `{key}` of `/items/{key}`, as axum's `Path` reads it (which the
/// guard's `PathParam` reads alike: `%2e%2e` is the key `..`, `100%` stays
/// `100%`), with the service's own 400s for keys it never stores.
struct ItemKey(String);

impl<S: Send + Sync> FromRequestParts<S> for ItemKey {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let Path(key) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|_| ApiError::bad_request("malformed key: not valid UTF-8"))?;
        check_key(&key)?;
        Ok(ItemKey(key))
    }
}

async fn get_item(
    State(state): State<AppState>,
    ItemKey(key): ItemKey,
) -> Result<Response, ApiError> {
    let (db, guard, lookup) = (state.db.clone(), state.items_guard().cloned(), key.clone());
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
    check_text("value", &new.value)?;
    // Into the filter before the row commits: a failed insert leaves a
    // harmless false positive, never a window where the key is refused.
    if let Some(guard) = state.items_guard() {
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

/// The body of `POST /users`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NewUser {
    #[serde(default)]
    name: String,
}

/// The longest user name, in bytes.
const MAX_NAME_LEN: usize = 1024;

/// Text Postgres cannot store (a NUL byte): a 4xx before any write.
fn check_text(field: &str, text: &str) -> Result<(), ApiError> {
    if text.contains('\0') {
        return Err(ApiError::bad_request(format!(
            "{field} must not contain NUL"
        )));
    }
    Ok(())
}

async fn get_user(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    // Any form a UUID parser accepts (upper case, braces, no hyphens);
    // anything else names no user.
    let Ok(id) = uuid::Uuid::try_parse(&id) else {
        return Ok(not_found());
    };
    Ok(match state.db.get_user(id).await? {
        Some(user) => Json(user).into_response(),
        None => {
            if let Some(guards) = &state.guards {
                guards.users.record_false_positive();
            }
            not_found()
        }
    })
}

async fn create_user(
    State(state): State<AppState>,
    body: Result<Json<NewUser>, JsonRejection>,
) -> Result<Response, ApiError> {
    let Json(new) = body?;
    check_text("name", &new.name)?;
    if new.name.len() > MAX_NAME_LEN {
        return Err(ApiError::bad_request("name too long"));
    }
    let id = uuid::Uuid::new_v4();
    if let Some(guards) = &state.guards {
        guards.users.insert(id.hyphenated().to_string());
    }
    let user = state.db.insert_user(id, &new.name).await?;
    Ok((StatusCode::CREATED, Json(user)).into_response())
}

async fn readyz(State(state): State<AppState>) -> Response {
    let waiting = state
        .guards
        .as_ref()
        .and_then(|guards| guards.all().into_iter().find(|guard| !guard.is_ready()));
    match waiting {
        None => (StatusCode::OK, Json(json!({ "status": "ready" }))).into_response(),
        Some(guard) => {
            let stats = guard.stats();
            (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(json!({
                    "status": stats.state.as_str(),
                    "guard": guard.name(),
                    "reason": stats.reason,
                })),
            )
                .into_response()
        }
    }
}
