//! The service's error responses: JSON, and nothing internal sent to clients.

use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

/// Everything a handler can fail with.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The request is malformed; the message says how, for the client.
    #[error("{message}")]
    BadRequest {
        /// The status to answer with (a 4xx).
        status: StatusCode,
        /// What is wrong with the request.
        message: String,
    },
    /// A key the service never stores, answered exactly as the guard
    /// answers it when it refuses a key itself (status and body declared by
    /// [`KeyError`](bloom_guard::keys::KeyError)).
    #[error("{0}")]
    Key(#[from] bloom_guard::keys::KeyError),
    /// An item with this key exists already.
    #[error("an item with this key exists")]
    Conflict,
    /// The database failed; logged, answered as 503.
    #[error("database error")]
    Database(#[source] Arc<sqlx::Error>),
}

impl ApiError {
    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::BadRequest {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
        }
    }
}

impl From<sqlx::Error> for ApiError {
    fn from(error: sqlx::Error) -> Self {
        // Input the database cannot store is the client's to fix: a NUL
        // byte, or a character the database's encoding cannot hold.
        if let sqlx::Error::Database(db) = &error {
            // MySQL: 1366, an incorrect string value for the column's
            // character set.
            let mysql_number = db
                .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
                .map(sqlx::mysql::MySqlDatabaseError::number);
            if matches!(db.code().as_deref(), Some("22021" | "22P05")) || mysql_number == Some(1366)
            {
                return Self::BadRequest {
                    status: StatusCode::UNPROCESSABLE_ENTITY,
                    message: "the text holds characters the database cannot store".to_owned(),
                };
            }
        }
        Self::Database(Arc::new(error))
    }
}

impl From<Arc<sqlx::Error>> for ApiError {
    fn from(error: Arc<sqlx::Error>) -> Self {
        Self::Database(error)
    }
}

impl From<JsonRejection> for ApiError {
    fn from(rejection: JsonRejection) -> Self {
        Self::BadRequest {
            status: rejection.status(),
            message: rejection.body_text(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, message) = match self {
            ApiError::Key(error) => {
                let mut response = Response::new(axum::body::Body::from(error.body()));
                *response.status_mut() = error.status();
                response.headers_mut().insert(
                    axum::http::header::CONTENT_TYPE,
                    axum::http::HeaderValue::from_static("application/json"),
                );
                return response;
            }
            ApiError::BadRequest { status, message } => (status, message),
            ApiError::Conflict => (StatusCode::CONFLICT, self.to_string()),
            ApiError::Database(error) => {
                tracing::error!(error = %error, "database request failed");
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "service unavailable".to_owned(),
                )
            }
        };
        (status, Json(json!({ "error": message }))).into_response()
    }
}

/// The service's "not found", byte for byte the guard's own answer for an
/// absent key: no response tells which of the two answered (only their
/// timing does).
pub fn not_found() -> Response {
    bloom_guard::not_found_response().map(axum::body::Body::from)
}
