//! Serving one connection: its deadlines, and closing it when it has been
//! idle too long, when it must make room, or when the service stops.

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::Instant;

use super::first_bytes::FirstBytes;
use super::registry::Slot;
use super::tracked::Tracked;

/// After a graceful close starts, how long the client has to see it (a
/// GOAWAY on HTTP/2) before an idle connection is dropped, as Go's HTTP/2
/// server allows. A request in flight is waited for.
const CLOSE_GRACE: Duration = Duration::from_secs(1);

type Connection = auto::Connection<
    'static,
    TokioIo<FirstBytes<TcpStream>>,
    TowerToHyperService<Tracked<Router>>,
    TokioExecutor,
>;

/// Starts serving `app` on `stream`, under the first-bytes deadline.
pub(super) fn open(
    builder: &auto::Builder<TokioExecutor>,
    stream: TcpStream,
    app: Router,
    slot: &Slot,
    first_bytes_timeout: Duration,
) -> Connection {
    let io = TokioIo::new(FirstBytes::new(stream, first_bytes_timeout));
    let service = TowerToHyperService::new(Tracked::new(app, slot.tracker()));
    builder.serve_connection(io, service).into_owned()
}

/// Drives `connection` to its end. Closed gracefully once it has had no
/// request in flight for `idle_timeout`, or when `stopping` changes or
/// closes; closed at once when its slot is taken to make room.
pub(super) async fn drive(
    connection: Connection,
    slot: Slot,
    idle_timeout: Duration,
    mut stopping: watch::Receiver<()>,
) {
    tokio::pin!(connection);
    let timer = tokio::time::sleep(idle_timeout);
    tokio::pin!(timer);
    // While open, `timer` is the idle deadline; once closing, the grace's end.
    let mut closing = false;
    let result = loop {
        tokio::select! {
            result = connection.as_mut() => break result,
            () = slot.evicted() => {
                connection.as_mut().graceful_shutdown();
                poll_once(connection.as_mut()).await;
                return;
            }
            _ = stopping.changed(), if !closing => {
                closing = true;
                connection.as_mut().graceful_shutdown();
                timer.as_mut().reset(Instant::now() + CLOSE_GRACE);
            }
            () = timer.as_mut() => {
                let now = Instant::now();
                match (slot.idle_since(), closing) {
                    (Some(_), true) => return,
                    (None, true) => timer.as_mut().reset(now + CLOSE_GRACE),
                    (Some(since), false) if now >= since + idle_timeout => {
                        closing = true;
                        connection.as_mut().graceful_shutdown();
                        timer.as_mut().reset(now + CLOSE_GRACE);
                    }
                    (Some(since), false) => timer.as_mut().reset(since + idle_timeout),
                    (None, false) => timer.as_mut().reset(now + idle_timeout),
                }
            }
        }
    };
    if let Err(error) = result {
        tracing::debug!(%error, "connection ended with an error");
    }
}

/// Gives `connection` one turn to write what it has to say (a GOAWAY on
/// HTTP/2) before it is dropped.
async fn poll_once(mut connection: Pin<&mut Connection>) {
    std::future::poll_fn(|cx| {
        let _ = connection.as_mut().poll(cx);
        Poll::Ready(())
    })
    .await;
}
