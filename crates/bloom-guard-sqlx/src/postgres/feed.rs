//! Reading the Postgres change feed by snapshot visibility.
//!
//! A position is a snapshot (`pg_snapshot` as text). The changes after
//! position `seen` are the rows of transactions that `seen` did not see
//! and the reading statement does: exactly those that committed in
//! between, whatever their commit order. Rows of transactions still running
//! come in a later read.

use std::time::Duration;

use futures_util::TryStreamExt;
use sqlx::{PgConnection, PgPool, Row, ValueRef};

use crate::follow::changes::Changes;
use crate::follow::Read;
use crate::kept::KeptConnection;

/// The changes read and the feed's snapshot after them, in one statement:
/// `pg_current_snapshot()` is the statement's own snapshot, taken after the
/// locks it waited for only under READ COMMITTED, which it reports. Keys travel as
/// UTF-8 bytes (`bytea`, which no client encoding refuses), or as stored in
/// a SQL_ASCII database, which has no encoding to convert from; `$3`:
/// [`lowered`].
static READ: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| READ_STATEMENT.replace("LOWERED", &lowered("c.key")));

const READ_STATEMENT: &str = "
with now as (
    select pg_catalog.pg_current_snapshot() as snapshot,
           pg_catalog.pg_snapshot_xmin($2::pg_snapshot) < (select below from bloom_guard.horizon) as pruned,
           case pg_catalog.current_setting('server_encoding') when 'SQL_ASCII' then 'SQL_ASCII' else 'UTF8' end as encoding,
           pg_catalog.current_setting('transaction_isolation') as isolation
)
select now.snapshot::text, now.pruned, c.kind::text,
       pg_catalog.convert_to(case when $3 then LOWERED else c.key end, now.encoding), now.isolation
from now left join bloom_guard.changes c
  on c.guard = $1
 and not now.pruned
 and c.xid >= pg_catalog.pg_snapshot_xmin($2::pg_snapshot)
 and not pg_catalog.pg_visible_in_snapshot(c.xid, $2::pg_snapshot)";

/// A key of a case-insensitive guard as the database lowers it, where it
/// has characters other than ASCII (ASCII keys as they are: the guard
/// lowers those itself, and a Turkish locale lowers `I` otherwise): the
/// form `citext` compares, so a stored key with any characters is held
/// exactly. Under the default collation, as the feed's key column has.
pub(super) fn lowered(key: &str) -> String {
    format!(
        "case when pg_catalog.octet_length({key}) = pg_catalog.char_length({key}) then {key}::text else pg_catalog.lower({key}::text collate \"default\") end"
    )
}

/// Retention runs at this level, whatever the database's or the role's
/// default: under REPEATABLE READ a statement's snapshot would predate the
/// lock it waits for. And without parallel workers or JIT compilation (see
/// [`feed_connection`]). One round trip: all go as one simple query.
const READ_COMMITTED: &str = "begin isolation level read committed; set local max_parallel_workers_per_gather = 0; set local jit = off";

/// The application name of the connection feed reads go through.
pub const FEED_APPLICATION_NAME: &str = "bloom_guard_feed";

/// The options of the connection a follower keeps for its feed reads
/// ([`KeptConnection`]).
///
/// The session runs at READ COMMITTED whatever the database's or the
/// role's default (under REPEATABLE READ a statement's snapshot would
/// predate the lock it waits for, and miss the horizon a truncation behind
/// that lock moved), and without parallel workers or JIT compilation: a
/// read finds a handful of rows, but on a feed whose statistics predate a
/// bulk load the planner expects a third of the table and starts workers
/// or compiles the plan, which costs a read (and every refusal waiting on
/// the read barrier) milliseconds. All are startup parameters, so
/// connecting costs no extra round trip.
pub(super) fn feed_connection(pool: &PgPool) -> KeptConnection<PgConnection> {
    let options = pool
        .connect_options()
        .as_ref()
        .clone()
        .application_name(FEED_APPLICATION_NAME)
        .options([
            ("default_transaction_isolation", "read committed"),
            ("max_parallel_workers_per_gather", "0"),
            ("jit", "off"),
            ("tcp_keepalives_idle", "30"),
            ("tcp_keepalives_interval", "10"),
            ("tcp_keepalives_count", "3"),
        ]);
    KeptConnection::new(options, None)
}

