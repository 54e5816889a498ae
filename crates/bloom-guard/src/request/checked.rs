//! The guard as an axum extractor, checking the key where the handler
//! reads it (feature `axum`).

use std::sync::atomic::{AtomicBool, Ordering};

use axum::extract::{FromRequestParts, Path, Query};
use axum::response::{IntoResponse, Response};
use http::request::Parts;

use crate::handle::guard::BloomGuard;
use crate::keys::key::{Key, KeyError};
use crate::request::response::CannedResponse;
use crate::request::verdict::{self, Verdict};

/// An axum extractor `T` (such as `Path<String>`) whose value is checked
/// against the guard: the handler runs only if the key may exist.
///
/// # Why an extractor
///
/// A [`layer`](BloomGuard::layer) answers before any extractor of the
/// handler runs. If the handler could answer first (an auth extractor's
/// 401, a rate limit's 429, a validation's 400), the layer changes that
/// answer into the guard's 404, and the difference tells anyone without a
/// token which keys are the filter's false positives. `Checked` answers
/// "absent" at its place in the handler's argument list, so the extractors
/// before it keep their answers. Use it on every route whose handler can
/// answer before reading the key; the layer suits routes without early
/// answers.
///
/// # Wiring
///
/// The guard comes from the request's extensions: add it to the route
/// with `axum::Extension(guard)` as a layer. Without it, requests pass
/// unchecked and the first is logged at error level.
///
/// The key is the value `T` yields, so it is read exactly as the handler
/// reads it: `Path<String>`, `Path<i64>`, `Path<Uuid>`, or any `T` whose
/// value implements [`AsKey`]. Shadow mode and audits count would-be
/// rejections and pass them on; only the layer sees the handler's answer
/// to report false negatives.
///
/// # Example
///
/// ```
/// use axum::extract::{FromRequestParts, Path};
/// use axum::http::{request::Parts, StatusCode};
/// use axum::{routing::get, Extension, Router};
/// use bloom_guard::{BloomGuard, extract::Checked};
///
/// /// Answers 401 without a bearer token, before the key is read.
/// struct Auth;
///
/// impl<S: Send + Sync> FromRequestParts<S> for Auth {
///     type Rejection = StatusCode;
///     async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, StatusCode> {
///         parts.headers.get("authorization").map(|_| Auth).ok_or(StatusCode::UNAUTHORIZED)
///     }
/// }
///
/// async fn profile(_: Auth, Checked(Path(username)): Checked<Path<String>>) -> String {
///     format!("the profile of {username}")
/// }
///
/// let profiles = BloomGuard::builder().name("profiles").build();
/// let app: Router = Router::new()
///     .route("/profiles/{username}", get(profile).layer(Extension(profiles)));
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct Checked<T>(pub T);

/// A value that names a key: what [`Checked`] looks up.
///
/// Implemented for the values axum's extractors yield for keys (`String`,
/// integers, `Uuid`) and for `Path<T>` and `Query<T>` of those. Implement
/// it for a query struct to name its key field.
///
/// # Example
///
/// ```
/// use bloom_guard::{extract::AsKey, keys::{Key, KeyError}};
///
/// // The query `?id=...`, read with `Checked<Query<Lookup>>`.
/// struct Lookup {
///     id: String,
/// }
///
/// impl AsKey for Lookup {
///     fn as_key(&self) -> Result<Key<'_>, KeyError> {
///         Ok(Key::from(&self.id))
///     }
/// }
/// ```
pub trait AsKey {
    /// The key the value names.
    ///
    /// # Errors
    ///
    /// A [`KeyError`] when the value names no key the guard can check;
    /// the request then passes unchecked.
    fn as_key(&self) -> Result<Key<'_>, KeyError>;
}

impl AsKey for String {
    fn as_key(&self) -> Result<Key<'_>, KeyError> {
        Ok(Key::from(self))
    }
}

impl AsKey for uuid::Uuid {
    fn as_key(&self) -> Result<Key<'_>, KeyError> {
        Ok(Key::from(self.hyphenated().to_string()))
    }
}

