//! A fleet-wide lock held by a database session of its own (a Postgres
//! advisory lock, a MySQL `GET_LOCK`): the server releases it when the
//! session ends, so a crashed holder never keeps it.

use sqlx::Connection;

/// A lock taken on `connection`; dropped, it closes the connection, which
/// releases the lock.
pub(crate) struct SessionLock<C: Connection + 'static> {
    connection: Option<C>,
}

impl<C: Connection + 'static> SessionLock<C> {
    /// Holds the lock `connection` took.
    pub(crate) fn new(connection: C) -> Self {
        Self {
            connection: Some(connection),
        }
    }
}

impl<C: Connection + 'static> std::fmt::Debug for SessionLock<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionLock").finish_non_exhaustive()
    }
}

impl<C: Connection + 'static> Drop for SessionLock<C> {
    fn drop(&mut self) {
        let Some(connection) = self.connection.take() else {
            return;
        };
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = connection.close().await;
            });
        }
    }
}
