//! What the follower engine takes from a database: small traits by role
//! (`Scans`, `FeedReads`, `FeedUpkeep`, `Checks`, `Wakes`, and `Stores` in
//! `stores.rs`), gathered by `Database`; one implementation of each per
//! database.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bloom_guard::feed::KeyLookup;
use bloom_guard::{KeySource, KeyType};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::error::SourceError;
use crate::follow::changes::Changes;
use crate::follow::column::KeyColumn;
pub(crate) use crate::follow::error::BackendError;
use crate::follow::stores::Stores;
use crate::watch::Watch;

/// Every key of the watched table, and what names that key set.
#[derive(Debug, Clone)]
pub(crate) struct KeySet<S> {
    pub(crate) source: S,
    /// Names the key set: a snapshot of another is not adopted.
    pub(crate) fingerprint: String,
    /// The feed triggers' versions the fingerprint includes: the baseline
    /// of the trigger check.
    pub(crate) trigger_versions: String,
}

/// A feed position, with the database's clock when it was taken.
#[derive(Debug, Clone)]
pub(crate) struct Clock<P> {
    pub(crate) position: P,
    /// Microseconds since the epoch, the database's clock.
    pub(crate) at: i64,
}

/// What the trigger check reads of the catalog.
#[derive(Debug)]
pub(crate) struct Catalog {
    /// See [`Checks::gaps`].
    pub(crate) gaps: Vec<String>,
    /// See [`Checks::trigger_versions`]; `None` if it could not be read.
    pub(crate) versions: Option<String>,
    /// See [`Checks::counts_rows`]; `None` if it could not be read (the
    /// last answer stands).
    pub(crate) counts_rows: Option<bool>,
}

/// The outcome of a read of the feed.
#[derive(Debug)]
pub(crate) enum Read<P> {
    /// What committed after the position, and the position it reached.
    Changes { position: P, changes: Changes },
    /// The feed cannot continue from the position: rows after it were
    /// pruned, or it belongs to another history of the server (a failover
    /// that lost commits, a restore). Only a rebuild catches up.
    Pruned,
}

/// What wakes the engine: a read of the feed, and a look for a snapshot
/// another instance published.
#[derive(Debug, Clone)]
pub(crate) struct WakeUps {
    pub(crate) feed: Arc<Notify>,
    /// A snapshot was published (Postgres and MySQL announce it).
    #[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
    pub(crate) published: Arc<Notify>,
    /// The fleet's stored settings changed (Postgres and MySQL announce it).
    #[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
    pub(crate) settings: Arc<Notify>,
    /// The guard's name: a publication's wake-up carries it.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) guard: String,
}

/// The database side of the follower protocol: what the engine takes from
/// a database, by role. Crate-private, so only this crate's backends
/// implement it; generic, so each call compiles to the backend's own code.
/// A backend implements each role's trait; this one names the watch.
pub(crate) trait Database: Scans + FeedReads + FeedUpkeep + Checks + Wakes {
    /// The tables the fleet shares, and the build lock: the backend itself,
    /// or the one whose tables it shares.
    type Stores: Stores;

    /// See [`Database::Stores`].
    fn stores(&self) -> &Self::Stores;

    /// The watched table and key columns.
    fn watch(&self) -> &Watch;

    /// The feed's name.
    fn feed(&self) -> &str {
        self.watch().feed_name()
    }

    /// How the guard's would-be refusals look their keys up in the watched
    /// table instead of waiting for a feed read ([`KeyLookup`]), for a feed
    /// whose reads for refusals cost more than that statement; `None`
    /// (the default): they wait for feed reads.
    fn key_lookup(
        &self,
        key_type: KeyType,
    ) -> impl Future<Output = Option<Box<dyn KeyLookup>>> + Send {
        let _ = key_type;
        async { None }
    }
}

