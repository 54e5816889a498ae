//! Tests of `install.rs`.

#[test]
fn the_schema_script_leaves_the_version_install_log_looks_for() {
    assert!(super::LOG_SQL.contains(&format!(
        "comment on table bloom_guard.log_progress is '{}';",
        super::LOG_SCHEMA
    )));
}
