//! One sub-filter of a growing filter: fastbloom's lock-free bits, sized
//! for a number of keys at a false-positive rate.

use std::sync::atomic::{AtomicU64, Ordering};

use fastbloom::AtomicBloomFilter;

/// A Bloom filter of fixed size, probed and filled by a key's source hash
/// (the hash every sub-filter of a [`Filter`](crate::filters::filter::Filter)
/// shares).
pub(crate) struct Stage {
    bloom: AtomicBloomFilter,
    capacity: u64,
    /// The false-positive rate it is sized for at `capacity` keys.
    fpp: f64,
    /// Keys whose insertion set at least one new bit: a close count of
    /// distinct keys (low by the keys whose bits were all set already, high
    /// by a key two threads inserted at once).
    keys: AtomicU64,
}

/// Everything a stage is made of, as a snapshot carries it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct StageParts {
    pub(crate) words: Vec<u64>,
    pub(crate) hashes: u32,
    pub(crate) fpp: f64,
    pub(crate) capacity: u64,
    pub(crate) keys: u64,
}

impl Stage {
    /// An empty stage for `capacity` keys at `fpp`, hashing with `seed`.
    pub(crate) fn new(capacity: u64, fpp: f64, seed: u128) -> Self {
        let capacity = capacity.max(1);
        let items = usize::try_from(capacity).unwrap_or(usize::MAX);
        Self {
            bloom: AtomicBloomFilter::with_false_pos(fpp)
                .seed(&seed)
                .expected_items(items),
            capacity,
            fpp,
            keys: AtomicU64::new(0),
        }
    }

    pub(crate) fn from_parts(parts: StageParts, seed: u128) -> Self {
        Self {
            bloom: AtomicBloomFilter::from_vec(parts.words)
                .seed(&seed)
                .hashes(parts.hashes),
            capacity: parts.capacity,
            fpp: parts.fpp,
            keys: AtomicU64::new(parts.keys),
        }
    }

    /// The key's source hash, the same in every stage of one seed.
    #[inline]
    pub(crate) fn source_hash(&self, key: &[u8]) -> u64 {
        self.bloom.source_hash(&Hashed(key))
    }

    #[inline]
    pub(crate) fn contains(&self, hash: u64) -> bool {
        self.bloom.contains_hash(hash)
    }

    /// Sets the hash's bits; whether that made it a new key of the stage.
    #[inline]
    pub(crate) fn insert(&self, hash: u64) -> bool {
        let new = !self.bloom.insert_hash(hash);
        if new {
            self.keys.fetch_add(1, Ordering::Relaxed);
        }
        new
    }

    /// Whether it holds the keys it was sized for.
    #[inline]
    pub(crate) fn is_full(&self) -> bool {
        self.keys() >= self.capacity
    }

    pub(crate) fn keys(&self) -> u64 {
        self.keys.load(Ordering::Relaxed)
    }

    /// Raises the key count to at least `keys`.
    pub(crate) fn count_at_least(&self, keys: u64) {
        self.keys.fetch_max(keys, Ordering::Relaxed);
    }

    pub(crate) fn capacity(&self) -> u64 {
        self.capacity
    }

    pub(crate) fn fpp(&self) -> f64 {
        self.fpp
    }

    pub(crate) fn hashes(&self) -> u32 {
        self.bloom.num_hashes()
    }

    pub(crate) fn bits(&self) -> u64 {
        self.bloom.num_bits() as u64
    }

    pub(crate) fn word_count(&self) -> usize {
        self.bloom.as_slice().len()
    }

    /// Words `from..to` of the bits (clamped to the stage).
    pub(crate) fn words(&self, from: usize, to: usize) -> impl Iterator<Item = u64> + '_ {
        let words = self.bloom.as_slice();
        let to = to.min(words.len());
        words[from.min(to)..to]
            .iter()
            .map(|word| word.load(Ordering::Relaxed))
    }

    /// The bits set. Reads the whole stage: for stats, not for requests.
    pub(crate) fn ones(&self) -> u64 {
        self.bloom
            .iter()
            .map(|word| u64::from(word.count_ones()))
            .sum()
    }

    /// The chance that all of an absent key's bits are set, from the fill:
    /// unlike an estimate from the key count, it stays right however many
    /// keys arrived.
    pub(crate) fn estimated_fpp(&self) -> f64 {
        let fill = self.ones() as f64 / self.bits() as f64;
        fill.powi(self.hashes() as i32)
    }

    /// The number of distinct keys the fill implies, which unlike the
    /// insert count stays close when the stage is overfull.
    pub(crate) fn estimated_keys(&self) -> u64 {
        let fill = (self.ones() as f64 / self.bits() as f64).min(1.0 - 1e-12);
        let estimate = -(self.bits() as f64 / f64::from(self.hashes())) * (1.0 - fill).ln();
        (estimate.round() as u64).max(self.keys())
    }

    #[cfg(test)]
    pub(crate) fn raw_bits(&self) -> Vec<u64> {
        self.bloom.iter().collect()
    }
}

/// A key's bytes, hashed as they are: `[u8]`'s own `Hash` also feeds the
/// length, one more SipHash block for no gain in a filter of single keys.
/// Used for every insert and every lookup alike.
struct Hashed<'a>(&'a [u8]);

impl std::hash::Hash for Hashed<'_> {
    #[inline]
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write(self.0);
    }
}
