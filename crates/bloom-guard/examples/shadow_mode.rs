//! `cargo run -p bloom-guard --example shadow_mode`: a guard in shadow mode
//! catches a false negative before it hurts anyone, then enforces.
//!
//! The "database" here is a set in memory; one key was written without
//! `guard.insert` (the kind of bug shadow mode exists for). In shadow mode
//! the guard decides every request but passes them all on, and a 2xx for a
//! key it would have rejected is counted as a false negative. After a
//! rebuild from the database, the guard is switched to enforce.

#![allow(clippy::print_stdout, reason = "an example reports on stdout")]

use std::collections::HashSet;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use bloom_guard::{extract::PathParam, not_found_response, BloomGuard, KeyList, Mode};
use tower::ServiceExt;

async fn get_item(
    State(items): State<Arc<HashSet<&'static str>>>,
    Path(key): Path<String>,
) -> Response {
    if items.contains(key.as_str()) {
        StatusCode::OK.into_response()
    } else {
        // The guard's answer for absent keys, byte for byte.
        not_found_response().map(Body::from)
    }
}

async fn request(app: &Router, path: &str) -> StatusCode {
    let request = Request::get(path)
        .body(Body::empty())
        .expect("a valid request");
    app.clone()
        .oneshot(request)
        .await
        .expect("infallible")
        .status()
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The database holds three keys; the guard was only told of two.
    let items = Arc::new(HashSet::from(["apple", "pear", "kiwi"]));
    let guard = BloomGuard::builder()
        .name("items")
        .mode(Mode::Shadow)
        .build();
    guard.rebuild(&KeyList::new(["apple", "pear"])).await?;
    let app = Router::new()
        .route("/items/{key}", get(get_item))
        .route_layer(guard.layer(PathParam("key")))
        .with_state(items);

    for path in ["/items/apple", "/items/no-such-key", "/items/kiwi"] {
        println!("shadow:  GET {path} -> {}", request(&app, path).await);
    }
    let stats = guard.stats();
    println!(
        "shadow:  would have rejected {}, of which false negatives {} (kiwi exists)",
        stats.shadow_would_reject, stats.shadow_false_negatives
    );
    assert_eq!(stats.shadow_false_negatives, 1);

    // The fix: a filter of every key (a follower keeps it so), then enforce.
    guard
        .rebuild(&KeyList::new(["apple", "pear", "kiwi"]))
        .await?;
    guard.set_mode(Mode::Enforce).await?;
    for path in ["/items/kiwi", "/items/no-such-key"] {
        println!("enforce: GET {path} -> {}", request(&app, path).await);
    }
    println!("enforce: rejected by the guard {}", guard.stats().rejected);
    Ok(())
}
