//! The slot's stream against a real Postgres (`DATABASE_URL`, with
//! `wal_level=logical`): raw SQL of every kind gives the feed rows the
//! triggers would record, and a stream started again skips what was
//! applied.

use std::collections::BTreeMap;
use std::time::Duration;

use sqlx::PgPool;

use super::rows::FeedRow;
use super::stream::{Event, LogStream, LoggedTable};

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
        let tables = [LoggedTable {
            schema: "public".into(),
            table: "items".into(),
            guards: vec![("items".into(), vec!["key".into()])],
        }];
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
    let statements = [
        "insert into items (id, key) values (1, 'a'), (2, 'b'), (3, 'c')",
        "update items set key = 'a2' where id = 1",
        "update items set id = 20 where id = 2",
        "update items set note = repeat('x', 100000) where id = 3",
        "insert into items (id, key) values (4, 'd') on conflict (id) do update set key = excluded.key",
        "insert into items (id, key) values (4, 'd4') on conflict (id) do update set key = excluded.key",
        "merge into items t using (values (5, 'e'), (3, 'c3')) s(id, key) on t.id = s.id
           when matched then update set key = s.key when not matched then insert (id, key) values (s.id, s.key)",
        "begin; delete from items where id = 20; insert into items (id, key) values (6, 'b'); commit",
        "delete from items where key = 'e'",
        "insert into other values (1)",
        "begin; insert into items (id, key) values (7, 'rolled back'); rollback",
        "copy items (id, key) from program 'printf \"8\\tf\\n9\\tg\\n\"'",
    ];
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
