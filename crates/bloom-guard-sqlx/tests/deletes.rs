//! Deletes applied from the feed, checked against the table: a random SQL
//! workload (rows of one key twice, deletes by id and by key, keys changed
//! and swapped by one UPDATE, MERGE, COPY, DELETE and INSERT again in one
//! transaction, rollbacks, TRUNCATE; on MySQL `REPLACE`, `INSERT ...
//! SELECT` and transactions that commit after later ones) on Postgres,
//! SQLite and MySQL, with two
//! instances, restarts that adopt a snapshot, and rebuilds in between. At
//! every checkpoint each key ever seen is asked through the guard's layer,
//! as a request would be: a key with a row is never refused, and a key
//! without one is refused but for the false-positive rate.
//!
//! `BLOOM_GUARD_SOAK_OPS` sets the number of statements (default 240); the
//! seed is printed, and `BLOOM_GUARD_SOAK_SEED` replays one.

mod common;

use std::collections::BTreeSet;
use std::str::FromStr;
use std::time::Duration;

use axum::body::Body;
use bloom_guard::{
    extract::PathParam,
    stats::{FilterKind, FilterOrigin},
    BloomGuard,
};
use bloom_guard_sqlx::{mysql, postgres, sqlite, FleetRebuild, Watch};
use common::*;
use http::StatusCode;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use sqlx::{MySqlPool, PgPool, SqlitePool};
use tower::ServiceExt as _;

/// The target false-positive rate of the test's guards.
const FPP: f64 = 0.01;

fn ops() -> usize {
    std::env::var("BLOOM_GUARD_SOAK_OPS")
        .ok()
        .and_then(|ops| ops.parse().ok())
        .unwrap_or(240)
}

fn rng() -> fastrand::Rng {
    common::seeded("BLOOM_GUARD_SOAK_SEED")
}

fn guard() -> BloomGuard {
    BloomGuard::builder()
        .name("things")
        .expected_items(500)
        .false_positive_rate(FPP)
        // The write path's journal would find a deleted key for a while.
        .write_window(Duration::from_millis(50))
        // A loaded machine (CI) must not turn refusals into timeouts.
        .read_barrier_timeout(Duration::from_secs(10))
        .build()
}

/// The status of `GET /things/{key}` through `guard`, in front of a
/// handler that finds every key: 404 is the guard's refusal.
async fn status(guard: &BloomGuard, key: &str) -> StatusCode {
    let app = axum::Router::new()
        .route("/things/{key}", axum::routing::get(|| async { "a thing" }))
        .route_layer(guard.layer(PathParam("key")));
    let request = http::Request::get(format!("/things/{key}"))
        .body(Body::empty())
        .expect("a request");
    app.oneshot(request).await.expect("infallible").status()
}

/// Returns once `guard`'s filter holds every change committed before the
/// call: a refusal waits for a feed read that began after its request, so
/// the first absent key refused is that read. A delete not read yet lets
/// its key through, which is the guard failing open, not keeping it.
async fn synced(guard: &BloomGuard) {
    for n in 0..20 {
        if status(guard, &format!("sync-{n}")).await == StatusCode::NOT_FOUND {
            return;
        }
    }
    panic!("no key refused: {:?}", guard.stats());
}

