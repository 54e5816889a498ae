//! The snapshot's bytes: the fixed prefix, the header and its parsing.
//!
//! Layout (integers little-endian):
//!
//! | bytes | field |
//! |---|---|
//! | 8 | magic `BLMGUARD` |
//! | 4 | format ([`SNAPSHOT_FORMAT`]) |
//! | 4 | length of the header that follows |
//! | 1 | key type |
//! | 16 | the hasher's secret seed |
//! | 8 | skipped keys |
//! | 4 | sub-filters, `n` |
//! | 36 × `n` | per sub-filter: hash functions (4), false-positive rate (8, `f64` bits), capacity, keys, 64-bit words of bits (8 each) |
//! | 4 + text, three times | guard name, key-query fingerprint, feed position (each at most [`MAX_TEXT`] bytes) |
//! | 8 × words | the bits, sub-filter after sub-filter |
//! | 32 | SHA-256 of everything before |
//!
//! Every field that steers a replay (the position among them) is inside
//! the checksum.

use crate::filters::filter::{MAX_STAGES, MIN_FPP};
use crate::filters::stage::StageParts;
use crate::keys::key_type::KeyType;

use super::{SnapshotError, SnapshotInfo};

/// The snapshot format this version writes and reads. Format 1 (before
/// filters grew sub-filters) is refused, which leads to a scan.
pub const SNAPSHOT_FORMAT: u32 = 2;

pub(super) const MAGIC: &[u8; 8] = b"BLMGUARD";
/// Magic, format, header length.
pub(super) const PREFIX_LEN: usize = 16;
/// Key type, seed, skipped keys, sub-filter count.
const FIXED_HEADER_LEN: usize = 1 + 16 + 8 + 4;
/// Hashes, rate, capacity, keys, words.
const STAGE_LEN: usize = 4 + 8 * 4;
pub(super) const CHECKSUM_LEN: usize = 32;
/// The longest header any snapshot has.
pub(super) const MAX_HEADER_LEN: usize =
    FIXED_HEADER_LEN + STAGE_LEN * MAX_STAGES + 3 * (4 + MAX_TEXT);
/// The longest name, fingerprint or position a snapshot holds: a snapshot
/// with a longer one is refused when read, never cut short (a cut position
/// would replay from the wrong place).
pub(super) const MAX_TEXT: usize = 1 << 20;

/// A sub-filter as the header describes it.
#[derive(Debug, Clone, Copy)]
pub(super) struct StageHead {
    pub(super) hashes: u32,
    pub(super) fpp: f64,
    pub(super) capacity: u64,
    pub(super) keys: u64,
    pub(super) words: u64,
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

/// The header, parsed.
#[derive(Debug)]
pub(super) struct Header {
    pub(super) info: SnapshotInfo,
    pub(super) seed: u128,
    pub(super) skipped: u64,
    pub(super) stages: Vec<StageHead>,
}

impl Header {
    /// The bytes of the prefix and the header.
    pub(super) fn encode(&self) -> Vec<u8> {
        let mut header = Vec::with_capacity(FIXED_HEADER_LEN + STAGE_LEN * self.stages.len() + 64);
        header.push(key_type_code(self.info.key_type));
        header.extend_from_slice(&self.seed.to_le_bytes());
        header.extend_from_slice(&self.skipped.to_le_bytes());
        header.extend_from_slice(&(self.stages.len() as u32).to_le_bytes());
        for stage in &self.stages {
            header.extend_from_slice(&stage.hashes.to_le_bytes());
            header.extend_from_slice(&stage.fpp.to_bits().to_le_bytes());
            for count in [stage.capacity, stage.keys, stage.words] {
                header.extend_from_slice(&count.to_le_bytes());
            }
        }
        let info = &self.info;
        for text in [&info.guard, &info.fingerprint, &info.position] {
            // Whole, however long: the reader refuses what is too long.
            let len = u32::try_from(text.len()).unwrap_or(u32::MAX);
            header.extend_from_slice(&len.to_le_bytes());
            header.extend_from_slice(text.as_bytes());
        }
        let mut head = Vec::with_capacity(PREFIX_LEN + header.len());
        head.extend_from_slice(MAGIC);
        head.extend_from_slice(&SNAPSHOT_FORMAT.to_le_bytes());
        head.extend_from_slice(&(header.len() as u32).to_le_bytes());
        head.extend_from_slice(&header);
        head
    }

