//! The tower `Layer` that binds a guard to where the key is.

use std::sync::Arc;

use tower_layer::Layer;

use crate::handle::guard::BloomGuard;
use crate::handle::shared::Shared;
use crate::request::methods::Methods;
use crate::request::service::BloomGuardService;

/// Guards the routes it wraps with a [`BloomGuard`], reading each
/// request's key with `K`. Made by [`BloomGuard::layer`].
///
/// One guard can make any number of layers, for several routes and
/// extractors; they share its filter and its counters. The layer works for
/// any tower service and response body (the guard's answers come as a
/// [`ResponseBody`](crate::service::ResponseBody) around the inner body).
///
/// # Example
///
/// A plain tower stack with a boxed response body, a closure extractor, and
/// the guard kept in the application's state:
///
/// ```
/// use std::convert::Infallible;
///
/// use bloom_guard::{BloomGuard, KeyList};
/// use bytes::Bytes;
/// use http::{Request, Response, StatusCode};
/// use http_body_util::{combinators::UnsyncBoxBody, BodyExt, Full};
/// use tower::{service_fn, Layer, ServiceExt};
///
/// type BoxBody = UnsyncBoxBody<Bytes, Infallible>;
///
/// #[derive(Clone)]
/// struct AppState {
///     users: BloomGuard, // one type for every guard, whatever its extractor
/// }
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let state = AppState { users: BloomGuard::builder().name("users").build() };
/// state.users.rebuild(&KeyList::new(["alice"])).await.expect("build");
///
/// let handler = service_fn(|_req: Request<()>| async {
///     Ok::<_, Infallible>(Response::new(Full::new(Bytes::from("a user")).boxed_unsync()))
/// });
/// let by_header = state.users.layer(|req: &Request<()>| {
///     req.headers().get("x-user")?.to_str().ok().map(str::to_owned)
/// });
/// let app = by_header.layer(handler);
///
/// let absent = Request::get("/").header("x-user", "mallory").body(()).expect("request");
/// let response = app.clone().oneshot(absent).await.expect("infallible");
/// assert_eq!(response.status(), StatusCode::NOT_FOUND);
/// let present = Request::get("/").header("x-user", "alice").body(()).expect("request");
/// let body = app.oneshot(present).await.expect("infallible").into_body();
/// assert_eq!(body.collect().await.expect("body").to_bytes(), "a user");
/// # let _: Option<BoxBody> = None;
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct BloomGuardLayer<K> {
    shared: Arc<Shared>,
    extractor: K,
    methods: Methods,
}

impl BloomGuard {
    /// A tower [`Layer`](tower_layer::Layer) that guards the routes it wraps with this guard,
    /// reading each request's key with `extractor` (a [`PathParam`](crate::extract::PathParam),
    /// [`PathSegment`](crate::extract::PathSegment), [`QueryParam`](crate::extract::QueryParam),
    /// [`Header`](crate::extract::Header), or a closure). Only `GET` and `HEAD` are
    /// checked unless [`BloomGuardLayer::methods`] says otherwise. Use it with
    /// `route_layer`, so unknown routes keep their normal 404.
    ///
    /// # Example
    ///
    /// ```
    /// use axum::{routing::get, Router};
    /// use bloom_guard::{BloomGuard, extract::{PathParam, QueryParam}};
    ///
    /// let users = BloomGuard::builder().name("users").build();
    /// let app: Router = Router::new()
    ///     .route("/users/{id}", get(|| async { "a user" }))
    ///     .route_layer(users.layer(PathParam("id")))
    ///     .route("/profile", get(|| async { "a profile" }))
    ///     .route_layer(users.layer(QueryParam("user")));
    /// ```
    pub fn layer<K>(&self, extractor: K) -> BloomGuardLayer<K> {
        BloomGuardLayer {
            shared: Arc::clone(&self.shared),
            extractor,
            methods: Methods::READS,
        }
    }
}

impl<K> BloomGuardLayer<K> {
    /// The methods whose requests are checked (default
    /// [`Methods::READS`]: `GET` and `HEAD`); every other request reaches
    /// the inner service untouched.
    #[must_use]
    pub fn methods(mut self, methods: Methods) -> Self {
        self.methods = methods;
        self
    }
}

impl<S, K: Clone> Layer<S> for BloomGuardLayer<K> {
    type Service = BloomGuardService<S, K>;

    fn layer(&self, inner: S) -> Self::Service {
        BloomGuardService::new(inner, self.clone())
    }
}

impl<S, K> BloomGuardService<S, K> {
    /// Guards `inner` as `layer` says.
    pub fn new(inner: S, layer: BloomGuardLayer<K>) -> Self {
        Self::from_parts(inner, layer.shared, layer.extractor, layer.methods)
    }
}
