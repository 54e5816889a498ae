//! The filter of one generation, of one of two kinds: a growing Bloom
//! filter for guards whose keys are only ever added, a counting quotient
//! filter for guards that follow a change feed and forget deleted keys.
//!
//! Which one a build makes is the guard's choice
//! ([`FilterKind`](crate::stats::FilterKind)): the Bloom filter is lock-free and
//! never needs a rebuild to grow; the counting filter removes a key with
//! its last row, for about the same memory.

use crate::filters::bloom::{random_seed, BloomFilter, BloomParts};
use crate::filters::counting::parts::CountingParts;
use crate::filters::counting::CountingFilter;
use crate::keys::batch::KeyBatch;
use crate::keys::key::Key;

pub(crate) use crate::filters::bloom::{MAX_STAGES, MIN_FPP};

/// A filter of either kind.
#[derive(Debug)]
#[allow(
    clippy::large_enum_variant,
    reason = "one per generation, always behind an Arc: its size is never copied"
)]
pub(crate) enum Filter {
    Bloom(BloomFilter),
    Counting(CountingFilter),
}

/// Everything a filter of either kind is made of, as a snapshot holds it.
pub(crate) enum FilterParts {
    Bloom(BloomParts),
    Counting(CountingParts),
}

impl Filter {
    /// A filter sized for `capacity` keys under `target_fpp`, with a fresh
    /// random hasher; a counting one if `removes` (the caller checked that
    /// the CPU runs it).
    pub(crate) fn new(capacity: u64, target_fpp: f64, removes: bool) -> Self {
        if removes {
            Self::Counting(CountingFilter::new(capacity, target_fpp, random_seed()))
        } else {
            Self::Bloom(BloomFilter::new(capacity, target_fpp))
        }
    }

    /// A filter restored from a snapshot's parts.
    pub(crate) fn from_parts(parts: FilterParts) -> Result<Self, String> {
        match parts {
            FilterParts::Bloom(parts) => Ok(Self::Bloom(BloomFilter::from_parts(parts))),
            FilterParts::Counting(parts) => CountingFilter::from_parts(parts)
                .map(Self::Counting)
                .map_err(|error| error.to_string()),
        }
    }

    pub(crate) fn kind(&self) -> crate::report::stats::FilterKind {
        match self {
            Self::Bloom(_) => crate::report::stats::FilterKind::Bloom,
            Self::Counting(_) => crate::report::stats::FilterKind::Counting,
        }
    }

    /// Whether it can remove keys.
    pub(crate) fn removes(&self) -> bool {
        matches!(self, Self::Counting(_))
    }

    /// The counting filter, if it is one.
    pub(crate) fn counting(&self) -> Option<&CountingFilter> {
        match self {
            Self::Counting(filter) => Some(filter),
            Self::Bloom(_) => None,
        }
    }

    /// The Bloom filter, if it is one.
    pub(crate) fn bloom(&self) -> Option<&BloomFilter> {
        match self {
            Self::Bloom(filter) => Some(filter),
            Self::Counting(_) => None,
        }
    }

    #[inline]
    pub(crate) fn contains(&self, key: &Key<'_>) -> bool {
        match self {
            Self::Bloom(filter) => filter.contains(key),
            Self::Counting(filter) => filter.contains(key),
        }
    }

    #[inline]
    pub(crate) fn insert(&self, key: &Key<'_>) {
        match self {
            Self::Bloom(filter) => filter.insert(key),
            Self::Counting(filter) => filter.insert(key),
        }
    }

    pub(crate) fn insert_batch(&self, batch: &KeyBatch, hashes: &mut Vec<u64>) {
        match self {
            Self::Bloom(filter) => filter.insert_batch(batch, hashes),
            Self::Counting(filter) => filter.insert_batch(batch),
        }
    }

    /// Stored keys (a counting filter: rows).
    pub(crate) fn keys(&self) -> u64 {
        match self {
            Self::Bloom(filter) => filter.keys(),
            Self::Counting(filter) => filter.keys(),
        }
    }

    pub(crate) fn skipped(&self) -> u64 {
        match self {
            Self::Bloom(filter) => filter.skipped(),
            Self::Counting(filter) => filter.skipped(),
        }
    }

    pub(crate) fn capacity(&self) -> u64 {
        match self {
            Self::Bloom(filter) => filter.capacity(),
            Self::Counting(filter) => filter.capacity(),
        }
    }

    pub(crate) fn bits(&self) -> u64 {
        match self {
            Self::Bloom(filter) => filter.bits(),
            Self::Counting(filter) => filter.bits(),
        }
    }

    /// Hash functions per key (one for a counting filter).
    pub(crate) fn hashes(&self) -> u32 {
        match self {
            Self::Bloom(filter) => filter.hashes(),
            Self::Counting(_) => 1,
        }
    }

    /// Sub-filters (stages) the filter grew into.
    pub(crate) fn stage_count(&self) -> usize {
        match self {
            Self::Bloom(filter) => filter.stage_count(),
            Self::Counting(filter) => filter.stage_count(),
        }
    }

    pub(crate) fn fill(&self) -> f64 {
        match self {
            Self::Bloom(filter) => filter.fill(),
            Self::Counting(filter) => filter.fill(),
        }
    }

    pub(crate) fn estimated_fpp(&self) -> f64 {
        match self {
            Self::Bloom(filter) => filter.estimated_fpp(),
            Self::Counting(filter) => filter.estimated_fpp(),
        }
    }

    /// Distinct keys, estimated from the fill (a Bloom filter) or counted.
    pub(crate) fn estimated_keys(&self) -> u64 {
        match self {
            Self::Bloom(filter) => filter.estimated_keys(),
            Self::Counting(filter) => filter.keys(),
        }
    }

    /// The keys it holds before a rebuild is due: for a Bloom filter at
    /// `stages` sub-filters; a counting one grows stages without one.
    pub(crate) fn capacity_within(&self, stages: usize) -> u64 {
        match self {
            Self::Bloom(filter) => filter.capacity_within(stages),
            Self::Counting(_) => u64::MAX,
        }
    }
}
