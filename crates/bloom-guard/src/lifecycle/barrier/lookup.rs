//! Would-be refusals confirmed by looking their keys up in the watched
//! table itself, instead of waiting for a feed read.
//!
//! A feed whose exact read waits for a producer (a log feed, whose
//! producer writes the log's changes to the feed a batch at a time) makes
//! every refusal wait for that producer's write while writers keep the log
//! moving. A follower that can look keys up in the table registers a
//! [`KeyLookup`]; the guard's would-be refusals then wait for one statement
//! that begins after they arrived and reads the table: a key it does not
//! find did not exist as of the request, whatever the feed has carried.
//! Refusals waiting at one moment share one statement.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use parking_lot::Mutex;
use tokio::sync::oneshot;

use crate::keys::batch::KeyBatch;
use crate::keys::key_type::KeyType;

/// The pause after a failed lookup before the next try.
const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// The most keys one lookup is asked about (a backend may split them
/// into several statements).
const MAX_KEYS: usize = 1024;

/// A key a would-be refusal asks a [`KeyLookup`] about.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LookupKey {
    canonical: Box<[u8]>,
    spelling: Option<Box<[u8]>>,
}

impl LookupKey {
    /// A key in canonical form under the guard's key type; `spelling`, the
    /// request's own spelling, where the canonical form is not text the
    /// table compares (a collation's weights).
    pub fn new(canonical: impl Into<Box<[u8]>>, spelling: Option<Box<[u8]>>) -> Self {
        Self {
            canonical: canonical.into(),
            spelling,
        }
    }

    /// The key in canonical form under the guard's key type: what the
    /// filter looks up, and what a row's key must come to for the row to
    /// be this key's.
    pub fn canonical(&self) -> &[u8] {
        &self.canonical
    }

    /// The text to look the key up by in the table: the request's own
    /// spelling under a [`KeyType::Collated`](crate::KeyType::Collated)
    /// guard (whose canonical form is the collation's weights), else the
    /// canonical form. A column that compares keys exactly as the key type
    /// does finds every row of the key by either; a lookup over a column
    /// that compares otherwise (a key type looser than its column) may
    /// miss rows, and must not be made.
    pub fn text(&self) -> &[u8] {
        self.spelling.as_deref().unwrap_or(&self.canonical)
    }
}

/// A lookup failed: the database did not answer, or refused the statement.
#[derive(Debug, thiserror::Error)]
#[error("looking keys up in the watched table failed: {0}")]
pub struct LookupError(#[source] Box<dyn std::error::Error + Send + Sync>);

impl LookupError {
    /// The failure `source`.
    pub fn new(source: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        Self(source.into())
    }
}

/// Looks keys up in the watched table: the rows it holds of them, as of
/// a statement that begins after the call.
///
/// Registered with [`FeedReader::look_up_with`](crate::feed::FeedReader::look_up_with)
/// by a follower whose feed reads cost more than a look at the table (a
/// log feed's wait for its producer). Once every follower of a guard has
/// one, its would-be refusals wait for a lookup instead of a feed read: a
/// key no row came back for is refused; any other goes on to the handler.
///
/// The rows come back as the follower's [`KeySource`](crate::KeySource)
/// gives them (their keys as stored, or weighed under a collation), and
/// the guard puts them in canonical form as it does a scan's: a row stands
/// for the key whose canonical form it comes to. A row that comes to none
/// of the keys asked about, or a key the batch
/// [skipped](KeyBatch::skip), sends every key of the statement on, as does
/// an error: the statement's answer is trusted only where it is plain. What
/// it cannot catch is a row the statement did not return: the statement
/// must find every row whose key the guard's key type calls equal to the
/// key asked (a column that compares keys as the key type does), and must
/// see every row committed before it began.
///
/// # Example
///
/// A table in memory.
///
/// ```
/// use std::collections::HashSet;
/// use std::sync::{Arc, Mutex};
/// use bloom_guard::{BloomGuard, feed::{KeyLookup, LookupError, LookupKey}, keys::KeyBatch};
/// use futures_util::future::BoxFuture;
///
/// struct Table(Arc<Mutex<HashSet<Vec<u8>>>>);
///
/// impl KeyLookup for Table {
///     fn find<'a>(&'a self, keys: &'a [LookupKey]) -> BoxFuture<'a, Result<KeyBatch, LookupError>> {
///         Box::pin(async move {
///             let rows = self.0.lock().map_err(|_| LookupError::new("poisoned"))?;
///             let mut found = KeyBatch::default();
///             for key in keys.iter().filter(|key| rows.contains(key.text())) {
///                 found.push(key.text());
///             }
///             Ok(found)
///         })
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let table = Arc::new(Mutex::new(HashSet::new()));
/// let guard = BloomGuard::builder().build();
/// let reader = guard.feed().reader();
/// reader.look_up_with(Table(Arc::clone(&table)));
/// // A row committed after the filter was built, not yet in the feed: the
/// // lookup finds it, and its request goes on.
/// table.lock().unwrap().insert(b"late".to_vec());
/// # }
/// ```
pub trait KeyLookup: Send + Sync + 'static {
    /// The keys of the rows the table holds of `keys`, read by statements
    /// (one, or one per chunk of them) that each begin after this call.
    fn find<'a>(&'a self, keys: &'a [LookupKey]) -> BoxFuture<'a, Result<KeyBatch, LookupError>>;
}

