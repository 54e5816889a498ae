//! `bloom-load barrier`: refusals under a flood of absent keys with the
//! read barrier on and off, beside the same process's unrouted 404, and
//! the database reads the barrier costs; a flood at a fixed rate; and
//! several instances under one spread flood.
//!
//! The floods run `wrk` (lighter than this process's own generator, which
//! would take a core from the service); the fixed rate runs this process's
//! paced generator.

use std::path::Path;
use std::time::Duration;

use serde::Serialize;

use crate::load::{self, Load, Workload};
use crate::services::{Database, Service};
use crate::wrk::{tempfile_dir, wrk};

/// What `bloom-load barrier` measures.
pub(crate) struct BarrierSettings {
    pub(crate) keys: u64,
    pub(crate) seconds: u64,
    pub(crate) connections: Vec<usize>,
    pub(crate) rate: f64,
    pub(crate) instances: usize,
    pub(crate) rounds: usize,
    /// The services' `BLOOM_FEED`: `triggers` or `log`.
    pub(crate) feed: String,
}

/// One measured flood.
#[derive(Debug, Serialize)]
struct Row {
    run: String,
    connections: usize,
    requests_per_sec: f64,
    p50_ms: f64,
    p99_ms: f64,
    /// Database transactions a second during the flood, less those of the
    /// idle services: the barrier's feed reads.
    db_reads_per_sec: Option<f64>,
}

impl Row {
    fn reads_share(&self) -> Option<f64> {
        self.db_reads_per_sec
            .map(|reads| reads / self.requests_per_sec.max(1.0))
    }
}

/// Seeds each wrk thread's random keys apart; `n` counts its requests.
pub(crate) const SEEDED_LUA: &str = r#"
local counter = 0
setup = function(thread)
  counter = counter + 1
  thread:set("id", counter)
end
init = function(args)
  math.randomseed(os.time() * 1000 + id)
  n = 0
end
"#;

/// Absent keys of `/items/{key}`.
pub(crate) const ATTACK_LUA: &str = r#"
request = function()
  return wrk.format("GET", string.format("/items/absent-%08x%08x",
    math.random(0, 0x7fffffff), math.random(0, 0x7fffffff)))
end
"#;

/// Absent keys of both guards in turn: `/items/{key}` and `/users/{id}`
/// (UUIDs), for the reads the guards of one instance share.
const TWO_GUARDS_LUA: &str = r#"
request = function()
  n = n + 1
  if n % 2 == 0 then
    return wrk.format("GET", string.format("/items/absent-%08x%08x",
      math.random(0, 0x7fffffff), math.random(0, 0x7fffffff)))
  end
  return wrk.format("GET", string.format("/users/%08x-%04x-4%03x-8%03x-%04x%08x",
    math.random(0, 0x7fffffff), math.random(0, 0xffff), math.random(0, 0xfff),
    math.random(0, 0xfff), math.random(0, 0xffff), math.random(0, 0x7fffffff)))
end
"#;

const UNROUTED_LUA: &str = r#"
request = function()
  return wrk.format("GET", string.format("/unrouted/%08x", math.random(0, 0x7fffffff)))
end
"#;

/// `bloom-load barrier`.
pub(crate) async fn barrier(
    server_url: &str,
    binary: &Path,
    out: &Path,
    settings: &BarrierSettings,
) -> Result<(), Box<dyn std::error::Error>> {
    let scripts = tempfile_dir()?;
    std::fs::write(
        scripts.join("attack.lua"),
        format!("{SEEDED_LUA}{ATTACK_LUA}"),
    )?;
    std::fs::write(scripts.join("unrouted.lua"), UNROUTED_LUA)?;
    std::fs::write(
        scripts.join("two_guards.lua"),
        format!("{SEEDED_LUA}{TWO_GUARDS_LUA}"),
    )?;

    let db = Database::create(server_url, "bloom_guard_barrier").await?;
    let result = floods(&db, binary, out, settings, &scripts).await;
    db.drop_database().await?;
    let _ = std::fs::remove_dir_all(scripts);
    result
}

