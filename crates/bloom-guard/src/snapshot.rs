//! Snapshots: a filter written out with everything needed to trust it
//! again elsewhere, and read back chunk by chunk.
//!
//! Layout (integers little-endian):
//!
//! | bytes | field |
//! |---|---|
//! | 8 | magic `BLMGUARD` |
//! | 4 | format ([`SNAPSHOT_FORMAT`]) |
//! | 4 | length of the header that follows |
//! | 1 | key type |
//! | 4 | hash functions |
//! | 16 | the hasher's secret seed |
//! | 8 × 4 | capacity, keys, skipped keys, 64-bit words of bits |
//! | 2 + n, three times | guard name, key-query fingerprint, feed position |
//! | 8 × words | the bits |
//! | 32 | SHA-256 of everything before |

use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::filter::{Filter, FilterParts};
use crate::key_type::KeyType;

/// The snapshot format this version writes and reads.
pub const SNAPSHOT_FORMAT: u32 = 1;

const MAGIC: &[u8; 8] = b"BLMGUARD";
/// Magic, format, header length.
const PREFIX_LEN: usize = 16;
/// Key type, hashes, seed, four counts.
const FIXED_HEADER_LEN: usize = 1 + 4 + 16 + 8 * 4;
const CHECKSUM_LEN: usize = 32;

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
    /// filter, so replaying the feed from there completes it.
    pub position: String,
    /// Keys in the filter.
    pub keys: u64,
    /// The filter's size in bits.
    pub bits: u64,
    /// The snapshot's length in bytes.
    pub len: u64,
}

/// A filter read back from a snapshot, checked, ready to
/// [adopt](crate::BloomGuard::adopt).
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
}

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
        let words = filter.word_count() as u64;
        let mut header = Vec::with_capacity(FIXED_HEADER_LEN + 64);
        header.push(key_type_code(key_type));
        header.extend_from_slice(&filter.hashes().to_le_bytes());
        header.extend_from_slice(&filter.seed().to_le_bytes());
        for count in [filter.capacity(), filter.keys(), filter.skipped(), words] {
            header.extend_from_slice(&count.to_le_bytes());
        }
        for text in [guard, fingerprint, position] {
            // Names, fingerprints and positions are short; longer text is
            // cut at a character boundary rather than refused.
            let mut end = text.len().min(usize::from(u16::MAX));
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            header.extend_from_slice(&(end as u16).to_le_bytes());
            header.extend_from_slice(&text.as_bytes()[..end]);
        }
        let mut head = Vec::with_capacity(PREFIX_LEN + header.len());
        head.extend_from_slice(MAGIC);
        head.extend_from_slice(&SNAPSHOT_FORMAT.to_le_bytes());
        head.extend_from_slice(&(header.len() as u32).to_le_bytes());
        head.extend_from_slice(&header);
        let len = head.len() as u64 + words * 8 + CHECKSUM_LEN as u64;
        Self {
            info: SnapshotInfo {
                guard: guard.to_owned(),
                key_type,
                fingerprint: fingerprint.to_owned(),
                position: position.to_owned(),
                keys: filter.keys(),
                bits: filter.bits(),
                len,
            },
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
        let size = size.max(64);
        SnapshotChunks {
            size,
            hasher: Sha256::new(),
            head: self.head,
            head_sent: 0,
            words: self.filter.word_count() as u64,
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
    words: u64,
    word: u64,
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
            let take = (room as u64).min(self.words - self.word);
            for word in self.filter.words(self.word as usize, take as usize) {
                chunk.extend_from_slice(&word.to_le_bytes());
            }
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

/// Reads a snapshot from its chunks as they arrive, into the filter's
/// final memory: the bits are never held twice.
pub struct SnapshotReader {
    len: u64,
    received: u64,
    hasher: Sha256,
    /// Bytes of the prefix and header not yet parsed, or of a word cut
    /// between two chunks, or of the checksum.
    pending: Vec<u8>,
    header: Option<Header>,
    words: Vec<u64>,
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

struct Header {
    info: SnapshotInfo,
    seed: u128,
    hashes: u32,
    capacity: u64,
    skipped: u64,
    words: u64,
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
            words: Vec::new(),
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
        }
        let Some(header) = &self.header else {
            return Ok(());
        };
        let wanted = header.words;
        // A word cut between two chunks.
        if !self.pending.is_empty() && (self.words.len() as u64) < wanted {
            let need = 8 - self.pending.len();
            let take = need.min(chunk.len());
            self.pending.extend_from_slice(&chunk[..take]);
            chunk = &chunk[take..];
            if self.pending.len() == 8 {
                let bytes: [u8; 8] = self.pending[..]
                    .try_into()
                    .map_err(|_| SnapshotError::Field("bits"))?;
                self.words.push(u64::from_le_bytes(bytes));
                self.pending.clear();
            }
        }
        let missing = (wanted - self.words.len() as u64) as usize;
        let whole = (chunk.len() / 8).min(missing);
        self.words
            .extend(chunk[..whole * 8].chunks_exact(8).map(|word| {
                u64::from_le_bytes([
                    word[0], word[1], word[2], word[3], word[4], word[5], word[6], word[7],
                ])
            }));
        chunk = &chunk[whole * 8..];
        if (self.words.len() as u64) < wanted {
            self.pending.extend_from_slice(chunk);
        } else {
            self.checksum.extend_from_slice(chunk);
        }
        Ok(())
    }

    /// Parses the prefix and header once they are complete; returns the
    /// rest of `chunk`.
    fn read_header<'c>(&mut self, chunk: &'c [u8]) -> Result<&'c [u8], SnapshotError> {
        let had = self.pending.len();
        self.pending.extend_from_slice(chunk);
        if self.pending.len() < PREFIX_LEN {
            return Ok(&[]);
        }
        if &self.pending[..8] != MAGIC {
            return Err(SnapshotError::NotASnapshot);
        }
        let format = u32_at(&self.pending, 8);
        if format != SNAPSHOT_FORMAT {
            return Err(SnapshotError::Format {
                found: format,
                supported: SNAPSHOT_FORMAT,
            });
        }
        let header_len = u32_at(&self.pending, 12) as usize;
        if header_len < FIXED_HEADER_LEN
            || header_len > FIXED_HEADER_LEN + 3 * (2 + usize::from(u16::MAX))
        {
            return Err(SnapshotError::Field("header length"));
        }
        let head_len = PREFIX_LEN + header_len;
        if self.pending.len() < head_len {
            return Ok(&[]);
        }
        let header = parse_header(&self.pending[PREFIX_LEN..head_len])?;
        let expected = header
            .words
            .checked_mul(8)
            .and_then(|bits| bits.checked_add(head_len as u64 + CHECKSUM_LEN as u64))
            .ok_or(SnapshotError::Field("words"))?;
        if expected != self.len {
            return Err(SnapshotError::Length {
                expected,
                received: self.len,
            });
        }
        let mut header = header;
        header.info.len = self.len;
        let words = usize::try_from(header.words).map_err(|_| SnapshotError::Field("words"))?;
        self.words = Vec::with_capacity(words);
        self.header = Some(header);
        let used = head_len - had;
        self.pending.clear();
        Ok(&chunk[used..])
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
        Ok(Snapshot {
            parts: FilterParts {
                seed: header.seed,
                words: self.words,
                hashes: header.hashes,
                capacity: header.capacity,
                keys: header.info.keys,
                skipped: header.skipped,
            },
            info: header.info,
        })
    }
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

