//! The admin API: an axum router over a guard's stats.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use sha2::{Digest, Sha256};

use crate::guard::BloomGuard;

/// The admin API of a guard, behind a bearer token.
///
/// - `GET /admin/bloom`: [`Stats`](crate::Stats) as JSON.
///
/// Requests without `Authorization: Bearer <token>`, or with any other
/// token, get `401` and learn nothing: tokens are compared as SHA-256
/// digests, so neither their content nor their length shows in the timing.
/// Serve it on an address of its own, never on the public one.
///
/// # Example
///
/// ```
/// use bloom_guard::{admin, BloomGuard};
///
/// let guard = BloomGuard::builder().build();
/// let admin_app: axum::Router = admin::router(guard, "s3cret");
/// # drop(admin_app);
/// ```
pub fn router<K>(guard: BloomGuard<K>, token: &str) -> Router
where
    K: Clone + Send + Sync + 'static,
{
    let token = Arc::new(Token::new(token));
    Router::new()
        .route("/admin/bloom", get(stats::<K>))
        .with_state(guard)
        .layer(middleware::from_fn_with_state(token, authorize))
}

async fn stats<K>(State(guard): State<BloomGuard<K>>) -> Response {
    Json(guard.stats()).into_response()
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
        (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            Json(serde_json::json!({ "error": "unauthorized" })),
        )
            .into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
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

    #[test]
    fn an_empty_token_never_matches() {
        let token = Token::new("");
        assert!(!token.matches(&HeaderMap::new()));
    }
}
