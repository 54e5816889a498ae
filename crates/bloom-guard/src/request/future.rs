//! The response future of `BloomGuardService`.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::Response;
use pin_project_lite::pin_project;

use crate::handle::shared::Shared;
use crate::request::body::ResponseBody;
use crate::request::verdict::AuditToken;

/// The read barrier's wait for one would-be refusal: the guard's core if
/// the key is still absent after the read, `None` to pass it on.
pub(crate) type ConfirmAbsent = Pin<Box<dyn Future<Output = Option<Arc<Shared>>> + Send + Sync>>;

pin_project! {
    /// The inner service's future, or the guard's own answer.
    pub struct ResponseFuture<F, B> {
        #[pin]
        kind: Kind<F, B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<F, B> {
        Inner { #[pin] future: F },
        Audited { #[pin] future: F, audit: Option<AuditToken> },
        Confirming { #[pin] future: F, absent: Option<ConfirmAbsent> },
        Answered { response: Option<Response<ResponseBody<B>>> },
    }
}

impl<F, B> ResponseFuture<F, B> {
    pub(crate) fn inner(future: F) -> Self {
        Self {
            kind: Kind::Inner { future },
        }
    }

    /// The inner service's future, whose answer `audit` checks.
    pub(crate) fn audited(future: F, audit: AuditToken) -> Self {
        Self {
            kind: Kind::Audited {
                future,
                audit: Some(audit),
            },
        }
    }

    /// The inner service's future, polled only once `absent` says the key
    /// exists; else the guard's answer.
    pub(crate) fn confirming(future: F, absent: ConfirmAbsent) -> Self {
        Self {
            kind: Kind::Confirming {
                future,
                absent: Some(absent),
            },
        }
    }

    pub(crate) fn answered(response: Response<ResponseBody<B>>) -> Self {
        Self {
            kind: Kind::Answered {
                response: Some(response),
            },
        }
    }
}

impl<F, B, E> Future for ResponseFuture<F, B>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<ResponseBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Inner { future } => future
                .poll(cx)
                .map(|result| result.map(|response| response.map(ResponseBody::inner))),
            KindProj::Audited { future, audit } => {
                let result = std::task::ready!(future.poll(cx));
                if let (Ok(response), Some(audit)) = (&result, audit.take()) {
                    audit.report(response.status(), response.headers());
                }
                Poll::Ready(result.map(|response| response.map(ResponseBody::inner)))
            }
            KindProj::Confirming { future, absent } => {
                if let Some(wait) = absent {
                    let refused = std::task::ready!(wait.as_mut().poll(cx));
                    *absent = None;
                    if let Some(shared) = refused {
                        return Poll::Ready(Ok(shared.config.absent.to_response()));
                    }
                }
                future
                    .poll(cx)
                    .map(|result| result.map(|response| response.map(ResponseBody::inner)))
            }
            KindProj::Answered { response } => {
                Poll::Ready(Ok(response.take().expect("future polled after completion")))
            }
        }
    }
}

impl<F, B> std::fmt::Debug for ResponseFuture<F, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
