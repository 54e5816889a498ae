//! `cargo run -p bloom-guard --example typed_keys`: one canonical form for
//! stored and requested keys, so every spelling of a UUID or an integer
//! finds its row.
//!
//! Postgres prints a `uuid` as lower-case hyphenated text and an integer
//! in decimal; clients write `550E8400-...`, `{550e8400-...}`, `007`. With
//! the guard's [`KeyType`](bloom_guard::KeyType) the filter and the request
//! path agree on one form, and a value that is not of the type goes to the
//! handler unchecked (counted), never refused by the guard.

#![allow(clippy::print_stdout, reason = "an example reports on stdout")]

use axum::body::Body;
use axum::http::Request;
use axum::routing::get;
use axum::Router;
use bloom_guard::{extract::PathParam, BloomGuard, KeyList, KeyType};
use tower::ServiceExt;

async fn check(guard: &BloomGuard, paths: &[&str]) {
    let app: Router = Router::new()
        .route("/{id}", get(|| async { "passed to the handler" }))
        .route_layer(guard.layer(PathParam("id")));
    for path in paths {
        let request = Request::get(*path)
            .body(Body::empty())
            .expect("a valid request");
        let status = app
            .clone()
            .oneshot(request)
            .await
            .expect("infallible")
            .status();
        println!("{:>8} GET {path} -> {status}", guard.name());
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // As the database stores them.
    let users = BloomGuard::builder()
        .name("users")
        .key_type(KeyType::Uuid)
        .build();
    users
        .rebuild(&KeyList::new(["550e8400-e29b-41d4-a716-446655440000"]))
        .await?;
    check(
        &users,
        &[
            "/550E8400-E29B-41D4-A716-446655440000", // upper case: found
            "/%7B550e8400-e29b-41d4-a716-446655440000%7D", // braces: found
            "/550e8400e29b41d4a716446655440000",     // no hyphens: found
            "/6ba7b810-9dad-11d1-80b4-00c04fd430c8", // absent: 404 by the guard
            "/not-a-uuid",                           // not of the type: unchecked
        ],
    )
    .await;

    let orders = BloomGuard::builder()
        .name("orders")
        .key_type(KeyType::Integer)
        .build();
    orders.rebuild(&KeyList::new(["7", "42"])).await?;
    check(&orders, &["/007", "/+42", "/8"]).await;

    let unchecked = users.stats().unchecked;
    println!(
        "users: {} request(s) not of the key type went to the handler unchecked",
        unchecked.not_of_key_type
    );
    assert_eq!((users.stats().rejected, orders.stats().rejected), (1, 1));
    Ok(())
}
