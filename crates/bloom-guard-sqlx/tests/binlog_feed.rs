//! The binary log feed of MySQL and MariaDB, end to end on the server of
//! `MYSQL_URL` (its binary log on, in `ROW` format): raw SQL of every kind
//! checked key by key against the table, a refusal of a key committed
//! before the request on another instance, an idle server's refusals, a
//! producer killed mid-stream, a purged log, DDL that starts the feed over,
//! and one feed per table.

mod common;

use std::collections::BTreeSet;
use std::str::FromStr;
use std::time::Duration;

use bloom_guard::{stats::GuardState, BloomGuard};
use bloom_guard_sqlx::{mysql, FeedError, Watch};
use common::{spawn, status, wait_until, Running};
use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};
use sqlx::{ConnectOptions, Connection, MySqlPool};

fn guard() -> BloomGuard {
    BloomGuard::builder()
        .expected_items(20_000)
        .false_positive_rate(0.0001)
        .build()
}

fn items() -> Watch {
    Watch::table("items").key("code")
}

/// A new database with `items` on the binary log feed, and its URL. The
/// feed's warnings go to the test's output.
async fn fresh() -> (MySqlPool, String) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter("bloom_guard_sqlx=info")
        .with_test_writer()
        .try_init();
    let url = std::env::var("MYSQL_URL").expect("MYSQL_URL");
    let options = MySqlConnectOptions::from_str(&url).expect("MYSQL_URL");
    let name = format!("bloom_guard_binlog_{}", fastrand::u64(..));
    let mut admin = options.connect().await.expect("connect to MySQL");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("create database {name}")))
        .execute(&mut admin)
        .await
        .expect("create the test database");
    let _ = admin.close().await;
    let pool = MySqlPoolOptions::new()
        .max_connections(16)
        .connect_with(options.database(&name))
        .await
        .expect("connect to the test database");
    sqlx::raw_sql(
        "create table items (id bigint auto_increment primary key,
                             code varchar(200) collate utf8mb4_nopad_bin not null,
                             note varchar(20),
                             unique key items_code (code))",
    )
    .execute(&pool)
    .await
    .expect("create items");
    items().install_log(&pool).await.expect("install_log");
    let (base, _) = url.rsplit_once('/').expect("a database in MYSQL_URL");
    (pool, format!("{base}/{name}"))
}

async fn followed(pool: &MySqlPool, url: &str) -> (BloomGuard, Running) {
    followed_with(pool, url, true).await
}

/// [`followed`], its refusals confirmed by a lookup in the table
/// (`look_up`) or by a feed read that waits for the producer.
async fn followed_with(pool: &MySqlPool, url: &str, look_up: bool) -> (BloomGuard, Running) {
    let guard = guard();
    let follower = mysql::log::Follower::new(guard.clone(), pool.clone(), items(), url)
        .check_interval(Duration::from_millis(200))
        .poll_interval(Duration::from_millis(200))
        .look_up_refusals(look_up);
    let running = spawn(follower);
    wait_until("the warm-up", Duration::from_secs(20), || guard.is_ready()).await;
    (guard, running)
}

async fn exec(pool: &MySqlPool, sql: &str) {
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
        .execute(pool)
        .await
        .unwrap_or_else(|error| panic!("{sql}: {error}"));
}

async fn stored(pool: &MySqlPool) -> BTreeSet<String> {
    sqlx::query_scalar::<_, String>("select code from items")
        .fetch_all(pool)
        .await
        .expect("the table's keys")
        .into_iter()
        .collect()
}