/// The scan: the key query a build streams, and the key columns' facts.
pub(crate) trait Scans: Send + Sync + Sized + 'static {
    /// Every key of the watched table.
    type Source: KeySource<Error = SourceError> + Clone + Send + Sync + 'static;

    /// The key source, the fingerprint that names its key set, and the
    /// trigger versions that fingerprint was taken under.
    fn key_source(&self)
        -> impl Future<Output = Result<KeySet<Self::Source>, BackendError>> + Send;

    /// The watched key columns, for the key type check.
    fn key_columns(&self) -> impl Future<Output = Result<Vec<KeyColumn>, BackendError>> + Send;

    /// Whether any key of `source` holds a character other than printable
    /// ASCII, tab or a line break (one scan of the key column).
    fn has_unsafe_keys(
        &self,
        source: &Self::Source,
    ) -> impl Future<Output = Result<bool, BackendError>> + Send;
}

/// Reading the change feed: its positions, one read from a position, and
/// the variants the barrier and a shared connection ask for.
pub(crate) trait FeedReads: Send + Sync + Sized + 'static {
    /// A position in the feed: every change committed before it is
    /// behind it.
    type Position: Clone + fmt::Display + fmt::Debug + Send + Sync + 'static;

    /// How soon to read again from `position` however quiet the feed
    /// looks: a position that waits on transactions still open (MySQL's
    /// open ids, whose commit moves no wake-up) is read again soon, not at
    /// the poll interval.
    fn revisit(_position: &Self::Position) -> Option<Duration> {
        None
    }

    /// A position read back from a snapshot.
    fn parse_position(text: &str) -> Option<Self::Position>;

    /// The feed's position now, with the database's clock.
    fn position(&self) -> impl Future<Output = Result<Clock<Self::Position>, BackendError>> + Send;

    /// The changes committed after `since`, a position that may be far
    /// behind (a snapshot's or a scan's, at a catch-up): where the database
    /// plans a statement for its parameters, planned for this one.
    fn read_behind(
        &self,
        since: &Self::Position,
    ) -> impl Future<Output = Result<Read<Self::Position>, BackendError>> + Send {
        self.read(since)
    }

    /// Whether a read no refusal waits for skips what makes a read exact
    /// ([`read_unwaited`](Self::read_unwaited)): such reads go on no
    /// refusal. False: every read is exact, and may go on refusals.
    const UNWAITED_READS_ARE_CHEAPER: bool = false;

    /// The changes committed after `since` as far as they are written,
    /// for a read no refusal waits for (the log feed: without waiting for
    /// its producer to reach the log's position).
    fn read_unwaited(
        &self,
        since: &Self::Position,
    ) -> impl Future<Output = Result<Read<Self::Position>, BackendError>> + Send {
        self.read(since)
    }

    /// Names the database (and role) this backend reads its feed from,
    /// where one statement can read the feeds of several guards
    /// ([`read_together`](Self::read_together)): the followers of one
    /// instance on one database then share a read when refusals of several
    /// guards wait. `None`: each follower reads its own feed.
    fn shared_reads(&self) -> Option<String> {
        None
    }

    /// The changes committed after each position of `reads`, feeds of
    /// followers on the database [`shared_reads`](Self::shared_reads)
    /// names, in one statement on the first's connection; in the order of
    /// `reads`. Each takes its snapshot after the call.
    fn read_together(
        reads: &[(&Self, &Self::Position)],
    ) -> impl Future<Output = Result<Vec<Read<Self::Position>>, BackendError>> + Send {
        async move {
            let mut all = Vec::with_capacity(reads.len());
            for (backend, since) in reads {
                all.push(backend.read(since).await?);
            }
            Ok(all)
        }
    }

    /// The changes committed after `since`, exactly: a read refusals
    /// that arrived before it began may go on by.
    fn read(
        &self,
        since: &Self::Position,
    ) -> impl Future<Output = Result<Read<Self::Position>, BackendError>> + Send;
}

