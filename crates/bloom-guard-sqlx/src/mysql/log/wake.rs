//! Wake-ups of the binary log feed: the producer's progress, looked at
//! every 10 ms while it moves, less often as it rests (up to once a
//! second), by one poller per database in a process for all its followers.

use std::time::Duration;

use sqlx::MySqlPool;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::per_database::PerDatabase;

const BUSY: Duration = Duration::from_millis(10);
const RESTING: Duration = Duration::from_secs(1);

static POLLERS: PerDatabase<(MySqlPool, std::sync::Arc<Notify>)> = PerDatabase::new();

/// Wakes `feed` whenever the progress of `database`'s producer moves,
/// until `stop`.
pub(super) async fn watch(
    database: String,
    pool: MySqlPool,
    feed: std::sync::Arc<Notify>,
    stop: CancellationToken,
) {
    let poller = database.clone();
    let _member = POLLERS.join(database, (pool, feed), |stop| {
        tokio::spawn(poll(poller, stop))
    });
    stop.cancelled().await;
}

async fn poll(database: String, stop: CancellationToken) {
    let mut seen: Option<(i64, i64, String)> = None;
    let mut pause = BUSY;
    loop {
        let followers = POLLERS.members(&database);
        let Some((pool, _)) = followers.last() else {
            return;
        };
        let look: Result<Option<(i64, i64, String)>, sqlx::Error> =
            sqlx::query_as("select seq, pos, epoch from bloom_guard_log_progress where id = 1")
                .fetch_optional(pool)
                .await;
        match look {
            Ok(now) if now != seen => {
                seen = now;
                for (_, feed) in &followers {
                    feed.notify_one();
                }
                pause = BUSY;
            }
            _ => pause = (pause * 2).min(RESTING),
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(pause) => {}
        }
    }
}
