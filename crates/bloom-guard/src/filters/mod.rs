//! The filters: one generation's growing filter (`filter`) made of
//! fastbloom sub-filters (`stage`), the filter in use beside the filters
//! being built (`filter_set`), and the recent inserts of this instance's
//! write path that a new build must not miss (`journal`).
//!
//! Data structures only: no clock, no task, no counters. Uses `keys/` only.

pub(crate) mod filter;
pub(crate) mod filter_set;
pub(crate) mod journal;
pub(crate) mod stage;