macro_rules! integer_keys {
    ($($int:ty),*) => {$(
        impl AsKey for $int {
            fn as_key(&self) -> Result<Key<'_>, KeyError> {
                Ok(Key::from(self.to_string()))
            }
        }
    )*};
}

integer_keys!(i16, i32, i64, u16, u32, u64);

impl<T: AsKey> AsKey for Path<T> {
    fn as_key(&self) -> Result<Key<'_>, KeyError> {
        self.0.as_key()
    }
}

impl<T: AsKey> AsKey for Query<T> {
    fn as_key(&self) -> Result<Key<'_>, KeyError> {
        self.0.as_key()
    }
}

/// Why [`Checked`] answered instead of the handler.
#[derive(Debug)]
pub enum CheckedRejection<R> {
    /// The wrapped extractor's own rejection, as it would answer unguarded.
    Inner(R),
    /// The guard's answer: the key is absent (or refused, with
    /// [`refuse_long_keys`](crate::Builder::refuse_long_keys)).
    Guard(Response),
}

impl<R: IntoResponse> IntoResponse for CheckedRejection<R> {
    fn into_response(self) -> Response {
        match self {
            CheckedRejection::Inner(rejection) => rejection.into_response(),
            CheckedRejection::Guard(response) => response,
        }
    }
}

/// Whether a `Checked` without a guard in the extensions was logged.
static WARNED_UNWIRED: AtomicBool = AtomicBool::new(false);

