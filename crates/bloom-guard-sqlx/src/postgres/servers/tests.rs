//! Tests of `servers.rs`.

use super::*;

#[test]
fn reads_each_server_and_the_session_asked_for() {
    let servers = Servers::parse(
            "postgres://app:s%40cret@db1:5433,[::1]:5434,db3/shop?sslmode=disable&target_session_attrs=read-write&application_name=x",
        )
        .expect("a URL");
    assert_eq!(servers.target(), TargetSession::ReadWrite);
    let hosts: Vec<(String, u16)> = servers
        .servers()
        .iter()
        .map(|server| (server.get_host().to_owned(), server.get_port()))
        .collect();
    assert_eq!(
        hosts,
        [
            ("db1".to_owned(), 5433),
            ("[::1]".to_owned(), 5434),
            ("db3".to_owned(), 5432)
        ]
    );
    for server in servers.servers() {
        assert_eq!(server.get_username(), "app");
        assert_eq!(server.get_database(), Some("shop"));
        assert_eq!(server.get_application_name(), Some("x"));
    }
}

#[tokio::test]
async fn a_url_of_several_servers_narrows_to_the_pools() {
    let pool =
        PgPoolOptions::new().connect_lazy_with(PgConnectOptions::new().host("db2").port(5433));
    assert_eq!(
            narrowed(
                "postgres://app:pw@db1:5432,db2:5433/shop?target_session_attrs=read-write&sslmode=require",
                &pool
            ),
            "postgres://app:pw@db2:5433/shop?sslmode=require"
        );
    assert_eq!(
        narrowed("postgres://app@db1:5432/shop", &pool),
        "postgres://app@db1:5432/shop"
    );
}

#[test]
fn one_server_asks_for_any_session() {
    let servers = Servers::parse("postgresql://db/shop").expect("a URL");
    assert_eq!(servers.servers().len(), 1);
    assert_eq!(servers.target(), TargetSession::Any);
    // As sqlx reads them: any case of the scheme, a socket folder.
    for url in [
        "Postgres://app@db/shop",
        "postgres:///shop?host=/var/run/postgresql",
    ] {
        let servers = Servers::parse(url).expect(url);
        assert_eq!(servers.servers().len(), 1, "{url}");
    }
}

#[test]
fn refuses_what_libpq_would() {
    for url in [
        "mysql://db/shop",
        "db1,db2/shop",
        "postgres://db1,db2/shop?target_session_attrs=primary-ish",
        "postgres://db1:port,db2/shop",
    ] {
        assert!(
            matches!(Servers::parse(url), Err(ServersError::Url(_))),
            "{url}"
        );
    }
}

#[test]
fn each_target_takes_its_servers() {
    let primary = Answer {
        in_recovery: false,
        read_only: false,
    };
    let standby = Answer {
        in_recovery: true,
        read_only: true,
    };
    assert!(TargetSession::ReadWrite.takes(primary));
    assert!(!TargetSession::ReadWrite.takes(standby));
    assert!(TargetSession::Standby.takes(standby));
    assert!(!TargetSession::Primary.takes(standby));
    assert!(TargetSession::Any.takes(standby));
}
