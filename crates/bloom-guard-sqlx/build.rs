//! Tests that need Postgres run when `DATABASE_URL` is set at build time and
//! show as ignored, with the reason, when it is not; tests that need MySQL
//! or MariaDB, the same with `MYSQL_URL`. Tests that start a
//! Postgres server of their own (a publisher for logical replication) also
//! need its binaries: in `PG_BIN`, by default `/usr/lib/postgresql/15/bin`.
//! Tests through PgBouncer start their own from `PGBOUNCER`, by default
//! `/usr/sbin/pgbouncer` (the distribution's package). The Galera tests
//! start a three-node cluster of their own with `.ci/galera`, given the
//! Galera 4 provider and the MariaDB server (the distribution's packages).

use std::path::PathBuf;

const DEFAULT_PG_BIN: &str = "/usr/lib/postgresql/15/bin";
const DEFAULT_PGBOUNCER: &str = "/usr/sbin/pgbouncer";
const GALERA_PROVIDER: &str = "/usr/lib/galera/libgalera_smm.so";

fn main() {
    println!("cargo::rustc-check-cfg=cfg(database)");
    println!("cargo::rustc-check-cfg=cfg(pg_server)");
    println!("cargo::rustc-check-cfg=cfg(mysql_database)");
    println!("cargo::rustc-check-cfg=cfg(pgbouncer)");
    println!("cargo::rustc-check-cfg=cfg(galera)");
    println!("cargo::rustc-check-cfg=cfg(mariadb_server)");
    // A MariaDB server of the test's own (`.ci/mariadb`).
    println!("cargo::rerun-if-changed=/usr/sbin/mariadbd");
    if std::path::Path::new("/usr/sbin/mariadbd").is_file()
        && std::path::Path::new("/usr/bin/mariadb-install-db").is_file()
    {
        println!("cargo::rustc-cfg=mariadb_server");
    }
    // A Galera cluster of the test's own (`.ci/galera`) needs the provider
    // and the MariaDB server.
    println!("cargo::rerun-if-changed={GALERA_PROVIDER}");
    if std::path::Path::new(GALERA_PROVIDER).is_file()
        && std::path::Path::new("/usr/sbin/mariadbd").is_file()
    {
        println!("cargo::rustc-cfg=galera");
    }
    println!("cargo::rerun-if-env-changed=PGBOUNCER");
    let pgbouncer = std::env::var_os("PGBOUNCER")
        .map_or_else(|| PathBuf::from(DEFAULT_PGBOUNCER), PathBuf::from);
    println!("cargo::rerun-if-changed={}", pgbouncer.display());
    if pgbouncer.is_file() {
        println!("cargo::rustc-cfg=pgbouncer");
        println!(
            "cargo::rustc-env=BLOOM_GUARD_PGBOUNCER={}",
            pgbouncer.display()
        );
    }
    println!("cargo::rerun-if-env-changed=MYSQL_URL");
    if std::env::var_os("MYSQL_URL").is_some_and(|url| !url.is_empty()) {
        println!("cargo::rustc-cfg=mysql_database");
    }
    println!("cargo::rerun-if-env-changed=DATABASE_URL");
    println!("cargo::rerun-if-env-changed=PG_BIN");
    if std::env::var_os("DATABASE_URL").is_some_and(|url| !url.is_empty()) {
        println!("cargo::rustc-cfg=database");
    }
    let bin =
        std::env::var_os("PG_BIN").map_or_else(|| PathBuf::from(DEFAULT_PG_BIN), PathBuf::from);
    println!("cargo::rerun-if-changed={}", bin.display());
    if bin.join("initdb").is_file() && bin.join("postgres").is_file() {
        println!("cargo::rustc-cfg=pg_server");
        println!("cargo::rustc-env=BLOOM_GUARD_PG_BIN={}", bin.display());
    }
}
