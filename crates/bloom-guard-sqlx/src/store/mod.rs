//! The SQL tables the follower engine keeps the same way on every
//! database, each backend bringing its own statements: snapshots in chunks
//! (`snapshots`) and the fleet's settings and heartbeats (`fleet`).

pub(crate) mod fleet;
pub(crate) mod snapshots;
