//! Wake-ups on Postgres: LISTEN on a connection of its own, reconnecting
//! with backoff. A wake-up carries nothing but "read now"; after a
//! reconnect one read catches up, and the feed is also read on an interval.

use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgListener, PgPool, PgPoolOptions};
use tokio::time::sleep;
use tokio_util::sync::CancellationToken;

use crate::backoff::retry_pauses;
use crate::follow::WakeUps;

/// The `application_name` of the listener's connection, to find it in
/// `pg_stat_activity`.
pub const LISTENER_APPLICATION_NAME: &str = "bloom-guard-listener";

/// The channel the feed NOTIFYs, with the feed's or the guard's name as
/// payload.
pub(super) const CHANNEL: &str = "bloom_guard";

/// The payload that announces a change of guard `<name>`'s stored
/// settings is this prefix and the name (see the fleet statements).
const SETTINGS_PREFIX: &str = "settings:";

/// The listener's (and the notifier's) connection options: named so
/// operators can find it, with TCP keepalives from the server's side (Postgres drops the backend of a
/// listener whose host vanished). A listener that is silently gone costs
/// only latency: the feed is also read on an interval.
pub(super) fn options(pool_options: &PgConnectOptions) -> PgConnectOptions {
    pool_options
        .clone()
        .application_name(LISTENER_APPLICATION_NAME)
        .options([
            ("tcp_keepalives_idle", "30"),
            ("tcp_keepalives_interval", "10"),
            ("tcp_keepalives_count", "3"),
        ])
}

/// LISTENs for wake-ups until `stop`.
/// Each connection takes the pool's server of the moment (a pool of
/// several servers moves across a failover).
pub(super) async fn listen(pool: PgPool, wake_ups: WakeUps, stop: CancellationToken) {
    let wake = &wake_ups.feed;
    let mut pauses = retry_pauses();
    let mut lost = false;
    loop {
        // A pool of one connection, fresh each time: a half-open connection
        // is dropped with its pool, never handed out again.
        let own = PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(Duration::from_secs(5))
            .idle_timeout(None)
            .max_lifetime(None)
            .connect_lazy_with(options(&pool.connect_options()));
        let session = async {
            let mut listener = PgListener::connect_with(&own).await?;
            listener.ignore_pool_close_event(true);
            listener.eager_reconnect(false);
            listener.listen(CHANNEL).await?;
            if lost {
                tracing::info!("listening for change feed wake-ups again");
                lost = false;
                pauses = retry_pauses();
            }
            // What changed while nobody listened is read now.
            wake.notify_one();
            wake_ups.settings.notify_one();
            wake_ups.published.notify_one();
            loop {
                match listener.try_recv().await? {
                    Some(notification) => {
                        // The guard's own name first: a guard may be named
                        // like a settings announcement.
                        let payload = notification.payload();
                        if payload == wake_ups.guard {
                            wake.notify_one();
                            wake_ups.published.notify_one();
                        } else if let Some(guard) = payload.strip_prefix(SETTINGS_PREFIX) {
                            if guard == wake_ups.guard {
                                wake_ups.settings.notify_one();
                            }
                        } else {
                            wake.notify_one();
                        }
                    }
                    // The connection is lost: a value, not an error.
                    None => return Ok::<(), sqlx::Error>(()),
                }
            }
        };
        let outcome = tokio::select! {
            () = stop.cancelled() => None,
            outcome = session => Some(outcome),
        };
        own.close().await;
        let Some(outcome) = outcome else {
            return;
        };
        if !lost {
            match outcome {
                Ok(()) => tracing::warn!("the listener's connection closed; reading the change feed on its interval until it is back"),
                Err(error) => tracing::warn!(%error, "the listener failed; reading the change feed on its interval until it is back"),
            }
            lost = true;
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = sleep(pauses.next().unwrap_or(Duration::from_secs(10))) => {}
        }
    }
}
