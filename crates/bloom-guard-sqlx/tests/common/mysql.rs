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
    items().install_mysql(&pool).await.expect("install");
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
