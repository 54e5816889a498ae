//! The log feed end to end (feature `log-feed`; `DATABASE_URL`'s server
//! with `wal_level=logical`): followers of a table fed by the write-ahead
//! log serve a key committed a moment before through another instance,
//! forget deleted keys exactly once through raw SQL of every kind, and a
//! follower started again (adopting a snapshot or scanning at a point of
//! the log) holds what the table holds.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use bloom_guard::BloomGuard;
use bloom_guard_sqlx::PgLogFollower;
use common::*;
use http::StatusCode;
use sqlx::PgPool;

/// The log feed's slot of the test's database, dropped with its reader
/// stopped when the test ends (also when it fails): a slot left behind
/// keeps the server's log, and its database from being dropped.
struct SlotGuard {
    url: String,
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        let sql = "select pg_terminate_backend(active_pid) from pg_replication_slots \
                    where database = current_database() and active_pid is not null; \
                   select pg_sleep(0.3); \
                   select pg_drop_replication_slot(slot_name) from pg_replication_slots \
                    where database = current_database();";
        let _ = std::process::Command::new("psql")
            .arg(&self.url)
            .args(["-qAt", "-c", sql])
            .output();
    }
}

/// `DATABASE_URL` naming the test's database.
async fn url_of(pool: &PgPool) -> String {
    let database: String = sqlx::query_scalar("select current_database()")
        .fetch_one(pool)
        .await
        .expect("database name");
    let url = std::env::var("DATABASE_URL").expect("DATABASE_URL");
    let (base, query) = url
        .split_once('?')
        .map_or((&*url, None), |(b, q)| (b, Some(q)));
    let server = base.rsplit_once('/').map_or(base, |(server, _)| server);
    match query {
        Some(query) => format!("{server}/{database}?{query}"),
        None => format!("{server}/{database}"),
    }
}

/// The feed installed and `items` on the log feed.
async fn log_fed(pool: &PgPool) -> (String, SlotGuard) {
    let url = url_of(pool).await;
    bloom_guard_sqlx::install(pool)
        .await
        .expect("install the feed");
    exec(
        pool,
        "alter table items replica identity using index items_key_key",
    )
    .await;
    let slot = SlotGuard { url: url.clone() };
    items()
        .install_log(pool)
        .await
        .expect("put items on the log feed");
    (url, slot)
}

fn guard() -> BloomGuard {
    BloomGuard::builder()
        .expected_items(500)
        .false_positive_rate(0.01)
        .write_window(Duration::from_millis(50))
        .read_barrier_timeout(Duration::from_secs(10))
        .build()
}

/// A guard kept complete by a log feed follower, once warm.
async fn log_followed(pool: &PgPool, url: &str) -> (BloomGuard, Running) {
    let guard = guard();
    let follower = PgLogFollower::new(guard.clone(), pool.clone(), items(), url)
        .check_interval(Duration::from_millis(200))
        .poll_interval(Duration::from_millis(500));
    let task = spawn(follower);
    wait_until("the first filter", Duration::from_secs(20), || {
        guard.is_ready()
    })
    .await;
    (guard, task)
}

#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn a_key_committed_through_one_instance_is_served_by_another_at_once(pool: PgPool) {
    let (url, _slot) = log_fed(&pool).await;
    let (one, _one) = log_followed(&pool, &url).await;
    let (two, _two) = log_followed(&pool, &url).await;
    let mut refused = Vec::new();
    for i in 0..300 {
        let key = format!("created-{i}-{}", fastrand::u32(..));
        one.insert(&key);
        sqlx::query("insert into items (key) values ($1)")
            .bind(&key)
            .execute(&pool)
            .await
            .expect("insert");
        if status(&two, &key).await == StatusCode::NOT_FOUND {
            refused.push(key);
        }
    }
    assert!(refused.is_empty(), "refused: {refused:?}");
    assert!(two.stats().barrier_found > 0, "{:?}", two.stats());
    assert_eq!(status(&two, "never-written").await, StatusCode::NOT_FOUND);
}

