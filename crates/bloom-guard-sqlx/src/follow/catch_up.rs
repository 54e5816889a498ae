//! Bringing a new filter (a build's, a snapshot's) from its own feed
//! position to the present and putting it in use, in one sequence with the
//! reader loop's reads: every change reaches it exactly once.

use std::sync::{Arc, Weak};

use bloom_guard::{
    feed::{CatchUp, PendingFilter},
    BuildError,
};
use futures_util::future::BoxFuture;

use super::changes::{warn_skipped, Changes};
use super::{BackendError, Database, Engine, Read};

/// Why a new filter could not be brought up to date.
#[derive(Debug, thiserror::Error)]
pub(super) enum CatchUpError {
    #[error("the follower stopped")]
    Stopped,
    #[error("the filter's feed position {0:?} cannot be read")]
    Position(String),
    #[error("the change feed was pruned past the filter's position")]
    Pruned,
    #[error("a watched table was truncated after the filter's scan")]
    Truncated,
    #[error(transparent)]
    Backend(#[from] BackendError),
}

impl From<CatchUpError> for BuildError {
    fn from(error: CatchUpError) -> Self {
        BuildError::Source(Arc::new(error))
    }
}

/// The follower's [`CatchUp`], registered with its feed reader. Weak: the
/// guard holds it, and must not keep the follower alive.
pub(super) struct CatchUpFrom<B: Database>(pub(super) Weak<Engine<B>>);

impl<B: Database> CatchUp for CatchUpFrom<B> {
    fn catch_up(&self, pending: PendingFilter) -> BoxFuture<'_, Result<u64, BuildError>> {
        Box::pin(async move {
            let follower = self.0.upgrade().ok_or(CatchUpError::Stopped)?;
            let from = B::parse_position(pending.position())
                .ok_or_else(|| CatchUpError::Position(pending.position().to_owned()))?;
            follower
                .bring_up_to_date(&from, Candidate::Build, |changes, reached| {
                    // Truncated after the scan: the rebuild that follows
                    // scans what is left.
                    if changes.truncated {
                        return Err(CatchUpError::Truncated.into());
                    }
                    pending.apply(&changes.added, follower.deletes(changes), reached);
                    pending.promote()
                })
                .await
        })
    }
}

/// Whose filter [`Engine::bring_up_to_date`] brings up to date.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Candidate {
    /// A build's, put in use whatever the read holds: writes the feed could
    /// not record after its scan hold the guard open until a rebuild has
    /// them, and a truncation after it asks for one.
    Build,
    /// A published snapshot's, refused when the read holds writes the feed
    /// could not record: those are then no concern of the filter in use,
    /// whose own reads see them if they came after it.
    Snapshot,
}

impl<B: Database> Engine<B> {
    /// Holding the feed: applies to the filter in use what the reader loop
    /// would (so the hooks see every change), reads the feed from `from`
    /// and hands that read to `put_in_use`, which applies it to the new
    /// filter and puts the filter in use; the feed then stands at that
    /// read's position. No read of the loop is applied between the two, so
    /// each change reaches the new filter exactly once.
    pub(super) async fn bring_up_to_date<T, E>(
        &self,
        from: &B::Position,
        candidate: Candidate,
        put_in_use: impl FnOnce(&Changes, &str) -> Result<T, E>,
    ) -> Result<T, E>
    where
        E: From<CatchUpError>,
    {
        let feed_name = self.backend.feed();
        let mut feed = self.reading.position.lock().await;
        if let Some(position) = feed.clone() {
            // No refusal goes on by this read: as far as the feed is
            // written (the log feed's producer not waited for).
            let read = self
                .backend
                .read_unwaited(&position)
                .await
                .map_err(CatchUpError::from)?;
            if let Read::Changes {
                position: reached,
                changes,
            } = read
            {
                self.note_read(&changes);
                self.hooks.apply(
                    &self.guard,
                    feed_name,
                    &changes,
                    (
                        self.read_start(&position.to_string(), &changes),
                        &reached.to_string(),
                    ),
                );
                *feed = Some(reached);
            }
        }
        let read = self
            .backend
            .read_behind(from)
            .await
            .map_err(CatchUpError::from)?;
        let Read::Changes {
            position: reached,
            changes,
        } = read
        else {
            return Err(CatchUpError::Pruned.into());
        };
        if candidate == Candidate::Build || !changes.resync {
            self.note_read(&changes);
        }
        warn_skipped(feed_name, &changes);
        let in_use = put_in_use(&changes, &reached.to_string())?;
        self.hooks.tell(&changes);
        self.fleet().position = Some(reached.clone());
        *feed = Some(reached);
        self.reading
            .catch_ups
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        Ok(in_use)
    }
}
