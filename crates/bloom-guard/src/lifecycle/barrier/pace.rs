//! How often a follower reads the feed for refusals that wait.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

/// How often a follower reads the feed for the read barrier: the trade
/// between a refusal's wait and the database's reads.
///
/// While refusals come slower than [`quiet_below`](Self::quiet_below) a
/// second, each read starts as soon as one waits. Faster, a flood: the
/// next read waits until [`refusals_per_read`](Self::refusals_per_read)
/// refusals share it, or at most [`max_gap`](Self::max_gap) after the last
/// read began. Whatever the flood, reads start at most
/// [`max_reads_per_sec`](Self::max_reads_per_sec) a second.
///
/// With the defaults (1 000 a second, 56 refusals a read, 12 ms, 2 000
/// reads a second): below 1 000 refusals a second, each waits one read's
/// round trip; in a flood, reads cost the database at most one in 56
/// refusals (1.8%) above 4 700 refusals a second and at most 84 reads a
/// second below, where a refusal waits up to 12 ms for its read to start.
/// A client that keeps fewer than 56 requests for absent keys in flight
/// back to back is held to one round of them per 12 ms (the reads it would
/// cost are the database's, whoever sends them).
///
/// # Sharing one budget
///
/// Clones share their ceiling: give every guard of an instance a clone of
/// one pace, and the instance's barrier reads for all of them stay under
/// one [`max_reads_per_sec`](Self::max_reads_per_sec).
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use bloom_guard::{BloomGuard, feed::ReadPace};
///
/// // Fewer database reads, longer waits: one read per 200 refusals,
/// // at most 500 reads a second for both guards together.
/// let pace = ReadPace::default()
///     .refusals_per_read(200)
///     .max_gap(Duration::from_millis(20))
///     .max_reads_per_sec(500);
/// let items = BloomGuard::builder().name("items").read_pace(pace.clone()).build();
/// let users = BloomGuard::builder().name("users").read_pace(pace).build();
/// # let _ = (items, users);
/// ```
#[derive(Debug, Clone)]
pub struct ReadPace {
    quiet_below: f64,
    refusals_per_read: u64,
    max_gap: Duration,
    ceiling: Arc<Ceiling>,
}

impl Default for ReadPace {
    fn default() -> Self {
        Self {
            quiet_below: 1_000.0,
            refusals_per_read: 56,
            max_gap: Duration::from_millis(12),
            ceiling: Arc::new(Ceiling::new(2_000)),
        }
    }
}

impl ReadPace {
    /// The refusals a second below which every read starts at once
    /// (default 1 000): a client reading keys one after another waits one
    /// read's round trip each, at the cost of a read per refusal. Measured
    /// since the last read refusals asked for began.
    #[must_use]
    pub fn quiet_below(mut self, refusals_per_sec: u32) -> Self {
        self.quiet_below = f64::from(refusals_per_sec);
        self
    }

    /// How many waiting refusals a read waits for before it starts early
    /// (default 56): the database reads at most one in this many
    /// refusals once refusals come faster than this many per
    /// [`max_gap`](Self::max_gap). At least 1.
    #[must_use]
    pub fn refusals_per_read(mut self, refusals: u32) -> Self {
        self.refusals_per_read = u64::from(refusals.max(1));
        self
    }

    /// The longest a read for waiting refusals waits for company after the
    /// last read began (default 12 ms): below
    /// [`refusals_per_read`](Self::refusals_per_read) per this long, a
    /// refusal waits at most this long for its read to start, and a lone
    /// refusal not at all.
    #[must_use]
    pub fn max_gap(mut self, gap: Duration) -> Self {
        self.max_gap = gap;
        self
    }

    /// The most barrier reads a second (default 2 000), shared by every
    /// clone of this pace. At least 1.
    #[must_use]
    pub fn max_reads_per_sec(self, reads: u32) -> Self {
        Self {
            ceiling: Arc::new(Ceiling::new(reads)),
            ..self
        }
    }

    /// Whether `asks` refusals over `elapsed` are few enough to read for at
    /// once.
    pub(crate) fn quiet(&self, asks: u64, elapsed: Duration) -> bool {
        asks as f64 <= self.quiet_below * elapsed.as_secs_f64()
    }

    pub(crate) fn per_read(&self) -> u64 {
        self.refusals_per_read
    }

    pub(crate) fn gap(&self) -> Duration {
        self.max_gap
    }

    /// Waits for the next start the ceiling allows, and takes it.
    pub(crate) async fn admit(&self) {
        let now = Instant::now();
        let at = self.ceiling.claim(now);
        if at > now {
            tokio::time::sleep_until(at).await;
        }
    }
}

/// The ceiling on read starts, shared by a pace's clones: a cell-rate
/// limiter (GCRA) claimed without a lock. A short burst of starts goes at
/// once, so a ceiling above the timer's millisecond never makes a read
/// sleep a whole millisecond; over any longer spell, starts keep to the
/// rate.
#[derive(Debug)]
struct Ceiling {
    epoch: Instant,
    every: Duration,
    /// Nanoseconds after `epoch`: the theoretical time of the next start.
    next: AtomicU64,
}

/// How many starts a quiet ceiling lets go at once.
const BURST: u32 = 4;

impl Ceiling {
    fn new(per_sec: u32) -> Self {
        Self {
            epoch: Instant::now(),
            every: Duration::from_secs(1) / per_sec.max(1),
            next: AtomicU64::new(0),
        }
    }

    /// Claims the first start the rate allows at or after `now`.
    fn claim(&self, now: Instant) -> Instant {
        let now_ns = nanos(now.saturating_duration_since(self.epoch));
        let every = nanos(self.every);
        let burst = every.saturating_mul(u64::from(BURST));
        let mut next = self.next.load(Ordering::Acquire);
        loop {
            let due = next.max(now_ns);
            match self.next.compare_exchange_weak(
                next,
                due.saturating_add(every),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    let start = due.saturating_sub(burst).max(now_ns);
                    return self.epoch + Duration::from_nanos(start);
                }
                Err(seen) => next = seen,
            }
        }
    }
}

/// A duration in whole nanoseconds, saturated.
pub(super) fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn clones_share_the_ceiling() {
        let pace = ReadPace::default().max_reads_per_sec(100);
        let other = pace.clone();
        let now = Instant::now();
        // A burst goes at once, whichever clone claims.
        for _ in 0..=BURST {
            assert_eq!(pace.ceiling.claim(now), now);
        }
        assert_eq!(other.ceiling.claim(now), now + Duration::from_millis(10));
        assert_eq!(pace.ceiling.claim(now), now + Duration::from_millis(20));
        // A pace of its own does not share.
        let own = ReadPace::default().max_reads_per_sec(100);
        assert_eq!(own.ceiling.claim(now), now);
    }

    #[tokio::test(start_paused = true)]
    async fn over_a_second_starts_keep_to_the_rate() {
        let pace = ReadPace::default().max_reads_per_sec(100);
        let start = Instant::now();
        let mut starts = 0;
        while start.elapsed() < Duration::from_secs(1) {
            pace.admit().await;
            starts += 1;
        }
        assert!(
            (100..=100 + BURST as usize + 1).contains(&starts),
            "{starts} starts"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_quiet_spell_leaves_no_debt() {
        let pace = ReadPace::default().max_reads_per_sec(10);
        let start = Instant::now();
        pace.admit().await;
        tokio::time::advance(Duration::from_secs(5)).await;
        let later = Instant::now();
        pace.admit().await;
        assert_eq!(Instant::now(), later, "a read after a quiet spell waited");
        assert!(later > start);
    }
}
