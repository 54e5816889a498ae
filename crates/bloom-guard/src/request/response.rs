//! The canned responses the guard answers with on its own.

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{HeaderMap, HeaderValue, Response, StatusCode};

use crate::keys::key::KeyError;
use crate::request::body::ResponseBody;

/// A response the guard sends without calling the inner service: kept as
/// parts so each request gets a fresh copy for any body type.
#[derive(Debug, Clone)]
pub(crate) struct CannedResponse {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

impl CannedResponse {
    pub(crate) fn from_response<B: Into<Bytes>>(response: Response<B>) -> Self {
        let (parts, body) = response.into_parts();
        Self {
            status: parts.status,
            headers: parts.headers,
            body: body.into(),
        }
    }

    pub(crate) fn json(status: StatusCode, body: &'static str) -> Self {
        let mut headers = HeaderMap::with_capacity(1);
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        Self {
            status,
            headers,
            body: Bytes::from_static(body.as_bytes()),
        }
    }

    /// 404 with `{"error":"not found"}`: what the example service answers for
    /// a missing row, so a guard rejection and a database miss look the same.
    pub(crate) fn not_found() -> Self {
        Self::json(StatusCode::NOT_FOUND, r#"{"error":"not found"}"#)
    }

    /// The answer to a key the guard refuses itself, as the error declares.
    pub(crate) fn refusal(error: &KeyError) -> Self {
        Self::json(error.status(), error.body())
    }

    /// Marks the response as the guard's own, for operators.
    pub(crate) fn with_debug_header(mut self) -> Self {
        self.headers
            .insert("x-bloom-guard", HeaderValue::from_static("absent"));
        self
    }

    pub(crate) fn to_response<B>(&self) -> Response<ResponseBody<B>> {
        self.to_response_with(ResponseBody::answer(self.body.clone()))
    }

    /// The answer with a body of any type made from bytes (an axum `Body`).
    #[cfg_attr(not(feature = "axum"), allow(dead_code))]
    pub(crate) fn to_plain_response<B: From<Bytes>>(&self) -> Response<B> {
        self.to_response_with(B::from(self.body.clone()))
    }

    fn to_response_with<B>(&self, body: B) -> Response<B> {
        let mut response = Response::new(body);
        *response.status_mut() = self.status;
        response.headers_mut().clone_from(&self.headers);
        response
    }
}

/// The response the guard gives for an absent key unless told otherwise:
/// `404 Not Found`, `content-type: application/json`, body
/// `{"error":"not found"}`.
///
/// Answer your own "not found" with the same bytes, and no response tells
/// a filter rejection from a database miss. Timing still does: the guard
/// answers in microseconds, a database miss takes milliseconds, so a client
/// can find which absent keys are the filter's false positives. A negative
/// cache entry makes each one cheap after its first lookup, and every
/// rebuild draws a new hasher seed, which replaces the set (see the
/// consistency page on `bloom_guard_sqlx::PgFollower`).
///
/// # Example
///
/// ```
/// let response = bloom_guard::not_found_response();
/// assert_eq!(response.status(), 404);
/// assert_eq!(response.body().as_ref(), br#"{"error":"not found"}"#);
/// ```
///
/// In an axum handler, its body as axum's:
///
/// ```
/// # #[cfg(feature = "axum")] {
/// use axum::response::{IntoResponse, Response};
///
/// async fn missing() -> Response {
///     bloom_guard::not_found_response()
///         .map(axum::body::Body::from)
///         .into_response()
/// }
/// # }
/// ```
pub fn not_found_response() -> Response<Bytes> {
    let canned = CannedResponse::not_found();
    let mut response = Response::new(canned.body.clone());
    *response.status_mut() = canned.status;
    *response.headers_mut() = canned.headers;
    response
}