async fn floods(
    db: &Database,
    binary: &Path,
    out: &Path,
    settings: &BarrierSettings,
    scripts: &Path,
) -> Result<(), Box<dyn std::error::Error>> {
    let attack = scripts.join("attack.lua");
    let unrouted = scripts.join("unrouted.lua");
    let two_guards = scripts.join("two_guards.lua");
    println!("filling {} rows", settings.keys);
    db.fill(settings.keys).await?;
    let env = |barrier: &str| {
        vec![
            ("DATABASE_URL", db.url.clone()),
            ("BLOOM_FEED", settings.feed.clone()),
            ("BLOOM_EXPECTED_ITEMS", settings.keys.to_string()),
            ("BLOOM_READ_BARRIER", barrier.to_owned()),
            // The barrier's reads alone: no audit lookups among them.
            ("BLOOM_AUDIT_RATE", "0".to_owned()),
        ]
    };
    let on = Service::start_with(binary, 3600, &env("on")).await?;
    let off = Service::start_with(binary, 3700, &env("off")).await?;
    let mut unguarded_env = env("on");
    unguarded_env.push(("BLOOM_GUARD", "off".to_owned()));
    let unguarded = Service::start_with(binary, 3800, &unguarded_env).await?;
    let seconds = settings.seconds;
    // What the idle services cost the database (polls, heartbeats,
    // checks), subtracted from the floods' transactions.
    let before = db.transactions().await?;
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let idle = reads_since(db, before, seconds).await?;
    println!("idle: {idle:.1} transactions/s, subtracted below");
    // Three services idle: on, off and unguarded.
    let idle_each = idle / 3.0;
    let feed_reads = |before| async move {
        reads_since(db, before, seconds)
            .await
            .map(|reads| (reads - idle).max(0.0))
    };
    let mut rows = Vec::new();
    for &connections in &settings.connections {
        // Rounds alternate the targets; each row is its median round.
        let mut rounds: Vec<Vec<Row>> = Vec::new();
        let mut targets = vec![
            ("unrouted 404", &on, &unrouted),
            ("barrier on", &on, &attack),
            ("barrier off", &off, &attack),
            (TWO_GUARDS, &on, &two_guards),
        ];
        if connections == settings.connections[0] {
            targets.push(("unguarded service", &unguarded, &attack));
        }
        for r in 0..settings.rounds {
            // Each round starts at another target, and every flood after
            // the same rest: the one after a rest would otherwise gain
            // over the one after a flood (connections still closing).
            let mut round = Vec::new();
            for i in 0..targets.len() {
                let (run, service, script) = targets[(r + i) % targets.len()];
                tokio::time::sleep(SETTLE).await;
                let before = db.transactions().await?;
                let measured = wrk(&service.addr, script, connections, seconds).await?;
                let reads = if run == "barrier on" || run == TWO_GUARDS {
                    Some(feed_reads(before).await?)
                } else {
                    None
                };
                round.push(row(run, connections, measured, reads));
            }
            round.sort_by_key(|row| targets.iter().position(|(run, _, _)| *run == row.run));
            rounds.push(round);
        }
        while !rounds[0].is_empty() {
            let mut runs: Vec<Row> = rounds.iter_mut().map(|round| round.remove(0)).collect();
            runs.sort_by(|a, b| a.requests_per_sec.total_cmp(&b.requests_per_sec));
            rows.push(runs.swap_remove(runs.len() / 2));
        }
    }
    drop((off, unguarded));

    // A flood at a fixed rate, barrier on.
    let before = db.transactions().await?;
    let paced = load::run_load(
        &Load {
            addrs: vec![on.addr.clone()],
            workload: Workload::Attack,
            hot_keys: 1,
            connections: 64,
            rate: Some(settings.rate),
        },
        Duration::ZERO,
        Duration::from_secs(seconds),
        "barrier on, fixed rate",
    )
    .await;
    let reads = feed_reads(before).await?;
    rows.push(row(
        &format!("barrier on, {} req/s", settings.rate),
        64,
        (
            paced.requests_per_sec,
            paced.p50_us as f64 / 1000.0,
            paced.p99_us as f64 / 1000.0,
        ),
        Some(reads),
    ));

    // Several instances under one flood spread over them.
    let mut fleet = vec![on];
    for i in 1..settings.instances {
        let port = 3600 + 20 * u16::try_from(i)?;
        fleet.push(Service::start_with(binary, port, &env("on")).await?);
    }
    let connections = settings.connections.iter().copied().max().unwrap_or(256);
    let per_instance = (connections / fleet.len()).max(1);
    let before = db.transactions().await?;
    let floods = fleet
        .iter()
        .map(|service| wrk(&service.addr, &attack, per_instance, seconds));
    let measured = futures_util::future::try_join_all(floods).await?;
    // Each instance idles at the cost measured for one.
    let reads = (feed_reads(before).await? + idle - idle_each * fleet.len() as f64).max(0.0);
    let total: f64 = measured.iter().map(|(rps, _, _)| rps).sum();
    let p50 = measured.iter().map(|m| m.1).fold(0.0, f64::max);
    let p99 = measured.iter().map(|m| m.2).fold(0.0, f64::max);
    rows.push(row(
        &format!("{} instances, barrier on", fleet.len()),
        per_instance * fleet.len(),
        (total, p50, p99),
        Some(reads),
    ));
    drop(fleet);

    report(&rows);
    std::fs::write(
        out.join("barrier.json"),
        serde_json::to_string_pretty(&rows)?,
    )?;
    println!("wrote {}", out.join("barrier.json").display());
    Ok(())
}

