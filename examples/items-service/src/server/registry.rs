//! The connections a port serves, which of them are idle, and the policy at
//! the cap: a new connection takes the place of the one idle the longest.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::Notify;
use tokio::time::Instant;

/// The connections of one port, and which of them have no request in flight.
#[derive(Debug)]
pub(super) struct Registry {
    max: usize,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    next_id: u64,
    /// Connections that hold a place under the cap: every open one except
    /// those told to close to make room.
    serving: usize,
    connections: HashMap<u64, Entry>,
    /// The idle connections that hold a place, oldest first.
    idle: BTreeSet<(Instant, u64)>,
}

#[derive(Debug)]
struct Entry {
    in_flight: usize,
    /// When the last request ended, or the connection was accepted; only
    /// meaningful while no request is in flight.
    idle_since: Instant,
    /// Told to close to make room for a new connection.
    evicted: bool,
    evict: Arc<Notify>,
}

/// What [`Registry::admit`] decided.
#[derive(Debug)]
pub(super) enum Admission {
    /// Under the cap.
    Admitted(Slot),
    /// At the cap: the connection idle the longest was told to close.
    MadeRoom(Slot),
    /// At the cap, and every connection has a request in flight.
    Full,
}

impl Registry {
    pub(super) fn new(max: usize) -> Arc<Self> {
        Arc::new(Self {
            max,
            state: Mutex::new(State::default()),
        })
    }

    /// Gives a new connection a place: a free one, or at the cap the place
    /// of the connection idle the longest, which is told to close at once.
    /// A connection with a request in flight is never made to close.
    pub(super) fn admit(self: &Arc<Self>) -> Admission {
        let now = Instant::now();
        let mut state = self.lock();
        let state = &mut *state;
        let made_room = state.serving >= self.max;
        if made_room {
            let Some((_, oldest)) = state.idle.pop_first() else {
                return Admission::Full;
            };
            if let Some(entry) = state.connections.get_mut(&oldest) {
                entry.evicted = true;
                entry.evict.notify_one();
            }
            state.serving -= 1;
        }
        let id = state.next_id;
        state.next_id += 1;
        state.serving += 1;
        let evict = Arc::new(Notify::new());
        state.connections.insert(
            id,
            Entry {
                in_flight: 0,
                idle_since: now,
                evicted: false,
                evict: Arc::clone(&evict),
            },
        );
        state.idle.insert((now, id));
        let slot = Slot {
            registry: Arc::clone(self),
            id,
            evict,
        };
        if made_room {
            Admission::MadeRoom(slot)
        } else {
            Admission::Admitted(slot)
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Nothing panics while holding the lock; the state stays whole.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn request_started(&self, id: u64) {
        let mut state = self.lock();
        let state = &mut *state;
        if let Some(entry) = state.connections.get_mut(&id) {
            if entry.in_flight == 0 {
                state.idle.remove(&(entry.idle_since, id));
            }
            entry.in_flight += 1;
        }
    }

    fn request_ended(&self, id: u64) {
        let now = Instant::now();
        let mut state = self.lock();
        let state = &mut *state;
        // A request can outlive its connection (HTTP/2 streams run on tasks
        // of their own).
        if let Some(entry) = state.connections.get_mut(&id) {
            entry.in_flight -= 1;
            if entry.in_flight == 0 {
                entry.idle_since = now;
                if !entry.evicted {
                    state.idle.insert((now, id));
                }
            }
        }
    }
}

/// A connection's place in the [`Registry`], given up when dropped.
#[derive(Debug)]
pub(super) struct Slot {
    registry: Arc<Registry>,
    id: u64,
    evict: Arc<Notify>,
}

impl Slot {
    /// The handle that counts this connection's requests in flight.
    pub(super) fn tracker(&self) -> Tracker {
        Tracker {
            registry: Arc::clone(&self.registry),
            id: self.id,
        }
    }

    /// Since when the connection has had no request in flight; `None`
    /// while it has one.
    pub(super) fn idle_since(&self) -> Option<Instant> {
        let state = self.registry.lock();
        let entry = state.connections.get(&self.id)?;
        (entry.in_flight == 0).then_some(entry.idle_since)
    }

    /// Completes once the connection has been told to close to make room.
    pub(super) async fn evicted(&self) {
        self.evict.notified().await;
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut state = self.registry.lock();
        let state = &mut *state;
        if let Some(entry) = state.connections.remove(&self.id) {
            if !entry.evicted {
                state.serving -= 1;
                state.idle.remove(&(entry.idle_since, self.id));
            }
        }
    }
}

/// Counts a connection's requests in flight; cloned into its service.
#[derive(Debug, Clone)]
pub(super) struct Tracker {
    registry: Arc<Registry>,
    id: u64,
}

impl Tracker {
    /// Marks a request in flight until the returned guard is dropped.
    pub(super) fn start(&self) -> InFlight {
        self.registry.request_started(self.id);
        InFlight {
            tracker: self.clone(),
        }
    }
}

/// A request in flight on a connection.
#[derive(Debug)]
pub(super) struct InFlight {
    tracker: Tracker,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.tracker.registry.request_ended(self.tracker.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(admission: Admission) -> Slot {
        match admission {
            Admission::Admitted(slot) | Admission::MadeRoom(slot) => slot,
            Admission::Full => panic!("no place"),
        }
    }

    #[tokio::test]
    async fn at_the_cap_the_oldest_idle_connection_makes_room() {
        let registry = Registry::new(2);
        let oldest = slot(registry.admit());
        let busy = slot(registry.admit());
        let request = busy.tracker().start();
        assert!(matches!(registry.admit(), Admission::MadeRoom(_)));
        // Told once, and no longer counted: the newcomer took its place.
        tokio::time::timeout(std::time::Duration::from_secs(1), oldest.evicted())
            .await
            .expect("the oldest idle connection is told to close");
        // The newcomer was dropped at once, leaving a place; the busy one is kept.
        let newest = slot(registry.admit());
        let held = newest.tracker().start();
        assert!(matches!(registry.admit(), Admission::Full));
        assert_eq!(busy.idle_since(), None);
        drop(request);
        assert!(busy.idle_since().is_some());
        assert!(matches!(registry.admit(), Admission::MadeRoom(_)));
        drop(held);
    }

    #[tokio::test]
    async fn a_request_that_outlives_its_connection_changes_nothing() {
        let registry = Registry::new(1);
        let connection = slot(registry.admit());
        let request = connection.tracker().start();
        drop(connection);
        drop(request);
        assert!(matches!(registry.admit(), Admission::Admitted(_)));
    }
}