/// Asks `guard` for every key ever seen, once it has read every change: no
/// key with a row refused, and the keys without one refused but for twice
/// the target rate. Returns how many absent keys were asked.
async fn check(
    name: &str,
    guard: &BloomGuard,
    seen: &BTreeSet<String>,
    table: &BTreeSet<String>,
) -> usize {
    synced(guard).await;
    let (mut absent, mut passed) = (0, Vec::new());
    for key in seen {
        // A request whose barrier read did not come in time (a loaded
        // machine) passed without an answer from the filter: asked again,
        // a few times, so only the filter's answer counts.
        let mut refused = false;
        for _ in 0..5 {
            let timeouts = guard.stats().barrier_timeouts;
            refused = status(guard, key).await == StatusCode::NOT_FOUND;
            if refused || guard.stats().barrier_timeouts == timeouts {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if table.contains(key) {
            assert!(
                !refused,
                "{name}: a false negative for {key:?}; {:?}",
                guard.stats()
            );
        } else {
            absent += 1;
            if !refused {
                passed.push(key);
            }
        }
    }
    // Twice the target rate, and two keys more. Deleted keys passed beyond
    // the rate when the check did not wait for a read (deletes not read
    // yet, on a loaded machine) and when an adopted snapshot also took the
    // rows its catch-up read again (counted twice, their deletes left the
    // key): both fixed. A delete not applied at all, or applied twice,
    // shows far above this.
    let allowed = (absent as f64 * 2.0 * FPP).ceil() as usize + 2;
    assert!(
        passed.len() <= allowed,
        "{name}: {} of {absent} deleted keys passed (allowed {allowed}): {passed:?}; {:?}",
        passed.len(),
        guard.stats()
    );
    absent
}

/// One random statement (or transaction) of the workload against the
/// `things` table; `write` is instance A's write path, which inserts into
/// its guard before the row commits.
#[derive(Debug, Clone, Copy)]
enum Op {
    Insert,
    InsertTwice,
    DeleteRow,
    DeleteKey,
    ChangeKey,
    Swap,
    DeleteAndInsertAgain,
    RolledBack,
    Merge,
    Copy,
    Truncate,
}

fn pick(rng: &mut fastrand::Rng, postgres: bool) -> Op {
    let ops: &[Op] = if postgres {
        &[
            Op::Insert,
            Op::Insert,
            Op::Insert,
            Op::InsertTwice,
            Op::DeleteRow,
            Op::DeleteRow,
            Op::DeleteKey,
            Op::ChangeKey,
            Op::Swap,
            Op::DeleteAndInsertAgain,
            Op::RolledBack,
            Op::Merge,
            Op::Copy,
        ]
    } else {
        &[
            Op::Insert,
            Op::Insert,
            Op::Insert,
            Op::InsertTwice,
            Op::DeleteRow,
            Op::DeleteRow,
            Op::DeleteKey,
            Op::ChangeKey,
            Op::Swap,
            Op::DeleteAndInsertAgain,
            Op::RolledBack,
        ]
    };
    if rng.usize(..400) == 0 {
        return Op::Truncate;
    }
    ops[rng.usize(..ops.len())]
}

fn key(rng: &mut fastrand::Rng) -> String {
    format!("k{}", rng.usize(..400))
}

/// The table's keys, and its row ids.
async fn pg_table(pool: &PgPool) -> (BTreeSet<String>, Vec<i64>) {
    let rows: Vec<(i64, String)> = sqlx::query_as("select id, key from things")
        .fetch_all(pool)
        .await
        .expect("rows");
    (
        rows.iter().map(|(_, key)| key.clone()).collect(),
        rows.iter().map(|(id, _)| *id).collect(),
    )
}

/// Runs one step; whether it truncated the table.
async fn pg_step(
    pool: &PgPool,
    writer: &BloomGuard,
    rng: &mut fastrand::Rng,
    seen: &mut BTreeSet<String>,
) -> bool {
    let (_, ids) = pg_table(pool).await;
    let id = |rng: &mut fastrand::Rng| ids.get(rng.usize(..ids.len().max(1))).copied().unwrap_or(0);
    let (k, other) = (key(rng), key(rng));
    seen.insert(k.clone());
    seen.insert(other.clone());
    let op = pick(rng, true);
    let sql = match op {
        Op::Insert => {
            writer.insert(&k);
            format!("insert into things (key) values ('{k}')")
        }
        Op::InsertTwice => format!("insert into things (key) values ('{k}'), ('{k}')"),
        Op::DeleteRow => format!("delete from things where id = {}", id(rng)),
        Op::DeleteKey => format!("delete from things where key = '{k}'"),
        Op::ChangeKey => format!("update things set key = '{k}' where id = {}", id(rng)),
        Op::Swap => {
            let (a, b) = (id(rng), id(rng));
            format!(
                "update things t set key = s.key from things s
                 where (t.id, s.id) in (({a}, {b}), ({b}, {a}))"
            )
        }
        Op::DeleteAndInsertAgain => format!(
            "begin; delete from things where key = '{k}'; insert into things (key) values ('{k}'); commit"
        ),
        Op::RolledBack => {
            writer.insert(&k);
            format!(
                "begin; insert into things (key) values ('{k}'); delete from things where key = '{other}'; rollback"
            )
        }
        Op::Merge => format!(
            // Distinct: MERGE refuses to touch a row twice when both are one key.
            "merge into things t using (select distinct key from (values ('{k}'), ('{other}')) v(key)) s on t.key = s.key
             when matched and t.key = '{k}' then delete
             when matched then update set key = '{k}'
             when not matched then insert (key) values (s.key)"
        ),
        Op::Copy => {
            eprintln!("copy things (key): {k}, {other}, {k}");
            let mut copy = pool
                .acquire()
                .await
                .expect("a connection")
                .detach();
            let mut sink = copy
                .copy_in_raw("copy things (key) from stdin")
                .await
                .expect("copy");
            sink.send(format!("{k}\n{other}\n{k}\n").into_bytes())
                .await
                .expect("rows");
            sink.finish().await.expect("copy done");
            return false;
        }
        Op::Truncate => "truncate things".to_owned(),
    };
    // Shown with a failure: the statements that led to it.
    eprintln!("{sql}");
    exec(pool, &sql).await;
    matches!(op, Op::Truncate)
}

/// After a TRUNCATE, each instance rebuilds (a truncation records no
/// row's delete): waits until the filter in use is newer than it.
async fn rebuilt_since(guard: &BloomGuard, truncated: Option<std::time::Instant>) {
    let Some(at) = truncated else {
        return;
    };
    wait_until(
        "a rebuild after the truncation",
        Duration::from_secs(20),
        || {
            guard
                .stats()
                .age_ms
                .is_some_and(|age| u128::from(age) < at.elapsed().as_millis())
        },
    )
    .await;
}

/// A guard following `things` by its triggers, or on the log feed given
/// the database's URL.
async fn pg_followed(pool: &PgPool, instance: &str, log: Option<&str>) -> (BloomGuard, Running) {
    macro_rules! fast {
        ($follower:expr) => {
            $follower
                .check_interval(Duration::from_millis(200))
                .poll_interval(Duration::from_millis(200))
                .min_read_gap(Duration::from_millis(5))
                .snapshot_interval(Duration::from_secs(1))
                .instance_id(instance)
        };
    }
    let guard = guard();
    let task = match log {
        #[cfg(feature = "log-feed")]
        Some(url) => spawn(fast!(bloom_guard_sqlx::postgres::log::Follower::new(
            guard.clone(),
            pool.clone(),
            things(),
            url
        ))),
        _ => spawn(fast!(postgres::Follower::new(
            guard.clone(),
            pool.clone(),
            things()
        ))),
    };
    wait_until("ready", Duration::from_secs(20), || guard.is_ready()).await;
    (guard, task)
}

fn things() -> Watch {
    Watch::table("things").key("key")
}

#[sqlx::test]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn postgres_the_guard_forgets_deleted_keys_and_never_refuses_a_stored_one(pool: PgPool) {
    postgres_forgets_deleted_keys(pool, None).await;
}

/// The same workload with `things` on the log feed (its replica identity
/// `FULL`, as its key is not unique).
#[cfg(feature = "log-feed")]
#[sqlx::test]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn postgres_on_the_log_feed_the_guard_forgets_deleted_keys_and_never_refuses_a_stored_one(
    pool: PgPool,
) {
    let url = common::log::url_of(&pool).await;
    let _slot = common::log::SlotGuard { url: url.clone() };
    postgres_forgets_deleted_keys(pool, Some(url)).await;
}

