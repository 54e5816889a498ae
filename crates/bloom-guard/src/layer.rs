//! The tower `Layer` that binds a guard to where the key is.

use tower_layer::Layer;

use crate::guard::BloomGuard;
use crate::methods::Methods;
use crate::service::BloomGuardService;

/// Guards the routes it wraps with a [`BloomGuard`], reading each
/// request's key with `K`. Made by [`BloomGuard::layer`].
///
/// One guard can make any number of layers, for several routes and
/// extractors; they share its filter and its counters. The layer works for
/// any tower service and response body (the guard's answers come as a
/// [`ResponseBody`](crate::ResponseBody) around the inner body).
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
pub struct GuardLayer<K> {
    pub(crate) guard: BloomGuard,
    pub(crate) extractor: K,
    pub(crate) methods: Methods,
}

impl<K> GuardLayer<K> {
    /// The methods whose requests are checked (default
    /// [`Methods::READS`]: `GET` and `HEAD`); every other request reaches
    /// the inner service untouched.
    #[must_use]
    pub fn methods(mut self, methods: Methods) -> Self {
        self.methods = methods;
        self
    }
}

impl<S, K: Clone> Layer<S> for GuardLayer<K> {
    type Service = BloomGuardService<S, K>;

    fn layer(&self, inner: S) -> Self::Service {
        BloomGuardService::new(inner, self.clone())
    }
}
