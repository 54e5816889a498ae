//! A MariaDB Galera cluster of three nodes, writes on every node: guards
//! that follow two of the nodes protect, and refuse no key committed on
//! any node before a request, through a node killed mid-write. The
//! cluster is the test's own (`.ci/galera`, free ports on loopback, a
//! node evicted 2 s after it stops answering).

#![cfg(feature = "mysql")]

mod common;

use std::path::PathBuf;
use std::str::FromStr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bloom_guard::BloomGuard;
use bloom_guard_sqlx::mysql;
use common::mysql::items;
use common::{guard, spawn, status, wait_until};
use http::StatusCode;
use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};
use sqlx::MySqlPool;

/// The cluster, stopped and removed on drop.
struct Galera {
    dir: PathBuf,
    urls: Vec<String>,
}

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.ci/galera")
}

impl Galera {
    fn start() -> Self {
        let dir = std::env::temp_dir().join(format!("bloom-guard-galera-{}", fastrand::u64(..)));
        let output = std::process::Command::new(script())
            .arg("start")
            .arg(&dir)
            .output()
            .expect("run .ci/galera");
        assert!(
            output.status.success(),
            ".ci/galera start: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let urls = String::from_utf8_lossy(&output.stdout)
            .trim()
            .split(',')
            .map(str::to_owned)
            .collect();
        Self { dir, urls }
    }

    /// Kills node `n` (1-based) at once, as a crash would.
    fn kill(&self, n: usize) {
        let pid = std::fs::read_to_string(self.dir.join(format!("node{n}/pid")))
            .expect("the node's pid file");
        let killed = std::process::Command::new("kill")
            .args(["-9", pid.trim()])
            .status()
            .expect("run kill");
        assert!(killed.success());
    }

    async fn pool(&self, n: usize, database: &str) -> MySqlPool {
        let options = MySqlConnectOptions::from_str(&self.urls[n - 1])
            .expect("a node's URL")
            .database(database);
        MySqlPoolOptions::new()
            .max_connections(6)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(options)
            .await
            .expect("connect to a node")
    }
}

impl Drop for Galera {
    fn drop(&mut self) {
        let _ = std::process::Command::new(script())
            .arg("stop")
            .arg(&self.dir)
            .output();
    }
}

fn follower(guard: &BloomGuard, pool: &MySqlPool) -> mysql::Follower {
    mysql::Follower::new(guard.clone(), pool.clone(), items())
        .check_interval(Duration::from_millis(500))
        .poll_interval(Duration::from_millis(500))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(galera),
    ignore = "needs MariaDB with the Galera 4 provider (packages mariadb-server, galera-4, rsync)"
)]
async fn guards_on_galera_refuse_no_key_written_on_any_node_through_a_node_killed() {
    let cluster = Galera::start();
    {
        let admin = cluster.pool(1, "test").await;
        sqlx::raw_sql(
            "create database galera_items;
             create table galera_items.items (id bigint auto_increment primary key,
                 code varchar(200) collate utf8mb4_nopad_bin not null,
                 key items_code (code))",
        )
        .execute(&admin)
        .await
        .expect("the table");
        admin.close().await;
    }
    let nodes = [
        cluster.pool(1, "galera_items").await,
        cluster.pool(2, "galera_items").await,
        cluster.pool(3, "galera_items").await,
    ];
    // The binary log feed is refused on Galera, and says why: each node
    // logs apart.
    #[cfg(feature = "binlog-feed")]
    {
        let refused = items()
            .install_log(&nodes[0])
            .await
            .expect_err("the binary log feed on Galera");
        assert!(
            refused.to_string().contains("Galera"),
            "the refusal does not say why: {refused}"
        );
    }
    items().install(&nodes[0]).await.expect("install the feed");
    // Right after the feed's DDL on node 1, a write on node 2 may lose
    // certification to it (error 1213): Galera's answer is to try again.
    for attempt in 1.. {
        match sqlx::raw_sql(
            "insert into items (code) values ('before-1'), ('before-2'), ('before-3')",
        )
        .execute(&nodes[1])
        .await
        {
            Ok(_) => break,
            Err(sqlx::Error::Database(error))
                if error.code().as_deref() == Some("40001") && attempt < 10 =>
            {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(error) => panic!("rows before: {error}"),
        }
    }

    // Two instances, each on a node of its own.
    let guards = [guard(), guard()];
    let _running = [
        spawn(follower(&guards[0], &nodes[0])),
        spawn(follower(&guards[1], &nodes[1])),
    ];
    for guard in &guards {
        wait_until("ready on Galera", Duration::from_secs(30), || {
            guard.is_ready()
        })
        .await;
    }

    // Writers on every node, each key asked of both guards right after its
    // commit; node 3 is killed a third of the way through.
    let false_negatives = Arc::new(AtomicUsize::new(0));
    let written = Arc::new(AtomicUsize::new(0));
    let run = Duration::from_secs(15);
    let writers: Vec<_> = nodes
        .iter()
        .enumerate()
        .map(|(n, pool)| {
            let (pool, guards) = (pool.clone(), guards.clone());
            let (false_negatives, written) = (false_negatives.clone(), written.clone());
            tokio::spawn(async move {
                let deadline = tokio::time::Instant::now() + run;
                let mut i = 0;
                while tokio::time::Instant::now() < deadline {
                    i += 1;
                    let key = format!("node{}-{i}", n + 1);
                    let inserted = sqlx::query("insert into items (code) values (?)")
                        .bind(&key)
                        .execute(&pool)
                        .await;
                    if inserted.is_err() {
                        // The killed node: its writes end there.
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                    written.fetch_add(1, Ordering::Relaxed);
                    for guard in &guards {
                        if status(guard, &key).await == StatusCode::NOT_FOUND {
                            false_negatives.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            })
        })
        .collect();
    let absent = tokio::spawn({
        let guards = guards.clone();
        async move {
            let (mut asked, mut refused) = (0, 0);
            let deadline = tokio::time::Instant::now() + run;
            while tokio::time::Instant::now() < deadline {
                for guard in &guards {
                    asked += 1;
                    if status(guard, &format!("absent-{asked}")).await == StatusCode::NOT_FOUND {
                        refused += 1;
                    }
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            (asked, refused)
        }
    });
    tokio::time::sleep(run / 3).await;
    cluster.kill(3);
    for writer in writers {
        writer.await.expect("a writer");
    }
    let (asked, refused) = absent.await.expect("the absent keys");
    let written = written.load(Ordering::Relaxed);
    eprintln!(
        "{written} keys written on three nodes, {} refused; {refused} of {asked} absent keys refused",
        false_negatives.load(Ordering::Relaxed)
    );
    assert!(written > 100, "only {written} keys written");
    assert_eq!(
        false_negatives.load(Ordering::Relaxed),
        0,
        "keys committed before a request refused ({written} written)"
    );
    // While the cluster waits to evict the killed node (2 s here), no
    // read can be causal: those refusals go on to the handler.
    assert!(
        refused * 100 >= asked * 95,
        "{refused} of {asked} absent keys refused: {:?}",
        guards.iter().map(BloomGuard::stats).collect::<Vec<_>>()
    );
    for guard in &guards {
        assert!(guard.is_ready(), "{:?}", guard.stats());
    }
}