async fn postgres_forgets_deleted_keys(pool: PgPool, log: Option<String>) {
    exec(
        &pool,
        "create table things (id bigint generated always as identity primary key, key text not null);
         create index on things (key)",
    )
    .await;
    bloom_guard_sqlx::postgres::install(&pool)
        .await
        .expect("install");
    match &log {
        #[cfg(feature = "log-feed")]
        Some(_) => {
            exec(&pool, "alter table things replica identity full").await;
            things().install_log(&pool).await.expect("on the log feed");
        }
        _ => things().install(&pool).await.expect("watch"),
    }
    let rebuild = |guard: &BloomGuard| match &log {
        #[cfg(feature = "log-feed")]
        Some(url) => FleetRebuild::log(guard.clone(), pool.clone(), things(), url),
        _ => FleetRebuild::new(guard.clone(), pool.clone(), things()),
    };
    exec(
        &pool,
        "insert into things (key) select 'k' || g from generate_series(0, 199) g",
    )
    .await;
    let mut rng = rng();
    let mut seen: BTreeSet<String> = (0..200).map(|i| format!("k{i}")).collect();
    let (a, _a) = pg_followed(&pool, "a", log.as_deref()).await;
    let (mut b, mut b_task) = pg_followed(&pool, "b", log.as_deref()).await;
    let (mut adopted, mut rebuilt, mut absent, mut applied) = (false, 0, 0, 0);
    let mut truncated = None;
    for step in 0..ops() {
        if pg_step(&pool, &a, &mut rng, &mut seen).await {
            eprintln!("step {step}: truncated");
            truncated = Some(std::time::Instant::now());
        }
        if step % 30 == 29 {
            // Past A's write window: its journal no longer speaks.
            tokio::time::sleep(Duration::from_millis(60)).await;
            rebuilt_since(&a, truncated).await;
            rebuilt_since(&b, truncated.take()).await;
            applied = applied.max(a.stats().deletes_applied + b.stats().deletes_applied);
            let (table, _) = pg_table(&pool).await;
            eprintln!("step {step}: checking");
            check("a", &a, &seen, &table).await;
            absent += check("b", &b, &seen, &table).await;
            match (step / 30) % 3 {
                // B restarts: it adopts the newest snapshot, or scans.
                0 => {
                    drop(b_task);
                    (b, b_task) = pg_followed(&pool, "b", log.as_deref()).await;
                    adopted |= b.stats().origin == Some(FilterOrigin::Snapshot);
                }
                // A rebuild for the fleet, as the admin endpoint runs it.
                1 => {
                    rebuild(&a).rebuild().await.expect("rebuild");
                    rebuilt += 1;
                }
                _ => {}
            }
        }
    }
    let (table, _) = pg_table(&pool).await;
    check("a", &a, &seen, &table).await;
    absent += check("b", &b, &seen, &table).await;
    let stats = b.stats();
    assert_eq!(stats.filter_kind, Some(FilterKind::Counting));
    assert!(
        absent > 0 && rebuilt > 0,
        "absent {absent}, rebuilt {rebuilt}"
    );
    assert!(adopted, "no restart adopted a snapshot");
    assert!(applied > 0, "no delete was applied from the feed");
}

