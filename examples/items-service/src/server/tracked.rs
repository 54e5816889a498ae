//! A connection's service, counting its requests in flight.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;
use tower_service::Service;

use super::registry::{InFlight, Tracker};

/// Wraps a connection's service so that the registry knows when the
/// connection has a request in flight.
#[derive(Debug, Clone)]
pub(super) struct Tracked<S> {
    inner: S,
    tracker: Tracker,
}

impl<S> Tracked<S> {
    pub(super) fn new(inner: S, tracker: Tracker) -> Self {
        Self { inner, tracker }
    }
}

impl<S, R> Service<R> for Tracked<S>
where
    S: Service<R>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = TrackedFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: R) -> Self::Future {
        let in_flight = Some(self.tracker.start());
        TrackedFuture {
            future: self.inner.call(request),
            in_flight,
        }
    }
}

pin_project! {
    /// The response future of [`Tracked`]: the request is in flight until
    /// the response is ready or the future is dropped.
    #[derive(Debug)]
    pub(super) struct TrackedFuture<F> {
        #[pin]
        future: F,
        in_flight: Option<InFlight>,
    }
}

impl<F: Future> Future for TrackedFuture<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let output = std::task::ready!(this.future.poll(cx));
        this.in_flight.take();
        Poll::Ready(output)
    }
}
