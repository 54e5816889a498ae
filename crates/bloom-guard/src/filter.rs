//! One Bloom filter generation: the bits, its secret hasher and its sizing.

use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

use fastbloom::AtomicBloomFilter;

use crate::key::Key;
use crate::source::KeyBatch;

/// A lock-free Bloom filter sized for `capacity` keys.
///
/// Its hasher is fastbloom's SipHash-1-3 keyed with a 128-bit seed from the
/// operating system's random source, fresh for every filter, so nobody
/// without the seed can compute which absent keys collide. The seed
/// travels only inside snapshots.
pub(crate) struct Filter {
    bloom: AtomicBloomFilter,
    seed: u128,
    capacity: u64,
    /// Keys whose insertion set at least one new bit: a close, slightly low,
    /// count of distinct keys.
    keys: AtomicU64,
    /// Stored keys left out because no request can name them.
    skipped: AtomicU64,
}

impl Filter {
    /// A filter holding `capacity` keys at `target_fpp`, with a fresh random hasher.
    pub(crate) fn new(capacity: u64, target_fpp: f64) -> Self {
        let capacity = capacity.max(1);
        let items = usize::try_from(capacity).unwrap_or(usize::MAX);
        let seed = random_seed();
        Self {
            bloom: AtomicBloomFilter::with_false_pos(target_fpp)
                .seed(&seed)
                .expected_items(items),
            seed,
            capacity,
            keys: AtomicU64::new(0),
            skipped: AtomicU64::new(0),
        }
    }

    /// A filter restored from its parts (a snapshot's).
    pub(crate) fn from_parts(parts: FilterParts) -> Self {
        Self {
            bloom: AtomicBloomFilter::from_vec(parts.words)
                .seed(&parts.seed)
                .hashes(parts.hashes),
            seed: parts.seed,
            capacity: parts.capacity,
            keys: AtomicU64::new(parts.keys),
            skipped: AtomicU64::new(parts.skipped),
        }
    }

    /// The hasher's secret seed.
    pub(crate) fn seed(&self) -> u128 {
        self.seed
    }

    /// The number of 64-bit words of bits.
    pub(crate) fn word_count(&self) -> usize {
        self.bloom.as_slice().len()
    }

    /// `count` words of bits from word `from` (clamped to the filter).
    pub(crate) fn words(&self, from: usize, count: usize) -> impl Iterator<Item = u64> + '_ {
        let words = self.bloom.as_slice();
        let from = from.min(words.len());
        let to = from.saturating_add(count).min(words.len());
        words[from..to]
            .iter()
            .map(|word| word.load(Ordering::Relaxed))
    }

    #[inline]
    pub(crate) fn insert(&self, key: &Key<'_>) {
        if !self.bloom.insert(&Hashed(key.as_bytes())) {
            self.keys.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Inserts a batch in two passes: every key's hash first, then every
    /// hash's bits. Kept apart, the bit sets' cache misses overlap; a
    /// build of 10M keys runs about a third faster than key by key.
    pub(crate) fn insert_batch(&self, batch: &KeyBatch, hashes: &mut Vec<u64>) {
        hashes.clear();
        hashes.extend(
            batch
                .iter()
                .map(|key| self.bloom.source_hash(&Hashed(key.as_bytes()))),
        );
        let new = hashes
            .iter()
            .filter(|&&hash| !self.bloom.insert_hash(hash))
            .count();
        self.keys.fetch_add(new as u64, Ordering::Relaxed);
        if batch.skipped() > 0 {
            self.skipped.fetch_add(batch.skipped(), Ordering::Relaxed);
        }
    }

    #[inline]
    pub(crate) fn contains(&self, key: &Key<'_>) -> bool {
        self.bloom.contains(&Hashed(key.as_bytes()))
    }

    pub(crate) fn keys(&self) -> u64 {
        self.keys.load(Ordering::Relaxed)
    }

    /// Keys left out because no request can name them.
    pub(crate) fn skipped(&self) -> u64 {
        self.skipped.load(Ordering::Relaxed)
    }

    pub(crate) fn capacity(&self) -> u64 {
        self.capacity
    }

    pub(crate) fn bits(&self) -> u64 {
        self.bloom.num_bits() as u64
    }

    pub(crate) fn hashes(&self) -> u32 {
        self.bloom.num_hashes()
    }

    /// The number of distinct keys the filter's fill implies, which unlike
    /// the insert count stays close when the filter is overfull.
    pub(crate) fn estimated_keys(&self) -> u64 {
        let fill = self.fill().min(1.0 - 1e-12);
        let bits = self.bits() as f64;
        let estimate = -(bits / f64::from(self.hashes())) * (1.0 - fill).ln();
        (estimate.round() as u64).max(self.keys())
    }

    /// The share of bits set. Reads the whole filter: for stats, not for
    /// the request path.
    pub(crate) fn fill(&self) -> f64 {
        let ones: u64 = self
            .bloom
            .iter()
            .map(|word| u64::from(word.count_ones()))
            .sum();
        ones as f64 / self.bits() as f64
    }

    /// The false-positive rate of the filter as it is: the chance that all
    /// of an absent key's bits are set. Unlike an estimate from the key
    /// count, this stays right when more keys arrive than were planned.
    pub(crate) fn estimated_fpp(&self) -> f64 {
        self.fill().powi(self.hashes() as i32)
    }

    #[cfg(test)]
    pub(crate) fn raw_bits(&self) -> Vec<u64> {
        self.bloom.iter().collect()
    }
}

impl std::fmt::Debug for Filter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the seed: it is the filter's secret.
        f.debug_struct("Filter")
            .field("bits", &self.bits())
            .field("hashes", &self.hashes())
            .field("capacity", &self.capacity)
            .field("keys", &self.keys())
            .finish_non_exhaustive()
    }
}

