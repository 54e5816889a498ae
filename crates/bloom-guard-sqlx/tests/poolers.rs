//! Followers behind PgBouncer (the distribution's package, started by each
//! test on a port of its own): in transaction mode they stop at start with
//! an error that names the fix, instead of retrying forever or following
//! with broken sessions; in session mode they follow.

mod common;

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use bloom_guard::BloomGuard;
use bloom_guard_sqlx::{postgres, FeedError};
use common::*;
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;

/// A PgBouncer of its own, stopped when dropped.
struct Bouncer {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Bouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Bouncer {
    /// PgBouncer in `mode` in front of the test's server, with `ignored`
    /// startup parameters, as a user would configure it.
    fn start(pool: &PgPool, mode: &str, ignored: &str) -> Self {
        let options = pool.connect_options();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free port")
            .port();
        let dir = tempfile::tempdir().expect("a folder");
        let path = |name: &str| dir.path().join(name);
        std::fs::write(
            path("users.txt"),
            format!("\"{}\" \"\"\n", options.get_username()),
        )
        .expect("users");
        std::fs::write(
            path("pgbouncer.ini"),
            format!(
                "[databases]\n* = host={host} port={pg_port}\n\
                 [pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\n\
                 auth_type = trust\nauth_file = {users}\npool_mode = {mode}\n\
                 ignore_startup_parameters = {ignored}\nunix_socket_dir =\n\
                 logfile = {log}\n",
                host = options.get_host(),
                pg_port = options.get_port(),
                users = path("users.txt").display(),
                log = path("pgbouncer.log").display(),
            ),
        )
        .expect("config");
        // PgBouncer refuses to run as root: as the database's user then.
        let binary = PathBuf::from(option_env!("BLOOM_GUARD_PGBOUNCER").unwrap_or("pgbouncer"));
        let root = Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|out| out.stdout.starts_with(b"0\n"));
        let mut command = if root {
            for file in ["", "users.txt", "pgbouncer.ini"] {
                let _ = Command::new("chown")
                    .args(["postgres", &path(file).display().to_string()])
                    .status();
            }
            // `setpriv` runs it in its own place, so a kill reaches it.
            let mut command = Command::new("setpriv");
            command
                .args([
                    "--reuid=postgres",
                    "--regid=postgres",
                    "--init-groups",
                    "--",
                ])
                .arg(&binary);
            command
        } else {
            Command::new(&binary)
        };
        let child = command
            .arg(path("pgbouncer.ini"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start pgbouncer");
        let bouncer = Self {
            child,
            port,
            _dir: dir,
        };
        for _ in 0..100 {
            if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return bouncer;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("pgbouncer did not listen on {port}");
    }

    /// Stops PgBouncer, and ends the server sessions it held open on the
    /// test's database, so the database can be dropped.
    async fn stop(mut self, pool: &PgPool) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        exec(
            pool,
            "select pg_terminate_backend(pid) from pg_stat_activity
              where datname = current_database() and pid <> pg_backend_pid()",
        )
        .await;
    }

    /// A pool of the test's database through this PgBouncer.
    fn pool(&self, pool: &PgPool) -> PgPool {
        let options = pool
            .connect_options()
            .as_ref()
            .clone()
            .host("127.0.0.1")
            .port(self.port);
        PgPoolOptions::new()
            .max_connections(4)
            .connect_lazy_with(options)
    }
}

/// Through `bouncer`, the session check fails for a reason that says
/// `why`, and a follower stops by itself.
async fn refused(pool: &PgPool, bouncer: Bouncer, why: &str) {
    let through = bouncer.pool(pool);
    match postgres::check_session(&through).await {
        Err(FeedError::Pooler(reason)) => assert!(reason.contains(why), "{reason}"),
        other => panic!("{other:?}"),
    }
    follower_stops(&through).await;
    through.close().await;
    bouncer.stop(pool).await;
}

/// A follower through `through` stops by itself, its guard naming the
/// pooler.
async fn follower_stops(through: &PgPool) {
    let guard = BloomGuard::builder().expected_items(100).build();
    let run = tokio::spawn(postgres::Follower::new(guard.clone(), through.clone(), items()).run());
    tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .expect("the follower stopped")
        .expect("the follower's task");
    let reason = guard.stats().last_error.unwrap_or_default();
    assert!(reason.contains("pooler"), "{reason}");
    assert!(!guard.is_ready());
}

#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(
    not(all(database, pgbouncer)),
    ignore = "needs Postgres and PgBouncer: set DATABASE_URL, install pgbouncer"
)]
async fn in_transaction_mode_a_follower_stops_at_start_naming_the_fix(pool: PgPool) {
    install(&pool).await;
    // The parameter PgBouncer would refuse let through: the connections
    // come up, and only the sessions break.
    let bouncer = Bouncer::start(&pool, "transaction", "extra_float_digits,options");
    refused(&pool, bouncer, "LISTEN").await;
}

#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(
    not(all(database, pgbouncer)),
    ignore = "needs Postgres and PgBouncer: set DATABASE_URL, install pgbouncer"
)]
async fn a_pooler_that_refuses_the_startup_parameters_is_named(pool: PgPool) {
    install(&pool).await;
    let bouncer = Bouncer::start(&pool, "transaction", "extra_float_digits");
    refused(&pool, bouncer, "startup parameter").await;
}

#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(
    not(all(database, pgbouncer)),
    ignore = "needs Postgres and PgBouncer: set DATABASE_URL, install pgbouncer"
)]
async fn in_session_mode_a_follower_follows(pool: PgPool) {
    install(&pool).await;
    let bouncer = Bouncer::start(&pool, "session", "extra_float_digits,options");
    let through = bouncer.pool(&pool);
    postgres::check_session(&through)
        .await
        .expect("sessions kept");
    let guard = guard();
    let task = spawn(follower(&guard, &through));
    wait_until("ready", Duration::from_secs(20), || guard.is_ready()).await;
    exec(&pool, "insert into items (key) values ('through')").await;
    arrives(&guard, &["through"]).await;
    drop(task);
    through.close().await;
    bouncer.stop(&pool).await;
}