impl<S, T> FromRequestParts<S> for Checked<T>
where
    S: Send + Sync,
    T: FromRequestParts<S> + AsKey + Send,
{
    type Rejection = CheckedRejection<T::Rejection>;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let value = T::from_request_parts(parts, state)
            .await
            .map_err(CheckedRejection::Inner)?;
        let Some(guard) = parts.extensions.get::<BloomGuard>() else {
            if !WARNED_UNWIRED.swap(true, Ordering::Relaxed) {
                tracing::error!(
                    "Checked found no BloomGuard in the request's extensions: add axum::Extension(guard) to the route; requests pass unchecked"
                );
            }
            return Ok(Checked(value));
        };
        let answer = match verdict::decide(&guard.shared, || value.as_key().map(Some)) {
            Verdict::Pass | Verdict::Audit(_) => return Ok(Checked(value)),
            Verdict::Reject(absent) => absent.to_plain_response(),
            Verdict::Confirm(confirm) => {
                if !confirm.absent(&guard.shared).await {
                    return Ok(Checked(value));
                }
                guard.shared.config.absent.to_plain_response()
            }
            Verdict::Refuse(error) => CannedResponse::refusal(&error).to_plain_response(),
        };
        Err(CheckedRejection::Guard(answer))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;

    use axum::body::Body;
    use axum::routing::get;
    use axum::{Extension, Router};
    use http::{Request, StatusCode};
    use tower::ServiceExt;

    use super::*;
    use crate::lifecycle::source::KeyList;
    use crate::request::path_param::PathParam;

    /// Answers 401 without a bearer token, before the handler reads its key.
    struct Auth;

    impl<S: Send + Sync> FromRequestParts<S> for Auth {
        type Rejection = StatusCode;

        async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, StatusCode> {
            match parts.headers.get("authorization") {
                Some(token) if token == "Bearer good" => Ok(Auth),
                _ => Err(StatusCode::UNAUTHORIZED),
            }
        }
    }

    /// The stored usernames, and a guard whose filter also holds `ghost`:
    /// a false positive, as an attacker would look for.
    async fn profiles() -> (BloomGuard, Arc<AtomicUsize>, Router) {
        let guard = BloomGuard::builder().name("profiles").build();
        guard
            .rebuild(&KeyList::new(["alice", "ghost"]))
            .await
            .expect("build");
        let calls = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&calls);
        let handler = move |_: Auth, Checked(Path(name)): Checked<Path<String>>| async move {
            counter.fetch_add(1, Ordering::SeqCst);
            if name == "alice" {
                (StatusCode::OK, "a profile")
            } else {
                (StatusCode::NOT_FOUND, "no such profile")
            }
        };
        let app = Router::new().route(
            "/profiles/{name}",
            get(handler).layer(Extension(guard.clone())),
        );
        (guard, calls, app)
    }

    async fn status(app: &Router, uri: &str, token: Option<&str>) -> StatusCode {
        let mut request = Request::get(uri);
        if let Some(token) = token {
            request = request.header("authorization", token);
        }
        let request = request.body(Body::empty()).expect("valid request");
        app.clone()
            .oneshot(request)
            .await
            .expect("infallible")
            .status()
    }

    #[tokio::test]
    async fn without_a_token_every_key_gets_the_same_401() {
        let (guard, calls, app) = profiles().await;
        for name in ["alice", "ghost", "nobody", "%2e%2e"] {
            let uri = format!("/profiles/{name}");
            assert_eq!(
                status(&app, &uri, None).await,
                StatusCode::UNAUTHORIZED,
                "{name}"
            );
            assert_eq!(
                status(&app, &uri, Some("Bearer bad")).await,
                StatusCode::UNAUTHORIZED,
                "{name}"
            );
        }
        assert_eq!(calls.load(Ordering::SeqCst), 0);
        // Nothing was even looked up.
        let stats = guard.stats();
        assert_eq!((stats.passed, stats.rejected), (0, 0));
    }

    #[tokio::test]
    async fn with_a_token_absent_keys_get_the_guards_answer() {
        let (guard, calls, app) = profiles().await;
        let token = Some("Bearer good");
        assert_eq!(status(&app, "/profiles/alice", token).await, StatusCode::OK);
        assert_eq!(
            status(&app, "/profiles/ghost", token).await,
            StatusCode::NOT_FOUND
        );
        assert_eq!(
            status(&app, "/profiles/nobody", token).await,
            StatusCode::NOT_FOUND
        );
        // The handler saw alice and the false positive, not the absent key.
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        let stats = guard.stats();
        assert_eq!((stats.passed, stats.rejected), (2, 1));
    }

    /// The layer answers before the auth extractor: the difference the
    /// extractor form removes.
    #[tokio::test]
    async fn a_layer_answers_before_auth_so_its_404_is_an_oracle() {
        let (guard, _, _) = profiles().await;
        let app = Router::new()
            .route("/profiles/{name}", get(|_: Auth| async { "a profile" }))
            .route_layer(guard.layer(PathParam("name")));
        assert_eq!(
            status(&app, "/profiles/nobody", None).await,
            StatusCode::NOT_FOUND
        );
        assert_eq!(
            status(&app, "/profiles/ghost", None).await,
            StatusCode::UNAUTHORIZED
        );
    }

    #[tokio::test]
    async fn typed_values_are_looked_up_in_the_guards_form() {
        let guard = BloomGuard::builder()
            .key_type(crate::KeyType::Integer)
            .build();
        guard.rebuild(&KeyList::new(["7"])).await.expect("build");
        let app = Router::new().route(
            "/orders/{id}",
            get(|Checked(Path(id)): Checked<Path<i64>>| async move { id.to_string() })
                .layer(Extension(guard.clone())),
        );
        assert_eq!(status(&app, "/orders/007", None).await, StatusCode::OK);
        assert_eq!(status(&app, "/orders/8", None).await, StatusCode::NOT_FOUND);
        // axum's own rejection, unchanged.
        assert_eq!(
            status(&app, "/orders/seven", None).await,
            StatusCode::BAD_REQUEST
        );
    }

    #[tokio::test]
    async fn without_the_guard_in_the_extensions_requests_pass() {
        let app = Router::new().route(
            "/items/{key}",
            get(|Checked(Path(key)): Checked<Path<String>>| async move { key }),
        );
        assert_eq!(status(&app, "/items/anything", None).await, StatusCode::OK);
    }
}
