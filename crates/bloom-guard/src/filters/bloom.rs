//! The filter of one generation: a chain of sub-filters that grows as keys
//! arrive, its secret hasher, and its sizing.
//!
//! A scalable Bloom filter (Almeida et al., "Scalable Bloom Filters", 2007;
//! RedisBloom's `EXPANSION`): the first sub-filter is sized for the
//! expected keys at half the target rate. When the newest one holds the
//! keys it was sized for, another is added, [`GROWTH`] times larger at
//! [`TIGHTENING`] times its rate, so the rates form a series whose sum, the
//! compound rate, stays below the target however many keys arrive. Inserts
//! go to the newest sub-filter; lookups hash the key once and probe each.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use crate::filters::stage::{Stage, StageParts};
use crate::keys::batch::KeyBatch;
use crate::keys::key::Key;

/// How much larger each sub-filter is than the one before.
pub(crate) const GROWTH: u64 = 2;
/// How much lower each sub-filter's false-positive rate is than the one
/// before's. The first one's is `target × (1 − TIGHTENING)`, so the sum of
/// all of them stays below the target.
pub(crate) const TIGHTENING: f64 = 0.5;
/// The most sub-filters a filter has: 2^32 times the first one's keys.
/// Past that, the newest one fills up and the estimated rate says so.
pub(crate) const MAX_STAGES: usize = 32;
/// The lowest rate a sub-filter is sized for (fastbloom needs a positive
/// one); a filter whose next sub-filter would need less grows no more.
pub(crate) const MIN_FPP: f64 = 1e-15;

/// A lock-free, growing Bloom filter.
///
/// Its hasher is fastbloom's SipHash-1-3 keyed with a 128-bit seed from the
/// operating system's random source, fresh for every filter, so nobody
/// without the seed can compute which absent keys collide. The seed
/// travels only inside snapshots.
pub(crate) struct BloomFilter {
    seed: u128,
    /// Filled in order; a lookup probes those set.
    stages: [OnceLock<Stage>; MAX_STAGES],
    /// Stored keys left out because no request can name them.
    skipped: AtomicU64,
}

/// Everything a filter is made of.
pub(crate) struct BloomParts {
    pub(crate) seed: u128,
    pub(crate) stages: Vec<StageParts>,
    pub(crate) skipped: u64,
}

impl BloomFilter {
    /// A filter sized for `capacity` keys that keeps its false-positive
    /// rate under `target_fpp` however many arrive, with a fresh random
    /// hasher.
    pub(crate) fn new(capacity: u64, target_fpp: f64) -> Self {
        let seed = random_seed();
        let filter = Self::empty(seed, 0);
        let first = Stage::new(capacity, target_fpp * (1.0 - TIGHTENING), seed);
        filter.stages[0].get_or_init(|| first);
        filter
    }

    /// A filter restored from its parts (a snapshot's), which must hold
    /// between one and [`MAX_STAGES`] stages (the snapshot reader checks).
    /// Each stage counts at least the keys its bits imply: keys inserted
    /// while the snapshot was written are in its bits, not in its counts,
    /// and a replay would not count them again.
    pub(crate) fn from_parts(parts: BloomParts) -> Self {
        debug_assert!((1..=MAX_STAGES).contains(&parts.stages.len()));
        let filter = Self::empty(parts.seed, parts.skipped);
        for (slot, stage) in filter.stages.iter().zip(parts.stages) {
            slot.get_or_init(|| {
                let stage = Stage::from_parts(stage, parts.seed);
                stage.count_at_least(stage.estimated_keys());
                stage
            });
        }
        filter
    }

    fn empty(seed: u128, skipped: u64) -> Self {
        Self {
            seed,
            stages: [const { OnceLock::new() }; MAX_STAGES],
            skipped: AtomicU64::new(skipped),
        }
    }

    /// The sub-filters, oldest first.
    #[inline]
    pub(crate) fn stages(&self) -> impl Iterator<Item = &Stage> {
        self.stages.iter().map_while(OnceLock::get)
    }

    /// How many sub-filters it has grown into.
    pub(crate) fn stage_count(&self) -> usize {
        self.stages().count()
    }

    /// The hasher's secret seed.
    pub(crate) fn seed(&self) -> u128 {
        self.seed
    }

    #[inline]
    fn first(&self) -> &Stage {
        // Every constructor sets the first stage.
        self.stages[0].get_or_init(|| Stage::new(1, 0.5, self.seed))
    }

    #[inline]
    pub(crate) fn contains(&self, key: &Key<'_>) -> bool {
        let hash = self.first().source_hash(key.as_bytes());
        self.stages().any(|stage| stage.contains(hash))
    }

    #[inline]
    pub(crate) fn insert(&self, key: &Key<'_>) {
        self.insert_hash(self.first().source_hash(key.as_bytes()));
    }

    /// Inserts a batch in two passes: every key's hash first, then every
    /// hash's bits. Kept apart, the bit sets' cache misses overlap; a
    /// build of 10M keys runs about a third faster than key by key.
    pub(crate) fn insert_batch(&self, batch: &KeyBatch, hashes: &mut Vec<u64>) {
        let first = self.first();
        hashes.clear();
        hashes.extend(batch.iter().map(|key| first.source_hash(key.as_bytes())));
        for &hash in hashes.iter() {
            self.insert_hash(hash);
        }
        if batch.skipped() > 0 {
            self.skipped.fetch_add(batch.skipped(), Ordering::Relaxed);
        }
    }

