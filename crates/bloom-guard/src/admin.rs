//! The admin API: an axum router over a guard's stats, rebuilds and
//! metrics (feature `admin`).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures_util::future::BoxFuture;
use metrics_exporter_prometheus::PrometheusHandle;
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::error::BuildError;
use crate::guard::BloomGuard;
use crate::shared::lock;
use crate::source::KeySource;
use crate::stats::Stats;

type RebuildFn = Arc<dyn Fn() -> BoxFuture<'static, Result<Stats, BuildError>> + Send + Sync>;

/// The admin API of a guard, behind a bearer token.
///
/// - `GET /admin/bloom`: [`Stats`] as JSON.
/// - `POST /admin/bloom/rebuild`: runs a rebuild, or joins the one in
///   flight, and answers the new stats. Needs [`rebuild_from`](Self::rebuild_from).
///   A new rebuild is refused with `429` within the
///   [cool-down](Self::cooldown) after the last one.
/// - `GET /metrics`: Prometheus text. Needs [`prometheus`](Self::prometheus).
///
/// Requests without `Authorization: Bearer <token>`, or with any other
/// token, get `401` and learn nothing: tokens are compared as SHA-256
/// digests, so neither their content nor their length shows in the timing.
/// Serve it on an address of its own, never on the public one.
///
/// # Example
///
/// ```
/// use bloom_guard::admin::Admin;
/// use bloom_guard::{BloomGuard, KeyList};
///
/// let guard = BloomGuard::builder().build();
/// let admin: axum::Router = Admin::new(guard, "s3cret")
///     .rebuild_from(KeyList::new(["a", "b"]))
///     .into_router();
/// # drop(admin);
/// ```
pub struct Admin<K> {
    guard: BloomGuard<K>,
    token: Token,
    rebuild: Option<RebuildFn>,
    prometheus: Option<PrometheusHandle>,
    cooldown: Duration,
}

impl<K> std::fmt::Debug for Admin<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admin")
            .field("rebuild", &self.rebuild.is_some())
            .field("prometheus", &self.prometheus.is_some())
            .field("cooldown", &self.cooldown)
            .finish_non_exhaustive()
    }
}

impl<K> Admin<K>
where
    K: Clone + Send + Sync + 'static,
{
    /// The admin API of `guard`, for requests bearing `token`.
    pub fn new(guard: BloomGuard<K>, token: &str) -> Self {
        Self {
            guard,
            token: Token::new(token),
            rebuild: None,
            prometheus: None,
            cooldown: Duration::from_secs(5),
        }
    }

    /// Where `POST /admin/bloom/rebuild` reads the keys.
    #[must_use]
    pub fn rebuild_from<S: KeySource>(mut self, source: S) -> Self {
        let source = Arc::new(source);
        let guard = self.guard.clone();
        self.rebuild = Some(Arc::new(move || {
            let (guard, source) = (guard.clone(), Arc::clone(&source));
            Box::pin(async move { guard.rebuild(&*source).await })
        }));
        self
    }

    /// Serve `GET /metrics` from this Prometheus recorder's handle (the one
    /// installed as the global `metrics` recorder).
    #[must_use]
    pub fn prometheus(mut self, handle: PrometheusHandle) -> Self {
        self.prometheus = Some(handle);
        self
    }

    /// The least time between the end of one rebuild started here and the
    /// start of the next (default 5 s). Calls that join a rebuild in flight
    /// are not limited.
    #[must_use]
    pub fn cooldown(mut self, cooldown: Duration) -> Self {
        self.cooldown = cooldown;
        self
    }

    /// The router.
    pub fn into_router(self) -> Router {
        let state = Arc::new(AdminState {
            guard: self.guard,
            rebuild: self.rebuild,
            prometheus: self.prometheus,
            cooldown: self.cooldown,
            last_rebuild: Mutex::new(None),
        });
        Router::new()
            .route("/admin/bloom", get(stats::<K>))
            .route("/admin/bloom/rebuild", post(rebuild::<K>))
            .route("/metrics", get(prometheus_text::<K>))
            .with_state(state)
            .layer(middleware::from_fn_with_state(
                Arc::new(self.token),
                authorize,
            ))
    }
}

/// The admin API with stats only: `Admin::new(guard, token).into_router()`.
pub fn router<K>(guard: BloomGuard<K>, token: &str) -> Router
where
    K: Clone + Send + Sync + 'static,
{
    Admin::new(guard, token).into_router()
}

struct AdminState<K> {
    guard: BloomGuard<K>,
    rebuild: Option<RebuildFn>,
    prometheus: Option<PrometheusHandle>,
    cooldown: Duration,
    /// When the last rebuild started here finished.
    last_rebuild: Mutex<Option<Instant>>,
}

fn error(status: StatusCode, message: &str) -> Response {
    (status, Json(json!({ "error": message }))).into_response()
}

