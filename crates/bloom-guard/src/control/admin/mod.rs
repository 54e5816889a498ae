//! The admin API: an axum router over the guards' stats, rebuilds and
//! metrics (feature `admin`).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use futures_util::future::BoxFuture;
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::error::BuildError;
use crate::handle::guard::BloomGuard;
use crate::lifecycle::source::KeySource;
use crate::lock::lock;
use crate::report::stats::Stats;

mod settings;

use settings::{fleet, reset, set_mode};

/// Renders the installed recorder's metrics as Prometheus text.
type RenderFn = Arc<dyn Fn() -> String + Send + Sync>;

type RebuildFn = Arc<dyn Fn() -> BoxFuture<'static, Result<Stats, BuildError>> + Send + Sync>;

/// The admin API of an application's guards, behind a bearer token.
///
/// - `GET /admin/bloom`: `{"guards": {"<name>": <stats>, ...}}`.
/// - `GET /admin/bloom/{guard}`: that guard's [`Stats`] as JSON.
/// - `POST /admin/bloom/{guard}/rebuild`: runs a rebuild, or joins the one
///   in flight, and answers the new stats. Needs a key source
///   ([`guard_with_source`](Self::guard_with_source)). A new rebuild is
///   refused with `429` within the [cool-down](Self::cooldown) after the
///   guard's last one.
/// - `POST /admin/bloom/rebuild`: the same for every guard with a source,
///   one after the other; answers as `GET /admin/bloom`.
/// - `PUT /admin/bloom/{guard}/mode` with `{"mode": "enforce" | "shadow" |
///   "off"}`, `{"audit_rate": 0.001}` or both: switches the guard's
///   [`Mode`](crate::Mode) or audit rate on every instance of its fleet
///   ([`BloomGuard::set_settings`]; `503` if the fleet's database cannot
///   be reached, and nothing changed); with `"scope": "instance"`, on
///   this instance only ([`BloomGuard::override_settings`]). Answers the
///   stats, whose `mode_set_by` and `audit_rate_set_by` say which is in
///   force.
/// - `DELETE /admin/bloom/{guard}/mode?scope=instance`: drops this
///   instance's overrides; `?scope=fleet`: forgets the fleet's settings
///   ([`BloomGuard::reset_settings`]), every instance back to its
///   builder's.
/// - `GET /admin/bloom/{guard}/fleet`: `{"instances": [...]}`, the
///   [`Instance`](crate::fleet::Instance)s of the guard's fleet heard from in the
///   last 30 s ([`BloomGuard::fleet`]).
/// - `GET /metrics`: the Prometheus text of the application's recorder
///   (see [`metrics`](Self::metrics)); the guards record their figures
///   there as they happen (feature `metrics`), one `guard` label per guard.
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
/// let items = BloomGuard::builder().name("items").build();
/// let users = BloomGuard::builder().name("users").build();
/// let admin: axum::Router = Admin::new("s3cret")
///     .guard_with_source(items, KeyList::new(["a", "b"]))
///     .guard(users)
///     .into_router();
/// # drop(admin);
/// ```
pub struct Admin {
    token: Token,
    guards: Vec<AdminGuard>,
    metrics: Option<RenderFn>,
    cooldown: Duration,
}

impl std::fmt::Debug for Admin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<_> = self.guards.iter().map(|g| g.guard.name()).collect();
        f.debug_struct("Admin")
            .field("guards", &names)
            .field("metrics", &self.metrics.is_some())
            .field("cooldown", &self.cooldown)
            .finish_non_exhaustive()
    }
}

impl Admin {
    /// An admin API for requests bearing `token`; add the guards.
    pub fn new(token: &str) -> Self {
        Self {
            token: Token::new(token),
            guards: Vec::new(),
            metrics: None,
            cooldown: Duration::from_secs(5),
        }
    }

    /// Serves `guard`'s stats (and metrics), under its
    /// [name](crate::Builder::name).
    #[must_use]
    pub fn guard(mut self, guard: BloomGuard) -> Self {
        self.guards.push(AdminGuard {
            guard,
            rebuild: None,
            last_rebuild: Mutex::new(None),
        });
        self
    }

    /// As [`guard`](Self::guard), with rebuilds reading the keys from
    /// `source`.
    #[must_use]
    pub fn guard_with_source<S: KeySource>(mut self, guard: BloomGuard, source: S) -> Self {
        let source = Arc::new(source);
        let rebuilding = guard.clone();
        let rebuild: RebuildFn = Arc::new(move || {
            let (guard, source) = (rebuilding.clone(), Arc::clone(&source));
            Box::pin(async move { guard.rebuild(&*source).await })
        });
        self.guards.push(AdminGuard {
            guard,
            rebuild: Some(rebuild),
            last_rebuild: Mutex::new(None),
        });
        self
    }