async fn sqlite_table(pool: &SqlitePool) -> (BTreeSet<String>, Vec<i64>) {
    let rows: Vec<(i64, String)> = sqlx::query_as("select id, key from things")
        .fetch_all(pool)
        .await
        .expect("rows");
    (
        rows.iter().map(|(_, key)| key.clone()).collect(),
        rows.iter().map(|(id, _)| *id).collect(),
    )
}

async fn sqlite_exec(pool: &SqlitePool, sql: &str) {
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
        .execute(pool)
        .await
        .unwrap_or_else(|error| panic!("{sql}: {error}"));
}

async fn sqlite_step(
    pool: &SqlitePool,
    writer: &BloomGuard,
    rng: &mut fastrand::Rng,
    seen: &mut BTreeSet<String>,
) {
    let (_, ids) = sqlite_table(pool).await;
    let id = |rng: &mut fastrand::Rng| ids.get(rng.usize(..ids.len().max(1))).copied().unwrap_or(0);
    let (k, other) = (key(rng), key(rng));
    seen.insert(k.clone());
    seen.insert(other.clone());
    let sql = match pick(rng, false) {
        Op::Insert => {
            writer.insert(&k);
            format!("insert into things (key) values ('{k}')")
        }
        Op::InsertTwice => format!("insert into things (key) values ('{k}'), ('{k}')"),
        Op::DeleteRow => format!("delete from things where id = {}", id(rng)),
        Op::DeleteKey => format!("delete from things where key = '{k}'"),
        Op::ChangeKey => format!("update things set key = '{k}' where id = {}", id(rng)),
        Op::Swap => {
            let (a, b) = (id(rng), id(rng));
            format!(
                "update things set key = case id
                    when {a} then (select key from things where id = {b})
                    else (select key from things where id = {a}) end
                 where id in ({a}, {b}) and (select count(*) from things where id in ({a}, {b})) = 2"
            )
        }
        Op::DeleteAndInsertAgain => format!(
            "begin; delete from things where key = '{k}'; insert into things (key) values ('{k}'); commit"
        ),
        Op::RolledBack => {
            writer.insert(&k);
            format!(
                "begin; insert into things (key) values ('{k}'); delete from things where key = '{other}'; rollback"
            )
        }
        Op::Truncate => "delete from things".to_owned(),
        Op::Merge | Op::Copy => unreachable!("Postgres only"),
    };
    // Shown with a failure: the statements that led to it.
    eprintln!("{sql}");
    sqlite_exec(pool, &sql).await;
}