/// Everything a filter is made of.
pub(crate) struct FilterParts {
    pub(crate) seed: u128,
    pub(crate) words: Vec<u64>,
    pub(crate) hashes: u32,
    pub(crate) capacity: u64,
    pub(crate) keys: u64,
    pub(crate) skipped: u64,
}

/// 128 bits from the operating system's random source; should it fail,
/// from std's randomly keyed hasher (itself seeded from that source).
fn random_seed() -> u128 {
    let mut bytes = [0_u8; 16];
    if getrandom::fill(&mut bytes).is_ok() {
        return u128::from_le_bytes(bytes);
    }
    use std::hash::BuildHasher;
    let half = || u128::from(std::collections::hash_map::RandomState::new().hash_one(0_u8));
    half() << 64 | half()
}

/// A key's bytes, hashed as they are: `[u8]`'s own `Hash` also feeds the
/// length, one more SipHash block for no gain in a filter of single keys.
/// Used for every insert and every lookup alike.
struct Hashed<'a>(&'a [u8]);

impl Hash for Hashed<'_> {
    #[inline]
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write(self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_filter_has_its_own_secret_hasher() {
        let a = Filter::new(1000, 0.01);
        let b = Filter::new(1000, 0.01);
        for i in 0..100 {
            let key = i.to_string();
            a.insert(&Key::from(&key));
            b.insert(&Key::from(&key));
        }
        assert_eq!(a.bits(), b.bits());
        assert_ne!(
            a.raw_bits(),
            b.raw_bits(),
            "two filters of the same keys share a hasher key"
        );
    }

    #[test]
    fn batches_and_single_keys_set_the_same_bits() {
        let one_by_one = Filter::new(1000, 0.01);
        let batched = Filter {
            bloom: one_by_one.bloom.clone(),
            seed: one_by_one.seed,
            capacity: 1000,
            keys: AtomicU64::new(0),
            skipped: AtomicU64::new(0),
        };
        let keys: Vec<String> = (0..500).map(|i| format!("k{i}")).collect();
        for key in &keys {
            one_by_one.insert(&Key::from(key));
        }
        let batch: KeyBatch = keys.iter().collect();
        batched.insert_batch(&batch, &mut Vec::new());
        assert_eq!(one_by_one.raw_bits(), batched.raw_bits());
        assert_eq!(one_by_one.keys(), batched.keys());
        assert!(keys.iter().all(|k| batched.contains(&Key::from(k))));
    }

    #[test]
    fn counts_distinct_keys_and_estimates_its_rate() {
        let filter = Filter::new(10_000, 0.001);
        assert_eq!((filter.fill(), filter.estimated_fpp()), (0.0, 0.0));
        for i in 0..10_000 {
            filter.insert(&Key::from(i.to_string()));
            filter.insert(&Key::from(i.to_string()));
        }
        assert!(
            filter.keys() <= 10_000 && filter.keys() > 9_900,
            "{}",
            filter.keys()
        );
        let estimated = filter.estimated_fpp();
        assert!(estimated > 0.0005 && estimated < 0.002, "{estimated}");
        assert!((filter.fill() - 0.5).abs() < 0.05, "{}", filter.fill());

        // Overfull: the key count saturates, the fill-based estimate does not.
        for i in 10_000..100_000 {
            filter.insert(&Key::from(i.to_string()));
        }
        assert!(filter.estimated_fpp() > 0.3, "{}", filter.estimated_fpp());
    }
}
