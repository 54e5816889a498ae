//! A replication connection's settings, from the database's URL as libpq
//! reads it, and the check that it reaches the pool's database.

use std::path::PathBuf;

use pgwire_replication::config::{SslMode, TlsConfig};
use pgwire_replication::{PgWireError, ReplicationClient, ReplicationConfig};
use sqlx::PgPool;

use super::error::StreamError;
use crate::error::FeedError;

/// A database as both kinds of connection name it: its cluster's system
/// identifier and its name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Server {
    system: String,
    database: String,
}

impl std::fmt::Display for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "database {} of cluster {}", self.database, self.system)
    }
}

impl Server {
    /// The database `executor` reaches; none where the role may not read
    /// the cluster's identifier (`pg_control_system` revoked from it), and
    /// nothing is compared.
    pub(crate) async fn of(
        executor: impl sqlx::PgExecutor<'_>,
    ) -> Result<Option<Self>, sqlx::Error> {
        let found = sqlx::query_as(
            "select system_identifier::pg_catalog.text, pg_catalog.current_database()::pg_catalog.text
               from pg_catalog.pg_control_system()",
        )
        .fetch_one(executor)
        .await;
        match found {
            Ok((system, database)) => Ok(Some(Self { system, database })),
            Err(sqlx::Error::Database(error)) if error.code().as_deref() == Some("42501") => {
                Ok(None)
            }
            Err(error) => Err(error),
        }
    }

    /// Checks that the replication session `client`, not started yet,
    /// reaches this database: a URL of another cluster (a cut-over half
    /// done, a replica's address) or another database would feed the
    /// guards another database's changes, or none.
    pub(crate) async fn check(&self, client: &mut ReplicationClient) -> Result<(), StreamError> {
        let found = client
            .identify_system()
            .await
            .map_err(StreamError::Replication)?;
        let there = Self {
            system: found.system_id,
            database: found.dbname.unwrap_or_default(),
        };
        if there != *self {
            return Err(StreamError::OtherDatabase {
                url: there.to_string(),
                pool: self.to_string(),
            });
        }
        Ok(())
    }
}

/// Checks that replication connections to `url` can feed the guards of
/// `pool`'s database: the URL is one the log feed reads (its TLS settings
/// among them, see the feature `log-feed-tls`), the role may open a
/// replication connection, and it reaches the pool's database on the same
/// cluster. [`postgres::log::Follower`](crate::postgres::log::Follower) runs it at start and
/// stops with the error (the guard failing open), rather than retrying
/// what only a setting can fix; call it to fail a start sooner.
///
/// # Errors
///
/// [`FeedError::ReplicationUrl`] for what a setting must fix (the URL, its
/// TLS settings, the password, the REPLICATION attribute, another
/// database); [`FeedError::Database`] if the database cannot be reached.
///
/// # Example
///
/// ```no_run
/// # async fn run(pool: sqlx::PgPool) -> Result<(), bloom_guard_sqlx::FeedError> {
/// let url = "postgres://app:secret@db.internal/shop?sslmode=verify-full";
/// bloom_guard_sqlx::postgres::log::check_replication(&pool, url).await?;
/// # Ok(()) }
/// ```
pub async fn check_replication(pool: &PgPool, url: &str) -> Result<(), FeedError> {
    let setting = |error: &StreamError| FeedError::ReplicationUrl(crate::error::error_chain(error));
    let url = crate::postgres::servers::narrowed(url, pool);
    let config = config(&url, "", "").map_err(|error| setting(&error))?;
    let server = Server::of(pool).await?;
    let mut client = ReplicationClient::connect_gated(config)
        .await
        .map_err(|error| setting(&StreamError::Replication(error)))?;
    let checked = match &server {
        Some(server) => server.check(&mut client).await,
        // The connection is still tried.
        None => client
            .identify_system()
            .await
            .map(drop)
            .map_err(StreamError::Replication),
    };
    client.abort();
    match checked {
        Ok(()) => Ok(()),
        Err(StreamError::Replication(error)) if transient(&error) => {
            let kind = match &error {
                PgWireError::Io(io) => io.kind(),
                _ => std::io::ErrorKind::Other,
            };
            Err(FeedError::Database(sqlx::Error::Io(std::io::Error::new(
                kind,
                crate::error::error_chain(&error),
            ))))
        }
        Err(error) => Err(setting(&error)),
    }
}

/// Whether a replication connection's failure may pass by itself: not a
/// refusal by TLS, authentication or privileges, or of the database's name.
fn transient(error: &PgWireError) -> bool {
    match error {
        PgWireError::Tls(_) | PgWireError::Auth(_) => false,
        // Invalid authorization (28...), insufficient privilege, no such
        // database.
        PgWireError::Server(message) => !["SQLSTATE 28", "SQLSTATE 42501", "SQLSTATE 3D000"]
            .iter()
            .any(|code| message.contains(code)),
        _ => true,
    }
}

