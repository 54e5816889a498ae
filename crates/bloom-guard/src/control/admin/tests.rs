//! Tests of `admin/mod.rs`.

use super::*;
use axum::body::Body;
use http_body_util::BodyExt;
use tower::ServiceExt;

async fn status(authorization: Option<&str>) -> StatusCode {
    let app = Admin::new("s3cret")
        .guard(BloomGuard::builder().build())
        .into_router();
    let mut request = Request::builder().uri("/admin/bloom");
    if let Some(value) = authorization {
        request = request.header(header::AUTHORIZATION, value);
    }
    let request = request.body(Body::empty()).expect("valid request");
    app.oneshot(request).await.expect("infallible").status()
}

#[tokio::test]
async fn only_the_exact_token_gets_in() {
    assert_eq!(status(None).await, StatusCode::UNAUTHORIZED);
    assert_eq!(status(Some("Bearer wrong")).await, StatusCode::UNAUTHORIZED);
    assert_eq!(status(Some("Bearer s3cre")).await, StatusCode::UNAUTHORIZED);
    assert_eq!(
        status(Some("Bearer s3cret2")).await,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(status(Some("Bearer ")).await, StatusCode::UNAUTHORIZED);
    assert_eq!(status(Some("s3cret")).await, StatusCode::UNAUTHORIZED);
    assert_eq!(status(Some("Bearer s3cret")).await, StatusCode::OK);
}

fn request(method: &str, uri: &str) -> Request<Body> {
    Request::builder()
        .method(method)
        .uri(uri)
        .header(header::AUTHORIZATION, "Bearer s3cret")
        .body(Body::empty())
        .expect("valid request")
}

#[tokio::test]
async fn concurrent_rebuild_calls_share_one_scan_then_cool_down() {
    let guard = BloomGuard::builder().build();
    let source = crate::lifecycle::rebuild::tests::Counting::new(["a", "b"]);
    let scans = source.scans();
    let app = Admin::new("s3cret")
        .guard_with_source(guard.clone(), source)
        .into_router();
    let calls = (0..10).map(|_| app.clone().oneshot(request("POST", "/admin/bloom/rebuild")));
    for response in futures_util::future::join_all(calls).await {
        assert_eq!(response.expect("infallible").status(), StatusCode::OK);
    }
    assert_eq!(scans.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert_eq!(guard.stats().generation, 1);

    let again = app
        .oneshot(request("POST", "/admin/bloom/rebuild"))
        .await
        .expect("infallible");
    assert_eq!(again.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(again.headers().contains_key(header::RETRY_AFTER));
}

#[tokio::test]
async fn rebuild_without_a_source_is_not_implemented() {
    let app = Admin::new("s3cret")
        .guard(BloomGuard::builder().build())
        .into_router();
    let response = app
        .oneshot(request("POST", "/admin/bloom/default/rebuild"))
        .await
        .expect("infallible");
    assert_eq!(response.status(), StatusCode::NOT_IMPLEMENTED);
}

pub(super) async fn json(app: &Router, method: &str, uri: &str) -> (StatusCode, serde_json::Value) {
    let response = app
        .clone()
        .oneshot(request(method, uri))
        .await
        .expect("infallible");
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    (status, serde_json::from_slice(&body).expect("json"))
}

#[tokio::test]
async fn every_guard_has_its_stats_and_rebuild() {
    let items = BloomGuard::builder().name("items").build();
    let users = BloomGuard::builder().name("users").build();
    let app = Admin::new("s3cret")
        .guard_with_source(items.clone(), crate::KeyList::new(["a", "b"]))
        .guard_with_source(users.clone(), crate::KeyList::new(["u"]))
        .cooldown(Duration::ZERO)
        .into_router();
    let (status, all) = json(&app, "GET", "/admin/bloom").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(all["guards"]["items"]["state"], "warming");
    assert_eq!(all["guards"]["users"]["generation"], 0);

    let (status, stats) = json(&app, "POST", "/admin/bloom/users/rebuild").await;
    assert_eq!((status, stats["keys"].as_u64()), (StatusCode::OK, Some(1)));
    assert_eq!((items.stats().generation, users.stats().generation), (0, 1));
    let (_, stats) = json(&app, "GET", "/admin/bloom/users").await;
    assert_eq!(stats["state"], "ready");

    let (status, all) = json(&app, "POST", "/admin/bloom/rebuild").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(all["guards"]["items"]["keys"], 2);
    assert_eq!(users.stats().generation, 2);

    let (status, _) = json(&app, "GET", "/admin/bloom/nobody").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[cfg(feature = "metrics")]
#[tokio::test]
async fn metrics_are_recorded_as_they_happen_and_rendered_as_prometheus_text() {
    use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
    let recorder = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Prefix("bloom_guard_".into()),
            crate::metrics::DURATION_BUCKETS,
        )
        .expect("buckets")
        .build_recorder();
    let handle = recorder.handle();
    // The recorder is in place before the guard registers its handles.
    let _local = ::metrics::set_default_local_recorder(&recorder);
    let guard = BloomGuard::builder().name("items").build();
    guard
        .rebuild(&crate::KeyList::new(["a"]))
        .await
        .expect("build");
    let inner = tower::service_fn(|_: Request| async {
        Ok::<_, std::convert::Infallible>(Response::new(Body::empty()))
    });
    let guarded = tower::Layer::layer(&guard.layer(crate::extract::PathSegment(0)), inner);
    for key in ["/a", "/zz-absent", "/yy-absent"] {
        let request = Request::builder()
            .uri(key)
            .body(Body::empty())
            .expect("request");
        guarded.clone().oneshot(request).await.expect("infallible");
    }
    guard
        .feed()
        .record_read(crate::stats::FeedStatus::new("1", 3));
    guard
        .feed()
        .record_read(crate::stats::FeedStatus::new("2", 5).with_reads(2, 1));

    let app = Admin::new("s3cret")
        .guard(guard)
        .metrics(move || handle.render())
        .into_router();
    let response = app
        .oneshot(request("GET", "/metrics"))
        .await
        .expect("infallible");
    assert_eq!(response.status(), StatusCode::OK);
    let text = String::from_utf8(
        response
            .into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes()
            .to_vec(),
    )
    .expect("utf-8");
    for line in text
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let (series, value) = line.rsplit_once(' ').expect("a sample is `series value`");
        assert!(value.parse::<f64>().is_ok(), "{line}");
        assert!(
            series.starts_with("bloom_guard_") && series.contains(r#"guard="items""#),
            "{line}"
        );
    }
    for expected in [
        r#"bloom_guard_passed_total{guard="items"} 1"#,
        r#"bloom_guard_rejected_total{guard="items"} 2"#,
        r#"bloom_guard_keys{guard="items"} 1"#,
        r#"bloom_guard_ready{guard="items"} 1"#,
        r#"bloom_guard_generation{guard="items"} 1"#,
        r#"bloom_guard_feed_changes_total{guard="items"} 5"#,
        r#"bloom_guard_feed_reads_total{guard="items"} 2"#,
        r#"bloom_guard_feed_shared_reads_total{guard="items"} 1"#,
        r#"bloom_guard_builds_total{guard="items",source="scan"} 1"#,
        r#"bloom_guard_mode{guard="items",mode="enforce"} 1"#,
        r#"bloom_guard_mode{guard="items",mode="shadow"} 0"#,
        r#"bloom_guard_build_duration_seconds_bucket{guard="items",source="scan",le="+Inf"} 1"#,
        "# HELP bloom_guard_rejected_total Requests the guard answered itself",
        "# TYPE bloom_guard_build_duration_seconds histogram",
    ] {
        assert!(text.contains(expected), "{expected} missing from\n{text}");
    }
}

#[tokio::test]
async fn metrics_without_a_recorder_answer_501() {
    let app = Admin::new("s3cret")
        .guard(BloomGuard::builder().build())
        .into_router();
    let response = app
        .oneshot(request("GET", "/metrics"))
        .await
        .expect("infallible");
    assert_eq!(response.status(), StatusCode::NOT_IMPLEMENTED);
}

#[test]
fn an_empty_token_never_matches() {
    let token = Token::new("");
    assert!(!token.matches(&HeaderMap::new()));
}
