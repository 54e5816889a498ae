//! The trigger feed's position: a snapshot of the server's transactions,
//! and the timeline it was taken on.
//!
//! A snapshot alone names transactions by id, and ids are not unique across
//! a server's history: a standby promoted after an asynchronous failover
//! (or a server restored to a point in time) starts a new timeline and
//! hands out again the ids of the transactions the old one committed and
//! lost. A position taken before counts those new commits as seen. So a
//! read continues from a position only on the timeline it was taken on,
//! and only if the server has handed out every id the position saw; any
//! other position rebuilds.

use std::fmt;

/// The position as SQL, one `text` value: the server's timeline (eight hex
/// digits, as in the name of its WAL files) and its snapshot now.
pub(super) const POSITION_NOW: &str = "pg_catalog.substr(pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_lsn()), 1, 8) || '/' || pg_catalog.pg_current_snapshot()::text";

/// The server's timeline as SQL, in the form a position carries.
pub(super) const TIMELINE_NOW: &str =
    "pg_catalog.substr(pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_lsn()), 1, 8)";

/// A position in the Postgres trigger feed: every change committed in
/// `snapshot` on `timeline` is behind it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PgPosition {
    timeline: String,
    snapshot: String,
}

/// The server wrote a feed position this release cannot read.
#[derive(Debug, thiserror::Error)]
#[error("the server's feed position {0:?} is not one")]
pub(crate) struct NotAPosition(String);

impl PgPosition {
    /// Reads a position back from its text (`timeline/xmin:xmax:xip,...`).
    /// A position without a timeline (a snapshot an earlier release
    /// published) is `None`: it cannot be told from a lost timeline's.
    pub(crate) fn parse(text: &str) -> Option<Self> {
        let (timeline, snapshot) = text.split_once('/')?;
        let timeline_ok = timeline.len() == 8 && timeline.bytes().all(|b| b.is_ascii_hexdigit());
        let snapshot_ok = snapshot.split(':').count() == 3
            && snapshot
                .bytes()
                .all(|b| b.is_ascii_digit() || b == b':' || b == b',');
        (timeline_ok && snapshot_ok).then(|| Self {
            timeline: timeline.to_owned(),
            snapshot: snapshot.to_owned(),
        })
    }

    /// A position the server wrote (its `POSITION_NOW`), read back; one
    /// that is not a position is a value that failed to decode.
    pub(crate) fn decode(text: &str) -> Result<Self, sqlx::Error> {
        Self::parse(text)
            .ok_or_else(|| sqlx::Error::Decode(Box::new(NotAPosition(text.to_owned()))))
    }

    /// The timeline the snapshot was taken on.
    pub(super) fn timeline(&self) -> &str {
        &self.timeline
    }

    /// The snapshot, as `pg_snapshot` reads it.
    pub(super) fn snapshot(&self) -> &str {
        &self.snapshot
    }
}

impl fmt::Display for PgPosition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.timeline, self.snapshot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_back_what_it_writes() {
        let position = PgPosition::parse("0000000A/740:752:741,744").expect("a position");
        assert_eq!(position.timeline(), "0000000A");
        assert_eq!(position.snapshot(), "740:752:741,744");
        assert_eq!(position.to_string(), "0000000A/740:752:741,744");
    }

    #[test]
    fn refuses_a_position_without_a_timeline() {
        // What releases before the timeline published in snapshots.
        assert_eq!(PgPosition::parse("740:752:"), None);
        assert_eq!(PgPosition::parse("1/740:752:"), None);
        assert_eq!(PgPosition::parse("00000001/740:752"), None);
        assert_eq!(PgPosition::parse("00000001/740:752:'"), None);
        assert_eq!(PgPosition::parse("0000000G/740:752:"), None);
    }
}
