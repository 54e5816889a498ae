//! Producing key batches on a task of their own.

use bloom_guard::keys::KeyBatch;
use futures_util::stream::{BoxStream, StreamExt};
use std::future::Future;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::error::SourceError;

/// Keys per batch: large enough to amortise channel hand-offs, small enough
/// to keep memory flat (a few hundred KiB per batch for typical keys).
const BATCH_KEYS: usize = 8192;

/// Batches in flight between the scanning task and the filter.
const BATCHES_IN_FLIGHT: usize = 4;

/// Where a scan sends its batches.
pub(crate) struct BatchSender {
    tx: mpsc::Sender<Result<KeyBatch, SourceError>>,
}

impl BatchSender {
    /// A batch to fill.
    pub(crate) fn new_batch() -> KeyBatch {
        KeyBatch::with_capacity(BATCH_KEYS, BATCH_KEYS * 32)
    }

    /// Sends `batch` once it is full, leaving an empty one in its place;
    /// `false` when nobody is listening any more.
    pub(crate) async fn send_if_full(&self, batch: &mut KeyBatch) -> bool {
        if batch.len() < BATCH_KEYS {
            return true;
        }
        let bytes = batch.byte_len();
        let full = std::mem::replace(batch, KeyBatch::with_capacity(BATCH_KEYS, bytes));
        self.tx.send(Ok(full)).await.is_ok()
    }

    /// Sends the last batch; an empty one too if it is the first and
    /// carries the scan's feed position.
    pub(crate) async fn finish(self, batch: KeyBatch) {
        if !batch.is_empty() || batch.position().is_some() {
            let _ = self.tx.send(Ok(batch)).await;
        }
    }
}

/// Runs `scan` on a task of its own, so reading and decoding overlap with
/// inserting into the filter, and streams what it sends. At most a few
/// batches wait in between, so memory stays bounded.
pub(crate) fn spawn_scan<F, Fut>(scan: F) -> BoxStream<'static, Result<KeyBatch, SourceError>>
where
    F: FnOnce(BatchSender) -> Fut,
    Fut: Future<Output = Result<(), SourceError>> + Send + 'static,
{
    let (tx, rx) = mpsc::channel(BATCHES_IN_FLIGHT);
    let done = tx.clone();
    let scan = scan(BatchSender { tx });
    let task = tokio::spawn(async move {
        if let Err(error) = scan.await {
            let _ = done.send(Err(error)).await;
        }
    });
    let finished = futures_util::stream::once(async move {
        match task.await {
            Ok(()) => None,
            Err(_) => Some(Err(SourceError::Interrupted)),
        }
    })
    .filter_map(std::future::ready);
    ReceiverStream::new(rx).chain(finished).boxed()
}
