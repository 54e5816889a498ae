//! The log feed's slot: made once per database, and made again when it is
//! missing (dropped, a failover before Postgres 17's failover slots, a
//! restore into another cluster) or lost (invalidated past
//! `max_slot_wal_keep_size`). A slot made again missed what came before
//! it, so the feed starts over with it: its rows are deleted, and its
//! progress and horizon move to the new slot's start. Readers behind the
//! horizon rebuild; the slot's start is part of every log-fed guard's
//! fingerprint, so a filter or snapshot of the slot before rebuilds too,
//! even when the positions went back (another cluster's log).
//!
//! Making a slot takes steps that cannot share one transaction (a slot is
//! made outside any). `bloom_guard.log_slot` says how far they got: while
//! it reads `making`, or names another slot, the slot is made again and
//! no producer streams it.

use sqlx::{ConnectOptions as _, Connection as _, PgConnection, PgPool};

use super::error::SlotError;

/// The feed's epoch in SQL: the slot it belongs to, how far its making
/// got, and the slot's start. It changes each time the slot is made. A
/// follower's reads compare it with the one its filter was built under
/// (positions of an older slot, even above the new one's start, are not
/// this feed's); a producer's writes, with the one it streams under.
pub(crate) const EPOCH: &str = "coalesce((select s.slot operator(pg_catalog.||) '@' operator(pg_catalog.||) s.state
                         operator(pg_catalog.||) '@' operator(pg_catalog.||) coalesce(s.made::pg_catalog.text, '')
                    from bloom_guard.log_slot s), '')";

/// The feed's epoch now ([`EPOCH`]).
pub(crate) async fn epoch(executor: impl sqlx::PgExecutor<'_>) -> Result<String, sqlx::Error> {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!("select {EPOCH}")))
        .fetch_one(executor)
        .await
}

/// The log feed's slot as the database has it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SlotState {
    /// Made, and the feed's state is its.
    Ready,
    /// No such slot, or the feed's state is another slot's.
    Missing,
    /// Invalidated: the log it needed was removed.
    Lost,
    /// Being made, or its making stopped half way.
    Unfinished,
}

impl SlotState {
    /// The state from the slot's `wal_status` (none: no slot) and the
    /// feed's record of it (`log_slot.state` for this slot's name).
    pub(crate) fn of(wal_status: Option<&str>, made: Option<&str>) -> Self {
        match (wal_status, made) {
            (Some("lost"), _) => Self::Lost,
            (Some(_), Some("made")) => Self::Ready,
            (_, Some("making")) => Self::Unfinished,
            _ => Self::Missing,
        }
    }

    /// The gap a follower reports for this state, if any.
    pub(crate) fn gap(self, slot: &str) -> Option<String> {
        match self {
            Self::Ready => None,
            Self::Missing => Some(format!("the log feed's slot {slot} is missing")),
            Self::Lost => Some(format!(
                "the log feed's slot {slot} was invalidated (max_slot_wal_keep_size)"
            )),
            Self::Unfinished => Some(format!("the log feed's slot {slot} is being made")),
        }
    }
}

/// The slot's state.
pub(crate) async fn state(
    executor: impl sqlx::PgExecutor<'_>,
    slot: &str,
) -> Result<SlotState, sqlx::Error> {
    let (wal_status, made): (Option<String>, Option<String>) = sqlx::query_as(
        "select (select coalesce(s.wal_status, 'reserved') from pg_catalog.pg_replication_slots s
                  where s.slot_name = $1),
                (select l.state from bloom_guard.log_slot l where l.slot = $1)",
    )
    .bind(slot)
    .fetch_one(executor)
    .await?;
    Ok(SlotState::of(wal_status.as_deref(), made.as_deref()))
}

/// Makes the slot (again) unless it is ready: the feed starts over at its
/// start. Several instances may call this at once: one makes it, under a
/// lock held by a connection of its own, and the others find it ready.
/// Whether it made the slot.
pub(crate) async fn ensure(pool: &PgPool, slot: &str) -> Result<bool, SlotError> {
    if state(pool, slot).await? == SlotState::Ready {
        return Ok(false);
    }
    // A connection of its own: the session's lock goes with it, whatever
    // stops this future.
    let mut connection = pool.connect_options().connect().await?;
    let made = make(&mut connection, slot).await;
    // Closing releases the lock; a failed close drops the connection.
    let _ = connection.close().await;
    made
}

async fn make(connection: &mut PgConnection, slot: &str) -> Result<bool, SlotError> {
    sqlx::query("select pg_catalog.pg_advisory_lock(pg_catalog.hashtext('bloom_guard.log_slot'))")
        .execute(&mut *connection)
        .await?;
    let state = state(&mut *connection, slot).await?;
    if state == SlotState::Ready {
        return Ok(false);
    }
    tracing::warn!(%slot, ?state, "making the log feed's slot; the log feed starts over at its start, and the guards on it rebuild");
    // What the feed held belongs to the slot before: gone, and no
    // producer streams the slot until the last step.
    start_over(
        connection,
        slot,
        "making",
        "pg_catalog.pg_current_wal_lsn()",
        None,
    )
    .await?;
    drop_slot(connection, slot).await?;
    let start: String = sqlx::query_scalar(
        "select lsn::text from pg_catalog.pg_create_logical_replication_slot($1, 'pgoutput')",
    )
    .bind(slot)
    .fetch_one(&mut *connection)
    .await?;
    let made = start_over(
        connection,
        slot,
        "made",
        "$2::pg_catalog.pg_lsn",
        Some(&start),
    )
    .await;
    if made.is_err() {
        // A slot no feed belongs to (the schema dropped meanwhile) would
        // keep the log; the next making starts from scratch anyway.
        let _ = drop_slot(connection, slot).await;
    }
    made?;
    Ok(true)
}

/// Drops the slot if it is there, stopping its reader first (a stream of
/// a lost slot, or of a slot whose making stopped half way).
async fn drop_slot(connection: &mut PgConnection, slot: &str) -> Result<(), SlotError> {
    if crate::postgres::install::drop_slot(connection, slot).await? {
        return Ok(());
    }
    Err(SlotError::InUse(slot.to_owned()))
}

/// In one transaction: the feed's rows deleted, its progress and horizon
/// at `at` (SQL: the current position, or `$2`), the slot's state.
async fn start_over(
    connection: &mut PgConnection,
    slot: &str,
    state: &str,
    at: &str,
    start: Option<&str>,
) -> Result<(), sqlx::Error> {
    let mut tx = connection.begin().await?;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "with at as (select {at} as lsn),
              progress as (
                  insert into bloom_guard.log_progress (slot, applied) select $1, lsn from at
                  on conflict (slot) do update
                     set applied = excluded.applied, part_at = null, part_rows = 0,
                         lag = null, written_at = null),
              horizon as (update bloom_guard.log_horizon set below = (select lsn from at))
         insert into bloom_guard.log_slot (slot, state, made) select $1, $3, lsn from at
         on conflict (singleton) do update
            set slot = excluded.slot, state = excluded.state, made = excluded.made"
    )))
    .bind(slot)
    .bind(start)
    .bind(state)
    .execute(&mut *tx)
    .await?;
    if state == "making" {
        sqlx::query("delete from bloom_guard.log_changes")
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await
}
