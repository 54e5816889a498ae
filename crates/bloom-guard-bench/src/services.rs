//! The benchmark's database and the items-service processes it drives.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, PgPool};
use tokio::process::{Child, Command};

const ADMIN_TOKEN: &str = "bench";

/// A database of the benchmark's own, dropped at the end.
pub(crate) struct Database {
    server: PgConnectOptions,
    name: String,
    pool: PgPool,
    /// The database's URL, for the services.
    pub(crate) url: String,
}

impl Database {
    /// Creates (or recreates) database `name` on the server of `server_url`
    /// and applies the migrations.
    pub(crate) async fn create(server_url: &str, name: &str) -> Result<Self, sqlx::Error> {
        let server: PgConnectOptions = server_url.parse()?;
        let mut admin = server.connect().await?;
        // A log feed's slot left by a run that stopped keeps the database.
        drop_slots(&mut admin, name).await?;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "drop database if exists {name} with (force)"
        )))
        .execute(&mut admin)
        .await?;
        sqlx::query(sqlx::AssertSqlSafe(format!("create database {name}")))
            .execute(&mut admin)
            .await?;
        let pool = PgPool::connect_with(server.clone().database(name)).await?;
        sqlx::migrate!("../../migrations").run(&pool).await?;
        let url = match server_url.rsplit_once('/') {
            Some((base, _)) => format!("{base}/{name}"),
            None => format!("{server_url}/{name}"),
        };
        Ok(Self {
            server,
            name: name.to_owned(),
            pool,
            url,
        })
    }

    /// The pool.
    pub(crate) fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Inserts `keys` rows, `key-1` to `key-N`, by plain SQL.
    pub(crate) async fn fill(&self, keys: u64) -> Result<(), sqlx::Error> {
        let keys = i64::try_from(keys).unwrap_or(i64::MAX);
        sqlx::query(
            "insert into items (key) select 'key-' || g from generate_series(1::bigint, $1) g",
        )
        .bind(keys)
        .execute(&self.pool)
        .await?;
        sqlx::query("vacuum analyze items")
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Transactions on this database so far (committed and rolled back),
    /// as Postgres counts them: the feed reads of the guards' followers
    /// while nothing else writes.
    pub(crate) async fn transactions(&self) -> Result<u64, sqlx::Error> {
        let count: i64 = sqlx::query_scalar(
            "select (xact_commit + xact_rollback)::int8 from pg_stat_database where datname = current_database()",
        )
        .fetch_one(&self.pool)
        .await?;
        Ok(count.max(0) as u64)
    }

    /// Scans of the items table so far (index and sequential), as Postgres
    /// counts them.
    pub(crate) async fn lookups(&self) -> Result<u64, sqlx::Error> {
        let scans: i64 = sqlx::query_scalar(
            "select coalesce(idx_scan, 0) + coalesce(seq_scan, 0) from pg_stat_user_tables where relname = 'items'",
        )
        .fetch_one(&self.pool)
        .await?;
        Ok(scans.max(0) as u64)
    }

    /// Drops the database.
    pub(crate) async fn drop_database(self) -> Result<(), sqlx::Error> {
        self.pool.close().await;
        let mut admin = self.server.connect().await?;
        drop_slots(&mut admin, &self.name).await?;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "drop database if exists {} with (force)",
            self.name
        )))
        .execute(&mut admin)
        .await?;
        Ok(())
    }
}

