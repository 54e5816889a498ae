//! Jittered exponential backoff, for every retry loop of the crate.

use std::time::Duration;

/// Pauses from 100 ms doubling up to 10 s, each jittered by ±50% so a
/// fleet restarting together does not retry in step.
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    next: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            next: Duration::from_millis(100),
        }
    }
}

impl Backoff {
    /// The pause before the next attempt.
    pub(crate) fn next_pause(&mut self) -> Duration {
        let pause = self.next.mul_f64(0.5 + fastrand::f64());
        self.next = (self.next * 2).min(Duration::from_secs(10));
        pause
    }
}
