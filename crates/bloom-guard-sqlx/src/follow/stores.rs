//! The tables a fleet shares, as the engine sees them: a backend's
//! snapshots and fleet tables (their contracts in `store/`), and its build
//! lock.

use std::future::Future;

use crate::follow::error::BackendError;
use crate::store::fleet::FleetTable;
use crate::store::snapshots::SnapshotStore;

/// The tables a fleet shares: snapshots, the fleet's settings and
/// members, and the build lock.
pub(crate) trait Stores: Send + Sync + 'static {
    /// The fleet's lock on building the guard's filter, released when
    /// dropped (a crashed holder frees it too).
    type Lock: Send + Sync + 'static;
    /// Where snapshots are kept.
    type Snapshots: SnapshotStore;
    /// Where the fleet's settings and heartbeats are kept.
    type Fleet: FleetTable;

    /// Where the guard's snapshots are kept.
    fn snapshots(&self) -> &Self::Snapshots;

    /// Where the fleet's settings and heartbeats are kept.
    fn fleet(&self) -> &Self::Fleet;

    /// Waits for the fleet's build lock of `guard`.
    fn lock(&self, guard: &str) -> impl Future<Output = Result<Self::Lock, BackendError>> + Send;

    /// The fleet's build lock of `guard`, if nobody holds it.
    fn try_lock(
        &self,
        guard: &str,
    ) -> impl Future<Output = Result<Option<Self::Lock>, BackendError>> + Send;
}
