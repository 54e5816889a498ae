//! The filters: one generation's filter (`filter`), either a growing
//! Bloom filter (`bloom`) made of fastbloom sub-filters (`stage`) or a
//! counting quotient filter that removes keys (`counting`); the filter in
//! use beside the filters being built (`filter_set`), and the recent
//! inserts of this instance's write path (`journal`).
//!
//! Data structures only: no clock, no task, no counters. Uses `keys/` only.

pub(crate) mod bloom;
pub(crate) mod counting;
pub(crate) mod filter;
pub(crate) mod filter_set;
pub(crate) mod journal;
pub(crate) mod stage;
