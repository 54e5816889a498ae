//! A connection kept open between uses: the feed reads' own, so a read
//! (the read barrier's included) is one statement and one round trip,
//! with no pool's ping before or after it.

use std::time::Duration;

use sqlx::{AssertSqlSafe, Connection, Executor};
use tokio::sync::{Mutex, MutexGuard};

/// How long a use of a kept connection may take before the connection is
/// given up: a half-open connection (a failover) fails the read instead of
/// holding the follower.
pub(crate) const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Runs `read` on a kept connection, failing it after [`READ_TIMEOUT`].
pub(crate) async fn within_timeout<T>(
    read: impl std::future::Future<Output = Result<T, sqlx::Error>>,
) -> Result<T, sqlx::Error> {
    tokio::time::timeout(READ_TIMEOUT, read)
        .await
        .map_err(|_| {
            sqlx::Error::Io(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("a change feed read took longer than {READ_TIMEOUT:?}"),
            ))
        })?
}

/// One connection, connected on first use and again after a use that
/// failed or was cancelled.
#[derive(Debug)]
pub(crate) struct KeptConnection<C: Connection> {
    options: C::Options,
    /// Run once on every new connection (session settings a startup
    /// parameter cannot carry).
    setup: Option<&'static str>,
    connection: Mutex<Option<C>>,
}

/// The kept connection, lent for one use: [`keep`](Self::keep) it after a
/// use that succeeded; dropped otherwise, it is closed, and the next use
/// connects again.
pub(crate) struct Lease<'a, C> {
    slot: MutexGuard<'a, Option<C>>,
    connection: C,
}

impl<C> KeptConnection<C>
where
    C: Connection,
    for<'c> &'c mut C: Executor<'c, Database = C::Database>,
{
    pub(crate) fn new(options: C::Options, setup: Option<&'static str>) -> Self {
        Self {
            options,
            setup,
            connection: Mutex::new(None),
        }
    }

    /// The connection, connecting first if none is kept.
    pub(crate) async fn lease(&self) -> Result<Lease<'_, C>, sqlx::Error> {
        let mut slot = self.connection.lock().await;
        let connection = match slot.take() {
            Some(connection) => connection,
            None => {
                let mut connection = C::connect_with(&self.options).await?;
                if let Some(setup) = self.setup {
                    connection.execute(AssertSqlSafe(setup)).await?;
                }
                connection
            }
        };
        Ok(Lease { slot, connection })
    }

    /// Closes the kept connection cleanly.
    pub(crate) async fn close(&self) {
        if let Some(connection) = self.connection.lock().await.take() {
            let _ = connection.close().await;
        }
    }
}

impl<C> Lease<'_, C> {
    pub(crate) fn connection(&mut self) -> &mut C {
        &mut self.connection
    }

    /// Keeps the connection for the next use.
    pub(crate) fn keep(mut self) {
        *self.slot = Some(self.connection);
    }
}
