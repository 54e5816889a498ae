//! The example's database over TLS, the log feed's replication connections
//! too, against a throwaway Postgres that takes TLS connections only
//! (`wal_level=logical`): a cluster of its own in a temporary directory,
//! started from the Postgres server binaries in `PG_BIN` (by default
//! `/usr/lib/postgresql/15/bin`), with a certificate from a CA made for the
//! test.

use std::fs::{self, File};
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use bloom_guard::BloomGuard;
use bloom_guard_sqlx::postgres;
use items_service::config::Feed;
use items_service::{app, prepare, AppState, Config, Database, Pool};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use sqlx::postgres::PgConnectOptions;
use sqlx::{Connection, PgConnection};
use tempfile::TempDir;
use tower::ServiceExt;

const DEFAULT_PG_BIN: &str = "/usr/lib/postgresql/15/bin";

/// A certificate authority made for one test.
struct Ca {
    issuer: Issuer<'static, KeyPair>,
    pem: String,
}

impl Ca {
    fn new(name: &str) -> Self {
        let key = KeyPair::generate().expect("CA key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let pem = params.self_signed(&key).expect("CA certificate").pem();
        Self {
            issuer: Issuer::new(params, key),
            pem,
        }
    }

    /// A server certificate for `localhost` and 127.0.0.1, and its key, in PEM.
    fn server_certificate(&self) -> (String, String) {
        let key = KeyPair::generate().expect("server key");
        let mut params = CertificateParams::new(vec!["localhost".into(), "127.0.0.1".into()])
            .expect("server parameters");
        params
            .distinguished_name
            .push(DnType::CommonName, "localhost");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let cert = params
            .signed_by(&key, &self.issuer)
            .expect("server certificate");
        (cert.pem(), key.serialize_pem())
    }
}

/// The account the server runs as, when it is not ours: Postgres refuses to
/// run as root.
#[derive(Clone, Copy)]
struct Account {
    uid: u32,
    gid: u32,
}

impl Account {
    /// `None` unless we are root; then the `postgres` account.
    fn server() -> Option<Self> {
        if id(&["-u"]) != 0 {
            return None;
        }
        Some(Self {
            uid: id(&["-u", "postgres"]),
            gid: id(&["-g", "postgres"]),
        })
    }

