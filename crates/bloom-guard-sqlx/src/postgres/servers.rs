//! URLs that list several servers, as libpq reads them: the servers are
//! tried in order for the session `target_session_attrs` asks for, and a
//! pool follows that server across failovers.

use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgConnection, PgPool};

use target::Answer;
pub use target::{ServersError, TargetSession};

/// How long one server may take to answer before the next is tried.
mod target;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How often a pool of several servers checks that its server is still
/// the one the URL asks for.
const FOLLOW_INTERVAL: Duration = Duration::from_secs(1);

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
mod tests;
