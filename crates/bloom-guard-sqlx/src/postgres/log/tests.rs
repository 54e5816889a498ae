//! The slot's stream against a real Postgres (`DATABASE_URL`, with
//! `wal_level=logical`): raw SQL of every kind gives the feed rows the
//! triggers would record, and a stream started again skips what was
//! applied.

use std::collections::BTreeMap;
use std::time::Duration;

use sqlx::PgPool;

use super::install::LogInstallError;
use super::producer::Producer;
use super::rows::FeedRow;
use super::stream::{Event, LogStream, LoggedTable};

/// Raw SQL of every kind on `items (id bigint primary key, key text)`:
/// key and id updates, upserts, MERGE, a delete and a re-insert of the
/// key in one transaction, COPY.
const RAW_SQL: [&str; 9] = [
    "insert into items (id, key) values (1, 'a'), (2, 'b'), (3, 'c')",
    "update items set key = 'a2' where id = 1",
    "update items set id = 20 where id = 2",
    "insert into items (id, key) values (4, 'd') on conflict (id) do update set key = excluded.key",
    "insert into items (id, key) values (4, 'd4') on conflict (id) do update set key = excluded.key",
    "merge into items t using (values (5, 'e'), (3, 'c3')) s(id, key) on t.id = s.id
       when matched then update set key = s.key when not matched then insert (id, key) values (s.id, s.key)",
    "begin; delete from items where id = 20; insert into items (id, key) values (6, 'b'); commit",
    "delete from items where key = 'e'",
    "copy items (id, key) from program 'printf \"8\\tf\\n9\\tg\\n\"'",
];

/// A logical slot of the test's database, dropped on drop (also when the
/// test fails): a slot left behind keeps the server's log and its
/// database from being dropped.
struct Slot {
    name: String,
    url: String,
}

impl Slot {
    async fn create(pool: &PgPool, url: &str) -> Self {
        let wal_level: String = sqlx::query_scalar("select current_setting('wal_level')")
            .fetch_one(pool)
            .await
            .expect("wal_level");
        assert_eq!(
            wal_level, "logical",
            "the log feed's tests need DATABASE_URL's server with wal_level=logical (.ci/run sets it)"
        );
        let name = format!("bloom_guard_test_{}", fastrand::u32(..));
        sqlx::query("select pg_create_logical_replication_slot($1, 'pgoutput')")
            .bind(&name)
            .execute(pool)
            .await
            .expect("create the slot");
        Self {
            name,
            url: url.to_owned(),
        }
    }
}

impl Slot {
    /// A stream of the slot for guard `items` over `public.items`' `key`,
    /// published as `bloom_guard_test`.
    async fn stream(&self, after: u64) -> LogStream {
        let tables = [
            LoggedTable {
                schema: "public".into(),
                table: "items".into(),
                guards: vec![("items".into(), vec!["key".into()])],
            },
            LoggedTable {
                schema: "public".into(),
                table: "other".into(),
                guards: Vec::new(),
            },
        ];
        LogStream::start(&self.url, &self.name, "bloom_guard_test", &tables, after)
            .await
            .expect("stream the slot")
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let sql = format!(
            "select pg_terminate_backend(active_pid) from pg_replication_slots \
              where slot_name = '{0}' and active_pid is not null; \
             select pg_sleep(0.2); \
             select pg_drop_replication_slot('{0}');",
            self.name
        );
        let _ = std::process::Command::new("psql")
            .arg(&self.url)
            .args(["-qAt", "-c", &sql])
            .output();
    }
}

/// The URL of the database `pool` is connected to: `DATABASE_URL` with
/// its database name replaced.
async fn url_of(pool: &PgPool) -> String {
    let database: String = sqlx::query_scalar("select current_database()")
        .fetch_one(pool)
        .await
        .expect("database name");
    let mut url = url::Url::parse(&std::env::var("DATABASE_URL").expect("DATABASE_URL"))
        .expect("DATABASE_URL is a URL");
    url.set_path(&database);
    url.to_string()
}

async fn exec(pool: &PgPool, sql: &str) {
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
        .execute(pool)
        .await
        .unwrap_or_else(|error| panic!("{sql}: {error}"));
}

/// Reads committed transactions until one adds `marker`, returning each
/// one's rows as (kind, key) and the last one's end.
async fn read_until(stream: &mut LogStream, marker: &str) -> (Vec<Vec<(char, String)>>, u64) {
    let mut transactions: Vec<Vec<(char, String)>> = Vec::new();
    loop {
        let event = tokio::time::timeout(Duration::from_secs(20), stream.next())
            .await
            .expect("the stream went quiet")
            .expect("the stream failed");
        if let Event::Committed { end, rows } = event {
            let rows: Vec<_> = rows.into_iter().map(pair).collect();
            let done = rows.contains(&('i', marker.to_owned()));
            transactions.push(rows);
            if done {
                return (transactions, end);
            }
        }
    }
}

fn pair(row: FeedRow) -> (char, String) {
    (char::from(row.kind), row.key)
}

