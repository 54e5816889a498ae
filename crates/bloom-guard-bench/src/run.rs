//! `bloom-load run`: the example service with and without the guard,
//! beside a static 404, under each workload; rounds alternate the targets
//! and the median of each is reported.

use std::time::Duration;

use crate::chart;
use crate::load::{self, Row, Workload};
use crate::services::{self, Database, Service};

/// What `bloom-load run` measures, and for how long.
pub(crate) struct RunSettings {
    pub(crate) rounds: usize,
    pub(crate) keys: u64,
    pub(crate) duration: Duration,
    pub(crate) connections: usize,
    pub(crate) hot_keys: u64,
    pub(crate) fpp: f64,
}

/// `bloom-load run`: every target and workload, `settings.rounds` times.
pub(crate) async fn run(
    server_url: &str,
    binary: &std::path::Path,
    out: &std::path::Path,
    settings: &RunSettings,
) -> Result<(), Box<dyn std::error::Error>> {
    let db = Database::create(server_url, "bloom_guard_load").await?;
    println!("filling {} rows", settings.keys);
    db.fill(settings.keys).await?;
    let guarded = Service::start(binary, &db.url, 3400, true, settings.fpp, settings.keys).await?;
    let unguarded =
        Service::start(binary, &db.url, 3500, false, settings.fpp, settings.keys).await?;

    let mut rounds: Vec<Vec<Row>> = Vec::new();
    for round in 1..=settings.rounds {
        println!("round {round} of {}", settings.rounds);
        rounds.push(run_round(&db, &guarded, &unguarded, settings).await?);
    }
    // Each row: the round with the median requests per second.
    let rows: Vec<Row> = (0..rounds[0].len())
        .map(|_| {
            let mut runs: Vec<Row> = rounds.iter_mut().map(|round| round.remove(0)).collect();
            runs.sort_by(|a, b| {
                a.measured
                    .requests_per_sec
                    .total_cmp(&b.measured.requests_per_sec)
            });
            runs.swap_remove(runs.len() / 2)
        })
        .collect();

    report(&rows, settings);
    std::fs::write(
        out.join("results.json"),
        serde_json::to_string_pretty(&rows)?,
    )?;
    chart::draw(&out.join("chart.svg"), &rows)?;
    println!(
        "wrote {} and {}",
        out.join("results.json").display(),
        out.join("chart.svg").display()
    );
    drop((guarded, unguarded));
    db.drop_database().await?;
    Ok(())
}

/// One round of every run.
async fn run_round(
    db: &Database,
    guarded: &Service,
    unguarded: &Service,
    settings: &RunSettings,
) -> Result<Vec<Row>, Box<dyn std::error::Error>> {
    let mut rows = Vec::new();
    let plan: [(&'static str, &Service, Workload, bool); 7] = [
        ("unrouted 404 (ceiling)", guarded, Workload::Unrouted, false),
        ("guarded", guarded, Workload::Attack, true),
        ("unguarded", unguarded, Workload::Attack, true),
        ("guarded", guarded, Workload::Hot, false),
        ("unguarded", unguarded, Workload::Hot, false),
        ("guarded", guarded, Workload::Mix, true),
        ("unguarded", unguarded, Workload::Mix, true),
    ];
    for (target, service, workload, count_lookups) in plan {
        let before = if count_lookups {
            Some((db.lookups().await?, db.transactions().await?))
        } else {
            None
        };
        let label = format!("{target} / {workload:?}");
        let measured = load::run(
            &service.addr,
            workload,
            settings.hot_keys,
            settings.connections,
            Duration::from_secs(1),
            settings.duration,
            &label,
        )
        .await;
        let (db_lookups_per_1000, db_transactions_per_sec) = match before {
            Some((lookups_before, transactions_before)) => {
                // Postgres publishes a backend's counts up to 10 s late.
                tokio::time::sleep(Duration::from_secs(11)).await;
                let lookups = db.lookups().await? - lookups_before;
                // Over the load (its warm-up second and the run); the
                // idle wait above adds a few of the followers' own.
                let window = (settings.duration + Duration::from_secs(1)).as_secs_f64();
                let transactions = db.transactions().await? - transactions_before;
                (
                    Some(1000.0 * lookups as f64 / (measured.all_requests as f64).max(1.0)),
                    Some(transactions as f64 / window),
                )
            }
            None => (None, None),
        };
        rows.push(Row {
            target: target.to_owned(),
            workload,
            measured,
            db_lookups_per_1000,
            db_transactions_per_sec,
        });
    }

    // A rebuild under attack: the same attack, with a rebuild one third in.
    let rebuild = {
        let admin = guarded.admin_addr.clone();
        let delay = settings.duration / 3 + Duration::from_secs(1);
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            services::post_rebuild(&admin).await
        })
    };
    let measured = load::run(
        &guarded.addr,
        Workload::Attack,
        settings.hot_keys,
        settings.connections,
        Duration::from_secs(1),
        settings.duration,
        "guarded / Attack during a rebuild",
    )
    .await;
    let rebuild_status = rebuild.await?;
    println!("rebuild during the attack answered {rebuild_status:?}");
    rows.push(Row {
        target: "guarded, rebuilding".to_owned(),
        workload: Workload::Attack,
        measured,
        db_lookups_per_1000: None,
        db_transactions_per_sec: None,
    });
    Ok(rows)
}