/// Drops the replication slots of database `name` (a log feed's), their
/// readers stopped first: a slot keeps its database from being dropped.
async fn drop_slots(admin: &mut sqlx::PgConnection, name: &str) -> Result<(), sqlx::Error> {
    sqlx::query(
        "select pg_terminate_backend(active_pid) from pg_replication_slots
          where database = $1 and active_pid is not null",
    )
    .bind(name)
    .execute(&mut *admin)
    .await?;
    for _ in 0..50 {
        sqlx::query(
            "select pg_drop_replication_slot(slot_name) from pg_replication_slots
              where database = $1 and not active",
        )
        .bind(name)
        .execute(&mut *admin)
        .await?;
        let left: bool = sqlx::query_scalar(
            "select exists (select from pg_replication_slots where database = $1)",
        )
        .bind(name)
        .fetch_one(&mut *admin)
        .await?;
        if !left {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    Ok(())
}

/// A running items-service, stopped when dropped.
pub(crate) struct Service {
    _child: Child,
    /// The public address.
    pub(crate) addr: String,
    /// The admin address.
    pub(crate) admin_addr: String,
}

impl Service {
    /// Starts the service on `port` (admin on `port + 1`) and waits until
    /// `/readyz` answers 200.
    pub(crate) async fn start(
        binary: &Path,
        database_url: &str,
        port: u16,
        guarded: bool,
        fpp: f64,
        keys: u64,
    ) -> Result<Self, Box<dyn std::error::Error>> {
        let env = [
            ("DATABASE_URL", database_url.to_owned()),
            ("BLOOM_GUARD", if guarded { "on" } else { "off" }.to_owned()),
            ("BLOOM_FPP", fpp.to_string()),
            ("BLOOM_EXPECTED_ITEMS", keys.to_string()),
        ];
        Self::start_with(binary, port, &env).await
    }

    /// Starts the service on `port` (admin on `port + 1`) with `env` on top
    /// of the addresses and the admin token (no `DATABASE_URL` unless `env`
    /// has one: SQLite), and waits until `/readyz` answers 200.
    pub(crate) async fn start_with(
        binary: &Path,
        port: u16,
        env: &[(&str, String)],
    ) -> Result<Self, Box<dyn std::error::Error>> {
        let addr = format!("127.0.0.1:{port}");
        let admin_addr = format!("127.0.0.1:{}", port + 1);
        let child = Command::new(binary)
            .env_remove("DATABASE_URL")
            .envs(env.iter().map(|(name, value)| (*name, value)))
            .env("BIND_ADDR", &addr)
            .env("ADMIN_ADDR", &admin_addr)
            .env("ADMIN_TOKEN", ADMIN_TOKEN)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| {
                format!(
                    "cannot start {}: {e} (build it with `cargo build --release -p items-service`)",
                    binary.display()
                )
            })?;
        let started = Instant::now();
        while get_status(&addr, "/readyz").await != Some(200) {
            if started.elapsed() > Duration::from_secs(120) {
                return Err(format!("{addr} did not become ready").into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(Self {
            _child: child,
            addr,
            admin_addr,
        })
    }
}

/// One request's status, or `None` if it failed.
async fn request_status(addr: &str, method: &str, path: &str, token: Option<&str>) -> Option<u16> {
    send(addr, method, path, token, bytes::Bytes::new()).await
}

/// `POST path` with a JSON `body`; the status, or `None` if it failed.
pub(crate) async fn post_json(addr: &str, path: &str, body: String) -> Option<u16> {
    send(addr, "POST", path, None, body.into()).await
}

/// `GET path`; the status, or `None` if it failed.
pub(crate) async fn get(addr: &str, path: &str) -> Option<u16> {
    get_status(addr, path).await
}

/// `GET path` on the admin address: the JSON body, or `None` if it
/// failed.
pub(crate) async fn admin_json(admin_addr: &str, path: &str) -> Option<serde_json::Value> {
    let (_, body) = exchange(
        admin_addr,
        "GET",
        path,
        Some(ADMIN_TOKEN),
        bytes::Bytes::new(),
    )
    .await?;
    serde_json::from_slice(&body).ok()
}

async fn send(
    addr: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: bytes::Bytes,
) -> Option<u16> {
    exchange(addr, method, path, token, body)
        .await
        .map(|(status, _)| status)
}

/// One request on a new connection: the status and the body, or `None`
/// if it failed.
async fn exchange(
    addr: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: bytes::Bytes,
) -> Option<(u16, bytes::Bytes)> {
    use http_body_util::{BodyExt, Full};
    let stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake::<_, Full<bytes::Bytes>>(
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .ok()?;
    tokio::spawn(conn);
    let mut request = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr)
        .header("content-type", "application/json");
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    let response = sender
        .send_request(request.body(Full::new(body)).ok()?)
        .await
        .ok()?;
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.ok()?.to_bytes();
    Some((status, body))
}

async fn get_status(addr: &str, path: &str) -> Option<u16> {
    request_status(addr, "GET", path, None).await
}

/// Asks the service at `admin_addr` for a rebuild.
pub(crate) async fn post_rebuild(admin_addr: &str) -> Option<u16> {
    request_status(
        admin_addr,
        "POST",
        "/admin/bloom/items/rebuild",
        Some(ADMIN_TOKEN),
    )
    .await
}
