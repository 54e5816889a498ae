//! Tests of `feed.rs`.

use super::*;
use crate::watch::Watch;

/// Feed rows this transaction fetched through the feed's indexes.
async fn rows_fetched(connection: &mut PgConnection) -> i64 {
    sqlx::query_scalar(
        "select coalesce(sum(idx_tup_fetch), 0)::int8 from pg_catalog.pg_stat_xact_user_tables
              where schemaname = 'bloom_guard' and relname like 'changes%'",
    )
    .fetch_one(connection)
    .await
    .expect("table statistics")
}

/// A catch-up of a quiet guard from a position before another guard's
/// bulk load reads its own rows through the index by guard, not the
/// other's rows through the index by transaction id.
#[sqlx::test(migrations = false)]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn a_read_from_far_behind_probes_only_its_own_guards_rows(pool: PgPool) {
    // Every substitution took: the guard and position are constants.
    assert!(!READ_BEHIND.contains("c.guard = m.guard") && !READ_BEHIND.contains("xmin(m.seen)"));
    crate::postgres::install(&pool)
        .await
        .expect("install the feed");
    for table in ["items", "users"] {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "create table {table} (key text primary key)"
        )))
        .execute(&pool)
        .await
        .expect("a table");
        Watch::table(table)
            .key("key")
            .install(&pool)
            .await
            .expect("watch");
    }
    let before = crate::postgres::store::snapshot::position_now(&pool)
        .await
        .expect("a position")
        .position;
    sqlx::raw_sql(
        "insert into items select 'item-' || g from generate_series(1, 20000) g;
             insert into users values ('ann'), ('bob'), ('cy');
             analyze bloom_guard.changes",
    )
    .execute(&pool)
    .await
    .expect("a bulk load");
    let mut tx = pool.begin().await.expect("a transaction");
    let read = read_since(
        &mut tx,
        behind(),
        &[FeedRead {
            name: "users",
            lowered: false,
            seen: &before,
        }],
    )
    .await
    .expect("a read");
    let Some(Read::Changes { changes, .. }) = read.first() else {
        panic!("no changes read: {read:?}");
    };
    assert_eq!(changes.added.len(), 3);
    let fetched = rows_fetched(&mut tx).await;
    assert!(
        fetched < 1_000,
        "the read fetched {fetched} feed rows: other guards' rows by transaction id"
    );
}
/// A position the server cannot have handed out (another timeline's, or
/// one whose transactions lie ahead of the server's) is never read
/// from: the read says the guard must rebuild, and reads no rows.
#[sqlx::test(migrations = false)]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn a_position_from_another_history_is_not_read_from(pool: PgPool) {
    crate::postgres::install(&pool)
        .await
        .expect("install the feed");
    sqlx::query("create table items (key text primary key)")
        .execute(&pool)
        .await
        .expect("a table");
    Watch::table("items")
        .key("key")
        .install(&pool)
        .await
        .expect("watch");
    let now = crate::postgres::store::snapshot::position_now(&pool)
        .await
        .expect("a position")
        .position;
    sqlx::query("insert into items values ('a'), ('b')")
        .execute(&pool)
        .await
        .expect("writes");
    let read = |seen: PgPosition| {
        let pool = pool.clone();
        async move {
            let mut connection = pool.acquire().await.expect("a connection");
            let feed = FeedRead {
                name: "items",
                lowered: false,
                seen: &seen,
            };
            let mut read = read_since(&mut connection, (READ.as_str(), false), &[feed])
                .await
                .expect("a read");
            read.pop().expect("one feed's read")
        }
    };
    // On this server's history: the two keys.
    let Read::Changes { changes, .. } = read(now.clone()).await else {
        panic!("a position of this timeline was not read from");
    };
    assert_eq!(changes.added.len(), 2);
    // The same snapshot on another timeline: a promoted standby's ids.
    let other = format!(
        "{:08X}/{}",
        u32::from_str_radix(now.timeline(), 16).expect("hex") + 1,
        now.snapshot()
    );
    let other = PgPosition::parse(&other).expect("a position");
    assert!(matches!(read(other).await, Read::Pruned));
    // Ids the server has not handed out yet: a position from a lost
    // history that ran ahead of this one.
    let xmax: i64 = sqlx::query_scalar(
        "select pg_catalog.pg_snapshot_xmax(pg_catalog.pg_current_snapshot())::text::int8",
    )
    .fetch_one(&pool)
    .await
    .expect("xmax");
    let ahead = format!("{}/{}:{}:", now.timeline(), xmax + 450, xmax + 450);
    let ahead = PgPosition::parse(&ahead).expect("a position");
    assert!(matches!(read(ahead).await, Read::Pruned));
}
