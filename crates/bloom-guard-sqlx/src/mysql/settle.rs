//! Which feed ids are settled: every transaction that could hold one has
//! ended, so a read begun after that sees the id if it ever commits.
//!
//! The method, in two looks at `information_schema.innodb_trx` (which needs
//! the `PROCESS` privilege):
//!
//! 1. Read the highest committed feed id, `up_to`. Ids are handed out in
//!    increasing order, so every id up to it was handed out before this
//!    read; a transaction that holds one and has not committed is running
//!    now.
//! 2. At least [`STEP`] later, list the running transactions. InnoDB
//!    refreshes that list at most every 100 ms, so it shows a moment after
//!    step 1: a holder still running is in it.
//! 3. Once a later list shares no transaction with it, every holder has
//!    ended, committed or rolled back: ids up to `up_to` are settled.
//!
//! A transaction that stays open long (a report in `REPEATABLE READ`)
//! delays the settling of the ids handed out before it ends; readers keep
//! asking for those ids meanwhile. Without the privilege nothing settles:
//! ids of rolled-back transactions stay open until pruning passes them,
//! and the reader rebuilds then (it never skips one).

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::Duration;

use sqlx::MySqlPool;
use tokio::time::Instant;

/// The least time between two looks at the running transactions: more
/// than InnoDB's 100 ms refresh of the list.
pub(super) const STEP: Duration = Duration::from_millis(150);

/// The settled feed ids of one database, advanced by the reads.
#[derive(Debug, Default)]
pub(crate) struct Settled {
    state: Mutex<State>,
    /// One look at a time.
    looking: tokio::sync::Mutex<()>,
}

#[derive(Debug, Default)]
struct State {
    /// Every id up to this one is settled.
    settled: i64,
    candidate: Option<Candidate>,
    last_look: Option<Instant>,
    /// Whether the missing privilege was logged.
    warned: bool,
}

#[derive(Debug)]
struct Candidate {
    up_to: i64,
    read_at: Instant,
    /// The transactions running a moment after `up_to` was read.
    running: Option<BTreeSet<String>>,
}

impl Settled {
    /// Every id up to the returned one is settled (as of the last look).
    pub(super) fn now(&self) -> i64 {
        crate::lock::lock(&self.state).settled
    }

    /// Whether ids wait to be settled: never looked, or a look under way.
    pub(super) fn settling(&self) -> bool {
        let state = crate::lock::lock(&self.state);
        state.last_look.is_none() || state.candidate.is_some()
    }

    /// Takes one step of the method if one is due, and returns the settled
    /// id: every id up to it that ever commits is visible to a read begun
    /// after this call.
    pub(super) async fn advance(&self, pool: &MySqlPool) -> i64 {
        let Ok(_looking) = self.looking.try_lock() else {
            return self.now();
        };
        let due = {
            let state = crate::lock::lock(&self.state);
            state.last_look.is_none_or(|at| at.elapsed() >= STEP)
        };
        if due {
            if let Err(error) = self.step(pool).await {
                let mut state = crate::lock::lock(&self.state);
                if !state.warned {
                    state.warned = true;
                    tracing::warn!(%error, "cannot list the running transactions (information_schema.innodb_trx needs the PROCESS privilege): ids of rolled-back transactions stay open until the feed is pruned past them, and the follower rebuilds then");
                }
            }
        }
        self.now()
    }

    async fn step(&self, pool: &MySqlPool) -> Result<(), sqlx::Error> {
        let now = Instant::now();
        let ripe = {
            let mut state = crate::lock::lock(&self.state);
            state.last_look = Some(now);
            state
                .candidate
                .as_ref()
                .is_some_and(|candidate| now.duration_since(candidate.read_at) >= STEP)
        };
        if ripe {
            let running = running(pool).await?;
            let mut state = crate::lock::lock(&self.state);
            if let Some(candidate) = state.candidate.as_mut() {
                let before = candidate.running.get_or_insert_with(|| running.clone());
                if before.is_disjoint(&running) {
                    let up_to = candidate.up_to;
                    state.settled = state.settled.max(up_to);
                    state.candidate = None;
                }
            }
        }
        let idle = crate::lock::lock(&self.state).candidate.is_none();
        if idle {
            let up_to: i64 = sqlx::query_scalar(
                "select cast(coalesce(max(id), 0) as signed) from bloom_guard_changes",
            )
            .fetch_one(pool)
            .await?;
            let mut state = crate::lock::lock(&self.state);
            if up_to > state.settled {
                state.candidate = Some(Candidate {
                    up_to,
                    read_at: Instant::now(),
                    running: None,
                });
            }
        }
        Ok(())
    }
}

/// The transactions InnoDB lists as running, but this connection's.
async fn running(pool: &MySqlPool) -> Result<BTreeSet<String>, sqlx::Error> {
    let ids: Vec<String> = sqlx::query_scalar(
        "select cast(trx_id as char) from information_schema.innodb_trx
          where trx_mysql_thread_id <> connection_id()",
    )
    .fetch_all(pool)
    .await?;
    Ok(ids.into_iter().collect())
}
