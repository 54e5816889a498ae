//! Installing the change feed's SQL into a Postgres database.

use futures_util::TryFutureExt;
use sqlx::{AssertSqlSafe, Connection, PgConnection, PgPool};

use crate::error::FeedError;

/// [`DDL_LOCK_TIMEOUT`] as a literal, for the statements that embed it.
macro_rules! ddl_lock_timeout {
    () => {
        "500ms"
    };
}

/// The version of the feed's schema that this crate installs and reads.
pub const SCHEMA_VERSION: i32 = 11;

/// The feed's SQL: schema `bloom_guard`, its tables, trigger functions and
/// `bloom_guard.watch(table, key_columns, name)`. Idempotent.
pub const SQL: &str = include_str!("../../sql/postgres.sql");

/// Installs (or upgrades) the change feed in the database: schema
/// `bloom_guard` with the change table and the functions its triggers run.
/// Then [`Watch::install`](crate::watch::Watch::install) puts the triggers on a
/// table.
///
/// Idempotent, and safe to call from every instance at start: it runs in one
/// transaction under an advisory lock, and does nothing when this version
/// (or a newer one, during a rolling upgrade) is installed. The role needs
/// the right to create a schema in the database.
///
/// # Errors
///
/// [`FeedError::Database`] if the database is unreachable or refuses the
/// DDL.
///
/// # Example
///
/// ```no_run
/// use bloom_guard_sqlx::{postgres, Watch};
///
/// # async fn run(pool: sqlx::PgPool) -> Result<(), bloom_guard_sqlx::FeedError> {
/// postgres::install(&pool).await?;
/// Watch::table("items").key("key").install(&pool).await?;
/// # Ok(()) }
/// ```
///
#[doc = include_str!("../../docs/feed.md")]
pub async fn install(pool: &PgPool) -> Result<(), FeedError> {
    let installed = installed(pool).await?;
    let current = installed
        .version
        .is_some_and(|version| version >= SCHEMA_VERSION);
    if current && installed.indexed && !installed.event_trigger_missing {
        tracing::debug!(version = ?installed.version, "the change feed is installed");
        return Ok(());
    }
    // A superuser installing over a feed that has no event trigger (an
    // earlier install ran as another role) runs the script again: it is
    // idempotent, and adds the event trigger.
    if !current || (installed.event_trigger_missing && installed.version == Some(SCHEMA_VERSION)) {
        schema_script(pool, "install", SQL).await?;
        tracing::info!(
            version = SCHEMA_VERSION,
            from = ?installed.version,
            "installed the bloom-guard change feed"
        );
    }
    if !installed.indexed {
        index_feed(pool).await;
    }
    Ok(())
}

/// The log feed's publication, one per database.
pub(crate) const PUBLICATION: &str = "bloom_guard";

/// Whether `table` is in the log feed's publication (false for a table
/// that does not exist).
pub(crate) async fn published(
    executor: impl sqlx::PgExecutor<'_>,
    table: &str,
) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar(
        "select exists (select from pg_catalog.pg_publication_rel r
                          join pg_catalog.pg_publication p on p.oid = r.prpubid
                         where p.pubname = $2 and r.prrelid = pg_catalog.to_regclass($1))",
    )
    .bind(table)
    .bind(PUBLICATION)
    .fetch_one(executor)
    .await
}

/// Drops replication slot `slot` if it is there, stopping its reader
/// first; whether it is gone (false: taken again on every try).
pub(crate) async fn drop_slot(
    connection: &mut PgConnection,
    slot: &str,
) -> Result<bool, sqlx::Error> {
    for _ in 0..50 {
        let stopped = sqlx::query(
            "select pg_catalog.pg_terminate_backend(active_pid) from pg_catalog.pg_replication_slots
              where slot_name = $1 and active_pid is not null",
        )
        .bind(slot)
        .execute(&mut *connection)
        .await?;
        if stopped.rows_affected() > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            continue;
        }
        let dropped = sqlx::query(
            "select pg_catalog.pg_drop_replication_slot(slot_name)
               from pg_catalog.pg_replication_slots where slot_name = $1",
        )
        .bind(slot)
        .execute(&mut *connection)
        .await;
        match dropped {
            // Taken again between the look and the drop: look again.
            Err(sqlx::Error::Database(error)) if error.code().as_deref() == Some("55006") => {}
            other => return other.map(|_| true),
        }
    }
    Ok(false)
}

