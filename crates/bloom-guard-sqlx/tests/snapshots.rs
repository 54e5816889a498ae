//! Snapshots on a real Postgres: one scan per fleet, adopted filters
//! completed from the feed, and every damaged or unfit snapshot refused.

mod common;

use std::io::Write as _;
use std::process::Stdio;
use std::time::Duration;

use bloom_guard::{stats::FilterOrigin, BloomGuard, KeyType};
use bloom_guard_sqlx::postgres;
use common::*;
use sqlx::PgPool;

/// Sequential scans of `items` so far, as the statistics collector has them
/// once every backend has flushed (at most a second after it went idle).
async fn seq_scans(pool: &PgPool) -> i64 {
    tokio::time::sleep(Duration::from_millis(1500)).await;
    exec(pool, "select pg_stat_clear_snapshot()").await;
    sqlx::query_scalar("select seq_scan from pg_stat_user_tables where relname = 'items'")
        .fetch_one(pool)
        .await
        .expect("statistics")
}

async fn seed(pool: &PgPool, keys: usize) {
    sqlx::query("insert into items (key) select 'k' || i from generate_series(1, $1) i")
        .bind(keys as i64)
        .execute(pool)
        .await
        .expect("seed");
    // Planner statistics, as a table in service has them: the scan's count
    // hint sizes the filter right the first time.
    exec(pool, "analyze items").await;
}

/// A first instance that scanned and published its snapshot, then stopped.
async fn published(pool: &PgPool) -> BloomGuard {
    let (guard, task) = followed(pool).await;
    for _ in 0..1000 {
        if snapshot_count(pool).await > 0 {
            drop(task);
            return guard;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("no snapshot was published");
}

async fn snapshot_count(pool: &PgPool) -> i64 {
    sqlx::query_scalar("select count(*) from bloom_guard.snapshots")
        .fetch_one(pool)
        .await
        .expect("count")
}

/// A new instance, ready: where its filter came from.
async fn start(pool: &PgPool, guard: BloomGuard) -> (BloomGuard, Running) {
    let task = spawn(follower(&guard, pool));
    wait_until("the warm-up", Duration::from_secs(10), || guard.is_ready()).await;
    (guard, task)
}

#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn four_instances_started_together_scan_once(pool: PgPool) {
    install(&pool).await;
    seed(&pool, 5_000).await;
    let before = seq_scans(&pool).await;
    let guards: Vec<BloomGuard> = (0..4).map(|_| guard()).collect();
    let _tasks: Vec<Running> = guards.iter().map(|g| spawn(follower(g, &pool))).collect();
    wait_until("four warm-ups", Duration::from_secs(20), || {
        guards.iter().all(BloomGuard::is_ready)
    })
    .await;
    let origins: Vec<_> = guards.iter().map(|g| g.stats().origin).collect();
    let scanned = origins
        .iter()
        .filter(|o| **o == Some(FilterOrigin::Scan))
        .count();
    assert_eq!(scanned, 1, "{origins:?}");
    assert_eq!(seq_scans(&pool).await - before, 1, "one table scan in all");
    for guard in &guards {
        assert!(holds_all(guard, &["k1", "k2500", "k5000"]));
        assert!(!guard.may_contain("absent-key"));
    }
}

#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn a_key_committed_after_the_snapshot_is_replayed(pool: PgPool) {
    install(&pool).await;
    seed(&pool, 1_000).await;
    published(&pool).await;
    // Between the snapshot and the next start, through psql.
    let mut psql = psql(&pool).await;
    let mut child = psql.stdin(Stdio::piped()).spawn().expect("psql on PATH");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(b"insert into items (key) values ('after-the-snapshot');\n")
        .expect("write");
    assert!(child.wait().expect("psql").success());

    let guard = guard();
    let task = spawn(follower(&guard, &pool).poll_interval(Duration::from_secs(3600)));
    wait_until("the adoption", Duration::from_secs(10), || guard.is_ready()).await;
    // Ready means replayed: no read of the follower is needed.
    assert!(guard.may_contain("after-the-snapshot"));
    assert!(guard.may_contain("k1000") && !guard.may_contain("absent-key"));
    assert_eq!(guard.stats().origin, Some(FilterOrigin::Snapshot));
    drop(task);
}

