//! Postgres: the feed's schema ([`install`], [`uninstall`], [`SQL`]), the
//! [`Follower`] of a table on the trigger feed, the [`CopySource`] a warm-up
//! scans, the servers of a multi-host URL ([`Servers`]), and the log feed
//! ([`log`], feature `log-feed`).
//!
//! Inside: the follower engine's Postgres backend: the feed read by
//! snapshot visibility, LISTEN wake-ups, the trigger check, snapshots
//! under an advisory lock, the feed's SQL, and the COPY warm-up.

mod backend;
mod catalog;
mod connections;
mod feed;
mod install;
#[cfg(feature = "log-feed")]
pub mod log;
mod notifier;
mod position;
mod privileges;
mod replica;
mod scan;
pub(crate) mod servers;
mod session;
pub(crate) mod store;
mod uninstall;
mod wake;
mod watch;

use std::time::Duration;

use bloom_guard::BloomGuard;
use sqlx::PgPool;

pub(crate) use backend::PgBackend;
pub use connections::warm_pool;
pub use feed::FEED_APPLICATION_NAME;
pub use install::{install, SCHEMA_VERSION, SQL};
#[cfg(feature = "log-feed")]
pub(crate) use log::PgLogBackend;
pub use notifier::NOTIFIER_APPLICATION_NAME;
pub use privileges::grant_runtime;
pub use scan::CopySource;
pub use servers::{Servers, ServersError, TargetSession};
pub use session::check_session;
pub use uninstall::uninstall;
pub use wake::LISTENER_APPLICATION_NAME;

use crate::follow::{follower_api, Engine};
use crate::watch::Watch;

#[doc = include_str!("../follow/protocol.md")]
///
/// # Example
///
/// ```no_run
/// use bloom_guard::BloomGuard;
/// use bloom_guard_sqlx::{postgres, Watch};
///
/// # async fn run(pool: sqlx::PgPool) -> Result<(), bloom_guard_sqlx::FeedError> {
/// let items = Watch::table("items").key("key");
/// bloom_guard_sqlx::postgres::install(&pool).await?; // at migration time
/// items.install(&pool).await?;
///
/// let guard = BloomGuard::builder().expected_items(1_000_000).build();
/// tokio::spawn(postgres::Follower::new(guard.clone(), pool, items).run());
/// # Ok(()) }
/// ```
///
#[doc = include_str!("../../docs/consistency.md")]
pub struct Follower {
    engine: Engine<PgBackend>,
}

follower_api!(Follower);

impl Follower {
    /// A follower for `guard`, holding the keys of `watch`'s table, reading
    /// through `pool`.
    pub fn new(guard: BloomGuard, pool: PgPool, watch: Watch) -> Self {
        let backend = PgBackend::new(&guard, pool, watch);
        Self {
            engine: Engine::new(guard, backend),
        }
    }

    /// Reads the feed on `replica`, a hot standby of the pool's primary:
    /// feed reads, the read barrier's among them, go to the replica, and
    /// count only once it has replayed past the primary's log position
    /// taken after they were asked for (one trivial statement on the
    /// primary per read, shared as reads are); a replica that has not within
    /// [`replica_lag`](Self::replica_lag) leaves the read to the primary,
    /// so a lagging replica never makes the guard refuse a committed key.
    /// Scans, snapshots, heartbeats, wake-ups and the trigger check stay on
    /// the primary.
    ///
    /// # Example
    ///
    /// ```no_run
    /// use bloom_guard::BloomGuard;
    /// use bloom_guard_sqlx::{postgres, Watch};
    ///
    /// # async fn run(primary: sqlx::PgPool, replica: sqlx::PgPool) {
    /// let guard = BloomGuard::builder().expected_items(1_000_000).build();
    /// let follower = postgres::Follower::new(guard, primary, Watch::table("items").key("key"))
    ///     .replica(replica);
    /// tokio::spawn(follower.run());
    /// # }
    /// ```
    #[must_use]
    pub fn replica(mut self, replica: PgPool) -> Self {
        self.engine.backend.replica = Some(replica::Replica::new(replica));
        self
    }

    /// How long a feed read waits for the [`replica`](Self::replica) to
    /// replay past the primary's position before it reads on the primary
    /// (default 100 ms, within the read barrier's bound).
    #[must_use]
    pub fn replica_lag(mut self, bound: Duration) -> Self {
        if let Some(replica) = &mut self.engine.backend.replica {
            replica.max_lag = bound;
        }
        self
    }

    /// How often the one instance elected to wake the others looks for
    /// newly committed changes (default 10 ms): a change reaches every
    /// instance about this long after its commit. One look is one cheap
    /// query on the primary, from one instance of the whole fleet; the
    /// writers' transactions send nothing.
    #[must_use]
    pub fn notify_interval(mut self, every: Duration) -> Self {
        self.engine.backend.notify_interval = every;
        self
    }

    /// The pause after a read that found no changes (default 50 ms):
    /// wake-ups that arrive meanwhile are served by one read, so a NOTIFY
    /// flood from any role costs at most one read per pause. A read that
    /// found changes (real writes) is followed at once.
    #[must_use]
    pub fn min_read_gap(mut self, gap: Duration) -> Self {
        self.engine.schedule.min_read_gap = gap;
        self
    }
}