/// Runs `sql` on the feed's schema as one simple-query message: Postgres
/// runs it as one transaction, so a failure leaves nothing half done, and
/// the advisory lock makes instances run it one after the other. Notices
/// stay quiet, and a lock on a user's table is waited for as
/// [`retrying_locks`] does.
pub(super) async fn schema_script(pool: &PgPool, what: &str, sql: &str) -> Result<(), sqlx::Error> {
    let script = format!(
        "set local client_min_messages = warning;
         select pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtext('bloom_guard.install'));
         set local lock_timeout = '{DDL_LOCK_TIMEOUT}';
         {sql}"
    );
    retrying_locks(what, || {
        sqlx::raw_sql(AssertSqlSafe(script.clone()))
            .execute(pool)
            .map_ok(drop)
    })
    .await
}

/// What [`postgres::install`] finds in the database, in one round trip.
struct Installed {
    /// The feed's schema version, if it is installed.
    version: Option<i32>,
    /// Whether the feed's index by guard is built and attached.
    indexed: bool,
    /// Whether the installing role is a superuser and the feed has no
    /// event trigger (installed by another role).
    event_trigger_missing: bool,
}

async fn installed(pool: &PgPool) -> Result<Installed, sqlx::Error> {
    // The version is read through `query_to_xml`, which parses its query
    // only when it runs: the statement plans whether or not the schema
    // exists.
    let (version, indexed, event_trigger_missing): (Option<i32>, bool, bool) = sqlx::query_as(
        "select case when pg_catalog.to_regclass('bloom_guard.schema_version') is not null then
                    (pg_catalog.xpath('/row/version/text()', pg_catalog.query_to_xml(
                        'select version from bloom_guard.schema_version', false, true, '')))[1]::text::int4
                end,
                exists (select from pg_catalog.pg_index i
                         where i.indexrelid = pg_catalog.to_regclass('bloom_guard.changes_guard_xid')
                           and i.indisvalid),
                exists (select from pg_catalog.pg_roles where rolname = current_user and rolsuper)
                  and not exists (select from pg_catalog.pg_event_trigger where evtname = 'bloom_guard_alter_table')",
    )
    .fetch_one(pool)
    .await?;
    Ok(Installed {
        version,
        indexed,
        event_trigger_missing,
    })
}

/// The partitions of the feed, whose indexes [`index_feed`] builds.
const FEED_PARTITIONS: [&str; 3] = ["changes_0", "changes_1", "changes_2"];

/// How long each concurrent build of [`index_feed`] waits for the
/// transactions it must outlast (CREATE INDEX CONCURRENTLY waits for every
/// transaction that could write to the partition, without holding writers
/// back): a start never hangs behind a long transaction; the next start
/// tries again. The parent's index and the attaching, which hold writers
/// back while they wait, wait at most 100 ms.
const INDEX_LOCK_TIMEOUT: &str = "10s";

/// Builds the feed's index by `(guard, xid)` (schema version 8) without
/// blocking writers: each partition's index with CREATE INDEX
/// CONCURRENTLY, then the parent's index `ON ONLY` the parent with the
/// partitions' attached (catalog changes). On a fresh install each step
/// takes milliseconds; on a feed that holds a bulk load's rows the builds
/// take as long as they take while writers go on. One instance at a time
/// (a session advisory lock, on a connection of its own that is closed
/// after). A build that fails or times out leaves the feed readable, only
/// slower to read, and is tried again at the next start: it is logged, not
/// returned.
async fn index_feed(pool: &PgPool) {
    let built = async {
        let options = pool.connect_options().as_ref().clone();
        let mut connection = PgConnection::connect_with(&options).await?;
        let built = build_feed_index(&mut connection).await;
        let closed = connection.close().await;
        built.and(closed)
    };
    match built.await {
        Ok(()) => tracing::info!("built the change feed's index by guard"),
        Err(error) => {
            tracing::warn!(%error, "cannot build the change feed's index by guard yet (reads by guard scan more of the feed); the next start tries again");
        }
    }
}

