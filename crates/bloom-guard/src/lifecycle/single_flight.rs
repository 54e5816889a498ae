//! One rebuild at a time: later callers join the one in flight.

use tokio::sync::watch;

use crate::error::BuildError;
use crate::lock::lock;
use crate::report::stats::Stats;

/// The result of the rebuild in flight, for the callers that joined it.
pub(crate) type RebuildResult = Option<Result<Stats, BuildError>>;

/// The rebuild in flight: when it started, and where its result appears.
pub(crate) type RebuildSlot = Option<(tokio::time::Instant, watch::Receiver<RebuildResult>)>;

/// A guard's builds: one at a time, and the rebuild in flight that later
/// callers join.
#[derive(Debug, Default)]
pub(crate) struct Builds {
    /// Held by the build (scan or adoption) that runs.
    pub(crate) one_at_a_time: tokio::sync::Mutex<()>,
    /// The rebuild in flight, which later callers join.
    pub(crate) in_flight: std::sync::Mutex<RebuildSlot>,
}

impl Builds {
    /// Whether a rebuild runs now (the admin API shows it).
    #[cfg(feature = "admin")]
    pub(crate) fn rebuilding(&self) -> bool {
        lock(&self.in_flight).is_some()
    }
}

/// The leader of a rebuild: publishes its result to the callers that
/// joined, and clears the slot even if it is cancelled.
pub(crate) struct InFlight<'a> {
    pub(crate) builds: &'a Builds,
    pub(crate) tx: watch::Sender<RebuildResult>,
}

impl InFlight<'_> {
    pub(crate) fn finish(self, outcome: Result<Stats, BuildError>) {
        *lock(&self.builds.in_flight) = None;
        let _ = self.tx.send(Some(outcome));
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let mut slot = lock(&self.builds.in_flight);
        if slot
            .as_ref()
            .is_some_and(|(_, rx)| rx.same_channel(&self.tx.subscribe()))
        {
            *slot = None;
        }
    }
}
