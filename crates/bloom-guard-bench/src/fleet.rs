//! `bloom-load fleet`: how long one fleet-wide switch takes to be in force
//! on every instance, and what a fleet's settings and heartbeats cost the
//! primary at rest.

use std::path::Path;
use std::time::{Duration, Instant};

use bloom_guard::{BloomGuard, Mode};
use bloom_guard_sqlx::{postgres, Watch};
use sqlx::postgres::PgPoolOptions;

use crate::writers::{feed_database, transactions_per_sec};

/// Starts `instances` instances of one guard (each its own pool, as
/// separate processes), switches the mode `switches` times on the first
/// and times each switch until every instance has it.
pub(crate) async fn switches(
    server_url: &str,
    out: &Path,
    instances: usize,
    switches: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    let (db, _pool) = feed_database(server_url, "bloom_guard_fleet", 1000).await?;
    let mut guards = Vec::new();
    let mut stops = Vec::new();
    for n in 0..instances {
        let pool = PgPoolOptions::new()
            .max_connections(4)
            .connect(&db.url)
            .await?;
        let guard = BloomGuard::builder().name("items").build();
        let follower =
            postgres::Follower::new(guard.clone(), pool, Watch::table("items").key("key"))
                .instance_id(format!("instance-{n}"));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(follower.run_until(async move {
            let _ = stopped.await;
        }));
        guard.ready().await;
        guards.push(guard);
        stops.push(stop);
    }
    // Past the start-up's scans and first heartbeats.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let at_rest = transactions_per_sec(db.pool(), Duration::from_secs(20)).await?;
    let listed = guards[0].fleet().await?.len();

    let mut samples = Vec::with_capacity(switches);
    for i in 0..switches {
        let mode = if i % 2 == 0 {
            Mode::Shadow
        } else {
            Mode::Enforce
        };
        let started = Instant::now();
        guards[0].set_mode(mode).await?;
        while guards.iter().any(|guard| guard.mode() != mode) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        samples.push(started.elapsed().as_secs_f64() * 1000.0);
        // Switches a random part of a second apart, as an operator's are.
        tokio::time::sleep(Duration::from_millis(fastrand::u64(100..1100))).await;
    }
    samples.sort_by(f64::total_cmp);
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    let (p50, p99, max) = (at(0.5), at(0.99), at(1.0));
    println!(
        "{instances} instances: a fleet-wide switch in force everywhere after p50 {p50:.0} ms, p99 {p99:.0} ms, max {max:.0} ms ({switches} switches); fleet view lists {listed}; at rest {at_rest:.1} transactions/s on the primary"
    );
    std::fs::write(
        out.join("fleet.json"),
        serde_json::to_vec_pretty(&serde_json::json!({
            "instances": instances, "switches": switches,
            "switch_in_force_everywhere_ms": { "p50": p50, "p99": p99, "max": max },
            "fleet_view_lists": listed,
            "transactions_per_sec_at_rest": at_rest,
        }))?,
    )?;
    drop(stops);
    Ok(())
}
