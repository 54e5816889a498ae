//! An in-memory backend, to test the protocol's order without a database.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bloom_guard::{
    keys::KeyBatch,
    snapshot::{Snapshot, SnapshotReader, SnapshotWriter},
    BloomGuard, KeySource,
};
use futures_util::stream::{self, BoxStream, StreamExt};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::{
    BackendError, Checks, Clock, Database, Engine, FeedReads, FeedUpkeep, FleetTable, KeySet,
    LoadError, Read, Scans, SnapshotStore, Stored, Stores, WakeUps, Wakes,
};
use crate::error::SourceError;
use crate::follow::changes::Changes;
use crate::follow::column::KeyColumn;
use crate::lock::lock;
use crate::watch::Watch;

/// The feed entry of a resync.
const RESYNC: &str = "\0resync";

/// A table, its feed (position = the number of changes committed), its
/// snapshots and its build lock, with a log of what the engine did.
#[derive(Clone)]
struct Fake {
    db: Arc<Db>,
    watch: Watch,
}

#[derive(Default)]
struct Db {
    state: Mutex<State>,
    /// Commits that wake the engine.
    commits: Notify,
    /// Lets a paused scan go on.
    resume_scans: Notify,
    /// Lets a held position be taken.
    resume_positions: Notify,
}

#[derive(Default)]
struct State {
    /// The fleet's stored mode and audit rate.
    settings: (Option<String>, Option<f64>),
    /// The fleet's heartbeats, by instance.
    instances: std::collections::BTreeMap<String, String>,
    table: BTreeSet<String>,
    feed: Vec<String>,
    /// Changes below this position were pruned.
    horizon: usize,
    snapshots: Vec<(Vec<u8>, i64)>,
    lock_held: bool,
    pause_scans: bool,
    /// Positions wait for `resume_positions` while set.
    hold_positions: bool,
    events: Vec<&'static str>,
    reads: usize,
    /// Reads fail while set: the database is unreachable.
    unreachable: bool,
    loads: usize,
    scans: usize,
    clock: i64,
}

impl Fake {
    fn new() -> Self {
        Self {
            db: Arc::default(),
            watch: Watch::table("items").key("key"),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        lock(&self.db.state)
    }

    /// Commits a row with `key` without waking the engine: another
    /// instance's write, before any wake-up reaches this one.
    fn commit_quietly(&self, key: &str) {
        let mut state = self.state();
        state.table.insert(key.to_owned());
        state.feed.push(key.to_owned());
    }

    /// Records writes the feed could not hold (a resync), and wakes the
    /// engine: every instance rebuilds.
    fn resync(&self) {
        self.state().feed.push(RESYNC.to_owned());
        self.db.commits.notify_one();
    }

    /// Commits a row with `key`, and wakes the engine.
    fn commit(&self, key: &str) {
        let mut state = self.state();
        state.table.insert(key.to_owned());
        state.feed.push(key.to_owned());
        drop(state);
        self.db.commits.notify_one();
    }
}

/// The table's keys as of the moment the scan starts.
#[derive(Clone)]
struct Scan(Fake);

impl KeySource for Scan {
    type Error = SourceError;

    async fn count_hint(&self) -> Result<Option<u64>, SourceError> {
        Ok(Some(self.0.state().table.len() as u64))
    }

    fn keys(&self) -> BoxStream<'static, Result<KeyBatch, SourceError>> {
        let mut state = self.0.state();
        state.events.push("scan");
        state.scans += 1;
        let mut keys: KeyBatch = state.table.iter().map(String::as_str).collect();
        keys.set_position(state.feed.len().to_string());
        let pause = state.pause_scans;
        drop(state);
        let db = Arc::clone(&self.0.db);
        stream::once(async move {
            if pause {
                db.resume_scans.notified().await;
            }
            Ok(keys)
        })
        .boxed()
    }
}

/// The build lock, free again when dropped.
struct FakeLock(Arc<Db>);

impl Drop for FakeLock {
    fn drop(&mut self) {
        lock(&self.0.state).lock_held = false;
    }
}

impl Database for Fake {
    type Stores = Self;

    fn stores(&self) -> &Self {
        self
    }

    fn watch(&self) -> &Watch {
        &self.watch
    }
}

