//! Serving a router so that hostile or broken clients cannot take the
//! service down: a cap on connections, a deadline for a connection's first
//! bytes, a deadline for request headers (which also closes idle keep-alive
//! connections), HTTP/2 keep-alive pings, a deadline for each request, and
//! graceful shutdown.

mod first_bytes;

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

use first_bytes::FirstBytes;

/// The limits each connection is served with.
///
/// A new connection has `first_bytes_timeout` to tell its protocol: the
/// whole HTTP/2 preface, or the start of an HTTP/1 request. An HTTP/1
/// client then has `header_read_timeout` for each request's headers. An
/// HTTP/2 client is pinged every `keep_alive_interval` and must answer
/// within `keep_alive_timeout`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections served at once; more are closed as they arrive (10 000).
    pub max_connections: usize,
    /// How long a new connection has to tell its protocol (10 s).
    pub first_bytes_timeout: Duration,
    /// How long a client has to send a request's headers, the first or the
    /// next on a kept-alive connection; then the connection is closed
    /// (10 s, HTTP/1).
    pub header_read_timeout: Duration,
    /// How often an HTTP/2 connection is pinged, idle or not (20 s).
    pub keep_alive_interval: Duration,
    /// How long an HTTP/2 client has to answer a ping; then its connection
    /// is closed (20 s).
    pub keep_alive_timeout: Duration,
    /// How long a request may take; then it gets a 408 (30 s).
    pub request_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: 10_000,
            first_bytes_timeout: Duration::from_secs(10),
            header_read_timeout: Duration::from_secs(10),
            keep_alive_interval: Duration::from_secs(20),
            keep_alive_timeout: Duration::from_secs(20),
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

/// Serves `app` on `listener` with `limits` until `shutdown` completes, then stops
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
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(limits.keep_alive_interval)
        .keep_alive_timeout(limits.keep_alive_timeout);
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
        let io = TokioIo::new(FirstBytes::new(stream, limits.first_bytes_timeout));
        let connection = builder.serve_connection(io, service).into_owned();
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
