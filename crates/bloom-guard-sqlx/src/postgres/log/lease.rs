//! The election of a database's log feed producer: a session advisory
//! lock, held on a connection of its own by the instance that streams the
//! slot. The other instances wait for it in the lock queue, a statement
//! that costs the server nothing while it waits: an idle fleet of standbys
//! runs no transaction (a look every few seconds each did, before).
//!
//! When the holder's process dies, its connection closes and the next
//! standby in the queue is elected at once. A holder cut off from the
//! server (a network fault) is found out by the server's TCP keepalives,
//! set on the lease's session, within about 25 s; its
//! replication connection ends at `wal_sender_timeout`. The stream is the
//! slot's own election: the lease only keeps standbys from trying it.

use std::str::FromStr as _;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::Connection as _;

/// The lease's lock, per database.
const TAKE: &str =
    "select pg_catalog.pg_advisory_lock(pg_catalog.hashtext('bloom_guard.log_producer'))";

/// The session's settings of Postgres 14 on, where the server has them:
/// a DBA's idle limit would end the holder's term while it streams (and a
/// standby would try the busy slot), and a standby that went away while
/// it waits leaves the queue within 5 s.
const SESSION: &str = "
select pg_catalog.set_config(s.name, s.setting, false)
  from (values ('idle_session_timeout', '0'),
               ('client_connection_check_interval', '5000')) as s(name, setting)
 where exists (select from pg_catalog.pg_settings p where p.name = s.name)";

/// How long one wait in the lock queue lasts before it is asked again:
/// a server gone silent is found out within this (and a little more).
const WAIT: Duration = Duration::from_secs(60);

/// The server's keepalives on the lease's session: a peer gone silent is
/// dropped after 10 s idle and three probes 5 s apart.
const KEEPALIVE: [(&str, &str); 3] = [
    ("tcp_keepalives_idle", "10"),
    ("tcp_keepalives_interval", "5"),
    ("tcp_keepalives_count", "3"),
];

/// The `application_name` of the lease's connection while it waits.
pub(crate) const STANDBY_APPLICATION_NAME: &str = "bloom-guard-log-standby";

/// The `application_name` of the lease's connection once it is held.
pub(crate) const PRODUCER_APPLICATION_NAME: &str = "bloom-guard-log-producer";

/// This instance's election as the log feed's producer, held until
/// dropped (its connection closes) or [`Lease::release`]d.
pub(crate) struct Lease {
    connection: PgConnection,
}

impl Lease {
    /// Waits in the lock queue of the database at `url` until this
    /// instance is elected. The wait is cancel-safe: dropping it closes
    /// its connection, and the queue forgets it.
    pub(crate) async fn take(url: &str) -> Result<Self, sqlx::Error> {
        let lock_timeout = format!("{}s", WAIT.as_secs());
        let options = PgConnectOptions::from_str(url)?
            .application_name(STANDBY_APPLICATION_NAME)
            .options(KEEPALIVE)
            .options([
                ("lock_timeout", lock_timeout.as_str()),
                ("statement_timeout", "0"),
            ]);
        let mut connection = PgConnection::connect_with(&options).await?;
        sqlx::query(SESSION).execute(&mut connection).await?;
        loop {
            // The client's own bound, past the server's: a server that
            // stops answering is not waited for forever.
            let waited = tokio::time::timeout(WAIT + Duration::from_secs(10), async {
                sqlx::query(TAKE).execute(&mut connection).await
            })
            .await;
            match waited {
                Ok(Ok(_)) => break,
                // The lock timeout: still another's; wait again.
                Ok(Err(sqlx::Error::Database(error)))
                    if error.code().as_deref() == Some("55P03") => {}
                Ok(Err(error)) => return Err(error),
                Err(_) => {
                    return Err(sqlx::Error::Io(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "the server did not answer the log feed's election",
                    )))
                }
            }
        }
        sqlx::query("select pg_catalog.set_config('application_name', $1, false), pg_catalog.set_config('lock_timeout', '0', false)")
            .bind(PRODUCER_APPLICATION_NAME)
            .execute(&mut connection)
            .await?;
        Ok(Self { connection })
    }

    /// Ends this instance's term: the next standby is elected at once.
    pub(crate) async fn release(self) {
        let _ = self.connection.close().await;
    }
}
