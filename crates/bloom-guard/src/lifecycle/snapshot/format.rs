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
//! | 1 | filter kind: 0 Bloom, 1 counting (format 3; format 2 has no such byte and is a Bloom filter) |
//! | 16 | the hasher's secret seed |
//! | 8 | skipped keys |
//! | 4 | parts, `n`: a Bloom filter's sub-filters, a counting filter's shards |
//! | 36 × `n` (Bloom) | per sub-filter: hash functions (4), false-positive rate (8, `f64` bits), capacity, keys, 64-bit words of bits (8 each) |
//! | 8 + 16 × `n` (counting) | the target rate (`f64` bits); per shard: its keys and its length in bytes (8 each); format 4: 20 × `n`, each shard followed by its stage (4) |
//! | 4 + text, three times | guard name, key-query fingerprint, feed position (each at most [`MAX_TEXT`] bytes) |
//! | 4 + text (key type 5 only) | the collation's identity ([`Collation::identity`](crate::keys::Collation::identity)) |
//! | 8 × words | the parts, one after the other: a sub-filter's bits, a shard's bytes (qfilter's, in postcard) padded to whole words |
//! | 32 | SHA-256 of everything before |
//!
//! A counting filter's snapshot holds exactly the rows of the feed
//! position it names: its adopter applies each later delete once. Its
//! shards are listed stage by stage, oldest first; a filter of one stage
//! is written in format 3, which versions before stages read too.
//! Format 4 is written only for a counting filter of several stages.
//!
//! Every field that steers a replay (the position among them) is inside
//! the checksum.

use crate::keys::collation::Collation;
use crate::keys::key_type::KeyType;

use super::parts::{
    decode_shards, decode_stages, take, u32_at, u32_of, u64_of, Parts, StageHead, MAX_SHARDS,
    SHARD_LEN, STAGED_SHARD_LEN,
};
use super::{SnapshotError, SnapshotInfo};

/// The newest snapshot format this version writes: 4 for a counting
/// filter that grew stages, 3 for every other filter. It reads formats 2
/// to 4 (format 2: a Bloom filter, which a guard with a counting filter
/// refuses to adopt); format 1 (before filters grew sub-filters) is
/// refused, which leads to a scan.
pub const SNAPSHOT_FORMAT: u32 = 4;
/// The format of every snapshot but a counting filter's of several stages.
const ONE_STAGE_FORMAT: u32 = 3;
/// The oldest format this version reads.
const OLDEST_FORMAT: u32 = 2;
pub(super) const MAGIC: &[u8; 8] = b"BLMGUARD";
/// Magic, format, header length.
pub(super) const PREFIX_LEN: usize = 16;
/// Key type, seed, skipped keys, sub-filter count (format 2).
const FIXED_HEADER_LEN: usize = 1 + 16 + 8 + 4;
pub(super) const CHECKSUM_LEN: usize = 32;
/// The longest header any snapshot has.
pub(super) const MAX_HEADER_LEN: usize =
    FIXED_HEADER_LEN + 1 + 8 + STAGED_SHARD_LEN * MAX_SHARDS + 4 * (4 + MAX_TEXT);
/// The longest name, fingerprint or position a snapshot holds: a snapshot
/// with a longer one is refused when read, never cut short (a cut position
/// would replay from the wrong place).
pub(super) const MAX_TEXT: usize = 1 << 20;

/// The header, parsed.
#[derive(Debug)]
pub(super) struct Header {
    pub(super) info: SnapshotInfo,
    pub(super) seed: u128,
    pub(super) skipped: u64,
    pub(super) parts: Parts,
}

impl Header {
    /// The bytes of the prefix and the header.
    pub(super) fn encode(&self) -> Vec<u8> {
        let format = self.format();
        let mut header = Vec::with_capacity(FIXED_HEADER_LEN + 64);
        header.push(key_type_code(self.info.key_type));
        header.push(match self.parts {
            Parts::Bloom(_) => 0,
            Parts::Counting { .. } => 1,
        });
        header.extend_from_slice(&self.seed.to_le_bytes());
        header.extend_from_slice(&self.skipped.to_le_bytes());
        match &self.parts {
            Parts::Bloom(stages) => {
                header.extend_from_slice(&(stages.len() as u32).to_le_bytes());
                for stage in stages {
                    header.extend_from_slice(&stage.hashes.to_le_bytes());
                    header.extend_from_slice(&stage.fpp.to_bits().to_le_bytes());
                    for count in [stage.capacity, stage.keys, stage.words] {
                        header.extend_from_slice(&count.to_le_bytes());
                    }
                }
            }
            Parts::Counting { target_fpp, shards } => {
                header.extend_from_slice(&(shards.len() as u32).to_le_bytes());
                header.extend_from_slice(&target_fpp.to_bits().to_le_bytes());
                for shard in shards {
                    header.extend_from_slice(&shard.keys.to_le_bytes());
                    header.extend_from_slice(&shard.bytes.to_le_bytes());
                    if format >= 4 {
                        header.extend_from_slice(&shard.stage.to_le_bytes());
                    }
                }
            }
        }
        let info = &self.info;
        let collation = match info.key_type {
            KeyType::Collated(collation) => Some(collation.identity()),
            _ => None,
        };
        for text in [&info.guard, &info.fingerprint, &info.position]
            .into_iter()
            .chain(&collation)
        {
            // Whole, however long: the reader refuses what is too long.
            let len = u32::try_from(text.len()).unwrap_or(u32::MAX);
            header.extend_from_slice(&len.to_le_bytes());
            header.extend_from_slice(text.as_bytes());
        }
        let mut head = Vec::with_capacity(PREFIX_LEN + header.len());
        head.extend_from_slice(MAGIC);
        head.extend_from_slice(&format.to_le_bytes());
        head.extend_from_slice(&(header.len() as u32).to_le_bytes());
        head.extend_from_slice(&header);
        head
    }

