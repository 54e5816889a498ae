//! Wake-ups on MySQL, which has no notifications: the feed's highest id,
//! looked at every 10 ms while it moves, less often as it rests (up to
//! once a second). One poller per database in a process wakes every
//! follower of that database: an idle instance costs the database one
//! cheap statement a second for its wake-ups, however many guards it has.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::MySqlPool;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::follow::WakeUps;
use crate::lock::lock;

/// The look's interval while the feed moves.
const BUSY: Duration = Duration::from_millis(10);
/// The look's interval after a long rest: the longest the first write
/// after a quiet spell waits for its wake-up (refusals never wait for it:
/// the read barrier reads the feed itself).
const RESTING: Duration = Duration::from_secs(1);

/// The pollers of this process, by database.
static POLLERS: Mutex<BTreeMap<String, Poller>> = Mutex::new(BTreeMap::new());

/// Numbers the followers a poller wakes.
static NEXT_FOLLOWER: AtomicU64 = AtomicU64::new(0);

/// One database's poller and the followers it wakes.
struct Poller {
    /// The pool it looks through: the latest follower's.
    pool: MySqlPool,
    followers: Vec<(u64, Arc<Notify>)>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

/// A follower woken by its database's poller; the last to leave stops it.
struct Woken {
    database: String,
    id: u64,
}

impl Drop for Woken {
    fn drop(&mut self) {
        let mut pollers = lock(&POLLERS);
        if let Some(poller) = pollers.get_mut(&self.database) {
            poller.followers.retain(|(id, _)| *id != self.id);
            if poller.followers.is_empty() {
                poller.stop.cancel();
                pollers.remove(&self.database);
            }
        }
    }
}

/// Wakes the feed's reader when the feed's highest id moves, until `stop`,
/// through the one poller of its database in this process (started by
/// the first follower; one whose runtime stopped is replaced). A
/// transaction that commits an id below the highest already seen wakes
/// nobody: the next read has it (a read the barrier asks for, or the poll).
pub(super) async fn watch(pool: MySqlPool, wake_ups: WakeUps, stop: CancellationToken) {
    let options = pool.connect_options();
    let database = format!(
        "{}:{}/{}?user={}",
        options.get_host(),
        options.get_port(),
        options.get_database().unwrap_or_default(),
        options.get_username()
    );
    let woken = {
        let mut pollers = lock(&POLLERS);
        let id = NEXT_FOLLOWER.fetch_add(1, Ordering::Relaxed);
        let running = pollers
            .get(&database)
            .is_some_and(|poller| !poller.task.is_finished());
        if !running {
            let stop = CancellationToken::new();
            let task = tokio::spawn(poll(database.clone(), stop.clone()));
            let followers = pollers
                .remove(&database)
                .map(|poller| poller.followers)
                .unwrap_or_default();
            pollers.insert(
                database.clone(),
                Poller {
                    pool: pool.clone(),
                    followers,
                    stop,
                    task,
                },
            );
        }
        if let Some(poller) = pollers.get_mut(&database) {
            poller.pool = pool;
            poller.followers.push((id, Arc::clone(&wake_ups.feed)));
        }
        Woken { database, id }
    };
    stop.cancelled().await;
    drop(woken);
}

/// Looks at the feed's highest id of `database` until `stop`, waking its
/// followers when it moves.
async fn poll(database: String, stop: CancellationToken) {
    let mut seen: Option<i64> = None;
    let mut pause = BUSY;
    loop {
        let pool = lock(&POLLERS)
            .get(&database)
            .map(|poller| poller.pool.clone());
        let Some(pool) = pool else {
            return;
        };
        let highest: Result<i64, sqlx::Error> = sqlx::query_scalar(
            "select cast(coalesce(max(id), 0) as signed) from bloom_guard_changes",
        )
        .fetch_one(&pool)
        .await;
        match highest {
            Ok(highest) if seen == Some(highest) => pause = (pause * 2).min(RESTING),
            Ok(highest) => {
                seen = Some(highest);
                if let Some(poller) = lock(&POLLERS).get(&database) {
                    for (_, feed) in &poller.followers {
                        feed.notify_one();
                    }
                }
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