async fn stats<K>(State(state): State<Arc<AdminState<K>>>) -> Response {
    Json(state.guard.stats()).into_response()
}

async fn rebuild<K>(State(state): State<Arc<AdminState<K>>>) -> Response
where
    K: Send + Sync + 'static,
{
    let Some(rebuild) = &state.rebuild else {
        return error(
            StatusCode::NOT_IMPLEMENTED,
            "no key source is configured for rebuilds",
        );
    };
    {
        // A rebuild in flight is joined whatever the cool-down.
        let in_flight = lock(&state.guard.shared.rebuild_in_flight).is_some();
        let last = *lock(&state.last_rebuild);
        if let Some(finished) = last.filter(|_| !in_flight) {
            let wait = state.cooldown.saturating_sub(finished.elapsed());
            if !wait.is_zero() {
                let retry_after = wait.as_secs().max(1).to_string();
                let mut response =
                    error(StatusCode::TOO_MANY_REQUESTS, "a rebuild ran moments ago");
                if let Ok(value) = retry_after.parse() {
                    response.headers_mut().insert(header::RETRY_AFTER, value);
                }
                return response;
            }
        }
    }
    // On a task of its own: a client hanging up does not cancel the rebuild
    // that others may have joined.
    let outcome = tokio::spawn(rebuild()).await;
    *lock(&state.last_rebuild) = Some(Instant::now());
    match outcome {
        Ok(Ok(stats)) => Json(stats).into_response(),
        Ok(Err(_)) | Err(_) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "the rebuild failed; the filter in use stays (see last_error in GET /admin/bloom)",
        ),
    }
}

async fn prometheus_text<K>(State(state): State<Arc<AdminState<K>>>) -> Response {
    let Some(prometheus) = &state.prometheus else {
        return error(
            StatusCode::NOT_IMPLEMENTED,
            "no Prometheus recorder is configured",
        );
    };
    state.guard.publish_metrics();
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        prometheus.render(),
    )
        .into_response()
}

/// The SHA-256 digest of the expected token.
struct Token([u8; 32]);

impl Token {
    fn new(token: &str) -> Self {
        Self(Sha256::digest(token.as_bytes()).into())
    }

    fn matches(&self, headers: &HeaderMap) -> bool {
        let presented = headers
            .get(header::AUTHORIZATION)
            .and_then(|value| value.as_bytes().strip_prefix(b"Bearer "))
            .unwrap_or_default();
        let digest: [u8; 32] = Sha256::digest(presented).into();
        // Digests of attacker-chosen input: a short-circuiting compare leaks
        // nothing about the token.
        !presented.is_empty() && digest == self.0
    }
}

async fn authorize(State(token): State<Arc<Token>>, request: Request, next: Next) -> Response {
    if token.matches(request.headers()) {
        next.run(request).await
    } else {
        let mut response = error(StatusCode::UNAUTHORIZED, "unauthorized");
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            header::HeaderValue::from_static("Bearer"),
        );
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    async fn status(authorization: Option<&str>) -> StatusCode {
        let app = router(BloomGuard::builder().build(), "s3cret");
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
        let source = crate::rebuild::tests::Counting::new(["a", "b"]);
        let scans = source.scans();
        let app = Admin::new(guard.clone(), "s3cret")
            .rebuild_from(source)
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
        let app = router(BloomGuard::builder().build(), "s3cret");
        let response = app
            .oneshot(request("POST", "/admin/bloom/rebuild"))
            .await
            .expect("infallible");
        assert_eq!(response.status(), StatusCode::NOT_IMPLEMENTED);
    }

    #[tokio::test]
    async fn metrics_are_prometheus_text() {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        let guard = BloomGuard::builder().name("items").build();
        guard
            .rebuild(&crate::KeyList::new(["a"]))
            .await
            .expect("build");
        let app = Admin::new(guard, "s3cret").prometheus(handle).into_router();
        let _local = ::metrics::set_default_local_recorder(&recorder);
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
        let mut samples = 0;
        for line in text.lines().filter(|l| !l.is_empty()) {
            if line.starts_with('#') {
                assert!(
                    line.starts_with("# TYPE ") || line.starts_with("# HELP "),
                    "{line}"
                );
                continue;
            }
            let (series, value) = line.rsplit_once(' ').expect("a sample is `series value`");
            assert!(value.parse::<f64>().is_ok(), "{line}");
            assert!(
                series.starts_with("bloom_guard_") && series.contains(r#"guard="items""#),
                "{line}"
            );
            samples += 1;
        }
        assert!(
            text.contains(r#"bloom_guard_keys{guard="items"} 1"#),
            "{text}"
        );
        assert!(samples >= 12, "{text}");
    }

    #[test]
    fn an_empty_token_never_matches() {
        let token = Token::new("");
        assert!(!token.matches(&HeaderMap::new()));
    }
}
