//! Writing a filter as a snapshot, a chunk at a time.

use std::collections::VecDeque;
use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::filters::counting::{encode_shard, encoded_len, CountingFilter, Shard};
use crate::filters::filter::Filter;
use crate::keys::key_type::KeyType;

use super::format::{Header, CHECKSUM_LEN};
use super::parts::{Parts, ShardHead, StageHead};
use super::SnapshotInfo;

/// Writes a guard's filter as a snapshot, a chunk at a time: see
/// [`FeedHandle::snapshot`](crate::feed::FeedHandle::snapshot).
pub struct SnapshotWriter {
    info: SnapshotInfo,
    body: Body,
    head: Vec<u8>,
}

/// Where the words after the header come from.
enum Body {
    /// A Bloom filter's bits, read as the chunks are made.
    Bloom(Arc<Filter>),
    /// A counting filter's shards of one moment.
    Shards(Shards),
}

impl Body {
    /// Words `from..from + count`; the chunks ask for them in order.
    fn write_words(&mut self, from: usize, count: usize, out: &mut Vec<u8>) {
        match self {
            Body::Bloom(filter) => {
                if let Some(bloom) = filter.bloom() {
                    bloom.write_words(from, count, out);
                }
            }
            Body::Shards(shards) => shards.write_words(count, out),
        }
    }
}

/// A counting filter's shards, taken at one moment and encoded one at a
/// time as the chunks reach them, each let go once written: the memory
/// held is one encoded shard, and the copies of the shards the filter
/// changed meanwhile.
struct Shards {
    /// The shards not yet written, in order, with the bytes the header
    /// declares for each.
    waiting: VecDeque<(Shard, usize)>,
    /// The shard being written, padded to whole words.
    current: Vec<u8>,
    /// Its bytes written so far.
    written: usize,
}

impl Shards {
    /// The next `count` words.
    fn write_words(&mut self, mut count: usize, out: &mut Vec<u8>) {
        while count > 0 {
            if self.written == self.current.len() {
                let Some((shard, bytes)) = self.waiting.pop_front() else {
                    return;
                };
                self.current = encode_shard(&shard);
                drop(shard);
                // Exactly what the header declares, in whole words.
                self.current.resize(bytes.div_ceil(8) * 8, 0);
                self.written = 0;
                continue;
            }
            let take = ((self.current.len() - self.written) / 8).min(count);
            out.extend_from_slice(&self.current[self.written..self.written + take * 8]);
            self.written += take * 8;
            count -= take;
        }
    }
}

impl std::fmt::Debug for SnapshotWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnapshotWriter")
            .field("info", &self.info)
            .finish_non_exhaustive()
    }
}

impl SnapshotWriter {
    /// A Bloom filter's snapshot, its bits read as the chunks are made;
    /// `None` for a counting filter.
    pub(crate) fn bloom(
        filter: Arc<Filter>,
        guard: &str,
        key_type: KeyType,
        fingerprint: &str,
        position: &str,
    ) -> Option<Self> {
        let bloom = filter.bloom()?;
        // The stages as they are now: one that grows while the chunks are
        // written is not in them, and its keys come with the replay.
        let stages: Vec<StageHead> = bloom
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
        let header = Header {
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
            seed: bloom.seed(),
            skipped: bloom.skipped(),
            parts: Parts::Bloom(stages),
        };
        Some(Self::with_body(header, words, Body::Bloom(filter)))
    }

    /// A counting filter's snapshot at the feed position its shards hold,
    /// taken now (a shard the feed changes before the chunks reach it is
    /// copied first); `None` if it is not exact (it may hold a row's insert
    /// twice, or miss a delete) or keys spilled past its last stage (a
    /// rebuild is due).
    pub(crate) fn counting(
        filter: &CountingFilter,
        guard: &str,
        key_type: KeyType,
        fingerprint: &str,
    ) -> Option<Self> {
        if !filter.exact() || filter.overflowed() {
            return None;
        }
        let (parts, position) = filter.to_parts();
        // Keys that overflowed while the copy was taken: a snapshot holds
        // no overflow table.
        if !parts.overflow.is_empty() || !filter.exact() {
            return None;
        }
        let position = position?;
        let mut shards: Vec<ShardHead> = parts
            .stages
            .iter()
            .zip(0_u32..)
            .flat_map(|(shards, stage)| {
                shards.iter().map(move |shard| ShardHead {
                    keys: 0,
                    bytes: encoded_len(shard) as u64,
                    stage,
                })
            })
            .collect();
        let words: u64 = shards.iter().map(|shard| shard.words()).sum();
        // The copies the shards of that moment hold (the filter's own count
        // may have moved since).
        let keys: u64 = parts.stages.iter().flatten().map(|shard| shard.len()).sum();
        if let Some(first) = shards.first_mut() {
            // The keys are counted once, on the first shard.
            first.keys = keys;
        }
        let header = Header {
            info: SnapshotInfo {
                guard: guard.to_owned(),
                key_type,
                fingerprint: fingerprint.to_owned(),
                position,
                keys,
                capacity: keys,
                sub_filters: u32::try_from(parts.stages.len()).unwrap_or(u32::MAX),
                bits: words * 64,
                len: 0,
            },
            seed: parts.seed,
            skipped: parts.skipped,
            parts: Parts::Counting {
                target_fpp: parts.target_fpp,
                shards,
            },
        };
        let Parts::Counting { shards: heads, .. } = &header.parts else {
            return None;
        };
        let waiting = parts
            .stages
            .into_iter()
            .flatten()
            .zip(heads.iter().map(|head| head.bytes as usize))
            .collect();
        let body = Body::Shards(Shards {
            waiting,
            current: Vec::new(),
            written: 0,
        });
        Some(Self::with_body(header, words, body))
    }

    fn with_body(mut header: Header, words: u64, body: Body) -> Self {
        let head = header.encode();
        header.info.len = head.len() as u64 + words * 8 + CHECKSUM_LEN as u64;
        Self {
            info: header.info,
            body,
            head,
        }
    }

    /// What the snapshot says of itself; `len` is its length in bytes.
    pub fn info(&self) -> &SnapshotInfo {
        &self.info
    }

    /// The snapshot format it is written in: the oldest that holds the
    /// filter (3, or 4 for a counting filter of several stages; see
    /// [`SNAPSHOT_FORMAT`](crate::snapshot::SNAPSHOT_FORMAT)). A store that keeps
    /// snapshots by format records this one, so that versions that read
    /// only older formats still find the snapshots they can read.
    pub fn format(&self) -> u32 {
        u32::from_le_bytes([self.head[8], self.head[9], self.head[10], self.head[11]])
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
            body: self.body,
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
    body: Body,
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
            self.body.write_words(self.word, take, &mut chunk);
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