/// The feed's room: how far a reader is behind, pruning, its size.
pub(crate) trait FeedUpkeep: FeedReads {
    /// How many feed rows committed after `since`, counting up to `limit`
    /// only: a bounded look at what a replay from there would read.
    fn pending(
        &self,
        since: &Self::Position,
        limit: u64,
    ) -> impl Future<Output = Result<u64, BackendError>> + Send;

    /// Removes the changes every reader has had for `retention`, on one
    /// instance at a time; how many.
    fn prune(&self, retention: Duration) -> impl Future<Output = Result<i64, BackendError>> + Send;

    /// The feed's room in the database and how late its pruning is, for
    /// the metrics; `None` where the feed cannot tell.
    fn storage(
        &self,
        retention: Duration,
    ) -> impl Future<Output = Result<Option<bloom_guard::stats::FeedStorage>, BackendError>> + Send
    {
        let _ = retention;
        async { Ok(None) }
    }
}

/// The checks a follower runs on its database: the session, the feed's
/// catalog (gaps, trigger versions, row counting) and its repair.
pub(crate) trait Checks: Send + Sync + Sized + 'static {
    /// Whether the follower's connections keep their sessions (no pooler in
    /// transaction mode between): checked once at start; an error stops
    /// the follower, since only a setting can fix it.
    fn check_session(&self) -> impl Future<Output = Result<(), crate::error::FeedError>> + Send {
        async { Ok(()) }
    }

    /// Why writes to a watched table could bypass the feed (missing or
    /// disabled triggers, the feed not installed); empty when none.
    fn gaps(&self) -> impl Future<Output = Result<Vec<String>, BackendError>> + Send;

    /// Whether the feed's triggers record one feed row per table row (so a
    /// counting filter may remove a key for each deleted row); `false` for
    /// functions an earlier schema version wrote.
    fn counts_rows(&self) -> impl Future<Output = Result<bool, BackendError>> + Send {
        async { Ok(true) }
    }

    /// The trigger check's answers: [`gaps`](Self::gaps),
    /// [`trigger_versions`](Self::trigger_versions) and
    /// [`counts_rows`](Self::counts_rows), in one round trip where the
    /// backend can (an idle instance checks every guard every interval).
    fn catalog(&self) -> impl Future<Output = Result<Catalog, BackendError>> + Send {
        async {
            Ok(Catalog {
                gaps: self.gaps().await?,
                versions: self.trigger_versions().await.ok(),
                counts_rows: self.counts_rows().await.ok(),
            })
        }
    }

    /// Puts the feed's triggers on the table the key query reads now, if
    /// it is not watched (a table swapped, recreated or shadowed; on SQLite
    /// one rebuilt, which drops its triggers) and the connection may; true
    /// if it did. The gap stays until the next check finds it repaired,
    /// and a rebuild follows.
    fn repair(&self) -> impl Future<Output = Result<bool, BackendError>> + Send;

    /// The watched tables' identities and their feed triggers' row
    /// versions: it changes when a table is recreated or a trigger altered
    /// (disabled and enabled again, even within one transaction), when
    /// writes may have bypassed the feed although no gap shows now.
    fn trigger_versions(&self) -> impl Future<Output = Result<String, BackendError>> + Send;
}

/// What wakes a follower: the database's announcements of changes,
/// snapshots and settings, and closing its connections.
pub(crate) trait Wakes: Send + Sync + Sized + 'static {
    /// Whether changes of the fleet's stored settings and publications of
    /// snapshots wake every follower ([`WakeUps::settings`],
    /// [`WakeUps::published`]); if not, followers look for them on their
    /// intervals.
    fn announces_changes(&self) -> bool {
        false
    }

    /// Wakes the engine until `stop`: on every commit that may concern
    /// the feed, and when another instance publishes a snapshot.
    fn wake_ups(
        &self,
        wake: WakeUps,
        stop: CancellationToken,
    ) -> impl Future<Output = ()> + Send + 'static;

    /// Closes the connections the backend keeps of its own (the follower
    /// stopped).
    fn close(&self) -> impl Future<Output = ()> + Send {
        async {}
    }
}
