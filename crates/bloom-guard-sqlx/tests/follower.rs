//! Keeping filters true while data changes, on a real Postgres: rebuilds
//! racing writers, followers on one database, lost notifications.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bloom_guard::{BloomGuard, State};
use bloom_guard_sqlx::{PgCopySource, PgFollower, LISTENER_APPLICATION_NAME};
use sqlx::PgPool;

const KEY_QUERY: &str = "select key from items";

fn guard() -> BloomGuard {
    BloomGuard::builder().expected_items(1000).build()
}

/// A guard kept true by a follower with a fast heartbeat.
async fn followed(pool: &PgPool) -> (BloomGuard, tokio::task::JoinHandle<()>) {
    let guard = guard();
    let follower = PgFollower::new(guard.clone(), pool.clone(), KEY_QUERY)
        .heartbeat(Duration::from_millis(300));
    let task = tokio::spawn(follower.run());
    wait_until("the first warm-up", Duration::from_secs(10), || {
        guard.is_ready()
    })
    .await;
    (guard, task)
}

async fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + limit;
    while !done() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Whether the guard answers from its filter (not failing open) and holds every key.
fn holds_all(guard: &BloomGuard, keys: &[String]) -> bool {
    guard.stats().state == State::Ready && keys.iter().all(|key| guard.may_contain(key))
}

async fn kill_listeners(pool: &PgPool) -> u64 {
    sqlx::query(
        "select pg_terminate_backend(pid) from pg_stat_activity
         where application_name = $1 and datname = current_database()",
    )
    .bind(LISTENER_APPLICATION_NAME)
    .execute(pool)
    .await
    .expect("terminate listeners")
    .rows_affected()
}

async fn insert(pool: &PgPool, keys: &[String]) {
    sqlx::query("insert into items (key) select * from unnest($1::text[])")
        .bind(keys)
        .execute(pool)
        .await
        .expect("insert");
}

#[sqlx::test(migrations = "../../migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn rebuilds_racing_writers_lose_no_committed_key(pool: PgPool) {
    // Enough rows that each scan takes a while and writes land during it.
    let filler: Vec<String> = (0..50_000).map(|i| format!("filler-{i}")).collect();
    insert(&pool, &filler).await;
    let guard = guard();
    guard
        .rebuild(&PgCopySource::new(pool.clone(), KEY_QUERY))
        .await
        .expect("first build");
    let committed = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..4)
        .map(|writer| {
            let (guard, pool, committed, stop) =
                (guard.clone(), pool.clone(), committed.clone(), stop.clone());
            tokio::spawn(async move {
                let mut i = 0;
                while !stop.load(Ordering::SeqCst) {
                    let key = format!("writer-{writer}-{i}");
                    i += 1;
                    // The write path: into the guard, then a transaction that
                    // takes a while to commit.
                    guard.insert(&key);
                    let mut tx = pool.begin().await.expect("begin");
                    tokio::time::sleep(Duration::from_micros(fastrand::u64(0..3000))).await;
                    sqlx::query("insert into items (key) values ($1)")
                        .bind(&key)
                        .execute(&mut *tx)
                        .await
                        .expect("insert");
                    tokio::time::sleep(Duration::from_micros(fastrand::u64(0..3000))).await;
                    tx.commit().await.expect("commit");
                    committed.lock().expect("keys").push(key);
                }
            })
        })
        .collect();
    let source = PgCopySource::new(pool.clone(), KEY_QUERY);
    for _ in 0..50 {
        guard.rebuild(&source).await.expect("rebuild");
    }
    stop.store(true, Ordering::SeqCst);
    for writer in writers {
        writer.await.expect("writer");
    }
    let committed = committed.lock().expect("keys").clone();
    assert!(
        committed.len() > 50,
        "the writers barely ran: {}",
        committed.len()
    );
    let lost: Vec<_> = committed
        .iter()
        .filter(|key| !guard.may_contain(key.as_str()))
        .collect();
    assert!(
        lost.is_empty(),
        "{} of {} committed keys lost: {:?}",
        lost.len(),
        committed.len(),
        &lost[..lost.len().min(5)]
    );
    assert_eq!(guard.stats().generation, 51);
}

#[sqlx::test(migrations = "../../migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn two_followers_survive_killed_listeners(pool: PgPool) {
    let (a, _a) = followed(&pool).await;
    let (b, _b) = followed(&pool).await;
    let keys: Vec<String> = (0..100_000).map(|i| format!("key-{i}")).collect();
    let killer = {
        let pool = pool.clone();
        tokio::spawn(async move {
            let mut kills = 0;
            for _ in 0..3 {
                tokio::time::sleep(Duration::from_millis(400)).await;
                kills += kill_listeners(&pool).await;
            }
            kills
        })
    };
    for chunk in keys.chunks(500) {
        insert(&pool, chunk).await;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let kills = killer.await.expect("killer");
    assert!(kills >= 3, "only {kills} listener connections were killed");
    wait_until("both guards to converge", Duration::from_secs(30), || {
        holds_all(&a, &keys) && holds_all(&b, &keys)
    })
    .await;
}

