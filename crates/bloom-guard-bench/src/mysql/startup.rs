//! `bloom-load mysql`'s start-up figures: a follower's warm-up against a
//! plain `SELECT`, and a deploy after a bulk load.

use std::time::{Duration, Instant};

use bloom_guard::BloomGuard;
use bloom_guard_sqlx::{mysql, Watch};
use futures_util::TryStreamExt;
use sqlx::MySqlPool;

use super::{fill, Deploy, Warmup};

pub(super) async fn warmup(
    pool: &MySqlPool,
    keys: u64,
) -> Result<Warmup, Box<dyn std::error::Error>> {
    sqlx::raw_sql("truncate table items_plain")
        .execute(pool)
        .await?;
    sqlx::raw_sql("drop table items; create table items (id bigint auto_increment primary key, code varbinary(200) not null, unique key (code))")
        .execute(pool)
        .await?;
    Watch::table("items").key("code").install(pool).await?;
    fill(pool, "items", 1, keys).await?;
    let (mut follower_secs, mut select_secs) = (0.0, 0.0);
    let rounds = 3;
    for _ in 0..rounds {
        // A follower from start to ready: the scan, one snapshot's
        // position, the first feed read (snapshots off: a scan each time).
        let guard = BloomGuard::builder().expected_items(keys).build();
        let started = Instant::now();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(
            mysql::Follower::new(
                guard.clone(),
                pool.clone(),
                Watch::table("items").key("code"),
            )
            .snapshots(false)
            .run_until(async move {
                let _ = stopped.await;
            }),
        );
        while !guard.is_ready() {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        follower_secs += started.elapsed().as_secs_f64();
        let _ = stop.send(());
        assert_eq!(guard.stats().keys, keys, "every key in the filter");
        // The same keys by a plain SELECT, fetched and dropped.
        let started = Instant::now();
        let mut rows = sqlx::query_scalar::<_, Vec<u8>>("select code from items").fetch(pool);
        let mut count = 0_u64;
        while let Some(key) = rows.try_next().await? {
            count += u64::from(!key.is_empty());
        }
        select_secs += started.elapsed().as_secs_f64();
        assert_eq!(count, keys);
    }
    let warmup = Warmup {
        keys,
        follower_secs: follower_secs / f64::from(rounds),
        select_secs: select_secs / f64::from(rounds),
        ratio: follower_secs / select_secs,
    };
    println!("{warmup:?}");
    Ok(warmup)
}

/// The share of random absent keys `guard` rejects.
fn rejected_share(guard: &BloomGuard) -> f64 {
    const PROBES: u64 = 1_000;
    let rejected = (0..PROBES)
        .filter(|i| !guard.may_contain(format!("absent-{}", fastrand::u64(..) ^ i)))
        .count();
    rejected as f64 / PROBES as f64
}

/// A deploy after a bulk load: the instance that ran the migrations
/// published a snapshot of the empty table and stopped; the keys are
/// loaded in one statement; a new instance starts.
pub(super) async fn deploy(
    pool: &MySqlPool,
    keys: u64,
) -> Result<Deploy, Box<dyn std::error::Error>> {
    sqlx::raw_sql(
        "drop table items;
         create table items (id bigint auto_increment primary key, code varbinary(200) not null, unique key (code));
         delete from bloom_guard_snapshot_chunks; delete from bloom_guard_snapshots;
         delete from bloom_guard_changes",
    )
    .execute(pool)
    .await?;
    let watch = || Watch::table("items").key("code");
    watch().install(pool).await?;
    let first = BloomGuard::builder().name("items").build();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(
        mysql::Follower::new(first.clone(), pool.clone(), watch()).run_until(async {
            let _ = stopped.await;
        }),
    );
    first.ready().await;
    while sqlx::query_scalar::<_, i64>("select count(*) from bloom_guard_snapshots")
        .fetch_one(pool)
        .await?
        == 0
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = stop.send(());
    task.await?;
    // The bulk load: one statement (each server caps recursion at 1000 by
    // default, with a setting of its own).
    let mut conn = pool.acquire().await?;
    for setting in ["cte_max_recursion_depth", "max_recursive_iterations"] {
        let _ = sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "set session {setting} = {keys}"
        )))
        .execute(&mut *conn)
        .await;
    }
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "insert into items (code)
           with recursive n (i) as (select 1 union all select i + 1 from n where i < {keys})
           select concat('key-', i) from n"
    )))
    .execute(&mut *conn)
    .await?;
    drop(conn);
    let guard = BloomGuard::builder().name("items").build();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let started = Instant::now();
    let task = tokio::spawn(
        mysql::Follower::new(guard.clone(), pool.clone(), watch()).run_until(async {
            let _ = stopped.await;
        }),
    );
    let (mut ready, mut protected) = (None, None);
    while protected.is_none() && started.elapsed() < Duration::from_secs(120) {
        if ready.is_none() && guard.is_ready() {
            ready = Some(started.elapsed());
        }
        if ready.is_some() && rejected_share(&guard) >= 0.99 {
            protected = Some(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let stats = guard.stats();
    let _ = stop.send(());
    task.await?;
    let deploy = Deploy {
        keys,
        ready_secs: ready.map_or(f64::NAN, |at| at.as_secs_f64()),
        protected_secs: protected.map(|at| at.as_secs_f64()),
        origin: stats
            .origin
            .map(|origin| bloom_guard::stats::FilterOrigin::as_str(origin).to_owned()),
        generation: stats.generation,
    };
    println!("{deploy:?}");
    Ok(deploy)
}
