//! Reading a snapshot from its chunks as they arrive.

use sha2::{Digest, Sha256};

use crate::filters::bloom::BloomParts;
use crate::filters::counting::parts::CountingParts;
use crate::filters::counting::{decode_shard, Shard};
use crate::filters::filter::FilterParts;

use super::format::{header_len, Header, CHECKSUM_LEN, PREFIX_LEN};
use super::parts::Parts;
use super::{Snapshot, SnapshotError};

/// Reads a snapshot from its chunks as they arrive, into the filter's
/// final memory: the bits are never held twice.
pub struct SnapshotReader {
    len: u64,
    received: u64,
    hasher: Sha256,
    /// Bytes of the prefix and header not yet parsed, or of a word cut
    /// between two chunks.
    pending: Vec<u8>,
    header: Option<Header>,
    /// Each part's length in words, as the header declares.
    lengths: Vec<u64>,
    /// Each part's words (a sub-filter's, a shard's), filled in order;
    /// a counting filter's shard is decoded as soon as it is whole, and its
    /// words let go.
    words: Vec<Vec<u64>>,
    /// The counting filter's shards decoded so far.
    shards: Vec<Shard>,
    /// The sub-filter being filled.
    stage: usize,
    checksum: Vec<u8>,
}

impl std::fmt::Debug for SnapshotReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnapshotReader")
            .field("len", &self.len)
            .field("received", &self.received)
            .finish_non_exhaustive()
    }
}

impl SnapshotReader {
    /// A reader for a snapshot of `len` bytes (as stored: the length is
    /// checked against the header before any memory is set aside for the
    /// bits).
    pub fn new(len: u64) -> Self {
        Self {
            len,
            received: 0,
            hasher: Sha256::new(),
            pending: Vec::new(),
            header: None,
            lengths: Vec::new(),
            words: Vec::new(),
            shards: Vec::new(),
            stage: 0,
            checksum: Vec::with_capacity(CHECKSUM_LEN),
        }
    }

    /// The next chunk.
    ///
    /// # Errors
    ///
    /// As soon as the bytes so far cannot be a snapshot of this format.
    pub fn push(&mut self, mut chunk: &[u8]) -> Result<(), SnapshotError> {
        self.received += chunk.len() as u64;
        if self.received > self.len {
            return Err(SnapshotError::Length {
                expected: self.len,
                received: self.received,
            });
        }
        // The checksum covers everything before its own 32 bytes.
        let body_end = self.len.saturating_sub(CHECKSUM_LEN as u64);
        let before = self.received - chunk.len() as u64;
        if before < body_end {
            let hashed = ((body_end - before) as usize).min(chunk.len());
            self.hasher.update(&chunk[..hashed]);
        }
        if self.header.is_none() {
            chunk = self.read_header(chunk)?;
            if self.header.is_none() {
                return Ok(());
            }
        }
        // A word cut between two chunks.
        if !self.pending.is_empty() && !self.words_done() {
            let take = (8 - self.pending.len()).min(chunk.len());
            self.pending.extend_from_slice(&chunk[..take]);
            chunk = &chunk[take..];
            if self.pending.len() == 8 {
                let word = std::mem::take(&mut self.pending);
                self.take_words(&word)?;
            }
        }
        chunk = self.take_words(chunk)?;
        if self.words_done() {
            self.checksum.extend_from_slice(chunk);
        } else {
            self.pending.extend_from_slice(chunk);
        }
        Ok(())
    }

