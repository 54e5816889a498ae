//! Wake-ups on MySQL, which has no notifications: the feed's highest id,
//! looked at every 10 ms while it moves, less often as it rests (up to
//! every 100 ms: ten cheap statements a second per follower at rest).

use std::time::Duration;

use sqlx::MySqlPool;
use tokio_util::sync::CancellationToken;

use crate::follow::WakeUps;

/// The look's interval while the feed moves.
const BUSY: Duration = Duration::from_millis(10);
/// The look's interval after a long rest.
const RESTING: Duration = Duration::from_millis(100);

/// Wakes the feed's reader when the feed's highest id moves, until `stop`.
/// A transaction that commits an id below the highest already seen wakes
/// nobody: the next read has it (a read the barrier asks for, or the poll).
pub(super) async fn watch(pool: MySqlPool, wake_ups: WakeUps, stop: CancellationToken) {
    let mut seen: Option<i64> = None;
    let mut pause = BUSY;
    loop {
        let highest: Result<i64, sqlx::Error> = sqlx::query_scalar(
            "select cast(coalesce(max(id), 0) as signed) from bloom_guard_changes",
        )
        .fetch_one(&pool)
        .await;
        match highest {
            Ok(highest) if seen == Some(highest) => pause = (pause * 2).min(RESTING),
            Ok(highest) => {
                seen = Some(highest);
                wake_ups.feed.notify_one();
                pause = BUSY;
            }
            Err(_) => pause = RESTING,
        }
        tokio::select! {
            () = stop.cancelled() => break,
            () = tokio::time::sleep(pause) => {}
        }
    }
}
