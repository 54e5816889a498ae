//! Where a MySQL feed could lose a key: a transaction list InnoDB serves
//! from an old copy, a feed pruned empty or pruned under an open
//! transaction, triggers rewritten by hand, writes that fire no trigger
//! (cascading foreign keys, tables outside InnoDB, exchanged partitions),
//! and every statement MySQL has for writing rows.

mod common;

use std::time::Duration;

use bloom_guard::{stats::GuardState, BloomGuard};
use bloom_guard_sqlx::{mysql, Watch};
use common::mysql::{busy_transaction_list, client, database, fresh, items, position};
use common::{spawn, status, wait_until, Running};
use http::StatusCode;
use sqlx::MySqlPool;

fn guard() -> BloomGuard {
    BloomGuard::builder()
        .expected_items(10_000)
        .false_positive_rate(0.001)
        .build()
}

fn follower(guard: &BloomGuard, pool: &MySqlPool, watch: Watch) -> mysql::Follower {
    mysql::Follower::new(guard.clone(), pool.clone(), watch)
        .check_interval(Duration::from_millis(200))
        .poll_interval(Duration::from_millis(200))
}

async fn followed(pool: &MySqlPool, watch: Watch) -> (BloomGuard, Running) {
    let guard = guard();
    let running = spawn(follower(&guard, pool, watch));
    wait_until("the warm-up", Duration::from_secs(20), || guard.is_ready()).await;
    (guard, running)
}

async fn exec(pool: &MySqlPool, sql: &str) {
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
        .execute(pool)
        .await
        .unwrap_or_else(|error| panic!("{sql}: {error}"));
}

/// Waits until the guard holds open for a reason that says `why`.
async fn held_open_because(guard: &BloomGuard, why: &str) {
    wait_until(
        &format!("the guard held open because of {why}"),
        Duration::from_secs(5),
        || {
            let stats = guard.stats();
            stats.state != GuardState::Ready
                && stats
                    .reason
                    .as_deref()
                    .is_some_and(|reason| reason.contains(why))
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(mysql_database), ignore = "needs MySQL or MariaDB: set MYSQL_URL")]
async fn a_late_commit_is_not_skipped_while_innodb_serves_an_old_transaction_list() {
    let pool = fresh(12).await;
    let (guard, _running) = followed(&pool, items()).await;
    // From here InnoDB serves the list as it was: without `late`.
    let reader = busy_transaction_list(&pool).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut late = pool.acquire().await.expect("connection");
    sqlx::raw_sql("begin; insert into items (code) values ('late')")
        .execute(&mut *late)
        .await
        .expect("late insert");
    exec(&pool, "insert into items (code) values ('early')").await;
    wait_until("the later id", Duration::from_secs(2), || {
        guard.may_contain("early")
    })
    .await;
    // Long enough for several rounds of the settling method.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        position(&guard).contains('~'),
        "the id of an open transaction was given up: {}",
        position(&guard)
    );
    sqlx::raw_sql("commit")
        .execute(&mut *late)
        .await
        .expect("commit");
    assert_ne!(status(&guard, "late").await, StatusCode::NOT_FOUND);
    wait_until("the late commit", Duration::from_secs(2), || {
        guard.may_contain("late")
    })
    .await;
    reader.abort();
    wait_until("the ids to settle", Duration::from_secs(5), || {
        !position(&guard).contains('~')
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(mysql_database), ignore = "needs MySQL or MariaDB: set MYSQL_URL")]
async fn a_follower_starting_on_a_feed_pruned_empty_becomes_ready() {
    let pool = fresh(8).await;
    exec(&pool, "insert into items (code) values ('a'), ('b')").await;
    // What a prune leaves once every row is older than the retention.
    exec(
        &pool,
        "update bloom_guard_horizon set below = (select max(id) + 1 from bloom_guard_changes);
         delete from bloom_guard_changes",
    )
    .await;
    let (guard, _running) = followed(&pool, items()).await;
    assert!(guard.may_contain("a") && guard.may_contain("b"));
    exec(&pool, "insert into items (code) values ('after')").await;
    assert_ne!(status(&guard, "after").await, StatusCode::NOT_FOUND);
    assert_eq!(status(&guard, "never-written").await, StatusCode::NOT_FOUND);
    assert_eq!(guard.stats().state, GuardState::Ready);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(mysql_database), ignore = "needs MySQL or MariaDB: set MYSQL_URL")]
