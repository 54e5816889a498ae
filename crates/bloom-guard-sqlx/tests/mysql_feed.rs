//! The MySQL feed under concurrency: transactions that commit after a
//! later id was read, transactions that roll back, many writers at once,
//! deletes and key updates. Checked key by key against the table: a key
//! the table holds is never refused, and every delete is applied once.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bloom_guard::{stats::GuardState, BloomGuard};
use bloom_guard_sqlx::{mysql, Watch};
use common::mysql::{
    busy_transaction_list, client, database, fresh, items, position, with_isolation,
};
use common::{spawn, status, wait_until, Running};
use sqlx::{Connection, MySqlPool};

fn guard() -> BloomGuard {
    BloomGuard::builder()
        .expected_items(20_000)
        .false_positive_rate(0.001)
        .build()
}

async fn followed(pool: &MySqlPool) -> (BloomGuard, Running) {
    let guard = guard();
    let follower = mysql::Follower::new(guard.clone(), pool.clone(), items())
        .check_interval(Duration::from_millis(200))
        .poll_interval(Duration::from_millis(200));
    let running = spawn(follower);
    wait_until("the warm-up", Duration::from_secs(20), || guard.is_ready()).await;
    (guard, running)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(mysql_database), ignore = "needs MySQL or MariaDB: set MYSQL_URL")]
async fn a_transaction_that_commits_after_a_later_id_was_read_is_not_skipped() {
    let pool = fresh(8).await;
    let (guard, _running) = followed(&pool).await;
    // `late` takes its feed id first and commits last.
    let mut late = pool.acquire().await.expect("connection");
    sqlx::raw_sql("begin; insert into items (code) values ('late')")
        .execute(&mut *late)
        .await
        .expect("late insert");
    let mut rolled = pool.acquire().await.expect("connection");
    sqlx::raw_sql("begin; insert into items (code) values ('rolled-back')")
        .execute(&mut *rolled)
        .await
        .expect("insert to roll back");
    sqlx::query("insert into items (code) values ('early')")
        .execute(&pool)
        .await
        .expect("early insert");
    wait_until("the later id", Duration::from_secs(2), || {
        guard.may_contain("early")
    })
    .await;
    // Both ids below the position's highest are kept open.
    let open = position(&guard);
    assert!(open.contains('~'), "no open ids in {open}");
    assert!(!guard.may_contain("late"));
    sqlx::raw_sql("commit")
        .execute(&mut *late)
        .await
        .expect("commit");
    sqlx::raw_sql("rollback")
        .execute(&mut *rolled)
        .await
        .expect("rollback");
    wait_until("the late commit", Duration::from_secs(2), || {
        guard.may_contain("late")
    })
    .await;
    // The rolled-back id settles: the position lets it go.
    wait_until(
        "the rolled-back id to settle",
        Duration::from_secs(5),
        || !position(&guard).contains('~'),
    )
    .await;
    assert!(!guard.may_contain("rolled-back"));
    assert_eq!(guard.stats().state, GuardState::Ready);
}

/// What the table holds: rows per key, as committed (0 for keys deleted,
/// renamed away or only ever rolled back), and the keys a transaction is
/// removing rows of (until its commit is counted).
#[derive(Default)]
struct Model {
    rows: BTreeMap<String, i64>,
    removing: BTreeMap<String, usize>,
}

type Shared = Arc<Mutex<Model>>;

impl Model {
    fn present(&self, key: &str) -> bool {
        self.rows.get(key).is_some_and(|rows| *rows > 0) && !self.removing.contains_key(key)
    }

    fn keys(&self) -> Vec<String> {
        self.rows
            .iter()
            .filter(|(_, rows)| **rows > 0)
            .map(|(key, _)| key.clone())
            .collect()
    }
}

/// One writer's transactions: inserts, deletes, key updates, some held
/// open a while before committing, some rolled back.
async fn writer(pool: MySqlPool, model: Shared, writer: usize, transactions: usize) {
    let mut rng = fastrand::Rng::with_seed(writer as u64);
    for t in 0..transactions {
        let mut conn = pool.acquire().await.expect("connection");
        let mut tx = conn.begin().await.expect("begin");
        let mut changes: Vec<(String, i64)> = Vec::new();
        let mut removing: Vec<String> = Vec::new();
        let written = statements(
            &mut tx,
            &model,
            &mut rng,
            (writer, t),
            &mut changes,
            &mut removing,
        )
        .await;
        // Some transactions stay open while others commit later ids.
        let hold = match rng.u8(..10) {
            0 => rng.u64(100..400),
            1..=3 => rng.u64(1..20),
            _ => 0,
        };
        tokio::time::sleep(Duration::from_millis(hold)).await;
        // A deadlock rolled the transaction back already, as it does for
        // any application: counted as a rollback.
        let commit = written && rng.u8(..5) != 0;
        if commit {
            tx.commit().await.expect("commit");
        } else {
            let _ = tx.rollback().await;
        }
        let mut model = crate::lock(&model);
        for (key, rows) in changes {
            let entry = model.rows.entry(key).or_default();
            if commit {
                *entry += rows;
            }
        }
        for key in removing {
            if let Some(count) = model.removing.get_mut(&key) {
                *count -= 1;
                if *count == 0 {
                    model.removing.remove(&key);
                }
            }
        }
    }
}

