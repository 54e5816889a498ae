//! A MySQL or MariaDB database of a test's own, from `MYSQL_URL`.

use std::str::FromStr;

use bloom_guard_sqlx::Watch;
use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};
use sqlx::{ConnectOptions, Connection, MySqlPool};

/// `items (id, code)`, `code` compared byte for byte, watched.
pub(crate) fn items() -> Watch {
    Watch::table("items").key("code")
}

/// A new database with `items` and the feed installed.
pub(crate) async fn fresh(max_connections: u32) -> MySqlPool {
    let url = std::env::var("MYSQL_URL").expect("MYSQL_URL");
    let options = MySqlConnectOptions::from_str(&url).expect("MYSQL_URL");
    let name = format!("bloom_guard_test_{}", fastrand::u64(..));
    let mut admin = options.connect().await.expect("connect to MySQL");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("create database {name}")))
        .execute(&mut admin)
        .await
        .expect("create the test database");
    let _ = admin.close().await;
    let pool = MySqlPoolOptions::new()
        .max_connections(max_connections)
        .connect_with(options.database(&name))
        .await
        .expect("connect to the test database");
    sqlx::raw_sql(
        "create table items (id bigint auto_increment primary key,
                             code varchar(200) collate utf8mb4_nopad_bin not null,
                             key items_code (code))",
    )
    .execute(&pool)
    .await
    .expect("create items");
    items().install(&pool).await.expect("install");
    pool
}

/// The database `pool` is connected to.
pub(crate) async fn database(pool: &MySqlPool) -> String {
    sqlx::query_scalar("select database()")
        .fetch_one(pool)
        .await
        .expect("the database's name")
}

/// A command line of the MariaDB or MySQL client `program` (`mariadb`,
/// `mariadb-dump`) for `database` on the `MYSQL_URL` server.
pub(crate) fn client(program: &str, database: &str) -> std::process::Command {
    let url = std::env::var("MYSQL_URL").expect("MYSQL_URL");
    let rest = url.trim_start_matches("mysql://");
    let (credentials, address) = rest.split_once('@').unwrap_or(("root", rest));
    let (user, password) = credentials.split_once(':').unwrap_or((credentials, ""));
    let address = address.split('/').next().unwrap_or(address);
    let (host, port) = address.split_once(':').unwrap_or((address, "3306"));
    let mut command = std::process::Command::new(program);
    command
        .arg("--no-defaults")
        .args(["-h", host, "-P", port, "-u", user])
        .arg(format!("--password={password}"))
        .arg(database);
    command
}

/// Another pool on `pool`'s database whose sessions default to
/// `isolation` (`read committed`, `serializable`), as a server or a pool
/// may be configured.
pub(crate) async fn with_isolation(
    pool: &MySqlPool,
    isolation: &'static str,
    max_connections: u32,
) -> MySqlPool {
    let options = (*pool.connect_options()).clone();
    MySqlPoolOptions::new()
        .max_connections(max_connections)
        .after_connect(move |conn, _| {
            Box::pin(async move {
                sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                    "set session transaction isolation level {isolation}"
                )))
                .execute(conn)
                .await
                .map(|_| ())
            })
        })
        .connect_with(options)
        .await
        .expect("connect with another isolation level")
}

/// Reads InnoDB's list of running transactions every 30 ms until dropped,
/// as a monitoring agent or another guard might: InnoDB then serves the
/// same old copy of it. The copy kept is one that lists no transaction,
/// the copy most apt to pass for a moment when all is settled.
pub(crate) async fn busy_transaction_list(pool: &MySqlPool) -> tokio::task::JoinHandle<()> {
    let pool = pool.clone();
    let list = || async {
        sqlx::query_scalar::<_, i64>("select count(*) from information_schema.innodb_trx")
            .fetch_one(&pool)
            .await
            .expect("the transaction list")
    };
    // Left unread for over 100 ms, the list is made anew at the next read.
    for _ in 0..50 {
        tokio::time::sleep(std::time::Duration::from_millis(120)).await;
        if list().await == 0 {
            break;
        }
    }
    let pool = pool.clone();
    tokio::spawn(async move {
        loop {
            let _ = sqlx::query("select count(*) from information_schema.innodb_trx")
                .fetch_one(&pool)
                .await;
            tokio::time::sleep(std::time::Duration::from_millis(30)).await;
        }
    })
}

