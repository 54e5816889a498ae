//! The change feed on SQLite: row triggers into a feed table, read by row
//! id. SQLite commits one writer at a time, so row ids follow commit order
//! and a reader's position is the last id it read.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bloom_guard::{BloomGuard, FeedStatus, KeyBatch, KeySource};
use futures_util::stream::BoxStream;
use futures_util::TryStreamExt;
use sqlx::sqlite::SqliteConnection;
use sqlx::{AssertSqlSafe, Connection, Row, SqlitePool, TypeInfo, ValueRef};
use tokio::time::sleep;
use tracing::Instrument;

use crate::abort::AbortOnDrop;
use crate::backoff::Backoff;
use crate::batches::{spawn_scan, BatchSender};
use crate::changes::{Changes, Hooks};
use crate::column;
use crate::error::{FeedError, SourceError};
use crate::sqlite_snapshot::{self, BuildLock};
use crate::watch::Watch;

const FEED_TABLE: &str = "
create table if not exists bloom_guard_changes (
    id integer primary key autoincrement,
    guard text not null,
    kind text not null,
    key,
    at integer not null default (cast(strftime('%s', 'now') as integer))
);
create table if not exists bloom_guard_horizon (below integer not null);
insert into bloom_guard_horizon (below) select 0 where not exists (select 1 from bloom_guard_horizon);
";

/// How often a follower looks for a newer snapshot and whether the newest
/// needs republishing.
const SNAPSHOT_CHECK: Duration = Duration::from_secs(10);

/// `"name"` with inner quotes doubled: an SQLite identifier.
fn ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// `'text'` with inner quotes doubled: an SQLite string literal.
fn literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

impl Watch {
    /// The canonical key of row `alias` in SQLite: as for Postgres (see
    /// [`Watch`]), a BLOB left as it is, for the reader to skip.
    fn sqlite_key(&self, alias: &str) -> String {
        let part = |column: &String| format!("{alias}.{}", ident(column));
        match self.key_columns.as_slice() {
            [one] => format!(
                "case typeof({0}) when 'blob' then {0} else cast({0} as text) end",
                part(one)
            ),
            columns => columns
                .iter()
                .map(|c| {
                    format!(
                        "cast(length(cast(cast({0} as text) as blob)) as text) || ':' || cast({0} as text)",
                        part(c)
                    )
                })
                .collect::<Vec<_>>()
                .join(" || "),
        }
    }

    /// Installs the feed's table and this table's triggers in a SQLite
    /// database: every key written by any client (another instance, the
    /// `sqlite3` shell) reaches [`SqliteFollower`]s. Idempotent.
    ///
    /// # Errors
    ///
    /// [`FeedError::Database`] if the table or a column does not exist.
    pub async fn install_sqlite(&self, pool: &SqlitePool) -> Result<(), FeedError> {
        let table = ident(&self.table);
        let name = literal(self.feed_name());
        let trigger = |event: &str| ident(&format!("bloom_guard_{}_{event}", self.feed_name()));
        let (new_key, old_key) = (self.sqlite_key("new"), self.sqlite_key("old"));
        let snapshot_tables = sqlite_snapshot::TABLES;
        let script = format!(
            "{FEED_TABLE}
            {snapshot_tables}
            drop trigger if exists {inserted};
            create trigger {inserted} after insert on {table} when ({new_key}) is not null begin
                insert into bloom_guard_changes (guard, kind, key) values ({name}, 'i', {new_key});
            end;
            drop trigger if exists {updated};
            create trigger {updated} after update on {table} when ({new_key}) is not ({old_key}) begin
                insert into bloom_guard_changes (guard, kind, key)
                select {name}, 'd', {old_key} where ({old_key}) is not null;
                insert into bloom_guard_changes (guard, kind, key)
                select {name}, 'i', {new_key} where ({new_key}) is not null;
            end;
            drop trigger if exists {deleted};
            create trigger {deleted} after delete on {table} when ({old_key}) is not null begin
                insert into bloom_guard_changes (guard, kind, key) values ({name}, 'd', {old_key});
            end;",
            inserted = trigger("inserted"),
            updated = trigger("updated"),
            deleted = trigger("deleted"),
        );
        // Idempotent: a failure half-way is repaired by the next call.
        sqlx::raw_sql(AssertSqlSafe(script)).execute(pool).await?;
        Ok(())
    }

