//! What the follower knows about the feed's exactness, and the holds it
//! keeps while the filter may lack a key: rows not counted, keys the key
//! type cannot make exact, writes the feed could not record.

use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};

use bloom_guard::keys::KeyBatch;
use bloom_guard::FailOpen;
use tokio::sync::Notify;

/// The feed's exactness and the holds that follow from it; owned by the
/// engine, changed by its reads (`reader.rs`) and its maintenance
/// (`maintain.rs`).
#[derive(Debug, Default)]
pub(crate) struct Holds {
    /// Whether the feed's triggers count rows as a counting filter needs:
    /// until a check says so, deletes are not passed on (the filter keeps
    /// their keys, harmless false positives).
    pub(crate) counts_rows: AtomicBool,
    /// An empty batch, passed for the deletes while `counts_rows` is false.
    pub(crate) no_keys: KeyBatch,
    /// Whether the warning about old trigger functions was logged.
    pub(crate) warned_counts: AtomicBool,
    /// Set at start when the key type is exact only for ASCII keys; the
    /// hold once a stored key is not.
    pub(crate) ascii_only: AtomicBool,
    pub(crate) unsafe_key: Mutex<Option<FailOpen>>,
    /// Held from the read that found writes the feed could not record (its
    /// triggers installed again, a key column gone) until a rebuild has
    /// them.
    pub(crate) unrecorded: Mutex<Option<FailOpen>>,
}

/// The rebuilds the follower owes: asked by a read, run by the maintenance.
#[derive(Debug, Default)]
pub(crate) struct Rebuilds {
    /// Wakes the maintenance for a rebuild: a read found the feed's
    /// triggers (re)installed.
    pub(crate) resync: Arc<Notify>,
    /// Resyncs read so far: a rebuild releases `unrecorded` only if none
    /// came while it ran.
    pub(crate) resyncs: AtomicU64,
    /// A rebuild on this instance is due: a table was truncated, or the
    /// triggers count rows again after a spell when they did not.
    pub(crate) here: AtomicBool,
    /// Wakes the maintenance for a rebuild now.
    pub(crate) soon: Notify,
}
