//! The log feed's position: the end of a commit, and the feed's epoch it
//! belongs to.
//!
//! A log position means something only for the slot it was streamed from:
//! a slot made again (a failover, a restore, a slot lost past
//! `max_slot_wal_keep_size`) starts the feed over, maybe below a position
//! of before. So a position carries the epoch ([`EPOCH`](super::slot::EPOCH))
//! it was taken under, and a read continues from it only under that epoch.

use std::fmt;

/// A position in the log feed: every change committed up to `lsn`, under
/// `epoch`, is behind it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LogPosition {
    pub(crate) lsn: u64,
    pub(crate) epoch: String,
}

impl LogPosition {
    /// Reads back a position written by `Display` (`lsn/epoch`). One
    /// without an epoch (a snapshot an earlier release published) is
    /// `None`.
    pub(crate) fn parse(text: &str) -> Option<Self> {
        let (lsn, epoch) = text.split_once('/')?;
        Some(Self {
            lsn: lsn.parse().ok()?,
            epoch: epoch.to_owned(),
        })
    }
}

impl fmt::Display for LogPosition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.lsn, self.epoch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_back_what_it_writes() {
        let position = LogPosition {
            lsn: 0x1_0000_00A8,
            epoch: "bloom_guard_5@streamed@2026-11-28 12:00:00.1+00".to_owned(),
        };
        assert_eq!(LogPosition::parse(&position.to_string()), Some(position));
        assert_eq!(LogPosition::parse("4294967464"), None);
        assert_eq!(LogPosition::parse("x/epoch"), None);
    }
}
