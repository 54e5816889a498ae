//! `cargo run -p bloom-guard --example in_memory`: the smallest guarded
//! service, keys in memory, no database.
//!
//! Shows a guard warmed from a key list, a route guarded by its layer, the
//! write path inserting into the guard before "committing" the key, and
//! the handler answering its misses with the guard's own bytes. Then:
//!
//! ```text
//! curl -i localhost:3000/items/apple         # 200
//! curl -i localhost:3000/items/nope          # 404, answered by the guard
//! curl -i -X PUT localhost:3000/items/kiwi   # 201
//! curl -i localhost:3000/items/kiwi          # 200
//! ```

use std::collections::HashSet;
use std::sync::{Arc, RwLock};

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use bloom_guard::{extract::PathParam, not_found_response, BloomGuard, KeyList};

#[derive(Clone)]
struct AppState {
    guard: BloomGuard,
    items: Arc<RwLock<HashSet<String>>>,
}

async fn get_item(State(state): State<AppState>, Path(key): Path<String>) -> Response {
    let found = state.items.read().is_ok_and(|items| items.contains(&key));
    if found {
        StatusCode::OK.into_response()
    } else {
        // The guard's answer for absent keys, byte for byte.
        not_found_response().map(Body::from)
    }
}

async fn put_item(State(state): State<AppState>, Path(key): Path<String>) -> StatusCode {
    state.guard.insert(&key); // before the key is stored: never a window
    match state.items.write() {
        Ok(mut items) => {
            items.insert(key);
            StatusCode::CREATED
        }
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let stored = ["apple", "banana", "cherry"];
    let guard = BloomGuard::builder().name("items").build();
    guard.clone().warm(KeyList::new(stored)).await;
    let state = AppState {
        guard: guard.clone(),
        items: Arc::new(RwLock::new(
            stored.iter().map(|k| (*k).to_owned()).collect(),
        )),
    };
    // Only GET and HEAD are checked: PUT reaches the handler and creates.
    let app = Router::new()
        .route("/items/{key}", get(get_item).put(put_item))
        .route_layer(guard.layer(PathParam("key")))
        .with_state(state);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    axum::serve(listener, app).await
}
