//! The response future of `BloomGuardService`.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use pin_project_lite::pin_project;
use tower_service::Service;

use crate::handle::shared::Shared;
use crate::request::body::ResponseBody;
use crate::request::verdict::AuditToken;

/// The read barrier's wait for one would-be refusal: the guard's core if
/// the key is still absent after the read, `None` to pass it on.
pub(crate) type ConfirmAbsent = Pin<Box<dyn Future<Output = Option<Arc<Shared>>> + Send + Sync>>;

pin_project! {
    /// The inner service's future, or the guard's own answer.
    pub struct ResponseFuture<S, ReqBody, ResBody>
    where
        S: Service<Request<ReqBody>>,
    {
        #[pin]
        kind: Kind<S, ReqBody, ResBody>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<S, ReqBody, ResBody>
    where
        S: Service<Request<ReqBody>>,
    {
        Inner { #[pin] future: S::Future },
        Audited { #[pin] future: S::Future, audit: Option<AuditToken> },
        // The request waits for the read barrier with the inner service
        // that was ready for it: the inner service is called only if the
        // key turns out to exist.
        Confirming { absent: ConfirmAbsent, call: Option<(S, Request<ReqBody>)> },
        Answered { response: Option<Response<ResponseBody<ResBody>>> },
    }
}

impl<S, ReqBody, ResBody> ResponseFuture<S, ReqBody, ResBody>
where
    S: Service<Request<ReqBody>>,
{
    pub(crate) fn inner(future: S::Future) -> Self {
        Self {
            kind: Kind::Inner { future },
        }
    }

    /// The inner service's future, whose answer `audit` checks.
    pub(crate) fn audited(future: S::Future, audit: AuditToken) -> Self {
        Self {
            kind: Kind::Audited {
                future,
                audit: Some(audit),
            },
        }
    }

    /// The guard's answer if `absent` says the key is still absent; else
    /// `ready` (an inner service ready for a call) is called with `req`.
    pub(crate) fn confirming(absent: ConfirmAbsent, ready: S, req: Request<ReqBody>) -> Self {
        Self {
            kind: Kind::Confirming {
                absent,
                call: Some((ready, req)),
            },
        }
    }

    pub(crate) fn answered(response: Response<ResponseBody<ResBody>>) -> Self {
        Self {
            kind: Kind::Answered {
                response: Some(response),
            },
        }
    }
}

impl<S, ReqBody, ResBody> Future for ResponseFuture<S, ReqBody, ResBody>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
{
    type Output = Result<Response<ResponseBody<ResBody>>, S::Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            match self.as_mut().project().kind.project() {
                KindProj::Inner { future } => {
                    return future
                        .poll(cx)
                        .map(|result| result.map(|response| response.map(ResponseBody::inner)));
                }
                KindProj::Audited { future, audit } => {
                    let result = std::task::ready!(future.poll(cx));
                    if let (Ok(response), Some(audit)) = (&result, audit.take()) {
                        audit.report(response.status(), response.headers());
                    }
                    return Poll::Ready(result.map(|response| response.map(ResponseBody::inner)));
                }
                KindProj::Confirming { absent, call } => {
                    let refused = std::task::ready!(absent.as_mut().poll(cx));
                    if let Some(shared) = refused {
                        return Poll::Ready(Ok(shared.config.absent.to_response()));
                    }
                    let Some((mut ready, req)) = call.take() else {
                        panic!("future polled after completion");
                    };
                    let future = ready.call(req);
                    self.as_mut().project().kind.set(Kind::Inner { future });
                }
                KindProj::Answered { response } => {
                    return Poll::Ready(Ok(response
                        .take()
                        .expect("future polled after completion")));
                }
            }
        }
    }
}

impl<S, ReqBody, ResBody> std::fmt::Debug for ResponseFuture<S, ReqBody, ResBody>
where
    S: Service<Request<ReqBody>>,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
