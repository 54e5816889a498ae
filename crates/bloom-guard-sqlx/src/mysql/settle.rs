//! Which feed ids are settled: every transaction that could hold one has
//! ended, so a read begun after that sees the id if it ever commits.
//!
//! The method, from `information_schema.innodb_trx` (which needs the
//! `PROCESS` privilege):
//!
//! 1. Read the highest committed feed id, `up_to`. Ids are handed out in
//!    increasing order, so every id up to it was handed out before this
//!    read, to a transaction that had already written a row of the watched
//!    table; one that has not ended is running now.
//! 2. Open a *canary*: a new connection, so a thread id no list showed
//!    before, and a transaction on it. Then list the running transactions.
//!    InnoDB serves that list from a cache it refreshes only when nobody
//!    read it for 100 ms, so a list may be older than the canary; it is
//!    taken only if it shows the canary, which proves it was made after
//!    step 1. Looks take a server-wide `GET_LOCK` and space their reads,
//!    so several instances do not keep the cache from refreshing.
//! 3. The holders are the listed transactions that have modified rows
//!    (a holder wrote the row and the feed row; MariaDB lists others with
//!    id 0), keyed by their id alone: a read-write transaction's id never
//!    changes and is never reused, while its thread does change (a
//!    prepared XA transaction whose client left is listed with thread 0). Each later fresh list keeps
//!    only the holders still in it; once none is left, every holder has
//!    ended, committed or rolled back, and ids up to `up_to` are settled.
//!
//! A list of [`MAX_LISTED`] transactions or more may be truncated (InnoDB
//! caps the cache's memory): such a list settles nothing. A transaction
//! that stays open long delays the settling of the ids handed out before
//! it ends; readers keep asking for those ids meanwhile. Without the
//! privilege nothing settles: ids of rolled-back transactions stay open
//! until pruning passes them, and the reader rebuilds then (it never
//! skips one).

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::{ConnectOptions, Connection, MySqlConnection, MySqlPool};
use tokio::time::Instant;

use super::galera::Cluster;

mod node;

/// The least time between two rounds of the method.
const STEP: Duration = Duration::from_millis(100);

/// How long after a read of the transaction list InnoDB may still serve
/// the same copy, with a margin.
const REFRESH: Duration = Duration::from_millis(120);

/// How long one look waits for a list that shows its canary.
const LOOK: Duration = Duration::from_secs(1);

/// A list this long may be truncated: InnoDB caps the cache at 16 MiB,
/// and a transaction waiting on locks can take several kilobytes of it.
pub(super) const MAX_LISTED: usize = 1000;

/// The server-wide lock looks take: the cache is the server's.
const LOOK_LOCK: &str = "bloom_guard.innodb_trx";

/// A running transaction that modified rows: its id.
type Trx = String;

/// The transaction every read of the feed runs in: one snapshot, taken
/// at its start, in `REPEATABLE READ` whatever the server's or the
/// session's default (under `READ COMMITTED` each statement would see
/// another moment; under `SERIALIZABLE` reads would lock).
const SNAPSHOT: &str = "set transaction isolation level repeatable read; start transaction with consistent snapshot, read only";

/// [`SNAPSHOT`] on a Galera node, causal: the node first applies every
/// write set the cluster certified before it (for this statement only).
const CAUSAL_SNAPSHOT: &str = "set transaction isolation level repeatable read; set statement wsrep_sync_wait = 1 for start transaction with consistent snapshot, read only";

/// How long a round may take before it is given up: a canary stuck on a
/// half-open connection must not stop settling for good.
const ROUND_LIMIT: Duration = Duration::from_secs(10);

/// Looks in a row that found only old copies of the list before that is
/// logged.
const STALE_WARNING: u32 = 20;

/// The settled feed ids of one database, advanced by the reads.
#[derive(Debug, Default)]
pub(crate) struct Settled {
    state: Mutex<State>,
    /// Whether a round is under way.
    running: AtomicBool,
    /// Whether the server is a Galera node, once known.
    galera: tokio::sync::OnceCell<bool>,
    /// On Galera, each node's own settling (see `galera.rs`).
    cluster: Cluster<Settled>,
    /// This settles one node of a cluster, not the cluster.
    node_only: bool,
}

#[derive(Debug, Default)]
struct State {
    /// Every id up to this one is settled.
    settled: i64,
    candidate: Option<Candidate>,
    /// When the last round started; `None` before the first.
    last_round: Option<Instant>,
    /// Whether a failed look was logged.
    warned: bool,
    /// Whether the last round was refused the transaction list (no
    /// `PROCESS` privilege).
    unlisted: bool,
    /// Looks in a row that found no fresh list.
    stale: u32,
    /// On Galera: whether a node's ids wait to be settled.
    cluster_settling: bool,
}

