//! An idle instance's cost: the server's statements a second (its
//! `Questions` counter) while one instance follows an idle table, per feed,
//! beside the same window with no instance running.

use std::time::Duration;

use serde::Serialize;
use sqlx::MySqlPool;

use super::Followers;

/// Before a window: the instance's start settles (scan, first reads, its
/// snapshot).
const SETTLE: Duration = Duration::from_secs(5);

/// One feed's idle cost.
#[derive(Debug, Serialize)]
pub(super) struct Idle {
    feed: &'static str,
    statements_per_sec: f64,
    /// The same window with no instance running.
    none_per_sec: f64,
}

/// The server's statements so far, from every session.
pub(super) async fn questions(pool: &MySqlPool) -> Result<f64, sqlx::Error> {
    let (_, value): (String, String) = sqlx::query_as("show global status like 'Questions'")
        .fetch_one(pool)
        .await?;
    Ok(value.parse().unwrap_or(f64::NAN))
}

/// Statements a second over `window`, less the two looks themselves.
async fn rate(pool: &MySqlPool, window: Duration) -> Result<f64, sqlx::Error> {
    let before = questions(pool).await?;
    tokio::time::sleep(window).await;
    let after = questions(pool).await?;
    Ok((after - before - 1.0) / window.as_secs_f64())
}

/// Each feed's idle instance, in turn, against no instance at all.
pub(super) async fn idle(
    pool: &MySqlPool,
    url: Option<&str>,
    feeds: &[(&'static str, &'static str)],
    window: Duration,
) -> Result<Vec<Idle>, Box<dyn std::error::Error>> {
    tokio::time::sleep(SETTLE).await;
    let none_per_sec = rate(pool, window).await?;
    let mut cells = Vec::new();
    for &feed in feeds {
        let followers = Followers::start(pool, url, &[feed]).await?;
        tokio::time::sleep(SETTLE).await;
        let statements_per_sec = rate(pool, window).await?;
        drop(followers);
        let cell = Idle {
            feed: feed.0,
            statements_per_sec,
            none_per_sec,
        };
        println!("{cell:?}");
        cells.push(cell);
        // The stopped instance's tasks end before the next window.
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    Ok(cells)
}