    /// As [`guard`](Self::guard), with rebuilds run by `rebuild`: for
    /// rebuilds that are more than a scan, such as
    /// `bloom_guard_sqlx::FleetRebuild`, which scans once for every
    /// instance and publishes the result.
    #[must_use]
    pub fn guard_with_rebuild<F, Fut>(mut self, guard: BloomGuard, rebuild: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<Stats, BuildError>> + Send + 'static,
    {
        let rebuild: RebuildFn = Arc::new(move || Box::pin(rebuild()));
        self.guards.push(AdminGuard {
            guard,
            rebuild: Some(rebuild),
            last_rebuild: Mutex::new(None),
        });
        self
    }

    /// Serves `GET /metrics` with the text `render` returns: the
    /// application's Prometheus recorder, such as
    /// `metrics-exporter-prometheus`'s `PrometheusHandle::render`. Without
    /// it, `/metrics` answers `501`.
    ///
    /// Install the recorder before building the guards: a guard registers
    /// its metrics when it is built.
    ///
    /// ```
    /// use bloom_guard::admin::Admin;
    /// use bloom_guard::BloomGuard;
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let handle = metrics_exporter_prometheus::PrometheusBuilder::new().install_recorder()?;
    /// let guard = BloomGuard::builder().name("items").build(); // after the recorder
    /// let admin = Admin::new("s3cret").guard(guard).metrics(move || handle.render());
    /// # let _: axum::Router = admin.into_router();
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn metrics(mut self, render: impl Fn() -> String + Send + Sync + 'static) -> Self {
        self.metrics = Some(Arc::new(render));
        self
    }

    /// The least time between the end of one rebuild started here and the
    /// start of the guard's next (default 5 s). Calls that join a rebuild in
    /// flight are not limited.
    #[must_use]
    pub fn cooldown(mut self, cooldown: Duration) -> Self {
        self.cooldown = cooldown;
        self
    }

    /// The router.
    pub fn into_router(self) -> Router {
        let state = Arc::new(AdminState {
            guards: self.guards,
            metrics: self.metrics,
            cooldown: self.cooldown,
        });
        Router::new()
            .route("/admin/bloom", get(all_stats))
            .route("/admin/bloom/rebuild", post(rebuild_all))
            .route("/admin/bloom/{guard}", get(stats))
            .route("/admin/bloom/{guard}/rebuild", post(rebuild))
            .route("/admin/bloom/{guard}/mode", put(set_mode).delete(reset))
            .route("/admin/bloom/{guard}/fleet", get(fleet))
            .route("/metrics", get(prometheus_text))
            .with_state(state)
            .layer(middleware::from_fn_with_state(
                Arc::new(self.token),
                authorize,
            ))
    }
}

/// A guard as the admin API serves it.
struct AdminGuard {
    guard: BloomGuard,
    rebuild: Option<RebuildFn>,
    /// When the last rebuild started here finished.
    last_rebuild: Mutex<Option<Instant>>,
}

struct AdminState {
    guards: Vec<AdminGuard>,
    metrics: Option<RenderFn>,
    cooldown: Duration,
}

impl AdminState {
    fn find(&self, name: &str) -> Option<&AdminGuard> {
        self.guards.iter().find(|g| g.guard.name() == name)
    }

    fn all_stats(&self) -> Response {
        let guards: serde_json::Map<String, serde_json::Value> = self
            .guards
            .iter()
            .map(|g| {
                let stats = serde_json::to_value(g.guard.stats()).unwrap_or_default();
                (g.guard.name().to_owned(), stats)
            })
            .collect();
        Json(json!({ "guards": guards })).into_response()
    }
}

fn error(status: StatusCode, message: &str) -> Response {
    (status, Json(json!({ "error": message }))).into_response()
}

async fn all_stats(State(state): State<Arc<AdminState>>) -> Response {
    state.all_stats()
}

fn no_such_guard() -> Response {
    error(StatusCode::NOT_FOUND, "no such guard")
}

async fn stats(State(state): State<Arc<AdminState>>, Path(name): Path<String>) -> Response {
    match state.find(&name) {
        Some(admin) => Json(admin.guard.stats()).into_response(),
        None => no_such_guard(),
    }
}

async fn rebuild(State(state): State<Arc<AdminState>>, Path(name): Path<String>) -> Response {
    let Some(admin) = state.find(&name) else {
        return no_such_guard();
    };
    match run_rebuild(admin, state.cooldown).await {
        Ok(stats) => Json(stats).into_response(),
        Err(response) => *response,
    }
}

async fn rebuild_all(State(state): State<Arc<AdminState>>) -> Response {
    for admin in state.guards.iter().filter(|g| g.rebuild.is_some()) {
        if let Err(response) = run_rebuild(admin, state.cooldown).await {
            return *response;
        }
    }
    state.all_stats()
}

/// Runs (or joins) one rebuild of `admin`'s guard, within the cool-down.
async fn run_rebuild(admin: &AdminGuard, cooldown: Duration) -> Result<Stats, Box<Response>> {
    let Some(rebuild) = &admin.rebuild else {
        return Err(Box::new(error(
            StatusCode::NOT_IMPLEMENTED,
            "no key source is configured for this guard's rebuilds",
        )));
    };
    // A rebuild in flight is joined whatever the cool-down.
    let in_flight = admin.guard.shared.builds.rebuilding();
    let last = *lock(&admin.last_rebuild);
    if let Some(finished) = last.filter(|_| !in_flight) {
        let wait = cooldown.saturating_sub(finished.elapsed());
        if !wait.is_zero() {
            let mut response = error(StatusCode::TOO_MANY_REQUESTS, "a rebuild ran moments ago");
            if let Ok(value) = wait.as_secs().max(1).to_string().parse() {
                response.headers_mut().insert(header::RETRY_AFTER, value);
            }
            return Err(Box::new(response));
        }
    }
    // On a task of its own: a client hanging up does not cancel the rebuild
    // that others may have joined.
    let outcome = tokio::spawn(rebuild()).await;
    *lock(&admin.last_rebuild) = Some(Instant::now());
    match outcome {
        Ok(Ok(stats)) => Ok(stats),
        Ok(Err(_)) | Err(_) => Err(Box::new(error(
            StatusCode::SERVICE_UNAVAILABLE,
            "the rebuild failed; the filter in use stays (see last_error in GET /admin/bloom)",
        ))),
    }
}

async fn prometheus_text(State(state): State<Arc<AdminState>>) -> Response {
    let Some(render) = &state.metrics else {
        return error(
            StatusCode::NOT_IMPLEMENTED,
            "no Prometheus recorder is configured",
        );
    };
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        render(),
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
mod tests;
