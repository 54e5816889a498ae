//! The check of a table on the log feed, in one round trip: its place on
//! the feed and in the publication, triggers or inheritance children
//! beside it, its replica identity, the slot's state and position, and
//! the versions that make a filter of before stale. An idle instance runs
//! it for every guard every check interval.

use sqlx::PgPool;

use super::install::{LogInstallError, PUBLICATION};
use super::slot::{SlotState, EPOCH};
use crate::watch::Watch;

/// The table's identity and family (its partitions), its place on the log
/// feed, and the feed's epoch: it changes when the table is recreated or
/// put on the feed again, a partition attached, or the slot made again,
/// when a filter of before may lack keys. `$1` is the guard, `$2` the
/// table.
static VERSIONS: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "'log:' operator(pg_catalog.||) coalesce(
             (select l.rel::oid::text operator(pg_catalog.||) '@' operator(pg_catalog.||) l.xmin::text
                     operator(pg_catalog.||) '/' operator(pg_catalog.||)
                     (select pg_catalog.string_agg(f.rel::oid::text, ',' order by f.rel::oid)
                        from bloom_guard.family(l.rel) f(rel))
                from bloom_guard.logged l
               where l.guard = $1 and l.rel = pg_catalog.to_regclass($2)), '')
         operator(pg_catalog.||) ':' operator(pg_catalog.||) {EPOCH}"
    )
});

/// The check's statement: `$1` the guard, `$2` the table, `$3` its key
/// columns, `$4` the publication, `$5` the slot.
static LOOK: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "with t as (select pg_catalog.to_regclass($2) as rel),
              s as (select s.wal_status, s.confirmed_flush_lsn, s.active
                      from pg_catalog.pg_replication_slots s where s.slot_name = $5)
         select exists (select from bloom_guard.logged l, t
                         where l.guard = $1 and l.rel = t.rel and l.key_columns = $3),
                exists (select from pg_catalog.pg_publication_rel r
                          join pg_catalog.pg_publication p on p.oid = r.prpubid, t
                         where p.pubname = $4 and r.prrelid = t.rel),
                exists (select from bloom_guard.watched w, t where w.rel = t.rel),
                exists (select from t cross join lateral bloom_guard.family(t.rel) f(rel)
                          join pg_catalog.pg_inherits i on i.inhrelid = f.rel
                          join pg_catalog.pg_class p on p.oid = i.inhparent
                         where p.relkind <> 'p'),
                (select coalesce(s.wal_status, 'reserved') from s),
                (select l.state from bloom_guard.log_slot l where l.slot = $5),
                (select c.relreplident::pg_catalog.text from pg_catalog.pg_class c, t where c.oid = t.rel),
                coalesce((select pg_catalog.array_agg(a.attname::pg_catalog.text)
                            from t join pg_catalog.pg_class c on c.oid = t.rel
                            join pg_catalog.pg_index i on i.indrelid = c.oid
                            join pg_catalog.pg_attribute a
                              on a.attrelid = i.indrelid and a.attnum = any (i.indkey)
                           where (c.relreplident = 'd' and i.indisprimary)
                              or (c.relreplident = 'i' and i.indisreplident)), '{{}}'),
                {versions},
                (select (s.confirmed_flush_lsn operator(pg_catalog.-) '0/0'::pg_catalog.pg_lsn)::pg_catalog.int8 from s),
                (select s.confirmed_flush_lsn < pg_catalog.pg_current_wal_lsn() from s),
                (select s.active from s),
                (select {unseen} from t),
                (select {drift} from t),
                (select {ancestors} from t)",
        versions = *VERSIONS,
        unseen = super::publication::unseen_in("t.rel"),
        drift = super::publication::publication_drift("t.rel"),
        ancestors = super::publication::fed_ancestors("t.rel")
    )
});