impl Scans for Fake {
    type Source = Scan;

    async fn key_source(&self) -> Result<KeySet<Scan>, BackendError> {
        Ok(KeySet {
            source: Scan(self.clone()),
            fingerprint: "fingerprint".to_owned(),
            trigger_versions: String::new(),
        })
    }

    async fn key_columns(&self) -> Result<Vec<KeyColumn>, BackendError> {
        Ok(Vec::new())
    }

    async fn has_unsafe_keys(&self, _: &Scan) -> Result<bool, BackendError> {
        Ok(false)
    }
}

impl FeedReads for Fake {
    type Position = usize;

    fn parse_position(text: &str) -> Option<usize> {
        text.parse().ok()
    }

    async fn position(&self) -> Result<Clock<usize>, BackendError> {
        while self.state().hold_positions {
            let resumed = self.db.resume_positions.notified();
            if !self.state().hold_positions {
                break;
            }
            resumed.await;
        }
        let mut state = self.state();
        state.events.push("position");
        state.clock += 1;
        Ok(Clock {
            position: state.feed.len(),
            at: state.clock,
        })
    }

    async fn read(&self, since: &usize) -> Result<Read<usize>, BackendError> {
        let mut state = self.state();
        state.reads += 1;
        if state.unreachable {
            return Err(sqlx::Error::PoolTimedOut.into());
        }
        if *since < state.horizon {
            return Ok(Read::Pruned);
        }
        let mut changes = Changes::default();
        for key in &state.feed[*since..] {
            if key == RESYNC {
                changes.record("r", None);
            } else {
                changes.record("i", Some(key.as_bytes()));
            }
        }
        Ok(Read::Changes {
            position: state.feed.len(),
            changes,
        })
    }
}

impl FeedUpkeep for Fake {
    async fn pending(&self, since: &usize, limit: u64) -> Result<u64, BackendError> {
        let state = self.state();
        Ok((state.feed.len().saturating_sub(*since) as u64).min(limit))
    }

    async fn prune(&self, _: Duration) -> Result<i64, BackendError> {
        Ok(0)
    }
}

impl Checks for Fake {
    async fn gaps(&self) -> Result<Vec<String>, BackendError> {
        Ok(Vec::new())
    }

    async fn repair(&self) -> Result<bool, BackendError> {
        Ok(false)
    }

    async fn trigger_versions(&self) -> Result<String, BackendError> {
        Ok(String::new())
    }
}

impl Wakes for Fake {
    fn wake_ups(
        &self,
        wake: WakeUps,
        stop: CancellationToken,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let db = Arc::clone(&self.db);
        async move {
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = db.commits.notified() => wake.feed.notify_one(),
                }
            }
        }
    }
}

impl Stores for Fake {
    type Lock = FakeLock;
    type Snapshots = Fake;
    type Fleet = Fake;

    fn snapshots(&self) -> &Fake {
        self
    }

    fn fleet(&self) -> &Fake {
        self
    }