#[derive(Debug)]
struct Candidate {
    up_to: i64,
    /// The transactions that may hold ids up to `up_to`, as of the last
    /// fresh list; `None` before the first.
    holders: Option<BTreeSet<Trx>>,
}

/// Clears `running` when a round ends, however it ends.
struct Running<'a>(&'a AtomicBool);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

impl Settled {
    /// Whether the server is a Galera node (`wsrep_on`): its feed is
    /// settled over every node, and read causally.
    pub(super) async fn is_galera(&self, pool: &MySqlPool) -> Result<bool, sqlx::Error> {
        if self.node_only {
            return Ok(false);
        }
        self.galera
            .get_or_try_init(|| async {
                match sqlx::query_scalar::<_, i64>("select cast(@@global.wsrep_on as signed)")
                    .fetch_one(pool)
                    .await
                {
                    Ok(on) => Ok(on != 0),
                    // Not MariaDB: no such variable.
                    Err(sqlx::Error::Database(_)) => Ok(false),
                    Err(error) => Err(error),
                }
            })
            .await
            .copied()
    }

    /// Whether the server is known to be a Galera node.
    pub(super) fn known_galera(&self) -> bool {
        self.galera.get().copied().unwrap_or(false)
    }

    /// The statement that starts a read transaction whose snapshot holds
    /// every transaction committed before it, on any node of a Galera
    /// cluster (a causal read), and on one server as ever.
    pub(super) async fn snapshot_statement(
        &self,
        pool: &MySqlPool,
    ) -> Result<&'static str, sqlx::Error> {
        Ok(if self.is_galera(pool).await? {
            CAUSAL_SNAPSHOT
        } else {
            SNAPSHOT
        })
    }

    /// Every id up to the returned one is settled: a read begun after this
    /// call that lacks such an id proves it never commits.
    pub(super) fn now(&self) -> i64 {
        crate::lock::lock(&self.state).settled
    }

    /// Whether the last round could not list the running transactions:
    /// nothing settles (see the module's note on `PROCESS`).
    pub(super) fn unlisted(&self) -> bool {
        crate::lock::lock(&self.state).unlisted
    }

    /// Whether ids wait to be settled: no round yet, or one under way.
    pub(super) fn settling(&self) -> bool {
        let state = crate::lock::lock(&self.state);
        state.last_round.is_none() || state.candidate.is_some() || state.cluster_settling
    }

    /// Starts a round in the background if one is due (none under way,
    /// the last at least [`STEP`] ago), and returns the settled id as of
    /// now: reads need not wait for a look.
    pub(super) fn advance(self: &Arc<Self>, pool: &MySqlPool) -> i64 {
        let due = !self.running.load(Ordering::Acquire)
            && crate::lock::lock(&self.state)
                .last_round
                .is_none_or(|at| at.elapsed() >= STEP);
        if due {
            let settled = Arc::clone(self);
            let pool = pool.clone();
            tokio::spawn(async move { settled.round(&pool).await });
        }
        self.now()
    }

    /// One round of the method, unless one is under way.
    pub(super) async fn round(&self, pool: &MySqlPool) {
        if self.running.swap(true, Ordering::AcqRel) {
            return;
        }
        let _running = Running(&self.running);
        let stepped = tokio::time::timeout(ROUND_LIMIT, async {
            if self.is_galera(pool).await? {
                self.cluster_step(pool).await
            } else {
                self.step(pool).await
            }
        })
        .await;
        self.record(stepped);
    }

    /// Records how a round ended.
    fn record(&self, stepped: Result<Result<(), sqlx::Error>, tokio::time::error::Elapsed>) {
        let mut state = crate::lock::lock(&self.state);
        match stepped {
            // On Galera the nodes' rounds said.
            Ok(Ok(())) if self.known_galera() => {}
            Ok(Ok(())) => state.unlisted = false,
            // A privilege refused: nothing will settle (pruning goes by age).
            Ok(Err(error)) if refused(&error) => {
                if !state.unlisted {
                    tracing::warn!(%error, "cannot list the running transactions (information_schema.innodb_trx needs the PROCESS privilege): ids of rolled-back transactions stay open until the feed is pruned past them, and the follower rebuilds then");
                }
                state.unlisted = true;
            }
            // Anything else (a connection refused, a network blip): the
            // last proof stands, and the next round tries again.
            Ok(Err(error)) => {
                if !state.warned {
                    state.warned = true;
                    tracing::warn!(%error, "cannot settle the change feed's ids this time; retrying");
                }
            }
            Err(_) => tracing::warn!(
                "a look at the running transactions took over {ROUND_LIMIT:?}; given up, retrying"
            ),
        }
    }

    /// A round over every node of a Galera cluster: the cluster's ids are
    /// settled up to the least node's (see `galera.rs`).
    async fn cluster_step(&self, pool: &MySqlPool) -> Result<(), sqlx::Error> {
        crate::lock::lock(&self.state).last_round = Some(Instant::now());
        let round = self.cluster.round(pool).await?;
        let mut state = crate::lock::lock(&self.state);
        state.cluster_settling = round.settling;
        state.unlisted = round.unlisted;
        if let Some(least) = round.settled {
            state.settled = state.settled.max(least);
        }
        Ok(())
    }

    async fn step(&self, pool: &MySqlPool) -> Result<(), sqlx::Error> {
        let idle = {
            let mut state = crate::lock::lock(&self.state);
            state.last_round = Some(Instant::now());
            state.candidate.is_none()
        };
        if idle {
            let up_to: i64 = sqlx::query_scalar(
                "select cast(coalesce(max(id), 0) as signed) from bloom_guard_changes",
            )
            .fetch_one(pool)
            .await?;
            let mut state = crate::lock::lock(&self.state);
            if up_to <= state.settled {
                return Ok(());
            }
            state.candidate = Some(Candidate {
                up_to,
                holders: None,
            });
        }
        // After the read of `up_to`: the canary connects now.
        let Some(running) = fresh_list(pool).await? else {
            let mut state = crate::lock::lock(&self.state);
            state.stale += 1;
            if state.stale == STALE_WARNING {
                tracing::warn!(looks = STALE_WARNING, "InnoDB served only old copies of its transaction list (something reads information_schema.innodb_trx more often than every 100 ms, or a thousand transactions or more are open): feed ids stay open, and pruning waits");
            }
            return Ok(());
        };
        let mut state = crate::lock::lock(&self.state);
        state.stale = 0;
        let Some(candidate) = state.candidate.as_mut() else {
            return Ok(());
        };
        let holders = match candidate.holders.take() {
            None => running,
            Some(holders) => holders.intersection(&running).cloned().collect(),
        };
        if holders.is_empty() {
            let up_to = candidate.up_to;
            state.settled = state.settled.max(up_to);
            state.candidate = None;
        } else {
            candidate.holders = Some(holders);
        }
        Ok(())
    }
}

