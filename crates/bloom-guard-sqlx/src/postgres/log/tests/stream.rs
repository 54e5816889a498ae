//! The slot's stream: raw SQL of every kind gives the rows the triggers
//! would record, once, and a stream started again skips what was applied.

use super::*;

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
        // What no trigger sees: a replica-role session (a logical
        // replica's apply, pg_restore --disable-triggers), and a bulk
        // load with the table's triggers disabled.
        "begin; set local session_replication_role = replica;
         insert into items (id, key) values (30, 'replica'); delete from items where key = 'f';
         commit",
        "begin; alter table items disable trigger all;
         copy items (id, key) from program 'printf \"31\\tbulk1\\n32\\tbulk2\\n\"';
         update items set key = 'bulk3' where key = 'bulk2';
         alter table items enable trigger all; commit",
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
    // back insert never comes; the replica session and the bulk load
    // with triggers disabled are in the counts above.
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
    let (slot, mut stream) = published_items(&pool).await;
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
    let (_slot, mut stream) = published_items(&pool).await;
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

/// `items (key text primary key)`, published, and a stream of a slot made
/// after.
async fn published_items(pool: &PgPool) -> (Slot, LogStream) {
    let url = url_of(pool).await;
    exec(
        pool,
        "create table items (key text primary key);
         create publication bloom_guard_test for table items;",
    )
    .await;
    let slot = Slot::create(pool, &url).await;
    let stream = slot.stream(0).await;
    (slot, stream)
}