/// Waits until the guard answers as the table for every key of `seen`:
/// each stored key is in the filter, each other one is not (the guard's
/// filter removes keys; its false-positive rate is 1 in 10 000). Refusals
/// look keys up in the table, so the filter may lag the table a moment.
async fn answers_as_the_table(guard: &BloomGuard, pool: &MySqlPool, seen: &BTreeSet<String>) {
    let table = stored(pool).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let missing: Vec<&String> = table.iter().filter(|key| !guard.may_contain(key)).collect();
        let kept: Vec<&String> = seen
            .iter()
            .filter(|key| !table.contains(*key) && guard.may_contain(key))
            .collect();
        if missing.is_empty() && kept.is_empty() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "stored keys missing from the filter: {missing:?}; deleted keys still in it: {kept:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(guard.stats().state, GuardState::Ready);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(mysql_database), ignore = "needs MySQL or MariaDB: set MYSQL_URL")]
async fn raw_sql_of_every_kind_reaches_the_guard_and_deletes_are_forgotten() {
    let (pool, url) = fresh().await;
    exec(
        &pool,
        "insert into items (code) values ('before-1'), ('before-2')",
    )
    .await;
    let (guard, _running) = followed(&pool, &url).await;
    let statements = [
        "insert into items (code) values ('a'), ('b'), ('c')",
        // An upsert that changes the key, one that changes another column.
        "insert into items (id, code) values (1, 'before-1b') on duplicate key update code = values(code)",
        "insert into items (code) values ('b') on duplicate key update note = 'upserted'",
        // REPLACE: a delete and an insert of the same id.
        "replace into items (id, code) values (2, 'replaced')",
        // Key and id updates.
        "update items set code = 'c2' where code = 'c'",
        "update items set id = id + 1000 where code = 'a'",
        "update items set note = 'n' where code = 'b'",
        // A delete and a re-insert of one key in one transaction.
        "begin; delete from items where code = 'b'; insert into items (code) values ('b'); commit",
        // Deleted and gone.
        "delete from items where code = 'c2'",
        // Several rows by one statement, a rolled-back transaction.
        "insert into items (code) select concat('copy-', code) from items",
        "begin; insert into items (code) values ('rolled-back'); rollback",
        "delete from items where code like 'copy-%' and code <> 'copy-a'",
    ];
    let mut seen: BTreeSet<String> = stored(&pool).await;
    for statement in statements {
        exec(&pool, statement).await;
        seen.extend(stored(&pool).await);
    }
    // LOAD DATA, from a file the server reads (it runs on this machine).
    let file = std::env::temp_dir().join(format!("bloom_guard_load_{}.txt", fastrand::u64(..)));
    std::fs::write(&file, "loaded-1\nloaded-2\nloaded-3\n").expect("the file to load");
    exec(
        &pool,
        &format!(
            "load data infile '{}' into table items (code)",
            file.display()
        ),
    )
    .await;
    let _ = std::fs::remove_file(&file);
    seen.extend(stored(&pool).await);
    assert!(seen.contains("loaded-2"), "LOAD DATA loaded nothing");
    seen.insert("c".to_owned());
    seen.insert("rolled-back".to_owned());
    // The barrier's promise: what committed before the request is found.
    for key in stored(&pool).await {
        assert_eq!(status(&guard, &key).await, http::StatusCode::OK, "{key}");
    }
    answers_as_the_table(&guard, &pool, &seen).await;
    assert_eq!(status(&guard, "c2").await, http::StatusCode::NOT_FOUND);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(mysql_database), ignore = "needs MySQL or MariaDB: set MYSQL_URL")]
async fn a_key_committed_on_one_instance_is_never_refused_by_another() {
    created_on_one_refused_by_none(true, 1_000).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(mysql_database), ignore = "needs MySQL or MariaDB: set MYSQL_URL")]
async fn the_barrier_by_log_point_refuses_no_key_committed_on_another_instance() {
    created_on_one_refused_by_none(false, 300).await;
}

/// `keys` keys created through one instance, each asked for at once of
/// another, whose refusals are confirmed by a lookup in the table
/// (`look_up`) or by a feed read that waits for the producer: none is
/// refused, and absent keys are.
async fn created_on_one_refused_by_none(look_up: bool, keys: usize) {
    let (pool, url) = fresh().await;
    let (_writer, _running_a) = followed(&pool, &url).await;
    // Another instance: its own pool, follower and producer candidate.
    let other = MySqlPoolOptions::new()
        .max_connections(8)
        .connect_with((*pool.connect_options()).clone())
        .await
        .expect("another pool");
    let (reader, _running_b) = followed_with(&other, &url, look_up).await;
    let mut refused = 0;
    for i in 0..keys {
        let key = format!("created-{i}");
        exec(&pool, &format!("insert into items (code) values ('{key}')")).await;
        if status(&reader, &key).await == http::StatusCode::NOT_FOUND {
            refused += 1;
        }
    }
    assert_eq!(refused, 0, "keys committed before the request were refused");
    // And the barrier lets refusals through: absent keys are refused, not
    // passed on after a timeout (a rare one, on a busy machine, aside).
    let mut absent_refused = 0;
    for i in 0..100 {
        if status(&reader, &format!("absent-{i}")).await == http::StatusCode::NOT_FOUND {
            absent_refused += 1;
        }
    }
    let stats = reader.stats();
    assert!(
        absent_refused >= 95,
        "{absent_refused} of 100 absent keys refused: {:?} {:?}, {} barrier timeouts",
        stats.state,
        stats.last_error,
        stats.barrier_timeouts
    );
}

