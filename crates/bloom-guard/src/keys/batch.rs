//! A batch of keys in one buffer: what a key source yields, what the feed
//! hands the guard, and what a filter inserts in one pass.

use crate::keys::key::Key;

/// Keys packed into one buffer: one allocation per batch, not per key.
///
/// # Example
///
/// ```
/// use bloom_guard::keys::{Key, KeyBatch};
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
    position: Option<String>,
}

impl KeyBatch {
    /// An empty batch with room for `keys` keys of `bytes` bytes in all.
    pub fn with_capacity(keys: usize, bytes: usize) -> Self {
        Self {
            bytes: Vec::with_capacity(bytes),
            ends: Vec::with_capacity(keys),
            skipped: 0,
            position: None,
        }
    }

    /// Tags the batch with the change feed's position of the snapshot it
    /// was read from: every change committed before it is in the keys, none
    /// after. A [`KeySource`](crate::KeySource) over a database with a
    /// change feed tags its first batch, so that a filter that removes keys
    /// knows which of the feed's changes its scan already holds (a delete
    /// is then applied exactly once, never to a key the scan did not see).
    ///
    /// ```
    /// use bloom_guard::keys::KeyBatch;
    ///
    /// let mut first: KeyBatch = ["a", "b"].into_iter().collect();
    /// first.set_position("42");
    /// assert_eq!(first.position(), Some("42"));
    /// ```
    pub fn set_position(&mut self, position: impl Into<String>) {
        self.position = Some(position.into());
    }

    /// The feed position the batch was tagged with, if any.
    pub fn position(&self) -> Option<&str> {
        self.position.as_deref()
    }

    /// Appends a key.
    pub fn push(&mut self, key: &[u8]) {
        self.bytes.extend_from_slice(key);
        self.ends.push(self.bytes.len());
    }

    /// Adds a stored text key, or counts it as skipped if it is not valid
    /// UTF-8: requests carry text, so no request can name such a key, and
    /// the guard passes a request whose key does not decode to UTF-8. (A
    /// key the database weighed, [`Collation::weighed`](crate::keys::Collation::weighed),
    /// is no text: [`push`](Self::push) it.)
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
