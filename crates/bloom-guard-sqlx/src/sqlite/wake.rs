//! Wake-ups on SQLite: `PRAGMA data_version` on a connection of its own
//! changes whenever another connection commits.

use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection};
use sqlx::Connection;
use tokio_util::sync::CancellationToken;

use crate::follow::WakeUps;

/// How often `data_version` is looked at.
const LOOK_EVERY: Duration = Duration::from_millis(20);

/// Wakes the feed's reader after every commit elsewhere, until `stop`.
pub(super) async fn watch(
    options: SqliteConnectOptions,
    wake_ups: WakeUps,
    stop: CancellationToken,
) {
    let mut watcher: Option<(SqliteConnection, i64)> = None;
    loop {
        if committed_elsewhere(&options, &mut watcher).await {
            wake_ups.feed.notify_one();
        }
        tokio::select! {
            () = stop.cancelled() => break,
            () = tokio::time::sleep(LOOK_EVERY) => {}
        }
    }
    if let Some((connection, _)) = watcher {
        let _ = connection.close().await;
    }
}

/// Whether another connection committed since the last call; true when
/// it cannot tell (a read costs little, a missed commit a delay).
async fn committed_elsewhere(
    options: &SqliteConnectOptions,
    watcher: &mut Option<(SqliteConnection, i64)>,
) -> bool {
    let Some((connection, seen)) = watcher.as_mut() else {
        let Ok(mut connection) = SqliteConnection::connect_with(options).await else {
            return true;
        };
        if let Ok(version) = data_version(&mut connection).await {
            *watcher = Some((connection, version));
        }
        return true;
    };
    match data_version(connection).await {
        Ok(version) if version == *seen => false,
        Ok(version) => {
            *seen = version;
            true
        }
        Err(_) => {
            *watcher = None;
            true
        }
    }
}

async fn data_version(connection: &mut SqliteConnection) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("pragma data_version")
        .fetch_one(connection)
        .await
}