/// Whether InnoDB rolled the transaction back to break a deadlock or a
/// lock wait.
fn rolled_back_by_the_server(error: &sqlx::Error) -> bool {
    let number = match error {
        sqlx::Error::Database(error) => error
            .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
            .map(sqlx::mysql::MySqlDatabaseError::number),
        _ => None,
    };
    // Deadlock, lock wait timeout (the writer rolls back the rest).
    matches!(number, Some(1213 | 1205))
}

/// One transaction's statements; false if the server rolled it back.
async fn statements(
    tx: &mut sqlx::MySqlConnection,
    model: &Shared,
    rng: &mut fastrand::Rng,
    (writer, t): (usize, usize),
    changes: &mut Vec<(String, i64)>,
    removing: &mut Vec<String>,
) -> bool {
    for _ in 0..rng.usize(1..4) {
        let known = crate::lock(model).keys();
        let kind = rng.u8(..10);
        let picked = known.get(rng.usize(..known.len().max(1))).cloned();
        let key = match (kind, picked) {
            // A second row of a stored key, now and then.
            (0, Some(key)) | (6..=9, Some(key)) => key,
            (0..=5, _) => format!("w{writer}-{t}-{}", rng.u32(..)),
            _ => continue,
        };
        if kind >= 6 {
            // Marked before the statement: a look at the table meanwhile
            // does not count on this key.
            *crate::lock(model).removing.entry(key.clone()).or_default() += 1;
            removing.push(key.clone());
        }
        let result = match kind {
            0..=5 => sqlx::query("insert into items (code) values (?)")
                .bind(&key)
                .execute(&mut *tx)
                .await
                .map(|_| vec![(key, 1)]),
            6..=7 => sqlx::query("delete from items where code = ? limit 1")
                .bind(&key)
                .execute(&mut *tx)
                .await
                .map(|done| vec![(key, -(done.rows_affected() as i64))]),
            _ => {
                let renamed = format!("{key}-r{}", rng.u16(..));
                sqlx::query("update items set code = ? where code = ? limit 1")
                    .bind(&renamed)
                    .bind(&key)
                    .execute(&mut *tx)
                    .await
                    .map(|done| {
                        let rows = done.rows_affected() as i64;
                        vec![(key, -rows), (renamed, rows)]
                    })
            }
        };
        match result {
            Ok(done) => changes.extend(done),
            Err(error) if rolled_back_by_the_server(&error) => return false,
            Err(error) => panic!("a write failed: {error}"),
        }
    }
    true
}

fn lock(model: &Shared) -> std::sync::MutexGuard<'_, Model> {
    model
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(mysql_database), ignore = "needs MySQL or MariaDB: set MYSQL_URL")]
async fn many_writers_with_late_commits_and_rollbacks_skip_no_key() {
    many_writers(None, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(mysql_database), ignore = "needs MySQL or MariaDB: set MYSQL_URL")]
async fn many_writers_skip_no_key_under_read_committed_with_an_old_transaction_list() {
    // Sessions that default to READ COMMITTED (a common server setting),
    // and InnoDB serving a transaction list older than the writes.
    many_writers(Some("read committed"), true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(mysql_database), ignore = "needs MySQL or MariaDB: set MYSQL_URL")]
async fn many_writers_skip_no_key_under_serializable() {
    many_writers(Some("serializable"), false).await;
}