impl<L: KeyLookup + ?Sized> KeyLookup for Box<L> {
    fn find<'a>(&'a self, keys: &'a [LookupKey]) -> BoxFuture<'a, Result<KeyBatch, LookupError>> {
        (**self).find(keys)
    }
}

/// The distinct keys of `asked` (a flood repeats keys), and for each key
/// asked, its index among them. Keys are the same only if both their
/// canonical form and their spelling are: two spellings of one canonical
/// form are each looked up, so a server that equates otherwise than the
/// guard's weights returns a row that names no key asked, never hides one.
fn distinct(asked: impl Iterator<Item = LookupKey>) -> (Vec<LookupKey>, Vec<usize>) {
    let mut index: HashMap<LookupKey, usize> = HashMap::new();
    let mut keys = Vec::new();
    let which = asked
        .map(|key| {
            *index.entry(key.clone()).or_insert_with(|| {
                keys.push(key);
                keys.len() - 1
            })
        })
        .collect();
    (keys, which)
}

/// Which of `keys` the rows `found` stand for, under `key_type`: `None`
/// when a row stands for none of them, or a key was skipped.
fn attribute(key_type: KeyType, keys: &[LookupKey], found: &KeyBatch) -> Option<Vec<bool>> {
    if found.skipped() > 0 {
        return None;
    }
    let mut present = vec![false; keys.len()];
    for row in found.iter() {
        let row = key_type.canonical_or_same(row);
        let mut named = false;
        for (key, present) in keys.iter().zip(present.iter_mut()) {
            if key.canonical() == row.as_bytes() {
                *present = true;
                named = true;
            }
        }
        if !named {
            return None;
        }
    }
    Some(present)
}

/// One follower's lookup, and the keys waiting for its next statement.
pub(crate) struct Lookups {
    lookup: Box<dyn KeyLookup>,
    key_type: KeyType,
    /// How long a statement may take: its waiters go on at the same bound.
    bound: Duration,
    queue: Mutex<Queue>,
}

impl std::fmt::Debug for Lookups {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lookups").finish_non_exhaustive()
    }
}

#[derive(Default)]
struct Queue {
    /// Each key, and where its answer goes.
    waiting: Vec<(LookupKey, oneshot::Sender<bool>)>,
    /// A task takes the queue's keys to statements.
    running: bool,
    /// The last statement failed (logged once, when it began failing).
    failing: bool,
}

impl Lookups {
    pub(crate) fn new(lookup: Box<dyn KeyLookup>, key_type: KeyType, bound: Duration) -> Self {
        Self {
            lookup,
            key_type,
            bound,
            queue: Mutex::default(),
        }
    }

