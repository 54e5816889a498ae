//! The parts a snapshot's header describes (a Bloom filter's sub-filters,
//! a counting filter's shards by stage), read and checked, and the reading
//! of the header's integers.

use crate::filters::counting::MAX_STAGES as MAX_COUNTING_STAGES;
use crate::filters::filter::{MAX_STAGES, MIN_FPP};
use crate::filters::stage::StageParts;

use super::SnapshotError;

/// The most shards a counting filter's snapshot may declare.
pub(super) const MAX_SHARDS: usize = 1 << 16;
/// A shard's keys and length (format 3).
pub(super) const SHARD_LEN: usize = 16;
/// A shard's keys, length and stage (format 4).
pub(super) const STAGED_SHARD_LEN: usize = SHARD_LEN + 4;

/// A sub-filter as the header describes it.
#[derive(Debug, Clone, Copy)]
pub(super) struct StageHead {
    pub(super) hashes: u32,
    pub(super) fpp: f64,
    pub(super) capacity: u64,
    pub(super) keys: u64,
    pub(super) words: u64,
}

/// A counting filter's shard as the header describes it.
#[derive(Debug, Clone, Copy)]
pub(super) struct ShardHead {
    pub(super) keys: u64,
    pub(super) bytes: u64,
    /// The stage it belongs to, from 0.
    pub(super) stage: u32,
}

impl ShardHead {
    pub(super) fn words(self) -> u64 {
        self.bytes.div_ceil(8)
    }
}

/// The parts a header describes, by filter kind.
#[derive(Debug, Clone)]
pub(super) enum Parts {
    Bloom(Vec<StageHead>),
    Counting {
        target_fpp: f64,
        shards: Vec<ShardHead>,
    },
}

impl Parts {
    /// Each part's length in 64-bit words, in order.
    pub(super) fn words(&self) -> Vec<u64> {
        match self {
            Parts::Bloom(stages) => stages.iter().map(|stage| stage.words).collect(),
            Parts::Counting { shards, .. } => shards.iter().map(|shard| shard.words()).collect(),
        }
    }
}

impl StageHead {
    pub(super) fn into_parts(self, words: Vec<u64>) -> StageParts {
        StageParts {
            words,
            hashes: self.hashes,
            fpp: self.fpp,
            capacity: self.capacity,
            keys: self.keys,
        }
    }
}

/// A Bloom filter's sub-filters, checked.
pub(super) fn decode_stages(
    bytes: &mut &[u8],
    count: usize,
) -> Result<Vec<StageHead>, SnapshotError> {
    if count == 0 || count > MAX_STAGES {
        return Err(SnapshotError::Field("sub-filters"));
    }
    let mut stages = Vec::with_capacity(count);
    for _ in 0..count {
        let stage = StageHead {
            hashes: u32_of(bytes, "hashes")?,
            fpp: f64::from_bits(u64_of(bytes, "rate")?),
            capacity: u64_of(bytes, "capacity")?,
            keys: u64_of(bytes, "keys")?,
            words: u64_of(bytes, "words")?,
        };
        if stage.words == 0 {
            return Err(SnapshotError::Field("words"));
        }
        if stage.hashes == 0 || stage.hashes > 64 {
            return Err(SnapshotError::Field("hashes"));
        }
        if !(MIN_FPP..1.0).contains(&stage.fpp) {
            return Err(SnapshotError::Field("rate"));
        }
        // No sub-filter holds more keys than it has bits.
        if stage.capacity == 0 || stage.capacity > stage.words.saturating_mul(64) {
            return Err(SnapshotError::Field("capacity"));
        }
        stages.push(stage);
    }
    Ok(stages)
}

/// A counting filter's target rate and shards, checked: stages from 0,
/// in order, none empty.
pub(super) fn decode_shards(
    bytes: &mut &[u8],
    count: usize,
    staged: bool,
) -> Result<Parts, SnapshotError> {
    if count == 0 || count > MAX_SHARDS {
        return Err(SnapshotError::Field("shards"));
    }
    let target_fpp = f64::from_bits(u64_of(bytes, "rate")?);
    if !(MIN_FPP..1.0).contains(&target_fpp) {
        return Err(SnapshotError::Field("rate"));
    }
    let mut shards = Vec::with_capacity(count);
    for _ in 0..count {
        let shard = ShardHead {
            keys: u64_of(bytes, "keys")?,
            bytes: u64_of(bytes, "shard length")?,
            stage: if staged { u32_of(bytes, "stage")? } else { 0 },
        };
        if shard.bytes == 0 {
            return Err(SnapshotError::Field("shard length"));
        }
        let last = shards.last().map_or(0, |last: &ShardHead| last.stage);
        let first = shards.is_empty();
        if !(shard.stage == last || (!first && shard.stage == last + 1))
            || shard.stage as usize >= MAX_COUNTING_STAGES
        {
            return Err(SnapshotError::Field("stage"));
        }
        shards.push(shard);
    }
    Ok(Parts::Counting { target_fpp, shards })
}

pub(super) fn take<'b>(
    bytes: &mut &'b [u8],
    n: usize,
    field: &'static str,
) -> Result<&'b [u8], SnapshotError> {
    if bytes.len() < n {
        return Err(SnapshotError::Field(field));
    }
    let (head, rest) = bytes.split_at(n);
    *bytes = rest;
    Ok(head)
}

pub(super) fn u32_of(bytes: &mut &[u8], field: &'static str) -> Result<u32, SnapshotError> {
    Ok(u32_at(take(bytes, 4, field)?, 0))
}

pub(super) fn u64_of(bytes: &mut &[u8], field: &'static str) -> Result<u64, SnapshotError> {
    let mut word = [0; 8];
    word.copy_from_slice(take(bytes, 8, field)?);
    Ok(u64::from_le_bytes(word))
}

pub(super) fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}