/// Waits until no reader feeds `pool`'s database: nobody follows it (the
/// server's reader, which other tests' followers keep running, leaves it
/// within a second).
async fn unfed(pool: &MySqlPool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let fed: i64 = sqlx::query_scalar(
            "select is_used_lock(concat('bloom_guard_binlog:', md5(database()))) is not null",
        )
        .fetch_one(pool)
        .await
        .expect("the feed's lock");
        if fed == 0 {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "a database nobody follows is still fed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Holds the feed's tables locked for writes on a connection of its own,
/// until [`resume`]d: the producer can write nothing to the feed, and no
/// feed read can bring a key committed meanwhile.
async fn producer_stalled(pool: &MySqlPool) -> sqlx::pool::PoolConnection<sqlx::MySql> {
    let mut connection = pool.acquire().await.expect("a connection");
    sqlx::raw_sql("lock tables bloom_guard_log_changes write, bloom_guard_log_progress write")
        .execute(&mut *connection)
        .await
        .expect("lock the feed's tables");
    connection
}

/// Lets the producer write again (a connection back in its pool keeps its
/// session's locks).
async fn resume(mut stalled: sqlx::pool::PoolConnection<sqlx::MySql>) {
    sqlx::raw_sql("unlock tables")
        .execute(&mut *stalled)
        .await
        .expect("unlock the feed's tables");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(mysql_database), ignore = "needs MySQL or MariaDB: set MYSQL_URL")]
async fn refusals_are_confirmed_in_the_table_while_the_producer_cannot_write() {
    let (pool, url) = fresh().await;
    let (guard, _running) = followed(&pool, &url).await;
    let stalled = producer_stalled(&pool).await;
    exec(
        &pool,
        "insert into items (code) values ('unfed-1'), ('unfed-2')",
    )
    .await;
    exec(
        &pool,
        "update items set code = 'unfed-3' where code = 'unfed-2'",
    )
    .await;
    // In no feed read, yet committed before the request: found.
    for key in ["unfed-1", "unfed-3"] {
        assert!(!guard.may_contain(key), "{key} reached the filter");
        assert_eq!(status(&guard, key).await, http::StatusCode::OK, "{key}");
    }
    // Absent, and refused at once, though no feed read can come.
    for key in ["unfed-2", "never"] {
        assert_eq!(
            status(&guard, key).await,
            http::StatusCode::NOT_FOUND,
            "{key}"
        );
    }
    let stats = guard.stats();
    assert_eq!((stats.rejected, stats.barrier_timeouts), (2, 0));
    resume(stalled).await;
    wait_until("the producer's catch-up", Duration::from_secs(10), || {
        guard.may_contain("unfed-3")
    })
    .await;
}

/// One random statement (or transaction) of raw SQL on `items`, its keys
/// drawn from `next` new ones and the table's own; the keys it may name.
fn random_statement(
    rng: &mut fastrand::Rng,
    table: &[String],
    next: &mut u64,
) -> (String, Vec<String>) {
    let mut fresh = || {
        *next += 1;
        format!("m-{next}")
    };
    let stored = |rng: &mut fastrand::Rng| {
        if table.is_empty() {
            "none".to_owned()
        } else {
            table[rng.usize(..table.len())].clone()
        }
    };
    match rng.u8(..7) {
        0 => {
            let (a, b) = (fresh(), fresh());
            (
                format!("insert into items (code) values ('{a}'), ('{b}')"),
                vec![a, b],
            )
        }
        1 => {
            let old = stored(rng);
            (format!("delete from items where code = '{old}'"), vec![old])
        }
        2 => {
            let (old, new) = (stored(rng), fresh());
            (
                format!("update items set code = '{new}' where code = '{old}'"),
                vec![old, new],
            )
        }
        3 => {
            let (old, new) = (stored(rng), fresh());
            (
                format!("insert into items (code) values ('{old}') on duplicate key update code = '{new}'"),
                vec![old, new],
            )
        }
        4 => {
            let new = fresh();
            (
                format!("replace into items (id, code) select id, '{new}' from items order by id limit 1"),
                vec![new],
            )
        }
        5 => {
            let old = stored(rng);
            (
                format!("begin; delete from items where code = '{old}'; insert into items (code) values ('{old}'); commit"),
                vec![old],
            )
        }
        _ => {
            let new = fresh();
            (
                format!("begin; insert into items (code) values ('{new}'); rollback"),
                vec![new],
            )
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(mysql_database), ignore = "needs MySQL or MariaDB: set MYSQL_URL")]
async fn refusals_answer_as_the_table_for_every_key_ever_seen_while_the_feed_lags() {
    let (pool, url) = fresh().await;
    let (guard, _running) = followed(&pool, &url).await;
    let mut rng = fastrand::Rng::with_seed(fastrand::u64(..));
    let (mut seen, mut next) = (BTreeSet::new(), 0_u64);
    for round in 0..6 {
        // Half the rounds with the producer unable to write: the filter
        // knows nothing of the round's changes, the table everything.
        let stalled = if round % 2 == 0 {
            Some(producer_stalled(&pool).await)
        } else {
            None
        };
        for _ in 0..40 {
            let table: Vec<String> = stored(&pool).await.into_iter().collect();
            let (statement, keys) = random_statement(&mut rng, &table, &mut next);
            exec(&pool, &statement).await;
            seen.extend(keys);
        }
        let table = stored(&pool).await;
        for key in &seen {
            let answer = status(&guard, key).await;
            if table.contains(key) {
                assert_eq!(
                    answer,
                    http::StatusCode::OK,
                    "round {round}: {key} is stored"
                );
            } else if !guard.may_contain(key) {
                assert_eq!(
                    answer,
                    http::StatusCode::NOT_FOUND,
                    "round {round}: {key} is absent and the filter says so"
                );
            }
        }
        assert_eq!(guard.stats().barrier_timeouts, 0);
        if let Some(stalled) = stalled {
            resume(stalled).await;
        }
        answers_as_the_table(&guard, &pool, &seen).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(mysql_database), ignore = "needs MySQL or MariaDB: set MYSQL_URL")]
async fn without_lookups_a_refusal_waits_for_the_producer() {
    let (pool, url) = fresh().await;
    let (guard, _running) = followed_with(&pool, &url, false).await;
    let stalled = producer_stalled(&pool).await;
    exec(&pool, "insert into items (code) values ('unfed')").await;
    // The producer cannot write what the log held: no refusal is trusted.
    for key in ["unfed", "never"] {
        assert_eq!(status(&guard, key).await, http::StatusCode::OK, "{key}");
    }
    assert_eq!(guard.stats().rejected, 0);
    resume(stalled).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(mysql_database), ignore = "needs MySQL or MariaDB: set MYSQL_URL")]
async fn a_key_column_no_index_leads_with_is_not_looked_up() {
    let (pool, url) = fresh().await;
    exec(
        &pool,
        "create table unindexed (id bigint auto_increment primary key,
                                 code varchar(100) collate utf8mb4_nopad_bin not null)",
    )
    .await;
    let watch = Watch::table("unindexed").key("code");
    watch.install_log(&pool).await.expect("install_log");
    let guard = guard();
    let _running = spawn(mysql::log::Follower::new(
        guard.clone(),
        pool.clone(),
        watch,
        &url,
    ));
    wait_until("the warm-up", Duration::from_secs(20), || guard.is_ready()).await;
    assert_eq!(status(&guard, "absent").await, http::StatusCode::NOT_FOUND);
    // Each lookup would read the whole table: refusals wait for feed reads,
    // which the stalled producer cannot give.
    let stalled = producer_stalled(&pool).await;
    exec(&pool, "insert into unindexed (code) values ('unfed')").await;
    for key in ["unfed", "never"] {
        assert_eq!(status(&guard, key).await, http::StatusCode::OK, "{key}");
    }
    assert_eq!(guard.stats().rejected, 1);
    resume(stalled).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(mysql_database), ignore = "needs MySQL or MariaDB: set MYSQL_URL")]
