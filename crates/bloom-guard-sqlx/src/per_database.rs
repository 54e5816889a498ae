//! One task per database in a process, shared by every follower of that
//! database, running while any of them does: Postgres's notifier
//! candidate, the MySQL wake-up poller.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::lock::lock;

/// The tasks of one kind, by database, and the members each runs for.
pub(crate) struct PerDatabase<T> {
    entries: Mutex<BTreeMap<String, Entry<T>>>,
    next_id: AtomicU64,
}

struct Entry<T> {
    members: Vec<(u64, T)>,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

/// A member of a database's task; dropped, it leaves, and the last to
/// leave stops the task.
pub(crate) struct Membership<T: 'static> {
    registry: &'static PerDatabase<T>,
    database: String,
    id: u64,
}

/// A database as a key: its server, name and user.
pub(crate) fn database_key(host: &str, port: u16, database: &str, user: &str) -> String {
    format!("{host}:{port}/{database}?user={user}")
}

impl<T: Clone> PerDatabase<T> {
    pub(crate) const fn new() -> Self {
        Self {
            entries: Mutex::new(BTreeMap::new()),
            next_id: AtomicU64::new(0),
        }
    }

    /// Joins `database`'s task as `member`, first starting it with `start`
    /// (given the token that stops it) if none runs, or if the one that
    /// ran has ended (its runtime stopped).
    pub(crate) fn join(
        &'static self,
        database: String,
        member: T,
        start: impl FnOnce(CancellationToken) -> JoinHandle<()>,
    ) -> Membership<T> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut entries = lock(&self.entries);
        let running = entries
            .get(&database)
            .is_some_and(|entry| !entry.task.is_finished());
        if !running {
            let stop = CancellationToken::new();
            let task = start(stop.clone());
            let members = entries
                .remove(&database)
                .map(|entry| entry.members)
                .unwrap_or_default();
            entries.insert(
                database.clone(),
                Entry {
                    members,
                    stop,
                    task,
                },
            );
        }
        if let Some(entry) = entries.get_mut(&database) {
            entry.members.push((id, member));
        }
        Membership {
            registry: self,
            database,
            id,
        }
    }

    /// The members of `database`'s task now, earliest first.
    #[cfg_attr(not(any(feature = "mysql", test)), allow(dead_code))]
    pub(crate) fn members(&self, database: &str) -> Vec<T> {
        lock(&self.entries)
            .get(database)
            .map(|entry| {
                entry
                    .members
                    .iter()
                    .map(|(_, member)| member.clone())
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl<T: 'static> Drop for Membership<T> {
    fn drop(&mut self) {
        let mut entries = lock(&self.registry.entries);
        if let Some(entry) = entries.get_mut(&self.database) {
            entry.members.retain(|(id, _)| *id != self.id);
            if entry.members.is_empty() {
                entry.stop.cancel();
                entries.remove(&self.database);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static TASKS: PerDatabase<u32> = PerDatabase::new();

    #[tokio::test]
    async fn the_first_member_starts_the_task_and_the_last_stops_it() {
        let started = std::sync::Arc::new(AtomicU64::new(0));
        let start = |started: std::sync::Arc<AtomicU64>| {
            move |stop: CancellationToken| {
                started.fetch_add(1, Ordering::Relaxed);
                tokio::spawn(async move { stop.cancelled().await })
            }
        };
        let a = TASKS.join("db".to_owned(), 1, start(started.clone()));
        let b = TASKS.join("db".to_owned(), 2, start(started.clone()));
        let other = TASKS.join("other".to_owned(), 3, start(started.clone()));
        assert_eq!(started.load(Ordering::Relaxed), 2, "one task per database");
        assert_eq!(TASKS.members("db"), [1, 2]);
        drop(a);
        assert_eq!(TASKS.members("db"), [2]);
        let stop = lock(&TASKS.entries)
            .get("db")
            .map(|entry| entry.stop.clone())
            .expect("running");
        drop(b);
        assert!(
            stop.is_cancelled(),
            "the last member left and the task runs on"
        );
        assert!(TASKS.members("db").is_empty());
        drop(other);
        let _again = TASKS.join("db".to_owned(), 4, start(started.clone()));
        assert_eq!(
            started.load(Ordering::Relaxed),
            3,
            "a new member starts a new task"
        );
    }
}
