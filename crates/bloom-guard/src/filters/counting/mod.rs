//! The filter of a guard that follows a change feed: it counts a key once
//! per stored row and forgets it with its last row.
//!
//! A rank-select quotient filter (Pandey et al., SIGMOD 2017; the
//! `qfilter` crate) stores each key's fingerprint, the guard's secret
//! keyed hash, once per insert: a multiset. Removing a key removes one
//! copy of its fingerprint, so two rows with one key keep the key until
//! both are gone. Removing a fingerprint that was never inserted would
//! remove another key's, which is why the follower applies a delete only
//! to a filter that holds that row's insert ([`exact`](CountingFilter::exact)).
//!
//! The fingerprints are spread over shards of at most [`SHARD_SLOTS`]
//! slots, each behind its own lock: lookups of different keys do not
//! contend, and a shard that fills up grows in place (one bit of each
//! fingerprint's remainder becomes quotient) without the others pausing.
//! Each shard is sized for the guard's rate at its first size, with two
//! doublings of room ([`GROWTH_ROOM`]): at four times the expected keys
//! the rate is twice the target. Keys past that go to an exact overflow
//! table, and the filter asks for a rebuild.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use parking_lot::RwLock;

use crate::keys::batch::KeyBatch;
use crate::keys::key::Key;
use crate::lock::lock;

/// The most slots a shard starts with: 2^16, about 62 000 keys at 95 %.
pub(crate) const SHARD_SLOTS: u64 = 1 << 16;
/// How many times each shard may double before it is full: rate at the
/// start is the target's half, after the doublings twice the target.
pub(crate) const GROWTH_ROOM: u64 = 4;
/// The share of a shard's slots its keys may use (qfilter's bound).
const OCCUPANCY: f64 = 0.95;

/// A sharded, growing quotient filter that removes.
pub(crate) struct CountingFilter {
    seed: u128,
    hasher: fastbloom::DefaultHasher,
    shards: Box<[RwLock<qfilter::Filter>]>,
    /// Fingerprints that found their shard full, by full hash and count.
    overflow: Mutex<HashMap<u64, u32>>,
    overflowed: AtomicBool,
    /// The target rate the shards were sized for.
    target_fpp: f64,
    /// Keys the scan or the feed held that no request can name.
    skipped: AtomicU64,
    /// Whether the filter holds exactly the feed's rows at its position,
    /// so a delete from the feed may remove a copy.
    exact: AtomicBool,
    /// Deletes applied.
    removed: AtomicU64,
    /// Deletes whose fingerprint was not there: none while exact.
    missed: AtomicU64,
    /// Deletes read while the filter was not exact, left in it.
    unapplied: AtomicU64,
    /// The change feed's position whose changes it holds, if known; held
    /// while a read is applied, so a snapshot copies one moment.
    position: Mutex<Option<String>>,
    /// What it does with the feed's keys while it is being built.
    live: Mutex<Live>,
}

/// What a counting filter being built does with the feed's keys as they
/// come, before its scan has said where it stands.
#[derive(Debug)]
enum Live {
    /// Holds them aside until the scan's first batch tells whether it names
    /// a feed position.
    Hold(Vec<Box<[u8]>>),
    /// Takes them (no position: it applies no delete).
    Take,
    /// Ignores them: it is brought up to date from its scan's position.
    Ignore,
}

/// A shard as a snapshot stores it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ShardParts(pub(crate) Vec<u8>);

/// Everything a counting filter is made of.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct CountingParts {
    pub(crate) seed: u128,
    pub(crate) target_fpp: f64,
    pub(crate) skipped: u64,
    pub(crate) shards: Vec<ShardParts>,
    pub(crate) overflow: Vec<(u64, u32)>,
}

/// A shard that a snapshot carries could not be read.
#[derive(Debug, thiserror::Error)]
#[error("a shard of the counting filter does not decode: {0}")]
pub(crate) struct ShardError(String);

impl CountingFilter {
    /// A filter sized for `capacity` keys at half `target_fpp`, with
    /// room to grow to four times that at twice the target.
    pub(crate) fn new(capacity: u64, target_fpp: f64, seed: u128) -> Self {
        let capacity = capacity.max(1);
        let per_shard = ((SHARD_SLOTS as f64) * OCCUPANCY) as u64;
        let count = capacity.div_ceil(per_shard).max(1);
        let shard_capacity = capacity.div_ceil(count).max(1);
        let rate = (2.0 * target_fpp).clamp(1e-12, 0.5);
        let shards = (0..count)
            .map(|_| RwLock::new(new_shard(shard_capacity, rate)))
            .collect();
        Self::assemble(seed, target_fpp, shards, HashMap::new(), 0)
    }

