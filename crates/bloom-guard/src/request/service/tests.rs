//! Tests of `service.rs`.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use http::StatusCode;
use http_body_util::BodyExt;
use tower::{service_fn, ServiceBuilder, ServiceExt};

use crate::{
    extract::{PathParam, PathSegment},
    BloomGuard, KeyList,
};

/// An inner service that counts its calls.
fn counting_app(guard: &BloomGuard) -> (Router, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&calls);
    let app = Router::new()
        .route(
            "/items/{key}",
            get(move || async move {
                counter.fetch_add(1, Ordering::SeqCst);
                "inner"
            }),
        )
        .route("/health", get(|| async { "ok" }))
        .route_layer(guard.layer(PathParam("key")));
    (app, calls)
}

async fn warm_guard(keys: &[&str]) -> BloomGuard {
    let guard = BloomGuard::builder().build();
    guard.clone().warm(KeyList::new(keys)).await;
    guard
}

async fn get_uri(app: &Router, uri: &str) -> (StatusCode, String) {
    let (status, _, body) = answer(app, &http::Method::GET, uri).await;
    (status, body)
}

#[tokio::test]
async fn absent_key_gets_the_configured_response_without_calling_inner() {
    let guard = BloomGuard::builder()
        .absent_response(
            http::Response::builder()
                .status(StatusCode::GONE)
                .header("x-why", "absent")
                .body("gone")
                .expect("valid response"),
        )
        .build();
    guard
        .rebuild(&KeyList::new(["present"]))
        .await
        .expect("build");
    let (app, calls) = counting_app(&guard);

    let request = http::Request::get("/items/absent")
        .body(Body::empty())
        .expect("valid request");
    let response = app.oneshot(request).await.expect("infallible");
    assert_eq!(response.status(), StatusCode::GONE);
    assert_eq!(response.headers()["x-why"], "absent");
    assert_eq!(
        response
            .into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes(),
        "gone"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    assert_eq!(guard.stats().rejected, 1);
}

#[tokio::test]
async fn default_absent_response_is_a_json_404() {
    let (app, _) = counting_app(&warm_guard(&["present"]).await);
    assert_eq!(
        get_uri(&app, "/items/absent").await,
        (StatusCode::NOT_FOUND, r#"{"error":"not found"}"#.to_owned())
    );
}

#[tokio::test]
async fn present_key_reaches_the_inner_service() {
    let guard = warm_guard(&["present", "a/b c"]).await;
    let (app, calls) = counting_app(&guard);
    assert_eq!(
        get_uri(&app, "/items/present").await,
        (StatusCode::OK, "inner".to_owned())
    );
    assert_eq!(
        get_uri(&app, "/items/a%2Fb%20c").await,
        (StatusCode::OK, "inner".to_owned())
    );
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!(guard.stats().passed, 2);
}

#[tokio::test]
async fn requests_without_a_key_pass() {
    let (app, _) = counting_app(&warm_guard(&[]).await);
    assert_eq!(
        get_uri(&app, "/health").await,
        (StatusCode::OK, "ok".to_owned())
    );
    // `route_layer`: unknown routes keep the router's own 404.
    assert_eq!(
        get_uri(&app, "/nowhere").await,
        (StatusCode::NOT_FOUND, String::new())
    );
}

#[tokio::test]
async fn everything_passes_until_the_filter_is_warm() {
    let guard = BloomGuard::builder().build();
    let (app, calls) = counting_app(&guard);
    assert_eq!(get_uri(&app, "/items/anything").await.0, StatusCode::OK);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    guard.rebuild(&KeyList::new(["x"])).await.expect("build");
    assert_eq!(
        get_uri(&app, "/items/anything").await.0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn overlong_keys_pass_unchecked_unless_the_guard_refuses_them() {
    let long = "k".repeat(17);
    let guard = BloomGuard::builder().max_key_len(16).build();
    guard.rebuild(&KeyList::new(["a"])).await.expect("build");
    let (app, calls) = counting_app(&guard);
    // Stored or not, the guard cannot look it up: the handler answers.
    let (status, body) = get_uri(&app, &format!("/items/{long}")).await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "inner"));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    let stats = guard.stats();
    assert_eq!((stats.passed, stats.rejected, stats.bad_keys), (0, 0, 0));
    assert_eq!(stats.unchecked.too_long, 1);
    // 16 bytes after decoding is checked even though the URL is longer.
    let encoded = "%6B".repeat(16);
    assert_eq!(
        get_uri(&app, &format!("/items/{encoded}")).await.0,
        StatusCode::NOT_FOUND
    );

    let refusing = BloomGuard::builder()
        .max_key_len(16)
        .refuse_long_keys(true)
        .build();
    refusing
        .rebuild(&KeyList::new([long.as_str()]))
        .await
        .expect("build");
    let (app, calls) = counting_app(&refusing);
    let (status, body) = get_uri(&app, &format!("/items/{long}")).await;
    assert_eq!(
        (status, body.as_str()),
        (StatusCode::BAD_REQUEST, r#"{"error":"key too long"}"#)
    );
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    assert_eq!(refusing.stats().bad_keys, 1);
}

#[tokio::test]
async fn works_in_a_plain_tower_stack() {
    let guard = BloomGuard::builder().build();
    guard
        .rebuild(&KeyList::new(["present"]))
        .await
        .expect("build");
    let svc = ServiceBuilder::new()
        .layer(guard.layer(PathSegment(1)))
        .service(service_fn(|_req: http::Request<()>| async {
            Ok::<_, Infallible>(http::Response::new(Body::from("inner")))
        }));
    let present = http::Request::get("/items/present")
        .body(())
        .expect("valid request");
    assert_eq!(
        svc.clone().oneshot(present).await.map(|r| r.status()),
        Ok(StatusCode::OK)
    );
    let absent = http::Request::get("/items/absent")
        .body(())
        .expect("valid request");
    assert_eq!(
        svc.oneshot(absent).await.map(|r| r.status()),
        Ok(StatusCode::NOT_FOUND)
    );
}

#[tokio::test]
async fn a_refusal_waiting_for_a_read_never_calls_the_inner_service() {
    let guard = warm_guard(&["present"]).await;
    let reader = guard.feed().reader();
    // The feed: each read brings "late", committed after the build.
    let feeding = guard.clone();
    let follower = tokio::spawn(async move {
        loop {
            reader.asked().await;
            let read = reader.begin();
            feeding.insert("late");
            reader.done(read);
        }
    });
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&calls);
    let svc = ServiceBuilder::new()
        .layer(guard.layer(PathSegment(1)))
        .service(service_fn(move |_req: http::Request<()>| {
            counter.fetch_add(1, Ordering::SeqCst);
            async { Ok::<_, Infallible>(http::Response::new(Body::from("inner"))) }
        }));
    let get = |uri: &str| http::Request::get(uri).body(()).expect("valid request");
    let absent = svc.clone().oneshot(get("/items/absent")).await;
    assert_eq!(absent.map(|r| r.status()), Ok(StatusCode::NOT_FOUND));
    assert_eq!(
        calls.load(Ordering::SeqCst),
        0,
        "a refusal made the inner future"
    );
    let late = svc.oneshot(get("/items/late")).await;
    assert_eq!(late.map(|r| r.status()), Ok(StatusCode::OK));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(guard.stats().rejected, 1);
    follower.abort();
}

#[tokio::test]
async fn the_debug_header_marks_only_the_guards_answers() {
    let quiet = warm_guard(&["a"]).await;
    let request = http::Request::get("/items/absent")
        .body(Body::empty())
        .expect("valid request");
    let response = counting_app(&quiet)
        .0
        .oneshot(request)
        .await
        .expect("infallible");
    assert!(
        !response.headers().contains_key("x-bloom-guard"),
        "on by default"
    );

    let guard = BloomGuard::builder().debug_header(true).build();
    guard.rebuild(&KeyList::new(["a"])).await.expect("build");
    let request = http::Request::get("/items/absent")
        .body(Body::empty())
        .expect("valid request");
    let response = counting_app(&guard)
        .0
        .oneshot(request)
        .await
        .expect("infallible");
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    assert_eq!(response.headers()["x-bloom-guard"], "absent");
}

/// Every key axum's `Path` reads is a key the app may store: dot
/// segments, malformed escapes and empty values are looked up as they
/// decode, never refused.
#[tokio::test]
async fn keys_the_app_serves_are_never_refused() {
    let stored = ["..", ".", "a%ZZ", "100%", "x%2", "edg\u{1}ecase", ""];
    let guard = warm_guard(&stored).await;
    let (app, calls) = counting_app(&guard);
    for path in [
        "/items/%2e%2e",
        "/items/%2E",
        "/items/a%ZZ",
        "/items/100%",
        "/items/x%2",
        "/items/edg%01ecase",
    ] {
        assert_eq!(
            get_uri(&app, path).await,
            (StatusCode::OK, "inner".into()),
            "{path}"
        );
    }
    // The same forms of keys that are not stored are looked up too.
    for path in ["/items/%2e%2e%2e", "/items/b%ZZ", "/items/99%"] {
        assert_eq!(get_uri(&app, path).await.0, StatusCode::NOT_FOUND, "{path}");
    }
    assert_eq!(calls.load(Ordering::SeqCst), 6);
    // Bytes that are not UTF-8 (axum's `Path` refuses them) pass unchecked.
    assert_eq!(get_uri(&app, "/items/%FF%FE").await.0, StatusCode::OK);
    let stats = guard.stats();
    assert_eq!(stats.unchecked.not_utf8, 1);
    assert_eq!((stats.passed, stats.rejected, stats.bad_keys), (6, 3, 0));

    let svc = ServiceBuilder::new()
        .layer(guard.layer(crate::extract::QueryParam("id")))
        .service(service_fn(|_req: http::Request<()>| async {
            Ok::<_, Infallible>(http::Response::new(Body::from("inner")))
        }));
    for (uri, status) in [
        ("/lookup?id=", StatusCode::OK),
        ("/lookup?id=nope", StatusCode::NOT_FOUND),
        ("/lookup?id=nope&id=..", StatusCode::OK),
    ] {
        let request = http::Request::get(uri).body(()).expect("valid request");
        let answer = svc.clone().oneshot(request).await.map(|r| r.status());
        assert_eq!(answer, Ok(status), "{uri}");
    }
    assert_eq!(guard.stats().unchecked.ambiguous, 1);
}

#[tokio::test]
async fn inserted_keys_pass_at_once() {
    let guard = warm_guard(&["a"]).await;
    let (app, _) = counting_app(&guard);
    assert_eq!(
        get_uri(&app, "/items/new%0Akey").await.0,
        StatusCode::NOT_FOUND
    );
    guard.insert("new\nkey");
    assert_eq!(get_uri(&app, "/items/new%0Akey").await.0, StatusCode::OK);
}

/// An items API: GET finds the key among `stored`, PUT creates, DELETE
/// removes; other methods get axum's 405. Counts its calls.
fn items_api(stored: &'static [&'static str]) -> (Router, Arc<AtomicUsize>) {
    use axum::extract::Path;
    use axum::response::IntoResponse;
    let calls = Arc::new(AtomicUsize::new(0));
    let (get_calls, put_calls, delete_calls) = (calls.clone(), calls.clone(), calls.clone());
    let app = Router::new().route(
        "/items/{key}",
        get(move |Path(key): Path<String>| async move {
            get_calls.fetch_add(1, Ordering::SeqCst);
            if stored.contains(&key.as_str()) {
                "found".into_response()
            } else {
                crate::not_found_response().map(Body::from).into_response()
            }
        })
        .put(move || async move {
            put_calls.fetch_add(1, Ordering::SeqCst);
            StatusCode::CREATED
        })
        .delete(move || async move {
            delete_calls.fetch_add(1, Ordering::SeqCst);
            StatusCode::NO_CONTENT
        }),
    );
    (app, calls)
}

async fn answer(
    app: &Router,
    method: &http::Method,
    uri: &str,
) -> (StatusCode, Vec<(String, String)>, String) {
    let request = http::Request::builder()
        .method(method.clone())
        .uri(uri)
        .body(Body::empty())
        .expect("valid request");
    let response = app.clone().oneshot(request).await.expect("infallible");
    let status = response.status();
    let mut headers: Vec<_> = response
        .headers()
        .iter()
        .map(|(name, value)| {
            (
                name.to_string(),
                String::from_utf8_lossy(value.as_bytes()).into_owned(),
            )
        })
        .collect();
    headers.sort();
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    (status, headers, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test]
async fn only_reads_are_checked_and_every_answer_is_the_unguarded_ones() {
    const STORED: &[&str] = &["present"];
    let guard = warm_guard(STORED).await;
    // In the filter, not in the database: a false positive (as a
    // rolled-back insert leaves).
    let false_positive = "rolled-back".to_owned();
    guard.insert(&false_positive);
    let (plain, _) = items_api(STORED);
    let (guarded, calls) = items_api(STORED);
    let guarded = guarded.route_layer(guard.layer(PathParam("key")));
    let methods = [
        http::Method::GET,
        http::Method::HEAD,
        http::Method::POST,
        http::Method::PUT,
        http::Method::PATCH,
        http::Method::DELETE,
        http::Method::OPTIONS,
        http::Method::TRACE,
    ];
    for key in ["present", "absent", false_positive.as_str()] {
        for method in &methods {
            let uri = format!("/items/{key}");
            let before = calls.load(Ordering::SeqCst);
            let expected = answer(&plain, method, &uri).await;
            let got = answer(&guarded, method, &uri).await;
            assert_eq!(got, expected, "{method} {uri}");
            let reached = calls.load(Ordering::SeqCst) > before;
            let refused =
                key == "absent" && (method == http::Method::GET || method == http::Method::HEAD);
            if refused {
                assert!(!reached, "{method} {uri} reached the handler");
            }
            if key == "present" && (method == http::Method::GET || method == http::Method::PUT) {
                assert!(reached, "{method} {uri} did not reach the handler");
            }
        }
    }
    // Only GET and HEAD of the absent key were answered by the guard.
    assert_eq!(guard.stats().rejected, 2);
}

#[tokio::test]
async fn the_checked_methods_can_be_chosen() {
    let guard = warm_guard(&["a"]).await;
    let (app, _) = items_api(&["a"]);
    let methods = crate::service::Methods::READS.with(&http::Method::DELETE);
    let app = app.route_layer(guard.layer(PathParam("key")).methods(methods));
    assert_eq!(
        answer(&app, &http::Method::DELETE, "/items/b").await.0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        answer(&app, &http::Method::DELETE, "/items/a").await.0,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        answer(&app, &http::Method::PUT, "/items/b").await.0,
        StatusCode::CREATED
    );
}

#[tokio::test]
async fn a_path_param_outside_a_router_is_counted_as_unguarded() {
    let guard = warm_guard(&["a"]).await;
    let svc = ServiceBuilder::new()
        .layer(guard.layer(PathParam("key")))
        .service(service_fn(|_req: http::Request<()>| async {
            Ok::<_, Infallible>(http::Response::new(Body::from("inner")))
        }));
    for _ in 0..3 {
        let request = http::Request::get("/items/absent")
            .body(())
            .expect("valid request");
        assert_eq!(
            svc.clone().oneshot(request).await.map(|r| r.status()),
            Ok(StatusCode::OK)
        );
    }
    let stats = guard.stats();
    assert_eq!((stats.unguarded, stats.rejected, stats.passed), (3, 0, 0));
}

#[tokio::test]
async fn typed_keys_find_every_form_of_a_stored_value() {
    let guard = BloomGuard::builder().key_type(crate::KeyType::Uuid).build();
    guard
        .rebuild(&KeyList::new(["550e8400-e29b-41d4-a716-446655440000"]))
        .await
        .expect("build");
    let (app, calls) = counting_app(&guard);
    for form in [
        "550E8400-E29B-41D4-A716-446655440000",
        "550e8400e29b41d4a716446655440000",
        "%7B550e8400-e29b-41d4-a716-446655440000%7D",
    ] {
        assert_eq!(
            get_uri(&app, &format!("/items/{form}")).await.0,
            StatusCode::OK,
            "{form}"
        );
    }
    // Not a UUID: the handler answers it, as it would unguarded.
    assert_eq!(get_uri(&app, "/items/not-a-uuid").await.0, StatusCode::OK);
    assert_eq!(calls.load(Ordering::SeqCst), 4);
    assert_eq!(
        get_uri(&app, "/items/6ba7b810-9dad-11d1-80b4-00c04fd430c8")
            .await
            .0,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn ready_waits_for_the_first_filter() {
    let guard = BloomGuard::builder().build();
    let waiting = tokio::spawn({
        let guard = guard.clone();
        async move { guard.ready().await }
    });
    tokio::task::yield_now().await;
    assert!(!waiting.is_finished());
    guard.rebuild(&KeyList::new(["a"])).await.expect("build");
    waiting.await.expect("ready");
}

/// A guard whose filter misses `stored`'s first key, as if its row had
/// been written with the feed off.
async fn missing_a_key(builder: crate::Builder) -> BloomGuard {
    let guard = builder.build();
    guard
        .rebuild(&KeyList::new(["other"]))
        .await
        .expect("build");
    guard
}

#[tokio::test]
async fn shadow_mode_passes_everything_and_catches_the_false_negative() {
    let guard = missing_a_key(BloomGuard::builder().mode(crate::Mode::Shadow)).await;
    let (app, calls) = items_api(&["present"]);
    let app = app.route_layer(guard.layer(PathParam("key")));
    assert_eq!(
        get_uri(&app, "/items/absent").await.0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(get_uri(&app, "/items/present").await.0, StatusCode::OK);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "shadow mode passes every request"
    );
    let stats = guard.stats();
    assert_eq!(
        (
            stats.shadow_would_reject,
            stats.shadow_false_negatives,
            stats.rejected
        ),
        (2, 1, 0)
    );
    // A filter that missed a key is trusted no more: open until rebuilt.
    assert_eq!(stats.state, crate::stats::GuardState::Degraded);
    assert_eq!(
        guard.feed().rebuild_due(),
        Some("a false negative was seen")
    );
}

#[tokio::test(start_paused = true)]
async fn an_audited_false_negative_fails_open_and_a_rebuild_follows() {
    let guard = missing_a_key(
        BloomGuard::builder()
            .audit_rate(1.0)
            .check_interval(std::time::Duration::from_secs(1)),
    )
    .await;
    let (app, calls) = items_api(&["present"]);
    let app = app.route_layer(guard.layer(PathParam("key")));
    assert_eq!(get_uri(&app, "/items/present").await.0, StatusCode::OK);
    let stats = guard.stats();
    assert_eq!((stats.audited, stats.shadow_false_negatives), (1, 1));
    assert!(guard.may_contain("anything"), "failing open");
    tokio::spawn(guard.clone().maintain(KeyList::new(["present", "other"])));
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let stats = guard.stats();
    assert_eq!(
        (stats.generation, stats.state),
        (2, crate::stats::GuardState::Ready)
    );
    // Audited, an absent key reaches the handler and gets its 404.
    assert_eq!(
        get_uri(&app, "/items/absent").await.0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!(guard.stats().shadow_false_negatives, 1);
}

#[tokio::test]
async fn without_audits_nothing_absent_reaches_the_handler() {
    let guard = missing_a_key(BloomGuard::builder()).await;
    let (app, calls) = items_api(&["present"]);
    let app = app.route_layer(guard.layer(PathParam("key")));
    for _ in 0..100 {
        assert_eq!(
            get_uri(&app, "/items/absent").await.0,
            StatusCode::NOT_FOUND
        );
    }
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    let stats = guard.stats();
    assert_eq!(
        (stats.rejected, stats.audited, stats.shadow_false_negatives),
        (100, 0, 0)
    );
}

#[tokio::test]
async fn off_mode_checks_and_counts_nothing() {
    let guard = warm_guard(&["a"]).await;
    guard
        .set_mode(crate::Mode::Off)
        .await
        .expect("no fleet to fail");
    let (app, calls) = counting_app(&guard);
    assert_eq!(get_uri(&app, "/items/absent").await.0, StatusCode::OK);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    let stats = guard.stats();
    assert_eq!(
        (stats.passed, stats.rejected, stats.mode),
        (0, 0, crate::Mode::Off)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mode_switches_under_load_lose_no_request() {
    let guard = warm_guard(&["present"]).await;
    let (app, _) = items_api(&["present"]);
    let app = app.route_layer(guard.layer(PathParam("key")));
    let switcher = {
        let guard = guard.clone();
        tokio::spawn(async move {
            for i in 0..300 {
                let mode = [crate::Mode::Enforce, crate::Mode::Shadow, crate::Mode::Off][i % 3];
                guard.set_mode(mode).await.expect("no fleet to fail");
                tokio::task::yield_now().await;
            }
        })
    };
    let requests: Vec<_> = (0..400)
        .map(|i| {
            let app = app.clone();
            tokio::spawn(async move {
                let key = if i % 2 == 0 { "present" } else { "absent" };
                (key, get_uri(&app, &format!("/items/{key}")).await.0)
            })
        })
        .collect();
    for request in requests {
        let (key, status) = request.await.expect("request task");
        let expected = if key == "present" {
            StatusCode::OK
        } else {
            StatusCode::NOT_FOUND
        };
        assert_eq!(status, expected, "{key}");
    }
    switcher.await.expect("switcher");
    assert_eq!(guard.stats().shadow_false_negatives, 0);
}

/// A table in memory that counts the statements looking keys up in it;
/// each waits for `gate` if there is one.
#[derive(Clone, Default)]
struct Table {
    rows: Arc<std::sync::Mutex<std::collections::HashSet<Vec<u8>>>>,
    statements: Arc<AtomicUsize>,
    keys_looked_up: Arc<AtomicUsize>,
    gate: Option<Arc<tokio::sync::Semaphore>>,
    fails: Arc<std::sync::atomic::AtomicBool>,
}

impl crate::feed::KeyLookup for Table {
    fn find<'a>(
        &'a self,
        keys: &'a [crate::feed::LookupKey],
    ) -> futures_util::future::BoxFuture<'a, Result<crate::keys::KeyBatch, crate::feed::LookupError>>
    {
        Box::pin(async move {
            self.statements.fetch_add(1, Ordering::SeqCst);
            self.keys_looked_up.fetch_add(keys.len(), Ordering::SeqCst);
            if let Some(gate) = &self.gate {
                gate.acquire()
                    .await
                    .map_err(crate::feed::LookupError::new)?
                    .forget();
            }
            if self.fails.load(Ordering::SeqCst) {
                return Err(crate::feed::LookupError::new("the database is gone"));
            }
            let rows = self.rows.lock().expect("rows");
            let mut found = crate::keys::KeyBatch::default();
            for key in keys.iter().filter(|key| rows.contains(key.text())) {
                found.push(key.text());
            }
            Ok(found)
        })
    }
}

/// An inner service that counts its calls, behind `guard`'s layer.
fn counted(
    guard: &BloomGuard,
) -> (
    impl tower::Service<
            http::Request<()>,
            Response = http::Response<crate::service::ResponseBody<Body>>,
            Error = Infallible,
            Future: Send,
        > + Clone
        + Send
        + 'static,
    Arc<AtomicUsize>,
) {
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&calls);
    let svc = ServiceBuilder::new()
        .layer(guard.layer(PathSegment(1)))
        .service(service_fn(move |_req: http::Request<()>| {
            counter.fetch_add(1, Ordering::SeqCst);
            async { Ok::<_, Infallible>(http::Response::new(Body::from("inner"))) }
        }));
    (svc, calls)
}

/// A guard holding "present" whose refusals wait at most 50 ms.
async fn bounded_guard() -> BloomGuard {
    let guard = BloomGuard::builder()
        .read_barrier_timeout(std::time::Duration::from_millis(50))
        .build();
    guard.clone().warm(KeyList::new(["present"])).await;
    guard
}

fn get_request(uri: &str) -> http::Request<()> {
    http::Request::get(uri).body(()).expect("valid request")
}

#[tokio::test]
async fn a_lookup_in_the_table_confirms_refusals_without_a_feed_read() {
    let guard = warm_guard(&["present"]).await;
    // No feed read ever comes: only the lookup can answer.
    let reader = guard.feed().reader();
    let table = Table::default();
    table.rows.lock().expect("rows").insert(b"late".to_vec());
    reader.look_up_with(table.clone());
    let (svc, calls) = counted(&guard);
    let absent = svc.clone().oneshot(get_request("/items/absent")).await;
    assert_eq!(absent.map(|r| r.status()), Ok(StatusCode::NOT_FOUND));
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    // Committed after the build and in no feed read: the table has it.
    let late = svc.clone().oneshot(get_request("/items/late")).await;
    assert_eq!(late.map(|r| r.status()), Ok(StatusCode::OK));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    // The filter's own answer needs no lookup.
    let present = svc.oneshot(get_request("/items/present")).await;
    assert_eq!(present.map(|r| r.status()), Ok(StatusCode::OK));
    assert_eq!(table.statements.load(Ordering::SeqCst), 2);
    let stats = guard.stats();
    assert_eq!((stats.rejected, stats.barrier_waits), (1, 2));
    drop(reader);
}

#[tokio::test]
async fn refusals_waiting_together_share_one_lookup() {
    let guard = warm_guard(&["present"]).await;
    let reader = guard.feed().reader();
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let table = Table {
        gate: Some(Arc::clone(&gate)),
        ..Table::default()
    };
    table.rows.lock().expect("rows").insert(b"k7".to_vec());
    reader.look_up_with(table.clone());
    let (svc, calls) = counted(&guard);
    // The first refusal's statement runs; 40 more arrive meanwhile.
    let first = tokio::spawn(svc.clone().oneshot(get_request("/items/first")));
    while table.statements.load(Ordering::SeqCst) == 0 {
        tokio::task::yield_now().await;
    }
    let waiting: Vec<_> = (0..40)
        .map(|i| tokio::spawn(svc.clone().oneshot(get_request(&format!("/items/k{i}")))))
        .collect();
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
    gate.add_permits(2);
    let status = |answer: Result<Result<http::Response<_>, Infallible>, _>| {
        answer.expect("the request runs").map(|r| r.status())
    };
    assert_eq!(status(first.await), Ok(StatusCode::NOT_FOUND));
    for (i, answer) in waiting.into_iter().enumerate() {
        let expected = if i == 7 {
            StatusCode::OK
        } else {
            StatusCode::NOT_FOUND
        };
        assert_eq!(status(answer.await), Ok(expected), "k{i}");
    }
    assert_eq!(table.statements.load(Ordering::SeqCst), 2);
    assert_eq!(table.keys_looked_up.load(Ordering::SeqCst), 41);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    drop(reader);
}

#[tokio::test]
async fn a_lookup_that_fails_or_does_not_answer_sends_refusals_on() {
    let guard = bounded_guard().await;
    let reader = guard.feed().reader();
    let table = Table::default();
    table.fails.store(true, Ordering::SeqCst);
    reader.look_up_with(table.clone());
    let (svc, calls) = counted(&guard);
    let failed = svc.clone().oneshot(get_request("/items/absent")).await;
    assert_eq!(failed.map(|r| r.status()), Ok(StatusCode::OK));
    // While lookups fail, refusals go on at once, each driving a retry.
    let started = std::time::Instant::now();
    let again = svc.clone().oneshot(get_request("/items/absent")).await;
    assert_eq!(again.map(|r| r.status()), Ok(StatusCode::OK));
    assert!(started.elapsed() < std::time::Duration::from_millis(50));
    // The database back: the retry clears the failure, refusals resume.
    table.fails.store(false, Ordering::SeqCst);
    let mut refused = false;
    for _ in 0..100 {
        let answer = svc.clone().oneshot(get_request("/items/absent")).await;
        if answer.map(|r| r.status()) == Ok(StatusCode::NOT_FOUND) {
            refused = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    assert!(refused, "lookups never recovered");
    let calls_before = calls.load(Ordering::SeqCst);
    // A statement that never answers: the request goes on at the bound.
    reader.look_up_with(Table {
        gate: Some(Arc::new(tokio::sync::Semaphore::new(0))),
        ..Table::default()
    });
    let silent = svc.oneshot(get_request("/items/absent")).await;
    assert_eq!(silent.map(|r| r.status()), Ok(StatusCode::OK));
    assert_eq!(calls.load(Ordering::SeqCst), calls_before + 1);
    assert_eq!(guard.stats().rejected, 1);
    drop(reader);
}

#[tokio::test]
async fn a_follower_without_a_lookup_keeps_the_feed_read_for_every_refusal() {
    let guard = bounded_guard().await;
    let looking = guard.feed().reader();
    let table = Table::default();
    looking.look_up_with(table.clone());
    // Another follower, of another table, that only reads its feed (and
    // never does here): the table it follows may hold the key.
    let reading = guard.feed().reader();
    let (svc, calls) = counted(&guard);
    let answer = svc.oneshot(get_request("/items/absent")).await;
    assert_eq!(answer.map(|r| r.status()), Ok(StatusCode::OK));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(table.statements.load(Ordering::SeqCst), 0);
    drop((looking, reading));
}