/// Starts an instance over a damaged or unfit snapshot: it must scan.
async fn refused(pool: &PgPool, guard: BloomGuard) {
    let (guard, _task) = start(pool, guard).await;
    assert_eq!(guard.stats().origin, Some(FilterOrigin::Scan));
    assert!(holds_all(&guard, &["k1", "k500"]));
}

#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn a_flipped_byte_is_refused(pool: PgPool) {
    install(&pool).await;
    seed(&pool, 500).await;
    published(&pool).await;
    exec(
        &pool,
        "update bloom_guard.snapshot_chunks
            set data = set_byte(data, length(data) / 2, get_byte(data, length(data) / 2) # 1)",
    )
    .await;
    refused(&pool, guard()).await;
}

#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn a_truncated_chunk_is_refused(pool: PgPool) {
    install(&pool).await;
    seed(&pool, 500).await;
    published(&pool).await;
    exec(
        &pool,
        "update bloom_guard.snapshot_chunks set data = substring(data from 1 for length(data) - 40)",
    )
    .await;
    refused(&pool, guard()).await;
}

#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn a_snapshot_of_another_key_type_or_query_is_refused(pool: PgPool) {
    install(&pool).await;
    seed(&pool, 500).await;
    published(&pool).await;
    // The same guard name and query, but integer keys.
    let integers = BloomGuard::builder().key_type(KeyType::Integer).build();
    let (integers, task) = start(&pool, integers).await;
    assert_eq!(integers.stats().origin, Some(FilterOrigin::Scan));
    drop(task);
    // Another key query on the same guard name: the snapshot is not its.
    let by_value = BloomGuard::builder().expected_items(1000).build();
    let task = spawn(postgres::Follower::new(
        by_value.clone(),
        pool.clone(),
        bloom_guard_sqlx::Watch::table("items")
            .key("value")
            .name("items"),
    ));
    wait_until("the warm-up", Duration::from_secs(10), || {
        by_value.is_ready()
    })
    .await;
    assert_eq!(by_value.stats().origin, Some(FilterOrigin::Scan));
    drop(task);
}

#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn a_snapshot_older_than_the_horizon_is_refused(pool: PgPool) {
    install(&pool).await;
    seed(&pool, 500).await;
    published(&pool).await;
    exec(&pool, "insert into items (key) values ('pruned-away')").await;
    // Retention waits for every older transaction in the cluster (other
    // tests' included): give it time, and insist it happened.
    let mut behind = false;
    for _ in 0..2000 {
        exec(&pool, "select bloom_guard.prune('0 s')").await;
        let now_behind: bool = sqlx::query_scalar(
            "select bool_and(pg_snapshot_xmin(split_part(position, '/', 2)::pg_snapshot) < (select below from bloom_guard.horizon))
               from bloom_guard.snapshots",
        )
        .fetch_one(&pool)
        .await
        .expect("horizon");
        if now_behind {
            behind = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(behind, "retention never passed the snapshot's position");
    let (guard, _task) = start(&pool, guard()).await;
    assert_eq!(guard.stats().origin, Some(FilterOrigin::Scan));
    assert!(holds_all(&guard, &["k1", "pruned-away"]));
}

#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn racing_rebuilds_scan_once_for_the_fleet(pool: PgPool) {
    install(&pool).await;
    seed(&pool, 2_000).await;
    let rebuilding = || {
        BloomGuard::builder()
            .expected_items(1000)
            .rebuild_interval(Duration::from_secs(1))
            .build()
    };
    let (a, _a) = start(&pool, rebuilding()).await;
    let (b, _b) = start(&pool, rebuilding()).await;
    let generations = (a.stats().generation, b.stats().generation);
    let before = seq_scans(&pool).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let scans = seq_scans(&pool).await - before;
    let builds = a.stats().generation - generations.0 + b.stats().generation - generations.1;
    // Unshared, every build is a scan; shared, one scan serves both.
    assert!(scans >= 1, "the schedule ran");
    assert!(
        (scans as u64) * 2 <= builds + 1,
        "{scans} scans for {builds} builds"
    );
    assert!(holds_all(&a, &["k1", "k2000"]) && holds_all(&b, &["k1", "k2000"]));
}

