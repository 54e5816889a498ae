//! Rows that logical replication applies to a watched table reach the
//! guard: the initial copy, inserts, and updates that change the key. A
//! throwaway publisher cluster runs on 127.0.0.1 with `wal_level=logical`;
//! the test database subscribes to it.

mod common;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use bloom_guard::{BloomGuard, GuardState};
use common::*;
use sqlx::{Connection as _, PgPool};

/// A Postgres cluster of the test's own, stopped and deleted on drop.
struct Publisher {
    server: Child,
    port: u16,
    dir: PathBuf,
}

/// The `postgres` account when we are root (Postgres refuses to run as
/// root), as (uid, gid).
fn server_account() -> Option<(u32, u32)> {
    let id = |args: &[&str]| -> u32 {
        let output = Command::new("id").args(args).output().expect("run id");
        String::from_utf8_lossy(&output.stdout)
            .trim()
            .parse()
            .expect("a numeric id")
    };
    (id(&["-u"]) == 0).then(|| (id(&["-u", "postgres"]), id(&["-g", "postgres"])))
}

fn as_account(program: &Path, account: Option<(u32, u32)>) -> Command {
    use std::os::unix::process::CommandExt as _;
    let mut command = Command::new(program);
    if let Some((uid, gid)) = account {
        command.uid(uid).gid(gid);
    }
    command
}

impl Publisher {
    async fn start() -> Self {
        let bin = PathBuf::from(
            option_env!("BLOOM_GUARD_PG_BIN").unwrap_or("/usr/lib/postgresql/15/bin"),
        );
        let account = server_account();
        let dir = std::env::temp_dir().join(format!("bloom-guard-publisher-{}", fastrand::u64(..)));
        std::fs::create_dir_all(&dir).expect("temporary directory");
        if let Some((uid, gid)) = account {
            std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).expect("chown");
        }
        let data = dir.join("data");
        let initdb = as_account(&bin.join("initdb"), account)
            .arg("--pgdata")
            .arg(&data)
            .args(["--username=postgres", "--auth=trust", "--encoding=UTF8"])
            .args(["--locale=C", "--no-sync"])
            .output()
            .expect("run initdb");
        assert!(
            initdb.status.success(),
            "initdb: {}",
            String::from_utf8_lossy(&initdb.stderr)
        );
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free port")
            .port();
        let server = as_account(&bin.join("postgres"), account)
            .arg("-D")
            .arg(&data)
            .arg("-p")
            .arg(port.to_string())
            .args([
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                "wal_level=logical",
            ])
            .args(["-c", "fsync=off", "-c", "max_wal_senders=4"])
            .arg("-c")
            .arg(format!("unix_socket_directories={}", dir.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start postgres");
        let publisher = Self { server, port, dir };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while sqlx::PgConnection::connect_with(&publisher.options())
            .await
            .is_err()
        {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the publisher did not start"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        publisher
    }

    fn options(&self) -> sqlx::postgres::PgConnectOptions {
        sqlx::postgres::PgConnectOptions::new()
            .host("127.0.0.1")
            .port(self.port)
            .username("postgres")
            .database("postgres")
    }

    async fn exec(&self, sql: &str) {
        let mut conn = sqlx::PgConnection::connect_with(&self.options())
            .await
            .expect("connect to the publisher");
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
            .execute(&mut conn)
            .await
            .unwrap_or_else(|error| panic!("{sql}: {error}"));
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A subscription of the test database, dropped on drop (also when the
/// test fails): a database with a subscription cannot be dropped, and the
/// test harness drops old test databases before every test.
struct Subscription {
    name: String,
    options: sqlx::postgres::PgConnectOptions,
}

impl Subscription {
    async fn create(pool: &PgPool, publisher: &Publisher) -> Self {
        let name = format!("bloom_guard_items_{}", fastrand::u32(..));
        exec(
            pool,
            &format!(
                "create subscription {name}
                     connection 'host=127.0.0.1 port={} user=postgres dbname=postgres'
                     publication bloom_guard_items",
                publisher.port
            ),
        )
        .await;
        Self {
            name,
            options: (*pool.connect_options()).clone(),
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let (name, options) = (self.name.clone(), self.options.clone());
        // Its own thread and runtime: drop cannot wait on the test's.
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async move {
                let mut conn = sqlx::PgConnection::connect_with(&options).await?;
                // Without its slot, in case the publisher is gone.
                for sql in [
                    format!("alter subscription {name} disable"),
                    format!("alter subscription {name} set (slot_name = none)"),
                    format!("drop subscription {name}"),
                ] {
                    sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                        .execute(&mut conn)
                        .await?;
                }
                Ok::<_, sqlx::Error>(())
            })
        })
        .join();
        if !matches!(dropped, Ok(Ok(()))) {
            eprintln!("could not drop subscription {}: {dropped:?}", self.name);
        }
    }
}

/// Waits until the guard answers (ready, nothing held) and holds `keys`.
async fn served(guard: &BloomGuard, what: &str, keys: &[String]) {
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    // The check interval (200 ms here) and one rebuild.
    wait_until(what, Duration::from_secs(15), || {
        guard.stats().state == GuardState::Ready && holds_all(guard, &keys)
    })
    .await;
}

#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(
    not(all(database, pg_server)),
    ignore = "needs Postgres (DATABASE_URL) and the Postgres server binaries (PG_BIN)"
)]
async fn rows_a_subscription_applies_reach_the_guard(pool: PgPool) {
    let publisher = Publisher::start().await;
    publisher
        .exec(
            "create table items (
                 id bigint generated always as identity primary key,
                 key text not null unique,
                 value text not null default '');
             insert into items (key) select 'copied-' || i from generate_series(1, 100) i;
             create publication bloom_guard_items for table items",
        )
        .await;
    install(&pool).await;
    let (guard, _task) = followed(&pool).await;
    assert!(!guard.may_contain("copied-1"));

    let subscription = Subscription::create(&pool, &publisher).await;
    // The initial copy (COPY by the table-sync worker) fires row triggers
    // in the replica role, as the apply worker does.
    let copied: Vec<String> = (1..=100).map(|i| format!("copied-{i}")).collect();
    served(&guard, "the initial copy", &copied).await;
    // Once the subscription is synchronized, later rows must come through
    // the feed, not a rebuild.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let ready: Option<bool> =
            sqlx::query_scalar("select bool_and(srsubstate = 'r') from pg_subscription_rel")
                .fetch_one(&pool)
                .await
                .expect("subscription states");
        if ready == Some(true) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the subscription never synchronized"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let generation = guard.stats().generation;

    // The apply worker fires row triggers only.
    publisher
        .exec("insert into items (key) select 'applied-' || i from generate_series(1, 50) i")
        .await;
    let applied: Vec<String> = (1..=50).map(|i| format!("applied-{i}")).collect();
    served(&guard, "the applied inserts", &applied).await;
    publisher
        .exec("update items set key = 'renamed-' || key where key in ('applied-1', 'applied-2', 'copied-3')")
        .await;
    let renamed: Vec<String> = ["applied-1", "applied-2", "copied-3"]
        .iter()
        .map(|key| format!("renamed-{key}"))
        .collect();
    served(&guard, "the applied renames", &renamed).await;
    assert!(!guard.may_contain("never-written"));
    assert_eq!(
        guard.stats().generation,
        generation,
        "through the feed, not a rebuild"
    );

    drop(subscription);
    drop(publisher);
}