fn parse_header(mut bytes: &[u8]) -> Result<Header, SnapshotError> {
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
    fn u64_of(bytes: &mut &[u8], field: &'static str) -> Result<u64, SnapshotError> {
        let raw = take(bytes, 8, field)?;
        let mut word = [0; 8];
        word.copy_from_slice(raw);
        Ok(u64::from_le_bytes(word))
    }
    fn text(bytes: &mut &[u8], field: &'static str) -> Result<String, SnapshotError> {
        let len = take(bytes, 2, field)?;
        let len = usize::from(u16::from_le_bytes([len[0], len[1]]));
        let raw = take(bytes, len, field)?;
        String::from_utf8(raw.to_vec()).map_err(|_| SnapshotError::Field(field))
    }
    let key_type =
        key_type_of(take(&mut bytes, 1, "key type")?[0]).ok_or(SnapshotError::Field("key type"))?;
    let hashes = take(&mut bytes, 4, "hashes")?;
    let hashes = u32::from_le_bytes([hashes[0], hashes[1], hashes[2], hashes[3]]);
    let mut seed = [0; 16];
    seed.copy_from_slice(take(&mut bytes, 16, "seed")?);
    let capacity = u64_of(&mut bytes, "capacity")?;
    let keys = u64_of(&mut bytes, "keys")?;
    let skipped = u64_of(&mut bytes, "skipped keys")?;
    let words = u64_of(&mut bytes, "words")?;
    let guard = text(&mut bytes, "guard")?;
    let fingerprint = text(&mut bytes, "fingerprint")?;
    let position = text(&mut bytes, "position")?;
    if !bytes.is_empty() {
        return Err(SnapshotError::Field("header length"));
    }
    if words == 0 || hashes == 0 {
        return Err(SnapshotError::Field("words"));
    }
    Ok(Header {
        info: SnapshotInfo {
            guard,
            key_type,
            fingerprint,
            position,
            keys,
            bits: words.saturating_mul(64),
            len: 0,
        },
        seed: u128::from_le_bytes(seed),
        hashes,
        capacity,
        skipped,
        words,
    })
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AdoptError, BloomGuard, KeyBatch, KeyList};

    const QUERY: &str = "select key from items";

    async fn built(keys: usize) -> (BloomGuard, Vec<String>) {
        let guard = BloomGuard::builder().name("items").build();
        let keys: Vec<String> = (0..keys).map(|i| format!("key-{i}")).collect();
        guard
            .rebuild(&KeyList::new(keys.clone()))
            .await
            .expect("build");
        (guard, keys)
    }

    fn bytes_of(guard: &BloomGuard, position: &str) -> Vec<u8> {
        guard
            .snapshot(position, QUERY)
            .expect("a complete filter")
            .chunks(4096)
            .flatten()
            .collect()
    }

    async fn adopt(snapshot: Snapshot) -> Result<BloomGuard, AdoptError> {
        let guard = BloomGuard::builder().name("items").build();
        guard
            .adopt(snapshot, QUERY, async { Ok::<(), std::io::Error>(()) })
            .await?;
        Ok(guard)
    }

    #[tokio::test]
    async fn a_snapshot_read_in_any_chunks_is_the_same_filter() {
        let (guard, keys) = built(5_000).await;
        let writer = guard.snapshot("pos-1", QUERY).expect("complete");
        let len = writer.info().len;
        let chunks: Vec<Vec<u8>> = writer.chunks(1000).collect();
        assert!(chunks.iter().all(|chunk| chunk.len() <= 1000));
        let bytes: Vec<u8> = chunks.concat();
        assert_eq!(bytes.len() as u64, len);
        // Pushed in pieces that cut the header, words and checksum anywhere.
        for piece in [1, 3, 7, 8, 13, 4096, bytes.len()] {
            let mut reader = SnapshotReader::new(len);
            for part in bytes.chunks(piece) {
                reader.push(part).expect("intact");
            }
            let snapshot = reader.finish().expect("intact");
            assert_eq!(snapshot.info().position, "pos-1");
            assert_eq!(snapshot.info().guard, "items");
            let restored = adopt(snapshot).await.expect("adopted");
            assert!(keys.iter().all(|key| restored.may_contain(key)));
            assert_eq!(restored.stats().origin, Some(crate::FilterOrigin::Snapshot));
            assert_eq!(restored.stats().keys, guard.stats().keys);
            // Same seed and bits: the same answer for absent keys too.
            for i in 0..2_000 {
                let absent = format!("absent-{i}");
                assert_eq!(restored.may_contain(&absent), guard.may_contain(&absent));
            }
        }
    }

    #[tokio::test]
    async fn every_flipped_byte_is_refused() {
        let (guard, _) = built(200).await;
        let bytes = bytes_of(&guard, "7");
        for at in (0..bytes.len()).step_by(7).chain([bytes.len() - 1]) {
            let mut damaged = bytes.clone();
            damaged[at] ^= 0x10;
            assert!(
                Snapshot::decode(&damaged).is_err(),
                "byte {at} flipped was accepted"
            );
        }
    }

    #[tokio::test]
    async fn a_truncated_or_padded_snapshot_is_refused() {
        let (guard, _) = built(200).await;
        let bytes = bytes_of(&guard, "7");
        let writer = guard.snapshot("7", QUERY).expect("complete");
        let chunks: Vec<Vec<u8>> = writer.chunks(256).collect();
        // A chunk missing from the middle, then a chunk cut short.
        let mut without: Vec<u8> = Vec::new();
        for (i, chunk) in chunks.iter().enumerate() {
            if i != 2 {
                without.extend_from_slice(chunk);
            }
        }
        let mut reader = SnapshotReader::new(bytes.len() as u64);
        let refused = reader.push(&without).and_then(|()| reader.finish());
        assert!(refused.is_err());
        assert!(matches!(
            Snapshot::decode(&bytes[..bytes.len() - 10]),
            Err(SnapshotError::Length { .. })
        ));
        let mut padded = bytes.clone();
        padded.push(0);
        assert!(Snapshot::decode(&padded).is_err());
        let mut reader = SnapshotReader::new(bytes.len() as u64);
        reader.push(&bytes[..100]).expect("a prefix");
        assert!(matches!(reader.finish(), Err(SnapshotError::Length { .. })));
    }

    #[tokio::test]
    async fn a_header_asking_for_any_size_is_refused_before_allocating() {
        let (guard, _) = built(10).await;
        let bytes = bytes_of(&guard, "7");
        // The word count: after the prefix, key type, hashes, seed and
        // three counts.
        let at = PREFIX_LEN + 1 + 4 + 16 + 8 * 3;
        for words in [u64::MAX, u64::MAX / 8, 1 << 40, 0] {
            let mut hostile = bytes.clone();
            hostile[at..at + 8].copy_from_slice(&words.to_le_bytes());
            assert!(Snapshot::decode(&hostile).is_err(), "{words} words");
        }
        let mut hostile = bytes.clone();
        hostile[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(
            Snapshot::decode(&hostile).err(),
            Some(SnapshotError::Field("header length"))
        );
    }

    #[tokio::test]
    async fn another_format_is_refused_by_name() {
        let (guard, _) = built(10).await;
        let mut bytes = bytes_of(&guard, "7");
        bytes[8] = 2;
        assert_eq!(
            Snapshot::decode(&bytes).err(),
            Some(SnapshotError::Format {
                found: 2,
                supported: SNAPSHOT_FORMAT
            })
        );
        assert_eq!(
            Snapshot::decode(b"PNG not a snapshot at all").err(),
            Some(SnapshotError::NotASnapshot)
        );
    }

    #[tokio::test]
    async fn another_guard_key_type_or_query_is_refused() {
        let (guard, _) = built(10).await;
        let bytes = bytes_of(&guard, "7");
        let users = BloomGuard::builder().name("users").build();
        let uuids = BloomGuard::builder()
            .name("items")
            .key_type(crate::KeyType::Uuid)
            .build();
        let items = BloomGuard::builder().name("items").build();
        let nothing = || async { Ok::<(), std::io::Error>(()) };
        for (candidate, query, what) in [
            (&users, QUERY, "guard"),
            (&uuids, QUERY, "key type"),
            (&items, "select other from items", "key query"),
        ] {
            let snapshot = Snapshot::decode(&bytes).expect("intact");
            match candidate.adopt(snapshot, query, nothing()).await {
                Err(AdoptError::Mismatch { what: found, .. }) => assert_eq!(found, what),
                other => panic!("{what}: {other:?}"),
            }
            assert_eq!(candidate.stats().generation, 0, "{what}");
        }
    }

    #[tokio::test]
    async fn keys_replayed_by_the_catch_up_are_in_the_adopted_filter() {
        let (guard, _) = built(100).await;
        let snapshot = Snapshot::decode(&bytes_of(&guard, "7")).expect("intact");
        let other = BloomGuard::builder().name("items").build();
        let replaying = other.clone();
        other
            .adopt(snapshot, QUERY, async move {
                let batch: KeyBatch = ["committed-after-the-snapshot"].into_iter().collect();
                replaying.insert_batch(&batch);
                Ok::<(), std::io::Error>(())
            })
            .await
            .expect("adopted");
        assert!(other.may_contain("committed-after-the-snapshot"));
        assert!(other.is_ready());
    }

    #[tokio::test]
    async fn a_failed_catch_up_keeps_the_filter_in_use() {
        let (guard, _) = built(100).await;
        let snapshot = Snapshot::decode(&bytes_of(&guard, "7")).expect("intact");
        let (other, _) = built(5).await;
        let failed = other
            .adopt(snapshot, QUERY, async {
                Err::<(), _>(std::io::Error::other("the feed is gone"))
            })
            .await;
        assert!(matches!(failed, Err(AdoptError::CatchUp(_))));
        assert_eq!(other.stats().generation, 1);
        assert_eq!(other.stats().origin, Some(crate::FilterOrigin::Scan));
    }

    #[tokio::test]
    async fn an_incomplete_filter_gives_no_snapshot_and_none_shows_its_secret() {
        let guard = BloomGuard::builder().name("items").build();
        assert!(guard.snapshot("1", QUERY).is_none(), "no filter yet");
        guard.rebuild(&KeyList::new(["a"])).await.expect("build");
        let hold = guard.hold_open();
        assert!(guard.snapshot("1", QUERY).is_none(), "held open");
        drop(hold);
        let writer = guard.snapshot("1", QUERY).expect("complete");
        let seed = guard.shared.complete_filter().expect("filter").seed();
        let mut shown = format!("{writer:?}");
        let bytes: Vec<u8> = writer.chunks(64).flatten().collect();
        shown.push_str(&format!("{:?}", Snapshot::decode(&bytes)));
        assert!(
            !shown.contains(&seed.to_string()) && !shown.contains(&format!("{seed:x}")),
            "{shown}"
        );
    }
}