    fn sqlite_key_query(&self) -> String {
        format!(
            "select {} from {} as t",
            self.sqlite_key("t"),
            ident(&self.table)
        )
    }
}

/// The feed's position now: its last row id.
async fn feed_position(pool: &SqlitePool) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("select coalesce(max(id), 0) from bloom_guard_changes")
        .fetch_one(pool)
        .await
}

/// A stored key's bytes: `None` for a BLOB, which no request can name,
/// and for NULL.
fn key_bytes<'r>(value: sqlx::sqlite::SqliteValueRef<'r>) -> Result<Option<&'r [u8]>, sqlx::Error> {
    if value.is_null() || value.type_info().name() == "BLOB" {
        return Ok(None);
    }
    <&[u8] as sqlx::Decode<'_, sqlx::Sqlite>>::decode(value)
        .map(Some)
        .map_err(sqlx::Error::Decode)
}

/// Every key of a watched SQLite table, BLOB keys counted as skipped.
#[derive(Debug, Clone)]
struct SqliteScan {
    pool: SqlitePool,
    query: String,
    count_query: String,
}

impl KeySource for SqliteScan {
    type Error = SourceError;

    async fn count_hint(&self) -> Result<Option<u64>, SourceError> {
        let count: i64 = sqlx::query_scalar(AssertSqlSafe(self.count_query.as_str()))
            .fetch_one(&self.pool)
            .await?;
        Ok(Some(count.max(0) as u64))
    }

    fn keys(&self) -> BoxStream<'static, Result<KeyBatch, SourceError>> {
        let (pool, query) = (self.pool.clone(), self.query.clone());
        spawn_scan(move |batches| async move {
            let mut rows = sqlx::query(AssertSqlSafe(query)).fetch(&pool);
            let mut batch = BatchSender::new_batch();
            while let Some(row) = rows.try_next().await? {
                {
                    let value = row.try_get_raw(0)?;
                    // A NULL key names no row; a BLOB is a key no request names.
                    let null = value.is_null();
                    match key_bytes(value)? {
                        Some(key) => batch.push_text(key),
                        None if null => {}
                        None => batch.skip(),
                    }
                }
                if !batches.send_if_full(&mut batch).await {
                    return Ok(());
                }
            }
            batches.finish(batch).await;
            Ok(())
        })
    }
}

/// Keeps a guard complete on SQLite, whoever writes to the database file:
/// this instance, another one on the same file, the `sqlite3` shell.
///
/// The SQLite twin of [`PgFollower`](crate::PgFollower): it takes the feed's
/// position, warms the guard up, then reads the rows of
/// `bloom_guard_changes` after its position whenever `PRAGMA data_version`
/// (on a connection of its own) says another connection committed, and at
/// least every [`poll_interval`](Self::poll_interval). Needs
/// [`Watch::install_sqlite`] first.
///
/// # Example
///
/// ```no_run
/// use bloom_guard::BloomGuard;
/// use bloom_guard_sqlx::{SqliteFollower, Watch};
///
/// # async fn run(pool: sqlx::SqlitePool) -> Result<(), bloom_guard_sqlx::FeedError> {
/// let items = Watch::table("items").key("key");
/// items.install_sqlite(&pool).await?;
/// let guard = BloomGuard::builder().build();
/// tokio::spawn(SqliteFollower::new(guard.clone(), pool, items).run());
/// # Ok(()) }
/// ```
pub struct SqliteFollower {
    guard: BloomGuard,
    pool: SqlitePool,
    watch: Watch,
    poll_interval: Duration,
    check_every: Duration,
    retention: Duration,
    snapshots: bool,
    snapshot_interval: Duration,
    hooks: Hooks,
}