    /// Fills the parts with the whole words at the start of `chunk`;
    /// returns the rest.
    fn take_words<'c>(&mut self, mut chunk: &'c [u8]) -> Result<&'c [u8], SnapshotError> {
        if self.header.is_none() {
            return Ok(chunk);
        }
        while let (Some(&length), Some(words)) =
            (self.lengths.get(self.stage), self.words.get_mut(self.stage))
        {
            let missing = (length - words.len() as u64) as usize;
            if missing == 0 {
                self.part_done()?;
                self.stage += 1;
                continue;
            }
            let whole = (chunk.len() / 8).min(missing);
            if whole == 0 {
                break;
            }
            // Memory for a part only once its words arrive.
            words.reserve_exact(missing);
            words.extend(chunk[..whole * 8].chunks_exact(8).map(|word| {
                u64::from_le_bytes([
                    word[0], word[1], word[2], word[3], word[4], word[5], word[6], word[7],
                ])
            }));
            chunk = &chunk[whole * 8..];
        }
        Ok(chunk)
    }

    /// Part `stage` is whole: a counting filter's shard is decoded now, so
    /// its words and its decoded copy are never held for every shard at
    /// once, and a shard that does not decode stops the read here.
    fn part_done(&mut self) -> Result<(), SnapshotError> {
        let Some(Header {
            parts: Parts::Counting { shards, .. },
            ..
        }) = &self.header
        else {
            return Ok(());
        };
        let (Some(head), Some(words)) = (shards.get(self.stage), self.words.get_mut(self.stage))
        else {
            return Ok(());
        };
        let mut bytes = Vec::with_capacity(words.len() * 8);
        for word in std::mem::take(words) {
            bytes.extend_from_slice(&word.to_le_bytes());
        }
        bytes.truncate(head.bytes as usize);
        let shard = decode_shard(&bytes).map_err(|_| SnapshotError::Field("shard"))?;
        self.shards.push(shard);
        Ok(())
    }

    fn words_done(&self) -> bool {
        self.header.is_some() && self.stage >= self.lengths.len()
    }

    /// Parses the prefix and header once they are complete; returns the
    /// rest of `chunk`.
    fn read_header<'c>(&mut self, chunk: &'c [u8]) -> Result<&'c [u8], SnapshotError> {
        let had = self.pending.len();
        self.pending.extend_from_slice(chunk);
        if self.pending.len() < PREFIX_LEN {
            return Ok(&[]);
        }
        let (format, header_len) = header_len(&self.pending[..PREFIX_LEN])?;
        let head_len = PREFIX_LEN + header_len;
        if self.pending.len() < head_len {
            return Ok(&[]);
        }
        let mut header = Header::decode(&self.pending[PREFIX_LEN..head_len], format)?;
        let expected = header
            .words()
            .and_then(|words| words.checked_mul(8))
            .and_then(|bits| bits.checked_add(head_len as u64 + CHECKSUM_LEN as u64))
            .ok_or(SnapshotError::Field("words"))?;
        if expected != self.len {
            return Err(SnapshotError::Length {
                expected,
                received: self.len,
            });
        }
        header.info.len = self.len;
        // The length matches the bytes stored: only now is memory set aside.
        self.lengths = header.parts.words();
        if self
            .lengths
            .iter()
            .any(|&words| usize::try_from(words).is_err())
        {
            return Err(SnapshotError::Field("words"));
        }
        self.words = vec![Vec::new(); self.lengths.len()];
        self.header = Some(header);
        self.pending.clear();
        Ok(&chunk[head_len - had..])
    }

    /// Checks the length and the checksum and returns the snapshot.
    ///
    /// # Errors
    ///
    /// [`SnapshotError::Length`] if bytes are missing,
    /// [`SnapshotError::Checksum`] if any byte changed.
    pub fn finish(self) -> Result<Snapshot, SnapshotError> {
        let (Some(header), true) = (self.header, self.received == self.len) else {
            return Err(SnapshotError::Length {
                expected: self.len,
                received: self.received,
            });
        };
        if self.checksum.len() != CHECKSUM_LEN || self.hasher.finalize()[..] != self.checksum[..] {
            return Err(SnapshotError::Checksum);
        }
        let parts = match header.parts {
            Parts::Bloom(stages) => FilterParts::Bloom(BloomParts {
                seed: header.seed,
                stages: stages
                    .iter()
                    .zip(self.words)
                    .map(|(stage, words)| stage.into_parts(words))
                    .collect(),
                skipped: header.skipped,
            }),
            Parts::Counting { target_fpp, shards } => {
                let mut stages: Vec<Vec<Shard>> = Vec::new();
                for (head, shard) in shards.iter().zip(self.shards) {
                    // The header lists stages in order from 0 (checked).
                    if stages.len() <= head.stage as usize {
                        stages.push(Vec::new());
                    }
                    if let Some(stage) = stages.last_mut() {
                        stage.push(shard);
                    }
                }
                FilterParts::Counting(CountingParts {
                    seed: header.seed,
                    target_fpp,
                    skipped: header.skipped,
                    stages,
                    overflow: Vec::new(),
                })
            }
        };
        Ok(Snapshot {
            parts,
            info: header.info,
        })
    }
}