async fn lookups_find_every_spelling_the_column_does() {
    let (pool, url) = fresh().await;
    exec(
        &pool,
        "create table names (id bigint auto_increment primary key,
                             name varchar(100) collate utf8mb4_unicode_ci not null,
                             unique key names_name (name));
         create table numbers (n bigint primary key);
         create table blobs (b varbinary(32) primary key)",
    )
    .await;
    let names = Watch::table("names").key("name");
    let numbers = Watch::table("numbers").key("n");
    let blobs = Watch::table("blobs").key("b");
    let mut guards = Vec::new();
    for watch in [&names, &numbers, &blobs] {
        watch.install_log(&pool).await.expect("install_log");
        let key_type = if std::ptr::eq(watch, &names) {
            names.key_type(&pool).await.expect("the column's key type")
        } else if std::ptr::eq(watch, &numbers) {
            bloom_guard::KeyType::Integer
        } else {
            bloom_guard::KeyType::Text
        };
        let guard = BloomGuard::builder().key_type(key_type).build();
        let follower = mysql::log::Follower::new(guard.clone(), pool.clone(), watch.clone(), &url);
        let running = spawn(follower);
        wait_until("the warm-up", Duration::from_secs(20), || guard.is_ready()).await;
        guards.push((guard, running));
    }
    let stalled = producer_stalled(&pool).await;
    exec(
        &pool,
        "insert into names (name) values ('Straße'), ('Crème Brûlée');
         insert into numbers values (7), (9007199254740993);
         insert into blobs values ('raw-key')",
    )
    .await;
    let cases: [(usize, &[&str], &[&str]); 3] = [
        (
            0,
            &[
                "Straße",
                "STRASSE",
                "strasse",
                "creme brulee",
                "CRÈME BRÛLÉE",
            ],
            &["Strasse2", "creme"],
        ),
        (
            1,
            &["7", "007", "9007199254740993"],
            &["8", "9007199254740992"],
        ),
        (2, &["raw-key"], &["RAW-KEY", "raw-key "]),
    ];
    for (index, found, absent) in cases {
        let guard = &guards[index].0;
        for key in found {
            let encoded = key.replace(' ', "%20");
            assert_eq!(status(guard, &encoded).await, http::StatusCode::OK, "{key}");
        }
        for key in absent {
            let encoded = key.replace(' ', "%20");
            assert_eq!(
                status(guard, &encoded).await,
                http::StatusCode::NOT_FOUND,
                "{key}"
            );
        }
        assert_eq!(guard.stats().barrier_timeouts, 0);
    }
    resume(stalled).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(mysql_database), ignore = "needs MySQL or MariaDB: set MYSQL_URL")]
