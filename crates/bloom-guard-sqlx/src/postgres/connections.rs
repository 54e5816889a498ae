//! Connections at start: opened together, and taken from the pool where a
//! session of its own is all that is needed.
//!
//! Each new connection over TLS costs a handshake of several round trips
//! (and, with sqlx 0.9.0, whose sockets do not set `TCP_NODELAY`, two
//! stalls of the server's delayed acknowledgement, some 40 ms each). A
//! start that opens its connections one after another pays that once per
//! connection; opened together, once.

use futures_util::future::join_all;
use sqlx::{Connection as _, PgConnection, PgPool};

/// Opens up to `connections` connections of `pool` at once and leaves
/// them idle in the pool, so that what a start does next (the session
/// check, the install, each follower's first statements and locks) finds
/// them open instead of opening them one after another. Run it before, or
/// beside, the start's first statement; a database that does not answer
/// is no error here (the start's own statements report it).
///
/// The pool keeps them as its settings say (`idle_timeout`,
/// `max_connections` caps them).
///
/// # Example
///
/// ```no_run
/// # async fn run(pool: sqlx::PgPool) -> Result<(), bloom_guard_sqlx::FeedError> {
/// // Two followers and the session check need about six connections.
/// let warm = tokio::spawn(bloom_guard_sqlx::postgres::warm_pool(pool.clone(), 6));
/// bloom_guard_sqlx::postgres::check_session(&pool).await?;
/// let _ = warm.await;
/// # Ok(()) }
/// ```
pub async fn warm_pool(pool: PgPool, connections: u32) {
    let opened = join_all((0..connections).map(|_| pool.acquire())).await;
    let failed = opened.iter().filter(|opened| opened.is_err()).count();
    if failed > 0 {
        tracing::debug!(failed, "connections of the pool not opened at start");
    }
}

/// A connection of its own (for a session advisory lock, released when
/// it closes): an idle connection of `pool` taken out of it if there is
/// one (acquired as any other, with the pool's checks: a pool of several
/// servers hands out only the current one's), else a new one with the
/// pool's options, so a pool busy to its limit never delays it.
pub(crate) async fn own_connection(pool: &PgPool) -> Result<PgConnection, sqlx::Error> {
    if pool.num_idle() > 0 {
        if let Ok(Ok(idle)) = tokio::time::timeout(IDLE_WAIT, pool.acquire()).await {
            return Ok(idle.detach());
        }
    }
    PgConnection::connect_with(&pool.connect_options()).await
}

/// How long [`own_connection`] waits for an idle connection another task
/// took first before it opens one.
const IDLE_WAIT: std::time::Duration = std::time::Duration::from_millis(50);

#[cfg(test)]
mod tests {
    use sqlx::postgres::PgPoolOptions;
    use sqlx::PgPool;

    #[sqlx::test(migrations = false)]
    #[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
    async fn a_warmed_pool_hands_its_idle_connections_to_the_start(pool: PgPool) {
        let pool = PgPoolOptions::new()
            .max_connections(8)
            .connect_lazy_with(pool.connect_options().as_ref().clone());
        super::warm_pool(pool.clone(), 4).await;
        // Released connections go back to the pool a moment later.
        for _ in 0..100 {
            if pool.num_idle() == 4 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert_eq!(
            (pool.size(), pool.num_idle()),
            (4, 4),
            "opened together, left idle"
        );
        // A session of its own is an idle connection taken out of the
        // pool, not a new one.
        let mut own = super::own_connection(&pool).await.expect("a connection");
        assert_eq!((pool.size(), pool.num_idle()), (3, 3));
        let pid: i32 = sqlx::query_scalar("select pg_catalog.pg_backend_pid()")
            .fetch_one(&mut own)
            .await
            .expect("a statement");
        assert!(pid > 0);
        // With none idle, a new one: the pool's limit never delays it.
        let held: Vec<_> = futures_util::future::join_all((0..3).map(|_| pool.acquire()))
            .await
            .into_iter()
            .collect::<Result<_, _>>()
            .expect("the pool's connections");
        assert_eq!(pool.num_idle(), 0);
        let _other = super::own_connection(&pool)
            .await
            .expect("a new connection");
        assert_eq!(pool.size(), 3);
        drop(held);
    }
}
