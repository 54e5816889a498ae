//! A counting filter as parts, for a snapshot: written without a copy,
//! read back into a filter.

use super::chain::Chain;
use super::shard::{Shard, ShardError};
use super::{supported, CountingFilter};
use crate::lock::lock;

/// Everything a counting filter is made of.
#[derive(Debug, Clone)]
pub(crate) struct CountingParts {
    pub(crate) seed: u128,
    pub(crate) target_fpp: f64,
    pub(crate) skipped: u64,
    /// Each stage's shards, oldest stage first.
    pub(crate) stages: Vec<Vec<Shard>>,
    pub(crate) overflow: Vec<(u64, u32)>,
}

impl CountingFilter {
    /// The filter's parts and the feed position they hold, taken while no
    /// read is applied. Only reads of the feed change an exact filter (the
    /// write path's keys go to the journal), so this is one moment. The
    /// shards are shared, not copied (see [`Shard`]).
    pub(crate) fn to_parts(&self) -> (CountingParts, Option<String>) {
        let at = lock(&self.position);
        let (stages, overflow) = self.chain.to_parts();
        let parts = CountingParts {
            seed: self.seed,
            target_fpp: self.target_fpp,
            skipped: self.skipped(),
            stages,
            overflow,
        };
        (parts, at.clone())
    }

    /// A filter from a snapshot's parts; not exact until the caller says
    /// so.
    pub(crate) fn from_parts(parts: CountingParts) -> Result<Self, ShardError> {
        if !supported() {
            return Err(ShardError("this CPU lacks popcnt or BMI2".to_owned()));
        }
        let chain = Chain::from_parts(parts.target_fpp, parts.stages, parts.overflow)?;
        Ok(Self::assemble(
            parts.seed,
            parts.target_fpp,
            chain,
            parts.skipped,
        ))
    }
}
