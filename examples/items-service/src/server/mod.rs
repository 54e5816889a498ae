//! Serving a router so that hostile or broken clients cannot take the
//! service down or lock other clients out: deadlines for a connection's
//! first bytes and for request headers, HTTP/2 keep-alive pings, an idle
//! timeout, a cap on connections that makes room for new clients by closing
//! the connection idle the longest, a deadline for each request, and
//! graceful shutdown.

mod connection;
mod first_bytes;
mod registry;
mod tracked;

use std::future::Future;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tower_http::timeout::TimeoutLayer;

use registry::{Admission, Registry};

/// The limits each connection is served with.
///
/// # Deadlines
///
/// A new connection has `first_bytes_timeout` to tell its protocol: the
/// whole HTTP/2 preface, or the start of an HTTP/1 request. An HTTP/1
/// client then has `header_read_timeout` for each request's headers. An
/// HTTP/2 client is pinged every `keep_alive_interval` and must answer
/// within `keep_alive_timeout`. A connection of either protocol with no
/// request in flight for `idle_timeout` is closed gracefully (a GOAWAY on
/// HTTP/2), and dropped a second later if its client lingers; idle HTTP/1
/// connections are closed sooner, by the header deadline.
///
/// # At the cap
///
/// With `max_connections` open, a new connection takes the place of the
/// connection that has been idle (no request in flight) the longest, which
/// is closed at once; idle sockets, however many, cannot lock new clients
/// out. A connection with a request in flight is never closed to make
/// room: when every connection has one, new connections are closed as they
/// arrive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections served at once (10 000).
    pub max_connections: usize,
    /// How long a new connection has to tell its protocol (10 s).
    pub first_bytes_timeout: Duration,
    /// How long a client has to send a request's headers, the first or the
    /// next on a kept-alive connection; then the connection is closed
    /// (10 s, HTTP/1).
    pub header_read_timeout: Duration,
    /// How long a connection may have no request in flight (60 s).
    pub idle_timeout: Duration,
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
            idle_timeout: Duration::from_secs(60),
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

/// Serves `app` on `listener` with `limits` until `shutdown` completes,
/// then stops accepting and lets the requests in flight finish.
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
    let registry = Registry::new(limits.max_connections);
    // Every connection holds a receiver: `closed` completes once all are gone.
    let (stop, _) = watch::channel(());
    let (mut making_room_logged, mut full_logged) = (false, false);
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
        let slot = match registry.admit() {
            Admission::Admitted(slot) => {
                (making_room_logged, full_logged) = (false, false);
                slot
            }
            Admission::MadeRoom(slot) => {
                if !making_room_logged {
                    tracing::warn!(
                        max = limits.max_connections,
                        "the connection cap is reached; closing idle connections, oldest first, for new ones"
                    );
                    making_room_logged = true;
                }
                full_logged = false;
                slot
            }
            Admission::Full => {
                // Closed at once, so the client learns it now rather than
                // waiting unseen in the kernel's queue.
                if !full_logged {
                    tracing::warn!(
                        max = limits.max_connections,
                        "the connection cap is reached and every connection has a request in flight; closing new connections"
                    );
                    full_logged = true;
                }
                continue;
            }
        };
        let connection = connection::open(
            &builder,
            stream,
            app.clone(),
            &slot,
            limits.first_bytes_timeout,
        );
        tokio::spawn(connection::drive(
            connection,
            slot,
            limits.idle_timeout,
            stop.subscribe(),
        ));
    }
    drop(listener);
    // No receiver left means no connection left; nothing to tell then.
    let _ = stop.send(());
    stop.closed().await;
    Ok(())
}
