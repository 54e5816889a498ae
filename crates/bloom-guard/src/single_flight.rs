//! One rebuild at a time: later callers join the one in flight.

use tokio::sync::watch;

use crate::error::BuildError;
use crate::lock::lock;
use crate::shared::{RebuildResult, Shared};
use crate::stats::Stats;

/// The leader of a rebuild: publishes its result to the callers that
/// joined, and clears the slot even if it is cancelled.
pub(crate) struct InFlight<'a> {
    pub(crate) shared: &'a Shared,
    pub(crate) tx: watch::Sender<RebuildResult>,
}

impl InFlight<'_> {
    pub(crate) fn finish(self, outcome: Result<Stats, BuildError>) {
        *lock(&self.shared.rebuild_in_flight) = None;
        let _ = self.tx.send(Some(outcome));
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let mut slot = lock(&self.shared.rebuild_in_flight);
        if slot
            .as_ref()
            .is_some_and(|(_, rx)| rx.same_channel(&self.tx.subscribe()))
        {
            *slot = None;
        }
    }
}