async fn sqlite_followed(pool: &SqlitePool) -> (BloomGuard, tokio::task::JoinHandle<()>) {
    let guard = guard();
    let follower = sqlite::Follower::new(guard.clone(), pool.clone(), things())
        .check_interval(Duration::from_millis(200))
        .poll_interval(Duration::from_millis(200))
        .snapshot_interval(Duration::from_secs(1));
    let task = tokio::spawn(follower.run());
    wait_until("ready", Duration::from_secs(20), || guard.is_ready()).await;
    (guard, task)
}

#[tokio::test]
async fn sqlite_the_guard_forgets_deleted_keys_and_never_refuses_a_stored_one() {
    let dir = std::env::temp_dir().join(format!("bloom-guard-deletes-{}", fastrand::u64(..)));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("things.db");
    let open = || async {
        let options = SqliteConnectOptions::from_str(&format!("sqlite://{}", path.display()))
            .expect("options")
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal);
        SqlitePoolOptions::new()
            .max_connections(2)
            .connect_with(options)
            .await
            .expect("open")
    };
    let (first, second) = (open().await, open().await);
    sqlite_exec(
        &first,
        "create table things (id integer primary key, key text not null);
         create index things_key on things (key)",
    )
    .await;
    things().install(&first).await.expect("install");
    for i in 0..200 {
        sqlite_exec(&first, &format!("insert into things (key) values ('k{i}')")).await;
    }
    let mut rng = rng();
    let mut seen: BTreeSet<String> = (0..200).map(|i| format!("k{i}")).collect();
    let (a, a_task) = sqlite_followed(&first).await;
    let (mut b, mut b_task) = sqlite_followed(&second).await;
    let (mut rebuilt, mut absent, mut applied) = (0, 0, 0);
    for step in 0..ops() {
        sqlite_step(&first, &a, &mut rng, &mut seen).await;
        if step % 30 == 29 {
            tokio::time::sleep(Duration::from_millis(60)).await;
            applied = applied.max(a.stats().deletes_applied + b.stats().deletes_applied);
            let (table, _) = sqlite_table(&first).await;
            eprintln!("step {step}: checking");
            check("a", &a, &seen, &table).await;
            absent += check("b", &b, &seen, &table).await;
            match (step / 30) % 3 {
                0 => {
                    b_task.abort();
                    (b, b_task) = sqlite_followed(&second).await;
                }
                1 => {
                    FleetRebuild::sqlite(a.clone(), first.clone(), things())
                        .rebuild()
                        .await
                        .expect("rebuild");
                    rebuilt += 1;
                }
                _ => {}
            }
        }
    }
    let (table, _) = sqlite_table(&first).await;
    check("a", &a, &seen, &table).await;
    absent += check("b", &b, &seen, &table).await;
    assert!(
        absent > 0 && rebuilt > 0,
        "absent {absent}, rebuilt {rebuilt}"
    );
    assert!(applied > 0, "no delete was applied from the feed");
    a_task.abort();
    b_task.abort();
    let _ = std::fs::remove_dir_all(&dir);
}

/// The MySQL table's keys, and its row ids.
async fn mysql_table(pool: &MySqlPool) -> (BTreeSet<String>, Vec<i64>) {
    let rows: Vec<(i64, String)> = sqlx::query_as("select id, cast(code as char) from things")
        .fetch_all(pool)
        .await
        .expect("rows");
    (
        rows.iter().map(|(_, key)| key.clone()).collect(),
        rows.iter().map(|(id, _)| *id).collect(),
    )
}