/// A replication connection's settings from a `postgres://` URL: host,
/// port, user, password and database; a Unix socket as `host=/dir`.
pub(crate) fn config(
    url: &str,
    slot: &str,
    publication: &str,
) -> Result<ReplicationConfig, StreamError> {
    let bad = |why: &str| StreamError::Url(why.to_owned());
    let url = url::Url::parse(url).map_err(|error| bad(&error.to_string()))?;
    if !matches!(url.scheme(), "postgres" | "postgresql") {
        return Err(bad("not a postgres:// URL"));
    }
    let decode = |text: &str| {
        percent_encoding::percent_decode_str(text)
            .decode_utf8()
            .map(|text| text.into_owned())
            .map_err(|_| bad("not UTF-8"))
    };
    let mut host = url.host_str().unwrap_or("localhost").to_owned();
    let mut port = url.port().unwrap_or(5432);
    let mut user = decode(url.username())?;
    let mut database = decode(url.path().trim_start_matches('/'))?;
    let mut tls = Tls::default();
    for (name, value) in url.query_pairs() {
        match &*name {
            "host" => host = value.into_owned(),
            "port" => {
                port = value
                    .parse()
                    .map_err(|_| bad("a port that is not a number"))?;
            }
            "user" => user = value.into_owned(),
            "dbname" => database = value.into_owned(),
            "sslmode" => tls.mode = Some(value.into_owned()),
            "sslrootcert" => tls.root = Some(value.into_owned()),
            "sslcert" => tls.cert = Some(value.into_owned()),
            "sslkey" => tls.key = Some(value.into_owned()),
            _ => {}
        }
    }
    if user.is_empty() {
        user = "postgres".to_owned();
    }
    if database.is_empty() {
        database.clone_from(&user);
    }
    let password = url.password().map(decode).transpose()?.unwrap_or_default();
    let socket = host.starts_with('/');
    let config = ReplicationConfig::new(host, user, password, database, slot, publication);
    Ok(config.with_port(port).with_tls(tls.config(socket)?))
}

/// The URL's TLS parameters, as libpq reads them: `sslmode` (`prefer`
/// when absent), `sslrootcert`, `sslcert` and `sslkey`.
#[derive(Default)]
struct Tls {
    mode: Option<String>,
    root: Option<String>,
    cert: Option<String>,
    key: Option<String>,
}

impl Tls {
    /// The replication connection's TLS settings. As with libpq, a Unix
    /// socket takes none, and `require` with a root certificate verifies
    /// the server's chain (`verify-ca`).
    fn config(self, socket: bool) -> Result<TlsConfig, StreamError> {
        let mode = match self.mode.as_deref().unwrap_or("prefer") {
            _ if socket => SslMode::Disable,
            "disable" => SslMode::Disable,
            // `allow` tries without TLS first, TLS if the server asks;
            // taken as `prefer`, which tries TLS first.
            "allow" | "prefer" if !cfg!(feature = "log-feed-tls") => SslMode::Disable,
            "allow" | "prefer" => SslMode::Prefer,
            "require" if self.root.is_some() => SslMode::VerifyCa,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            other => {
                return Err(StreamError::Url(format!(
                    "sslmode={other} is not one of disable, allow, prefer, require, verify-ca, verify-full"
                )))
            }
        };
        if mode.requires_tls() && !cfg!(feature = "log-feed-tls") {
            return Err(StreamError::Url(
                "the log reader was built without TLS (sslmode=require, verify-ca and verify-full need the log-feed-tls feature)".to_owned(),
            ));
        }
        let mut config = TlsConfig {
            mode,
            ca_pem_path: self.root.map(PathBuf::from),
            ..TlsConfig::default()
        };
        match (self.cert, self.key) {
            (Some(cert), Some(key)) => config = config.with_client_cert(cert, key),
            (None, None) => {}
            _ => {
                return Err(StreamError::Url(
                    "sslcert and sslkey go together".to_owned(),
                ))
            }
        }
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_gives_its_host_port_user_password_and_database() {
        let tcp = config("postgres://app:p%40ss@db.example:6432/shop", "s", "p").unwrap();
        assert_eq!(
            (
                &*tcp.host,
                tcp.port,
                &*tcp.user,
                &*tcp.password,
                &*tcp.database
            ),
            ("db.example", 6432, "app", "p@ss", "shop")
        );
        let socket = config("postgres:///shop?host=/run/postgresql", "s", "p").unwrap();
        assert!(socket.is_unix_socket());
        assert!(config("mysql://x/y", "s", "p").is_err());
    }

    #[test]
    fn a_url_gives_its_tls_settings_as_libpq_reads_them() {
        let mode = |query: &str| config(&format!("postgres://h/d{query}"), "s", "p");
        let tls = cfg!(feature = "log-feed-tls");
        let prefer = if tls {
            SslMode::Prefer
        } else {
            SslMode::Disable
        };
        assert_eq!(mode("").unwrap().tls.mode, prefer);
        assert_eq!(mode("?sslmode=allow").unwrap().tls.mode, prefer);
        assert_eq!(mode("?sslmode=disable").unwrap().tls.mode, SslMode::Disable);
        assert!(mode("?sslmode=sometimes").is_err());
        assert!(
            mode("?sslcert=/c.pem").is_err(),
            "a certificate without its key"
        );
        let socket = config(
            "postgres:///d?host=/run/postgresql&sslmode=verify-full",
            "s",
            "p",
        );
        assert_eq!(socket.unwrap().tls.mode, SslMode::Disable);
        if !tls {
            let error = mode("?sslmode=require").unwrap_err().to_string();
            assert!(error.contains("log-feed-tls"), "{error}");
            return;
        }
        assert_eq!(mode("?sslmode=require").unwrap().tls.mode, SslMode::Require);
        let verified = mode("?sslmode=require&sslrootcert=/ca.pem&sslcert=/c.pem&sslkey=/k.pem")
            .unwrap()
            .tls;
        assert_eq!(verified.mode, SslMode::VerifyCa);
        assert_eq!(verified.ca_pem_path, Some(PathBuf::from("/ca.pem")));
        assert!(verified.is_mtls());
        assert_eq!(
            mode("?sslmode=verify-full").unwrap().tls.mode,
            SslMode::VerifyFull
        );
    }
}
