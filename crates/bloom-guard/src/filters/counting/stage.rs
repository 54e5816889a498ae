//! One stage of a counting filter's chain: shards of one size and rate,
//! nested in the stage before it (see `chain.rs`).

use std::sync::Arc;

use parking_lot::RwLock;

use super::shard::{new_shard, Shard};

/// The most slots a shard starts with: 2^16, about 62 000 keys at 95 %.
pub(crate) const SHARD_SLOTS: u64 = 1 << 16;
/// The share of a shard's slots its keys may use (qfilter's bound).
pub(super) const OCCUPANCY: f64 = 0.95;
/// The lowest rate a stage is sized for.
pub(super) const MIN_RATE: f64 = 1e-12;

/// One stage: shards of one size and rate.
#[derive(Debug)]
pub(crate) struct Stage {
    pub(super) shards: Box<[RwLock<Shard>]>,
    /// The narrowest and the widest fingerprint of its shards (fixed:
    /// growing in place keeps a shard's width).
    widths: (u8, u8),
    /// Whether it nests in the stage before it (see the module's docs);
    /// the first stage does.
    pub(super) nests: bool,
}

impl Stage {
    /// A stage for `capacity` keys whose rate is `rate` once its shards
    /// grew [`GROWTH_ROOM`](super::shard::GROWTH_ROOM) times, nested in `after` (the stage before it,
    /// if any): a multiple of its shard count, fingerprints at least as
    /// wide (at a lower rate if need be).
    pub(super) fn new(capacity: u64, rate: f64, after: Option<&Stage>) -> Self {
        let capacity = capacity.max(1);
        let per_shard = ((SHARD_SLOTS as f64) * OCCUPANCY) as u64;
        let mut count = capacity.div_ceil(per_shard).max(1);
        let mut width = 0;
        if let Some(after) = after {
            let before = after.shards.len() as u64;
            count = count.div_ceil(before) * before;
            width = after.widths.1;
        }
        let shard_capacity = capacity.div_ceil(count).max(1);
        let mut rate = rate;
        let mut first = new_shard(shard_capacity, rate);
        while first.fingerprint_size() < width && rate > MIN_RATE {
            rate = (rate / 2.0).max(MIN_RATE);
            first = new_shard(shard_capacity, rate);
        }
        let shards = std::iter::once(first)
            .chain((1..count).map(|_| new_shard(shard_capacity, rate)))
            .map(|shard| RwLock::new(Arc::new(shard)))
            .collect();
        Self::of(shards, after)
    }

    /// A stage of `shards`, after the stage `after`.
    pub(super) fn of(shards: Box<[RwLock<Shard>]>, after: Option<&Stage>) -> Self {
        let widths = shards.iter().fold((u8::MAX, 0), |(low, high), shard| {
            let width = shard.read().fingerprint_size();
            (low.min(width), high.max(width))
        });
        let nests = after.is_none_or(|before| {
            shards.len().is_multiple_of(before.shards.len()) && widths.0 >= before.widths.1
        });
        Self {
            shards,
            widths,
            nests,
        }
    }

    /// The shard of a hash, from its high bits (the fingerprint is its
    /// low bits).
    #[inline]
    pub(super) fn shard(&self, hash: u64) -> &RwLock<Shard> {
        &self.shards[self.index(hash)]
    }

    /// The index of a hash's shard: grows with the hash.
    #[inline]
    pub(super) fn index(&self, hash: u64) -> usize {
        ((u128::from(hash) * self.shards.len() as u128) >> 64) as usize
    }

    #[inline]
    pub(super) fn contains(&self, hash: u64) -> bool {
        self.shard(hash).read().contains_fingerprint(hash)
    }

    /// Adds a copy; `false` if its shard is full.
    pub(super) fn insert(&self, hash: u64) -> bool {
        Arc::make_mut(&mut self.shard(hash).write())
            .insert_fingerprint(true, hash)
            .is_ok()
    }

    /// Adds a copy of each of `hashes`, sorted, all of one shard, under one
    /// lock; returns those that found the shard full.
    pub(super) fn insert_run<'h>(&self, hashes: &'h [u64]) -> &'h [u64] {
        let Some(&first) = hashes.first() else {
            return hashes;
        };
        let mut locked = self.shard(first).write();
        let shard = Arc::make_mut(&mut locked);
        for (at, &hash) in hashes.iter().enumerate() {
            if shard.insert_fingerprint(true, hash).is_err() {
                return &hashes[at..];
            }
        }
        &[]
    }

    pub(super) fn sum(&self, of: impl Fn(&qfilter::Filter) -> u64) -> u64 {
        self.shards.iter().map(|shard| of(&shard.read())).sum()
    }

    /// The chance that an absent key matches here: the mean of the
    /// shards' rates (a key goes to one shard, each as likely).
    pub(super) fn error_ratio(&self) -> f64 {
        let sum: f64 = self
            .shards
            .iter()
            .map(|shard| shard.read().current_error_ratio())
            .sum();
        sum / self.shards.len() as f64
    }
}
