//! The flood: absent keys through the guard's layer, in this process, 64
//! and 1 024 requests at a time, while 32 writers insert one row per
//! statement into the guarded table, and again while they insert into a
//! table of another database on the same server; per feed, what the guard
//! refused a second and the share of requests its barrier let through
//! because the read did not come in time, and the server's statements per
//! refusal beyond the writers'.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bloom_guard::extract::PathSegment;
use bloom_guard::BloomGuard;
use http::{Request, Response, StatusCode};
use serde::Serialize;
use sqlx::MySqlPool;
use tower::{Layer, Service, ServiceExt};

use super::catchup::Inserters;
use super::Followers;

/// Requests in flight at once: a flood per number.
const CONCURRENCY: [usize; 2] = [64, 1024];

/// Writers during the flood.
const WRITERS: usize = 32;

/// One feed's flood.
#[derive(Debug, Serialize)]
pub(super) struct Flood {
    feed: &'static str,
    /// Requests in flight at once.
    concurrency: usize,
    /// Where the writers write: the guarded table, or another database.
    writers: &'static str,
    requests_per_sec: f64,
    refused_per_sec: f64,
    barrier_timeouts: u64,
    /// Barrier timeouts as a share of the requests.
    timeout_share: f64,
    writes_per_sec: f64,
    /// The server's statements (`Questions`) during the flood, less the
    /// writers' inserts, per refusal: what a refusal costs the database.
    statements_per_refusal: f64,
}

/// The flood on each feed's table, in turn, with the writers on the
/// table, then on `elsewhere`'s table `elsewhere` (another database).
pub(super) async fn flood(
    pool: &MySqlPool,
    elsewhere: &MySqlPool,
    followers: &Followers,
    duration: Duration,
) -> Result<Vec<Flood>, Box<dyn std::error::Error>> {
    let mut cells = Vec::new();
    for (feed, table, guard) in &followers.guards {
        for (concurrency, (writers_at, writing, written_table)) in
            CONCURRENCY.into_iter().flat_map(|concurrency| {
                [
                    (concurrency, ("the table", pool, *table)),
                    (concurrency, ("another database", elsewhere, "elsewhere")),
                ]
            })
        {
            let writers = Inserters::start(
                writing,
                written_table,
                &format!("flood-{feed}-{concurrency}-{}", writers_at.len()),
                WRITERS,
            );
            let before = guard.stats();
            let questions = super::idle::questions(pool).await?;
            let started = Instant::now();
            let (requests, refused) = requests(guard, concurrency, duration).await;
            let elapsed = started.elapsed().as_secs_f64();
            let questions = super::idle::questions(pool).await? - questions - 1.0;
            let written = writers.stop().await;
            let after = guard.stats();
            let timeouts = after.barrier_timeouts - before.barrier_timeouts;
            let cell = Flood {
                feed,
                concurrency,
                writers: writers_at,
                requests_per_sec: requests as f64 / elapsed,
                refused_per_sec: refused as f64 / elapsed,
                barrier_timeouts: timeouts,
                timeout_share: timeouts as f64 / requests.max(1) as f64,
                writes_per_sec: written as f64 / elapsed,
                statements_per_refusal: (questions - written as f64) / refused.max(1) as f64,
            };
            println!("{cell:?}");
            cells.push(cell);
        }
    }
    Ok(cells)
}

/// Runs absent keys through `guard`'s layer for `duration`, `concurrency`
/// at a time; the requests answered and those refused.
async fn requests(guard: &BloomGuard, concurrency: usize, duration: Duration) -> (u64, u64) {
    let inner = tower::service_fn(|_: Request<()>| async {
        Ok::<_, std::convert::Infallible>(Response::new(
            http_body_util::Empty::<bytes::Bytes>::new(),
        ))
    });
    let service = guard.layer(PathSegment(1)).layer(inner);
    let deadline = Instant::now() + duration;
    let (answered, refused) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut tasks = Vec::new();
    for task in 0..concurrency {
        let (mut service, answered, refused) = (service.clone(), answered.clone(), refused.clone());
        tasks.push(tokio::spawn(async move {
            let mut i = 0_u64;
            while Instant::now() < deadline {
                i += 1;
                let Ok(request) = Request::get(format!("/items/absent-{task}-{i}")).body(()) else {
                    continue;
                };
                // The guard's service never fails: its error is the
                // inner service's, which is `Infallible` here.
                let Ok(ready) = service.ready().await;
                let Ok(response) = ready.call(request).await;
                answered.fetch_add(1, Ordering::Relaxed);
                if response.status() == StatusCode::NOT_FOUND {
                    refused.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for task in tasks {
        let _ = task.await;
    }
    (
        answered.load(Ordering::Relaxed),
        refused.load(Ordering::Relaxed),
    )
}
