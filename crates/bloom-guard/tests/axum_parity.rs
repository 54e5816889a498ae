//! Differential tests: the guard reads a request's key as axum's own
//! extractors read it. For arbitrary paths and query strings, axum's `Path`
//! and `Query` run first, unguarded; then a guard holding exactly the value
//! axum read answers the same request. It must reach the handler: the
//! guard may look the key up or pass it unchecked, never call it absent.
//! Where axum refuses the value, a guard holding nothing must pass it on
//! too, so the handler's own refusal is the answer.

use std::collections::HashMap;

use axum::body::Body;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query};
use axum::routing::get;
use axum::Router;
use bloom_guard::{
    extract::{PathParam, QueryParam},
    BloomGuard, KeyList,
};
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use proptest::prelude::*;
use tower::ServiceExt;

/// What axum read: the value, or `None` for a rejection.
type Read = Option<String>;

async fn body_of(app: Router, uri: &str) -> (StatusCode, String) {
    let request = Request::get(uri).body(Body::empty()).expect("a valid uri");
    let response = app.oneshot(request).await.expect("infallible");
    let status = response.status();
    let bytes = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

/// The value read, as the body `ok:<value>`, or `rejected` with a 400.
fn answer(read: Read) -> (StatusCode, String) {
    match read {
        Some(value) => (StatusCode::OK, format!("ok:{value}")),
        None => (StatusCode::BAD_REQUEST, "rejected".to_owned()),
    }
}

async fn by_path(path: Result<Path<String>, PathRejection>) -> (StatusCode, String) {
    answer(path.ok().map(|Path(value)| value))
}

#[derive(serde::Deserialize)]
struct Lookup {
    id: String,
}

async fn by_query(query: Result<Query<Lookup>, QueryRejection>) -> (StatusCode, String) {
    answer(query.ok().map(|Query(lookup)| lookup.id))
}

async fn by_query_map(query: Query<HashMap<String, String>>) -> (StatusCode, String) {
    answer(query.0.get("id").cloned())
}

/// A guard whose filter holds exactly `keys`.
async fn guard_holding(keys: &[String]) -> BloomGuard {
    let guard = BloomGuard::builder().build();
    guard.rebuild(&KeyList::new(keys)).await.expect("build");
    guard
}

/// Sends `uri` unguarded, then through a guard holding what axum read, and
/// checks that both answers are the same.
async fn same_answer(
    routes: fn() -> Router,
    layer: impl Fn(&BloomGuard) -> Router,
    uri: &str,
) -> Result<(), TestCaseError> {
    let unguarded = body_of(routes(), uri).await;
    let held: Vec<String> = unguarded
        .1
        .strip_prefix("ok:")
        .map(str::to_owned)
        .into_iter()
        .collect();
    let guard = guard_holding(&held).await;
    let guarded = body_of(layer(&guard), uri).await;
    prop_assert_eq!(&guarded, &unguarded, "{}", uri);
    let stats = guard.stats();
    prop_assert_eq!(stats.rejected, 0, "{}", uri);
    if !held.is_empty() {
        // Read and looked up, not waved through; only a parameter given
        // twice (which axum's map reads as the last) passes unchecked.
        let checked = stats.passed + stats.unchecked.ambiguous;
        prop_assert_eq!(checked, 1, "{} was not checked: {:?}", uri, stats.unchecked);
    }
    Ok(())
}

fn path_routes() -> Router {
    Router::new().route("/items/{key}", get(by_path))
}

fn query_routes() -> Router {
    Router::new()
        .route("/lookup", get(by_query))
        .route("/map", get(by_query_map))
}

/// A piece of a URL component: plain characters, escapes valid and not,
/// dots, form syntax, and UTF-8 of any character, escaped.
fn piece() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-zA-Z0-9_~-]{1,3}",
        Just(".".to_owned()),
        Just("..".to_owned()),
        Just("+".to_owned()),
        Just("%".to_owned()),
        Just("%2e".to_owned()),
        Just("%2E".to_owned()),
        "%[0-9a-fA-F]",
        "%[g-zG-Z][0-9a-fA-F]",
        any::<u8>().prop_map(|byte| format!("%{byte:02X}")),
        any::<u8>().prop_map(|byte| format!("%{byte:02x}")),
        any::<char>().prop_map(|c| {
            let mut utf8 = [0; 4];
            c.encode_utf8(&mut utf8)
                .bytes()
                .map(|byte| format!("%{byte:02X}"))
                .collect()
        }),
        Just("=".to_owned()),
        Just("&".to_owned()),
        Just("!$'()*,;:@".to_owned()),
    ]
}

fn component() -> impl Strategy<Value = String> {
    prop::collection::vec(piece(), 0..6).prop_map(|pieces| pieces.concat())
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime")
}

#[test]
fn path_param_reads_what_axum_path_reads() {
    let runtime = runtime();
    proptest!(ProptestConfig::with_cases(512), |(segment in component())| {
        // `&` and `=` are plain characters in a path.
        let uri = format!("/items/{segment}");
        prop_assume!(uri.parse::<http::Uri>().is_ok());
        runtime.block_on(same_answer(
            path_routes,
            |guard| path_routes().route_layer(guard.layer(PathParam("key"))),
            &uri,
        ))?;
    });
}

#[test]
fn query_param_reads_what_axum_query_reads() {
    let runtime = runtime();
    let names = prop_oneof![
        Just("id".to_owned()),
        Just("i%64".to_owned()),
        Just("ID".to_owned()),
        Just("other".to_owned()),
        Just("id+".to_owned()),
    ];
    let pair = (names, component()).prop_map(|(name, value)| format!("{name}={value}"));
    proptest!(ProptestConfig::with_cases(512), |(pairs in prop::collection::vec(pair, 0..4), route in prop_oneof![Just("lookup"), Just("map")])| {
        let uri = format!("/{route}?{}", pairs.join("&"));
        prop_assume!(uri.parse::<http::Uri>().is_ok());
        runtime.block_on(same_answer(
            query_routes,
            |guard| query_routes().route_layer(guard.layer(QueryParam("id"))),
            &uri,
        ))?;
    });
}

/// The cases the table of refused keys listed, as fixed examples.
#[test]
fn keys_a_path_guard_once_refused_are_read_as_axum_reads_them() {
    let runtime = runtime();
    for segment in [
        "%2e%2e",
        "%2E",
        "a%ZZ",
        "100%",
        "x%2",
        "edg%01ecase",
        "%F0%9F%A6%80",
    ] {
        let uri = format!("/items/{segment}");
        let result = runtime.block_on(same_answer(
            path_routes,
            |guard| path_routes().route_layer(guard.layer(PathParam("key"))),
            &uri,
        ));
        assert!(result.is_ok(), "{uri}: {result:?}");
    }
}
