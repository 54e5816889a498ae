//! Tests of `db/mod.rs`.

use super::*;
use sqlx::postgres::PgConnectOptions;

fn ssl_mode(url: &str) -> PgSslMode {
    PgConnectOptions::from_str(url)
        .expect("valid URL")
        .get_ssl_mode()
}

#[test]
fn tls_modes_need_tls_in_the_build() {
    for (url, sslmode) in [
        ("postgres://db/app?sslmode=require", "require"),
        ("postgres://db/app?sslmode=verify-ca", "verify-ca"),
        ("postgres://db/app?sslmode=verify-full", "verify-full"),
    ] {
        let mode = ssl_mode(url);
        assert!(check_tls(mode, true).is_ok(), "{url} with TLS");
        let error = check_tls(mode, false).expect_err("no TLS in the build");
        assert!(
            matches!(error, UrlError::TlsUnavailable { sslmode: named } if named == sslmode),
            "{url}: {error:?}"
        );
        let message = error.to_string();
        assert!(
            message.contains(&format!("sslmode={sslmode}")) && message.contains("`tls` feature"),
            "{message}"
        );
    }
}

#[tokio::test]
async fn a_url_of_another_kind_is_refused_at_start() {
    for url in ["mongodb://db/app", "redis://127.0.0.1"] {
        let error = Database::connect(url).await.expect_err(url);
        assert!(
            matches!(error, UrlError::UnknownKind { .. }),
            "{url}: {error:?}"
        );
        assert!(error.to_string().contains("mysql://"), "{error}");
    }
    // Without `://` the value is not repeated: it may hold a password.
    for url in ["items.db", "", "admin:s3cret@db/app"] {
        let error = Database::connect(url).await.expect_err(url);
        assert!(matches!(error, UrlError::NoScheme), "{url}: {error:?}");
        let message = error.to_string();
        assert!(message.contains("mysql://"), "{message}");
        assert!(!message.contains("s3cret"), "{message}");
    }
    for url in [
        "mysql://root@127.0.0.1:3306/app",
        "mariadb://root@127.0.0.1:3306/app",
        "MySQL://root@db/app",
    ] {
        let db = Database::connect(url).await.expect(url);
        assert!(matches!(db.pool(), Pool::MySql(_)), "{url}");
    }
    let db = Database::connect("postgresql://db/app")
        .await
        .expect("postgres");
    assert!(matches!(db.pool(), Pool::Postgres(_)));
    assert!(matches!(
        Database::connect("mysql://db:notaport/app").await,
        Err(UrlError::InvalidMySql(_))
    ));
}

#[test]
fn other_modes_need_no_tls() {
    for url in [
        "postgres://db/app?sslmode=disable",
        "postgres://db/app?sslmode=allow",
        "postgres://db/app?sslmode=prefer",
    ] {
        let mode = ssl_mode(url);
        assert!(check_tls(mode, false).is_ok(), "{url} without TLS");
        assert!(check_tls(mode, true).is_ok(), "{url} with TLS");
    }
}

#[tokio::test]
async fn postgres_checks_the_url_before_connecting() {
    let result = Database::postgres("postgres://db/app?sslmode=verify-full").await;
    if cfg!(feature = "tls") {
        assert!(result.is_ok(), "{result:?}");
    } else {
        assert!(
            matches!(
                result,
                Err(UrlError::TlsUnavailable {
                    sslmode: "verify-full"
                })
            ),
            "{result:?}"
        );
    }
    assert!(matches!(
        Database::postgres("postgres://db/app?sslmode=sometimes").await,
        Err(UrlError::Invalid(_))
    ));
}