async fn refusals_do_not_wait_for_commits_of_other_tables() {
    let (pool, url) = fresh().await;
    exec(
        &pool,
        "create table other (id bigint auto_increment primary key, v int)",
    )
    .await;
    let guard = guard();
    // A bound far below what a wait for the producer could take were it
    // woken by each commit elsewhere.
    let follower = mysql::log::Follower::new(guard.clone(), pool.clone(), items(), &url)
        .barrier_bound(Duration::from_millis(500));
    let _running = spawn(follower);
    wait_until("the warm-up", Duration::from_secs(20), || guard.is_ready()).await;
    // About a thousand commits a second elsewhere: every producer on the
    // server (each test's) reads them all.
    let writing = {
        let pool = pool.clone();
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(Duration::from_millis(1));
            loop {
                ticks.tick().await;
                let _ = sqlx::query("insert into other (v) values (1)")
                    .execute(&pool)
                    .await;
            }
        })
    };
    let mut refused = 0;
    for i in 0..200 {
        if status(&guard, &format!("absent-{i}")).await == http::StatusCode::NOT_FOUND {
            refused += 1;
        }
    }
    writing.abort();
    let stats = guard.stats();
    assert!(
        refused >= 190,
        "{refused} of 200 absent keys refused while another table was written: {} barrier timeouts, {:?}",
        stats.barrier_timeouts,
        stats.last_error,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(mysql_database), ignore = "needs MySQL or MariaDB: set MYSQL_URL")]