    fn assemble(
        seed: u128,
        target_fpp: f64,
        shards: Box<[RwLock<qfilter::Filter>]>,
        overflow: HashMap<u64, u32>,
        skipped: u64,
    ) -> Self {
        Self {
            seed,
            hasher: fastbloom::DefaultHasher::seeded(&seed.to_le_bytes()),
            overflowed: AtomicBool::new(!overflow.is_empty()),
            overflow: Mutex::new(overflow),
            shards,
            target_fpp,
            skipped: AtomicU64::new(skipped),
            exact: AtomicBool::new(false),
            removed: AtomicU64::new(0),
            missed: AtomicU64::new(0),
            unapplied: AtomicU64::new(0),
            position: Mutex::new(None),
            live: Mutex::new(Live::Take),
        }
    }

    /// Holds the feed's keys aside until [`settle`](Self::settle): for a
    /// build whose scan may name its feed position.
    pub(crate) fn hold_live_keys(&self) {
        *lock(&self.live) = Live::Hold(Vec::new());
    }

    /// A batch of the feed's keys while the filter is being built: held,
    /// taken or ignored (see [`Live`]).
    pub(crate) fn take_live(&self, batch: &KeyBatch) {
        let mut live = lock(&self.live);
        match &mut *live {
            Live::Hold(held) => held.extend(batch.iter().map(|key| key.as_bytes().into())),
            Live::Take => self.insert_batch(batch),
            Live::Ignore => {}
        }
    }

    /// The scan's first batch said where it stands: at `position` (the keys
    /// held are dropped: the catch-up from there brings them once, and the
    /// filter is exact), or nowhere (the keys held go in, it takes the rest
    /// as they come, and it applies no delete).
    pub(crate) fn settle(&self, position: Option<&str>) {
        let mut live = lock(&self.live);
        let held = std::mem::replace(
            &mut *live,
            if position.is_some() {
                Live::Ignore
            } else {
                Live::Take
            },
        );
        match position {
            Some(position) => {
                self.set_position(position);
                self.set_exact(true);
            }
            None => {
                if let Live::Hold(held) = held {
                    for key in held {
                        self.insert(&Key::from(&key[..]));
                    }
                }
            }
        }
    }

    /// The key's hash: SipHash-1-3 keyed with the seed, as the Bloom
    /// filter's.
    #[inline]
    fn hash(&self, key: &[u8]) -> u64 {
        let mut state = self.hasher.build_hasher();
        state.write(key);
        state.finish()
    }

    /// The shard of a hash, from its high bits (the fingerprint is its
    /// low bits).
    #[inline]
    fn shard(&self, hash: u64) -> &RwLock<qfilter::Filter> {
        let index = ((u128::from(hash) * self.shards.len() as u128) >> 64) as usize;
        &self.shards[index]
    }

    #[inline]
    pub(crate) fn contains(&self, key: &Key<'_>) -> bool {
        let hash = self.hash(key.as_bytes());
        if self.shard(hash).read().contains_fingerprint(hash) {
            return true;
        }
        self.overflowed.load(Ordering::Acquire) && lock(&self.overflow).contains_key(&hash)
    }

    /// Adds one copy of the key's fingerprint.
    #[inline]
    pub(crate) fn insert(&self, key: &Key<'_>) {
        self.insert_hash(self.hash(key.as_bytes()));
    }

    pub(crate) fn insert_batch(&self, batch: &KeyBatch) {
        for key in batch.iter() {
            self.insert(&key);
        }
        if batch.skipped() > 0 {
            self.skipped.fetch_add(batch.skipped(), Ordering::Relaxed);
        }
    }

    fn insert_hash(&self, hash: u64) {
        let full = self
            .shard(hash)
            .write()
            .insert_fingerprint(true, hash)
            .is_err();
        if full {
            let mut overflow = lock(&self.overflow);
            *overflow.entry(hash).or_insert(0) += 1;
            self.overflowed.store(true, Ordering::Release);
        }
    }