async fn mysql_exec(pool: &MySqlPool, sql: &str) {
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
        .execute(pool)
        .await
        .unwrap_or_else(|error| panic!("{sql}: {error}"));
}

/// A transaction that took its feed id and has not committed: it commits
/// after the next step's statement took later ones.
type Late = Option<sqlx::pool::PoolConnection<sqlx::MySql>>;

async fn commit_late(late: &mut Late) {
    if let Some(mut conn) = late.take() {
        sqlx::raw_sql("commit")
            .execute(&mut *conn)
            .await
            .expect("the late commit");
    }
}

/// Runs one step; whether it truncated the table.
async fn mysql_step(
    pool: &MySqlPool,
    writer: &BloomGuard,
    rng: &mut fastrand::Rng,
    seen: &mut BTreeSet<String>,
    late: &mut Late,
) -> bool {
    let (_, ids) = mysql_table(pool).await;
    let id = |rng: &mut fastrand::Rng| ids.get(rng.usize(..ids.len().max(1))).copied().unwrap_or(0);
    let (k, other) = (key(rng), key(rng));
    seen.insert(k.clone());
    seen.insert(other.clone());
    let op = if late.is_some() {
        Op::Insert
    } else {
        pick(rng, true)
    };
    let sql = match op {
        Op::Insert => {
            writer.insert(&k);
            format!("insert into things (code) values ('{k}')")
        }
        Op::InsertTwice => format!("insert into things (code) values ('{k}'), ('{k}')"),
        Op::DeleteRow => format!("delete from things where id = {}", id(rng)),
        Op::DeleteKey => format!("delete from things where code = '{k}'"),
        Op::ChangeKey => format!("update things set code = '{k}' where id = {}", id(rng)),
        Op::Swap => {
            let (a, b) = (id(rng), id(rng));
            format!(
                "update things t join (select id, code from things where id in ({a}, {b})) s
                    on s.id = if(t.id = {a}, {b}, {a})
                   set t.code = s.code
                 where t.id in ({a}, {b})"
            )
        }
        Op::DeleteAndInsertAgain => format!(
            "begin; delete from things where code = '{k}'; insert into things (code) values ('{k}'); commit"
        ),
        Op::RolledBack => {
            writer.insert(&k);
            format!(
                "begin; insert into things (code) values ('{k}'); delete from things where code = '{other}'; rollback"
            )
        }
        // MySQL's upsert of a row: the row of that id deleted, a new one
        // inserted.
        Op::Merge => format!("replace into things (id, code) values ({}, '{k}')", id(rng)),
        // A transaction that takes its feed ids now and commits after the
        // next statement's: plain inserts, which lock no gap, and the next
        // statement an insert too, which waits on none.
        Op::Copy => {
            commit_late(late).await;
            let mut conn = pool.acquire().await.expect("a connection");
            sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                "begin; insert into things (code) values ('{k}'), ('{other}')"
            )))
            .execute(&mut *conn)
            .await
            .expect("the late transaction");
            *late = Some(conn);
            return false;
        }
        Op::Truncate => "truncate things".to_owned(),
    };
    // Shown with a failure: the statements that led to it.
    eprintln!("{sql}");
    mysql_exec(pool, &sql).await;
    if late.is_some() {
        // The followers read this statement's ids first.
        tokio::time::sleep(Duration::from_millis(50)).await;
        commit_late(late).await;
    }
    matches!(op, Op::Truncate)
}

/// After a TRUNCATE on MySQL, which records no row and is seen by the
/// trigger check (every 200 ms here) as a new table id: waits until the
/// guard rebuilt from the table as it is now, forgetting what the
/// truncation removed (but for the rate).
async fn mysql_rebuilt_since(
    guard: &BloomGuard,
    truncated: Option<std::time::Instant>,
    seen: &BTreeSet<String>,
    table: &BTreeSet<String>,
) {
    if truncated.is_none() {
        return;
    }
    let absent: Vec<&String> = seen.iter().filter(|key| !table.contains(*key)).collect();
    let allowed = (absent.len() as f64 * 2.0 * FPP).ceil() as usize + 2;
    wait_until(
        "a rebuild after the truncation",
        Duration::from_secs(20),
        || {
            guard.stats().state == bloom_guard::stats::GuardState::Ready
                && absent.iter().filter(|key| guard.may_contain(key)).count() <= allowed
        },
    )
    .await;
}

