//! The filter's life, from scan to swap: where keys come from (`source`),
//! one build (`scan`: size, register for inserts, scan, verify, promote;
//! `load` puts the scan's keys in),
//! warm-up, rebuilds and their maintenance (`rebuild`), one rebuild at a
//! time (`single_flight`), and snapshots: writing the filter in use and
//! adopting one instead of scanning (`snapshot/`, `adopt`), and the read
//! barrier a follower keeps so that no refusal trusts a filter older than
//! its request (`barrier`), and the follower's catch-up that brings a new
//! counting filter from its scan's feed position to the present before it
//! goes in use (`catch_up`).
//!
//! Uses `filters/`, `keys/` and the guard's shared state (`handle/`) to put
//! a filter in use; the request path never calls into it.

pub(crate) mod adopt;
pub(crate) mod barrier;
pub(crate) mod catch_up;
pub(crate) mod load;
pub(crate) mod rebuild;
pub(crate) mod scan;
pub(crate) mod single_flight;
pub(crate) mod snapshot;
pub(crate) mod source;
