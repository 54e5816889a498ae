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
//! The fingerprints live in a [`Chain`] of stages that grows as keys
//! arrive, without a rescan and with its rate under twice the target at
//! any size (see `chain.rs`).

mod chain;
pub(crate) mod parts;
mod shard;
mod stage;

use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use crate::keys::batch::KeyBatch;
use crate::keys::key::Key;
use crate::lock::lock;

pub(crate) use chain::MAX_STAGES;
use chain::{Chain, Removal};
pub(crate) use shard::{decode_shard, encode_shard, encoded_len, Shard};

/// A growing quotient filter that removes.
pub(crate) struct CountingFilter {
    seed: u128,
    hasher: fastbloom::DefaultHasher,
    chain: Chain,
    /// The target rate the stages were sized for.
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
    /// Deletes whose key several stages matched, left in.
    kept: AtomicU64,
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

impl CountingFilter {
    /// A filter whose first stage holds `capacity` keys; it grows past
    /// them at under twice `target_fpp`.
    pub(crate) fn new(capacity: u64, target_fpp: f64, seed: u128) -> Self {
        Self::assemble(seed, target_fpp, Chain::new(capacity, target_fpp), 0)
    }

    fn assemble(seed: u128, target_fpp: f64, chain: Chain, skipped: u64) -> Self {
        Self {
            seed,
            hasher: fastbloom::DefaultHasher::seeded(&seed.to_le_bytes()),
            chain,
            target_fpp,
            skipped: AtomicU64::new(skipped),
            exact: AtomicBool::new(false),
            removed: AtomicU64::new(0),
            missed: AtomicU64::new(0),
            kept: AtomicU64::new(0),
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

    /// Ignores the feed's keys from now on: a filter (a snapshot's) that
    /// its follower brings up to date from its own position, where every
    /// read meanwhile is read again.
    pub(crate) fn ignore_live_keys(&self) {
        *lock(&self.live) = Live::Ignore;
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

    #[inline]
    pub(crate) fn contains(&self, key: &Key<'_>) -> bool {
        self.chain.contains(self.hash(key.as_bytes()))
    }

    /// Adds one copy of the key's fingerprint.
    #[inline]
    pub(crate) fn insert(&self, key: &Key<'_>) {
        self.chain.insert(self.hash(key.as_bytes()));
    }

    pub(crate) fn insert_batch(&self, batch: &KeyBatch) {
        for key in batch.iter() {
            self.insert(&key);
        }
        if batch.skipped() > 0 {
            self.skipped.fetch_add(batch.skipped(), Ordering::Relaxed);
        }
    }

    /// Appends the hashes of `batch`'s keys to `hashes`, for
    /// [`insert_hashes`](Self::insert_hashes).
    pub(crate) fn hash_batch(&self, batch: &KeyBatch, hashes: &mut Vec<u64>) {
        hashes.extend(batch.iter().map(|key| self.hash(key.as_bytes())));
        if batch.skipped() > 0 {
            self.skipped.fetch_add(batch.skipped(), Ordering::Relaxed);
        }
    }

    /// Adds a copy of each of a scan's `hashes`, in shard order: several
    /// times faster than one key at a time for a filter larger than the
    /// CPU's caches. Sorts `hashes`.
    pub(crate) fn insert_hashes(&self, hashes: &mut [u64]) {
        self.chain.insert_many(hashes);
    }

    /// Removes one copy of the key's fingerprint: a copy that this key's
    /// insert put there, if the caller applies each stored row's delete
    /// once, after its insert.
    pub(crate) fn remove(&self, key: &Key<'_>) {
        match self.chain.remove(self.hash(key.as_bytes())) {
            Removal::Removed => {
                self.removed.fetch_add(1, Ordering::Relaxed);
            }
            Removal::Kept => {
                self.kept.fetch_add(1, Ordering::Relaxed);
            }
            Removal::Missing => {
                // An exact filter holds every deleted row's insert: this
                // one does not (a row the scan never saw: a table outside
                // the key query, writes that bypassed the feed). Other
                // deletes may hit another key's fingerprint: no more
                // removals, and a rebuild.
                if self.missed.fetch_add(1, Ordering::Relaxed) == 0 {
                    tracing::warn!("a deleted row's key was not in the counting filter: the filter and the change feed disagree; it keeps deleted keys until a rebuild");
                }
                self.set_exact(false);
            }
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
        self.chain.keys()
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

    /// Deletes whose key matched several stages, left in the filter.
    pub(crate) fn kept(&self) -> u64 {
        self.kept.load(Ordering::Relaxed)
    }

    /// Keys the stages hold before any shard grows again.
    pub(crate) fn capacity(&self) -> u64 {
        self.chain.capacity()
    }

    /// The stages the filter grew into.
    pub(crate) fn stage_count(&self) -> usize {
        self.chain.stage_count()
    }

    pub(crate) fn bits(&self) -> u64 {
        self.chain.bits()
    }

    /// Whether keys found every stage full and wait for a rebuild in the
    /// overflow table (past [`chain::MAX_STAGES`] stages).
    pub(crate) fn overflowed(&self) -> bool {
        self.chain.overflowed()
    }

    /// The share of slots in use.
    pub(crate) fn fill(&self) -> f64 {
        self.chain.fill()
    }

    /// The chance that an absent key is found.
    pub(crate) fn estimated_fpp(&self) -> f64 {
        self.chain.estimated_fpp()
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

impl std::fmt::Debug for CountingFilter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the seed: it is the filter's secret.
        f.debug_struct("CountingFilter")
            .field("stages", &self.stage_count())
            .field("exact", &self.exact())
            .field("removed", &self.removed())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests;
