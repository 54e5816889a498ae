//! The counting filter's fingerprints: a chain of stages, each a set of
//! quotient-filter shards, that grows without a rescan.
//!
//! Every stage is sharded: a key's shard is picked from its hash's high
//! bits, its fingerprint is the hash's low bits. A shard grows in place
//! up to [`GROWTH_ROOM`](super::shard::GROWTH_ROOM) times its first size (each doubling turns a bit of
//! the fingerprint's remainder into quotient, so the rate doubles too).
//! When a shard of the newest stage is full, a new stage starts, with as
//! many keys' room as every stage before it together and half the rate of
//! the stage before at full size ([`TIGHTENING`]): the rates form a series
//! whose sum stays under twice the target however many keys arrive, and
//! no key is ever moved.
//!
//! A key's copies live in whichever stage took each of its rows (the
//! newest when it arrived, or, for a scan's set, the newest when the set
//! began), so a delete must take a copy that stands for one of the key's
//! rows; what makes that safe is that the stages nest, not the order in
//! which they took copies. The stages are nested: each one's shard count is a multiple of
//! the one before (so two hashes in one shard of a later stage share a
//! shard in every earlier one) and its fingerprints are at least as wide.
//! Two keys that match in a later stage then match in every earlier one,
//! and [`Chain::remove`] takes the copy from the latest stage that matches
//! the key: if that copy stood for another key's row, the deleted row's own
//! copy, in an earlier stage, matches that other key too and stands for its
//! row from then on, so every live row keeps a copy of its own. A chain
//! whose stages are not nested (one read from a snapshot of another layout)
//! removes a copy only when exactly one stage matches, and otherwise leaves
//! the key in, a harmless false positive.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use std::sync::Arc;

use parking_lot::RwLock;

use super::shard::{Shard, ShardError};
use super::stage::{Stage, MIN_RATE, OCCUPANCY};
use crate::lock::lock;

/// Each stage's rate at full size, against the stage before it.
pub(crate) const TIGHTENING: f64 = 0.5;
/// The most stages; each one more than doubles the room, so the chain
/// never needs them all. Past them, keys spill into an exact table and a
/// rebuild is asked for.
pub(crate) const MAX_STAGES: usize = 32;

/// What [`Chain::remove`] did with one deleted row's key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Removal {
    /// One copy of its fingerprint went, from the stage that held it.
    Removed,
    /// No stage holds its fingerprint: the filter and the feed disagree.
    Missing,
    /// Several stages of a chain that is not nested match it: it stays (a
    /// false positive) rather than risk another key's fingerprint.
    Kept,
}

/// The stages of a counting filter, oldest first, and the exact table of
/// keys past the last.
#[derive(Debug)]
pub(crate) struct Chain {
    target_fpp: f64,
    stages: [OnceLock<Stage>; MAX_STAGES],
    /// Fingerprints that found the last stage full, by full hash and count.
    overflow: Mutex<HashMap<u64, u32>>,
    overflowed: std::sync::atomic::AtomicBool,
}

impl Chain {
    /// A chain whose first stage holds `capacity` keys, sized so that the
    /// whole chain's rate stays under twice `target_fpp`.
    pub(crate) fn new(capacity: u64, target_fpp: f64) -> Self {
        let chain = Self::empty(target_fpp, HashMap::new());
        chain.stages[0].get_or_init(|| Stage::new(capacity, rate_of(target_fpp, 0), None));
        chain
    }

    fn empty(target_fpp: f64, overflow: HashMap<u64, u32>) -> Self {
        Self {
            target_fpp,
            stages: [const { OnceLock::new() }; MAX_STAGES],
            overflowed: std::sync::atomic::AtomicBool::new(!overflow.is_empty()),
            overflow: Mutex::new(overflow),
        }
    }

    /// The stages started so far, oldest first.
    pub(crate) fn stages(&self) -> impl Iterator<Item = &Stage> {
        self.stages.iter().map_while(OnceLock::get)
    }

    pub(crate) fn stage_count(&self) -> usize {
        self.stages().count()
    }

    #[inline]
    pub(crate) fn contains(&self, hash: u64) -> bool {
        if self.stages().any(|stage| stage.contains(hash)) {
            return true;
        }
        self.overflowed() && lock(&self.overflow).contains_key(&hash)
    }