fn find<'a>(rows: &'a [Row], target: &str, workload: Workload) -> Option<&'a Row> {
    rows.iter()
        .find(|r| r.target == target && r.workload == workload)
}

/// Prints every run and the targets as ratios of runs of this process.
fn report(rows: &[Row], settings: &RunSettings) {
    println!(
        "\n{:<24} {:<9} {:>10} {:>9} {:>9} {:>9} {:>7} {:>12}",
        "target", "workload", "req/s", "p50 µs", "p99 µs", "p999 µs", "errors", "db/1000 req"
    );
    for row in rows {
        let m = &row.measured;
        println!(
            "{:<24} {:<9} {:>10.0} {:>9} {:>9} {:>9} {:>7} {:>12}",
            row.target,
            format!("{:?}", row.workload).to_lowercase(),
            m.requests_per_sec,
            m.p50_us,
            m.p99_us,
            m.p999_us,
            m.errors,
            row.db_lookups_per_1000
                .map_or("-".to_owned(), |v| format!("{v:.2}")),
        );
        if let Some(per_sec) = row.db_transactions_per_sec {
            println!(
                "{:<34} database transactions: {per_sec:.0}/s, {:.2} per 1000 requests",
                "",
                1000.0 * per_sec / m.requests_per_sec.max(1.0)
            );
        }
    }
    let rps = |target, workload| {
        find(rows, target, workload).map_or(f64::NAN, |r| r.measured.requests_per_sec)
    };
    let ceiling = rps("unrouted 404 (ceiling)", Workload::Unrouted);
    let attack = rps("guarded", Workload::Attack);
    let unguarded_attack = rps("unguarded", Workload::Attack);
    let hot = rps("guarded", Workload::Hot);
    let unguarded_hot = rps("unguarded", Workload::Hot);
    let lookups = find(rows, "guarded", Workload::Attack).and_then(|r| r.db_lookups_per_1000);
    let steady_p99 = find(rows, "guarded", Workload::Attack).map_or(0, |r| r.measured.p99_us);
    let rebuilding = find(rows, "guarded, rebuilding", Workload::Attack);
    println!("\ntargets (ratios within this run):");
    println!(
        "  attack vs unrouted 404 ceiling: {:.3}x (target >= 0.8 with the read barrier)",
        attack / ceiling
    );
    println!(
        "  attack vs unguarded attack:     {:.2}x (target >= 5)",
        attack / unguarded_attack
    );
    println!(
        "  db lookups per 1000 absent keys: {} (target <= {:.2})",
        lookups.map_or("-".to_owned(), |v| format!("{v:.2}")),
        1.2 * 1000.0 * settings.fpp
    );
    println!(
        "  hot keys, guarded vs unguarded:  {:.3}x (target >= 0.97)",
        hot / unguarded_hot
    );
    if let Some(r) = rebuilding {
        println!(
            "  rebuild under attack: {} errors, p99 {} µs vs {} µs steady = {:.2}x (target 0 errors, <= 2x)",
            r.measured.errors,
            r.measured.p99_us,
            steady_p99,
            r.measured.p99_us as f64 / steady_p99.max(1) as f64
        );
    }
}
