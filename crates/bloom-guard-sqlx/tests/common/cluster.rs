//! Throwaway Postgres servers of a test's own (a publisher, a primary and
//! its streaming standby), each on a free port of 127.0.0.1 with its own
//! data folder, and a TCP proxy that a test switches from one server to
//! another, as a failover switches a virtual address.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::Connection as _;

/// The server binaries.
fn bin() -> PathBuf {
    PathBuf::from(option_env!("BLOOM_GUARD_PG_BIN").unwrap_or("/usr/lib/postgresql/15/bin"))
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

fn succeeded(what: &str, output: std::io::Result<Output>) {
    let output = output.unwrap_or_else(|error| panic!("run {what}: {error}"));
    assert!(
        output.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port()
}

/// A Postgres server of the test's own, stopped and deleted on drop.
pub(crate) struct Server {
    server: Option<Child>,
    pub(crate) port: u16,
    dir: PathBuf,
    account: Option<(u32, u32)>,
}

impl Server {
    /// A new cluster with `wal_level=logical`, ready for standbys and
    /// subscribers.
    pub(crate) async fn start() -> Self {
        let mut server = Self::folder();
        let initdb = as_account(&bin().join("initdb"), server.account)
            .arg("--pgdata")
            .arg(server.data())
            .args(["--username=postgres", "--auth=trust", "--encoding=UTF8"])
            .args(["--locale=C", "--no-sync"])
            .output();
        succeeded("initdb", initdb);
        server.run().await;
        server
    }

    /// A streaming standby of `primary`, from a base backup, replicating
    /// asynchronously.
    pub(crate) async fn standby_of(primary: &Self) -> Self {
        let mut server = Self::folder();
        let backup = as_account(&bin().join("pg_basebackup"), server.account)
            .arg("--pgdata")
            .arg(server.data())
            .args(["--host=127.0.0.1", "--username=postgres", "--no-sync"])
            .args(["--wal-method=stream", "--write-recovery-conf"])
            .arg(format!("--port={}", primary.port))
            .output();
        succeeded("pg_basebackup", backup);
        server.run().await;
        server
    }

    fn folder() -> Self {
        let account = server_account();
        let dir = std::env::temp_dir().join(format!("bloom-guard-server-{}", fastrand::u64(..)));
        std::fs::create_dir_all(&dir).expect("temporary directory");
        if let Some((uid, gid)) = account {
            std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).expect("chown");
        }
        Self {
            server: None,
            port: free_port(),
            dir,
            account,
        }
    }

    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    async fn run(&mut self) {
        let server = as_account(&bin().join("postgres"), self.account)
            .arg("-D")
            .arg(self.data())
            .arg("-p")
            .arg(self.port.to_string())
            .args(["-c", "listen_addresses=127.0.0.1"])
            .args(["-c", "wal_level=logical", "-c", "hot_standby=on"])
            .args(["-c", "fsync=off", "-c", "max_wal_senders=8"])
            .args(["-c", "max_replication_slots=8"])
            .arg("-c")
            .arg(format!("unix_socket_directories={}", self.dir.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start postgres");
        self.server = Some(server);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while sqlx::PgConnection::connect_with(&self.options())
            .await
            .is_err()
        {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the server did not start"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub(crate) fn options(&self) -> sqlx::postgres::PgConnectOptions {
        sqlx::postgres::PgConnectOptions::new()
            .host("127.0.0.1")
            .port(self.port)
            .username("postgres")
            .database("postgres")
    }

    /// Runs `sql` (statements without a transaction block of their own
    /// run one by one: `ALTER SYSTEM` refuses an implicit one).
    pub(crate) async fn exec(&self, sql: &str) {
        let mut conn = sqlx::PgConnection::connect_with(&self.options())
            .await
            .expect("connect to the server");
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
            .execute(&mut conn)
            .await
            .unwrap_or_else(|error| panic!("{sql}: {error}"));
    }

    /// One value `sql` returns.
    pub(crate) async fn scalar<T>(&self, sql: &str) -> T
    where
        T: for<'r> sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres> + Send + Unpin,
    {
        let mut conn = sqlx::PgConnection::connect_with(&self.options())
            .await
            .expect("connect to the server");
        sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()))
            .fetch_one(&mut conn)
            .await
            .unwrap_or_else(|error| panic!("{sql}: {error}"))
    }

    /// Stops the server at once, as a crash would: what it wrote and no
    /// standby received is lost with it.
    pub(crate) fn crash(&mut self) {
        let stop = as_account(&bin().join("pg_ctl"), self.account)
            .arg("--pgdata")
            .arg(self.data())
            .args(["--mode=immediate", "stop"])
            .output();
        succeeded("pg_ctl stop", stop);
        if let Some(mut server) = self.server.take() {
            let _ = server.wait();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut server) = self.server.take() {
            let _ = server.kill();
            let _ = server.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A TCP proxy on a port of its own that forwards each connection to the
/// server it points at; switched, it closes every connection it carries,
/// as a failover's virtual address does.
pub(crate) struct Proxy {
    pub(crate) port: u16,
    target: Arc<Mutex<u16>>,
    carried: Arc<Mutex<Vec<tokio::task::AbortHandle>>>,
    accept: tokio::task::JoinHandle<()>,
}

impl Proxy {
    pub(crate) async fn to(port: u16) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a proxy port");
        let own = listener.local_addr().expect("its address").port();
        let target = Arc::new(Mutex::new(port));
        let carried = Arc::new(Mutex::new(Vec::new()));
        let accept = tokio::spawn({
            let (target, carried) = (target.clone(), carried.clone());
            async move {
                while let Ok((mut client, _)) = listener.accept().await {
                    let port = *target.lock().expect("target");
                    let carry = tokio::spawn(async move {
                        if let Ok(mut server) =
                            tokio::net::TcpStream::connect(("127.0.0.1", port)).await
                        {
                            let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                        }
                    });
                    carried
                        .lock()
                        .expect("connections")
                        .push(carry.abort_handle());
                }
            }
        });
        Self {
            port: own,
            target,
            carried,
            accept,
        }
    }

    /// Points new connections at `port` and closes the ones carried.
    pub(crate) fn switch(&self, port: u16) {
        *self.target.lock().expect("target") = port;
        for connection in self.carried.lock().expect("connections").drain(..) {
            connection.abort();
        }
    }

    pub(crate) fn options(&self) -> sqlx::postgres::PgConnectOptions {
        sqlx::postgres::PgConnectOptions::new()
            .host("127.0.0.1")
            .port(self.port)
            .username("postgres")
            .database("postgres")
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.switch(0);
    }
}