async fn pruning_never_passes_the_id_of_an_open_transaction() {
    let pool = fresh(12).await;
    let first = guard();
    let _first = spawn(follower(&first, &pool, items()).retention(Duration::from_secs(1)));
    wait_until("the warm-up", Duration::from_secs(20), || first.is_ready()).await;
    let mut held = pool.acquire().await.expect("connection");
    sqlx::raw_sql("begin; insert into items (code) values ('held')")
        .execute(&mut *held)
        .await
        .expect("held insert");
    exec(&pool, "insert into items (code) values ('after-held')").await;
    // Every row is past the retention, and pruning runs meanwhile.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    // An instance starting now takes its position below the horizon's
    // clamp: the held id stays open for it.
    let second = guard();
    let _second = spawn(follower(&second, &pool, items()));
    wait_until("the second warm-up", Duration::from_secs(20), || {
        second.is_ready()
    })
    .await;
    sqlx::raw_sql("commit")
        .execute(&mut *held)
        .await
        .expect("commit");
    for guard in [&first, &second] {
        assert_ne!(status(guard, "held").await, StatusCode::NOT_FOUND);
        wait_until("the held key", Duration::from_secs(5), || {
            guard.may_contain("held")
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(mysql_database), ignore = "needs MySQL or MariaDB: set MYSQL_URL")]
async fn a_trigger_rewritten_by_hand_holds_the_guard_open_until_reinstalled() {
    let pool = fresh(8).await;
    let (guard, _running) = followed(&pool, items()).await;
    let name: String = sqlx::query_scalar(
        "select cast(trigger_name as char) from information_schema.triggers
          where trigger_schema = database() and event_manipulation = 'INSERT'",
    )
    .fetch_one(&pool)
    .await
    .expect("the insert trigger");
    // Same name, same event, a body that records nothing; replaced in one
    // statement where the server can (MariaDB), so no check sees it
    // missing.
    let rewritten =
        format!("trigger {name} after insert on items for each row set @ignored = new.code");
    let replaced = sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "create or replace {rewritten}"
    )))
    .execute(&pool)
    .await;
    if replaced.is_ok() {
        held_open_because(&guard, "is not as Watch::install puts it").await;
    } else {
        exec(&pool, &format!("drop trigger {name}; create {rewritten}")).await;
        held_open_because(&guard, &name).await;
    }
    exec(&pool, "insert into items (code) values ('while-rewritten')").await;
    // The follower puts the trigger back and rebuilds.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !(guard.stats().state == GuardState::Ready && guard.may_contain("while-rewritten")) {
        assert_ne!(
            status(&guard, "while-rewritten").await,
            StatusCode::NOT_FOUND
        );
        assert!(
            tokio::time::Instant::now() < deadline,
            "{:?}",
            guard.stats()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let body: String = sqlx::query_scalar(
        "select cast(action_statement as char) from information_schema.triggers
          where trigger_schema = database() and trigger_name = ?",
    )
    .bind(&name)
    .fetch_one(&pool)
    .await
    .expect("the trigger");
    assert!(body.contains("bloom_guard_changes"), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(mysql_database), ignore = "needs MySQL or MariaDB: set MYSQL_URL")]
async fn a_foreign_key_cascading_into_a_key_column_holds_the_guard_open() {
    let pool = fresh(8).await;
    exec(
        &pool,
        "create table parents (code varchar(200) collate utf8mb4_nopad_bin primary key);
         alter table items add constraint items_parent foreign key (code)
               references parents (code) on update cascade",
    )
    .await;
    let guard = guard();
    let _running = spawn(follower(&guard, &pool, items()));
    held_open_because(&guard, "ON UPDATE CASCADE").await;
    exec(
        &pool,
        "insert into parents values ('old'); insert into items (code) values ('old');
         update parents set code = 'cascaded' where code = 'old'",
    )
    .await;
    // The cascaded key is in no feed: the guard lets it through.
    assert_ne!(status(&guard, "cascaded").await, StatusCode::NOT_FOUND);
    // RESTRICT fires no hidden change: the guard comes back with the key.
    exec(
        &pool,
        "alter table items drop foreign key items_parent;
         alter table items add constraint items_parent foreign key (code)
               references parents (code) on update restrict",
    )
    .await;
    wait_until("the guard back", Duration::from_secs(10), || {
        guard.stats().state == GuardState::Ready && guard.may_contain("cascaded")
    })
    .await;
    assert_eq!(status(&guard, "never-written").await, StatusCode::NOT_FOUND);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(mysql_database), ignore = "needs MySQL or MariaDB: set MYSQL_URL")]
