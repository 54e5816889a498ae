//! One filter build: size, register for inserts, scan, verify, promote
//! (a counting filter scanned at a feed position: through the follower's
//! catch-up).

use std::sync::Arc;
use std::time::Instant;

use futures_util::StreamExt;

use crate::error::BuildError;
use crate::filters::filter::Filter;
use crate::handle::shared::{Overfull, Shared};
use crate::keys::key::Key;
use crate::lifecycle::catch_up::{PendingFilter, Promote};
use crate::lifecycle::load::Loader;
use crate::lifecycle::source::KeySource;
use crate::report::stats::FilterOrigin;

/// Keys checked against a new filter before it is put in use.
const SAMPLE_SIZE: usize = 256;

pub(crate) async fn scan<S: KeySource>(
    shared: &Arc<Shared>,
    source: &S,
    floor: u64,
) -> Result<(), BuildError> {
    let started = Instant::now();
    let hint = source.count_hint().await.map_err(BuildError::source)?;
    let config = &shared.config;
    // Never smaller than the filter in use: a low count hint (stale planner
    // statistics) must not shrink a filter that live inserts have grown.
    let wanted = hint
        .unwrap_or(0)
        .max(config.expected_items)
        .max(floor)
        .max(shared.filters.keys_to_carry());
    let capacity = (wanted as f64 * (1.0 + config.headroom)).ceil() as u64;
    let filter = Arc::new(Filter::new(
        capacity,
        config.target_fpp,
        shared.counts_rows(),
    ));
    tracing::info!(count_hint = ?hint, capacity, bits = filter.bits(), kind = filter.kind().as_str(), "bloom filter build started");
    // More keys than planned grow the filter's sub-filters: one scan,
    // whatever the hint said.

    // A counting filter of a guard with one follower is brought up to date
    // from its scan's feed position, if the source names one: until its
    // first batch says, it holds the feed's keys aside (a key both scanned
    // and taken would be a copy no delete removes).
    let from_position = filter.removes() && shared.catch_up().is_some();
    if let (Some(counting), true) = (filter.counting(), from_position) {
        counting.hold_live_keys();
    }
    let registration = Registration::new(shared, Arc::clone(&filter));
    let mut keys = source.keys();
    let mut scanned: u64 = 0;
    let mut sample: Vec<Vec<u8>> = Vec::with_capacity(SAMPLE_SIZE);
    let mut loader = Loader::new(Arc::clone(&filter));
    let mut last_report = (Instant::now(), 0_u64);
    let mut first = true;
    while let Some(batch) = keys.next().await {
        let batch = batch.map_err(BuildError::source)?;
        if let (true, Some(counting)) = (std::mem::take(&mut first), filter.counting()) {
            counting.settle(batch.position().filter(|_| from_position));
        }
        let batch = config.key_type.canonical_batch(&batch);
        loader.load(&batch).await?;
        if sample.len() < SAMPLE_SIZE {
            sample.extend(
                batch
                    .iter()
                    .step_by(97)
                    .take(SAMPLE_SIZE - sample.len())
                    .map(|k| k.as_bytes().to_vec()),
            );
        }
        scanned += batch.len() as u64;
        // A batch is a fraction of a millisecond of work: give the requests
        // queued on this worker their turn before the next one.
        tokio::task::yield_now().await;
        let since = last_report.0.elapsed();
        if since >= config.progress_interval {
            let rate = (scanned - last_report.1) as f64 / since.as_secs_f64();
            tracing::info!(
                keys = scanned,
                keys_per_sec = rate as u64,
                "bloom filter build in progress"
            );
            last_report = (Instant::now(), scanned);
        }
    }
    drop(keys);
    loader.finish().await?;
    if let (true, Some(counting)) = (first, filter.counting()) {
        // No batch at all: no position either.
        counting.settle(None);
    }
    let missing = sample
        .iter()
        .filter(|key| !filter.contains(&Key::from(&key[..])))
        .count();
    if missing > 0 {
        return Err(BuildError::Verification {
            missing,
            checked: sample.len(),
        });
    }
    let catch_up = filter
        .counting()
        .and_then(|counting| counting.position())
        .map(|position| (position, shared.catch_up()));
    let generation = match catch_up {
        // From its scan's position to the present, by the follower.
        Some((position, Some(catch_up))) => {
            let pending = PendingFilter::new(
                Arc::clone(shared) as Arc<dyn Promote>,
                shared.config.key_type,
                Arc::clone(&filter),
                position,
                FilterOrigin::Scan,
            );
            let generation = catch_up.catch_up(pending).await?;
            drop(registration);
            generation
        }
        // The follower stopped during the scan: the filter took no feed
        // keys since its position, and none will bring it up to date.
        Some((_, None)) => return Err(BuildError::source(FollowerGone)),
        None => registration
            .promote(FilterOrigin::Scan)
            .map_err(|overfull| BuildError::Overfull {
                estimated_fpp: overfull.estimated_fpp,
                bound: overfull.bound,
            })?,
    };
    let elapsed = started.elapsed();
    tracing::info!(
        generation,
        keys = scanned,
        elapsed_ms = elapsed.as_millis() as u64,
        keys_per_sec = (scanned as f64 / elapsed.as_secs_f64().max(1e-9)) as u64,
        estimated_fpp = filter.estimated_fpp(),
        sub_filters = filter.stage_count(),
        "bloom filter ready"
    );
    Ok(())
}

/// The change feed's follower stopped while a counting filter was scanned.
#[derive(Debug, thiserror::Error)]
#[error("the change feed's follower stopped during the scan; the filter could not be brought up to date")]
struct FollowerGone;

/// A filter registered for write-through inserts; unregistered on drop
/// unless promoted, so a failed or cancelled build leaves nothing behind.
pub(crate) struct Registration<'a> {
    shared: &'a Shared,
    filter: Option<Arc<Filter>>,
}

impl<'a> Registration<'a> {
    pub(crate) fn new(shared: &'a Shared, filter: Arc<Filter>) -> Self {
        shared.filters.register(&filter);
        Self {
            shared,
            filter: Some(filter),
        }
    }

    /// Puts the filter in use, unless it is overfull (then it is
    /// unregistered).
    pub(crate) fn promote(mut self, origin: FilterOrigin) -> Result<u64, Overfull> {
        match self.filter.take() {
            Some(filter) => {
                let promoted = self.shared.promote(&filter, origin);
                if promoted.is_err() {
                    self.shared.filters.unregister(&filter);
                }
                promoted
            }
            None => Ok(0),
        }
    }
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        if let Some(filter) = self.filter.take() {
            self.shared.filters.unregister(&filter);
        }
    }
}