/// Reads the changes of feed `name` committed after position `seen` on the
/// kept connection; a read that failed closes it.
pub(super) async fn read_kept(
    kept: &KeptConnection<PgConnection>,
    name: &str,
    lowered: bool,
    seen: &str,
) -> Result<Read<String>, sqlx::Error> {
    let mut lease = kept.lease().await?;
    let read =
        crate::kept::within_timeout(read_since(lease.connection(), name, lowered, seen)).await?;
    lease.keep();
    Ok(read)
}

/// Reads the changes of feed `name` committed after position `seen`, in
/// one statement: its own snapshot, under the session's READ COMMITTED.
async fn read_since(
    connection: &mut PgConnection,
    name: &str,
    lowered: bool,
    seen: &str,
) -> Result<Read<String>, sqlx::Error> {
    let mut rows = sqlx::query(READ.as_str())
        .bind(name)
        .bind(seen)
        .bind(lowered)
        .fetch(connection);
    let mut position = None;
    let mut changes = Changes::default();
    while let Some(row) = rows.try_next().await? {
        if position.is_none() {
            let isolation: String = row.try_get(4)?;
            if isolation != "read committed" {
                // A pooler dropped the startup parameters, and the role's
                // default isolation would let the read miss a truncation.
                return Err(sqlx::Error::Configuration(
                    format!("the change feed connection runs at {isolation}, not read committed: connect without a pooler that drops startup parameters").into(),
                ));
            }
            position = Some(row.try_get(0)?);
            if row.try_get::<bool, _>(1)? {
                return Ok(Read::Pruned);
            }
        }
        let Some(kind) = row.try_get::<Option<String>, _>(2)? else {
            continue; // the one row of a read that found nothing
        };
        let raw = row.try_get_raw(3)?;
        let key = if raw.is_null() {
            &[][..]
        } else {
            raw.as_bytes().map_err(sqlx::Error::Decode)?
        };
        changes.record(&kind, Some(key));
    }
    let position = position.ok_or(sqlx::Error::RowNotFound)?;
    Ok(Read::Changes { position, changes })
}

/// Counts the rows of feed `name` committed after position `seen`, up to
/// `limit`: what [`read_since`] would read, without reading it.
pub(super) async fn pending(
    pool: &PgPool,
    name: &str,
    seen: &str,
    limit: u64,
) -> Result<u64, sqlx::Error> {
    let mut tx = pool.begin_with(READ_COMMITTED).await?;
    let count: i64 = sqlx::query_scalar(
        "select count(*) from (
            select from bloom_guard.changes c
            where c.guard = $1
              and c.xid >= pg_catalog.pg_snapshot_xmin($2::pg_snapshot)
              and not pg_catalog.pg_visible_in_snapshot(c.xid, $2::pg_snapshot)
            limit $3) as pending",
    )
    .bind(name)
    .bind(seen)
    .bind(i64::try_from(limit).unwrap_or(i64::MAX))
    .fetch_one(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(count.max(0) as u64)
}

/// Prunes the rows every reader has had for `retention`; one instance at a
/// time does the work.
pub(super) async fn prune(pool: &PgPool, retention: Duration) -> Result<i64, sqlx::Error> {
    // READ COMMITTED: the function's statements see what committed while
    // it waited for a slot's lock (a writer finishing in the slot).
    let mut tx = pool.begin_with(READ_COMMITTED).await?;
    let removed = sqlx::query_scalar("select bloom_guard.prune(make_interval(secs => $1))")
        .bind(retention.as_secs_f64())
        .fetch_one(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(removed)
}

/// The feed's partitions with their indexes, in bytes, and how long the
/// oldest retired slot has been due for emptying under `retention` (whole
/// seconds, 0 when none is): one catalog and one three-row read.
pub(super) async fn storage(
    pool: &PgPool,
    retention: Duration,
) -> Result<bloom_guard::FeedStorage, sqlx::Error> {
    let (bytes, overdue): (i64, f64) = sqlx::query_as(
        "select (select coalesce(sum(pg_catalog.pg_total_relation_size(i.inhrelid)), 0)::int8
                   from pg_catalog.pg_inherits i
                  where i.inhparent = 'bloom_guard.changes'::regclass),
                coalesce(max(extract(epoch from pg_catalog.now() - s.since)::float8 - $1)
                         filter (where not s.current and s.retired is not null), 0)
           from bloom_guard.slots s",
    )
    .bind(retention.as_secs_f64())
    .fetch_one(pool)
    .await?;
    Ok(bloom_guard::FeedStorage::new(
        u64::try_from(bytes).unwrap_or(0),
        overdue.max(0.0) as u64,
    ))
}