    /// Removes one copy of the key's fingerprint: a copy that this key's
    /// insert put there, if the caller applies each stored row's delete
    /// once, after its insert.
    pub(crate) fn remove(&self, key: &Key<'_>) {
        let hash = self.hash(key.as_bytes());
        // A copy in the overflow table has this very hash: take it first.
        if self.overflowed.load(Ordering::Acquire) {
            let mut overflow = lock(&self.overflow);
            if let Some(count) = overflow.get_mut(&hash) {
                *count -= 1;
                if *count == 0 {
                    overflow.remove(&hash);
                }
                self.overflowed
                    .store(!overflow.is_empty(), Ordering::Release);
                self.removed.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
        if self.shard(hash).write().remove_fingerprint(hash) {
            self.removed.fetch_add(1, Ordering::Relaxed);
        } else {
            // An exact filter holds every deleted row's insert: this one
            // does not (a row the scan never saw: a table outside the key
            // query, writes that bypassed the feed). Other deletes may hit
            // another key's fingerprint: no more removals, and a rebuild.
            if self.missed.fetch_add(1, Ordering::Relaxed) == 0 {
                tracing::warn!("a deleted row's key was not in the counting filter: the filter and the change feed disagree; it keeps deleted keys until a rebuild");
            }
            self.set_exact(false);
        }
    }

    /// Marks the filter as holding exactly the feed's rows at a position,
    /// so that deletes read after it may be applied.
    pub(crate) fn set_exact(&self, exact: bool) {
        self.exact.store(exact, Ordering::Release);
    }

    /// Records the feed position whose changes the filter holds (its
    /// scan's snapshot, before any read is applied).
    pub(crate) fn set_position(&self, position: &str) {
        *lock(&self.position) = Some(position.to_owned());
    }

    /// The feed position whose changes it holds, if known.
    pub(crate) fn position(&self) -> Option<String> {
        lock(&self.position).clone()
    }

    /// Applies one read of the feed that began at position `from` (`None`:
    /// at the filter's own, as a catch-up reads) and reached `reached`:
    /// the added rows' keys, then the removed rows' keys (so a key deleted
    /// and inserted again within the read never leaves meanwhile). Removals
    /// only while the filter is exact and the read began where the filter
    /// stands; a read from anywhere else (another follower's, one from
    /// before a restart) makes it inexact for good: its deletes are counted
    /// and left, a harmless false positive each, until a rebuild.
    pub(crate) fn apply(
        &self,
        added: &KeyBatch,
        removed: &KeyBatch,
        from: Option<&str>,
        reached: Option<&str>,
    ) {
        let mut at = lock(&self.position);
        if from.is_some_and(|from| at.as_deref() != Some(from)) && self.exact() {
            tracing::warn!(
                filter_at = ?*at,
                read_from = ?from,
                "a change feed read that does not start where the counting filter stands; it keeps deleted keys until the next rebuild"
            );
            self.set_exact(false);
        }
        self.insert_batch(added);
        for key in removed.iter() {
            // Checked for each: a delete the filter cannot match stops the
            // ones after it too.
            if self.exact() {
                self.remove(&key);
            } else {
                self.unapplied.fetch_add(1, Ordering::Relaxed);
            }
        }
        if let Some(position) = reached {
            *at = Some(position.to_owned());
        }
    }

    /// Deletes read while the filter was not exact, left in it.
    pub(crate) fn unapplied(&self) -> u64 {
        self.unapplied.load(Ordering::Relaxed)
    }
    pub(crate) fn exact(&self) -> bool {
        self.exact.load(Ordering::Acquire)
    }

    /// Copies of fingerprints held: one per stored row.
    pub(crate) fn keys(&self) -> u64 {
        let held: u64 = self.shards.iter().map(|shard| shard.read().len()).sum();
        let spilled: u64 = lock(&self.overflow).values().map(|&n| u64::from(n)).sum();
        held + spilled
    }

    pub(crate) fn skipped(&self) -> u64 {
        self.skipped.load(Ordering::Relaxed)
    }

    pub(crate) fn removed(&self) -> u64 {
        self.removed.load(Ordering::Relaxed)
    }

    /// Deletes whose key was not in the filter: the filter and the feed
    /// disagree, and a rebuild is due.
    pub(crate) fn missed(&self) -> u64 {
        self.missed.load(Ordering::Relaxed)
    }

    /// Keys the shards hold before any grows again.
    pub(crate) fn capacity(&self) -> u64 {
        self.shards
            .iter()
            .map(|shard| shard.read().capacity())
            .sum()
    }

    /// Keys the shards hold fully grown.
    pub(crate) fn max_capacity(&self) -> u64 {
        self.shards
            .iter()
            .map(|shard| shard.read().max_capacity())
            .sum()
    }

    pub(crate) fn bits(&self) -> u64 {
        let bytes: usize = self
            .shards
            .iter()
            .map(|shard| shard.read().memory_usage())
            .sum();
        bytes as u64 * 8
    }

    /// Whether some keys found their shard full and wait for a rebuild in
    /// the overflow table.
    pub(crate) fn overflowed(&self) -> bool {
        self.overflowed.load(Ordering::Acquire)
    }

    /// The share of slots in use.
    pub(crate) fn fill(&self) -> f64 {
        let (mut len, mut slots) = (0.0, 0.0);
        for shard in self.shards.iter() {
            let shard = shard.read();
            len += shard.len() as f64;
            slots += shard.capacity() as f64 / OCCUPANCY;
        }
        if slots == 0.0 {
            0.0
        } else {
            len / slots
        }
    }

    /// The chance that an absent key is found: the mean of the shards'
    /// rates at their occupancy (a key goes to one shard, each as likely).
    pub(crate) fn estimated_fpp(&self) -> f64 {
        let sum: f64 = self
            .shards
            .iter()
            .map(|shard| shard.read().current_error_ratio())
            .sum();
        let overflow = if self.overflowed() { 1e-12 } else { 0.0 };
        sum / self.shards.len() as f64 + overflow
    }

    /// The filter's parts and the feed position they hold, copied while
    /// no read is applied. Only reads of the feed change an exact filter
    /// (the write path's keys go to the journal), so this is one moment.
    pub(crate) fn to_parts(&self) -> (CountingParts, Option<String>) {
        let at = lock(&self.position);
        let parts = CountingParts {
            seed: self.seed,
            target_fpp: self.target_fpp,
            skipped: self.skipped(),
            shards: self
                .shards
                .iter()
                .map(|shard| ShardParts(encode_shard(&shard.read())))
                .collect(),
            overflow: lock(&self.overflow)
                .iter()
                .map(|(&hash, &count)| (hash, count))
                .collect(),
        };
        (parts, at.clone())
    }

    /// A filter from a snapshot's parts; not exact until the caller says
    /// so.
    pub(crate) fn from_parts(parts: CountingParts) -> Result<Self, ShardError> {
        if !supported() {
            return Err(ShardError("this CPU lacks popcnt or BMI2".to_owned()));
        }
        // Each shard's bytes are dropped once it is decoded: the filter
        // and its snapshot's bytes are never held whole at once.
        let shards = parts
            .shards
            .into_iter()
            .map(|ShardParts(bytes)| decode_shard(&bytes).map(RwLock::new))
            .collect::<Result<Box<[_]>, _>>()?;
        if shards.is_empty() {
            return Err(ShardError("no shards".to_owned()));
        }
        Ok(Self::assemble(
            parts.seed,
            parts.target_fpp,
            shards,
            parts.overflow.into_iter().collect(),
            parts.skipped,
        ))
    }
}

/// Whether this CPU runs qfilter: on x86-64 it needs `popcnt` and BMI2
/// (every x86-64 CPU since 2013), and would stop the process without them.
/// Elsewhere, always.
pub(crate) fn supported() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("popcnt") && std::is_x86_feature_detected!("bmi2")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        true
    }
}

