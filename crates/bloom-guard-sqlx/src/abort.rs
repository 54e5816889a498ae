//! Tasks that end with their owner.

use tokio::task::JoinHandle;

/// Aborts a task when dropped, so a dropped follower leaves nothing running.
pub(crate) struct AbortOnDrop(pub(crate) JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
