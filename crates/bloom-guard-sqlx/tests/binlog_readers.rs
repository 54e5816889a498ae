//! One reader of the binary log per server, on a MariaDB server of each
//! test's own (`.ci/mariadb`): the databases of a server share one stream;
//! a database whose feed the server's reader may not write, or whose
//! watched table it cannot see, is read by its own instances, and so is one
//! whose feed tables are locked or whose progress is far behind; one read
//! alone is handed to the server's reader; a reader stopped is replaced.
//! Through every change of reader, every key written reaches its guard and
//! no transaction is written twice.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bloom_guard::{stats::GuardState, BloomGuard};
use bloom_guard_sqlx::{mysql, Watch};
use common::mysql::Server;
use common::{spawn, status, wait_until, Running};
use sqlx::mysql::MySqlPoolOptions;
use sqlx::{Connection as _, MySqlConnection, MySqlPool};

fn items() -> Watch {
    Watch::table("items").key("code")
}

/// Database `name` on `server` with `items` on the binary log feed.
async fn database(server: &Server, name: &str) {
    server.root(&format!(
        "create database {name};
         create table {name}.items (id bigint auto_increment primary key,
                                    code varchar(200) collate utf8mb4_nopad_bin not null,
                                    unique key items_code (code));"
    ));
    let pool = pool(&server.url_of("bloom", name)).await;
    items().install_log(&pool).await.expect("install_log");
    pool.close().await;
}

async fn pool(url: &str) -> MySqlPool {
    MySqlPoolOptions::new()
        .max_connections(8)
        .connect(url)
        .await
        .unwrap_or_else(|error| panic!("connect to {url}: {error}"))
}

/// A guard on `url`'s `items`, followed on the binary log feed, once warm.
async fn followed(url: &str) -> (BloomGuard, MySqlPool, Running) {
    followed_watch(url, items()).await
}

/// A guard on `url`'s `watch`, followed on the binary log feed, once warm.
async fn followed_watch(url: &str, watch: Watch) -> (BloomGuard, MySqlPool, Running) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter("bloom_guard_sqlx=info")
        .with_test_writer()
        .try_init();
    let pool = pool(url).await;
    let guard = BloomGuard::builder()
        .expected_items(20_000)
        .false_positive_rate(0.0001)
        .build();
    let running = spawn(
        mysql::log::Follower::new(guard.clone(), pool.clone(), watch, url)
            .check_interval(Duration::from_millis(200))
            .poll_interval(Duration::from_millis(200)),
    );
    wait_until("the warm-up", Duration::from_secs(30), || guard.is_ready()).await;
    (guard, pool, running)
}

/// The connection that writes each database's feed (none where none does).
async fn feeders(admin: &mut MySqlConnection, databases: &[&str]) -> Vec<Option<u64>> {
    let mut ids = Vec::new();
    for database in databases {
        let id: Option<u64> = sqlx::query_scalar(
            "select cast(is_used_lock(concat('bloom_guard_binlog:', md5(?))) as unsigned)",
        )
        .bind(database)
        .fetch_one(&mut *admin)
        .await
        .expect("the feed's lock");
        ids.push(id);
    }
    ids
}

/// The binary log streams the server sends.
async fn streams(admin: &mut MySqlConnection) -> i64 {
    sqlx::query_scalar(
        "select cast(count(*) as signed) from information_schema.processlist
          where command like 'Binlog Dump%'",
    )
    .fetch_one(admin)
    .await
    .expect("the processlist")
}