    async fn lock(&self, guard: &str) -> Result<FakeLock, BackendError> {
        loop {
            if let Some(lock) = self.try_lock(guard).await? {
                return Ok(lock);
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    async fn try_lock(&self, _: &str) -> Result<Option<FakeLock>, BackendError> {
        let mut state = self.state();
        if state.lock_held {
            return Ok(None);
        }
        state.lock_held = true;
        Ok(Some(FakeLock(Arc::clone(&self.db))))
    }
}

impl FleetTable for Fake {
    async fn settings(&self, _: &str) -> Result<(Option<String>, Option<f64>), sqlx::Error> {
        Ok(self.state().settings.clone())
    }

    async fn store(
        &self,
        _: &str,
        mode: Option<&'static str>,
        audit_rate: Option<f64>,
    ) -> Result<(), sqlx::Error> {
        let mut state = self.state();
        if let Some(mode) = mode {
            state.settings.0 = Some(mode.to_owned());
        }
        if let Some(rate) = audit_rate {
            state.settings.1 = Some(rate);
        }
        Ok(())
    }

    async fn reset(&self, _: &str) -> Result<(), sqlx::Error> {
        self.state().settings = (None, None);
        Ok(())
    }

    async fn beat(&self, _: &str, id: &str, report: String) -> Result<(), sqlx::Error> {
        self.state().instances.insert(id.to_owned(), report);
        Ok(())
    }

    async fn instances(&self, _: &str) -> Result<Vec<(String, i64)>, sqlx::Error> {
        Ok(self
            .state()
            .instances
            .values()
            .map(|report| (report.clone(), 0))
            .collect())
    }

    async fn leave(&self, _: &str, id: &str) -> Result<(), sqlx::Error> {
        self.state().instances.remove(id);
        Ok(())
    }
}

impl SnapshotStore for Fake {
    async fn newest(&self, _: &str, _: &str) -> Result<Option<Stored>, sqlx::Error> {
        let state = self.state();
        Ok(state.snapshots.last().map(|(bytes, scanned_at)| Stored {
            id: state.snapshots.len() as i64,
            len: bytes.len() as i64,
            scanned_at: *scanned_at,
            age_secs: 0.0,
        }))
    }

    async fn load(&self, stored: &Stored) -> Result<Snapshot, LoadError> {
        let mut state = self.state();
        state.loads += 1;
        state.events.push("load");
        let (bytes, _) = &state.snapshots[stored.id as usize - 1];
        let mut reader = SnapshotReader::new(bytes.len() as u64);
        reader.push(bytes)?;
        Ok(reader.finish()?)
    }

    async fn publish(&self, writer: SnapshotWriter, scanned_at: i64) -> Result<i64, sqlx::Error> {
        let bytes = writer.chunks(1 << 20).flatten().collect();
        let mut state = self.state();
        state.snapshots.push((bytes, scanned_at));
        Ok(state.snapshots.len() as i64)
    }
}

/// A follower over `fake`, quick to check, running until dropped.
struct Running {
    guard: BloomGuard,
    _stop: tokio::sync::oneshot::Sender<()>,
}

fn run(fake: &Fake, snapshots: bool) -> Running {
    run_guard(fake, snapshots, BloomGuard::builder().name("items").build())
}

fn run_guard(fake: &Fake, snapshots: bool, guard: BloomGuard) -> Running {
    let mut engine = Engine::new(guard.clone(), fake.clone());
    engine.schedule.snapshots = snapshots;
    engine.schedule.check_interval = Duration::from_millis(10);
    engine.schedule.poll_interval = Duration::from_secs(5);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(engine.run_until(async move {
        let _ = stopped.await;
    }));
    Running { guard, _stop: stop }
}

async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !done() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

#[tokio::test]
async fn the_position_is_taken_before_the_scan() {
    let fake = Fake::new();
    fake.commit("a");
    let follower = run(&fake, false);
    until("ready", || follower.guard.is_ready()).await;
    let events = fake.state().events.clone();
    assert_eq!(&events[..2], ["position", "scan"], "{events:?}");
}

#[tokio::test]
async fn a_change_committed_during_a_scan_is_in_the_new_filter() {
    let fake = Fake::new();
    fake.commit("before");
    fake.state().pause_scans = true;
    let follower = run(&fake, false);
    until("the scan", || fake.state().scans == 1).await;
    // Committed after the scan's snapshot: only the feed brings it.
    let reads = fake.state().reads;
    fake.commit("during");
    until("a read", || fake.state().reads > reads).await;
    fake.db.resume_scans.notify_one();
    until("ready", || follower.guard.is_ready()).await;
    assert!(follower.guard.may_contain("before"));
    assert!(follower.guard.may_contain("during"));
    assert!(!follower.guard.may_contain("never"));
}

#[tokio::test]
async fn a_snapshot_refused_once_is_not_retried() {
    let fake = Fake::new();
    fake.commit("a");
    // Damaged, and from a scan newer than any: wanted at every check.
    fake.state()
        .snapshots
        .push((b"not a snapshot".to_vec(), i64::MAX));
    let follower = run(&fake, true);
    until("ready", || follower.guard.is_ready()).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let state = fake.state();
    assert_eq!(state.loads, 1, "the refused snapshot was loaded again");
    assert_eq!(state.scans, 1);
}

/// A resync: the follower rebuilds, and is ready once that scan has the
/// writes; the number of scans then, and the fleet's clock before it.
async fn resynced(fake: &Fake, follower: &Running) -> (usize, i64) {
    let (scans, before) = {
        // Time passes: a scan of another instance's now would be newer
        // than this one's first.
        let mut state = fake.state();
        state.clock += 1;
        (state.scans, state.clock)
    };
    fake.resync();
    until("the rebuild after the resync", || {
        fake.state().scans > scans
            && follower.guard.stats().state == bloom_guard::stats::GuardState::Ready
    })
    .await;
    (fake.state().scans, before)
}

#[tokio::test]
async fn a_rebuild_for_a_resync_makes_older_snapshots_no_newer() {
    let fake = Fake::new();
    fake.commit("a");
    let follower = run(&fake, true);
    until("ready", || follower.guard.is_ready()).await;
    let published = fake.state().snapshots[0].0.clone();
    let (scans, before) = resynced(&fake, &follower).await;
    // Published by another instance from a scan before the resync (newer
    // than this instance's first): the rebuild is newer still.
    fake.state().snapshots.push((published, before));
    let loads = fake.state().loads;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let state = fake.state();
    assert_eq!(
        state.loads, loads,
        "a snapshot older than the rebuild was loaded"
    );
    assert_eq!(state.scans, scans);
}

#[tokio::test]
async fn a_snapshot_refused_for_a_resync_after_it_does_not_hold_the_guard_open() {
    let fake = Fake::new();
    fake.commit("a");
    let follower = run(&fake, true);
    until("ready", || follower.guard.is_ready()).await;
    let published = fake.state().snapshots[0].0.clone();
    let (scans, _) = resynced(&fake, &follower).await;
    // Newer than any scan, at the position before the resync: its replay
    // meets the resync, and it is refused. The filter in use was built
    // after the resync and stays as it is.
    let loads = fake.state().loads;
    fake.state().snapshots.push((published, i64::MAX));
    until("the snapshot's load", || fake.state().loads > loads).await;
    let deadline = tokio::time::Instant::now() + Duration::from_millis(100);
    while tokio::time::Instant::now() < deadline {
        assert_eq!(
            follower.guard.stats().state,
            bloom_guard::stats::GuardState::Ready
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(fake.state().scans, scans, "the guard rebuilt again");
}

#[tokio::test]
async fn a_published_snapshot_is_adopted_instead_of_a_scan() {
    let fake = Fake::new();
    fake.commit("a");
    let first = run(&fake, true);
    until("ready", || first.guard.is_ready()).await;
    fake.commit("after-the-snapshot");
    let second = run(&fake, true);
    until("ready", || second.guard.is_ready()).await;
    assert_eq!(fake.state().scans, 1, "the second follower scanned");
    assert!(second.guard.may_contain("a") && second.guard.may_contain("after-the-snapshot"));
}

#[tokio::test]
async fn a_start_reads_the_snapshot_while_its_position_is_taken_and_adopts_it() {
    let fake = Fake::new();
    fake.commit("a");
    let first = run(&fake, true);
    until("ready", || first.guard.is_ready()).await;
    fake.commit("after-the-snapshot");
    fake.state().hold_positions = true;
    let second = run(&fake, true);
    until("the snapshot read", || fake.state().loads == 1).await;
    assert!(
        !second.guard.is_ready(),
        "adopted before the start's position"
    );
    fake.state().hold_positions = false;
    fake.db.resume_positions.notify_waiters();
    until("ready", || second.guard.is_ready()).await;
    let state = fake.state();
    assert_eq!(
        (state.loads, state.scans),
        (1, 1),
        "the snapshot read twice, or scanned"
    );
    assert!(second.guard.may_contain("a") && second.guard.may_contain("after-the-snapshot"));
}

#[tokio::test]
async fn a_snapshot_with_a_feed_longer_than_a_scan_is_not_replayed() {
    let fake = Fake::new();
    fake.commit("a");
    let first = run(&fake, true);
    until("ready", || first.guard.is_ready()).await;
    drop(first);
    // A bulk load after the snapshot: more feed rows than a replay is
    // worth (a scan of 50 001 keys beats replaying 50 000 rows).
    {
        let mut state = fake.state();
        for i in 0..50_000 {
            let key = format!("bulk-{i}");
            state.table.insert(key.clone());
            state.feed.push(key);
        }
    }
    let second = run(&fake, true);
    until("ready", || second.guard.is_ready()).await;
    let stats = second.guard.stats();
    assert_eq!(
        stats.origin,
        Some(bloom_guard::stats::FilterOrigin::Scan),
        "{stats:?}"
    );
    assert_eq!((fake.state().scans, stats.generation), (2, 1));
    assert!(second.guard.may_contain("bulk-49999") && !second.guard.may_contain("never"));
}

#[tokio::test]
async fn a_snapshot_published_between_a_reads_keys_and_its_position_has_them() {
    let fake = Fake::new();
    fake.commit("a");
    let guard = BloomGuard::builder().name("items").build();
    let mut engine = Engine::new(guard.clone(), fake.clone());
    engine.schedule.check_interval = Duration::from_millis(5);
    engine.schedule.poll_interval = Duration::from_millis(5);
    // Republished at every check.
    engine.schedule.snapshot_interval = Duration::ZERO;
    let pause = Arc::new((Notify::new(), Notify::new()));
    engine.between_keys_and_position = Some(Arc::clone(&pause));
    let (_stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(engine.run_until(async move {
        let _ = stopped.await;
    }));
    until("ready", || guard.is_ready()).await;
    fake.commit("b");
    pause.0.notified().await;
    // Paused between the two steps: snapshots published now must complete
    // to "b", from their bits or from their position's replay.
    let published = fake.state().snapshots.len();
    until("a snapshot published in the pause", || {
        fake.state().snapshots.len() > published
    })
    .await;
    let second = run(&fake, true);
    until("the adoption", || second.guard.is_ready()).await;
    let (loads, scans) = {
        let state = fake.state();
        (state.loads, state.scans)
    };
    assert_eq!(
        second.guard.stats().origin,
        Some(bloom_guard::stats::FilterOrigin::Snapshot),
        "loads {loads} scans {scans}"
    );
    assert!(second.guard.may_contain("b"));
    pause.1.notify_one();
}

#[tokio::test]
async fn a_reader_behind_the_horizon_rebuilds() {
    let fake = Fake::new();
    fake.commit("a");
    let follower = run(&fake, false);
    until("ready", || follower.guard.is_ready()).await;
    {
        let mut state = fake.state();
        state.horizon = state.feed.len() + 1;
    }
    fake.commit("b");
    until("a second scan", || fake.state().scans == 2).await;
    until("ready again", || {
        follower.guard.stats().state == bloom_guard::stats::GuardState::Ready
    })
    .await;
    assert!(follower.guard.may_contain("b"));
}

#[tokio::test]
async fn wake_ups_are_coalesced() {
    let fake = Fake::new();
    let follower = run(&fake, false);
    until("ready", || follower.guard.is_ready()).await;
    let reads = fake.state().reads;
    for _ in 0..10_000 {
        fake.db.commits.notify_one();
        tokio::task::yield_now().await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let more = fake.state().reads - reads;
    // One read per gap (50 ms) at most, however many wake-ups.
    assert!(more <= 10, "{more} reads for 10 000 wake-ups");
}

#[tokio::test]
async fn the_fleet_lock_is_released_on_drop() {
    let fake = Fake::new();
    fake.state().pause_scans = true;
    let follower = run(&fake, true);
    until("the scan under the lock", || {
        let state = fake.state();
        state.scans == 1 && state.lock_held
    })
    .await;
    drop(follower);
    until("the lock released", || !fake.state().lock_held).await;
}

/// The status of `GET /items/{key}` through `guard` in front of a handler
/// that finds every key.
async fn status(guard: &BloomGuard, key: &str) -> http::StatusCode {
    use tower::ServiceExt as _;
    let app = axum::Router::new()
        .route("/items/{key}", axum::routing::get(|| async { "an item" }))
        .route_layer(guard.layer(bloom_guard::extract::PathParam("key")));
    let request = http::Request::get(format!("/items/{key}"))
        .body(axum::body::Body::empty())
        .expect("a request");
    app.oneshot(request).await.expect("infallible").status()
}

#[tokio::test]
async fn a_key_committed_before_the_request_is_never_refused() {
    let fake = Fake::new();
    let follower = run(&fake, false);
    until("ready", || follower.guard.is_ready()).await;
    for i in 0..200 {
        let key = format!("elsewhere-{i}");
        fake.commit_quietly(&key);
        assert_eq!(
            status(&follower.guard, &key).await,
            http::StatusCode::OK,
            "{key} refused"
        );
    }
    let stats = follower.guard.stats();
    assert_eq!(
        (stats.barrier_waits, stats.barrier_found, stats.rejected),
        (200, 200, 0)
    );
    assert_eq!(
        status(&follower.guard, "absent").await,
        http::StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn without_the_barrier_a_key_committed_elsewhere_is_refused_until_read() {
    let fake = Fake::new();
    let guard = BloomGuard::builder()
        .name("items")
        .read_barrier(false)
        .build();
    let follower = run_guard(&fake, false, guard);
    until("ready", || follower.guard.is_ready()).await;
    fake.commit_quietly("elsewhere");
    assert_eq!(
        status(&follower.guard, "elsewhere").await,
        http::StatusCode::NOT_FOUND
    );
    assert_eq!(follower.guard.stats().barrier_waits, 0);
}

#[tokio::test]
async fn a_flood_of_absent_keys_shares_reads() {
    let fake = Fake::new();
    let follower = run(&fake, false);
    until("ready", || follower.guard.is_ready()).await;
    let reads = fake.state().reads;
    let requests: Vec<_> = (0..2_000)
        .map(|i| {
            let guard = follower.guard.clone();
            tokio::spawn(async move { status(&guard, &format!("absent-{i}")).await })
        })
        .collect();
    for request in requests {
        assert_eq!(
            request.await.expect("the request runs"),
            http::StatusCode::NOT_FOUND
        );
    }
    let more = fake.state().reads - reads;
    // One read per 56 waiting refusals (the default pace), or per 12 ms,
    // not one per key.
    assert!(more <= 50, "{more} reads for 2 000 absent keys");
    assert_eq!(follower.guard.stats().rejected, 2_000);
}

#[tokio::test]
async fn an_unreachable_database_sends_refusals_on_after_the_bound() {
    let fake = Fake::new();
    let guard = BloomGuard::builder()
        .name("items")
        .read_barrier_timeout(Duration::from_millis(50))
        .build();
    let follower = run_guard(&fake, false, guard);
    until("ready", || follower.guard.is_ready()).await;
    fake.state().unreachable = true;
    fake.commit_quietly("written-while-down");
    // The filter is stale and no read can say so: nothing is refused.
    assert_eq!(
        status(&follower.guard, "written-while-down").await,
        http::StatusCode::OK
    );
    assert_eq!(
        status(&follower.guard, "absent").await,
        http::StatusCode::OK
    );
    let stats = follower.guard.stats();
    assert_eq!((stats.barrier_timeouts, stats.rejected), (2, 0));
    // Back: once the follower's retry reads again, absent keys are refused.
    fake.state().unreachable = false;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while status(&follower.guard, "absent").await != http::StatusCode::NOT_FOUND {
        assert!(
            tokio::time::Instant::now() < deadline,
            "never refused again"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn shadow_mode_counts_only_what_enforce_mode_would_refuse() {
    let fake = Fake::new();
    let guard = BloomGuard::builder()
        .name("items")
        .mode(bloom_guard::Mode::Shadow)
        .rebuild_on_false_negative(false)
        .build();
    let follower = run_guard(&fake, false, guard);
    until("ready", || follower.guard.is_ready()).await;
    // Committed elsewhere a moment before: enforce mode would wait for the
    // next read and serve it, so it is no false negative.
    fake.commit_quietly("elsewhere");
    assert_eq!(
        status(&follower.guard, "elsewhere").await,
        http::StatusCode::OK
    );
    // In the table but in no feed (written with the triggers off): a real
    // false negative.
    fake.state().table.insert("unrecorded".to_owned());
    assert_eq!(
        status(&follower.guard, "unrecorded").await,
        http::StatusCode::OK
    );
    until("the checks", || {
        follower.guard.stats().shadow_false_negatives > 0
    })
    .await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let stats = follower.guard.stats();
    assert_eq!(
        (stats.shadow_would_reject, stats.shadow_false_negatives),
        (2, 1)
    );
}