/// Each key's count after applying every row: what a counting filter
/// would hold.
fn counts(transactions: &[Vec<(char, String)>]) -> BTreeMap<String, i64> {
    let mut counts = BTreeMap::new();
    for (kind, key) in transactions.iter().flatten() {
        let count = counts.entry(key.clone()).or_insert(0);
        match kind {
            'i' => *count += 1,
            'd' => *count -= 1,
            _ => {}
        }
    }
    counts.retain(|_, count| *count != 0);
    counts
}

#[sqlx::test(migrations = false)]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn raw_sql_of_every_kind_streams_the_rows_the_table_holds(pool: PgPool) {
    let url = url_of(&pool).await;
    exec(
        &pool,
        "create table items (id bigint primary key, key text not null unique, note text);
         alter table items replica identity using index items_key_key;
         create table other (id int primary key);
         create publication bloom_guard_test for table items, other;",
    )
    .await;
    let slot = Slot::create(&pool, &url).await;
    let mut stream = slot.stream(0).await;
    let statements = RAW_SQL.iter().chain(&[
        "update items set note = repeat('x', 100000) where id = 3",
        "insert into other values (1)",
        "begin; insert into items (id, key) values (7, 'rolled back'); rollback",
    ]);
    for sql in statements {
        exec(&pool, sql).await;
    }
    exec(&pool, "insert into items (id, key) values (100, 'end')").await;
    let (transactions, last) = read_until(&mut stream, "end").await;
    let table: BTreeMap<String, i64> = sqlx::query_scalar::<_, String>("select key from items")
        .fetch_all(&pool)
        .await
        .expect("keys")
        .into_iter()
        .map(|key| (key, 1))
        .collect();
    assert_eq!(counts(&transactions), table, "{transactions:?}");
    // The id change and the unwatched table record nothing; the rolled
    // back insert never comes.
    assert!(transactions
        .iter()
        .flatten()
        .all(|(_, key)| key != "rolled back"));
    stream.applied(last);
    stream.stop().await;

    // Started again from the slot: what was applied is not sent again as
    // new, and a new change comes once.
    exec(&pool, "insert into items (id, key) values (10, 'h')").await;
    let mut again = slot.stream(last).await;
    let (transactions, _) = read_until(&mut again, "h").await;
    let rows: Vec<_> = transactions.into_iter().flatten().collect();
    assert_eq!(rows, [('i', "h".to_owned())]);
    again.stop().await;
}

#[sqlx::test(migrations = false)]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn a_stream_started_before_its_last_acknowledgement_skips_what_was_applied(pool: PgPool) {
    let url = url_of(&pool).await;
    exec(
        &pool,
        "create table items (key text primary key);
         create publication bloom_guard_test for table items;",
    )
    .await;
    let slot = Slot::create(&pool, &url).await;
    let mut stream = slot.stream(0).await;
    exec(&pool, "insert into items values ('a')").await;
    exec(&pool, "delete from items where key = 'a'").await;
    exec(&pool, "insert into items values ('end')").await;
    let (first, last) = read_until(&mut stream, "end").await;
    assert_eq!(
        counts(&first),
        BTreeMap::from([("end".to_owned(), 1)]),
        "{first:?}"
    );
    // Stopped without telling the server: the slot sends both again, and
    // a stream that knows they were applied skips them.
    drop(stream);
    exec(&pool, "insert into items values ('b')").await;
    let mut again = slot.stream(last).await;
    let (second, _) = read_until(&mut again, "b").await;
    let rows: Vec<_> = second.into_iter().flatten().collect();
    assert_eq!(rows, [('i', "b".to_owned())], "a change applied twice");
    again.stop().await;
}

#[sqlx::test(migrations = false)]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn a_truncate_streams_a_truncation_of_the_guard(pool: PgPool) {
    let url = url_of(&pool).await;
    exec(
        &pool,
        "create table items (key text primary key);
         create publication bloom_guard_test for table items;",
    )
    .await;
    let slot = Slot::create(&pool, &url).await;
    let mut stream = slot.stream(0).await;
    exec(&pool, "insert into items values ('a')").await;
    exec(&pool, "truncate items").await;
    exec(&pool, "insert into items values ('end')").await;
    let (transactions, _) = read_until(&mut stream, "end").await;
    assert_eq!(
        transactions,
        [
            vec![('i', "a".to_owned())],
            vec![('t', String::new())],
            vec![('i', "end".to_owned())]
        ]
    );
    stream.stop().await;
}

/// Each key's count in the feed's rows of guard `items`: inserts less
/// deletes, the keys left non-zero.
async fn feed_counts(pool: &PgPool) -> BTreeMap<String, i64> {
    sqlx::query_as::<_, (String, i64)>(
        "select key, sum(case kind when 'i' then 1 when 'd' then -1 else 0 end)::int8
           from bloom_guard.changes where guard = 'items' group by key
         having sum(case kind when 'i' then 1 when 'd' then -1 else 0 end) <> 0",
    )
    .fetch_all(pool)
    .await
    .expect("feed rows")
    .into_iter()
    .collect()
}

