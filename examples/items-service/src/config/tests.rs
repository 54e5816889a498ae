use super::*;

#[test]
fn the_log_feed_is_for_postgres_and_mysql() {
    assert!(Feed::Log.check(Some("postgres://db/items")).is_ok());
    assert!(Feed::Log.check(Some("mysql://db/items")).is_ok());
    for url in [None, Some("sqlite://items.db")] {
        let error = Feed::Log.check(url).expect_err("refused").to_string();
        assert!(error.starts_with("BLOOM_FEED=\"log\""), "{error}");
        assert!(Feed::Triggers.check(url).is_ok());
    }
}

#[test]
fn a_replica_is_for_postgres_only() {
    let replica = Some("postgres://app:s3cret@replica/items");
    assert!(check_replica(Some("postgres://db/items"), replica).is_ok());
    for url in [None, Some("mysql://db/items")] {
        let error = check_replica(url, replica)
            .expect_err("refused")
            .to_string();
        assert!(
            error.starts_with("DATABASE_REPLICA_URL=\"(set)\""),
            "{error}"
        );
        assert!(!error.contains("s3cret"), "{error}");
        assert!(check_replica(url, None).is_ok());
    }
}

/// Environment variables are process-wide: one test sets them all.
#[test]
fn settings_are_validated_with_a_clear_message() {
    let cases = [
        ("BLOOM_FPP", "0", "BLOOM_FPP=\"0\""),
        ("BLOOM_FPP", "abc", "BLOOM_FPP=\"abc\""),
        ("BLOOM_FPP", "0.9", "BLOOM_FPP"),
        (
            "BLOOM_EXPECTED_ITEMS",
            "99999999999999",
            "BLOOM_EXPECTED_ITEMS",
        ),
        ("BLOOM_EXPECTED_ITEMS", "-1", "BLOOM_EXPECTED_ITEMS"),
        ("BLOOM_GUARD", "maybe", "BLOOM_GUARD"),
        ("BLOOM_FEED", "wal", "BLOOM_FEED=\"wal\""),
        ("BIND_ADDR", "nowhere", "BIND_ADDR"),
        ("IDLE_TIMEOUT_SECS", "0", "IDLE_TIMEOUT_SECS=\"0\""),
        (
            "FIRST_BYTES_TIMEOUT_SECS",
            "1.5",
            "FIRST_BYTES_TIMEOUT_SECS",
        ),
    ];
    for (name, value, shown) in cases {
        std::env::set_var(name, value);
        let error = Config::from_env().expect_err(name).to_string();
        std::env::remove_var(name);
        assert!(error.starts_with(shown), "{name}={value}: {error}");
    }
    std::env::set_var("BLOOM_FPP", "0.01");
    std::env::set_var("BLOOM_GUARD", "off");
    std::env::set_var("ADMIN_TOKEN", "s3cret-token");
    let config = Config::from_env().expect("valid settings");
    std::env::remove_var("BLOOM_FPP");
    std::env::remove_var("BLOOM_GUARD");
    std::env::remove_var("ADMIN_TOKEN");
    assert_eq!((config.bloom_fpp, config.guard_enabled), (0.01, false));
    let shown = format!("{config:?}");
    assert!(
        !shown.contains("s3cret-token") && shown.contains("admin_token: \"<redacted>\""),
        "{shown}"
    );
}
