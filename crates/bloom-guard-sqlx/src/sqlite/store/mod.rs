//! The tables a fleet shares on one file: snapshots and the build lock
//! (`snapshot`), the fleet's settings and members (`fleet`).

pub(crate) mod fleet;
pub(crate) mod snapshot;
