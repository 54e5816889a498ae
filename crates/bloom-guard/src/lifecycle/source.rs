//! Where the guard's keys come from: the `KeySource` trait and key batches.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;

use futures_util::stream::{self, BoxStream, StreamExt};

use crate::keys::batch::KeyBatch;

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
/// use bloom_guard::{keys::KeyBatch, KeySource};
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