async fn mysql_followed(
    pool: &MySqlPool,
    instance: &str,
    log: Option<&str>,
) -> (BloomGuard, Running) {
    let guard = guard();
    let fast = |follower: bloom_guard_sqlx::mysql::Follower| {
        follower
            .check_interval(Duration::from_millis(200))
            .poll_interval(Duration::from_millis(200))
            .snapshot_interval(Duration::from_secs(1))
            .instance_id(instance)
    };
    let task = match log {
        #[cfg(feature = "binlog-feed")]
        Some(url) => spawn(
            mysql::log::Follower::new(guard.clone(), pool.clone(), mysql_things(), url)
                // The filter's own answers are under test: a refusal that
                // looked its key up in the table would hide a key missing
                // from it, and `synced` needs refusals that wait for reads.
                .look_up_refusals(false)
                .check_interval(Duration::from_millis(200))
                .poll_interval(Duration::from_millis(200))
                .snapshot_interval(Duration::from_secs(1))
                .instance_id(instance),
        ),
        _ => spawn(fast(mysql::Follower::new(
            guard.clone(),
            pool.clone(),
            mysql_things(),
        ))),
    };
    wait_until("ready", Duration::from_secs(20), || guard.is_ready()).await;
    (guard, task)
}

fn mysql_things() -> Watch {
    Watch::table("things").key("code")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(mysql_database), ignore = "needs MySQL or MariaDB: set MYSQL_URL")]
async fn mysql_the_guard_forgets_deleted_keys_and_never_refuses_a_stored_one() {
    mysql_forgets_deleted_keys(false).await;
}

#[cfg(feature = "binlog-feed")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(mysql_database), ignore = "needs MySQL or MariaDB: set MYSQL_URL")]
async fn mysql_on_the_binary_log_the_guard_forgets_deleted_keys_and_never_refuses_a_stored_one() {
    mysql_forgets_deleted_keys(true).await;
}