async fn a_table_outside_innodb_holds_the_guard_open() {
    let pool = fresh(8).await;
    // Aria on MariaDB, MyISAM on MySQL: neither rolls back with the feed.
    let engine = if sqlx::raw_sql("create table plain (code varbinary(200) not null) engine = Aria")
        .execute(&pool)
        .await
        .is_ok()
    {
        "Aria"
    } else {
        exec(
            &pool,
            "create table plain (code varbinary(200) not null) engine = MyISAM",
        )
        .await;
        "MyISAM"
    };
    let watch = Watch::table("plain").key("code");
    watch.install(&pool).await.expect("install");
    exec(&pool, "insert into plain values ('kept')").await;
    let guard = guard();
    let _running = spawn(follower(&guard, &pool, watch));
    held_open_because(&guard, &format!("its engine {engine}")).await;
    assert_ne!(status(&guard, "kept").await, StatusCode::NOT_FOUND);
    assert_ne!(status(&guard, "never-written").await, StatusCode::NOT_FOUND);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(mysql_database), ignore = "needs MySQL or MariaDB: set MYSQL_URL")]
async fn a_partition_exchanged_into_the_table_is_noticed_and_rebuilt() {
    let pool = fresh(8).await;
    exec(
        &pool,
        "create table parted (id bigint not null primary key, code varbinary(200) not null)
           partition by range (id) (partition p0 values less than (1000),
                                    partition p1 values less than maxvalue);
         insert into parted values (1, 'low'), (2000, 'high')",
    )
    .await;
    let watch = Watch::table("parted").key("code");
    watch.install(&pool).await.expect("install");
    let (guard, _running) = followed(&pool, watch).await;
    assert!(guard.may_contain("low") && guard.may_contain("high"));
    // Rows that never passed a trigger take partition p0's place.
    exec(
        &pool,
        "create table swap (id bigint not null primary key, code varbinary(200) not null);
         insert into swap values (5, 'swapped-in');
         alter table parted exchange partition p0 with table swap",
    )
    .await;
    wait_until(
        "the rebuild after the exchange",
        Duration::from_secs(10),
        || {
            guard.stats().state == GuardState::Ready
                && guard.may_contain("swapped-in")
                && !guard.may_contain("low")
        },
    )
    .await;
    assert!(guard.may_contain("high"));
    // TRUNCATE of one partition, the same way.
    exec(&pool, "alter table parted truncate partition p1").await;
    wait_until(
        "the rebuild after the partition's truncation",
        Duration::from_secs(10),
        || guard.stats().state == GuardState::Ready && !guard.may_contain("high"),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(mysql_database), ignore = "needs MySQL or MariaDB: set MYSQL_URL")]
