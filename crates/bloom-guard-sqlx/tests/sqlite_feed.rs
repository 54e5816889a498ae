//! The SQLite change feed: two instances on one file and the `sqlite3`
//! shell see each other's keys.

mod common;

use std::str::FromStr;
use std::time::Duration;

use bloom_guard::{stats::GuardState, BloomGuard};
use bloom_guard_sqlx::{sqlite, Watch};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use sqlx::SqlitePool;

async fn open(path: &std::path::Path) -> SqlitePool {
    let options = SqliteConnectOptions::from_str(&format!("sqlite://{}", path.display()))
        .expect("options")
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal);
    SqlitePoolOptions::new()
        .max_connections(2)
        .connect_with(options)
        .await
        .expect("open")
}

/// A SQLite file of its own, in a new folder, with `schema` run on it.
async fn fresh(schema: &str) -> (std::path::PathBuf, SqlitePool) {
    let dir = std::env::temp_dir().join(format!("bloom-guard-sqlite-{}", fastrand::u64(..)));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let pool = open(&dir.join("items.db")).await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(schema.to_owned()))
        .execute(&pool)
        .await
        .expect("schema");
    (dir, pool)
}

async fn wait_for(guard: &BloomGuard, key: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
    while !(guard.stats().state == GuardState::Ready && guard.may_contain(key)) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{key} did not arrive within 1 s"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn two_instances_and_the_sqlite3_shell_see_each_others_keys() {
    let dir = std::env::temp_dir().join(format!("bloom-guard-sqlite-{}", fastrand::u64(..)));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("items.db");
    let (one, two) = (open(&path).await, open(&path).await);
    sqlx::raw_sql(
        "create table items (id integer primary key, key not null unique);
         insert into items (key) values ('seeded'), (x'ff00');",
    )
    .execute(&one)
    .await
    .expect("schema");
    let items = Watch::table("items").key("key");
    items.install(&one).await.expect("install");
    items.install(&two).await.expect("install twice");

    let guards = [BloomGuard::builder().build(), BloomGuard::builder().build()];
    for (guard, pool) in guards.iter().zip([&one, &two]) {
        tokio::spawn(sqlite::Follower::new(guard.clone(), pool.clone(), items.clone()).run());
    }
    for guard in &guards {
        wait_for(guard, "seeded").await;
        assert_eq!(guard.stats().skipped_keys, 1, "the BLOB key");
    }
    sqlx::query("insert into items (key) values ('from-one')")
        .execute(&one)
        .await
        .expect("insert");
    sqlx::query("update items set id = id + 100, key = 'renamed' where key = 'seeded'")
        .execute(&two)
        .await
        .expect("update");
    shell(
        &path,
        "insert into items (key) values ('from-the-shell'), (42);",
    )
    .await;
    for guard in &guards {
        wait_for(guard, "from-one").await;
        wait_for(guard, "renamed").await;
        assert!(!guard.may_contain("never-written"));
    }
    for guard in &guards {
        wait_for(guard, "from-the-shell").await;
        wait_for(guard, "42").await;
    }
    assert_eq!(guards[0].stats().generation, 1, "no key needed a rebuild");
    one.close().await;
    two.close().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs a follower until the returned sender is dropped.
fn follow(guard: &BloomGuard, pool: &SqlitePool) -> tokio::sync::oneshot::Sender<()> {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let follower = sqlite::Follower::new(
        guard.clone(),
        pool.clone(),
        Watch::table("items").key("key"),
    );
    tokio::spawn(follower.run_until(async move {
        let _ = stopped.await;
    }));
    stop
}

async fn ready(guard: &BloomGuard) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !guard.is_ready() {
        assert!(tokio::time::Instant::now() < deadline, "not ready in 10 s");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn instances_on_one_file_share_snapshots_and_refuse_damaged_ones() {
    use bloom_guard::stats::FilterOrigin;
    let dir = std::env::temp_dir().join(format!("bloom-guard-sqlite-{}", fastrand::u64(..)));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("items.db");
    let pool = open(&path).await;
    sqlx::raw_sql(
        "create table items (id integer primary key, key not null unique);
         with recursive n(i) as (select 1 union all select i + 1 from n where i < 1000)
         insert into items (key) select 'k' || i from n;",
    )
    .execute(&pool)
    .await
    .expect("schema");
    Watch::table("items")
        .key("key")
        .install(&pool)
        .await
        .expect("install");

    // The first instance scans and publishes.
    let first = BloomGuard::builder().build();
    let stop = follow(&first, &pool);
    ready(&first).await;
    assert_eq!(first.stats().origin, Some(FilterOrigin::Scan));
    let mut published = 0;
    for _ in 0..500 {
        published = sqlx::query_scalar("select count(*) from bloom_guard_snapshots")
            .fetch_one(&pool)
            .await
            .expect("count");
        if published > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(published, 1, "the first instance publishes its scan");
    drop(stop);

    // A key written by the shell between the starts.
    shell(
        &path,
        "insert into items (key) values ('between-the-starts');",
    )
    .await;
    let second = BloomGuard::builder().build();
    let _second = follow(&second, &open(&path).await);
    ready(&second).await;
    assert_eq!(second.stats().origin, Some(FilterOrigin::Snapshot));
    assert!(second.may_contain("between-the-starts") && second.may_contain("k1000"));
    assert!(!second.may_contain("never-written"));

    // A damaged snapshot is refused: the next instance scans.
    for damage in [
        "update bloom_guard_snapshot_chunks set data = substr(data, 1, 100)
            || (case when substr(data, 101, 1) = x'00' then x'01' else x'00' end) || substr(data, 102)",
        "update bloom_guard_snapshot_chunks set data = substr(data, 1, length(data) - 10)",
    ] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(damage))
            .execute(&pool)
            .await
            .expect("damage");
        let third = BloomGuard::builder().build();
        let stop = follow(&third, &open(&path).await);
        ready(&third).await;
        assert_eq!(third.stats().origin, Some(FilterOrigin::Scan), "{damage}");
        assert!(third.may_contain("between-the-starts"));
        drop(stop);
        // Its scan published a whole snapshot again; damage that one next.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `COLLATE NOCASE` finds `edgecase` for `EdgeCase`: a text guard over
/// such a column stays open and names the key type to use, and a
/// case-insensitive one answers.
#[tokio::test]
async fn a_key_type_stricter_than_its_column_keeps_the_guard_open() {
    let dir = std::env::temp_dir().join(format!("bloom-guard-sqlite-{}", fastrand::u64(..)));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let pool = open(&dir.join("profiles.db")).await;
    sqlx::raw_sql(
        "create table profiles (id integer primary key, username text not null collate nocase unique);
         insert into profiles (username) values ('EdgeCase');",
    )
    .execute(&pool)
    .await
    .expect("schema");
    let profiles = Watch::table("profiles").key("username");
    profiles.install(&pool).await.expect("install");
    let text = BloomGuard::builder().build();
    let case_insensitive = BloomGuard::builder()
        .key_type(bloom_guard::KeyType::CaseInsensitiveText)
        .build();
    for guard in [&text, &case_insensitive] {
        tokio::spawn(sqlite::Follower::new(guard.clone(), pool.clone(), profiles.clone()).run());
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while text.stats().generation == 0 || !case_insensitive.is_ready() {
        assert!(tokio::time::Instant::now() < deadline, "no first filter");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let stats = text.stats();
    assert_eq!(stats.state, GuardState::Warming);
    assert!(!text.is_ready());
    assert!(text.may_contain("edgecase") && text.may_contain("nobody"));
    let error = stats.last_error.unwrap_or_default();
    assert!(error.contains("KeyType::CaseInsensitiveText"), "{error}");
    wait_for(&case_insensitive, "EDGECASE").await;
    assert!(!case_insensitive.may_contain("nobody"));
}

/// A table rebuilt the SQLite way (new table, copy, drop, rename) loses the
/// feed's triggers: the guard fails open, names the trigger, and once the
/// watch is installed again rebuilds with the keys written meanwhile.
#[tokio::test]
async fn a_dropped_trigger_fails_the_guard_open_until_the_watch_is_repaired() {
    let dir = std::env::temp_dir().join(format!("bloom-guard-sqlite-{}", fastrand::u64(..)));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let pool = open(&dir.join("items.db")).await;
    sqlx::raw_sql(
        "create table items (id integer primary key, key not null unique);
         insert into items (key) values ('seeded');",
    )
    .execute(&pool)
    .await
    .expect("schema");
    let items = Watch::table("items").key("key");
    items.install(&pool).await.expect("install");
    let guard = BloomGuard::builder().build();
    tokio::spawn(
        sqlite::Follower::new(guard.clone(), pool.clone(), items.clone())
            .check_interval(Duration::from_millis(20))
            .run(),
    );
    wait_for(&guard, "seeded").await;
    sqlx::raw_sql(
        "create table items_new (id integer primary key, key not null unique);
         insert into items_new select * from items;
         drop table items;
         alter table items_new rename to items;
         insert into items (key) values ('unseen');",
    )
    .execute(&pool)
    .await
    .expect("the SQLite way of altering a table");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    while guard.stats().state != GuardState::Degraded {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the gap was not noticed"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let error = guard.stats().last_error.unwrap_or_default();
    assert!(error.contains("bloom_guard_items_inserted"), "{error}");
    assert!(guard.may_contain("unseen"), "failing open");
    items.install(&pool).await.expect("repair");
    wait_for(&guard, "unseen").await;
    assert!(!guard.may_contain("never-written"));
}

/// An operator's rebuild on one instance is adopted by another on the same
/// file, which scans no more.
#[tokio::test]
async fn a_fleet_rebuild_on_one_instance_reaches_the_other() {
    let dir = std::env::temp_dir().join(format!("bloom-guard-sqlite-{}", fastrand::u64(..)));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("items.db");
    let (one, two) = (open(&path).await, open(&path).await);
    sqlx::raw_sql(
        "create table items (id integer primary key, key not null unique);
         insert into items (key) values ('seeded'), (x'ff00');",
    )
    .execute(&one)
    .await
    .expect("schema");
    let items = Watch::table("items").key("key");
    items.install(&one).await.expect("install");
    let guards = [BloomGuard::builder().build(), BloomGuard::builder().build()];
    for (guard, pool) in guards.iter().zip([&one, &two]) {
        tokio::spawn(
            sqlite::Follower::new(guard.clone(), pool.clone(), items.clone())
                .check_interval(Duration::from_millis(20))
                .run(),
        );
        wait_for(guard, "seeded").await;
    }
    let generation = guards[1].stats().generation;
    let rebuilt =
        bloom_guard_sqlx::FleetRebuild::sqlite(guards[0].clone(), one.clone(), items.clone())
            .rebuild()
            .await
            .expect("a rebuild, BLOB key and all");
    assert_eq!(rebuilt.skipped_keys, 1);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    while guards[1].stats().generation == generation {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the rebuild was not adopted"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let adopted = guards[1].stats();
    assert_eq!(
        adopted.origin,
        Some(bloom_guard::stats::FilterOrigin::Snapshot)
    );
    assert!(guards[1].may_contain("seeded"));
}

#[tokio::test]
async fn an_instance_started_after_a_bulk_load_protects_from_its_first_filter() {
    use bloom_guard::stats::FilterOrigin;
    let dir = std::env::temp_dir().join(format!("bloom-guard-sqlite-{}", fastrand::u64(..)));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("items.db");
    let pool = open(&path).await;
    sqlx::raw_sql("create table items (id integer primary key, key text not null unique)")
        .execute(&pool)
        .await
        .expect("schema");
    Watch::table("items")
        .key("key")
        .install(&pool)
        .await
        .expect("install");
    // The instance that ran the migrations published the empty table.
    publish_snapshot(&pool).await;
    // A bulk load in one statement.
    sqlx::raw_sql(
        "with recursive n(i) as (select 1 union all select i + 1 from n where i < 200000)
         insert into items (key) select 'k' || i from n",
    )
    .execute(&pool)
    .await
    .expect("bulk load");

    let guard = BloomGuard::builder().build();
    let _stop = follow(&guard, &open(&path).await);
    ready(&guard).await;
    let rejected = (0..1_000)
        .filter(|i| !guard.may_contain(format!("never-stored-{i}")))
        .count();
    assert!(rejected >= 990, "{rejected} of 1000 absent keys rejected");
    let stats = guard.stats();
    assert_eq!(
        (stats.generation, stats.origin),
        (1, Some(FilterOrigin::Scan)),
        "one scan, not the snapshot: {stats:?}"
    );
    assert!(stats.estimated_fpp <= stats.target_fpp, "{stats:?}");
    assert!((1..=200_000)
        .step_by(997)
        .all(|i| guard.may_contain(format!("k{i}"))));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(guard.stats().generation, 1, "and no rebuild after it");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A file of its own, with `items` holding `seeded` keys and watched.
async fn watched_file(seeded: usize) -> (std::path::PathBuf, SqlitePool) {
    let dir = std::env::temp_dir().join(format!("bloom-guard-sqlite-{}", fastrand::u64(..)));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("items.db");
    let pool = open(&path).await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "create table items (id integer primary key, key text not null unique);
         with recursive n(i) as (select 1 union all select i + 1 from n where i < {seeded})
         insert into items (key) select 'seeded-' || i from n;"
    )))
    .execute(&pool)
    .await
    .expect("schema");
    Watch::table("items")
        .key("key")
        .install(&pool)
        .await
        .expect("install");
    (path, pool)
}

/// Runs `command` in the `sqlite3` shell, another client of the file. It
/// waits for locks the followers' connections hold, as an app would, and
/// runs off the test's runtime thread: blocking that thread would stall a
/// follower in the middle of a transaction, whose lock the shell then
/// waits for in vain.
async fn shell(path: &std::path::Path, command: &str) {
    let (path, command) = (path.to_owned(), command.to_owned());
    let status = tokio::task::spawn_blocking(move || {
        let status = std::process::Command::new("sqlite3")
            .args(["-cmd", ".timeout 10000"])
            .arg(&path)
            .arg(&command)
            .status()
            .expect("the sqlite3 shell on PATH");
        (status, command)
    })
    .await
    .expect("the shell's thread");
    assert!(status.0.success(), "{}", status.1);
}

/// Waits until `guard` answers from its filter and holds every key.
async fn serves(guard: &BloomGuard, what: &str, keys: &[String]) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !(guard.stats().state == GuardState::Ready && keys.iter().all(|k| guard.may_contain(k))) {
        assert!(tokio::time::Instant::now() < deadline, "{what}: not served");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!guard.may_contain("never-written"), "{what}");
}

#[tokio::test]
async fn a_restore_of_an_older_backup_is_noticed_and_rebuilt() {
    let (path, pool) = watched_file(10).await;
    let guard = BloomGuard::builder().build();
    let _stop = follow(&guard, &pool);
    ready(&guard).await;
    let backup = path.with_file_name("backup.db");
    shell(&path, &format!(".backup '{}'", backup.display())).await;
    shell(
        &path,
        "insert into items (key) select 'after-backup-' || value from generate_series(1, 20);",
    )
    .await;
    let after_backup: Vec<String> = (1..=20).map(|i| format!("after-backup-{i}")).collect();
    serves(&guard, "the keys after the backup", &after_backup).await;
    // The feed goes back under the reader: new rows take ids it has passed.
    shell(&path, &format!(".restore '{}'", backup.display())).await;
    shell(
        &path,
        "insert into items (key) select 'after-restore-' || value from generate_series(1, 10);",
    )
    .await;
    let after_restore: Vec<String> = (1..=10).map(|i| format!("after-restore-{i}")).collect();
    serves(&guard, "the keys written after the restore", &after_restore).await;
    let _ = std::fs::remove_dir_all(path.parent().expect("dir"));
}

/// Publishes a snapshot of `pool`'s file from a first instance, then stops it.
async fn publish_snapshot(pool: &SqlitePool) {
    let first = BloomGuard::builder().build();
    let stop = follow(&first, pool);
    ready(&first).await;
    for _ in 0..500 {
        let published: i64 = sqlx::query_scalar("select count(*) from bloom_guard_snapshots")
            .fetch_one(pool)
            .await
            .expect("count");
        if published > 0 {
            drop(stop);
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("no snapshot was published");
}

#[tokio::test]
async fn a_snapshot_is_replayed_from_its_own_position_whatever_its_row_says() {
    use bloom_guard::stats::FilterOrigin;
    let (path, pool) = watched_file(10).await;
    publish_snapshot(&pool).await;
    shell(
        &path,
        "insert into items (key) select 'after-' || value from generate_series(1, 30);",
    )
    .await;
    // The position column says the snapshot has everything; its bytes
    // (checksummed) say where to replay from.
    sqlx::query("update bloom_guard_snapshots set position = '1000000'")
        .execute(&pool)
        .await
        .expect("tamper");
    let guard = BloomGuard::builder().build();
    let _stop = follow(&guard, &pool);
    ready(&guard).await;
    assert_eq!(guard.stats().origin, Some(FilterOrigin::Snapshot));
    let after: Vec<String> = (1..=30).map(|i| format!("after-{i}")).collect();
    serves(&guard, "the keys after the snapshot", &after).await;
    let _ = std::fs::remove_dir_all(path.parent().expect("dir"));
}

#[tokio::test]
async fn a_snapshot_copied_from_another_file_is_refused() {
    use bloom_guard::stats::FilterOrigin;
    let (other_path, other) = watched_file(5).await;
    publish_snapshot(&other).await;
    other.close().await;
    let (path, pool) = watched_file(100).await;
    // The other file's snapshot, rows and chunks, copied in.
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "attach database '{}' as other;
         insert into bloom_guard_snapshots
         select id + 1000, guard, format, fingerprint, position, scanned_at, created_at, len, keys
           from other.bloom_guard_snapshots;
         insert into bloom_guard_snapshot_chunks
         select snapshot + 1000, seq, data from other.bloom_guard_snapshot_chunks;
         detach database other;",
        other_path.display()
    )))
    .execute(&pool)
    .await
    .expect("copy the snapshot");
    let guard = BloomGuard::builder().build();
    let _stop = follow(&guard, &pool);
    ready(&guard).await;
    assert_eq!(guard.stats().origin, Some(FilterOrigin::Scan));
    let seeded: Vec<String> = (1..=100).map(|i| format!("seeded-{i}")).collect();
    serves(&guard, "this file's keys", &seeded).await;
    for path in [path, other_path] {
        let _ = std::fs::remove_dir_all(path.parent().expect("dir"));
    }
}

#[tokio::test]
async fn a_key_that_is_not_utf8_does_not_stall_the_feed() {
    let (path, pool) = watched_file(3).await;
    let guard = BloomGuard::builder().build();
    let _stop = follow(&guard, &pool);
    ready(&guard).await;
    shell(
        &path,
        "insert into items (key) values (cast(x'ff61' as text)); insert into items (key) values ('after-it');",
    ).await;
    serves(
        &guard,
        "the key after a non-UTF-8 one",
        &["after-it".to_owned()],
    )
    .await;
    let _ = std::fs::remove_dir_all(path.parent().expect("dir"));
}

/// `COLLATE RTRIM` ignores trailing spaces: under `SpacePaddedText` the
/// guard protects such a column. A model: random keys written by SQL
/// before the start and through the feed after it, and random spellings
/// asked through the guard, each against `=` in the database.
#[tokio::test]
async fn rtrim_under_space_padded_text_refuses_only_absent_spellings() {
    let mut rng = common::seeded("BLOOM_GUARD_SEED");
    let dir = std::env::temp_dir().join(format!("bloom-guard-sqlite-{}", fastrand::u64(..)));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let pool = open(&dir.join("codes.db")).await;
    sqlx::raw_sql("create table items (id integer primary key, key text not null collate rtrim)")
        .execute(&pool)
        .await
        .expect("schema");
    Watch::table("items")
        .key("key")
        .install(&pool)
        .await
        .expect("install");
    let insert = async |key: String| {
        sqlx::query("insert into items (key) values (?)")
            .bind(key)
            .execute(&pool)
            .await
            .expect("insert by SQL");
    };
    for _ in 0..20 {
        insert(common::spelling(&mut rng)).await;
    }
    let guard = BloomGuard::builder()
        .key_type(bloom_guard::KeyType::SpacePaddedText)
        .build();
    let _stop = follow(&guard, &pool);
    ready(&guard).await;
    common::answers_as_the_table(
        &mut rng,
        &guard,
        insert,
        async |key: &str| {
            sqlx::query_scalar("select exists(select 1 from items where key = ?)")
                .bind(key)
                .fetch_one(&pool)
                .await
                .expect("the table's answer")
        },
        async |key: &str| common::status(&guard, key).await,
    )
    .await;
    assert_eq!(guard.stats().last_error, None);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `Watch::uninstall` drops a table's triggers (its writes no
/// longer reach the feed), and `sqlite::uninstall` everything the feed
/// installed, leaving the application's tables as they were.
#[tokio::test]
async fn uninstall_removes_a_tables_triggers_then_the_whole_feed() {
    let (dir, pool) =
        fresh("create table items (id integer primary key, key not null unique)").await;
    let items = Watch::table("items").key("key");
    items.install(&pool).await.expect("install");
    let count = |sql: &'static str| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(sql)
                .fetch_one(&pool)
                .await
                .expect(sql)
        }
    };
    let ours = "select count(*) from sqlite_master where name like 'bloom\\_guard\\_%' escape '\\'";
    let triggers = "select count(*) from sqlite_master where type = 'trigger'";
    let feed_rows = "select count(*) from bloom_guard_changes";
    sqlx::raw_sql("insert into items (key) values ('recorded')")
        .execute(&pool)
        .await
        .expect("insert");
    let recorded = count(feed_rows).await;
    assert_eq!(count(triggers).await, 3);

    items.uninstall(&pool).await.expect("unwatch");
    assert_eq!(count(triggers).await, 0);
    sqlx::raw_sql("insert into items (key) values ('unrecorded')")
        .execute(&pool)
        .await
        .expect("insert");
    assert_eq!(count(feed_rows).await, recorded, "a write reached the feed");

    items.install(&pool).await.expect("watch again");
    bloom_guard_sqlx::sqlite::uninstall(&pool)
        .await
        .expect("uninstall");
    assert_eq!(count(ours).await, 0);
    assert_eq!(count("select count(*) from items").await, 2);
    items.install(&pool).await.expect("install again");
    assert_eq!(count(triggers).await, 3);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A key column of numeric affinity (`7.0` is found by `7`) is refused at
/// watch, naming the column; nothing is installed on it.
#[tokio::test]
async fn a_key_column_no_key_type_compares_is_refused_at_watch() {
    let (dir, pool) = fresh("create table prices (amount numeric not null)").await;
    let watched = Watch::table("prices").key("amount").install(&pool).await;
    let Err(bloom_guard_sqlx::FeedError::Uncomparable(why)) = watched else {
        panic!("{watched:?}");
    };
    assert!(
        why.contains("prices.amount") && why.contains("numeric affinity"),
        "{why}"
    );
    let triggers: i64 =
        sqlx::query_scalar("select count(*) from sqlite_master where type = 'trigger'")
            .fetch_one(&pool)
            .await
            .expect("triggers");
    assert_eq!(triggers, 0);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Installing over a current feed changes nothing (SQLite's schema
/// version stays, so no write lock was taken and no statement of another
/// connection is prepared again); a trigger dropped by hand is put back.
#[tokio::test]
async fn installing_again_over_a_current_feed_writes_nothing() {
    let (dir, pool) =
        fresh("create table items (id integer primary key, key not null unique)").await;
    let items = Watch::table("items").key("key");
    items.install(&pool).await.expect("install");
    let version = || async {
        sqlx::query_scalar::<_, i64>("pragma schema_version")
            .fetch_one(&pool)
            .await
            .expect("schema version")
    };
    let installed = version().await;
    items.install(&pool).await.expect("install again");
    assert_eq!(
        version().await,
        installed,
        "installing again changed the schema"
    );
    sqlx::raw_sql("drop trigger bloom_guard_items_deleted")
        .execute(&pool)
        .await
        .expect("drop a trigger");
    items.install(&pool).await.expect("repair");
    let triggers: i64 =
        sqlx::query_scalar("select count(*) from sqlite_master where type = 'trigger'")
            .fetch_one(&pool)
            .await
            .expect("triggers");
    assert_eq!(triggers, 3);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every code point of the Basic Multilingual Plane alone, after and
/// before an ASCII letter, and with trailing spaces, stored under
/// `COLLATE NOCASE` and under `COLLATE RTRIM` (half scanned, half through
/// the feed), with the key type `Watch::key_type` picks; every probe (each
/// stored string, its upper and lower case, trailing spaces) that SQLite
/// finds there (`join ... on p.w = t.w`, its own equality) must be found
/// by the guard, and absent keys are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_spelling_nocase_and_rtrim_find_is_found() {
    for collation in ["nocase", "rtrim"] {
        let (dir, pool) = fresh(&format!(
            "create table words (id integer primary key, w text collate {collation} not null);
             create index words_w on words (w);
             create table probes (w text collate {collation} not null);"
        ))
        .await;
        let watch = Watch::table("words").key("w");
        watch.install(&pool).await.expect("install");
        let key_type = watch.key_type(&pool).await.expect("the key type");
        let expected = match collation {
            "nocase" => bloom_guard::KeyType::CaseInsensitiveText,
            _ => bloom_guard::KeyType::SpacePaddedText,
        };
        assert_eq!(key_type, expected, "{collation}");
        let corpus = common::spellings::corpus(true);
        let probes = common::spellings::probes(&corpus);
        let insert = async |table: &str, rows: &[String]| {
            for chunk in rows.chunks(5_000) {
                let values = vec!["(?)"; chunk.len()].join(", ");
                let mut query = sqlx::query(sqlx::AssertSqlSafe(format!(
                    "insert into {table} (w) values {values}"
                )));
                for row in chunk {
                    query = query.bind(row);
                }
                query.execute(&pool).await.expect("insert");
            }
        };
        let (scanned, fed) = corpus.split_at(corpus.len() / 2);
        insert("words", scanned).await;
        let guard = BloomGuard::builder()
            .key_type(key_type)
            .expected_items(corpus.len() as u64 * 2)
            .false_positive_rate(0.001)
            .build();
        let follower = sqlite::Follower::new(guard.clone(), pool.clone(), watch);
        let task = tokio::spawn(follower.run());
        insert("words", fed).await;
        insert("words", &["zz-last".to_owned()]).await;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while !(guard.is_ready() && guard.may_contain("zz-last")) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{collation}: not caught up"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        insert("probes", &probes).await;
        let matched: Vec<String> = sqlx::query_scalar(
            "select p.w from probes p where exists (select 1 from words t where t.w = p.w)",
        )
        .fetch_all(&pool)
        .await
        .expect("the probes SQLite finds");
        common::spellings::assert_exact(collation, &guard, &matched, corpus.len());
        task.abort();
        pool.close().await;
        let _ = std::fs::remove_dir_all(dir);
    }
}
