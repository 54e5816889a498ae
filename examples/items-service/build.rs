//! Tests that need Postgres run when `DATABASE_URL` is set at build time and
//! show as ignored, with the reason, when it is not; those that need MySQL
//! or MariaDB, the same with `MYSQL_URL`. The test that scrapes
//! the service with a real Prometheus needs the `prometheus` binary: on the
//! `PATH`, or where `PROMETHEUS` says. The TLS tests start a Postgres server
//! of their own: they need its binaries, in `PG_BIN` (by default
//! `/usr/lib/postgresql/15/bin`).

use std::path::PathBuf;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(database)");
    println!("cargo::rustc-check-cfg=cfg(mysql_database)");
    println!("cargo::rerun-if-env-changed=MYSQL_URL");
    if std::env::var_os("MYSQL_URL").is_some_and(|url| !url.is_empty()) {
        println!("cargo::rustc-cfg=mysql_database");
    }
    println!("cargo::rustc-check-cfg=cfg(prometheus)");
    println!("cargo::rustc-check-cfg=cfg(pg_server)");
    println!("cargo::rerun-if-env-changed=PG_BIN");
    println!("cargo::rerun-if-env-changed=DATABASE_URL");
    println!("cargo::rerun-if-env-changed=PROMETHEUS");
    println!("cargo::rerun-if-env-changed=PATH");
    if std::env::var_os("DATABASE_URL").is_some_and(|url| !url.is_empty()) {
        println!("cargo::rustc-cfg=database");
    }
    let pg_bin = std::env::var_os("PG_BIN").map_or_else(
        || PathBuf::from("/usr/lib/postgresql/15/bin"),
        PathBuf::from,
    );
    println!("cargo::rerun-if-changed={}", pg_bin.display());
    if pg_bin.join("initdb").is_file() && pg_bin.join("postgres").is_file() {
        println!("cargo::rustc-cfg=pg_server");
    }
    if let Some(prometheus) = prometheus() {
        println!("cargo::rerun-if-changed={}", prometheus.display());
        println!("cargo::rustc-cfg=prometheus");
        println!(
            "cargo::rustc-env=ITEMS_SERVICE_PROMETHEUS={}",
            prometheus.display()
        );
    }
}

/// The `prometheus` binary: `PROMETHEUS`, else the first on the `PATH`.
fn prometheus() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("PROMETHEUS") {
        return Some(PathBuf::from(path)).filter(|path| path.is_file());
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join("prometheus"))
        .find(|candidate| candidate.is_file())
}