#[sqlx::test(migrations = "../../migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn a_row_that_commits_after_a_catch_up_is_not_missed(pool: PgPool) {
    let guard = guard();
    let catch_ups = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&catch_ups);
    let follower = PgFollower::new(guard.clone(), pool.clone(), KEY_QUERY)
        .heartbeat(Duration::from_millis(300))
        .on_catch_up(move || {
            counter.fetch_add(1, Ordering::SeqCst);
        });
    let _follower = tokio::spawn(follower.run());
    wait_until("the first warm-up", Duration::from_secs(10), || {
        guard.is_ready()
    })
    .await;
    assert_eq!(catch_ups.load(Ordering::SeqCst), 0);
    // T1 takes the first id and stays open.
    let mut t1 = pool.begin().await.expect("begin");
    sqlx::query("insert into items (key) values ('late')")
        .execute(&mut *t1)
        .await
        .expect("insert");
    // T2 takes a later id and commits.
    insert(&pool, &["early".to_owned()]).await;
    // A catch-up runs while T1 is open.
    let generation = guard.stats().generation;
    assert!(kill_listeners(&pool).await >= 1);
    wait_until("the catch-up", Duration::from_secs(10), || {
        let stats = guard.stats();
        stats.generation > generation && stats.state == State::Ready
    })
    .await;
    assert!(guard.may_contain("early"));
    assert!(
        catch_ups.load(Ordering::SeqCst) >= 1,
        "no catch-up hook after a lost listener"
    );
    t1.commit().await.expect("commit");
    wait_until("the late key", Duration::from_secs(5), || {
        holds_all(&guard, &["late".to_owned()])
    })
    .await;
}

#[sqlx::test(migrations = "../../migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn keys_from_any_sql_client_reach_every_follower(pool: PgPool) {
    let (a, _a) = followed(&pool).await;
    let seen = Arc::new(AtomicUsize::new(0));
    let b = guard();
    let counter = Arc::clone(&seen);
    let follower = PgFollower::new(b.clone(), pool.clone(), KEY_QUERY).on_key(move |_| {
        counter.fetch_add(1, Ordering::SeqCst);
    });
    let _b = tokio::spawn(follower.run());
    wait_until("the second warm-up", Duration::from_secs(10), || {
        b.is_ready()
    })
    .await;

    let keys: Vec<String> = ["plain", "tab\there", "new\nline", "back\\slash", "ü/🦀"]
        .map(String::from)
        .to_vec();
    for key in &keys {
        sqlx::query("insert into items (key) values ($1)")
            .bind(key)
            .execute(&pool)
            .await
            .expect("insert");
    }
    wait_until("the keys", Duration::from_secs(1), || {
        holds_all(&a, &keys) && holds_all(&b, &keys)
    })
    .await;
    assert!(seen.load(Ordering::SeqCst) >= keys.len());

    // An update that changes the key announces the new one.
    sqlx::query("update items set key = 'renamed' where key = 'plain'")
        .execute(&pool)
        .await
        .expect("update");
    wait_until("the renamed key", Duration::from_secs(1), || {
        a.may_contain("renamed")
    })
    .await;
}

#[sqlx::test(migrations = "../../migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn an_8000_byte_key_is_inserted_and_reaches_the_filter(pool: PgPool) {
    let (guard, _follower) = followed(&pool).await;
    let long = "é".repeat(4000); // 8000 bytes
    sqlx::query("insert into items (key) values ($1)")
        .bind(&long)
        .execute(&pool)
        .await
        .expect("insert");
    let long = [long];
    wait_until("the long key", Duration::from_secs(2), || {
        holds_all(&guard, &long)
    })
    .await;
}

#[sqlx::test(migrations = "../../migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn a_bulk_load_is_caught_up_with_a_rebuild(pool: PgPool) {
    let (guard, _follower) = followed(&pool).await;
    let generation = guard.stats().generation;
    let keys: Vec<String> = (0..20_000).map(|i| format!("bulk-{i}")).collect();
    insert(&pool, &keys).await;
    wait_until("the bulk keys", Duration::from_secs(10), || {
        holds_all(&guard, &keys)
    })
    .await;
    assert!(guard.stats().generation > generation);
}
