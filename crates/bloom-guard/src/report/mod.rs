//! What the guard reports about itself: the [`Stats`] snapshot (`stats`),
//! the request counters (`counters`, over the sharded `counter`), and the
//! same figures through the `metrics` facade (`metrics`).
//!
//! Near the ground floor: uses `switches::mode` and `switches::settings` for
//! the names it reports, nothing of the request path or the filter's life.

pub(crate) mod counter;
pub(crate) mod counters;
pub(crate) mod metrics;
pub(crate) mod stats;
