//! What a change feed read brings, and what a follower does with it: the
//! same for Postgres and SQLite.

use std::sync::Arc;

use bloom_guard::{keys::KeyBatch, BloomGuard};

pub(crate) type KeyHook = Arc<dyn Fn(&str) + Send + Sync>;
pub(crate) type CatchUpHook = Arc<dyn Fn() + Send + Sync>;

/// Changed keys handed to `on_key` one by one per read; more go to
/// `on_catch_up`.
const MAX_KEY_HOOKS: usize = 10_000;

/// The rows of a feed read, by kind.
#[derive(Debug, Default)]
pub(crate) struct Changes {
    /// New keys (and a count of the ones no request can name).
    pub(crate) added: KeyBatch,
    /// Keys deleted or changed away, once per row (and a count of the
    /// ones no request can name).
    pub(crate) removed: KeyBatch,
    /// A table was truncated.
    pub(crate) truncated: bool,
    /// Keys may have been written without the feed (the triggers were just
    /// installed): only a rebuild has them.
    pub(crate) resync: bool,
    /// Rows read.
    pub(crate) rows: u64,
    /// Where the feed is written after the commit (the log feed): its
    /// commit-to-feed lag as of the read.
    pub(crate) lag: Option<std::time::Duration>,
}

impl Changes {
    /// Adds a feed row: its kind (`i`, `d`, `t`, `r`) and its key's bytes,
    /// `None` for a key no request can name (a SQLite BLOB).
    pub(crate) fn record(&mut self, kind: &str, key: Option<&[u8]>) {
        self.record_with(kind, key, KeyBatch::push_text);
    }

    /// As [`record`](Self::record), for a key the database weighed
    /// ([`Collation::weighed`](bloom_guard::keys::Collation::weighed)): bytes, not
    /// text.
    #[cfg(feature = "mysql")]
    pub(crate) fn record_weighed(&mut self, kind: &str, key: Option<&[u8]>) {
        self.record_with(kind, key, KeyBatch::push);
    }

    fn record_with(&mut self, kind: &str, key: Option<&[u8]>, push: fn(&mut KeyBatch, &[u8])) {
        self.rows += 1;
        match (kind, key) {
            ("i", Some(key)) => push(&mut self.added, key),
            ("i", None) => self.added.skip(),
            ("d", Some(key)) => push(&mut self.removed, key),
            ("d", None) => self.removed.skip(),
            ("t", _) => self.truncated = true,
            ("r", _) => self.resync = true,
            (other, _) => tracing::debug!(kind = other, "ignored a change of an unknown kind"),
        }
    }
}

/// The hooks a follower calls with what it read.
#[derive(Clone, Default)]
pub(crate) struct Hooks {
    pub(crate) on_key: Option<KeyHook>,
    pub(crate) on_catch_up: Option<CatchUpHook>,
}

impl Hooks {
    /// Applies a read from position `from` to `reached` to the filter in
    /// use and tells the hooks.
    pub(crate) fn apply(
        &self,
        guard: &BloomGuard,
        feed: &str,
        changes: &Changes,
        positions: (&str, &str),
    ) {
        Self::put(guard, feed, changes, positions);
        self.tell(changes);
    }

    /// [`apply`](Self::apply) without telling the hooks: the keys in the
    /// filter in use.
    pub(crate) fn put(
        guard: &BloomGuard,
        feed: &str,
        changes: &Changes,
        (from, reached): (&str, &str),
    ) {
        warn_skipped(feed, changes);
        guard.feed().apply(
            &changes.added,
            &changes.removed,
            Some(&bloom_guard::feed::Position::from(from)),
            Some(&bloom_guard::feed::Position::from(reached)),
        );
    }

    /// Tells the hooks what a read brought: each changed key, or one
    /// catch-up for a bulk change or a truncation.
    pub(crate) fn tell(&self, changes: &Changes) {
        let added = &changes.added;
        // A bulk change is one "drop everything", not a call per key.
        let one_by_one = added.len() + changes.removed.len() <= MAX_KEY_HOOKS;
        if let (Some(hook), true) = (&self.on_key, one_by_one) {
            for key in added.iter().chain(changes.removed.iter()) {
                if let Ok(key) = std::str::from_utf8(key.as_bytes()) {
                    hook(key);
                }
            }
        }
        if changes.truncated || !one_by_one {
            self.catch_up();
        }
    }

    pub(crate) fn catch_up(&self) {
        if let Some(hook) = &self.on_catch_up {
            hook();
        }
    }
}

/// Warns of stored keys no request can name, left out.
pub(crate) fn warn_skipped(feed: &str, changes: &Changes) {
    let skipped = changes.added.skipped();
    if skipped > 0 {
        tracing::warn!(
            feed,
            skipped,
            "keys that are not UTF-8 text were left out: no request can name them"
        );
    }
}