/// The feed position of `guard`'s follower, as its stats show it (open ids
/// after a `~`).
pub(crate) fn position(guard: &bloom_guard::BloomGuard) -> String {
    guard
        .stats()
        .feed
        .map(|feed| feed.position)
        .unwrap_or_default()
}

/// A MariaDB server of the test's own (`.ci/mariadb start DIR [tls]`): its
/// `url` for the user `bloom`, and `root` statements over its socket;
/// stopped when dropped.
pub(crate) struct Server {
    pub(crate) dir: tempfile::TempDir,
    pub(crate) url: String,
}

impl Server {
    fn script() -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.ci/mariadb")
    }

    /// Starts one, with TLS (a user `bloom_tls` that connects over TLS
    /// only, the CA at `dir/tls/ca.pem`) where `tls` says so.
    pub(crate) fn start(tls: bool) -> Self {
        Self::start_as(tls, 1)
    }

    /// [`Server::start`] with server id `id` (a replica needs its own).
    /// A start that fails (a port taken between its choice and the
    /// server's bind, a machine too busy for the script's wait) is tried
    /// twice more, each in a new folder.
    pub(crate) fn start_as(tls: bool, id: u32) -> Self {
        let mut failed = String::new();
        for _ in 0..3 {
            let dir = tempfile::tempdir().expect("a folder for the server");
            let mut command = std::process::Command::new(Self::script());
            command
                .arg("start")
                .arg(dir.path())
                .env("MARIADB_SERVER_ID", id.to_string());
            if tls {
                command.arg("tls");
            }
            let out = command.output().expect(".ci/mariadb");
            if out.status.success() {
                let url = String::from_utf8_lossy(&out.stdout).trim().to_owned();
                return Self { dir, url };
            }
            let log =
                |name: &str| std::fs::read_to_string(dir.path().join(name)).unwrap_or_default();
            failed.push_str(&format!(
                "\n{}: {}\ninstall.log: {}\nerror.log: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr),
                log("install.log"),
                log("error.log"),
            ));
            let _ = std::process::Command::new(Self::script())
                .arg("stop")
                .arg(dir.path())
                .output();
        }
        panic!("the test's MariaDB server did not start: {failed}");
    }

    /// Runs `sql` as the server's `root` (users, rights).
    pub(crate) fn root(&self, sql: &str) {
        self.client(sql, &[]);
    }

    /// The server's port.
    pub(crate) fn port(&self) -> u16 {
        self.url
            .rsplit_once(':')
            .and_then(|(_, rest)| rest.split('/').next())
            .and_then(|port| port.parse().ok())
            .expect("a port in the URL")
    }

    /// The value of `sql` as the server's `root` sees it (one column, one
    /// row).
    pub(crate) fn root_value(&self, sql: &str) -> String {
        self.client(sql, &["-N", "-B"])
    }

    /// What the `mariadb` client prints for `sql`, as `root`, with `args`.
    fn client(&self, sql: &str, args: &[&str]) -> String {
        let out = std::process::Command::new("mariadb")
            .arg("--no-defaults")
            .arg(format!(
                "--socket={}",
                self.dir.path().join("sock").display()
            ))
            .arg("-uroot")
            .args(args)
            .arg("-e")
            .arg(sql)
            .output()
            .expect("the mariadb client");
        assert!(
            out.status.success(),
            "{sql}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// Stops the server at once, as a crash does (`SIGKILL`).
    pub(crate) fn crash(&self) {
        let pid_file = self.dir.path().join("pid");
        if let Ok(pid) = std::fs::read_to_string(&pid_file) {
            let _ = std::process::Command::new("kill")
                .arg("-9")
                .arg(pid.trim())
                .status();
            let _ = std::fs::remove_file(pid_file);
        }
    }

    /// The URL of `user` (password `bloom`) on `database`.
    pub(crate) fn url_of(&self, user: &str, database: &str) -> String {
        let address = self
            .url
            .rsplit_once('@')
            .and_then(|(_, address)| address.split('/').next())
            .expect("an address");
        format!("mysql://{user}:bloom@{address}/{database}")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = std::process::Command::new(Self::script())
            .arg("stop")
            .arg(self.dir.path())
            .output();
    }
}