fn row(run: &str, connections: usize, (rps, p50, p99): (f64, f64, f64), reads: Option<f64>) -> Row {
    Row {
        run: run.to_owned(),
        connections,
        requests_per_sec: rps,
        p50_ms: p50,
        p99_ms: p99,
        db_reads_per_sec: reads,
    }
}

/// The flood over both guards of one instance, with the barrier on.
const TWO_GUARDS: &str = "barrier on, two guards";

/// The rest before every flood.
const SETTLE: Duration = Duration::from_secs(3);

/// Database transactions a second since `before`, over a flood of
/// `seconds`: Postgres publishes an idle backend's counts up to 10 s late.
async fn reads_since(db: &Database, before: u64, seconds: u64) -> Result<f64, sqlx::Error> {
    tokio::time::sleep(Duration::from_secs(11)).await;
    let after = db.transactions().await?;
    Ok(after.saturating_sub(before) as f64 / seconds as f64)
}

/// Prints every flood and the ratios the read barrier is held to.
fn report(rows: &[Row]) {
    println!(
        "\n{:<28} {:>6} {:>10} {:>8} {:>8} {:>10} {:>8}",
        "run", "conns", "req/s", "p50 ms", "p99 ms", "db reads/s", "share"
    );
    for row in rows {
        println!(
            "{:<28} {:>6} {:>10.0} {:>8.2} {:>8.2} {:>10} {:>8}",
            row.run,
            row.connections,
            row.requests_per_sec,
            row.p50_ms,
            row.p99_ms,
            row.db_reads_per_sec
                .map_or("-".to_owned(), |reads| format!("{reads:.0}")),
            row.reads_share()
                .map_or("-".to_owned(), |share| format!("{:.2}%", 100.0 * share)),
        );
    }
    println!("\nratios within this run:");
    let find = |run: &str, connections: usize| {
        rows.iter()
            .find(|row| row.run == run && row.connections == connections)
    };
    let mut seen = Vec::new();
    for connections in rows.iter().map(|row| row.connections) {
        if seen.contains(&connections) {
            continue;
        }
        seen.push(connections);
        let (Some(on), Some(off), Some(unrouted)) = (
            find("barrier on", connections),
            find("barrier off", connections),
            find("unrouted 404", connections),
        ) else {
            continue;
        };
        let unguarded = find("unguarded service", connections).map_or(String::new(), |row| {
            format!(
                ", on ÷ unguarded {:.1}",
                on.requests_per_sec / row.requests_per_sec.max(1.0)
            )
        });
        // A flood over two guards costs the reads of one when they share.
        let shared = find(TWO_GUARDS, connections)
            .and_then(|two| Some((two.reads_share()?, on.reads_share()?)))
            .map_or(String::new(), |(two, one)| {
                format!(
                    ", reads ÷ refusals over two guards ÷ over one {:.2}",
                    two / one.max(f64::MIN_POSITIVE)
                )
            });
        println!(
            "  {connections:>5} connections: on ÷ off {:.2}, on ÷ unrouted {:.2}{unguarded}{shared}",
            on.requests_per_sec / off.requests_per_sec.max(1.0),
            on.requests_per_sec / unrouted.requests_per_sec.max(1.0),
        );
    }
}