#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn a_crash_mid_publish_leaves_the_previous_snapshot_usable(pool: PgPool) {
    install(&pool).await;
    seed(&pool, 1_000).await;
    // A large filter (several chunks), republished on every check.
    let big = BloomGuard::builder().expected_items(5_000_000).build();
    let task = spawn(follower(&big, &pool).snapshot_interval(Duration::ZERO));
    wait_until("the warm-up", Duration::from_secs(20), || big.is_ready()).await;
    while snapshot_count(&pool).await == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Kill the publishing connection in the middle of its chunks, again
    // and again.
    let mut killed = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(4);
    while tokio::time::Instant::now() < deadline {
        killed += sqlx::query(
            "select pg_terminate_backend(pid) from pg_stat_activity
              where datname = current_database() and query like 'insert into bloom_guard.snapshot_chunks%'
                and state = 'active'",
        )
        .execute(&pool)
        .await
        .expect("terminate")
        .rows_affected();
    }
    drop(task);
    assert!(killed > 0, "no publish was caught in the middle");
    // Every snapshot left is whole, and a new instance adopts the newest.
    let torn: i64 = sqlx::query_scalar(
        "select count(*) from bloom_guard.snapshots s
          where s.len <> (select coalesce(sum(length(data)), 0) from bloom_guard.snapshot_chunks c where c.snapshot = s.id)",
    )
    .fetch_one(&pool)
    .await
    .expect("count");
    assert_eq!(torn, 0);
    let other = BloomGuard::builder().expected_items(5_000_000).build();
    let (other, _task) = start(&pool, other).await;
    assert_eq!(other.stats().origin, Some(FilterOrigin::Snapshot));
    assert!(holds_all(&other, &["k1", "k1000"]));
}

#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn an_admin_rebuild_asked_of_two_instances_at_once_scans_once(pool: PgPool) {
    install(&pool).await;
    seed(&pool, 2_000).await;
    let (a, _a) = start(&pool, guard()).await;
    let (b, _b) = start(&pool, guard()).await;
    let generations = (a.stats().generation, b.stats().generation);
    exec(
        &pool,
        "insert into items (key) values ('before-the-rebuild')",
    )
    .await;
    let before = seq_scans(&pool).await;
    let rebuild_a = bloom_guard_sqlx::FleetRebuild::new(a.clone(), pool.clone(), items());
    let rebuild_b = bloom_guard_sqlx::FleetRebuild::new(b.clone(), pool.clone(), items());
    let (from_a, from_b) = tokio::join!(rebuild_a.rebuild(), rebuild_b.rebuild());
    from_a.expect("rebuild asked of a");
    from_b.expect("rebuild asked of b");
    // The instance that did not scan adopts the published filter.
    wait_until("both on the new filter", Duration::from_secs(10), || {
        a.stats().generation > generations.0 && b.stats().generation > generations.1
    })
    .await;
    assert_eq!(
        seq_scans(&pool).await - before,
        1,
        "one scan for both requests"
    );
    let origins = [a.stats().origin, b.stats().origin];
    assert!(
        origins.contains(&Some(FilterOrigin::Snapshot)),
        "{origins:?}"
    );
    assert!(holds_all(&a, &["before-the-rebuild"]) && holds_all(&b, &["before-the-rebuild"]));
}