    /// Adds one copy to the newest stage, starting the next one if its
    /// shard is full.
    pub(crate) fn insert(&self, hash: u64) {
        let mut at = self.stage_count().saturating_sub(1);
        while let Some(stage) = self.stages.get(at).and_then(OnceLock::get) {
            if stage.insert(hash) {
                return;
            }
            at += 1;
            if let Some(next) = self.stages.get(at) {
                next.get_or_init(|| self.next_stage(at));
            }
        }
        let mut overflow = lock(&self.overflow);
        *overflow.entry(hash).or_insert(0) += 1;
        self.overflowed
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// Adds one copy of each of `hashes` in the order of their shards:
    /// each shard is locked once and its memory is still in the cache for
    /// the next hash, where random order reaches a cold shard for nearly
    /// every one. Each goes to the stage that was newest when the call
    /// began, as if they had all arrived at once, and one whose shard
    /// there is full goes on as [`insert`](Self::insert) would. Sorts
    /// `hashes`.
    pub(crate) fn insert_many(&self, hashes: &mut [u64]) {
        hashes.sort_unstable();
        let Some(stage) = self.stages().last() else {
            return;
        };
        let mut rest: &[u64] = hashes;
        while let Some(&first) = rest.first() {
            // The shard is picked from the high bits: sorted hashes of one
            // shard are next to each other.
            let index = stage.index(first);
            let run = rest.partition_point(|&hash| stage.index(hash) <= index);
            let (same, after) = rest.split_at(run);
            for &hash in stage.insert_run(same) {
                self.insert(hash);
            }
            rest = after;
        }
    }

    /// Stage `at`: room for as many keys as the stages before it hold
    /// fully grown, at [`TIGHTENING`] times the last one's rate.
    fn next_stage(&self, at: usize) -> Stage {
        let before: u64 = self
            .stages()
            .take(at)
            .map(|stage| stage.sum(qfilter::Filter::max_capacity))
            .sum();
        let last = at
            .checked_sub(1)
            .and_then(|last| self.stages.get(last)?.get());
        Stage::new(before, rate_of(self.target_fpp, at), last)
    }

    /// Removes one copy of a deleted row's key: from the latest stage that
    /// matches it, or where the stages are not nested, from the only one
    /// (see the module's docs).
    pub(crate) fn remove(&self, hash: u64) -> Removal {
        // A copy in the overflow table has this very hash: take it first.
        if self.overflowed() {
            let mut overflow = lock(&self.overflow);
            if let Some(count) = overflow.get_mut(&hash) {
                *count -= 1;
                if *count == 0 {
                    overflow.remove(&hash);
                }
                self.overflowed
                    .store(!overflow.is_empty(), std::sync::atomic::Ordering::Release);
                return Removal::Removed;
            }
        }
        let (mut matches, mut latest) = (0, None);
        for stage in self.stages().filter(|stage| stage.contains(hash)) {
            matches += 1;
            latest = Some(stage);
        }
        let Some(stage) = latest else {
            return Removal::Missing;
        };
        if matches > 1 && !self.stages().all(|stage| stage.nests) {
            return Removal::Kept;
        }
        if Arc::make_mut(&mut stage.shard(hash).write()).remove_fingerprint(hash) {
            Removal::Removed
        } else {
            Removal::Missing
        }
    }

    /// How many stages match a hash.
    #[cfg(test)]
    pub(super) fn matching(&self, hash: u64) -> usize {
        self.stages().filter(|stage| stage.contains(hash)).count()
    }

    /// Copies held: one per stored row.
    pub(crate) fn keys(&self) -> u64 {
        let held: u64 = self
            .stages()
            .map(|stage| stage.sum(qfilter::Filter::len))
            .sum();
        let spilled: u64 = lock(&self.overflow).values().map(|&n| u64::from(n)).sum();
        held + spilled
    }

    /// Keys the stages hold before any shard grows again.
    pub(crate) fn capacity(&self) -> u64 {
        self.stages()
            .map(|stage| stage.sum(qfilter::Filter::capacity))
            .sum()
    }

    pub(crate) fn bits(&self) -> u64 {
        let bytes: u64 = self
            .stages()
            .map(|stage| stage.sum(|shard| shard.memory_usage() as u64))
            .sum();
        bytes * 8
    }

    /// Whether keys found every stage full and wait for a rebuild in the
    /// overflow table.
    pub(crate) fn overflowed(&self) -> bool {
        self.overflowed.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The share of slots in use.
    pub(crate) fn fill(&self) -> f64 {
        let (mut len, mut slots) = (0.0, 0.0);
        for stage in self.stages() {
            for shard in stage.shards.iter() {
                let shard = shard.read();
                len += shard.len() as f64;
                slots += shard.capacity() as f64 / OCCUPANCY;
            }
        }
        if slots == 0.0 {
            0.0
        } else {
            len / slots
        }
    }

    /// The chance that an absent key is found: it is looked up in every
    /// stage.
    pub(crate) fn estimated_fpp(&self) -> f64 {
        let stages: f64 = self.stages().map(Stage::error_ratio).sum();
        let overflow = if self.overflowed() { 1e-12 } else { 0.0 };
        stages + overflow
    }

    /// Every stage's shards as they are now, and the overflow table. The
    /// shards are shared, not copied: one the filter changes from now on
    /// is copied then.
    pub(crate) fn to_parts(&self) -> (Vec<Vec<Shard>>, Vec<(u64, u32)>) {
        let stages = self
            .stages()
            .map(|stage| {
                stage
                    .shards
                    .iter()
                    .map(|shard| Arc::clone(&shard.read()))
                    .collect()
            })
            .collect();
        let overflow = lock(&self.overflow)
            .iter()
            .map(|(&hash, &count)| (hash, count))
            .collect();
        (stages, overflow)
    }

    /// A chain of a snapshot's stages.
    pub(crate) fn from_parts(
        target_fpp: f64,
        stages: Vec<Vec<Shard>>,
        overflow: Vec<(u64, u32)>,
    ) -> Result<Self, ShardError> {
        if stages.is_empty() || stages.len() > MAX_STAGES {
            return Err(ShardError(format!("{} stages", stages.len())));
        }
        let chain = Self::empty(target_fpp, overflow.into_iter().collect());
        for (slot, shards) in chain.stages.iter().zip(stages) {
            let shards: Box<[_]> = shards.into_iter().map(RwLock::new).collect();
            if shards.is_empty() {
                return Err(ShardError("a stage with no shards".to_owned()));
            }
            let before = chain.stages().last();
            let stage = Stage::of(shards, before);
            slot.get_or_init(|| stage);
        }
        Ok(chain)
    }
}

/// Stage `at`'s rate at full size: the target for the first, then
/// [`TIGHTENING`] times the one before; their sum stays under twice the
/// target.
fn rate_of(target_fpp: f64, at: usize) -> f64 {
    let exponent = i32::try_from(at).unwrap_or(i32::MAX);
    (target_fpp * TIGHTENING.powi(exponent)).clamp(MIN_RATE, 0.5)
}