/// What a SQLite follower knows of the snapshots.
#[derive(Debug, Default)]
struct Lineage {
    fingerprint: String,
    /// When the scan the filter in use descends from started (µs).
    scanned_at: Option<i64>,
    refused: std::collections::HashSet<i64>,
    last_check: Option<tokio::time::Instant>,
}

impl std::fmt::Debug for SqliteFollower {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteFollower")
            .field("watch", &self.watch)
            .field("poll_interval", &self.poll_interval)
            .finish_non_exhaustive()
    }
}

impl SqliteFollower {
    /// A follower for `guard`, holding the keys of `watch`'s table.
    pub fn new(guard: BloomGuard, pool: SqlitePool, watch: Watch) -> Self {
        Self {
            guard,
            pool,
            watch,
            poll_interval: Duration::from_secs(1),
            check_every: Duration::from_millis(20),
            retention: Duration::from_secs(3600),
            snapshots: true,
            snapshot_interval: Duration::from_secs(600),
            hooks: Hooks::default(),
        }
    }

    /// Whether instances sharing the file share the filter through
    /// snapshots in it (default on), as
    /// [`PgFollower::snapshots`](crate::PgFollower::snapshots) does on
    /// Postgres: adopt the newest at start and replay the feed since; scan
    /// on one instance at a time and publish.
    #[must_use]
    pub fn snapshots(mut self, enabled: bool) -> Self {
        self.snapshots = enabled;
        self
    }

    /// The newest snapshot is republished from the filter in use when it
    /// is older than this (default 10 min).
    #[must_use]
    pub fn snapshot_interval(mut self, every: Duration) -> Self {
        self.snapshot_interval = every;
        self
    }

    /// The longest time between two reads of the feed (default 1 s);
    /// commits by other connections are noticed within 20 ms.
    #[must_use]
    pub fn poll_interval(mut self, every: Duration) -> Self {
        self.poll_interval = every;
        self
    }