async fn mysql_forgets_deleted_keys(log: bool) {
    // The feed's warnings in the test's output.
    let _ = tracing_subscriber::fmt()
        .with_env_filter("bloom_guard_sqlx=info")
        .with_test_writer()
        .try_init();
    let pool = common::mysql::fresh(8).await;
    let url = log.then(|| {
        let url = std::env::var("MYSQL_URL").expect("MYSQL_URL");
        let (base, _) = url
            .rsplit_once('/')
            .map(|(base, rest)| (base.to_owned(), rest.to_owned()))
            .expect("a database in MYSQL_URL");
        base
    });
    let url = match url {
        Some(base) => Some(format!("{base}/{}", common::mysql::database(&pool).await)),
        None => None,
    };
    let log = url.as_deref();
    // A second pool: instance B's own connections.
    let other = common::mysql::with_isolation(&pool, "repeatable read", 4).await;
    mysql_exec(
        &pool,
        "create table things (id bigint auto_increment primary key,
                              code varchar(100) collate utf8mb4_nopad_bin not null,
                              key things_code (code))",
    )
    .await;
    match log {
        #[cfg(feature = "binlog-feed")]
        Some(_) => mysql_things().install_log(&pool).await.expect("watch"),
        _ => mysql_things().install(&pool).await.expect("watch"),
    }
    let values: Vec<String> = (0..200).map(|i| format!("('k{i}')")).collect();
    mysql_exec(
        &pool,
        &format!("insert into things (code) values {}", values.join(", ")),
    )
    .await;
    let mut rng = rng();
    let mut seen: BTreeSet<String> = (0..200).map(|i| format!("k{i}")).collect();
    let (a, _a) = mysql_followed(&pool, "a", log).await;
    let (mut b, mut b_task) = mysql_followed(&other, "b", log).await;
    let (mut adopted, mut rebuilt, mut absent, mut applied) = (false, 0, 0, 0);
    let (mut truncated, mut late) = (None, None);
    for step in 0..ops() {
        if mysql_step(&pool, &a, &mut rng, &mut seen, &mut late).await {
            truncated = Some(std::time::Instant::now());
        }
        if step % 30 == 29 {
            commit_late(&mut late).await;
            tokio::time::sleep(Duration::from_millis(60)).await;
            let (table, _) = mysql_table(&pool).await;
            mysql_rebuilt_since(&a, truncated, &seen, &table).await;
            mysql_rebuilt_since(&b, truncated.take(), &seen, &table).await;
            applied = applied.max(a.stats().deletes_applied + b.stats().deletes_applied);
            eprintln!("step {step}: checking");
            check("a", &a, &seen, &table).await;
            absent += check("b", &b, &seen, &table).await;
            match (step / 30) % 3 {
                0 => {
                    drop(b_task);
                    (b, b_task) = mysql_followed(&other, "b", log).await;
                    adopted |= b.stats().origin == Some(FilterOrigin::Snapshot);
                }
                1 => {
                    let rebuild = match log {
                        #[cfg(feature = "binlog-feed")]
                        Some(url) => {
                            FleetRebuild::mysql_log(a.clone(), pool.clone(), mysql_things(), url)
                        }
                        _ => FleetRebuild::mysql(a.clone(), pool.clone(), mysql_things()),
                    };
                    rebuild.rebuild().await.expect("rebuild");
                    rebuilt += 1;
                }
                _ => {}
            }
        }
    }
    commit_late(&mut late).await;
    tokio::time::sleep(Duration::from_millis(60)).await;
    let (table, _) = mysql_table(&pool).await;
    mysql_rebuilt_since(&a, truncated, &seen, &table).await;
    mysql_rebuilt_since(&b, truncated, &seen, &table).await;
    check("a", &a, &seen, &table).await;
    absent += check("b", &b, &seen, &table).await;
    assert_eq!(b.stats().filter_kind, Some(FilterKind::Counting));
    assert!(
        absent > 0 && rebuilt > 0,
        "absent {absent}, rebuilt {rebuilt}"
    );
    assert!(adopted, "no restart adopted a snapshot");
    assert!(applied > 0, "no delete was applied from the feed");
}

/// Trigger functions an earlier schema version wrote (kept by an install
/// whose role did not own them) may record a row twice or two rows once:
/// the follower then passes no deletes to the filter, which keeps their
/// keys, until the functions are written again.
#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn with_trigger_functions_of_an_earlier_version_no_delete_is_applied(pool: PgPool) {
    install(&pool).await;
    let counts = || async {
        sqlx::query_scalar::<_, bool>("select bloom_guard.counts_rows('items')")
            .fetch_one(&pool)
            .await
            .expect("counts_rows")
    };
    assert!(counts().await);
    // The delete function as an earlier version left it (its body without
    // this version's mark).
    exec(
        &pool,
        "do $$
         declare
             f name := bloom_guard.record_function('items', array['key'], 'deleted');
             src text;
         begin
             select p.prosrc into src from pg_proc p where p.proname = f;
             execute format('create or replace function bloom_guard.%I() returns trigger
                             language plpgsql security definer as %L',
                            f, replace(src, 'rows counted (7)', 'an earlier version'));
         end $$",
    )
    .await;
    assert!(!counts().await);
    exec(&pool, "insert into items (key) values ('a'), ('b')").await;
    let (guard, _task) = followed(&pool).await;
    exec(&pool, "delete from items where key = 'a'").await;
    wait_until("the delete read", Duration::from_secs(5), || {
        guard.stats().feed.is_some_and(|feed| feed.changes >= 1)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        guard.may_contain("a"),
        "a delete counted by old functions was applied"
    );
    assert_eq!(guard.stats().deletes_applied, 0);
    // Watched again by their owner: this version's functions (and a
    // rebuild, as after any watch); deletes are applied once the check
    // sees them.
    items().install(&pool).await.expect("watch again");
    assert!(counts().await);
    tokio::time::sleep(Duration::from_millis(500)).await;
    exec(&pool, "delete from items where key = 'b'").await;
    wait_until("b refused", Duration::from_secs(10), || {
        guard.stats().state == bloom_guard::stats::GuardState::Ready && !guard.may_contain("b")
    })
    .await;
}
