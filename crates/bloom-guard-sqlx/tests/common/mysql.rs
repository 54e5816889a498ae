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