/// One shard: `capacity` keys at a quarter of `rate`, growing in place
/// to [`GROWTH_ROOM`] times that at `rate`. A shard's capacity and rate
/// are within qfilter's bounds by construction (at most a few million
/// keys, a rate of at least 1e-12); should a combination be refused
/// anyway, a shard without growth room, then one at the loosest rate,
/// which still never misses a key.
fn new_shard(capacity: u64, rate: f64) -> qfilter::Filter {
    let grown = capacity.saturating_mul(GROWTH_ROOM);
    let mut tries = [
        (capacity, grown, rate),
        (capacity, capacity, rate),
        (capacity, capacity, 0.5),
        (1, 1, 0.5),
    ]
    .into_iter()
    .filter_map(|(initial, max, rate)| qfilter::Filter::new_resizeable(initial, max, rate).ok());
    tries
        .next()
        .unwrap_or_else(|| unreachable!("qfilter refuses a one-key filter"))
}

fn encode_shard(shard: &qfilter::Filter) -> Vec<u8> {
    postcard::to_allocvec(shard).unwrap_or_default()
}

fn decode_shard(bytes: &[u8]) -> Result<qfilter::Filter, ShardError> {
    postcard::from_bytes(bytes).map_err(|error| ShardError(error.to_string()))
}

