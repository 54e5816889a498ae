//! Which answers of the inner service mean "the key exists": shadow mode
//! and the audits count a would-be refusal answered so as a false negative.

use std::fmt;
use std::sync::Arc;

use http::{HeaderMap, StatusCode};

type Predicate = dyn Fn(StatusCode, &HeaderMap) -> bool + Send + Sync;

/// A guard's test of an answer; by default any 2xx or 3xx (a redirect to an
/// existing resource, as a URL shortener answers).
#[derive(Clone, Default)]
pub(crate) struct Found(Option<Arc<Predicate>>);

impl Found {
    pub(crate) fn new(
        found: impl Fn(StatusCode, &HeaderMap) -> bool + Send + Sync + 'static,
    ) -> Self {
        Self(Some(Arc::new(found)))
    }

    /// Whether an answer with `status` and `headers` says the key exists.
    pub(crate) fn test(&self, status: StatusCode, headers: &HeaderMap) -> bool {
        match &self.0 {
            Some(found) => found(status, headers),
            None => status.is_success() || status.is_redirection(),
        }
    }
}

impl fmt::Debug for Found {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_some() {
            "Found(custom)"
        } else {
            "Found(2xx or 3xx)"
        })
    }
}

#[cfg(all(test, feature = "axum"))]
mod tests;
