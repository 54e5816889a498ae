//! Wake-ups on MySQL, which has no notifications: the feed's highest id,
//! looked at every 10 ms while it moves, less often as it rests (up to
//! once a second). One poller per database in a process wakes every
//! follower of that database: an idle instance costs the database one
//! cheap statement a second for its wake-ups, however many guards it has.
//! The same statement sees the fleet's stored settings change and new
//! snapshots published, and announces them to every follower as Postgres
//! does by NOTIFY.

use std::time::Duration;

use sqlx::MySqlPool;
use tokio_util::sync::CancellationToken;

use crate::follow::WakeUps;
use crate::per_database::{database_key, PerDatabase};

/// The look's interval while the feed moves.
const BUSY: Duration = Duration::from_millis(10);
/// The look's interval after a long rest: the longest the first write
/// after a quiet spell waits for its wake-up (refusals never wait for it:
/// the read barrier reads the feed itself).
const RESTING: Duration = Duration::from_secs(1);

/// The pollers of this process, by database; each wakes its followers
/// and looks through the latest one's pool.
static POLLERS: PerDatabase<(MySqlPool, WakeUps)> = PerDatabase::new();

/// Wakes the feed's reader when the feed's highest id moves, until `stop`,
/// through the one poller of its database in this process (started by
/// the first follower). A transaction that commits an id below the
/// highest already seen wakes nobody: the next read has it (a read the
/// barrier asks for, or the poll).
pub(super) async fn watch(pool: MySqlPool, wake_ups: WakeUps, stop: CancellationToken) {
    let options = pool.connect_options();
    let database = database_key(
        options.get_host(),
        options.get_port(),
        options.get_database().unwrap_or_default(),
        options.get_username(),
    );
    let poller = database.clone();
    let _member = POLLERS.join(database, (pool.clone(), wake_ups), |stop| {
        tokio::spawn(poll(poller, stop))
    });
    stop.cancelled().await;
}

/// The feed's highest id, the newest snapshot's id, and a digest of the
/// stored settings (their count, latest change and a checksum of every
/// row): one cheap statement.
const LOOK: &str = "
select cast(coalesce(max(id), 0) as signed),
       (select cast(coalesce(max(id), 0) as signed) from bloom_guard_snapshots),
       (select cast(concat(count(*), ':', coalesce(max(updated_at), 0), ':',
                           coalesce(bit_xor(crc32(concat_ws(',', guard, mode, audit_rate, updated_at))), 0))
                    as char)
          from bloom_guard_settings)
  from bloom_guard_changes";

/// Looks at the feed of `database` until `stop`, waking its followers when
/// its highest id moves, and announcing new snapshots and changed settings.
async fn poll(database: String, stop: CancellationToken) {
    let mut seen: Option<(i64, i64, String)> = None;
    let mut pause = BUSY;
    loop {
        let followers = POLLERS.members(&database);
        let Some((pool, _)) = followers.last() else {
            return;
        };
        let look: Result<(i64, i64, String), sqlx::Error> =
            sqlx::query_as(LOOK).fetch_one(pool).await;
        match look {
            Ok(now) => {
                let before = seen.replace(now.clone());
                let moved = before.as_ref().is_none_or(|before| before.0 != now.0);
                let published = before.as_ref().is_some_and(|before| before.1 != now.1);
                let settings = before.as_ref().is_some_and(|before| before.2 != now.2);
                for (_, wake_ups) in &followers {
                    if moved {
                        wake_ups.feed.notify_one();
                    }
                    if published {
                        wake_ups.published.notify_one();
                    }
                    if settings {
                        wake_ups.settings.notify_one();
                    }
                }
                pause = if moved {
                    BUSY
                } else {
                    (pause * 2).min(RESTING)
                };
            }
            Err(_) => pause = RESTING,
        }
        tokio::select! {
            () = stop.cancelled() => break,
            () = tokio::time::sleep(pause) => {}
        }
    }
}
