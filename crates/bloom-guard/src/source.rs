//! Where the guard's keys come from: the `KeySource` trait and key batches.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;

use futures_util::stream::{self, BoxStream, StreamExt};

use crate::key::Key;

/// Every key of a database, as an async stream of batches.
///
/// The guard calls [`count_hint`](Self::count_hint) to size a new filter,
/// then scans [`keys`](Self::keys) once into it. Batches keep memory bounded
/// (a source should hold a few batches at most) and avoid one allocation per
/// key. `bloom-guard-sqlx` implements this for Postgres (`COPY`) and for any
/// sqlx query.
///
/// The stream's snapshot must be taken when it is first polled, not when
/// `keys` is called: the guard registers the new filter for write-through
/// inserts between the two, which is what makes a scan under concurrent
/// writes lose nothing.
///
/// # Example
///
/// ```
/// use bloom_guard::{KeyBatch, KeySource};
/// use futures_util::stream::{self, BoxStream, StreamExt};
///
/// /// Keys `0..n` as decimal strings.
/// struct Numbers(u64);
///
/// impl KeySource for Numbers {
///     type Error = std::convert::Infallible;
///
///     async fn count_hint(&self) -> Result<Option<u64>, Self::Error> {
///         Ok(Some(self.0))
///     }
///
///     fn keys(&self) -> BoxStream<'static, Result<KeyBatch, Self::Error>> {
///         let batch: KeyBatch = (0..self.0).map(|i| i.to_string()).collect();
///         stream::iter([Ok(batch)]).boxed()
///     }
/// }
/// ```
pub trait KeySource: Send + Sync + 'static {
    /// The error of a failed count or scan.
    type Error: std::error::Error + Send + Sync + 'static;

    /// About how many keys [`keys`](Self::keys) will yield, if known cheaply.
    /// An estimate is fine: the guard sizes with headroom and takes the larger
    /// of this and the configured expected items.
    fn count_hint(&self) -> impl Future<Output = Result<Option<u64>, Self::Error>> + Send;

    /// Every key, in batches.
    fn keys(&self) -> BoxStream<'static, Result<KeyBatch, Self::Error>>;
}

/// Keys packed into one buffer: one allocation per batch, not per key.
///
/// # Example
///
/// ```
/// use bloom_guard::{Key, KeyBatch};
///
/// let mut batch = KeyBatch::default();
/// batch.push(b"a");
/// batch.push("b\tc".as_bytes());
/// assert_eq!(batch.len(), 2);
/// assert_eq!(batch.iter().nth(1), Some(Key::from("b\tc")));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyBatch {
    bytes: Vec<u8>,
    ends: Vec<usize>,
    skipped: u64,
}

impl KeyBatch {
    /// An empty batch with room for `keys` keys of `bytes` bytes in all.
    pub fn with_capacity(keys: usize, bytes: usize) -> Self {
        Self {
            bytes: Vec::with_capacity(bytes),
            ends: Vec::with_capacity(keys),
            skipped: 0,
        }
    }

    /// Appends a key.
    pub fn push(&mut self, key: &[u8]) {
        self.bytes.extend_from_slice(key);
        self.ends.push(self.bytes.len());
    }

    /// Adds a stored text key, or counts it as skipped if it is not valid
    /// UTF-8: requests carry text, so no request can name such a key, and
    /// the guard passes a request whose key does not decode to UTF-8.
    pub fn push_text(&mut self, key: &[u8]) {
        if std::str::from_utf8(key).is_ok() {
            self.push(key);
        } else {
            self.skip();
        }
    }

    /// Counts a stored key that no request can name (see
    /// [`Stats::skipped_keys`](crate::Stats::skipped_keys)).
    pub fn skip(&mut self) {
        self.skipped += 1;
    }

    /// Keys counted by [`skip`](Self::skip).
    pub fn skipped(&self) -> u64 {
        self.skipped
    }

    /// Appends a key whose bytes were already written with
    /// [`extend_current`](Self::extend_current).
    pub fn finish_key(&mut self) {
        self.ends.push(self.bytes.len());
    }

    /// As [`finish_key`](Self::finish_key) for a text key: one that is not
    /// valid UTF-8 is dropped and counted as [skipped](Self::skip).
    pub fn finish_text_key(&mut self) {
        let start = self.ends.last().copied().unwrap_or(0);
        if std::str::from_utf8(&self.bytes[start..]).is_ok() {
            self.finish_key();
        } else {
            self.discard_current();
            self.skip();
        }
    }

    /// Appends bytes to the key being built; [`finish_key`](Self::finish_key)
    /// ends it. Lets a decoder write straight into the batch.
    pub fn extend_current(&mut self, bytes: &[u8]) {
        self.bytes.extend_from_slice(bytes);
    }

    /// Drops the bytes of the key being built, keeping the finished keys.
    pub fn discard_current(&mut self) {
        let end = self.ends.last().copied().unwrap_or(0);
        self.bytes.truncate(end);
    }

    /// The number of keys.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// Whether the batch holds no key.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// The total size of the keys, in bytes.
    pub fn byte_len(&self) -> usize {
        self.bytes.len()
    }

    /// The keys, in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = Key<'_>> + '_ {
        (0..self.ends.len()).map(move |i| {
            let start = if i == 0 { 0 } else { self.ends[i - 1] };
            Key::from(&self.bytes[start..self.ends[i]])
        })
    }
}

impl<K: AsRef<[u8]>> FromIterator<K> for KeyBatch {
    fn from_iter<I: IntoIterator<Item = K>>(iter: I) -> Self {
        let mut batch = KeyBatch::default();
        for key in iter {
            batch.push(key.as_ref());
        }
        batch
    }
}

/// A fixed list of keys held in memory: for tests, and for data sets small
/// enough to ship with the program.
///
/// # Example
///
/// ```
/// use bloom_guard::{BloomGuard, KeyList};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let guard = BloomGuard::builder().build();
/// guard.clone().warm(KeyList::new(["alice", "bob"])).await;
/// assert!(guard.may_contain("alice"));
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct KeyList {
    keys: Arc<KeyBatch>,
}

impl KeyList {
    /// A source yielding `keys`.
    pub fn new<K: AsRef<[u8]>>(keys: impl IntoIterator<Item = K>) -> Self {
        Self {
            keys: Arc::new(keys.into_iter().collect()),
        }
    }
}

impl KeySource for KeyList {
    type Error = Infallible;

    async fn count_hint(&self) -> Result<Option<u64>, Infallible> {
        Ok(Some(self.keys.len() as u64))
    }

    fn keys(&self) -> BoxStream<'static, Result<KeyBatch, Infallible>> {
        stream::iter([Ok(KeyBatch::clone(&self.keys))]).boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_keeps_keys_apart() {
        let mut batch: KeyBatch = ["", "a", "bc"].into_iter().collect();
        batch.extend_current(b"d");
        batch.extend_current(b"e");
        batch.finish_key();
        batch.extend_current(b"partial");
        batch.discard_current();
        let keys: Vec<_> = batch.iter().map(|k| k.as_bytes().to_vec()).collect();
        assert_eq!(keys, [&b""[..], b"a", b"bc", b"de"]);
        assert_eq!(batch.byte_len(), 5);
    }
}
