//! The public followers' shared API, written once: each is a thin wrapper
//! around the engine, and this macro gives it the engine's knobs, as
//! inherent methods and as the [`Follow`] trait for code generic over the
//! database.

use std::future::Future;
use std::time::Duration;

/// What every follower ([`postgres::Follower`](crate::postgres::Follower),
/// [`sqlite::Follower`](crate::sqlite::Follower)) can be told and do, for code
/// that starts followers whatever the database. Each method is also the
/// follower's own (no import needed); see them there.
///
/// # Example
///
/// ```no_run
/// use std::future::Future;
/// use std::time::Duration;
/// use bloom_guard_sqlx::Follow;
///
/// fn start(follower: impl Follow, shutdown: impl Future<Output = ()> + Send + 'static) {
///     tokio::spawn(follower.poll_interval(Duration::from_millis(500)).run_until(shutdown));
/// }
/// ```
///
#[doc = include_str!("../../docs/snapshots.md")]
pub trait Follow: Sized + Send + 'static {
    /// See [`postgres::Follower::snapshots`](crate::postgres::Follower::snapshots).
    #[must_use]
    fn snapshots(self, enabled: bool) -> Self;
    /// See [`postgres::Follower::snapshot_interval`](crate::postgres::Follower::snapshot_interval).
    #[must_use]
    fn snapshot_interval(self, every: Duration) -> Self;
    /// See [`postgres::Follower::poll_interval`](crate::postgres::Follower::poll_interval).
    #[must_use]
    fn poll_interval(self, every: Duration) -> Self;
    /// See [`postgres::Follower::check_interval`](crate::postgres::Follower::check_interval).
    #[must_use]
    fn check_interval(self, every: Duration) -> Self;
    /// See [`postgres::Follower::retention`](crate::postgres::Follower::retention).
    #[must_use]
    fn retention(self, retention: Duration) -> Self;
    /// See [`postgres::Follower::instance_id`](crate::postgres::Follower::instance_id).
    #[must_use]
    fn instance_id(self, id: impl Into<String>) -> Self;
    /// See [`postgres::Follower::heartbeat_interval`](crate::postgres::Follower::heartbeat_interval).
    #[must_use]
    fn heartbeat_interval(self, every: Duration) -> Self;
    /// See [`postgres::Follower::on_key`](crate::postgres::Follower::on_key).
    #[must_use]
    fn on_key(self, hook: impl Fn(&str) + Send + Sync + 'static) -> Self;
    /// See [`postgres::Follower::on_catch_up`](crate::postgres::Follower::on_catch_up).
    #[must_use]
    fn on_catch_up(self, hook: impl Fn() + Send + Sync + 'static) -> Self;
    /// See [`postgres::Follower::run_until`](crate::postgres::Follower::run_until).
    fn run_until(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> impl Future<Output = ()> + Send + 'static;
}

/// Writes `Debug`, the knobs every backend has, `run` and `run_until` for
/// a follower type with an `engine` field.
macro_rules! follower_api {
    ($follower:ident) => {
        impl std::fmt::Debug for $follower {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                std::fmt::Debug::fmt(&self.engine, f)
            }
        }

        impl $follower {
            /// Whether the guard's filter is shared through snapshots in
            /// the database (default on): at start the newest snapshot is
            /// adopted and completed from the feed instead of scanning;
            /// scans run on one instance at a time, which publishes the
            /// result for the others. Off, every instance scans at start
            /// and on its own schedule.
            ///
            /// Snapshots hold the filter's secret hasher seed: only the
            /// service's role should read the snapshot tables.
            #[must_use]
            pub fn snapshots(mut self, enabled: bool) -> Self {
                self.engine.schedule.snapshots = enabled;
                self
            }

            /// The newest snapshot is republished from the filter in use
            /// when it is older than this (default 10 min) and the filter
            /// read changes worth 1% of its keys (at least 1 000) since, or
            /// once it is half the [`retention`](Self::retention) old, by
            /// one instance, so that an instance starting later replays
            /// little of the feed; an unchanged filter is not written
            /// again. `Duration::ZERO` republishes at every check, changed
            /// or not. Keep it well under the
            /// [`retention`](Self::retention): a snapshot older than the
            /// feed's pruned horizon is refused.
            #[must_use]
            pub fn snapshot_interval(mut self, every: std::time::Duration) -> Self {
                self.engine.schedule.snapshot_interval = every;
                self
            }

            /// How often the feed is read without a wake-up (default 15 s):
            /// the longest a committed key takes to reach the filter and the
            /// [`on_key`](Self::on_key) hooks while wake-ups are lost. They
            /// rarely are: a listener that reconnects reads at once, and a
            /// newly elected Postgres notifier wakes every reader once. A
            /// refusal never waits for it: the read barrier reads the feed
            /// for every would-be refusal (see
            /// [`Builder::read_barrier`](bloom_guard::Builder::read_barrier)).
            #[must_use]
            pub fn poll_interval(mut self, every: std::time::Duration) -> Self {
                self.engine.schedule.poll_interval = every;
                self
            }

            /// How often the feed's triggers are checked, the feed pruned,
            /// newer snapshots looked for and the guard's rebuild schedule
            /// looked at (default 10 s).
            #[must_use]
            pub fn check_interval(mut self, every: std::time::Duration) -> Self {
                self.engine.schedule.check_interval = every;
                self
            }

            /// How long the feed keeps its rows (default 1 h): an instance
            /// that cannot read for longer rebuilds (failing open
            /// meanwhile) instead of catching up from the feed. Scans must
            /// also take less than this.
            #[must_use]
            pub fn retention(mut self, retention: std::time::Duration) -> Self {
                self.engine.schedule.retention = retention;
                self
            }

            /// This instance's name in the guard's fleet view
            /// (`GET /admin/bloom/{guard}/fleet`, [`BloomGuard::fleet`](bloom_guard::BloomGuard::fleet));
            /// default [`host:pid`](bloom_guard::fleet::instance_id). Give each
            /// instance its own: two with one name show as one.
            #[must_use]
            pub fn instance_id(mut self, id: impl Into<String>) -> Self {
                self.engine.schedule.instance_id = id.into();
                self
            }

            /// How often this instance's heartbeat is recorded for the
            /// fleet view (default and at most 10 s: an instance not heard
            /// from for 30 s is taken for stopped), and at once (within a
            /// second) when the guard's state, mode or filter changes. The
            /// fleet's settings are read when a change is announced
            /// (Postgres) or every second (SQLite), whatever this is.
            #[must_use]
            pub fn heartbeat_interval(mut self, every: std::time::Duration) -> Self {
                self.engine.schedule.heartbeat_interval = every;
                self
            }

            /// Called with each key the feed reports added, deleted or
            /// changed away, after new keys are in the guard: drop the
            /// key's cache entry here.
            #[must_use]
            pub fn on_key(mut self, hook: impl Fn(&str) + Send + Sync + 'static) -> Self {
                self.engine.hooks.on_key = Some(std::sync::Arc::new(hook));
                self
            }

            /// Called when changes arrive that name no key one by one (a
            /// table was truncated, a bulk change, a rebuild after the
            /// feed's retention): drop every cache entry here.
            #[must_use]
            pub fn on_catch_up(mut self, hook: impl Fn() + Send + Sync + 'static) -> Self {
                self.engine.hooks.on_catch_up = Some(std::sync::Arc::new(hook));
                self
            }

            /// Builds the guard's first filter and keeps it complete; runs
            /// until dropped.
            pub async fn run(self) {
                self.engine.run_until(std::future::pending()).await;
            }

            /// As [`run`](Self::run), until `shutdown` completes; then
            /// closes its connections cleanly and returns.
            pub async fn run_until(self, shutdown: impl std::future::Future<Output = ()>) {
                self.engine.run_until(shutdown).await;
            }
        }

        impl $crate::Follow for $follower {
            fn snapshots(self, enabled: bool) -> Self {
                $follower::snapshots(self, enabled)
            }
            fn snapshot_interval(self, every: std::time::Duration) -> Self {
                $follower::snapshot_interval(self, every)
            }
            fn poll_interval(self, every: std::time::Duration) -> Self {
                $follower::poll_interval(self, every)
            }
            fn check_interval(self, every: std::time::Duration) -> Self {
                $follower::check_interval(self, every)
            }
            fn retention(self, retention: std::time::Duration) -> Self {
                $follower::retention(self, retention)
            }
            fn instance_id(self, id: impl Into<String>) -> Self {
                $follower::instance_id(self, id)
            }
            fn heartbeat_interval(self, every: std::time::Duration) -> Self {
                $follower::heartbeat_interval(self, every)
            }
            fn on_key(self, hook: impl Fn(&str) + Send + Sync + 'static) -> Self {
                $follower::on_key(self, hook)
            }
            fn on_catch_up(self, hook: impl Fn() + Send + Sync + 'static) -> Self {
                $follower::on_catch_up(self, hook)
            }
            fn run_until(
                self,
                shutdown: impl std::future::Future<Output = ()> + Send + 'static,
            ) -> impl std::future::Future<Output = ()> + Send + 'static {
                self.engine.run_until(shutdown)
            }
        }
    };
}

pub(crate) use follower_api;