impl std::fmt::Debug for CountingFilter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the seed: it is the filter's secret.
        f.debug_struct("CountingFilter")
            .field("shards", &self.shards.len())
            .field("exact", &self.exact())
            .field("removed", &self.removed())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(text: &str) -> Key<'_> {
        Key::from(text.as_bytes())
    }

    #[test]
    fn a_key_stays_until_its_last_copy_goes() {
        let filter = CountingFilter::new(1000, 0.001, 7);
        filter.insert(&key("a"));
        filter.insert(&key("a"));
        filter.remove(&key("a"));
        assert!(filter.contains(&key("a")), "one row of two removed the key");
        filter.remove(&key("a"));
        assert!(!filter.contains(&key("a")));
        assert_eq!(filter.keys(), 0);
        assert_eq!((filter.removed(), filter.missed()), (2, 0));
    }

    #[test]
    fn removing_what_is_not_there_is_counted_and_removes_nothing_else() {
        let filter = CountingFilter::new(1000, 0.001, 7);
        filter.insert(&key("a"));
        filter.remove(&key("b"));
        assert!(filter.contains(&key("a")));
        assert_eq!(filter.missed(), 1);
    }

    #[test]
    fn grows_past_its_capacity_and_keeps_its_rate_within_twice_the_target() {
        let target = 0.01;
        let filter = CountingFilter::new(10_000, target, 11);
        let keys: Vec<String> = (0..40_000).map(|i| format!("key-{i}")).collect();
        for k in &keys {
            filter.insert(&key(k));
        }
        assert!(keys.iter().all(|k| filter.contains(&key(k))));
        assert!(!filter.overflowed());
        let absent = (0..100_000)
            .filter(|i| filter.contains(&key(&format!("absent-{i}"))))
            .count();
        let rate = absent as f64 / 100_000.0;
        assert!(rate <= 2.0 * target, "{rate}");
        assert!(
            filter.estimated_fpp() <= 2.0 * target,
            "{}",
            filter.estimated_fpp()
        );
    }

    #[test]
    fn a_full_filter_spills_exactly_and_removes_from_the_spill() {
        let filter = CountingFilter::new(10, 0.01, 3);
        let keys: Vec<String> = (0..2_000).map(|i| format!("k{i}")).collect();
        for k in &keys {
            filter.insert(&key(k));
        }
        assert!(filter.overflowed());
        assert!(keys.iter().all(|k| filter.contains(&key(k))));
        for k in &keys[..1_000] {
            filter.remove(&key(k));
        }
        assert_eq!(filter.missed(), 0);
        assert!(keys[1_000..].iter().all(|k| filter.contains(&key(k))));
        assert_eq!(filter.keys(), 1_000);
    }

    #[test]
    fn parts_round_trip() {
        let filter = CountingFilter::new(100_000, 0.001, 5);
        for i in 0..70_000 {
            filter.insert(&key(&format!("k{i}")));
        }
        let copy = CountingFilter::from_parts(filter.to_parts().0).expect("decodes");
        assert!((0..70_000).all(|i| copy.contains(&key(&format!("k{i}")))));
        assert_eq!(copy.keys(), filter.keys());
        copy.remove(&key("k1"));
        assert_eq!(copy.missed(), 0);
    }

    #[test]
    fn deletes_are_applied_only_to_an_exact_filter() {
        let filter = CountingFilter::new(100, 0.001, 1);
        let added: KeyBatch = ["a", "b"].into_iter().collect();
        let removed: KeyBatch = ["a"].into_iter().collect();
        filter.apply(&added, &removed, None, Some("1"));
        assert!(
            filter.contains(&key("a")),
            "an inexact filter removed a key"
        );
        assert_eq!(filter.unapplied(), 1);
        filter.set_exact(true);
        filter.apply(&KeyBatch::default(), &removed, None, Some("2"));
        assert!(!filter.contains(&key("a")) && filter.contains(&key("b")));
        assert_eq!(filter.position().as_deref(), Some("2"));
    }

    #[test]
    fn a_key_deleted_and_inserted_again_in_one_read_stays() {
        let filter = CountingFilter::new(100, 0.001, 1);
        filter.set_exact(true);
        let a: KeyBatch = ["a"].into_iter().collect();
        filter.apply(&a, &KeyBatch::default(), None, None);
        filter.apply(&a, &a, None, None);
        assert!(filter.contains(&key("a")));
    }
}