    /// How long the feed keeps its rows (default 1 h).
    #[must_use]
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }

    /// Called with each key the feed reports added, deleted or changed
    /// away: drop the key's cache entry here.
    #[must_use]
    pub fn on_key(mut self, hook: impl Fn(&str) + Send + Sync + 'static) -> Self {
        self.hooks.on_key = Some(Arc::new(hook));
        self
    }

    /// Called when changes arrive that name no key one by one (a bulk
    /// change, a rebuild after the feed's retention): drop every cache
    /// entry here.
    #[must_use]
    pub fn on_catch_up(mut self, hook: impl Fn() + Send + Sync + 'static) -> Self {
        self.hooks.on_catch_up = Some(Arc::new(hook));
        self
    }

    /// Warms the guard up and keeps it complete; runs until dropped.
    pub async fn run(self) {
        self.run_until(std::future::pending()).await;
    }

    /// As [`run`](Self::run), until `shutdown` completes.
    pub async fn run_until(self, shutdown: impl Future<Output = ()>) {
        let span = tracing::info_span!(
            "bloom_guard_follower",
            guard = self.guard.name(),
            feed = self.watch.feed_name()
        );
        tokio::select! {
            () = shutdown => {}
            () = self.follow().instrument(span) => {}
        }
    }

    async fn follow(&self) {
        let name = self.watch.feed_name().to_owned();
        let query = self.watch.sqlite_key_query();
        let mut lineage = Lineage {
            fingerprint: sqlite_snapshot::fingerprint(&query),
            ..Lineage::default()
        };
        let source = SqliteScan {
            pool: self.pool.clone(),
            count_query: format!("select count(*) from ({query})"),
            query,
        };
        let mut backoff = Backoff::default();
        // The position before the warm-up's scan: the scan has every key
        // committed before it, the feed every key after.
        let mut position: i64 = loop {
            match feed_position(&self.pool).await {
                Ok(position) => break position,
                Err(error) => {
                    tracing::warn!(%error, "cannot read the SQLite change feed; is it installed (Watch::install_sqlite)?");
                    self.guard.report_unavailable(&error);
                    sleep(backoff.next_pause()).await;
                }
            }
        };
        // Before the first filter: a key type that does not fit its column
        // never lets the guard answer.
        let _key_type = match column::sqlite_columns(&self.pool, &self.watch).await {
            Ok(columns) => column::enforce(&self.guard, &self.watch, &columns),
            Err(error) => {
                tracing::warn!(%error, "cannot read the watched key columns' types");
                None
            }
        };
        if self.snapshots {
            self.first_filter(&name, &source, &mut lineage).await;
        }
        let warm_up = tokio::spawn({
            let (guard, source, snapshots) = (self.guard.clone(), source.clone(), self.snapshots);
            async move {
                if !snapshots {
                    guard.warm(source).await;
                }
            }
            .in_current_span()
        });
        let _warm_up = AbortOnDrop(warm_up);
        let mut watcher: Option<(SqliteConnection, i64)> = None;
        let mut total = 0;
        let mut last_read = tokio::time::Instant::now();
        let mut last_prune: Option<tokio::time::Instant> = None;
        loop {
            match self.read(&name, position).await {
                Ok(Some((reached, rows))) => {
                    position = reached;
                    total += rows;
                    self.guard
                        .record_feed_read(FeedStatus::new(position.to_string(), total));
                    last_read = tokio::time::Instant::now();
                }
                Ok(None) => {
                    tracing::warn!(feed = %name, "the SQLite change feed was pruned past this reader; rebuilding");
                    let _hold = self.guard.hold_open();
                    self.hooks.catch_up();
                    if let Ok(reached) = feed_position(&self.pool).await {
                        // Only a rebuild that starts after the position was
                        // taken scans every row committed before it.
                        let since = tokio::time::Instant::now();
                        if self.guard.rebuild_newer_than(&source, since).await.is_ok() {
                            position = reached;
                        }
                    }
                }
                Err(error) => {
                    tracing::debug!(%error, "cannot read the SQLite change feed; retrying");
                    sleep(backoff.next_pause()).await;
                    continue;
                }
            }
            if last_prune.is_none_or(|at| at.elapsed() >= Duration::from_secs(60)) {
                if let Err(error) = self.prune().await {
                    tracing::debug!(%error, "cannot prune the SQLite change feed");
                }
                last_prune = Some(tokio::time::Instant::now());
            }
            if self.snapshots
                && lineage
                    .last_check
                    .is_none_or(|at| at.elapsed() >= SNAPSHOT_CHECK)
            {
                lineage.last_check = Some(tokio::time::Instant::now());
                self.adopt_newer(&name, &mut lineage).await;
                self.republish_if_stale(position, &lineage).await;
            }
            if let Some(reason) = self.guard.rebuild_due() {
                if self.snapshots {
                    self.fleet_rebuild(&name, &source, &mut lineage, reason)
                        .await;
                } else {
                    tracing::info!(reason, "rebuilding the bloom filter");
                    let _ = self.guard.rebuild(&source).await;
                }
            }
            // Wait for another connection's commit, or the interval.
            while last_read.elapsed() < self.poll_interval {
                sleep(self.check_every).await;
                if self.committed_elsewhere(&mut watcher).await {
                    break;
                }
            }
        }
    }

    /// The first filter: the newest usable snapshot, else a scan on one
    /// instance at a time, published for the others.
    async fn first_filter(&self, name: &str, source: &SqliteScan, lineage: &mut Lineage) {
        if self.adopt_newest(name, lineage, |_| true).await {
            return;
        }
        let build_lock = BuildLock::acquire(&self.pool, self.guard.name()).await.ok();
        if build_lock.is_some() && self.adopt_newest(name, lineage, |_| true).await {
            if let Some(build_lock) = build_lock {
                build_lock.release().await;
            }
            return;
        }
        let scanned_at = sqlite_snapshot::now_micros();
        let position = feed_position(&self.pool).await.ok();
        self.guard.clone().warm(source.clone()).await;
        lineage.scanned_at = Some(scanned_at);
        if let Some(position) = position {
            sqlite_snapshot::publish(
                &self.pool,
                &self.guard,
                &lineage.fingerprint,
                position,
                scanned_at,
            )
            .await;
        }
        if let Some(build_lock) = build_lock {
            build_lock.release().await;
        }
    }

    /// Adopts the newest snapshot if `wanted` and not refused before.
    async fn adopt_newest(
        &self,
        name: &str,
        lineage: &mut Lineage,
        wanted: impl Fn(&sqlite_snapshot::Stored) -> bool,
    ) -> bool {
        let stored = match sqlite_snapshot::newest(
            &self.pool,
            self.guard.name(),
            &lineage.fingerprint,
        )
        .await
        {
            Ok(Some(stored)) if wanted(&stored) && !lineage.refused.contains(&stored.id) => stored,
            Ok(_) => return false,
            Err(error) => {
                tracing::debug!(%error, "cannot list the filter's snapshots");
                return false;
            }
        };
        let started = std::time::Instant::now();
        let snapshot = match sqlite_snapshot::load(&self.pool, &stored).await {
            Ok(snapshot) => snapshot,
            Err(sqlite_snapshot::LoadError::Snapshot(error)) => {
                tracing::warn!(snapshot = stored.id, why = %error, "refusing the filter's snapshot; scanning instead");
                lineage.refused.insert(stored.id);
                return false;
            }
            Err(error) => {
                tracing::debug!(%error, "cannot load the filter's snapshot");
                return false;
            }
        };
        let catch_up = async {
            match self.read(name, stored.position).await {
                Ok(Some(_)) => Ok(()),
                Ok(None) => Err(SqliteCatchUpError::Pruned),
                Err(error) => Err(SqliteCatchUpError::Database(error)),
            }
        };
        match self
            .guard
            .adopt(snapshot, &lineage.fingerprint, catch_up)
            .await
        {
            Ok(_) => {
                lineage.scanned_at = Some(stored.scanned_at);
                tracing::info!(
                    snapshot = stored.id,
                    bytes = stored.len,
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "adopted the filter's snapshot and replayed the feed since"
                );
                true
            }
            Err(bloom_guard::AdoptError::CatchUp(error))
                if error
                    .downcast_ref::<SqliteCatchUpError>()
                    .is_some_and(|error| matches!(error, SqliteCatchUpError::Database(_))) =>
            {
                tracing::debug!(%error, "cannot replay the feed since the snapshot");
                false
            }
            Err(error) => {
                tracing::warn!(snapshot = stored.id, why = %error, "refusing the filter's snapshot; scanning instead");
                lineage.refused.insert(stored.id);
                false
            }
        }
    }

    /// Adopts a snapshot from a scan newer than the filter in use's.
    async fn adopt_newer(&self, name: &str, lineage: &mut Lineage) -> bool {
        let Some(ours) = lineage.scanned_at else {
            return false;
        };
        self.adopt_newest(name, lineage, |stored| stored.scanned_at > ours)
            .await
    }

    /// Republishes the filter in use at `position` when the newest snapshot
    /// is older than the interval, on one instance.
    async fn republish_if_stale(&self, position: i64, lineage: &Lineage) {
        let Some(scanned_at) = lineage.scanned_at else {
            return;
        };
        let name = self.guard.name();
        let fresh = match sqlite_snapshot::newest(&self.pool, name, &lineage.fingerprint).await {
            Ok(newest) => newest.is_some_and(|stored| {
                u64::try_from(stored.age_secs)
                    .is_ok_and(|age| age < self.snapshot_interval.as_secs())
            }),
            Err(_) => return,
        };
        if fresh {
            return;
        }
        if let Ok(Some(build_lock)) = BuildLock::try_acquire(&self.pool, name).await {
            sqlite_snapshot::publish(
                &self.pool,
                &self.guard,
                &lineage.fingerprint,
                position,
                scanned_at,
            )
            .await;
            build_lock.release().await;
        }
    }

    /// A rebuild the guard asked for, once for the instances on the file.
    async fn fleet_rebuild(
        &self,
        name: &str,
        source: &SqliteScan,
        lineage: &mut Lineage,
        reason: &str,
    ) {
        let Ok(Some(build_lock)) = BuildLock::try_acquire(&self.pool, self.guard.name()).await
        else {
            return;
        };
        if !self.adopt_newer(name, lineage).await {
            tracing::info!(reason, "rebuilding the bloom filter for every instance");
            let scanned_at = sqlite_snapshot::now_micros();
            if let Ok(position) = feed_position(&self.pool).await {
                let since = tokio::time::Instant::now();
                if self.guard.rebuild_newer_than(source, since).await.is_ok() {
                    lineage.scanned_at = Some(scanned_at);
                    sqlite_snapshot::publish(
                        &self.pool,
                        &self.guard,
                        &lineage.fingerprint,
                        position,
                        scanned_at,
                    )
                    .await;
                }
            }
        }
        build_lock.release().await;
    }

    /// Whether another connection committed since the last call, by
    /// `PRAGMA data_version` on a connection of the watcher's own.
    async fn committed_elsewhere(&self, watcher: &mut Option<(SqliteConnection, i64)>) -> bool {
        if watcher.is_none() {
            let Ok(mut conn) = SqliteConnection::connect_with(&self.pool.connect_options()).await
            else {
                return true;
            };
            let Ok(version) = sqlx::query_scalar::<_, i64>("pragma data_version")
                .fetch_one(&mut conn)
                .await
            else {
                return true;
            };
            *watcher = Some((conn, version));
            return true;
        }
        let Some((conn, seen)) = watcher.as_mut() else {
            return true;
        };
        match sqlx::query_scalar::<_, i64>("pragma data_version")
            .fetch_one(&mut *conn)
            .await
        {
            Ok(version) if version == *seen => false,
            Ok(version) => {
                *seen = version;
                true
            }
            Err(_) => {
                *watcher = None;
                true
            }
        }
    }

    /// Reads the changes after `position`: `None` if some were pruned.
    async fn read(&self, name: &str, position: i64) -> Result<Option<(i64, u64)>, sqlx::Error> {
        let mut rows = sqlx::query(
            "select id, kind, key from bloom_guard_changes where guard = ? and id > ? order by id",
        )
        .bind(name)
        .bind(position)
        .fetch(&self.pool);
        let mut changes = Changes::default();
        let mut reached = position;
        while let Some(row) = rows.try_next().await? {
            reached = row.try_get(0)?;
            let kind: String = row.try_get(1)?;
            changes.record(&kind, key_bytes(row.try_get_raw(2)?)?);
        }
        drop(rows);
        // After the rows: pruning moves the horizon before it deletes, so a
        // read that lost rows to it sees the new horizon here.
        let below: i64 = sqlx::query_scalar("select below from bloom_guard_horizon")
            .fetch_one(&self.pool)
            .await?;
        if position + 1 < below {
            return Ok(None);
        }
        self.hooks.apply(&self.guard, name, &changes);
        Ok(Some((reached, changes.rows)))
    }

    /// Moves the horizon past the rows older than the retention, then
    /// deletes them.
    async fn prune(&self) -> Result<(), sqlx::Error> {
        sqlx::query(
            "update bloom_guard_horizon set below = max(below, coalesce(
                (select max(id) + 1 from bloom_guard_changes where at < cast(strftime('%s', 'now') as integer) - ?), 0))",
        )
        .bind(self.retention.as_secs() as i64)
        .execute(&self.pool)
        .await?;
        sqlx::query(
            "delete from bloom_guard_changes where id < (select below from bloom_guard_horizon)",
        )
        .execute(&self.pool)
        .await?;
        Ok(())
    }
}

/// Why the feed could not complete a snapshot.
#[derive(Debug, thiserror::Error)]
enum SqliteCatchUpError {
    #[error("the snapshot is older than the change feed's pruned horizon")]
    Pruned,
    #[error("cannot read the change feed")]
    Database(#[source] sqlx::Error),
}
