//! The middleware `Service`.

use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower_service::Service;

use crate::handle::shared::Shared;
use crate::request::body::ResponseBody;
use crate::request::extract::KeyExtractor;
use crate::request::future::ResponseFuture;
use crate::request::methods::Methods;
use crate::request::response::CannedResponse;
use crate::request::verdict::{self, AuditToken, Verdict};

/// Answers requests whose key is absent from the filter; passes the rest to
/// the inner service.
///
/// Made by a [`BloomGuardLayer`](crate::BloomGuardLayer). Requests of methods the
/// layer does not check, requests without a key, and every request while no
/// filter is in place go to the inner service.
///
/// The inner service must be `Clone` (axum's routes and routers are): a
/// would-be refusal waiting for the read barrier takes the inner service
/// made ready for it, leaves a clone in its place, and calls it only if
/// the read brings the key, so a refusal never makes the handler's future.
#[derive(Debug, Clone)]
pub struct BloomGuardService<S, K> {
    inner: S,
    shared: Arc<Shared>,
    extractor: K,
    methods: Methods,
}

impl<S, K> BloomGuardService<S, K> {
    pub(crate) fn from_parts(
        inner: S,
        shared: Arc<Shared>,
        extractor: K,
        methods: Methods,
    ) -> Self {
        Self {
            inner,
            shared,
            extractor,
            methods,
        }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, K, ReqBody, ResBody> Service<Request<ReqBody>> for BloomGuardService<S, K>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    K: KeyExtractor<ReqBody>,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody, ResBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        if !self.methods.contains(req.method()) {
            return ResponseFuture::inner(self.inner.call(req));
        }
        let response = match verdict::decide(&self.shared, || self.extractor.extract(&req)) {
            Verdict::Pass => return ResponseFuture::inner(self.inner.call(req)),
            Verdict::Audit(key) => {
                let audit = AuditToken::new(Arc::clone(&self.shared), key);
                return ResponseFuture::audited(self.inner.call(req), audit);
            }
            Verdict::Reject(absent) => absent.to_response(),
            Verdict::Confirm(confirm) => {
                // The request waits with the inner service made ready for
                // it (a clone takes its place): a refusal never makes the
                // handler's future, only a key found by the read does.
                let shared = Arc::clone(&self.shared);
                let absent = Box::pin(async move {
                    let absent = confirm.absent(&shared).await;
                    absent.then_some(shared)
                });
                let clone = self.inner.clone();
                let ready = std::mem::replace(&mut self.inner, clone);
                return ResponseFuture::confirming(absent, ready, req);
            }
            Verdict::Refuse(error) => {
                tracing::debug!(%error, "request key refused");
                CannedResponse::refusal(&error).to_response()
            }
        };
        ResponseFuture::answered(response)
    }
}

#[cfg(test)]
mod tests;
