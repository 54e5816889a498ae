//! The SQLite change feed: two instances on one file and the `sqlite3`
//! shell see each other's keys.

use std::str::FromStr;
use std::time::Duration;

use bloom_guard::{BloomGuard, GuardState};
use bloom_guard_sqlx::{SqliteFollower, Watch};
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
    items.install_sqlite(&one).await.expect("install");
    items.install_sqlite(&two).await.expect("install twice");

    let guards = [BloomGuard::builder().build(), BloomGuard::builder().build()];
    for (guard, pool) in guards.iter().zip([&one, &two]) {
        tokio::spawn(SqliteFollower::new(guard.clone(), pool.clone(), items.clone()).run());
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
    let shell = std::process::Command::new("sqlite3")
        .arg(&path)
        .arg("insert into items (key) values ('from-the-shell'), (42);")
        .status()
        .expect("the sqlite3 shell on PATH");
    assert!(shell.success(), "sqlite3 failed");
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