    /// The words of bits of every sub-filter together.
    pub(super) fn words(&self) -> Option<u64> {
        total_words(&self.stages)
    }

    /// Parses the header's bytes (after the prefix).
    pub(super) fn decode(mut bytes: &[u8]) -> Result<Self, SnapshotError> {
        let bytes = &mut bytes;
        let key_type =
            key_type_of(take(bytes, 1, "key type")?[0]).ok_or(SnapshotError::Field("key type"))?;
        let mut seed = [0; 16];
        seed.copy_from_slice(take(bytes, 16, "seed")?);
        let skipped = u64_of(bytes, "skipped keys")?;
        let count = u32_of(bytes, "sub-filters")? as usize;
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
        let guard = text(bytes, "guard")?;
        let fingerprint = text(bytes, "fingerprint")?;
        let position = text(bytes, "position")?;
        if !bytes.is_empty() {
            return Err(SnapshotError::Field("header length"));
        }
        let words = total_words(&stages).ok_or(SnapshotError::Field("words"))?;
        let sum = |field: fn(&StageHead) -> u64, name| {
            stages
                .iter()
                .try_fold(0_u64, |sum, stage| sum.checked_add(field(stage)))
                .ok_or(SnapshotError::Field(name))
        };
        let (keys, capacity) = (sum(|s| s.keys, "keys")?, sum(|s| s.capacity, "capacity")?);
        Ok(Self {
            info: SnapshotInfo {
                guard,
                key_type,
                fingerprint,
                position,
                keys,
                capacity,
                sub_filters: count as u32,
                bits: words.saturating_mul(64),
                len: 0,
            },
            seed: u128::from_le_bytes(seed),
            skipped,
            stages,
        })
    }
}

fn total_words(stages: &[StageHead]) -> Option<u64> {
    stages
        .iter()
        .try_fold(0_u64, |sum, stage| sum.checked_add(stage.words))
}

/// The header length the prefix declares, if it can be one.
pub(super) fn header_len(prefix: &[u8]) -> Result<usize, SnapshotError> {
    if &prefix[..8] != MAGIC {
        return Err(SnapshotError::NotASnapshot);
    }
    let format = u32_at(prefix, 8);
    if format != SNAPSHOT_FORMAT {
        return Err(SnapshotError::Format {
            found: format,
            supported: SNAPSHOT_FORMAT,
        });
    }
    let len = u32_at(prefix, 12) as usize;
    if !(FIXED_HEADER_LEN + STAGE_LEN..=MAX_HEADER_LEN).contains(&len) {
        return Err(SnapshotError::Field("header length"));
    }
    Ok(len)
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

fn take<'b>(
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

fn u32_of(bytes: &mut &[u8], field: &'static str) -> Result<u32, SnapshotError> {
    Ok(u32_at(take(bytes, 4, field)?, 0))
}

fn u64_of(bytes: &mut &[u8], field: &'static str) -> Result<u64, SnapshotError> {
    let mut word = [0; 8];
    word.copy_from_slice(take(bytes, 8, field)?);
    Ok(u64::from_le_bytes(word))
}

fn text(bytes: &mut &[u8], field: &'static str) -> Result<String, SnapshotError> {
    let len = u32_of(bytes, field)? as usize;
    if len > MAX_TEXT {
        return Err(SnapshotError::Field(field));
    }
    let raw = take(bytes, len, field)?;
    String::from_utf8(raw.to_vec()).map_err(|_| SnapshotError::Field(field))
}

fn key_type_code(key_type: KeyType) -> u8 {
    match key_type {
        KeyType::Text => 0,
        KeyType::CaseInsensitiveText => 1,
        KeyType::Integer => 2,
        KeyType::Uuid => 3,
    }
}

fn key_type_of(code: u8) -> Option<KeyType> {
    Some(match code {
        0 => KeyType::Text,
        1 => KeyType::CaseInsensitiveText,
        2 => KeyType::Integer,
        3 => KeyType::Uuid,
        _ => return None,
    })
}
