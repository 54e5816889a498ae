//! The SQL tables the follower engine keeps the same way on every
//! database, each backend bringing its own statements: snapshots in chunks
//! (`snapshots`) and the fleet's settings and heartbeats (`fleet`).

pub(crate) mod fleet;
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) mod session_lock;
pub(crate) mod snapshots;