    /// Queues `key` for the next statement: the answer, `true` if the
    /// table holds it (or it could not be looked up), and whether the last
    /// statement failed. A dropped sender (the task gone with its runtime)
    /// counts as `true` at the receiver.
    pub(crate) fn ask(self: &Arc<Self>, key: LookupKey) -> (oneshot::Receiver<bool>, bool) {
        let (answer, receiver) = oneshot::channel();
        let (start, failing) = {
            let mut queue = self.queue.lock();
            queue.waiting.push((key, answer));
            (!std::mem::replace(&mut queue.running, true), queue.failing)
        };
        if start {
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => {
                    runtime.spawn(Arc::clone(self).run());
                }
                Err(_) => {
                    // No runtime to look up on: every key queued goes on.
                    let mut queue = self.queue.lock();
                    queue.running = false;
                    queue.waiting.clear();
                }
            }
        }
        (receiver, failing)
    }

    /// Takes the queued keys to statements, one at a time, until none
    /// waits: the keys that came while one ran share the next.
    async fn run(self: Arc<Self>) {
        /// Hands the queue back if the task is dropped (its runtime
        /// stopped): the next ask starts another.
        struct Running<'a>(Option<&'a Mutex<Queue>>);
        impl Drop for Running<'_> {
            fn drop(&mut self) {
                if let Some(queue) = self.0 {
                    queue.lock().running = false;
                }
            }
        }
        let mut running = Running(Some(&self.queue));
        loop {
            let (keys, asked, answers) = {
                let mut queue = self.queue.lock();
                // Waiters that went on (the bound, their client gone) need
                // no statement; while lookups fail, refusals go on at once,
                // and one of their keys makes the next try.
                let (failing, mut trying) = (queue.failing, false);
                queue.waiting.retain(|(_, answer)| {
                    let keep = !answer.is_closed() || (failing && !trying);
                    trying |= keep && answer.is_closed();
                    keep
                });
                if queue.waiting.is_empty() {
                    // Handed back under the lock: an ask after it starts
                    // another task.
                    queue.running = false;
                    running.0 = None;
                    return;
                }
                let take = queue.waiting.len().min(MAX_KEYS);
                let (keys, answers): (Vec<_>, Vec<_>) = queue.waiting.drain(..take).unzip();
                let (keys, asked) = distinct(keys.into_iter());
                (keys, asked, answers)
            };
            let found = tokio::time::timeout(self.bound, self.lookup.find(&keys)).await;
            let found = match found {
                Ok(Ok(found)) => {
                    self.queue.lock().failing = false;
                    attribute(self.key_type, &keys, &found).unwrap_or_else(|| {
                        tracing::debug!(
                            keys = keys.len(),
                            "a key lookup found rows it could not name; its keys go on to the handler"
                        );
                        vec![true; keys.len()]
                    })
                }
                failed => {
                    let first = !std::mem::replace(&mut self.queue.lock().failing, true);
                    if first {
                        let error = match failed {
                            Ok(Err(error)) => error.to_string(),
                            _ => format!("no answer within {:?}", self.bound),
                        };
                        tracing::warn!(%error, "would-be refusals go on to the handler until a key lookup succeeds again");
                    }
                    vec![true; keys.len()]
                }
            };
            for (answer, key) in answers.into_iter().zip(asked) {
                let _ = answer.send(found.get(key).copied().unwrap_or(true));
            }
            if self.queue.lock().failing {
                // Refusals go on at once meanwhile: the next try can wait.
                tokio::time::sleep(RETRY_PAUSE.min(self.bound)).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(canonical: &[&str]) -> Vec<LookupKey> {
        canonical
            .iter()
            .map(|key| LookupKey::new(key.as_bytes(), None))
            .collect()
    }

    fn rows(stored: &[&str]) -> KeyBatch {
        stored.iter().collect()
    }

    #[test]
    fn a_row_stands_for_the_key_it_comes_to_in_canonical_form() {
        let asked = keys(&["apple", "pear", "7"]);
        assert_eq!(
            attribute(KeyType::CaseInsensitiveText, &asked, &rows(&["APPLE"])),
            Some(vec![true, false, false])
        );
        assert_eq!(
            attribute(KeyType::Integer, &asked, &rows(&["007"])),
            Some(vec![false, false, true])
        );
        assert_eq!(
            attribute(KeyType::Text, &asked, &rows(&[])),
            Some(vec![false; 3])
        );
    }

    #[test]
    fn a_row_that_names_no_key_asked_about_sends_every_key_on() {
        let asked = keys(&["apple", "pear"]);
        // `Text` is stricter than a column that found "APPLE" for "apple":
        // the statement's answer is not plain, so nothing is refused.
        assert_eq!(attribute(KeyType::Text, &asked, &rows(&["APPLE"])), None);
        let mut skipped = rows(&["apple"]);
        skipped.skip();
        assert_eq!(attribute(KeyType::Text, &asked, &skipped), None);
    }

    #[test]
    fn a_key_asked_twice_is_looked_up_once() {
        let (distinct, which) = distinct(keys(&["a", "b", "a", "c", "b"]).into_iter());
        assert_eq!(distinct, keys(&["a", "b", "c"]));
        assert_eq!(which, [0, 1, 0, 2, 1]);
        // One canonical form, two spellings: each looked up.
        let spelt =
            |spelling: &str| LookupKey::new(b"w".as_slice(), Some(spelling.as_bytes().into()));
        let (spellings, which) = super::distinct([spelt("a"), spelt("A"), spelt("a")].into_iter());
        assert_eq!(spellings.len(), 2);
        assert_eq!(which, [0, 1, 0]);
    }

    #[test]
    fn a_lookup_key_is_looked_up_by_its_spelling_where_it_has_one() {
        let plain = LookupKey::new(b"abc".as_slice(), None);
        assert_eq!(plain.text(), b"abc");
        let weighed = LookupKey::new(b"\x00A".as_slice(), Some(b"\xc3\xa0bc".as_slice().into()));
        assert_eq!(
            (weighed.canonical(), weighed.text()),
            (&b"\x00A"[..], &b"\xc3\xa0bc"[..])
        );
    }
}