async fn every_way_mysql_writes_rows_reaches_the_filter() {
    let pool = fresh(8).await;
    exec(
        &pool,
        "create table tags (id bigint auto_increment primary key,
                            code varchar(200) collate utf8mb4_nopad_bin not null unique)",
    )
    .await;
    let watch = Watch::table("tags").key("code");
    watch.install(&pool).await.expect("install");
    exec(
        &pool,
        "insert into tags (id, code) values (1, 'one'), (2, 'two'), (3, 'three')",
    )
    .await;
    let (guard, _running) = followed(&pool, watch).await;
    let db = database(&pool).await;
    let file = std::env::temp_dir().join(format!("bloom-guard-load-{db}.tsv"));
    std::fs::write(&file, "loaded-1\nloaded-2\n").expect("the load file");
    let loaded = tokio::task::spawn_blocking({
        let mut command = client("mariadb", &db);
        command.arg("--local-infile=1").arg("-e").arg(format!(
            "load data local infile '{}' into table tags (code)",
            file.display()
        ));
        move || command.status()
    })
    .await
    .expect("the client")
    .expect("run mariadb");
    assert!(loaded.success(), "LOAD DATA failed");
    let _ = std::fs::remove_file(&file);
    exec(
        &pool,
        // REPLACE deletes the row of a unique key it meets, then inserts.
        "replace into tags (id, code) values (1, 'replaced-one');
         replace into tags (code) values ('two');
         insert into tags (code) values ('three') on duplicate key update code = 'upserted-three';
         insert into tags (code) select concat(code, '-copy') from tags where code like 'loaded-%';
         update tags set id = id + 1000 where code = 'two';
         create table doomed (code varchar(200) collate utf8mb4_nopad_bin);
         insert into doomed values ('loaded-2-copy');
         delete tags from tags join doomed using (code);
         update tags join doomed set tags.code = 'joined' where tags.code = 'loaded-1-copy'",
    )
    .await;
    let stored: Vec<String> = sqlx::query_scalar("select cast(code as char) from tags")
        .fetch_all(&pool)
        .await
        .expect("the table");
    let mut expected = vec![
        "joined",
        "loaded-1",
        "loaded-2",
        "replaced-one",
        "two",
        "upserted-three",
    ];
    expected.sort_unstable();
    let mut sorted = stored.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, expected, "the statements did what they say");
    for key in &stored {
        assert_ne!(status(&guard, key).await, StatusCode::NOT_FOUND, "{key}");
    }
    wait_until("every key in the filter", Duration::from_secs(5), || {
        stored.iter().all(|key| guard.may_contain(key))
    })
    .await;
    for gone in ["one", "three", "loaded-1-copy", "loaded-2-copy"] {
        assert!(!guard.may_contain(gone), "{gone} was not forgotten");
    }
    assert_eq!(guard.stats().state, GuardState::Ready);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(mysql_database), ignore = "needs MySQL or MariaDB: set MYSQL_URL")]
async fn a_bulk_load_that_commits_after_later_writes_is_not_skipped() {
    const ROWS: usize = 50_000;
    let pool = fresh(8).await;
    let (guard, _running) = followed(&pool, items()).await;
    let mut bulk = pool.acquire().await.expect("connection");
    // Both cap recursion at 1000 by default, each with its own setting.
    for setting in ["cte_max_recursion_depth", "max_recursive_iterations"] {
        let _ = sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "set session {setting} = 1000000"
        )))
        .execute(&mut *bulk)
        .await;
    }
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "begin;
         insert into items (code)
           with recursive n (i) as (select 1 union all select i + 1 from n where i < {ROWS})
           select concat('bulk-', i) from n"
    )))
    .execute(&mut *bulk)
    .await
    .expect("the bulk load");
    exec(&pool, "insert into items (code) values ('after-bulk')").await;
    wait_until("the later write", Duration::from_secs(5), || {
        guard.may_contain("after-bulk")
    })
    .await;
    // The load's ids are one open run, read as a range.
    let open = position(&guard);
    assert!(open.contains('~') && open.contains('-'), "{open}");
    sqlx::raw_sql("commit")
        .execute(&mut *bulk)
        .await
        .expect("commit");
    assert_ne!(status(&guard, "bulk-1").await, StatusCode::NOT_FOUND);
    wait_until("the bulk load", Duration::from_secs(20), || {
        (1..=ROWS).all(|i| guard.may_contain(format!("bulk-{i}")))
    })
    .await;
    wait_until("the ids to settle", Duration::from_secs(5), || {
        !position(&guard).contains('~')
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(mysql_database), ignore = "needs MySQL or MariaDB: set MYSQL_URL")]
async fn rows_past_the_retention_are_pruned_though_no_id_was_left_open() {
    let pool = fresh(8).await;
    let guard = guard();
    let _running = spawn(follower(&guard, &pool, items()).retention(Duration::from_secs(1)));
    wait_until("the warm-up", Duration::from_secs(20), || guard.is_ready()).await;
    exec(&pool, "insert into items (code) values ('a'), ('b'), ('c')").await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let left: i64 = sqlx::query_scalar("select count(*) from bloom_guard_changes")
            .fetch_one(&pool)
            .await
            .expect("the feed");
        if left == 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{left} feed rows left past the retention"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    exec(&pool, "insert into items (code) values ('after-the-prune')").await;
    assert_ne!(
        status(&guard, "after-the-prune").await,
        StatusCode::NOT_FOUND
    );
    assert!(guard.may_contain("a") && guard.may_contain("c"));
    assert_eq!(guard.stats().state, GuardState::Ready);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(mysql_database), ignore = "needs MySQL or MariaDB: set MYSQL_URL")]
