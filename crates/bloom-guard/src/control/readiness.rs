//! A readiness handler for the application's own router (feature `axum`):
//! `200` once every guard protects, `503` naming the guards that do not.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, MethodRouter};

use crate::handle::guard::BloomGuard;

/// A `GET` route for the application's readiness probe: `200 ready` once
/// every one of `guards` protects (its first filter holds every key within
/// its rate bound), `503` with a line per guard that does not, and why,
/// before. Once ready it stays ready: a later degradation fails the guard
/// open and shows in its stats and metrics, not here (taking instances out
/// of rotation for a database blip would turn one fault into an outage).
///
/// # Example
///
/// ```
/// use axum::{routing::get, Router};
/// use bloom_guard::{readiness, BloomGuard, extract::PathParam};
///
/// let items = BloomGuard::builder().name("items").build();
/// let users = BloomGuard::builder().name("users").build();
/// let app: Router = Router::new()
///     .route("/items/{key}", get(|| async { "an item" }))
///     .route_layer(items.layer(PathParam("key")))
///     .route("/readyz", readiness([items, users]));
/// # drop(app);
/// ```
pub fn readiness<S>(guards: impl IntoIterator<Item = BloomGuard>) -> MethodRouter<S>
where
    S: Clone + Send + Sync + 'static,
{
    let guards: Vec<BloomGuard> = guards.into_iter().collect();
    get(move || {
        let guards = guards.clone();
        async move { answer(&guards) }
    })
}

fn answer(guards: &[BloomGuard]) -> Response {
    let waiting: Vec<String> = guards
        .iter()
        .filter(|guard| !guard.is_ready())
        .map(|guard| {
            let stats = guard.stats();
            let why = stats.reason.unwrap_or_else(|| "warming".to_owned());
            format!("{}: {why}", guard.name())
        })
        .collect();
    if waiting.is_empty() {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, waiting.join("\n") + "\n").into_response()
    }
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::Router;
    use http::Request;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    use super::*;
    use crate::lifecycle::source::KeyList;

    async fn probe(app: &Router) -> (StatusCode, String) {
        let request = Request::get("/readyz")
            .body(Body::empty())
            .expect("a request");
        let response = app.clone().oneshot(request).await.expect("infallible");
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    #[tokio::test]
    async fn ready_once_every_guard_protects() {
        let items = BloomGuard::builder().name("items").build();
        let users = BloomGuard::builder().name("users").build();
        let app = Router::new().route("/readyz", readiness([items.clone(), users.clone()]));
        let (status, body) = probe(&app).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(
            body.contains("items: ") && body.contains("users: "),
            "{body}"
        );
        items.rebuild(&KeyList::new(["a"])).await.expect("build");
        let (status, body) = probe(&app).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(
            !body.contains("items") && body.contains("users: "),
            "{body}"
        );
        users.rebuild(&KeyList::new(["b"])).await.expect("build");
        assert_eq!(probe(&app).await, (StatusCode::OK, "ready\n".to_owned()));
    }
}