/// What one check saw.
#[derive(Debug)]
pub(crate) struct Look {
    logged: bool,
    published: bool,
    triggers: bool,
    inherited: bool,
    wal_status: Option<String>,
    slot_state: Option<String>,
    identity: Option<String>,
    identity_columns: Vec<String>,
    pub(crate) versions: String,
    /// The slot's confirmed position, whether it is behind the log, and
    /// whether an instance streams it; none without a slot (or one being
    /// made).
    pub(crate) confirmed: Option<i64>,
    pub(crate) behind: Option<bool>,
    pub(crate) active: Option<bool>,
    /// Members of the table's family the log never carries, named.
    unseen: Option<String>,
    /// How the publication was changed outside `install_log`.
    drift: Option<String>,
    /// Tables on the log feed this one is a partition of.
    ancestors: Option<String>,
}

/// Looks at `watch`'s table and the database's `slot`.
pub(crate) async fn look(pool: &PgPool, watch: &Watch, slot: &str) -> Result<Look, sqlx::Error> {
    use sqlx::Row as _;
    let row = sqlx::query(sqlx::AssertSqlSafe(LOOK.as_str()))
        .bind(watch.feed_name())
        .bind(&watch.table)
        .bind(&watch.key_columns)
        .bind(PUBLICATION)
        .bind(slot)
        .fetch_one(pool)
        .await?;
    Ok(Look {
        logged: row.try_get(0)?,
        published: row.try_get(1)?,
        triggers: row.try_get(2)?,
        inherited: row.try_get(3)?,
        wal_status: row.try_get(4)?,
        slot_state: row.try_get(5)?,
        identity: row.try_get(6)?,
        identity_columns: row.try_get(7)?,
        versions: row.try_get(8)?,
        confirmed: row.try_get(9)?,
        behind: row.try_get(10)?,
        active: row.try_get(11)?,
        unseen: row.try_get(12)?,
        drift: row.try_get(13)?,
        ancestors: row.try_get(14)?,
    })
}

impl Look {
    /// Why writes to the watched table could miss the log feed: the table
    /// not on it (or with other key columns), not in the publication, a
    /// key column out of its replica identity, the slot missing, lost or
    /// being made, the feed's triggers on it too, or inheritance children.
    /// Empty when none.
    pub(crate) fn gaps(&self, watch: &Watch, slot: &str) -> Vec<String> {
        let mut gaps = Vec::new();
        if !self.logged {
            gaps.push(format!(
                "{} is not on the log feed with these key columns",
                watch.table
            ));
        }
        if !self.published {
            gaps.push(format!(
                "{} is not in publication {PUBLICATION}",
                watch.table
            ));
        }
        gaps.extend(
            SlotState::of(self.wal_status.as_deref(), self.slot_state.as_deref()).gap(slot),
        );
        if self.triggers {
            gaps.push(format!("{} is fed by triggers too", watch.table));
        }
        if self.inherited {
            gaps.push(LogInstallError::Inherited(watch.table.clone()).to_string());
        }
        if let Some(ancestors) = &self.ancestors {
            gaps.push(
                LogInstallError::UnderFed {
                    table: watch.table.clone(),
                    ancestors: ancestors.clone(),
                }
                .to_string(),
            );
        }
        if let Some(drift) = &self.drift {
            gaps.push(LogInstallError::Publication(drift.clone()).to_string());
        }
        if let Some(members) = &self.unseen {
            gaps.push(
                LogInstallError::Unseen {
                    table: watch.table.clone(),
                    members: members.clone(),
                }
                .to_string(),
            );
        }
        if let (true, Some(identity)) = (self.logged, &self.identity) {
            gaps.extend(
                watch
                    .identity_gap(identity, &self.identity_columns)
                    .map(|error| error.to_string()),
            );
        }
        gaps
    }
}

/// The versions alone ([`VERSIONS`]), for a key source's fingerprint.
pub(crate) async fn versions(pool: &PgPool, watch: &Watch) -> Result<String, sqlx::Error> {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!("select {}", *VERSIONS)))
        .bind(watch.feed_name())
        .bind(&watch.table)
        .fetch_one(pool)
        .await
}
