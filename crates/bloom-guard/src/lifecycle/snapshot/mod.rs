//! Snapshots: a filter written out with everything needed to trust it
//! again elsewhere, and read back chunk by chunk (the byte layout is
//! described in `format.rs`, its parts checked in `parts.rs`).

mod format;
mod parts;
mod read;
mod write;

use crate::filters::filter::FilterParts;
use crate::keys::key_type::KeyType;

pub use format::SNAPSHOT_FORMAT;
pub use read::SnapshotReader;
pub use write::{SnapshotChunks, SnapshotWriter};

/// Why bytes could not be read as a snapshot. A refused snapshot is never
/// used: the caller scans instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SnapshotError {
    /// The bytes do not start like a snapshot.
    #[error("not a bloom-guard snapshot")]
    NotASnapshot,
    /// Written by a version with another format.
    #[error("snapshot format {found} is not the supported format {supported}")]
    Format {
        /// The format the snapshot declares.
        found: u32,
        /// The format this version reads.
        supported: u32,
    },
    /// Fewer or more bytes than the snapshot declares.
    #[error("snapshot length {received} differs from the {expected} bytes it declares")]
    Length {
        /// The length the snapshot's header implies.
        expected: u64,
        /// The bytes given.
        received: u64,
    },
    /// A field holds a value no snapshot has.
    #[error("snapshot field {0} is invalid")]
    Field(&'static str),
    /// The checksum does not match: a changed or damaged byte.
    #[error("snapshot checksum mismatch")]
    Checksum,
}

/// What a snapshot says of itself: everything but its bits and its secret.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SnapshotInfo {
    /// The guard's [name](crate::Builder::name).
    pub guard: String,
    /// The guard's key type.
    pub key_type: KeyType,
    /// The caller's fingerprint of the key query the filter holds.
    pub fingerprint: String,
    /// The change feed's position: every key committed before it is in the
    /// filter, so replaying the feed from there completes it. A counting
    /// filter holds exactly the rows of that position, none after.
    pub position: String,
    /// Keys in the filter.
    pub keys: u64,
    /// The keys its sub-filters are sized for, together (a counting
    /// filter: its keys).
    pub capacity: u64,
    /// The sub-filters the filter has grown into (1 for a counting filter).
    pub sub_filters: u32,
    /// The filter's size in bits.
    pub bits: u64,
    /// The snapshot's length in bytes.
    pub len: u64,
}

/// A filter read back from a snapshot, checked, ready to
/// [adopt](crate::feed::FeedHandle::adopt).
pub struct Snapshot {
    info: SnapshotInfo,
    parts: FilterParts,
}

impl std::fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the seed nor the bits.
        f.debug_struct("Snapshot")
            .field("info", &self.info)
            .finish_non_exhaustive()
    }
}

impl Snapshot {
    /// What the snapshot says of itself.
    pub fn info(&self) -> &SnapshotInfo {
        &self.info
    }

    /// Reads a whole snapshot held in memory.
    ///
    /// # Errors
    ///
    /// A [`SnapshotError`] for anything but an intact snapshot of this format.
    pub fn decode(bytes: &[u8]) -> Result<Self, SnapshotError> {
        let mut reader = SnapshotReader::new(bytes.len() as u64);
        reader.push(bytes)?;
        reader.finish()
    }

    pub(crate) fn into_parts(self) -> (SnapshotInfo, FilterParts) {
        (self.info, self.parts)
    }

    /// The kind of filter it holds.
    pub fn filter_kind(&self) -> crate::report::stats::FilterKind {
        match self.parts {
            FilterParts::Bloom(_) => crate::report::stats::FilterKind::Bloom,
            FilterParts::Counting(_) => crate::report::stats::FilterKind::Counting,
        }
    }
}

#[cfg(test)]
mod tests;
