//! Whether the pool's connections are sessions of their own, or go
//! through a pooler in transaction mode.

use std::time::Duration;

use sqlx::postgres::{PgListener, PgPoolOptions};
use sqlx::{AssertSqlSafe, PgPool, Row as _};

use crate::error::FeedError;

/// The channel of the probe: no feed listens to it.
const PROBE_CHANNEL: &str = "bloom_guard_probe";

/// How long the probe's notification may take: milliseconds on any
/// database that delivers it.
const PROBE_WAIT: Duration = Duration::from_secs(5);

/// Probes that must all go unheard before a pooler is concluded from
/// silence alone (a notification queue far behind, on a healthy database,
/// would delay one).
const PROBES: u32 = 3;

/// The longest the whole check may take: past it, the database is too
/// slow to tell, which is an error to retry, not a pooler.
const CHECK_WAIT: Duration = Duration::from_secs(30);

/// Checks that `pool` reaches a primary, and that connections made from
/// its options keep their session:
/// a listener's connection `LISTEN`s, a connection of the pool sends it a
/// notification, and it must arrive. Through a pooler in transaction mode
/// (PgBouncer's `pool_mode = transaction`) the listener's session is
/// handed to other clients between its statements and never hears it; a
/// pooler that refuses the follower's startup parameters (PgBouncer without
/// `ignore_startup_parameters = options`) is named too. Followers run it
/// at start and stop with the error, rather than retrying what a setting
/// must fix.
///
/// # Errors
///
/// [`FeedError::Standby`] for a standby's URL;
/// [`FeedError::Pooler`] for a pooler that breaks sessions;
/// [`FeedError::Database`] if the database cannot be reached.
///
/// # Example
///
/// ```no_run
/// # async fn run(pool: sqlx::PgPool) -> Result<(), bloom_guard_sqlx::FeedError> {
/// // Before starting followers: fails at once behind PgBouncer in
/// // transaction mode, naming the fix.
/// bloom_guard_sqlx::postgres::check_session(&pool).await?;
/// # Ok(()) }
/// ```
pub async fn check_session(pool: &PgPool) -> Result<(), FeedError> {
    // A simple query, as the probe's: behind a pooler in transaction mode
    // a prepared statement's name can meet another client's statement on
    // the server connection, and its answer would name the wrong fix.
    let options = super::wake::options(pool.connect_options().as_ref());
    let listening = PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(PROBE_WAIT)
        .connect_lazy_with(options);
    // The first probe's listener connects while the pool's connection asks
    // (over TLS each costs a handshake: together, one).
    let (standby, first_listener) = tokio::join!(
        sqlx::raw_sql("select pg_catalog.pg_is_in_recovery()").fetch_one(pool),
        PgListener::connect_with(&listening)
    );
    // The listener holds the listening pool's connection: closing that
    // pool waits for it, so it goes first whatever the answer.
    let standby = standby.and_then(|row| row.try_get::<bool, _>(0));
    if !matches!(standby, Ok(false)) {
        drop(first_listener);
        listening.close().await;
        return match standby {
            Ok(_) => Err(FeedError::Standby),
            Err(error) => Err(error.into()),
        };
    }
    let mut first_listener = Some(first_listener);
    let probed = tokio::time::timeout(CHECK_WAIT, async {
        let mut unheard = 0;
        loop {
            let listener = match first_listener.take() {
                Some(listener) => listener,
                None => PgListener::connect_with(&listening).await,
            };
            match probe(pool, listener).await {
                // Silence may be a slow queue: only silence every time is
                // taken for a pooler.
                Err(FeedError::Pooler(_)) if unheard + 1 < PROBES => unheard += 1,
                probed => return probed,
            }
        }
    })
    .await
    .unwrap_or_else(|_| Err(FeedError::Database(sqlx::Error::PoolTimedOut)));
    listening.close().await;
    probed
}

/// One probe on `listener` (connected, or why not): `Ok` once heard, [`FeedError::Pooler`] on evidence of a
/// pooler (a refused startup parameter, the sender hearing it) or silence.
async fn probe(pool: &PgPool, listener: Result<PgListener, sqlx::Error>) -> Result<(), FeedError> {
    let mut listener = listener.map_err(refused_parameters)?;
    listener
        .listen(PROBE_CHANNEL)
        .await
        .map_err(refused_parameters)?;
    let nonce = format!("{:016x}", fastrand::u64(..));
    // A simple query: no statement to prepare on whichever server
    // connection a pooler picks.
    let sent = sqlx::raw_sql(AssertSqlSafe(format!(
        "select pg_catalog.pg_notify('{PROBE_CHANNEL}', '{nonce}')"
    )))
    .execute(pool)
    .await;
    match sent {
        Ok(_) => {}
        // The pooler ran it on the session that LISTENs, and handed the
        // notification to the sender.
        Err(sqlx::Error::Protocol(message)) if message.contains("NotificationResponse") => {
            return Err(FeedError::Pooler(
                "another connection's LISTEN heard a NOTIFY sent on this one".to_owned(),
            ));
        }
        Err(error) => return Err(FeedError::Database(error)),
    }
    let heard = tokio::time::timeout(PROBE_WAIT, async {
        loop {
            match listener.try_recv().await? {
                Some(notification) if notification.payload() == nonce => return Ok(()),
                Some(_) => {}
                // The connection was lost (a restart, a terminated
                // backend): an error to retry, not evidence of a pooler.
                None => {
                    return Err(sqlx::Error::Io(std::io::Error::new(
                        std::io::ErrorKind::ConnectionAborted,
                        "the session check's listening connection closed",
                    )))
                }
            }
        }
    })
    .await;
    match heard {
        Ok(Ok(())) => Ok(()),
        Ok(Err(error)) => Err(FeedError::Database(error)),
        Err(_) => Err(FeedError::Pooler(format!(
            "a connection that ran LISTEN did not hear a NOTIFY within {PROBE_WAIT:?}, {PROBES} times"
        ))),
    }
}

/// A connection refused for its startup parameters names the pooler that
/// refused them; any other error is the database's.
fn refused_parameters(error: sqlx::Error) -> FeedError {
    match &error {
        sqlx::Error::Database(database)
            if database.message().contains("unsupported startup parameter") =>
        {
            FeedError::Pooler(format!(
                "it refused a startup parameter: {}",
                database.message()
            ))
        }
        _ => FeedError::Database(error),
    }
}