/// One random statement of raw SQL on `items`.
async fn random_write(pool: &PgPool, rng: &mut fastrand::Rng, seen: &mut BTreeSet<String>) {
    let key = format!("k{}", rng.u32(..400));
    let other = format!("k{}", rng.u32(..400));
    seen.insert(key.clone());
    seen.insert(other.clone());
    let sql = match rng.u8(0..6) {
        0 | 1 => format!("insert into items (key) values ('{key}') on conflict do nothing"),
        2 => format!("update items set key = '{other}' where key = '{key}' and not exists (select from items where key = '{other}')"),
        3 => format!("delete from items where key = '{key}'"),
        4 => format!(
            "begin; delete from items where key = '{key}'; insert into items (key) values ('{key}'); commit"
        ),
        _ => format!(
            "merge into items t using (values ('{key}')) s(key) on t.key = s.key
               when matched then delete when not matched then insert (key) values (s.key)"
        ),
    };
    exec(pool, &sql).await;
}

/// Every seen key asked of `guard` once it has read every change: none
/// with a row refused, the others refused but for twice the rate and two.
async fn answers_as_the_table(
    name: &str,
    guard: &BloomGuard,
    pool: &PgPool,
    seen: &BTreeSet<String>,
) {
    let table: BTreeSet<String> = sqlx::query_scalar("select key from items")
        .fetch_all(pool)
        .await
        .expect("keys")
        .into_iter()
        .collect();
    // The first refusal waited for a read after every write above.
    let mut synced = false;
    for n in 0..20 {
        if status(guard, &format!("sync-{n}")).await == StatusCode::NOT_FOUND {
            synced = true;
            break;
        }
    }
    assert!(synced, "{name}: no key refused: {:?}", guard.stats());
    let (mut absent, mut passed) = (0, Vec::new());
    for key in seen {
        let refused = status(guard, key).await == StatusCode::NOT_FOUND;
        if table.contains(key) {
            assert!(
                !refused,
                "{name}: a false negative for {key}; {:?}",
                guard.stats()
            );
        } else {
            absent += 1;
            if !refused {
                passed.push(key.clone());
            }
        }
    }
    let allowed = (f64::from(absent) * 0.02).ceil() as usize + 2;
    assert!(
        passed.len() <= allowed,
        "{name}: {} of {absent} deleted keys passed: {passed:?}; {:?}",
        passed.len(),
        guard.stats()
    );
}

#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn raw_sql_of_every_kind_is_forgotten_or_held_exactly_across_restarts(pool: PgPool) {
    let (url, _slot) = log_fed(&pool).await;
    exec(
        &pool,
        "insert into items (key) select 'k' || g from generate_series(0, 199) g",
    )
    .await;
    let mut seen: BTreeSet<String> = (0..200).map(|i| format!("k{i}")).collect();
    let mut rng = seeded("BLOOM_GUARD_SOAK_SEED");
    let (a, _a) = log_followed(&pool, &url).await;
    let (mut b, mut b_task) = log_followed(&pool, &url).await;
    for round in 0..6 {
        for _ in 0..40 {
            random_write(&pool, &mut rng, &mut seen).await;
        }
        tokio::time::sleep(Duration::from_millis(60)).await;
        answers_as_the_table("a", &a, &pool, &seen).await;
        answers_as_the_table("b", &b, &pool, &seen).await;
        if round % 2 == 0 {
            // B starts again while writes go on: it adopts A's snapshot or
            // scans at a point of the log, and catches up from there.
            drop(b_task);
            let writes = tokio::spawn({
                let (pool, mut seen) = (pool.clone(), seen.clone());
                let mut rng = fastrand::Rng::with_seed(rng.u64(..));
                async move {
                    for _ in 0..20 {
                        random_write(&pool, &mut rng, &mut seen).await;
                    }
                    seen
                }
            });
            (b, b_task) = log_followed(&pool, &url).await;
            seen = writes.await.expect("the writes");
        }
    }
    assert!(a.stats().deletes_applied > 0, "{:?}", a.stats());
}
