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

/// Runs `attempt`, and once more if it failed on a connection the server
/// had closed (a terminated backend, a restart, a failover, a dropped
/// socket): a kept connection is only found dead when used, and a read
/// that fails on one would let the refusals waiting for it through. The
/// second attempt connects afresh (the failed lease closed the dead
/// connection); a read that times out is not tried again.
pub(crate) async fn again_if_lost<T, F>(mut attempt: impl FnMut() -> F) -> Result<T, sqlx::Error>
where
    F: std::future::Future<Output = Result<T, sqlx::Error>>,
{
    match attempt().await {
        Err(error) if lost_connection(&error) => {
            tracing::debug!(%error, "the change feed's connection was lost; reading again on a new one");
            attempt().await
        }
        done => done,
    }
}

/// Whether `error` says the connection is gone, not that the statement
/// failed: an I/O error other than a timeout, or a server shutting the
/// session down (SQLSTATE class 57P: terminated, crashed, restarting).
fn lost_connection(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Io(error) => error.kind() != std::io::ErrorKind::TimedOut,
        sqlx::Error::Database(error) => error.code().is_some_and(|code| code.starts_with("57P")),
        _ => false,
    }
}

/// The options of a kept connection's next connect: taken from its pool
/// each time, so a pool moved to another server (a failover) moves it too.
type OptionsNow<C> = Box<dyn Fn() -> <C as Connection>::Options + Send + Sync>;

/// One connection, connected on first use and again after a use that
/// failed or was cancelled.
pub(crate) struct KeptConnection<C: Connection> {
    options: OptionsNow<C>,
    /// Run once on every new connection (session settings a startup
    /// parameter cannot carry).
    setup: Option<&'static str>,
    connection: Mutex<Option<C>>,
}

impl<C: Connection> std::fmt::Debug for KeptConnection<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeptConnection")
            .field("setup", &self.setup)
            .finish_non_exhaustive()
    }
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
    pub(crate) fn new(
        options: impl Fn() -> C::Options + Send + Sync + 'static,
        setup: Option<&'static str>,
    ) -> Self {
        Self {
            options: Box::new(options),
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
                let mut connection = C::connect_with(&(self.options)()).await?;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn io(kind: std::io::ErrorKind) -> sqlx::Error {
        sqlx::Error::Io(std::io::Error::new(kind, "test"))
    }

    #[tokio::test]
    async fn a_lost_connection_is_tried_once_more() {
        let mut attempts = 0;
        let read = again_if_lost(|| {
            attempts += 1;
            let first = attempts == 1;
            async move {
                if first {
                    Err(io(std::io::ErrorKind::BrokenPipe))
                } else {
                    Ok(7)
                }
            }
        })
        .await;
        assert_eq!(read.ok(), Some(7));
        assert_eq!(attempts, 2);
    }

    #[tokio::test]
    async fn a_timeout_or_a_failed_statement_is_not_tried_again() {
        for error in [
            || io(std::io::ErrorKind::TimedOut),
            || sqlx::Error::RowNotFound,
        ] {
            let mut attempts = 0;
            let read: Result<(), _> = again_if_lost(|| {
                attempts += 1;
                async move { Err(error()) }
            })
            .await;
            assert!(read.is_err());
            assert_eq!(attempts, 1);
        }
        // Lost twice: the second failure is the answer.
        let mut attempts = 0;
        let read: Result<(), _> = again_if_lost(|| {
            attempts += 1;
            async { Err(io(std::io::ErrorKind::ConnectionReset)) }
        })
        .await;
        assert!(read.is_err());
        assert_eq!(attempts, 2);
    }
}
