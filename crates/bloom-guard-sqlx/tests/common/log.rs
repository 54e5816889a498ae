//! The log feed's helpers (feature `log-feed`): `items` on the log feed,
//! its slot dropped when the test ends, followers, random raw SQL and the
//! guard's answers compared with the table's.

use std::collections::BTreeSet;
use std::time::Duration;

use bloom_guard::BloomGuard;
use bloom_guard_sqlx::postgres;
use http::StatusCode;
use sqlx::PgPool;

use super::{exec, items, spawn, status, wait_until, Running};

/// The log feed's slot of the test's database, dropped with its reader
/// stopped when the test ends (also when it fails): a slot left behind
/// keeps the server's log, and its database from being dropped.
pub(crate) struct SlotGuard {
    pub(crate) url: String,
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
pub(crate) async fn url_of(pool: &PgPool) -> String {
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
pub(crate) async fn log_fed(pool: &PgPool) -> (String, SlotGuard) {
    let url = url_of(pool).await;
    bloom_guard_sqlx::postgres::install(pool)
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

pub(crate) fn log_guard() -> BloomGuard {
    BloomGuard::builder()
        .expected_items(500)
        .false_positive_rate(0.01)
        .write_window(Duration::from_millis(50))
        .read_barrier_timeout(Duration::from_secs(10))
        .build()
}

/// A guard kept complete by a log feed follower of `items`, once warm.
pub(crate) async fn log_followed(pool: &PgPool, url: &str) -> (BloomGuard, Running) {
    log_followed_as(|guard| {
        postgres::log::Follower::new(guard, pool.clone(), items(), url)
            .check_interval(Duration::from_millis(200))
            .poll_interval(Duration::from_millis(500))
    })
    .await
}

/// A guard kept complete by the log feed follower `follower` makes of
/// it, once warm.
pub(crate) async fn log_followed_as(
    follower: impl FnOnce(BloomGuard) -> postgres::log::Follower,
) -> (BloomGuard, Running) {
    let guard = log_guard();
    let task = spawn(follower(guard.clone()));
    wait_until("the first filter", Duration::from_secs(20), || {
        guard.is_ready()
    })
    .await;
    (guard, task)
}

/// One random statement of raw SQL on `items`.
pub(crate) async fn random_write(
    pool: &PgPool,
    rng: &mut fastrand::Rng,
    seen: &mut BTreeSet<String>,
) {
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
pub(crate) async fn holds_what_the_table_holds(
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

/// Waits until `guard` refuses keys again (a rebuild after a gap in
/// place), then compares its answers with the table's.
pub(crate) async fn holds_what_the_table_holds_once_closed(
    name: &str,
    guard: &BloomGuard,
    pool: &PgPool,
    seen: &BTreeSet<String>,
) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while status(guard, "never-written").await != StatusCode::NOT_FOUND {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{name}: still letting every key through: {:?}",
            guard.stats()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    holds_what_the_table_holds(name, guard, pool, seen).await;
}