    fn own(self, path: &Path) {
        std::os::unix::fs::chown(path, Some(self.uid), Some(self.gid))
            .unwrap_or_else(|error| panic!("cannot chown {}: {error}", path.display()));
    }
}

/// A number `id` prints.
fn id(args: &[&str]) -> u32 {
    let output = Command::new("id").args(args).output().expect("run id");
    assert!(output.status.success(), "id {args:?} failed");
    String::from_utf8_lossy(&output.stdout)
        .trim()
        .parse()
        .expect("a numeric id")
}

/// A command that runs as `account`, or as us.
fn command(program: &Path, account: Option<Account>) -> Command {
    let mut command = Command::new(program);
    if let Some(account) = account {
        command.uid(account.uid).gid(account.gid);
    }
    command
}

/// A Postgres server that refuses connections without TLS. Dropping it stops
/// the server and deletes its files, also when a test panics.
struct TlsPostgres {
    server: Child,
    port: u16,
    ca: PathBuf,
    // Dropped after `drop` has stopped the server.
    dir: TempDir,
}

impl TlsPostgres {
    async fn start() -> Self {
        let bin =
            std::env::var_os("PG_BIN").map_or_else(|| PathBuf::from(DEFAULT_PG_BIN), PathBuf::from);
        let (initdb, postgres) = (bin.join("initdb"), bin.join("postgres"));
        assert!(
            initdb.is_file() && postgres.is_file(),
            "the Postgres server binaries (initdb, postgres) are not in {}: install the \
             PostgreSQL 15 server, or set PG_BIN to the directory that holds them",
            bin.display()
        );
        let account = Account::server();
        let dir = tempfile::Builder::new()
            .prefix("items-service-tls-")
            .tempdir()
            .expect("temporary directory");
        if let Some(account) = account {
            account.own(dir.path());
        }
        let data = dir.path().join("data");

        let output = command(&initdb, account)
            .arg("--pgdata")
            .arg(&data)
            .args(["--username=postgres", "--auth=trust", "--encoding=UTF8"])
            .args(["--locale=C", "--no-sync"])
            .output()
            .expect("run initdb");
        assert!(
            output.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        fs::write(
            data.join("pg_hba.conf"),
            "hostssl all all 127.0.0.1/32 trust\nhostssl replication all 127.0.0.1/32 trust\n\
             hostnossl all all 0.0.0.0/0 reject\nhostnossl replication all 0.0.0.0/0 reject\n",
        )
        .expect("write pg_hba.conf");

        let ca = Ca::new("items-service test CA");
        let (cert, key) = ca.server_certificate();
        let ca_file = dir.path().join("ca.pem");
        let (cert_file, key_file) = (dir.path().join("server.crt"), dir.path().join("server.key"));
        fs::write(&ca_file, &ca.pem).expect("write the CA certificate");
        fs::write(&cert_file, cert).expect("write the server certificate");
        fs::write(&key_file, key).expect("write the server key");
        // Postgres refuses a key that others can read.
        fs::set_permissions(&key_file, fs::Permissions::from_mode(0o600)).expect("chmod the key");
        if let Some(account) = account {
            for file in [&cert_file, &key_file, &data.join("pg_hba.conf")] {
                account.own(file);
            }
        }

        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free port")
            .port();
        let log = File::create(dir.path().join("server.log")).expect("create the server log");
        let server = command(&postgres, account)
            .arg("-D")
            .arg(&data)
            .arg("-p")
            .arg(port.to_string())
            .args(["-c", "listen_addresses=127.0.0.1"])
            .arg("-c")
            .arg(format!("unix_socket_directories={}", dir.path().display()))
            .args(["-c", "ssl=on", "-c", "fsync=off", "-c", "wal_level=logical"])
            .arg("-c")
            .arg(format!("ssl_cert_file={}", cert_file.display()))
            .arg("-c")
            .arg(format!("ssl_key_file={}", key_file.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start postgres");
        let mut server = Self {
            server,
            port,
            ca: ca_file,
            dir,
        };
        server.wait_until_ready().await;
        server
    }

    /// Connects over verified TLS until the server answers.
    async fn wait_until_ready(&mut self) {
        let options = self.options("verify-full", &self.ca);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let error = match PgConnection::connect_with(&options).await {
                Ok(connection) => {
                    let _ = connection.close().await;
                    return;
                }
                Err(error) => error,
            };
            if let Ok(Some(status)) = self.server.try_wait() {
                panic!("postgres exited ({status}):\n{}", self.log());
            }
            assert!(
                Instant::now() < deadline,
                "postgres did not take connections in 30 s ({error}):\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The URL of the `postgres` database with these query parameters.
    fn url(&self, query: &str) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/postgres?{query}",
            self.port
        )
    }

    /// As [`url`](Self::url), by the host's name: the log feed's reader
    /// takes `verify-full` with a name only (its certificate check does not
    /// match IP addresses; `verify-ca` takes one).
    fn named_url(&self, query: &str) -> String {
        format!(
            "postgres://postgres@localhost:{}/postgres?{query}",
            self.port
        )
    }

    fn options(&self, sslmode: &str, root: &Path) -> PgConnectOptions {
        let url = self.url(&format!("sslmode={sslmode}&sslrootcert={}", root.display()));
        url.parse().expect("valid URL")
    }

    fn log(&self) -> String {
        fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }
}

impl Drop for TlsPostgres {
    fn drop(&mut self) {
        // SIGINT, a fast shutdown: the server ends its sessions and exits
        // cleanly, leaving no shared memory behind.
        let _ = Command::new("kill")
            .args(["-INT", &self.server.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if !matches!(self.server.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.server.kill();
        let _ = self.server.wait();
    }
}

#[tokio::test]
#[cfg_attr(
    not(all(database, pg_server)),
    ignore = "needs Postgres (DATABASE_URL) and its server binaries (PG_BIN, default /usr/lib/postgresql/15/bin)"
)]
async fn the_database_works_over_verified_tls() {
    let server = TlsPostgres::start().await;
    let url = server.url(&format!(
        "sslmode=verify-full&sslrootcert={}",
        server.ca.display()
    ));
    let db = Database::postgres(&url).await.expect("valid URL");
    db.migrate().await.expect("migrate over TLS");
    db.seed_if_empty().await.expect("seed over TLS");
    assert!(db.get("apple").await.expect("get over TLS").is_some());
    let Pool::Postgres(pool) = db.pool() else {
        panic!("a Postgres pool");
    };
    let ssl: bool = sqlx::query_scalar("select ssl from pg_stat_ssl where pid = pg_backend_pid()")
        .fetch_one(pool)
        .await
        .expect("pg_stat_ssl");
    assert!(ssl, "the connection is not encrypted");
    db.close().await;
}

#[tokio::test]
#[cfg_attr(
    not(all(database, pg_server)),
    ignore = "needs Postgres (DATABASE_URL) and its server binaries (PG_BIN, default /usr/lib/postgresql/15/bin)"
)]
async fn the_server_refuses_connections_without_tls() {
    let server = TlsPostgres::start().await;
    let error = PgConnection::connect(&server.url("sslmode=disable"))
        .await
        .expect_err("a connection without TLS");
    // invalid_authorization_specification: pg_hba.conf rejects it.
    let code = error
        .as_database_error()
        .and_then(|error| error.code())
        .map(|code| code.into_owned());
    assert_eq!(code.as_deref(), Some("28000"), "{error}");
}

#[tokio::test]
#[cfg_attr(
    not(all(database, pg_server)),
    ignore = "needs Postgres (DATABASE_URL) and its server binaries (PG_BIN, default /usr/lib/postgresql/15/bin)"
)]
async fn verify_full_refuses_a_server_from_another_ca() {
    let server = TlsPostgres::start().await;
    let other = server.dir.path().join("other-ca.pem");
    fs::write(&other, Ca::new("another CA").pem).expect("write the other CA");
    let error = PgConnection::connect_with(&server.options("verify-full", &other))
        .await
        .expect_err("a certificate from an unknown CA");
    // rustls's verdict, which sqlx passes on as an I/O error.
    assert!(
        matches!(&error, sqlx::Error::Io(io) if io.kind() == std::io::ErrorKind::InvalidData)
            && error.to_string().contains("UnknownIssuer"),
        "{error:?}"
    );
}

#[tokio::test]
#[cfg_attr(
    not(all(database, pg_server)),
    ignore = "needs Postgres (DATABASE_URL) and its server binaries (PG_BIN, default /usr/lib/postgresql/15/bin)"
)]
async fn the_log_feed_streams_over_verified_tls() {
    let server = TlsPostgres::start().await;
    let url = server.named_url(&format!(
        "sslmode=verify-full&sslrootcert={}",
        server.ca.display()
    ));
    let mut config = Config::from_env().expect("config");
    config.audit_rate = 0.0;
    config.database_url = Some(url.clone());
    config.feed = Feed::Log;
    let db = Database::postgres(&url).await.expect("valid URL");
    let state = AppState::new(db.clone(), Some(items_service::guards(&config)));
    prepare(state.clone()).await;
    let app = app(state.clone());
    let Pool::Postgres(pool) = db.pool() else {
        panic!("a Postgres pool");
    };
    for i in 0..20 {
        let key = format!("over-tls-{i}");
        sqlx::query("insert into items (key) values ($1)")
            .bind(&key)
            .execute(pool)
            .await
            .expect("insert");
        assert_eq!(status(&app, &format!("/items/{key}")).await, StatusCode::OK);
    }
    // A refusal waits for the producer's stream to pass the server's
    // position: it is refused only once the stream is up.
    let guards = state.guards.clone().expect("guarded");
    let deadline = Instant::now() + Duration::from_secs(20);
    while guards.items.stats().rejected == 0 {
        assert_eq!(
            status(&app, "/items/never-written").await,
            StatusCode::NOT_FOUND
        );
        assert!(Instant::now() < deadline, "nothing refused over TLS");
    }
    let (senders, encrypted): (i64, bool) = sqlx::query_as(
        "select count(*), coalesce(bool_and(s.ssl), false)
           from pg_stat_replication r join pg_stat_ssl s on s.pid = r.pid",
    )
    .fetch_one(pool)
    .await
    .expect("pg_stat_replication");
    assert!(senders >= 1, "no replication connection");
    assert!(encrypted, "a replication connection is not encrypted");
    db.close().await;
}

