//! The public follower of a table on the binary log feed.

use bloom_guard::BloomGuard;
use sqlx::MySqlPool;

use super::backend::MySqlLogBackend;
use crate::follow::{follower_api, Engine};
use crate::mysql::MySqlBackend;
use crate::watch::Watch;

/// The least gap between two reads: the producer writes a batch at a time
/// and the poller wakes the followers once per write.
const MIN_READ_GAP: std::time::Duration = std::time::Duration::from_millis(5);

#[doc = include_str!("../../../docs/binlog-feed.md")]
pub struct Follower {
    engine: Engine<MySqlLogBackend>,
}

follower_api!(Follower);

impl Follower {
    /// A follower of `watch`'s table on the binary log feed of `pool`'s
    /// database, whose producer streams the log with `url` (the pool's
    /// URL; its role needs `REPLICATION SLAVE` and `REPLICATION CLIENT`).
    /// Put the table on the feed first with
    /// [`Watch::install_log`](crate::Watch::install_log).
    pub fn new(guard: BloomGuard, pool: MySqlPool, watch: Watch, url: impl Into<String>) -> Self {
        let inner = MySqlBackend::new(&guard, pool, watch);
        let mut engine = Engine::new(guard, MySqlLogBackend::new(inner, url.into()));
        engine.schedule.min_read_gap = MIN_READ_GAP;
        Self { engine }
    }

    /// How long a read for waiting refusals waits for the producer to
    /// write what the log held when it began (1 s by default); the read
    /// then fails and is tried again. Each refusal waits at most the
    /// guard's own bound
    /// ([`read_barrier_timeout`](bloom_guard::Builder::read_barrier_timeout))
    /// before it goes to the application.
    #[must_use]
    pub fn barrier_bound(mut self, bound: std::time::Duration) -> Self {
        self.engine.backend.bound = bound;
        self
    }

    /// Whether the guard's would-be refusals are confirmed by a lookup of
    /// their keys in the table (the default), or wait for a feed read,
    /// which waits for the producer to write what the log held after the
    /// request. Either way a refusal is exact as of its request; the
    /// lookup answers in one indexed statement shared by the refusals
    /// waiting at one moment, where the read waits out the producer's lag
    /// (tens of milliseconds while writers write). Lookups are made only
    /// for a watch of one key column that compares keys exactly as the
    /// guard's key type does and that an index leads with; any other
    /// always waits for reads.
    #[must_use]
    pub fn look_up_refusals(mut self, look_up: bool) -> Self {
        self.engine.backend.look_up = look_up;
        self
    }
}
