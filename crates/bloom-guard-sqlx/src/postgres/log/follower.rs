//! The public follower of a table on the log feed.

use bloom_guard::BloomGuard;
use sqlx::PgPool;

use super::backend::PgLogBackend;
use crate::follow::{follower_api, Engine};
use crate::postgres::PgBackend;
use crate::watch::Watch;

/// The log follower's pause after a read that found nothing. The
/// producer wakes the followers once per write of a batch; a wake-up whose
/// rows an earlier read already took finds nothing, and a longer pause
/// would hold the next batch back by as much (the trigger feed's 50 ms
/// showed as a 60 ms p99 from commit to another instance under 2 000
/// writes/s).
const MIN_READ_GAP: std::time::Duration = std::time::Duration::from_millis(5);

/// Keeps `guard` complete for a Postgres table on the **log feed**: the
/// changes come from the write-ahead log (`wal_level=logical`), decoded
/// from a logical replication slot, so writers run no trigger of ours.
///
/// The table is put on the log feed once, at migration time, with
/// [`Watch::install_log`]. One instance of the fleet at a time streams the
/// database's slot (the slot takes one reader) and writes each committed
/// transaction's key changes, in commit order, to the feed's table; every
/// follower reads them from there. A refusal waits until the slot has
/// confirmed the server's log position taken after the request arrived:
/// a commit not decoded yet is never refused as absent. `url` is the
/// database's URL with its password (a replication connection is opened
/// from it); its role needs the REPLICATION attribute.
///
/// # Example
///
/// ```no_run
/// use bloom_guard::BloomGuard;
/// use bloom_guard_sqlx::{postgres, Watch};
///
/// # async fn run(pool: sqlx::PgPool, url: String) -> Result<(), bloom_guard_sqlx::FeedError> {
/// let items = Watch::table("items").key("key");
/// bloom_guard_sqlx::postgres::install(&pool).await?; // at migration time
/// items.install_log(&pool).await?;
///
/// let guard = BloomGuard::builder().expected_items(1_000_000).build();
/// tokio::spawn(postgres::log::Follower::new(guard.clone(), pool, items, url).run());
/// # Ok(()) }
/// ```
///
#[doc = include_str!("../../../docs/log-feed.md")]
pub struct Follower {
    engine: Engine<PgLogBackend>,
}

follower_api!(Follower);

impl Follower {
    /// A follower for `guard`, holding the keys of `watch`'s table, reading
    /// through `pool`; replication connections go to `url`.
    pub fn new(guard: BloomGuard, pool: PgPool, watch: Watch, url: impl Into<String>) -> Self {
        let inner = PgBackend::new(&guard, pool, watch);
        let mut engine = Engine::new(guard, PgLogBackend::new(inner, url.into()));
        engine.schedule.min_read_gap = MIN_READ_GAP;
        Self { engine }
    }

    /// How long the database's slot may stay behind the log, its confirmed
    /// position not moving, before the guard fails open, naming the cause
    /// (default 30 s): no instance streams the slot (every producer
    /// failing, a dead connection holding it until `wal_sender_timeout`),
    /// and each refusal would otherwise wait the barrier's bound. Once a
    /// producer writes again, the guard rebuilds and refuses again.
    #[must_use]
    pub fn stalled_after(mut self, after: std::time::Duration) -> Self {
        self.engine.backend.stalled_after = after;
        self
    }

    /// The pause after a read that found no changes (default 5 ms):
    /// wake-ups that arrive meanwhile are served by one read. A read that
    /// found changes is followed at once.
    #[must_use]
    pub fn min_read_gap(mut self, gap: std::time::Duration) -> Self {
        self.engine.schedule.min_read_gap = gap;
        self
    }
}