/// Waits until one connection writes the feeds of all `databases`, and
/// the server sends one stream.
async fn one_reader(admin: &mut MySqlConnection, databases: &[&str]) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let ids = feeders(admin, databases).await;
        let streams = streams(admin).await;
        if ids[0].is_some() && ids.iter().all(|id| *id == ids[0]) && streams == 1 {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not one reader: feeds written by {ids:?}, {streams} streams"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Writes keys `<prefix>-<n>` to `pool`'s `items` until `stop`, and
/// returns them.
fn writing(
    pool: &MySqlPool,
    prefix: &str,
    stop: &Arc<AtomicBool>,
) -> tokio::task::JoinHandle<Vec<String>> {
    let (pool, prefix, stop) = (pool.clone(), prefix.to_owned(), Arc::clone(stop));
    tokio::spawn(async move {
        let mut written = Vec::new();
        let mut n = 0;
        while !stop.load(Ordering::Relaxed) {
            let key = format!("{prefix}-{n}");
            n += 1;
            sqlx::query("insert into items (code) values (?)")
                .bind(&key)
                .execute(&pool)
                .await
                .expect("an insert");
            if n % 5 == 0 {
                // Some deletes too: a delete written twice would remove
                // another key's fingerprint.
                let gone = format!("{prefix}-{}", n - 3);
                sqlx::query("delete from items where code = ?")
                    .bind(&gone)
                    .execute(&pool)
                    .await
                    .expect("a delete");
                written.retain(|key| *key != gone);
            }
            written.push(key);
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        written
    })
}

/// Writers of keys `<prefix>-<n>`, one per pool, until stopped.
struct Writers {
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<Vec<String>>>,
}

impl Writers {
    fn start(targets: &[(&MySqlPool, &str)]) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let tasks = targets
            .iter()
            .map(|(pool, prefix)| writing(pool, prefix, &stop))
            .collect();
        Self { stop, tasks }
    }

    /// Stops them: the keys each wrote and kept, in the order started.
    async fn stop(self) -> Vec<Vec<String>> {
        self.stop.store(true, Ordering::Relaxed);
        let mut written = Vec::new();
        for task in self.tasks {
            written.push(task.await.expect("the writes"));
        }
        written
    }
}

/// What [`Writers`] on `targets` wrote in `millis` milliseconds.
async fn written_for(targets: &[(&MySqlPool, &str)], millis: u64) -> Vec<Vec<String>> {
    let writers = Writers::start(targets);
    tokio::time::sleep(Duration::from_millis(millis)).await;
    writers.stop().await
}

/// Every key of `written` reaches the guard, the guard is ready, absent
/// keys are refused, and the feed holds no transaction twice.
async fn complete(guard: &BloomGuard, pool: &MySqlPool, written: &[String]) {
    wait_until("every key written", Duration::from_secs(20), || {
        guard.stats().state == GuardState::Ready && written.iter().all(|key| guard.may_contain(key))
    })
    .await;
    for key in written.iter().step_by(97) {
        assert_eq!(status(guard, key).await, http::StatusCode::OK, "{key}");
    }
    let mut refused = 0;
    for i in 0..20 {
        if status(guard, &format!("absent-{i}")).await == http::StatusCode::NOT_FOUND {
            refused += 1;
        }
    }
    assert!(refused >= 19, "{refused} of 20 absent keys refused");
    let twice: i64 = sqlx::query_scalar(
        "select cast(count(*) as signed) from (
            select 1 from bloom_guard_log_changes group by seq, pos, kind, k having count(*) > 1) d",
    )
    .fetch_one(pool)
    .await
    .expect("duplicates");
    assert_eq!(twice, 0, "a transaction's rows were written twice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(mariadb_server),
    ignore = "needs MariaDB's server (mariadbd) for a server of the test's own"
)]
async fn the_databases_of_a_server_share_one_stream_and_a_reader_stopped_is_replaced() {
    let server = Server::start(false);
    let names = ["shop_a", "shop_b", "shop_c"];
    for name in names {
        database(&server, name).await;
    }
    let mut admin = MySqlConnection::connect(&server.url).await.expect("admin");
    let mut followed_all = Vec::new();
    for name in names {
        let (guard, pool, running) = followed(&server.url_of("bloom", name)).await;
        followed_all.push((guard, pool, Some(running)));
    }
    one_reader(&mut admin, &names).await;
    // The instance whose candidate reads for the server stops, while every
    // database is written.
    let reader = feeders(&mut admin, &names).await[0].expect("a reader");
    let reader_database: String = sqlx::query_scalar(
        "select cast(db as char) from information_schema.processlist where id = ?",
    )
    .bind(reader)
    .fetch_one(&mut admin)
    .await
    .expect("the reader's database");
    let targets: Vec<(&MySqlPool, &str)> = followed_all
        .iter()
        .zip(names)
        .map(|((_, pool, _), name)| (pool, name))
        .collect();
    let writers = Writers::start(&targets);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let index = names
        .iter()
        .position(|name| *name == reader_database)
        .expect("the reader is one of the instances");
    drop(followed_all[index].2.take());
    let rest: Vec<&str> = names
        .iter()
        .copied()
        .filter(|name| *name != reader_database)
        .collect();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let left: i64 = sqlx::query_scalar(
            "select cast(count(*) as signed) from information_schema.processlist where id = ?",
        )
        .bind(reader)
        .fetch_one(&mut admin)
        .await
        .expect("the processlist");
        if left == 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the stopped instance's reader goes on"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    one_reader(&mut admin, &rest).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    for (written, name) in writers.stop().await.into_iter().zip(names) {
        if name == reader_database {
            continue;
        }
        let (guard, pool, _) =
            &followed_all[names.iter().position(|n| *n == name).expect("a name")];
        complete(guard, pool, &written).await;
    }
    // Nobody follows the stopped instance's database: its feed stops.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while feeders(&mut admin, &[&reader_database]).await[0].is_some() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "a database nobody follows is still fed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(mariadb_server),
    ignore = "needs MariaDB's server (mariadbd) for a server of the test's own"
)]
async fn a_database_the_server_reader_may_not_write_is_read_by_its_own_instances() {
    let server = Server::start(false);
    database(&server, "shop_a").await;
    database(&server, "shop_b").await;
    // alice may write shop_a's feed and read shop_b's; bob may write
    // shop_b's.
    server.root(
        "create user alice@'127.0.0.1' identified by 'bloom';
         create user bob@'127.0.0.1' identified by 'bloom';
         grant replication slave, replication client, process on *.* to alice@'127.0.0.1';
         grant replication slave, replication client, process on *.* to bob@'127.0.0.1';
         grant all on shop_a.* to alice@'127.0.0.1';
         grant select on shop_b.* to alice@'127.0.0.1';
         grant all on shop_b.* to bob@'127.0.0.1';",
    );
    let mut admin = MySqlConnection::connect(&server.url).await.expect("admin");
    let (guard_a, pool_a, _running_a) = followed(&server.url_of("alice", "shop_a")).await;
    one_reader(&mut admin, &["shop_a"]).await;
    let (guard_b, pool_b, _running_b) = followed(&server.url_of("bob", "shop_b")).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let ids = feeders(&mut admin, &["shop_a", "shop_b"]).await;
        if ids.iter().all(Option::is_some) && ids[0] != ids[1] && streams(&mut admin).await == 2 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "shop_b is not read by its own instance: feeds written by {ids:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let written = written_for(&[(&pool_a, "a"), (&pool_b, "b")], 500).await;
    complete(&guard_a, &pool_a, &written[0]).await;
    complete(&guard_b, &pool_b, &written[1]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(mariadb_server),
    ignore = "needs MariaDB's server (mariadbd) for a server of the test's own"
)]
async fn databases_read_alone_are_handed_to_one_reader_while_written() {
    let server = Server::start(false);
    database(&server, "shop_a").await;
    database(&server, "shop_b").await;
    let mut admin = MySqlConnection::connect(&server.url).await.expect("admin");
    // The server's lock held elsewhere: each database is read alone.
    let mut holder = MySqlConnection::connect(&server.url).await.expect("holder");
    let held: Option<i64> = sqlx::query_scalar("select get_lock('bloom_guard_binlog_server', 0)")
        .fetch_one(&mut holder)
        .await
        .expect("the server's lock");
    assert_eq!(held, Some(1));
    let (guard_a, pool_a, _running_a) = followed(&server.url_of("bloom", "shop_a")).await;
    let (guard_b, pool_b, _running_b) = followed(&server.url_of("bloom", "shop_b")).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let ids = feeders(&mut admin, &["shop_a", "shop_b"]).await;
        if ids.iter().all(Option::is_some) && ids[0] != ids[1] {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the databases are not read alone: {ids:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(streams(&mut admin).await, 2);
    // Written throughout: the lock goes, one of them becomes the server's
    // reader and the other hands its database over.
    let writers = Writers::start(&[(&pool_a, "a"), (&pool_b, "b")]);
    tokio::time::sleep(Duration::from_millis(300)).await;
    holder.close().await.expect("the lock released");
    one_reader(&mut admin, &["shop_a", "shop_b"]).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let written = writers.stop().await;
    complete(&guard_a, &pool_a, &written[0]).await;
    complete(&guard_b, &pool_b, &written[1]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(mariadb_server),
    ignore = "needs MariaDB's server (mariadbd) for a server of the test's own"
)]
async fn a_database_whose_feed_tables_are_locked_does_not_hold_back_the_others() {
    let server = Server::start(false);
    database(&server, "shop_a").await;
    database(&server, "shop_b").await;
    let mut admin = MySqlConnection::connect(&server.url).await.expect("admin");
    let (guard_a, pool_a, _running_a) = followed(&server.url_of("bloom", "shop_a")).await;
    let (guard_b, pool_b, _running_b) = followed(&server.url_of("bloom", "shop_b")).await;
    one_reader(&mut admin, &["shop_a", "shop_b"]).await;
    let reader = feeders(&mut admin, &["shop_a"]).await[0];
    // shop_b's feed tables locked, as a dump with `LOCK TABLES` does.
    let mut dump = pool_b.acquire().await.expect("a connection");
    sqlx::raw_sql("lock tables bloom_guard_log_changes write, bloom_guard_log_progress write")
        .execute(&mut *dump)
        .await
        .expect("lock the feed's tables");
    let writers = Writers::start(&[(&pool_a, "a"), (&pool_b, "b")]);
    tokio::time::sleep(Duration::from_millis(300)).await;
    // shop_a's keys reach its guard while shop_b's tables stay locked.
    let key = "a-while-b-is-locked";
    sqlx::query("insert into items (code) values (?)")
        .bind(key)
        .execute(&pool_a)
        .await
        .expect("an insert");
    wait_until(
        "shop_a's key while shop_b is locked",
        Duration::from_secs(4),
        || guard_a.may_contain(key),
    )
    .await;
    assert!(
        !guard_b.may_contain("b-5"),
        "shop_b's feed was written through its lock"
    );
    // The server's reader went on, without shop_b.
    assert_eq!(
        feeders(&mut admin, &["shop_a"]).await[0],
        reader,
        "the server's reader stopped"
    );
    sqlx::raw_sql("unlock tables")
        .execute(&mut *dump)
        .await
        .expect("unlock");
    drop(dump);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut written = writers.stop().await;
    let mut written_a = std::mem::take(&mut written[0]);
    written_a.push(key.to_owned());
    complete(&guard_a, &pool_a, &written_a).await;
    complete(&guard_b, &pool_b, &written[1]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(mariadb_server),
    ignore = "needs MariaDB's server (mariadbd) for a server of the test's own"
)]
async fn a_database_watching_a_table_the_server_reader_cannot_see_is_read_by_its_own_instances() {
    let server = Server::start(false);
    database(&server, "shop_a").await;
    // shop_b's feed watches `catalog.items`, which alice may not see,
    // though she may write shop_b's feed tables.
    server.root(
        "create database shop_b;
         create database catalog;
         create table catalog.items (id bigint auto_increment primary key,
                                     code varchar(200) collate utf8mb4_nopad_bin not null,
                                     unique key items_code (code));
         create user alice@'127.0.0.1' identified by 'bloom';
         create user bob@'127.0.0.1' identified by 'bloom';
         grant replication slave, replication client, process on *.* to alice@'127.0.0.1';
         grant replication slave, replication client, process on *.* to bob@'127.0.0.1';
         grant all on shop_a.* to alice@'127.0.0.1';
         grant all on shop_b.* to alice@'127.0.0.1';
         grant all on shop_b.* to bob@'127.0.0.1';
         grant all on catalog.* to bob@'127.0.0.1';",
    );
    let catalog = Watch::table("catalog.items").key("code");
    {
        let setup = pool(&server.url_of("bloom", "shop_b")).await;
        catalog.install_log(&setup).await.expect("install_log");
        setup.close().await;
    }
    let mut admin = MySqlConnection::connect(&server.url).await.expect("admin");
    let (guard_a, pool_a, _running_a) = followed(&server.url_of("alice", "shop_a")).await;
    one_reader(&mut admin, &["shop_a"]).await;
    let (guard_b, pool_b, _running_b) =
        followed_watch(&server.url_of("bob", "shop_b"), catalog).await;
    let catalog_pool = pool(&server.url_of("bob", "catalog")).await;
    let written = written_for(&[(&pool_a, "a"), (&catalog_pool, "b")], 500).await;
    complete(&guard_a, &pool_a, &written[0]).await;
    complete(&guard_b, &pool_b, &written[1]).await;
    let ids = feeders(&mut admin, &["shop_a", "shop_b"]).await;
    assert_ne!(ids[0], ids[1], "the server's reader feeds shop_b");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(mariadb_server),
    ignore = "needs MariaDB's server (mariadbd) for a server of the test's own"
)]
async fn a_reader_elected_as_its_database_was_released_still_feeds_it() {
    let server = Server::start(false);
    database(&server, "shop_a").await;
    // Another connection holds both the server's lock and shop_a's
    // "wanted" lock, as an instance stopping does until its connection
    // closes: the new candidate fails to take the second, then is elected
    // the moment both go.
    let mut stopping = MySqlConnection::connect(&server.url)
        .await
        .expect("connect");
    let held: (Option<i64>, Option<i64>) = sqlx::query_as(
        "select get_lock('bloom_guard_binlog_server', 0),
                get_lock(concat('bloom_guard_binlog_wanted:', md5('shop_a')), 0)",
    )
    .fetch_one(&mut stopping)
    .await
    .expect("the locks");
    assert_eq!(held, (Some(1), Some(1)));
    let url = server.url_of("bloom", "shop_a");
    let pool = pool(&url).await;
    let guard = BloomGuard::builder()
        .expected_items(20_000)
        .false_positive_rate(0.0001)
        .build();
    let _running = spawn(
        mysql::log::Follower::new(guard.clone(), pool.clone(), items(), url)
            .check_interval(Duration::from_millis(200))
            .poll_interval(Duration::from_millis(200)),
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    stopping.close().await.expect("the locks released");
    wait_until("the warm-up", Duration::from_secs(20), || guard.is_ready()).await;
    let written = written_for(&[(&pool, "a")], 300).await;
    complete(&guard, &pool, &written[0]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(mariadb_server),
    ignore = "needs MariaDB's server (mariadbd) for a server of the test's own"
)]
async fn a_database_far_behind_the_stream_is_caught_up_alone_then_handed_over() {
    let server = Server::start(false);
    database(&server, "shop_a").await;
    database(&server, "shop_b").await;
    let mut admin = MySqlConnection::connect(&server.url).await.expect("admin");
    let (guard_a, pool_a, _running_a) = followed(&server.url_of("bloom", "shop_a")).await;
    let (guard_b, pool_b, running_b) = followed(&server.url_of("bloom", "shop_b")).await;
    one_reader(&mut admin, &["shop_a", "shop_b"]).await;
    // shop_b's instance stops, and is written while down; the log moves
    // to a new file, which shop_a's writes go on in.
    drop(running_b);
    drop(guard_b);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while feeders(&mut admin, &["shop_b"]).await[0].is_some() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "shop_b is still fed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let written_b = written_for(&[(&pool_b, "down")], 300).await.remove(0);
    sqlx::raw_sql("flush binary logs")
        .execute(&mut admin)
        .await
        .expect("a new log file");
    let writer_a = Writers::start(&[(&pool_a, "a")]);
    tokio::time::sleep(Duration::from_millis(300)).await;
    // shop_b's instance comes back: its feed is a file behind the server's
    // stream, so its own instance reads for it, then hands it over.
    let (guard_b, _running_b) = {
        let (guard, _, running) = followed(&server.url_of("bloom", "shop_b")).await;
        (guard, running)
    };
    let reader_a = feeders(&mut admin, &["shop_a"]).await[0];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let ids = feeders(&mut admin, &["shop_a", "shop_b"]).await;
        if ids[1].is_some() && ids[1] != ids[0] {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "shop_b was not read alone: {ids:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        feeders(&mut admin, &["shop_a"]).await[0],
        reader_a,
        "the server's reader went back for shop_b"
    );
    one_reader(&mut admin, &["shop_a", "shop_b"]).await;
    complete(&guard_a, &pool_a, &writer_a.stop().await[0]).await;
    complete(&guard_b, &pool_b, &written_b).await;
}
