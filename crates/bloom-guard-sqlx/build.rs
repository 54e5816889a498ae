//! Tests that need Postgres run when `DATABASE_URL` is set at build time and
//! show as ignored, with the reason, when it is not.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(database)");
    println!("cargo::rerun-if-env-changed=DATABASE_URL");
    if std::env::var_os("DATABASE_URL").is_some_and(|url| !url.is_empty()) {
        println!("cargo::rustc-cfg=database");
    }
}