async fn a_producer_killed_mid_stream_resumes_and_writes_nothing_twice() {
    let (pool, url) = fresh().await;
    let (guard, _running) = followed(&pool, &url).await;
    let writer = {
        let pool = pool.clone();
        tokio::spawn(async move {
            for i in 0..2_000 {
                let _ = sqlx::query("insert into items (code) values (?)")
                    .bind(format!("k{i}"))
                    .execute(&pool)
                    .await;
                if i % 3 == 0 {
                    let _ = sqlx::query("delete from items where code = ?")
                        .bind(format!("k{}", i / 2))
                        .execute(&pool)
                        .await;
                }
            }
        })
    };
    // Kill the producer's connections (its stream and its lock) a few
    // times while the writes go on.
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(150)).await;
        let ids: Vec<Option<u64>> = sqlx::query_scalar(
            "select cast(id as unsigned) from information_schema.processlist
              where db = database() and command like 'Binlog Dump%'
             union all
             select cast(is_used_lock(concat('bloom_guard_binlog:', md5(database()))) as unsigned)",
        )
        .fetch_all(&pool)
        .await
        .expect("the processlist");
        for id in ids.into_iter().flatten() {
            let _ = sqlx::query(sqlx::AssertSqlSafe(format!("kill {id}")))
                .execute(&pool)
                .await;
        }
    }
    writer.await.expect("the writes");
    // Every transaction once: no two rows of one kind and key at one point.
    let twice: i64 = sqlx::query_scalar(
        "select cast(count(*) as signed) from (
            select 1 from bloom_guard_log_changes group by seq, pos, kind, k having count(*) > 1) d",
    )
    .fetch_one(&pool)
    .await
    .expect("duplicates");
    assert_eq!(twice, 0, "a transaction's rows were written twice");
    let seen: BTreeSet<String> = (0..2_000).map(|i| format!("k{i}")).collect();
    wait_until("the producer to catch up", Duration::from_secs(20), || {
        guard.stats().state == GuardState::Ready
    })
    .await;
    exec(&pool, "insert into items (code) values ('after-the-kills')").await;
    assert_eq!(
        status(&guard, "after-the-kills").await,
        http::StatusCode::OK
    );
    answers_as_the_table(&guard, &pool, &seen).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(mysql_database), ignore = "needs MySQL or MariaDB: set MYSQL_URL")]
async fn a_log_purged_before_it_was_read_starts_the_feed_over() {
    let (pool, url) = fresh().await;
    let (guard, running) = followed(&pool, &url).await;
    let epoch = || async {
        sqlx::query_scalar::<_, String>("select epoch from bloom_guard_log_progress")
            .fetch_one(&pool)
            .await
            .expect("the feed's epoch")
    };
    let before = epoch().await;
    // The fleet stops; keys are written; the log they are in is purged.
    drop(running);
    unfed(&pool).await;
    exec(
        &pool,
        "insert into items (code) values ('while-down-1'), ('while-down-2')",
    )
    .await;
    let progress_file: String = sqlx::query_scalar("select file from bloom_guard_log_progress")
        .fetch_one(&pool)
        .await
        .expect("the progress's file");
    exec(&pool, "flush binary logs").await;
    // Purged once no stream reads it any more (other producers on the
    // server may still).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        use sqlx::Row as _;
        let current: String = sqlx::query("show master status")
            .fetch_one(&pool)
            .await
            .expect("the log's end")
            .try_get(0)
            .expect("the file");
        let _ = sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "purge binary logs to '{current}'"
        )))
        .execute(&pool)
        .await;
        let files: Vec<String> = sqlx::query("show binary logs")
            .fetch_all(&pool)
            .await
            .expect("the log's files")
            .iter()
            .map(|row| row.try_get(0).expect("a file"))
            .collect();
        if !files.contains(&progress_file) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{progress_file} was not purged"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The next start reads from a point that is gone: a new epoch, and a
    // guard rebuilt from a scan, with the keys written while down.
    let guard_again = self::guard();
    let _running = spawn(
        mysql::log::Follower::new(guard_again.clone(), pool.clone(), items(), &url)
            .check_interval(Duration::from_millis(200)),
    );
    wait_until("the new epoch", Duration::from_secs(20), || {
        guard_again.is_ready()
    })
    .await;
    let mut after = epoch().await;
    for _ in 0..100 {
        if after != before {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        after = epoch().await;
    }
    assert_ne!(before, after, "the feed did not start over");
    wait_until("the rebuild", Duration::from_secs(20), || {
        guard_again.stats().state == GuardState::Ready
            && guard_again.may_contain("while-down-1")
            && guard_again.may_contain("while-down-2")
    })
    .await;
    exec(&pool, "insert into items (code) values ('after-purge')").await;
    assert_eq!(
        status(&guard_again, "after-purge").await,
        http::StatusCode::OK
    );
    drop(guard);
}