async fn a_prepared_xa_transaction_whose_client_left_is_not_skipped() {
    use sqlx::{ConnectOptions, Connection};
    let pool = fresh(8).await;
    let (guard, _running) = followed(&pool, items()).await;
    let xid = format!("bloom-guard-{}", fastrand::u64(..));
    // A transaction manager's client: it prepares, then goes away.
    let mut client = pool.connect_options().connect().await.expect("connect");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "xa start '{xid}'; insert into items (code) values ('xa-key'); xa end '{xid}'; xa prepare '{xid}'"
    )))
    .execute(&mut client)
    .await
    .expect("the prepared transaction");
    exec(&pool, "insert into items (code) values ('after-xa')").await;
    wait_until("the later id", Duration::from_secs(2), || {
        guard.may_contain("after-xa")
    })
    .await;
    // Rounds of the settling method see it with its client.
    tokio::time::sleep(Duration::from_millis(500)).await;
    client.close().await.expect("disconnect");
    // And without: the server keeps it prepared, under thread 0.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let kept_open = position(&guard);
    // The recovery commits it from another session (before any assertion:
    // a prepared transaction left behind would hold the whole server's
    // ids open).
    exec(&pool, &format!("xa commit '{xid}'")).await;
    assert!(
        kept_open.contains('~'),
        "the id of a prepared transaction was given up: {kept_open}"
    );
    assert_ne!(status(&guard, "xa-key").await, StatusCode::NOT_FOUND);
    wait_until(
        "the prepared transaction's key",
        Duration::from_secs(2),
        || guard.may_contain("xa-key"),
    )
    .await;
}

/// MariaDB's `utf8mb4_bin` and MySQL's PAD SPACE binary collations ignore
/// trailing spaces: under `SpacePaddedText` the guard protects a
/// `varchar` and a `char(n)` column of them. A model: random keys written
/// by SQL before the start and through the feed after it, and random
/// spellings asked through the guard, each against `=` in the database.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(mysql_database), ignore = "needs MySQL or MariaDB: set MYSQL_URL")]
async fn pad_space_binary_columns_under_space_padded_text_refuse_only_absent_spellings() {
    let mut rng = common::seeded("BLOOM_GUARD_SEED");
    let pool = fresh(4).await;
    for (column_type, table) in [
        ("varchar(20)", "padded_varchar"),
        ("char(6)", "padded_char"),
    ] {
        exec(
            &pool,
            &format!(
                "create table {table} (id bigint auto_increment primary key,
                                       code {column_type} collate utf8mb4_bin not null)"
            ),
        )
        .await;
        let watch = Watch::table(table).key("code");
        watch.install(&pool).await.expect("install");
        let insert = async |key: String| {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "insert into {table} (code) values (?)"
            )))
            .bind(key)
            .execute(&pool)
            .await
            .expect("insert by SQL");
        };
        for _ in 0..20 {
            insert(common::spelling(&mut rng)).await;
        }
        let guard = BloomGuard::builder()
            .name(table)
            .key_type(bloom_guard::KeyType::SpacePaddedText)
            .expected_items(1000)
            .build();
        let _running = spawn(follower(&guard, &pool, watch));
        wait_until("the warm-up", Duration::from_secs(20), || guard.is_ready()).await;
        common::answers_as_the_table(
            &mut rng,
            &guard,
            insert,
            async |key: &str| {
                sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                    "select exists(select 1 from {table} where code = ?)"
                )))
                .bind(key)
                .fetch_one(&pool)
                .await
                .expect("the table's answer")
            },
            async |key: &str| status(&guard, key).await,
        )
        .await;
        assert_eq!(guard.stats().last_error, None, "{column_type}");
    }
}
