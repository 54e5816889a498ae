//! One statement for every guard of an instance on one database: a read
//! that refusals of one guard asked for also reads the feeds of the other
//! guards whose refusals wait, so a flood over several guards costs the
//! database one read, not one per guard.
//!
//! Each companion's read follows the same protocol as its own loop's: its
//! feed held, its read numbered ([`FeedReader::begin_if_asked`]) before
//! the statement takes its snapshot, its keys in the filter before its
//! position moves and its waiters go on.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, Weak};

use bloom_guard::feed::ReadStart;
use tokio::sync::OwnedMutexGuard;

use super::{Database, Engine, Read};
use crate::lock::lock;

/// The followers of one instance that read one database's feeds.
pub(super) struct ReadGroup<B: Database> {
    members: Mutex<Vec<Weak<Engine<B>>>>,
}

/// The groups of this process, by backend, instance and database.
type Groups = HashMap<(TypeId, String), Weak<dyn Any + Send + Sync>>;

static GROUPS: LazyLock<Mutex<Groups>> = LazyLock::new(Mutex::default);

/// A follower's place in its group, for as long as its loop reads.
pub(super) struct Membership<B: Database> {
    group: Arc<ReadGroup<B>>,
    follower: Weak<Engine<B>>,
}

/// Another guard's follower whose read the statement makes: its feed held
/// from before its read began until the read is applied.
pub(super) struct Companion<B: Database> {
    pub(super) follower: Arc<Engine<B>>,
    feed: OwnedMutexGuard<Option<B::Position>>,
    pub(super) position: B::Position,
    started: ReadStart,
    /// Whether the read was applied: a companion dropped before (the
    /// statement's follower stopped) wakes its own loop to read.
    applied: bool,
}

impl<B: Database> Membership<B> {
    /// Puts `follower` in the group of its instance and database, if its
    /// database reads several feeds in one statement.
    pub(super) fn join(follower: &Arc<Engine<B>>) -> Option<Self> {
        let database = follower.backend.shared_reads()?;
        let key = (
            TypeId::of::<B>(),
            format!("{} {database}", follower.schedule.instance_id),
        );
        let group = {
            let mut groups = lock(&GROUPS);
            groups.retain(|_, group| group.strong_count() > 0);
            let found = groups
                .get(&key)
                .and_then(Weak::upgrade)
                .and_then(|group| group.downcast::<ReadGroup<B>>().ok());
            found.unwrap_or_else(|| {
                let group = Arc::new(ReadGroup {
                    members: Mutex::default(),
                });
                let erased: Arc<dyn Any + Send + Sync> = group.clone();
                groups.insert(key, Arc::downgrade(&erased));
                group
            })
        };
        lock(&group.members).push(Arc::downgrade(follower));
        Some(Self {
            group,
            follower: Arc::downgrade(follower),
        })
    }

    /// The other members: their waiting refusals count toward the company
    /// of this member's reads.
    pub(super) fn others(&self) -> Vec<Arc<Engine<B>>> {
        lock(&self.group.members)
            .iter()
            .filter(|member| !member.ptr_eq(&self.follower))
            .filter_map(Weak::upgrade)
            .collect()
    }

    /// The other members with refusals waiting whose feed is free now,
    /// each with its read begun: they join the read `leader` is about to
    /// make. A member whose feed is held (its own read, a catch-up) reads
    /// for itself.
    pub(super) fn company(&self) -> Vec<Companion<B>> {
        let members: Vec<_> = lock(&self.group.members).clone();
        let mut company = Vec::new();
        for member in members {
            if member.ptr_eq(&self.follower) {
                continue;
            }
            let Some(follower) = member.upgrade() else {
                continue;
            };
            let Ok(feed) = Arc::clone(&follower.reading.position).try_lock_owned() else {
                continue;
            };
            let Some(position) = feed.clone() else {
                continue;
            };
            // Numbered after the feed is held, before the statement.
            let Some(started) = follower.reading.barrier.begin_if_asked() else {
                continue;
            };
            company.push(Companion {
                follower,
                feed,
                position,
                started,
                applied: false,
            });
        }
        company
    }
}

impl<B: Database> Drop for Membership<B> {
    fn drop(&mut self) {
        lock(&self.group.members).retain(|member| !member.ptr_eq(&self.follower));
    }
}

impl<B: Database> Companion<B> {
    /// Applies the statement's read for this companion; `None`: the
    /// statement failed, or found its feed pruned. Then its refusals go on
    /// to the handler at once and its own loop reads.
    pub(super) fn finish(mut self, read: Option<Read<B::Position>>) {
        match read {
            Some(Read::Changes {
                position: reached,
                changes,
            }) => {
                let follower = &self.follower;
                follower.apply_keys(&self.position, &reached, &changes, false);
                follower.apply_position(
                    &mut *self.feed,
                    reached,
                    &changes,
                    Some(self.started),
                    true,
                );
                self.applied = true;
                // The hooks last, after the position moved: a hook that
                // panics cannot make this guard read the changes again,
                // nor stop the follower whose statement it was.
                let told = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    follower.hooks.tell(&changes);
                }));
                if told.is_err() {
                    tracing::error!(
                        guard = follower.guard.name(),
                        "a hook panicked on the changes of a read another guard's follower made for this one; ignored"
                    );
                }
            }
            Some(Read::Pruned) | None => self.follower.reading.barrier.failed(),
        }
    }
}

impl<B: Database> Drop for Companion<B> {
    fn drop(&mut self) {
        if !self.applied {
            // Its refusals asked for a read this one did not bring.
            self.follower.reading.now.notify_one();
        }
    }
}
