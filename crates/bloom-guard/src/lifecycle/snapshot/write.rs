//! Writing a filter as a snapshot, a chunk at a time.

use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::filters::filter::Filter;
use crate::keys::key_type::KeyType;

use super::format::{Header, StageHead, CHECKSUM_LEN};
use super::SnapshotInfo;

/// Writes a guard's filter as a snapshot, a chunk at a time: see
/// [`BloomGuard::snapshot`](crate::BloomGuard::snapshot).
pub struct SnapshotWriter {
    info: SnapshotInfo,
    filter: Arc<Filter>,
    head: Vec<u8>,
}

impl std::fmt::Debug for SnapshotWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnapshotWriter")
            .field("info", &self.info)
            .finish_non_exhaustive()
    }
}

impl SnapshotWriter {
    pub(crate) fn new(
        filter: Arc<Filter>,
        guard: &str,
        key_type: KeyType,
        fingerprint: &str,
        position: &str,
    ) -> Self {
        // The stages as they are now: one that grows while the chunks are
        // written is not in them, and its keys come with the replay.
        let stages: Vec<StageHead> = filter
            .stages()
            .map(|stage| StageHead {
                hashes: stage.hashes(),
                fpp: stage.fpp(),
                capacity: stage.capacity(),
                keys: stage.keys(),
                words: stage.word_count() as u64,
            })
            .collect();
        let words: u64 = stages.iter().map(|stage| stage.words).sum();
        let mut header = Header {
            info: SnapshotInfo {
                guard: guard.to_owned(),
                key_type,
                fingerprint: fingerprint.to_owned(),
                position: position.to_owned(),
                keys: stages.iter().map(|stage| stage.keys).sum(),
                capacity: stages.iter().map(|stage| stage.capacity).sum(),
                sub_filters: stages.len() as u32,
                bits: words * 64,
                len: 0,
            },
            seed: filter.seed(),
            skipped: filter.skipped(),
            stages,
        };
        let head = header.encode();
        header.info.len = head.len() as u64 + words * 8 + CHECKSUM_LEN as u64;
        Self {
            info: header.info,
            filter,
            head,
        }
    }

    /// What the snapshot says of itself; `len` is its length in bytes.
    pub fn info(&self) -> &SnapshotInfo {
        &self.info
    }

    /// The snapshot in chunks of `size` bytes (at least 64), the last one
    /// shorter. The bits are read as the chunks are made, so the memory
    /// held is one chunk, not a copy of the filter.
    pub fn chunks(self, size: usize) -> SnapshotChunks {
        SnapshotChunks {
            size: size.max(64),
            hasher: Sha256::new(),
            head: self.head,
            head_sent: 0,
            words: (self.info.bits / 64) as usize,
            word: 0,
            filter: self.filter,
            done: false,
        }
    }
}

/// The chunks of a snapshot, in order: an iterator of byte vectors.
pub struct SnapshotChunks {
    size: usize,
    hasher: Sha256,
    head: Vec<u8>,
    head_sent: usize,
    filter: Arc<Filter>,
    /// The words the header declares (a stage grown since is left out).
    words: usize,
    word: usize,
    done: bool,
}

impl std::fmt::Debug for SnapshotChunks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnapshotChunks")
            .field("size", &self.size)
            .field("word", &self.word)
            .field("words", &self.words)
            .finish_non_exhaustive()
    }
}

impl Iterator for SnapshotChunks {
    type Item = Vec<u8>;

    fn next(&mut self) -> Option<Vec<u8>> {
        if self.done {
            return None;
        }
        let mut chunk = Vec::with_capacity(self.size);
        let head = &self.head[self.head_sent..];
        let take = head.len().min(self.size);
        chunk.extend_from_slice(&head[..take]);
        self.head_sent += take;
        let room = (self.size - chunk.len()) / 8;
        if room > 0 && self.word < self.words {
            let take = room.min(self.words - self.word);
            self.filter.write_words(self.word, take, &mut chunk);
            self.word += take;
        }
        self.hasher.update(&chunk);
        if self.word == self.words
            && self.head_sent == self.head.len()
            && chunk.len() + CHECKSUM_LEN <= self.size
        {
            let checksum = std::mem::take(&mut self.hasher).finalize();
            chunk.extend_from_slice(&checksum);
            self.done = true;
        }
        Some(chunk)
    }
}