/// The transactions running at a moment after this call began that have
/// modified rows; `None` if no such list could be had within [`LOOK`].
async fn fresh_list(pool: &MySqlPool) -> Result<Option<BTreeSet<Trx>>, sqlx::Error> {
    let mut canary = pool.connect_options().connect().await?;
    let listed = look(&mut canary).await;
    // The canary's transaction ends with its connection.
    let _ = canary.close().await;
    listed
}

async fn look(canary: &mut MySqlConnection) -> Result<Option<BTreeSet<Trx>>, sqlx::Error> {
    let (thread, _locked): (u64, Option<i64>) =
        sqlx::query_as("select connection_id(), get_lock(?, 2)")
            .bind(LOOK_LOCK)
            .fetch_one(&mut *canary)
            .await?;
    sqlx::raw_sql("start transaction with consistent snapshot")
        .execute(&mut *canary)
        .await?;
    let deadline = Instant::now() + LOOK;
    loop {
        let listed: Vec<(String, u64, String, u64)> = sqlx::query_as(
            "select cast(trx_id as char), trx_mysql_thread_id, cast(trx_started as char),
                    trx_rows_modified
               from information_schema.innodb_trx",
        )
        .fetch_all(&mut *canary)
        .await?;
        if listed.iter().any(|(_, listed, ..)| *listed == thread) {
            // Possibly truncated: the memory cap may have cut holders.
            if listed.len() >= MAX_LISTED {
                return Ok(None);
            }
            return Ok(Some(
                listed
                    .into_iter()
                    .filter(|(_, listed, _, modified)| *listed != thread && *modified > 0)
                    .map(|(id, ..)| id)
                    .collect(),
            ));
        }
        // An older copy: InnoDB refreshes it once nobody read it for
        // 100 ms.
        if Instant::now() + REFRESH > deadline {
            return Ok(None);
        }
        tokio::time::sleep(REFRESH).await;
    }
}

/// Whether `error` is the server refusing a privilege (`PROCESS` for the
/// transaction list).
fn refused(error: &sqlx::Error) -> bool {
    let sqlx::Error::Database(error) = error else {
        return false;
    };
    let number = error
        .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
        .map(sqlx::mysql::MySqlDatabaseError::number);
    // Access denied: to a privilege, to a table, to a database.
    matches!(number, Some(1227 | 1142 | 1044))
}