/// Writers and a follower on sessions defaulting to `isolation`, with
/// someone reading the transaction list all along if `busy_list`.
async fn many_writers(isolation: Option<&'static str>, busy_list: bool) {
    let writers: usize = std::env::var("BLOOM_GUARD_MYSQL_WRITERS")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(16);
    let transactions: usize = std::env::var("BLOOM_GUARD_MYSQL_TRANSACTIONS")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(60);
    let connections = u32::try_from(writers).unwrap_or(16) + 8;
    let pool = fresh(connections).await;
    let pool = match isolation {
        Some(isolation) => with_isolation(&pool, isolation, connections).await,
        None => pool,
    };
    sqlx::raw_sql("insert into items (code) values ('seed-1'), ('seed-2'), ('seed-3'), ('seed-3')")
        .execute(&pool)
        .await
        .expect("seed");
    let model: Shared = Arc::new(Mutex::new(Model {
        rows: BTreeMap::from([
            ("seed-1".to_owned(), 1),
            ("seed-2".to_owned(), 1),
            ("seed-3".to_owned(), 2),
        ]),
        removing: BTreeMap::new(),
    }));
    let (guard, _running) = followed(&pool).await;
    let reader = if busy_list {
        Some(busy_transaction_list(&pool).await)
    } else {
        None
    };
    let tasks: Vec<_> = (0..writers)
        .map(|w| tokio::spawn(writer(pool.clone(), Arc::clone(&model), w, transactions)))
        .collect();
    // While they write: a key the table holds is never refused, asked at
    // any moment (the read barrier brings what the filter lacks).
    let (mut looks, mut asked) = (0, 0);
    while !tasks.iter().all(tokio::task::JoinHandle::is_finished) {
        let lacking: Vec<String> = {
            let model = lock(&model);
            model
                .keys()
                .into_iter()
                .filter(|key| model.present(key) && !guard.may_contain(key))
                .collect()
        };
        for key in lacking {
            asked += 1;
            let refused = status(&guard, &key).await == http::StatusCode::NOT_FOUND;
            // Removed meanwhile: the refusal may be right.
            assert!(
                !refused || !lock(&model).present(&key),
                "{key}, committed before the request, was refused"
            );
        }
        looks += 1;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for task in tasks {
        task.await.expect("writer");
    }
    if let Some(reader) = reader {
        // The keys are checked below once the ids settled, which the
        // reader kept from happening.
        reader.abort();
    }
    let stored: BTreeMap<String, i64> = sqlx::query_as(
        "select cast(code as char), cast(count(*) as signed) from items group by code",
    )
    .fetch_all(&pool)
    .await
    .expect("the table")
    .into_iter()
    .collect();
    let model = std::mem::take(&mut *lock(&model));
    let modelled: BTreeMap<String, i64> = model
        .rows
        .iter()
        .filter(|(_, rows)| **rows > 0)
        .map(|(key, rows)| (key.clone(), *rows))
        .collect();
    assert_eq!(stored, modelled, "the model is the table");
    wait_until("every open id to settle", Duration::from_secs(10), || {
        !position(&guard).contains('~')
    })
    .await;
    let refused: Vec<&String> = stored
        .keys()
        .filter(|key| !guard.may_contain(key))
        .collect();
    assert!(refused.is_empty(), "stored keys refused: {refused:?}");
    // Every key seen that the table does not hold (deleted, renamed away,
    // only ever rolled back): forgotten, but for the filter's rate.
    let gone: Vec<&String> = model
        .rows
        .iter()
        .filter(|(_, rows)| **rows == 0)
        .map(|(key, _)| key)
        .collect();
    let kept = gone.iter().filter(|key| guard.may_contain(key)).count();
    let allowed = (gone.len() as f64 * 0.002).ceil() as usize + 1;
    assert!(kept <= allowed, "{kept} of {} gone keys kept", gone.len());
    let stats = guard.stats();
    assert!(stats.deletes_applied > 0, "{stats:?}");
    assert_eq!(stats.state, GuardState::Ready);
    eprintln!(
        "{} keys stored, {} gone, {kept} kept; {looks} looks, {asked} asked through the barrier, {} deletes applied",
        stored.len(),
        gone.len(),
        stats.deletes_applied
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(mysql_database), ignore = "needs MySQL or MariaDB: set MYSQL_URL")]
async fn a_truncated_table_is_rebuilt_and_keys_written_after_are_kept() {
    let pool = fresh(8).await;
    sqlx::raw_sql("insert into items (code) values ('old-1'), ('old-2')")
        .execute(&pool)
        .await
        .expect("seed");
    let (guard, _running) = followed(&pool).await;
    sqlx::raw_sql("truncate table items; insert into items (code) values ('after-truncate')")
        .execute(&pool)
        .await
        .expect("truncate");
    assert_ne!(
        status(&guard, "after-truncate").await,
        http::StatusCode::NOT_FOUND
    );
    // TRUNCATE gives the table a new id: the trigger check rebuilds.
    wait_until(
        "the rebuild after the truncation",
        Duration::from_secs(5),
        || {
            guard.stats().state == GuardState::Ready
                && !guard.may_contain("old-1")
                && !guard.may_contain("old-2")
                && guard.may_contain("after-truncate")
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(mysql_database), ignore = "needs MySQL or MariaDB: set MYSQL_URL")]
async fn keys_written_after_a_restore_of_an_older_dump_are_never_refused() {
    let pool = fresh(8).await;
    let name = database(&pool).await;
    sqlx::raw_sql("insert into items (code) values ('dumped')")
        .execute(&pool)
        .await
        .expect("seed");
    let dump = std::env::temp_dir().join(format!("{name}.sql"));
    let mut command = client("mariadb-dump", &name);
    command
        .arg("--single-transaction")
        .arg("--triggers")
        .arg(format!("--result-file={}", dump.display()));
    assert!(run(command).await.success(), "mariadb-dump");
    let (guard, _running) = followed(&pool).await;
    // Rows after the dump: the feed's ids move past the dump's.
    let later: Vec<String> = (0..50).map(|i| format!("('later-{i}')")).collect();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "insert into items (code) values {}",
        later.join(", ")
    )))
    .execute(&pool)
    .await
    .expect("later rows");
    wait_until("the later rows", Duration::from_secs(2), || {
        guard.may_contain("later-49")
    })
    .await;
    // The restore takes the feed back: new rows take ids the follower has
    // passed, and must not be skipped.
    let mut command = client("mariadb", &name);
    command.stdin(std::fs::File::open(&dump).expect("the dump"));
    assert!(run(command).await.success(), "restore");
    let _ = std::fs::remove_file(&dump);
    for i in 0..20 {
        let key = format!("after-restore-{i}");
        sqlx::query("insert into items (code) values (?)")
            .bind(&key)
            .execute(&pool)
            .await
            .expect("insert after the restore");
        assert_ne!(
            status(&guard, &key).await,
            http::StatusCode::NOT_FOUND,
            "{key} was refused"
        );
    }
    wait_until(
        "the rebuild after the restore",
        Duration::from_secs(10),
        || {
            guard.stats().state == GuardState::Ready
                && guard.may_contain("dumped")
                && guard.may_contain("after-restore-19")
                && !guard.may_contain("later-7")
        },
    )
    .await;
}