/// A failover to a replica, or a restore to another host, as the producer
/// finds it: its progress names another server (the replica's copy of the
/// feed's tables came from the old primary). It starts the feed over; the
/// guard rebuilds with every key, those written after the switch too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(mysql_database), ignore = "needs MySQL or MariaDB: set MYSQL_URL")]
async fn a_log_of_another_server_starts_the_feed_over() {
    let (pool, url) = fresh().await;
    let (_guard, running) = followed(&pool, &url).await;
    let epoch = || async {
        sqlx::query_scalar::<_, String>("select epoch from bloom_guard_log_progress")
            .fetch_one(&pool)
            .await
            .expect("the feed's epoch")
    };
    let before = epoch().await;
    drop(running);
    unfed(&pool).await;
    exec(
        &pool,
        "update bloom_guard_log_progress set server = '2:/var/lib/mysql/old-primary-bin'",
    )
    .await;
    exec(
        &pool,
        "insert into items (code) values ('after-the-switch')",
    )
    .await;
    let guard = self::guard();
    let _running = spawn(
        mysql::log::Follower::new(guard.clone(), pool.clone(), items(), &url)
            .check_interval(Duration::from_millis(200)),
    );
    wait_until(
        "the new epoch and the rebuild",
        Duration::from_secs(20),
        || guard.stats().state == GuardState::Ready && guard.may_contain("after-the-switch"),
    )
    .await;
    assert_ne!(before, epoch().await, "the feed did not start over");
    exec(
        &pool,
        "insert into items (code) values ('after-the-rebuild')",
    )
    .await;
    assert_eq!(
        status(&guard, "after-the-rebuild").await,
        http::StatusCode::OK
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(mysql_database), ignore = "needs MySQL or MariaDB: set MYSQL_URL")]
async fn truncate_starts_the_guard_over() {
    let (pool, url) = fresh().await;
    exec(&pool, "insert into items (code) values ('old')").await;
    let (guard, _running) = followed(&pool, &url).await;
    let generation = guard.stats().generation;
    exec(&pool, "truncate table items").await;
    exec(&pool, "insert into items (code) values ('new')").await;
    wait_until(
        "a rebuild after the truncate",
        Duration::from_secs(20),
        || {
            let stats = guard.stats();
            stats.generation > generation
                && stats.state == GuardState::Ready
                && !guard.may_contain("old")
        },
    )
    .await;
    assert_eq!(status(&guard, "new").await, http::StatusCode::OK);
    assert_eq!(status(&guard, "old").await, http::StatusCode::NOT_FOUND);
}

