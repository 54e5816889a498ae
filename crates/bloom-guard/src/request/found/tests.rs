use axum::body::Body;
use axum::response::{IntoResponse, Redirect};
use axum::routing::get;
use axum::Router;
use http::{Request, StatusCode};
use tower::ServiceExt;

use crate::handle::builder::Builder;
use crate::handle::guard::BloomGuard;
use crate::lifecycle::source::KeyList;
use crate::request::path_param::PathParam;
use crate::switches::mode::Mode;

/// A guard in shadow mode whose filter lacks every key but "other".
async fn shadow(builder: Builder) -> BloomGuard {
    // Every would-be refusal checked: one false negative does not fail
    // the guard open here.
    let guard = builder
        .mode(Mode::Shadow)
        .rebuild_on_false_negative(false)
        .build();
    guard
        .rebuild(&KeyList::new(["other"]))
        .await
        .expect("build");
    guard
}

async fn status(app: &Router, uri: &str) -> StatusCode {
    let request = Request::get(uri).body(Body::empty()).expect("a request");
    app.clone()
        .oneshot(request)
        .await
        .expect("infallible")
        .status()
}

#[tokio::test]
async fn a_redirect_for_a_key_the_filter_lacks_is_a_false_negative() {
    let guard = shadow(BloomGuard::builder()).await;
    let app = Router::new()
        .route(
            "/l/{code}",
            get(|| async { Redirect::temporary("https://example.com/") }),
        )
        .route_layer(guard.layer(PathParam("code")));
    assert_eq!(status(&app, "/l/abc").await, StatusCode::TEMPORARY_REDIRECT);
    assert_eq!(guard.stats().shadow_false_negatives, 1);
}

#[tokio::test]
async fn a_route_that_answers_200_for_absent_keys_can_say_how() {
    // 200 for every key; `x-not-found` on the absent ones.
    let route = || {
        get(
            |axum::extract::Path(key): axum::extract::Path<String>| async move {
                if key == "stored" {
                    r#"{"found":true}"#.into_response()
                } else {
                    ([("x-not-found", "1")], r#"{"found":false}"#).into_response()
                }
            },
        )
    };
    let naive = shadow(BloomGuard::builder()).await;
    let told =
        shadow(BloomGuard::builder().found_when(|status, headers| {
            status.is_success() && !headers.contains_key("x-not-found")
        }))
        .await;
    for guard in [&naive, &told] {
        let app = Router::new()
            .route("/things/{key}", route())
            .route_layer(guard.layer(PathParam("key")));
        assert_eq!(status(&app, "/things/absent").await, StatusCode::OK);
        assert_eq!(status(&app, "/things/stored").await, StatusCode::OK);
    }
    // Untold, every absent answer is taken for a key found.
    assert_eq!(naive.stats().shadow_false_negatives, 2);
    // Told, only the key that exists (missing from this filter) counts.
    assert_eq!(told.stats().shadow_false_negatives, 1);
}