    /// The format these parts need: the oldest that holds them.
    fn format(&self) -> u32 {
        match &self.parts {
            Parts::Counting { shards, .. } if shards.iter().any(|shard| shard.stage > 0) => {
                SNAPSHOT_FORMAT
            }
            _ => ONE_STAGE_FORMAT,
        }
    }

    /// The words of every part together.
    pub(super) fn words(&self) -> Option<u64> {
        self.parts
            .words()
            .into_iter()
            .try_fold(0_u64, |sum, words| sum.checked_add(words))
    }

    /// Parses the header's bytes (after the prefix) of a snapshot of
    /// `format`.
    pub(super) fn decode(mut bytes: &[u8], format: u32) -> Result<Self, SnapshotError> {
        let bytes = &mut bytes;
        let key_type_code = take(bytes, 1, "key type")?[0];
        let counting = if format >= 3 {
            match take(bytes, 1, "filter kind")?[0] {
                0 => false,
                1 => true,
                _ => return Err(SnapshotError::Field("filter kind")),
            }
        } else {
            false
        };
        let mut seed = [0; 16];
        seed.copy_from_slice(take(bytes, 16, "seed")?);
        let skipped = u64_of(bytes, "skipped keys")?;
        let count = u32_of(bytes, "sub-filters")? as usize;
        let parts = if counting {
            decode_shards(bytes, count, format >= 4)?
        } else {
            Parts::Bloom(decode_stages(bytes, count)?)
        };
        let guard = text(bytes, "guard")?;
        let fingerprint = text(bytes, "fingerprint")?;
        let position = text(bytes, "position")?;
        let key_type = match key_type_code {
            COLLATED => Collation::find(&text(bytes, "collation")?).map(KeyType::Collated),
            code => key_type_of(code),
        }
        // A collation this process never built: no guard of it to adopt.
        .ok_or(SnapshotError::Field("key type"))?;
        if !bytes.is_empty() {
            return Err(SnapshotError::Field("header length"));
        }
        let words = parts
            .words()
            .into_iter()
            .try_fold(0_u64, |sum, words| sum.checked_add(words))
            .ok_or(SnapshotError::Field("words"))?;
        let (keys, capacity, sub_filters) = match &parts {
            Parts::Bloom(stages) => {
                let sum = |field: fn(&StageHead) -> u64, name| {
                    stages
                        .iter()
                        .try_fold(0_u64, |sum, stage| sum.checked_add(field(stage)))
                        .ok_or(SnapshotError::Field(name))
                };
                (
                    sum(|s| s.keys, "keys")?,
                    sum(|s| s.capacity, "capacity")?,
                    count as u32,
                )
            }
            Parts::Counting { shards, .. } => {
                let keys = shards
                    .iter()
                    .try_fold(0_u64, |sum, shard| sum.checked_add(shard.keys))
                    .ok_or(SnapshotError::Field("keys"))?;
                let stages = shards.last().map_or(1, |shard| shard.stage + 1);
                (keys, keys, stages)
            }
        };
        Ok(Self {
            info: SnapshotInfo {
                guard,
                key_type,
                fingerprint,
                position,
                keys,
                capacity,
                sub_filters,
                bits: words.saturating_mul(64),
                len: 0,
            },
            seed: u128::from_le_bytes(seed),
            skipped,
            parts,
        })
    }
}

/// The format and header length the prefix declares, if they can be one.
pub(super) fn header_len(prefix: &[u8]) -> Result<(u32, usize), SnapshotError> {
    if &prefix[..8] != MAGIC {
        return Err(SnapshotError::NotASnapshot);
    }
    let format = u32_at(prefix, 8);
    if !(OLDEST_FORMAT..=SNAPSHOT_FORMAT).contains(&format) {
        return Err(SnapshotError::Format {
            found: format,
            supported: SNAPSHOT_FORMAT,
        });
    }
    let len = u32_at(prefix, 12) as usize;
    if !(FIXED_HEADER_LEN + SHARD_LEN..=MAX_HEADER_LEN).contains(&len) {
        return Err(SnapshotError::Field("header length"));
    }
    Ok((format, len))
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
        KeyType::SpacePaddedText => 4,
        KeyType::Collated(_) => COLLATED,
    }
}

/// The key type of a collation, whose identity follows the position.
const COLLATED: u8 = 5;

fn key_type_of(code: u8) -> Option<KeyType> {
    Some(match code {
        0 => KeyType::Text,
        1 => KeyType::CaseInsensitiveText,
        2 => KeyType::Integer,
        3 => KeyType::Uuid,
        4 => KeyType::SpacePaddedText,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_type_has_its_own_code() {
        let all = [
            KeyType::Text,
            KeyType::CaseInsensitiveText,
            KeyType::Integer,
            KeyType::Uuid,
            KeyType::SpacePaddedText,
        ];
        for key_type in all {
            assert_eq!(key_type_of(key_type_code(key_type)), Some(key_type));
        }
        let mut codes: Vec<u8> = all.into_iter().map(key_type_code).collect();
        codes.sort_unstable();
        codes.dedup();
        assert_eq!(codes.len(), all.len());
        assert_eq!(key_type_of(5), None);
    }
}