    /// Sets a key's bits in the newest stage, unless an older one holds it
    /// already (a key counts in one stage only); a full newest stage gets
    /// a successor first.
    #[inline]
    fn insert_hash(&self, hash: u64) {
        let mut newest = self.first();
        let mut index = 0;
        for (i, stage) in self.stages().enumerate().skip(1) {
            if newest.contains(hash) {
                return;
            }
            (newest, index) = (stage, i);
        }
        if newest.is_full() && !newest.contains(hash) {
            newest = self.grow(index);
        }
        newest.insert(hash);
    }

    /// The stage after `index`, added unless another insert did; the stage
    /// at `index` itself once there is no room for more.
    #[cold]
    fn grow(&self, index: usize) -> &Stage {
        let full = self.stages[index].get_or_init(|| Stage::new(1, 0.5, self.seed));
        let fpp = full.fpp() * TIGHTENING;
        let (Some(slot), true) = (self.stages.get(index + 1), fpp >= MIN_FPP) else {
            return full;
        };
        slot.get_or_init(|| {
            let capacity = full.capacity().saturating_mul(GROWTH);
            let stage = Stage::new(capacity, fpp, self.seed);
            tracing::debug!(
                stage = index + 1,
                capacity,
                bits = stage.bits(),
                "the bloom filter grew a sub-filter"
            );
            stage
        })
    }

    /// Distinct keys (a close count).
    pub(crate) fn keys(&self) -> u64 {
        self.stages()
            .fold(0, |sum, stage| sum.saturating_add(stage.keys()))
    }

    /// Keys left out because no request can name them.
    pub(crate) fn skipped(&self) -> u64 {
        self.skipped.load(Ordering::Relaxed)
    }

    /// The keys its sub-filters are sized for, together.
    pub(crate) fn capacity(&self) -> u64 {
        self.stages()
            .fold(0, |sum, stage| sum.saturating_add(stage.capacity()))
    }

    pub(crate) fn bits(&self) -> u64 {
        self.stages().map(Stage::bits).sum()
    }

    /// Hash functions per key of the first sub-filter (later ones have
    /// more: their rate is lower).
    pub(crate) fn hashes(&self) -> u32 {
        self.first().hashes()
    }

    /// Appends `count` words of the bits from word `from`, counting through
    /// the sub-filters in order, to `out` as little-endian bytes.
    pub(crate) fn write_words(&self, mut from: usize, mut count: usize, out: &mut Vec<u8>) {
        for stage in self.stages() {
            let len = stage.word_count();
            if from >= len {
                from -= len;
                continue;
            }
            let to = len.min(from + count);
            for word in stage.words(from, to) {
                out.extend_from_slice(&word.to_le_bytes());
            }
            count -= to - from;
            from = 0;
            if count == 0 {
                return;
            }
        }
    }

    /// The number of distinct keys the fill implies, which unlike the
    /// insert count stays close when a sub-filter is overfull.
    pub(crate) fn estimated_keys(&self) -> u64 {
        self.stages().map(Stage::estimated_keys).sum()
    }

    /// The share of bits set. Reads the whole filter: for stats, not for
    /// the request path.
    pub(crate) fn fill(&self) -> f64 {
        let ones: u64 = self.stages().map(Stage::ones).sum();
        ones as f64 / self.bits() as f64
    }

    /// The false-positive rate of the filter as it is: the chance that an
    /// absent key is found in any sub-filter.
    pub(crate) fn estimated_fpp(&self) -> f64 {
        1.0 - self
            .stages()
            .map(|stage| 1.0 - stage.estimated_fpp())
            .product::<f64>()
    }

    /// The keys its sub-filters could hold before a rebuild is due at
    /// `stages` sub-filters.
    pub(crate) fn capacity_within(&self, stages: usize) -> u64 {
        let mut capacity = 0_u64;
        let mut next = 0_u64;
        for stage in self.stages().take(stages) {
            capacity = capacity.saturating_add(stage.capacity());
            next = stage.capacity().saturating_mul(GROWTH);
        }
        for _ in self.stage_count()..stages.min(MAX_STAGES) {
            capacity = capacity.saturating_add(next);
            next = next.saturating_mul(GROWTH);
        }
        capacity
    }

    /// Its parts, as a snapshot stores them.
    #[cfg(test)]
    pub(crate) fn stage_parts(&self) -> Vec<StageParts> {
        self.stages()
            .map(|stage| StageParts {
                words: stage.raw_bits(),
                hashes: stage.hashes(),
                fpp: stage.fpp(),
                capacity: stage.capacity(),
                keys: stage.keys(),
            })
            .collect()
    }
}

impl std::fmt::Debug for BloomFilter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the seed: it is the filter's secret.
        f.debug_struct("BloomFilter")
            .field("stages", &self.stage_count())
            .field("bits", &self.bits())
            .field("capacity", &self.capacity())
            .field("keys", &self.keys())
            .finish_non_exhaustive()
    }
}

/// 128 bits from the operating system's random source; should it fail,
/// from std's randomly keyed hasher (itself seeded from that source).
pub(crate) fn random_seed() -> u128 {
    let mut bytes = [0_u8; 16];
    if getrandom::fill(&mut bytes).is_ok() {
        return u128::from_le_bytes(bytes);
    }
    use std::hash::BuildHasher;
    let half = || u128::from(std::collections::hash_map::RandomState::new().hash_one(0_u8));
    half() << 64 | half()
}

#[cfg(test)]
mod tests;
