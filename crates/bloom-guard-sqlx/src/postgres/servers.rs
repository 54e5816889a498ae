//! URLs that list several servers, as libpq reads them: the servers are
//! tried in order for the session `target_session_attrs` asks for, and a
//! pool follows that server across failovers.

use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgConnection, PgPool};

/// How long one server may take to answer before the next is tried.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How often a pool of several servers checks that its server is still
/// the one the URL asks for.
const FOLLOW_INTERVAL: Duration = Duration::from_secs(1);

/// Why a URL of several servers cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServersError {
    /// The URL does not parse: write it as
    /// `postgres://user:password@host1:port1,host2:port2/database?target_session_attrs=read-write`.
    #[error("invalid Postgres URL: {0}")]
    Url(String),
    /// No server listed is the kind `target_session_attrs` asks for (or
    /// none answered); each server is named with what it answered.
    #[error("no server is {target}: {servers}")]
    NoneMatches {
        /// The `target_session_attrs` asked for.
        target: TargetSession,
        /// Each server and its answer.
        servers: String,
    },
}

/// The session a URL asks for (`target_session_attrs`), as libpq names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum TargetSession {
    /// The first server that answers (the default).
    #[default]
    Any,
    /// A server whose sessions may write (`read-write`).
    ReadWrite,
    /// A server whose sessions are read-only (`read-only`).
    ReadOnly,
    /// A server not in recovery (`primary`).
    Primary,
    /// A server in recovery (`standby`).
    Standby,
    /// A standby if one answers, any server otherwise (`prefer-standby`).
    PreferStandby,
}

impl FromStr for TargetSession {
    type Err = ServersError;

    fn from_str(value: &str) -> Result<Self, ServersError> {
        Ok(match value {
            "any" => Self::Any,
            "read-write" => Self::ReadWrite,
            "read-only" => Self::ReadOnly,
            "primary" => Self::Primary,
            "standby" => Self::Standby,
            "prefer-standby" => Self::PreferStandby,
            other => {
                return Err(ServersError::Url(format!(
                    "target_session_attrs={other:?} is none of any, read-write, read-only, primary, standby, prefer-standby"
                )))
            }
        })
    }
}

impl std::fmt::Display for TargetSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Any => "any",
            Self::ReadWrite => "read-write",
            Self::ReadOnly => "read-only",
            Self::Primary => "primary",
            Self::Standby => "standby",
            Self::PreferStandby => "prefer-standby",
        })
    }
}

/// What a server answered about its sessions.
#[derive(Debug, Clone, Copy)]
struct Answer {
    in_recovery: bool,
    read_only: bool,
}

impl TargetSession {
    /// Whether a server that answered `answer` is one of this kind; a
    /// `prefer-standby` takes a standby on the first pass.
    fn takes(self, answer: Answer) -> bool {
        match self {
            Self::Any => true,
            Self::ReadWrite => !answer.read_only,
            Self::ReadOnly => answer.read_only,
            Self::Primary => !answer.in_recovery,
            Self::Standby | Self::PreferStandby => answer.in_recovery,
        }
    }
}

/// The servers a Postgres URL lists, and the session it asks for: the
/// form libpq, Patroni and managed services hand out,
/// `postgres://user@host1:5432,host2:5432/db?target_session_attrs=read-write`.
///
/// sqlx reads a URL of one server; this type splits the list of servers
/// (the host and port part, IPv6 addresses in brackets) and hands each
/// server's URL to sqlx, which reads everything else (user, password,
/// database, `sslmode` and the other parameters) as it always does.
///
/// # Following a failover
///
/// [`pool`](Self::pool) connects to the first server of the kind asked
/// for, and checks every second that it still is one; when it is not (it
/// went down, or was demoted), the pool's new connections go to the server
/// that now is, and connections to the old one are not handed out again.
/// The followers' own connections (feed reads, wake-ups, locks) take the
/// pool's server each time they connect, so they follow it too.
///
/// # Example
///
/// ```no_run
/// use bloom_guard_sqlx::postgres;
/// use sqlx::postgres::PgPoolOptions;
///
/// # async fn run() -> Result<(), bloom_guard_sqlx::postgres::ServersError> {
/// let servers = postgres::Servers::parse(
///     "postgres://app@db1:5432,db2:5432/shop?target_session_attrs=read-write",
/// )?;
/// let pool = servers.pool(PgPoolOptions::new().max_connections(16)).await;
/// # drop(pool);
/// # Ok(()) }
/// ```
///
#[doc = include_str!("../../docs/servers.md")]
#[derive(Debug, Clone)]
pub struct Servers {
    servers: Vec<PgConnectOptions>,
    target: TargetSession,
}