async fn build_feed_index(connection: &mut PgConnection) -> Result<(), sqlx::Error> {
    sqlx::raw_sql(AssertSqlSafe(format!(
        "set lock_timeout = '{INDEX_LOCK_TIMEOUT}';
         set client_min_messages = warning;
         select pg_catalog.pg_advisory_lock(pg_catalog.hashtext('bloom_guard.index'))"
    )))
    .execute(&mut *connection)
    .await?;
    for partition in FEED_PARTITIONS {
        let index = format!("{partition}_guard_xid");
        let valid: Option<bool> = sqlx::query_scalar(
            "select i.indisvalid from pg_catalog.pg_index i
              where i.indexrelid = pg_catalog.to_regclass('bloom_guard.' || $1)",
        )
        .bind(&index)
        .fetch_optional(&mut *connection)
        .await?;
        if valid == Some(true) {
            continue;
        }
        if valid == Some(false) {
            // Left by a build that stopped half way.
            sqlx::raw_sql(AssertSqlSafe(format!(
                "drop index concurrently if exists bloom_guard.{index}"
            )))
            .execute(&mut *connection)
            .await?;
        }
        // Alone in its message: CREATE INDEX CONCURRENTLY runs in no
        // transaction, not even a multi-statement message's implicit one.
        sqlx::raw_sql(AssertSqlSafe(format!(
            "create index concurrently if not exists {index} on bloom_guard.{partition} (guard, xid)"
        )))
        .execute(&mut *connection)
        .await?;
    }
    let attach = FEED_PARTITIONS
        .iter()
        .map(|partition| {
            format!(
                "if not exists (select from pg_catalog.pg_inherits
                                 where inhrelid = 'bloom_guard.{partition}_guard_xid'::regclass) then
                     alter index bloom_guard.changes_guard_xid attach partition bloom_guard.{partition}_guard_xid;
                 end if;"
            )
        })
        .collect::<String>();
    sqlx::raw_sql(AssertSqlSafe(format!(
        "begin;
         -- ON ONLY takes a SHARE lock on the parent, which waits for open
         -- writing transactions and holds new writers behind it: never long.
         set local lock_timeout = '100ms';
         create index if not exists changes_guard_xid on only bloom_guard.changes (guard, xid);
         do $attach$ begin {attach} end $attach$;
         commit;"
    )))
    .execute(&mut *connection)
    .await?;
    Ok(())
}

/// A transaction in which the feed's functions keep their notices (the
/// `drop trigger if exists ..., skipping` of every install) to themselves
/// (a start logs nothing a user would take for a problem), and wait at
/// most [`DDL_LOCK_TIMEOUT`] for a lock on a user's table.
pub(super) const QUIET: &str = concat!(
    "begin; set local client_min_messages = warning; set local lock_timeout = '",
    ddl_lock_timeout!(),
    "'"
);

/// The longest a statement of ours that locks a user's table (the
/// triggers' DDL of `watch`, `unwatch`, an upgrade, `uninstall`) waits for
/// its lock. Writers queue behind a lock request that waits: a request
/// that gives up after this long holds them back no longer. Such a
/// statement is tried again (see [`retrying_locks`]) until the
/// transaction in its way ends.
pub(crate) const DDL_LOCK_TIMEOUT: &str = ddl_lock_timeout!();

/// Runs `attempt` until it does not time out on a lock (SQLSTATE 55P03):
/// see [`crate::ddl::retrying_locks`].
pub(crate) async fn retrying_locks<F, Fut>(what: &str, attempt: F) -> Result<(), sqlx::Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), sqlx::Error>>,
{
    crate::ddl::retrying_locks(what, DDL_LOCK_TIMEOUT, lock_not_available, attempt).await
}

/// A lock not granted within `lock_timeout` (SQLSTATE 55P03).
fn lock_not_available(error: &sqlx::Error) -> bool {
    matches!(error, sqlx::Error::Database(error) if error.code().as_deref() == Some("55P03"))
}
