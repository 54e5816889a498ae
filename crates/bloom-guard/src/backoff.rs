//! Jittered exponential backoff, for every retry loop of the crate.

use std::time::Duration;

/// Pauses that start at `first`, double up to `max`, each jittered by ±50%
/// so a fleet restarting together does not retry in step.
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    next: Duration,
    max: Duration,
}

impl Backoff {
    pub(crate) fn new(first: Duration, max: Duration) -> Self {
        Self { next: first, max }
    }

    /// The pause before the next attempt.
    pub(crate) fn next_pause(&mut self) -> Duration {
        let pause = self.next.mul_f64(0.5 + fastrand::f64());
        self.next = (self.next * 2).min(self.max);
        pause
    }
}