#[tokio::test]
#[cfg_attr(
    not(all(database, pg_server)),
    ignore = "needs Postgres (DATABASE_URL) and its server binaries (PG_BIN, default /usr/lib/postgresql/15/bin)"
)]
async fn the_log_reader_refuses_a_server_from_another_ca() {
    let server = TlsPostgres::start().await;
    let good = server.named_url(&format!(
        "sslmode=verify-full&sslrootcert={}",
        server.ca.display()
    ));
    let other = server.dir.path().join("other-ca.pem");
    fs::write(&other, Ca::new("another CA").pem).expect("write the other CA");
    let db = Database::postgres(&good).await.expect("valid URL");
    db.migrate_for(Feed::Log).await.expect("migrate over TLS");
    let Pool::Postgres(pool) = db.pool() else {
        panic!("a Postgres pool");
    };
    let guard = BloomGuard::builder().expected_items(1_000).build();
    let follower = postgres::log::Follower::new(
        guard.clone(),
        pool.clone(),
        items_service::items_feed(),
        server.named_url(&format!(
            "sslmode=verify-full&sslrootcert={}",
            other.display()
        )),
    );
    let task = tokio::spawn(follower.run());
    let deadline = Instant::now() + Duration::from_secs(20);
    let error = loop {
        if let Some(error) = guard.stats().last_error {
            break error;
        }
        assert!(Instant::now() < deadline, "no error reported");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    task.abort();
    assert!(error.contains("UnknownIssuer"), "{error}");
    assert!(
        !guard.is_ready(),
        "a guard whose scan could not be placed is ready"
    );
    let senders: i64 = sqlx::query_scalar("select count(*) from pg_stat_replication")
        .fetch_one(pool)
        .await
        .expect("pg_stat_replication");
    assert_eq!(
        senders, 0,
        "a replication connection past a wrong certificate"
    );
    // The right certificate, and a pool on another cluster (the one at
    // DATABASE_URL): named, not followed.
    let elsewhere = sqlx::PgPool::connect(&std::env::var("DATABASE_URL").expect("DATABASE_URL"))
        .await
        .expect("connect to DATABASE_URL");
    let checked = bloom_guard_sqlx::postgres::log::check_replication(&elsewhere, &good).await;
    assert!(
        matches!(&checked, Err(bloom_guard_sqlx::FeedError::ReplicationUrl(message))
            if message.contains("of cluster")),
        "{checked:?}"
    );
    bloom_guard_sqlx::postgres::log::check_replication(pool, &good)
        .await
        .expect("the server's own database over TLS");
    elsewhere.close().await;
    db.close().await;
}

async fn status(app: &axum::Router, path: &str) -> StatusCode {
    let request = Request::get(path).body(Body::empty()).expect("request");
    app.clone()
        .oneshot(request)
        .await
        .expect("infallible")
        .status()
}
