//! The log feed against a real Postgres (`DATABASE_URL`, with
//! `wal_level=logical`): the slot's stream (`stream`), the producer and
//! a table put on the log feed (`producer`), a transaction too large to
//! hold whole (`parts`), and reads with the barrier
//! and from a scan's point (`read`); the helpers they share.

use std::collections::BTreeMap;
use std::time::Duration;

use sqlx::PgPool;

mod parts;
mod producer;
mod read;
mod stream;

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
        LogStream::start(
            &self.url,
            None,
            &self.name,
            "bloom_guard_test",
            &tables,
            after,
        )
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
        if let Event::Committed { end, rows, .. } = event {
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

/// Each key's count in the feed's rows of guard `items`: inserts less
/// deletes, the keys left non-zero.
async fn feed_counts(pool: &PgPool) -> BTreeMap<String, i64> {
    sqlx::query_as::<_, (String, i64)>(
        "select key, sum(case kind when 'i' then 1 when 'd' then -1 else 0 end)::int8
           from bloom_guard.log_changes where guard = 'items' group by key
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
            "select exists (select from bloom_guard.log_changes where guard = 'items' and key = $1)",
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
    crate::postgres::install(pool)
        .await
        .expect("install the feed");
    exec(
        pool,
        "create table items (id bigint primary key, key text not null unique);
         alter table items replica identity using index items_key_key;",
    )
    .await;
    crate::watch::Watch::table("items")
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

/// Applies a read's rows for guard `items` to `counts`, as a counting
/// filter would; a delete of a key the counts do not hold is a change
/// applied twice (it would remove another key's fingerprint).
fn apply(counts: &mut BTreeMap<String, i64>, rows: &[FeedRow]) {
    for row in rows.iter().filter(|row| row.guard == "items") {
        let count = counts.entry(row.key.clone()).or_insert(0);
        match row.kind {
            b'i' => *count += 1,
            b'd' => {
                assert!(
                    *count > 0,
                    "a delete of {:?}, which the filter does not hold",
                    row.key
                );
                *count -= 1;
            }
            _ => {}
        }
    }
    counts.retain(|_, count| *count != 0);
}

/// One random write to `items`: a new key, a key changed, a row deleted,
/// or a delete and re-insert of a key in one transaction.
async fn random_write(pool: &PgPool, rng: &mut fastrand::Rng, next: &mut i64) {
    let id = rng.i64(0..=*next);
    let sql = match rng.u8(0..4) {
        0 | 1 => {
            *next += 1;
            format!("insert into items (id, key) values ({next}, 'k{next}')")
        }
        2 => format!("update items set key = key || 'x' where id = {id}"),
        _ => format!(
            "begin; delete from items where id = {id}; delete from items where id = {};
             insert into items (id, key) values ({id}, 'back{id}') on conflict do nothing; commit",
            rng.i64(0..=*next)
        ),
    };
    exec(pool, &sql).await;
}

async fn exec_in(tx: &mut sqlx::PgConnection, sql: &str) {
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
        .execute(tx)
        .await
        .unwrap_or_else(|error| panic!("{sql}: {error}"));
}
