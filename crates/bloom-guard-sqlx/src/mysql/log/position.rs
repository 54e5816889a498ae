//! A place in a server's binary log: a file and the offset after an event
//! ([`BinlogPoint`]), and a follower's position in the feed the producer
//! writes from it ([`LogPosition`]): a point of one epoch of the feed.
//!
//! A point means something only on the server it was read from: a
//! replica promoted after a failover, or a server restored from a backup,
//! writes its own files, whose names and offsets may repeat the old ones'
//! for other transactions. The producer's progress carries the server's
//! identity ([`server_identity`]); a point of another server starts the
//! feed over with a rebuild, never a read from a place that may skip.

use std::fmt;

use sqlx::MySqlConnection;

use super::error::BinlogError;

/// A place in the binary log: every event that ends at or before it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BinlogPoint {
    pub(crate) file: String,
    pub(crate) pos: u64,
}

impl BinlogPoint {
    /// The file's sequence number: `binlog.000042` is 42.
    pub(crate) fn sequence(&self) -> Option<u64> {
        self.file
            .rsplit_once('.')
            .and_then(|(_, number)| number.parse().ok())
    }

    /// Whether every event up to `other` is at or before this point.
    pub(crate) fn reaches(&self, other: &Self) -> bool {
        match (self.sequence(), other.sequence()) {
            (Some(mine), Some(theirs)) => (mine, self.pos) >= (theirs, other.pos),
            _ => self.file == other.file && self.pos >= other.pos,
        }
    }
}

/// A follower's position: every change committed up to `point` in the
/// log of the feed's `epoch` is in the filter, none after. The epoch
/// changes when the feed starts over (another server, a purged log): a
/// position of another epoch is not this feed's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LogPosition {
    pub(crate) epoch: String,
    /// The log file's sequence number and the offset after the commit.
    pub(crate) seq: u64,
    pub(crate) pos: u64,
}

impl LogPosition {
    /// Reads back `epoch/seq:pos`.
    pub(crate) fn parse(text: &str) -> Option<Self> {
        let (epoch, point) = text.rsplit_once('/')?;
        let (seq, pos) = point.split_once(':')?;
        if epoch.is_empty() {
            return None;
        }
        Some(Self {
            epoch: epoch.to_owned(),
            seq: seq.parse().ok()?,
            pos: pos.parse().ok()?,
        })
    }

    /// The later of two positions of one epoch.
    pub(crate) fn max(self, other: Self) -> Self {
        if (other.seq, other.pos) > (self.seq, self.pos) {
            other
        } else {
            self
        }
    }
}

/// A point as one number that orders as the points do, for the feed's
/// index: the file's sequence number above the offset's 40 bits (a file
/// of up to a terabyte, 2^23 files).
pub(crate) fn ordinal(seq: u64, pos: u64) -> i64 {
    let value = (seq.min((1 << 23) - 1) << 40) | pos.min((1 << 40) - 1);
    i64::try_from(value).unwrap_or(i64::MAX)
}

impl fmt::Display for LogPosition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}:{}", self.epoch, self.seq, self.pos)
    }
}

impl fmt::Display for BinlogPoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.file, self.pos)
    }
}

/// The server's binary log position now: the end of its last event.
/// `SHOW MASTER STATUS`, or `SHOW BINARY LOG STATUS` where MySQL 8.4
/// removed the first.
pub(crate) async fn log_end(connection: &mut MySqlConnection) -> Result<BinlogPoint, BinlogError> {
    let row: Option<(String, u64)> = match status(connection, "show master status").await {
        Err(sqlx::Error::Database(error)) if error.code().as_deref() == Some("42000") => {
            status(connection, "show binary log status").await?
        }
        other => other?,
    };
    row.map(|(file, pos)| BinlogPoint { file, pos })
        .ok_or(BinlogError::NoBinlog)
}

async fn status(
    connection: &mut MySqlConnection,
    statement: &'static str,
) -> Result<Option<(String, u64)>, sqlx::Error> {
    use sqlx::Row as _;
    let row = sqlx::query(statement).fetch_optional(connection).await?;
    row.map(|row| Ok((row.try_get::<String, _>(0)?, row.try_get::<u64, _>(1)?)))
        .transpose()
}

/// The server's identity as far as its binary log goes, as an SQL
/// expression: its server id (unique among the servers of a replication
/// topology, so a promoted replica has another), its log's base name, and
/// its host name and port (a copy of a server's data on another host, its
/// settings and all, has the same id and base name).
pub(crate) const SERVER: &str = "cast(concat(@@server_id, ':', coalesce(@@log_bin_basename, ''), '@', @@hostname, ':', @@port) as char)";

#[cfg(test)]
mod tests {
    use super::{BinlogPoint, LogPosition};

    fn at(file: &str, pos: u64) -> BinlogPoint {
        BinlogPoint {
            file: file.to_owned(),
            pos,
        }
    }

    #[test]
    fn a_later_file_reaches_any_offset_of_an_earlier_one() {
        assert!(at("binlog.000010", 4).reaches(&at("binlog.000009", 90_000)));
        assert!(!at("binlog.000009", 90_000).reaches(&at("binlog.000010", 4)));
        assert!(at("binlog.000009", 500).reaches(&at("binlog.000009", 500)));
        assert!(!at("binlog.000009", 499).reaches(&at("binlog.000009", 500)));
    }

    #[test]
    fn a_position_reads_back_as_written() {
        let position = LogPosition {
            epoch: "9f2c".to_owned(),
            seq: 12,
            pos: 4_096,
        };
        assert_eq!(position.to_string(), "9f2c/12:4096");
        assert_eq!(LogPosition::parse("9f2c/12:4096"), Some(position));
        assert_eq!(LogPosition::parse("12:4096"), None);
        assert_eq!(LogPosition::parse("/12:4096"), None);
        assert_eq!(LogPosition::parse("e/x:1"), None);
    }

    #[test]
    fn ordinals_order_as_points_do() {
        use super::ordinal;
        assert!(ordinal(2, 4) > ordinal(1, 1 << 39));
        assert!(ordinal(7, 500) > ordinal(7, 499));
        assert_eq!(ordinal(0, 0), 0);
    }

    #[test]
    fn files_without_a_number_compare_only_within_one_file() {
        assert!(at("log", 7).reaches(&at("log", 6)));
        assert!(!at("log", 7).reaches(&at("other", 6)));
    }
}