async fn table_counts(pool: &PgPool) -> BTreeMap<String, i64> {
    sqlx::query_scalar::<_, String>("select key from items")
        .fetch_all(pool)
        .await
        .expect("keys")
        .into_iter()
        .map(|key| (key, 1))
        .collect()
}

/// Waits until the feed holds `key`.
async fn until_fed(pool: &PgPool, key: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let fed: bool = sqlx::query_scalar(
            "select exists (select from bloom_guard.changes where guard = 'items' and key = $1)",
        )
        .bind(key)
        .fetch_one(pool)
        .await
        .expect("look at the feed");
        if fed {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{key} never reached the feed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Stops the slot's reader, as a network fault or a killed instance does.
async fn kill_reader(pool: &PgPool, slot: &str) {
    sqlx::query(
        "select pg_terminate_backend(active_pid) from pg_replication_slots
          where slot_name = $1 and active_pid is not null",
    )
    .bind(slot)
    .execute(pool)
    .await
    .expect("terminate the reader");
}

/// The feed, the log feed's tables and `items` on it.
async fn log_fed_items(pool: &PgPool) -> (String, Slot) {
    let url = url_of(pool).await;
    crate::install(pool).await.expect("install the feed");
    exec(
        pool,
        "create table items (id bigint primary key, key text not null unique);
         alter table items replica identity using index items_key_key;",
    )
    .await;
    crate::Watch::table("items")
        .key("key")
        .install_log(pool)
        .await
        .expect("put items on the log feed");
    let slot = Slot {
        name: super::install::slot_name(pool).await.expect("slot name"),
        url: url.clone(),
    };
    (url, slot)
}

#[sqlx::test(migrations = false)]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn two_producers_write_each_change_once_through_killed_connections(pool: PgPool) {
    let (url, slot) = log_fed_items(&pool).await;
    let stop = tokio_util::sync::CancellationToken::new();
    for _ in 0..2 {
        let producer = Producer::new(pool.clone(), &url).await.expect("producer");
        tokio::spawn(producer.run(stop.clone()));
    }
    for (n, sql) in RAW_SQL.iter().enumerate() {
        exec(&pool, sql).await;
        until_fed(&pool, "a").await;
        // The reader goes down mid-stream, before the server heard of
        // what was written: the slot sends it again, to either producer.
        if n % 3 == 2 {
            kill_reader(&pool, &slot.name).await;
        }
    }
    exec(&pool, "insert into items (id, key) values (100, 'end')").await;
    until_fed(&pool, "end").await;
    assert_eq!(feed_counts(&pool).await, table_counts(&pool).await);

    // Both stopped, their reader killed before the server heard of the
    // last acknowledgement: a producer started again is sent what the
    // server did not hear of, and writes only what is new.
    stop.cancel();
    tokio::time::sleep(Duration::from_millis(300)).await;
    kill_reader(&pool, &slot.name).await;
    let stop = tokio_util::sync::CancellationToken::new();
    let producer = Producer::new(pool.clone(), &url).await.expect("producer");
    tokio::spawn(producer.run(stop.clone()));
    exec(&pool, "insert into items (id, key) values (101, 'after')").await;
    until_fed(&pool, "after").await;
    assert_eq!(feed_counts(&pool).await, table_counts(&pool).await);
    stop.cancel();
}

#[sqlx::test(migrations = false)]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn a_table_has_one_feed_and_a_key_the_log_cannot_carry_is_refused(pool: PgPool) {
    let (_url, _slot) = log_fed_items(&pool).await;
    let triggers = crate::Watch::table("items").key("key").install(&pool).await;
    assert!(
        matches!(triggers, Err(crate::FeedError::LogFed(_))),
        "{triggers:?}"
    );
    exec(
        &pool,
        "create table watched (key text primary key);
         create table by_id (id bigint primary key, key text not null unique);
         create table full_rows (id bigint primary key, key text not null);
         alter table full_rows replica identity full;",
    )
    .await;
    crate::Watch::table("watched")
        .key("key")
        .install(&pool)
        .await
        .expect("watch with triggers");
    let log = crate::Watch::table("watched")
        .key("key")
        .install_log(&pool)
        .await;
    assert!(matches!(log, Err(LogInstallError::Triggers(_))), "{log:?}");
    let by_id = crate::Watch::table("by_id")
        .key("key")
        .install_log(&pool)
        .await;
    assert!(
        matches!(by_id, Err(LogInstallError::Identity { .. })),
        "{by_id:?}"
    );
    crate::Watch::table("full_rows")
        .key("key")
        .install_log(&pool)
        .await
        .expect("a full replica identity carries the key");
    // Uninstalled, nothing of the log feed is left on the server.
    crate::uninstall(&pool).await.expect("uninstall");
    let left: i64 = sqlx::query_scalar(
        "select (select count(*) from pg_replication_slots where database = current_database())
              + (select count(*) from pg_publication)",
    )
    .fetch_one(&pool)
    .await
    .expect("count");
    assert_eq!(left, 0);
}