impl Servers {
    /// Reads `url`: one server or several.
    ///
    /// # Errors
    ///
    /// [`ServersError::Url`] if it is not a Postgres URL, a server's URL
    /// does not parse, or `target_session_attrs` is not one libpq knows.
    pub fn parse(url: &str) -> Result<Self, ServersError> {
        let invalid = |why: &str| ServersError::Url(why.to_owned());
        let (scheme, rest) = url.split_once("://").ok_or_else(|| invalid("no `://`"))?;
        // Schemes are case-insensitive, as sqlx reads them.
        let scheme = scheme.to_ascii_lowercase();
        if !matches!(scheme.as_str(), "postgres" | "postgresql") {
            return Err(invalid("the scheme is not postgres:// or postgresql://"));
        }
        let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
        let (authority, tail) = rest.split_at(authority_end);
        let (user, hosts) = match authority.rfind('@') {
            Some(at) => (&authority[..=at], &authority[at + 1..]),
            None => ("", authority),
        };
        let (tail, target) = without_target(tail)?;
        let servers = split_hosts(hosts)
            .into_iter()
            .map(|host| {
                PgConnectOptions::from_str(&format!("{scheme}://{user}{host}{tail}"))
                    .map_err(|error| ServersError::Url(error.to_string()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self { servers, target })
    }

    /// The servers, in the URL's order, each as sqlx reads it.
    pub fn servers(&self) -> &[PgConnectOptions] {
        &self.servers
    }

    /// The session the URL asks for.
    pub fn target(&self) -> TargetSession {
        self.target
    }

    /// The first server of the kind the URL asks for, trying each in
    /// order (and, for `prefer-standby`, any server that answers if no
    /// standby does).
    ///
    /// # Errors
    ///
    /// [`ServersError::NoneMatches`] naming each server and its answer.
    pub async fn find(&self) -> Result<PgConnectOptions, ServersError> {
        let mut answers = Vec::with_capacity(self.servers.len());
        let mut any = None;
        for server in &self.servers {
            match ask(server).await {
                Ok(answer) if self.target.takes(answer) => return Ok(server.clone()),
                Ok(answer) => {
                    any.get_or_insert(server);
                    answers.push(format!(
                        "{}:{} is {}",
                        server.get_host(),
                        server.get_port(),
                        if answer.in_recovery {
                            "a standby"
                        } else if answer.read_only {
                            "read-only"
                        } else {
                            "a primary"
                        }
                    ));
                }
                Err(error) => answers.push(format!(
                    "{}:{} failed: {}",
                    server.get_host(),
                    server.get_port(),
                    crate::error::error_chain(&error)
                )),
            }
        }
        match any {
            Some(server) if self.target == TargetSession::PreferStandby => Ok(server.clone()),
            _ => Err(ServersError::NoneMatches {
                target: self.target,
                servers: answers.join("; "),
            }),
        }
    }

    /// A pool on the first server of the kind the URL asks for, which
    /// follows that kind across failovers (see the type's docs). Connects
    /// lazily: if no server answers now, the pool starts on the first one
    /// listed and moves once the right one answers. Must be called within a
    /// Tokio runtime; the following stops once the pool is closed.
    ///
    /// `options` must not set `before_acquire`: the pool uses it to retire
    /// connections to a server it left.
    pub async fn pool(&self, options: PgPoolOptions) -> PgPool {
        let Some(first) = self.servers.first() else {
            return options.connect_lazy_with(PgConnectOptions::new());
        };
        if self.servers.len() == 1 && self.target == TargetSession::Any {
            return options.connect_lazy_with(first.clone());
        }
        let start = match self.find().await {
            Ok(found) => found,
            Err(error) => {
                tracing::warn!(%error, "no database server to connect to yet; starting on the first listed");
                first.clone()
            }
        };
        let moved = Arc::new(AtomicU64::new(0));
        let pool = options
            .before_acquire({
                let moved = moved.clone();
                move |_, meta| {
                    // Made before the pool last moved: to the server it left.
                    let made = since_base().saturating_sub(nanos(meta.age));
                    let fresh = made >= moved.load(Ordering::Acquire);
                    Box::pin(async move { Ok(fresh) })
                }
            })
            .connect_lazy_with(start);
        tokio::spawn(follow(self.clone(), pool.clone(), moved));
        pool
    }
}

/// `url` narrowed to the server `pool` reaches now, if it lists several
/// (a connection that is not the pool's, such as the log feed's
/// replication connection, goes to the server the pool follows); `url`
/// as it is otherwise.
#[cfg_attr(not(feature = "log-feed"), allow(dead_code))]
pub(crate) fn narrowed(url: &str, pool: &PgPool) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let (user, hosts) = match authority.rfind('@') {
        Some(at) => (&authority[..=at], &authority[at + 1..]),
        None => ("", authority),
    };
    if split_hosts(hosts).len() < 2 {
        return url.to_owned();
    }
    let Ok((tail, _)) = without_target(tail) else {
        return url.to_owned();
    };
    let options = pool.connect_options();
    format!(
        "{scheme}://{user}{}:{}{tail}",
        options.get_host(),
        options.get_port()
    )
}

/// The URL's tail (path and query) without `target_session_attrs`, which
/// sqlx does not know, and its value.
fn without_target(tail: &str) -> Result<(String, TargetSession), ServersError> {
    let Some((path, query)) = tail.split_once('?') else {
        return Ok((tail.to_owned(), TargetSession::Any));
    };
    let mut target = TargetSession::Any;
    let mut kept = Vec::new();
    for pair in query.split('&') {
        match pair.split_once('=') {
            Some(("target_session_attrs", value)) => target = value.parse()?,
            _ => kept.push(pair),
        }
    }
    let tail = if kept.is_empty() {
        path.to_owned()
    } else {
        format!("{path}?{}", kept.join("&"))
    };
    Ok((tail, target))
}

/// The host list split at its commas, outside IPv6 brackets.
fn split_hosts(hosts: &str) -> Vec<&str> {
    let mut split = Vec::new();
    let (mut start, mut bracket) = (0, false);
    for (i, c) in hosts.char_indices() {
        match c {
            '[' => bracket = true,
            ']' => bracket = false,
            ',' if !bracket => {
                split.push(&hosts[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    split.push(&hosts[start..]);
    split
}

/// What `server` answers about its sessions, within [`CONNECT_TIMEOUT`].
async fn ask(server: &PgConnectOptions) -> Result<Answer, sqlx::Error> {
    tokio::time::timeout(CONNECT_TIMEOUT, async {
        let mut connection = PgConnection::connect_with(server).await?;
        let answer = answer_of(&mut connection).await;
        let _ = connection.close().await;
        answer
    })
    .await
    .map_err(|_| sqlx::Error::PoolTimedOut)?
}

async fn answer_of(connection: &mut PgConnection) -> Result<Answer, sqlx::Error> {
    let (in_recovery, read_only): (bool, bool) = sqlx::query_as(
        "select pg_catalog.pg_is_in_recovery(), pg_catalog.current_setting('transaction_read_only') = 'on'",
    )
    .fetch_one(connection)
    .await?;
    Ok(Answer {
        in_recovery,
        read_only,
    })
}

/// Nanoseconds since the process's first look at the clock here.
fn since_base() -> u64 {
    static BASE: OnceLock<Instant> = OnceLock::new();
    nanos(BASE.get_or_init(Instant::now).elapsed())
}

fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

/// Checks every [`FOLLOW_INTERVAL`] that the pool's server is still of the
/// kind asked for, on a connection of its own; when not, moves the pool to
/// the one that is. Ends when the pool is closed.
async fn follow(servers: Servers, pool: PgPool, moved: Arc<AtomicU64>) {
    let mut watching: Option<PgConnection> = None;
    while !pool.is_closed() {
        tokio::time::sleep(FOLLOW_INTERVAL).await;
        let current = pool.connect_options();
        let still = async {
            let connection = match watching.as_mut() {
                Some(connection) => connection,
                None => watching.insert(
                    tokio::time::timeout(CONNECT_TIMEOUT, PgConnection::connect_with(&current))
                        .await
                        .map_err(|_| sqlx::Error::PoolTimedOut)??,
                ),
            };
            let answer = tokio::time::timeout(CONNECT_TIMEOUT, answer_of(connection))
                .await
                .map_err(|_| sqlx::Error::PoolTimedOut)??;
            Ok::<_, sqlx::Error>(servers.target.takes(answer))
        }
        .await;
        if matches!(still, Ok(true)) {
            continue;
        }
        watching = None;
        match servers.find().await {
            Ok(found)
                if (found.get_host(), found.get_port())
                    != (current.get_host(), current.get_port()) =>
            {
                tracing::warn!(
                    from = %format_args!("{}:{}", current.get_host(), current.get_port()),
                    to = %format_args!("{}:{}", found.get_host(), found.get_port()),
                    target = %servers.target,
                    "the database server changed; connecting to the new one"
                );
                moved.store(since_base(), Ordering::Release);
                pool.set_connect_options(found);
            }
            Ok(_) => {}
            Err(error) => tracing::warn!(%error, "no database server to connect to; trying again"),
        }
    }
}

#[cfg(test)]
mod tests {
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
}