/// Runs `command` off the test's runtime thread.
async fn run(mut command: std::process::Command) -> std::process::ExitStatus {
    tokio::task::spawn_blocking(move || command.status())
        .await
        .expect("the command's thread")
        .expect("the command on PATH")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(mysql_database), ignore = "needs MySQL or MariaDB: set MYSQL_URL")]
async fn integer_and_uuid_keys_are_held_in_their_text_form() {
    let pool = fresh(8).await;
    // MariaDB has a uuid type (MySQL 8 does not: the test keeps to integers there).
    let uuid =
        sqlx::raw_sql("create table users (id uuid primary key default uuid(), n bigint not null)")
            .execute(&pool)
            .await
            .is_ok();
    if !uuid {
        sqlx::raw_sql("create table users (id char(36) primary key, n bigint not null)")
            .execute(&pool)
            .await
            .expect("users");
    }
    let by_id = Watch::table("users").key("id");
    let by_number = Watch::table("users").key("n").name("numbers");
    by_id.install(&pool).await.expect("install");
    by_number.install(&pool).await.expect("install");
    sqlx::raw_sql("insert into users (id, n) values ('0b6ac9b4-1f4c-4a0e-9b0f-6a1c2e3d4f50', 7)")
        .execute(&pool)
        .await
        .expect("a user");
    let numbers = BloomGuard::builder()
        .name("numbers")
        .key_type(bloom_guard::KeyType::Integer)
        .build();
    let ids = BloomGuard::builder()
        .name("users")
        .key_type(bloom_guard::KeyType::Uuid)
        .build();
    let mut running = Vec::new();
    for (guard, watch) in [(&numbers, &by_number), (&ids, &by_id)] {
        let follower = mysql::Follower::new(guard.clone(), pool.clone(), watch.clone())
            .check_interval(Duration::from_millis(200));
        running.push(spawn(follower));
    }
    wait_until("the warm-ups", Duration::from_secs(10), || {
        numbers.is_ready() && (ids.is_ready() || !uuid)
    })
    .await;
    sqlx::raw_sql("insert into users (id, n) values ('0b6ac9b4-1f4c-4a0e-9b0f-6a1c2e3d4f51', 42)")
        .execute(&pool)
        .await
        .expect("another user");
    wait_until("the second user", Duration::from_secs(2), || {
        numbers.may_contain("42")
    })
    .await;
    assert!(numbers.may_contain("7") && numbers.may_contain("007"));
    assert!(!numbers.may_contain("8"));
    if uuid {
        wait_until("the second id", Duration::from_secs(2), || {
            ids.may_contain("0B6AC9B4-1F4C-4A0E-9B0F-6A1C2E3D4F51")
        })
        .await;
        assert!(ids.may_contain("{0b6ac9b4-1f4c-4a0e-9b0f-6a1c2e3d4f50}"));
        assert!(!ids.may_contain("0b6ac9b4-1f4c-4a0e-9b0f-6a1c2e3d4f52"));
    } else {
        // char(36) under a case-insensitive collation: held open.
        assert!(!ids.is_ready());
    }
}