/// A transaction of more keys than the reader holds in memory starts the
/// guard over instead: its keys are found after the rebuild, the one it
/// deleted is forgotten, and the feed holds no row of it but the resync.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(mysql_database), ignore = "needs MySQL or MariaDB: set MYSQL_URL")]
async fn a_transaction_of_more_keys_than_the_reader_holds_starts_the_guard_over() {
    let (pool, url) = fresh().await;
    exec(&pool, "insert into items (code) values ('old'), ('gone')").await;
    let (guard, _running) = followed(&pool, &url).await;
    let generation = guard.stats().generation;
    // 250 001 inserts (MariaDB's sequence engine) and a delete, one
    // transaction.
    exec(
        &pool,
        "start transaction;
         insert into items (code) select concat('bulk-', seq) from seq_0_to_250000;
         delete from items where code = 'gone';
         commit",
    )
    .await;
    wait_until(
        "a rebuild after the bulk transaction",
        Duration::from_secs(60),
        || {
            let stats = guard.stats();
            stats.generation > generation
                && stats.state == GuardState::Ready
                && !guard.may_contain("gone")
        },
    )
    .await;
    for key in (0..=250_000)
        .step_by(499)
        .map(|i| format!("bulk-{i}"))
        .chain(["bulk-250000".to_owned(), "old".to_owned()])
    {
        assert!(guard.may_contain(&key), "{key} missing after the rebuild");
    }
    let (rows, resyncs): (i64, i64) = sqlx::query_as(
        "select cast(coalesce(sum(kind <> 'r'), 0) as signed),
                cast(coalesce(sum(kind = 'r'), 0) as signed)
           from bloom_guard_log_changes",
    )
    .fetch_one(&pool)
    .await
    .expect("the feed");
    // At most the two rows written before it.
    assert!(
        rows <= 2,
        "{rows} feed rows: the transaction's rows were written"
    );
    assert_eq!(resyncs, 1, "the transaction's resync");
    // The feed goes on after it.
    exec(&pool, "insert into items (code) values ('after')").await;
    wait_until("a key after the rebuild", Duration::from_secs(10), || {
        guard.may_contain("after")
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(mysql_database), ignore = "needs MySQL or MariaDB: set MYSQL_URL")]
async fn a_table_has_one_feed() {
    let (pool, _url) = fresh().await;
    let error = items().install(&pool).await.expect_err("triggers refused");
    assert!(matches!(error, FeedError::LogFed(_)), "{error}");
    exec(
        &pool,
        "create table users (id bigint auto_increment primary key,
                             name varchar(50) collate utf8mb4_nopad_bin not null)",
    )
    .await;
    let users = Watch::table("users").key("name");
    users.install(&pool).await.expect("triggers on users");
    let error = users.install_log(&pool).await.expect_err("log refused");
    assert!(matches!(error, FeedError::LogFeed(_)), "{error}");
    // A key type whose bytes in the log are not the triggers' is refused.
    exec(
        &pool,
        "create table prices (id bigint auto_increment primary key, p decimal(10, 2) not null)",
    )
    .await;
    let error = Watch::table("prices")
        .key("p")
        .install_log(&pool)
        .await
        .expect_err("decimal refused");
    assert!(error.to_string().contains("decimal"), "{error}");
}

/// The stream over TLS, its server's certificate verified against the
/// URL's `ssl-ca`, as a user the server lets in over TLS only: the producer
/// streams, keys arrive, absent ones are refused.
#[cfg(feature = "binlog-feed-tls")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(mariadb_server),
    ignore = "needs MariaDB's server (mariadbd) for a server with TLS"
)]
async fn the_stream_goes_over_tls_as_the_url_asks() {
    let server = common::mysql::Server::start(true);
    let pool = MySqlPoolOptions::new()
        .max_connections(8)
        .connect(&server.url)
        .await
        .expect("connect to the TLS server");
    sqlx::raw_sql(
        "create table items (id bigint auto_increment primary key,
                             code varchar(200) collate utf8mb4_nopad_bin not null)",
    )
    .execute(&pool)
    .await
    .expect("create items");
    items().install_log(&pool).await.expect("install_log");
    let address = server
        .url
        .rsplit_once('@')
        .map(|(_, address)| address.to_owned())
        .expect("an address");
    let ca = server.dir.path().join("tls/ca.pem");
    let url = format!(
        "mysql://bloom_tls:bloom@{address}?ssl-mode=VERIFY_CA&ssl-ca={}",
        ca.display()
    );
    let (guard, _running) = followed(&pool, &url).await;
    for i in 0..20 {
        let key = format!("over-tls-{i}");
        exec(&pool, &format!("insert into items (code) values ('{key}')")).await;
        assert_eq!(status(&guard, &key).await, http::StatusCode::OK, "{key}");
    }
    let mut refused = 0;
    for i in 0..20 {
        if status(&guard, &format!("absent-{i}")).await == http::StatusCode::NOT_FOUND {
            refused += 1;
        }
    }
    assert!(
        refused >= 19,
        "{refused} of 20 absent keys refused over TLS"
    );
}
