//! Serving a router so that hostile or broken clients cannot take the
//! service down: a cap on connections, a deadline for request headers
//! (which also closes idle keep-alive connections), a deadline for each
//! request, and graceful shutdown.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tower_http::timeout::TimeoutLayer;

/// The limits each connection is served with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections served at once; more are closed as they arrive.
    pub max_connections: usize,
    /// How long a client has to send a request's headers, the first or the
    /// next on a kept-alive connection; then the connection is closed.
    pub header_read_timeout: Duration,
    /// How long a request may take; then it gets a 408.
    pub request_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: 10_000,
            header_read_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(30),
        }
    }
}

/// Raises the process's soft limit on open files to its hard limit, so the
/// connection cap, not the operating system's default of 1024, decides how
/// many idle sockets the service holds. Returns the limit now in force.
pub fn raise_open_files_limit() -> u64 {
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(limit) => limit,
        Err(error) => {
            tracing::warn!(%error, "cannot raise the open files limit");
            rlimit::getrlimit(rlimit::Resource::NOFILE).map_or(1024, |(soft, _)| soft)
        }
    }
}

/// Serves `app` on `listener` until `shutdown` completes, then stops
/// accepting and lets the requests in flight finish.
///
/// # Errors
///
/// Never at present: accept failures (such as running out of file
/// descriptors) are logged and retried after a short pause.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
    limits: Limits,
) -> std::io::Result<()> {
    let app = app.layer(TimeoutLayer::with_status_code(
        axum::http::StatusCode::REQUEST_TIMEOUT,
        limits.request_timeout,
    ));
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let graceful = GracefulShutdown::new();
    let mut refused_logged = false;
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(error) => {
                    tracing::warn!(%error, "cannot accept a connection; retrying");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Ok(permit) = Arc::clone(&permits).try_acquire_owned() else {
            // At the cap: closed at once, so the client learns it now
            // rather than waiting unseen in the kernel's queue.
            if !refused_logged {
                tracing::warn!(
                    max = limits.max_connections,
                    "the connection cap is reached; closing new connections"
                );
                refused_logged = true;
            }
            continue;
        };
        refused_logged = false;
        let service = TowerToHyperService::new(app.clone());
        let connection = builder
            .serve_connection(TokioIo::new(stream), service)
            .into_owned();
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%error, "connection ended with an error");
            }
            drop(permit);
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}