/// Of 1 000 keys no row holds, how many the guard answers absent.
fn absent_rejected(guard: &BloomGuard) -> usize {
    (0..1_000)
        .filter(|i| !guard.may_contain(format!("never-stored-{i}")))
        .count()
}

#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn an_instance_started_after_a_bulk_load_protects_from_its_first_filter(pool: PgPool) {
    install(&pool).await;
    // The instance that ran the migrations published the empty table.
    published(&pool).await;
    // A bulk load in one statement, without ANALYZE.
    exec(
        &pool,
        "insert into items (key) select 'k' || i from generate_series(1, 200000) i",
    )
    .await;
    let before = seq_scans(&pool).await;
    let guard = guard();
    let _task = spawn(follower(&guard, &pool));
    wait_until("ready", Duration::from_secs(30), || guard.is_ready()).await;
    // The first filter it answers with protects: no saturated snapshot
    // replayed into, no second scan to size it right.
    let rejected = absent_rejected(&guard);
    assert!(rejected >= 990, "{rejected} of 1000 absent keys rejected");
    let stats = guard.stats();
    assert_eq!(
        (stats.generation, stats.origin),
        (1, Some(FilterOrigin::Scan)),
        "{stats:?}"
    );
    assert!(stats.estimated_fpp <= stats.target_fpp, "{stats:?}");
    assert!((1..=200_000)
        .step_by(997)
        .all(|i| guard.may_contain(format!("k{i}"))));
    assert_eq!(seq_scans(&pool).await - before, 1, "one scan");
    assert_eq!(guard.stats().generation, 1, "and no rebuild after it");
}

#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn a_snapshot_of_an_older_format_leads_to_a_scan(pool: PgPool) {
    install(&pool).await;
    seed(&pool, 500).await;
    published(&pool).await;
    // As format 1 wrote it: the format in its row and in its bytes.
    exec(
        &pool,
        "update bloom_guard.snapshots set format = 1;
         update bloom_guard.snapshot_chunks
            set data = overlay(data placing '\\x01000000'::bytea from 9 for 4)
          where seq = 0",
    )
    .await;
    refused(&pool, guard()).await;
}

/// The newest snapshot's id.
async fn newest_snapshot(pool: &PgPool) -> i64 {
    sqlx::query_scalar("select coalesce(max(id), 0) from bloom_guard.snapshots")
        .fetch_one(pool)
        .await
        .expect("newest")
}

/// A stale snapshot is published again only once the filter changed by
/// 1% of its keys (at least 1 000) since: an unchanged filter costs the
/// database no snapshot writes.
#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn a_stale_snapshot_is_published_again_only_once_the_filter_changed(pool: PgPool) {
    install(&pool).await;
    seed(&pool, 2_000).await;
    let guard = guard();
    let _task = spawn(follower(&guard, &pool).snapshot_interval(Duration::from_millis(100)));
    wait_until("ready", Duration::from_secs(20), || guard.is_ready()).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while newest_snapshot(&pool).await == 0 {
        assert!(tokio::time::Instant::now() < deadline, "no first snapshot");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let first = newest_snapshot(&pool).await;
    // Stale after 100 ms, checked every 200 ms: ten checks, no change.
    exec(&pool, "insert into items (key) values ('one')").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        newest_snapshot(&pool).await,
        first,
        "published again unchanged"
    );
    // 1 000 changes: published again.
    exec(
        &pool,
        "insert into items (key) select 'more-' || i from generate_series(1, 1000) i",
    )
    .await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while newest_snapshot(&pool).await == first {
        assert!(
            tokio::time::Instant::now() < deadline,
            "not published again after 1 000 changes"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (other, _other) = start(&pool, BloomGuard::builder().expected_items(1000).build()).await;
    assert_eq!(other.stats().origin, Some(FilterOrigin::Snapshot));
    assert!(holds_all(&other, &["one", "more-1000", "k2000"]));
}
