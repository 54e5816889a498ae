//! Start-up: the database migrated, the change feeds followed, the guards
//! warm.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use bloom_guard_sqlx::{mysql, postgres, sqlite, FeedError, Follow};

use crate::config::Config;
use crate::db::{Database, MigrateError, Pool};
use crate::feeds::{items_feed, users_feed};
use crate::guards::{guards, guards_for, Guards};
use crate::state::AppState;

/// How long the start waits for the `items` key column to be read.
const KEY_COLUMN_WAIT: Duration = Duration::from_secs(10);

/// The guards, with the `items` key type read from its key column
/// ([`guards_for`]) if the database answers within 10 s.
///
/// # Errors
///
/// [`FeedError::Uncomparable`] for a key column no key type compares as
/// the database does: the service stops with it. A database that does not
/// answer, or a table not created yet (a first start), is no error: keys
/// are compared byte for byte (the example's own schema), and should the
/// column compare otherwise, the follower holds the guard open with the
/// reason until the next start.
pub async fn guards_at_start(config: &Config, db: &Database) -> Result<Guards, FeedError> {
    let read = tokio::time::timeout(KEY_COLUMN_WAIT, guards_for(config, db)).await;
    match read {
        Ok(Ok(guards)) => return Ok(guards),
        Ok(Err(error @ FeedError::Uncomparable(_))) => return Err(error),
        Ok(Err(error)) => {
            tracing::warn!(%error, "cannot read the items key column now; its keys are compared byte for byte");
        }
        Err(_) => {
            tracing::warn!(wait = ?KEY_COLUMN_WAIT, "the database did not answer; the items keys are compared byte for byte");
        }
    }
    Ok(guards(config))
}

/// Brings the database up and the guard warm: applies the migrations and
/// installs the change feed (retrying while the database is unreachable),
/// starts the follower that keeps the filter complete ([`postgres::Follower`], or
/// [`postgres::log::Follower`] with `BLOOM_FEED=log`, [`mysql::Follower`]
/// ([`mysql::log::Follower`] with `BLOOM_FEED=log`) or
/// [`sqlite::Follower`]: warm-up, every key written by any instance or SQL
/// client, scheduled rebuilds), and returns once the guard is ready. The
/// service fails open until then.
pub async fn prepare(state: AppState) {
    // 200 ms doubling up to 10 s, jittered: a fleet restarting together
    // does not retry in step.
    let mut pauses = ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(200))
        .with_max_delay(Duration::from_secs(10))
        .with_jitter()
        .without_max_times()
        .build();
    let feed = state.feed;
    while let Err(error) = state.db.migrate_for(feed).await {
        let delay = pauses.next().unwrap_or(Duration::from_secs(10));
        // The whole chain: "migration failed" alone says nothing.
        let mut message = error.to_string();
        let mut source = std::error::Error::source(&error);
        while let Some(cause) = source {
            message.push_str(": ");
            message.push_str(&cause.to_string());
            source = cause.source();
        }
        // What only a changed column or setting can fix is no reason to
        // retry: the service stops with it.
        if matches!(
            error,
            MigrateError::Feed(
                FeedError::Uncomparable(_)
                    | FeedError::Pooler(_)
                    | FeedError::LogFeed(_)
                    | FeedError::LogFed(_)
            )
        ) {
            tracing::error!(error = %message, "cannot guard this database; stopping");
            std::process::exit(1);
        }
        tracing::warn!(error = %message, retry_in = ?delay, "database migration failed; retrying");
        if let Some(guards) = &state.guards {
            for guard in guards.all() {
                guard.report_unavailable(&error);
            }
        }
        tokio::time::sleep(delay).await;
    }
    let Some(guards) = state.guards.clone() else {
        return;
    };
    // A key created or deleted elsewhere: its cache entry (a negative one
    // would hide a new item) is stale.
    let cache = state.cache.clone();
    let invalidate = move |key: &str| {
        let (cache, key) = (cache.clone(), key.to_owned());
        tokio::spawn(async move { cache.invalidate(&key).await });
    };
    let all = state.cache.clone();
    let drop_all = move || all.invalidate_all();
    let (items, users) = (guards.items.clone(), guards.users.clone());
    match (state.db.pool().clone(), guards.log_feed.clone()) {
        (Pool::Postgres(pool), Some(url)) => follow(
            &state,
            &guards,
            postgres::log::Follower::new(items, pool.clone(), items_feed(), url.clone()),
            postgres::log::Follower::new(users, pool, users_feed(), url),
            invalidate,
            drop_all,
        ),
        (Pool::Postgres(pool), None) => {
            let follower = |guard, watch| {
                let follower = postgres::Follower::new(guard, pool.clone(), watch);
                match state.db.replica() {
                    Some(replica) => follower.replica(replica.clone()),
                    None => follower,
                }
            };
            follow(
                &state,
                &guards,
                follower(items, items_feed()),
                follower(users, users_feed()),
                invalidate,
                drop_all,
            );
        }
        (Pool::Sqlite(pool), _) => follow(
            &state,
            &guards,
            sqlite::Follower::new(items, pool.clone(), items_feed()),
            sqlite::Follower::new(users, pool, users_feed()),
            invalidate,
            drop_all,
        ),
        (Pool::MySql(pool), Some(url)) => follow(
            &state,
            &guards,
            mysql::log::Follower::new(items, pool.clone(), items_feed(), url.clone()),
            mysql::log::Follower::new(users, pool, users_feed(), url),
            invalidate,
            drop_all,
        ),
        (Pool::MySql(pool), None) => follow(
            &state,
            &guards,
            mysql::Follower::new(items, pool.clone(), items_feed()),
            mysql::Follower::new(users, pool, users_feed()),
            invalidate,
            drop_all,
        ),
    }
    for guard in guards.all() {
        guard.ready().await;
    }
}

/// Runs the followers of both guards until the service stops; the items'
/// follower keeps the cache in step with the feed.
fn follow<F: Follow>(
    state: &AppState,
    guards: &Guards,
    items: F,
    users: F,
    invalidate: impl Fn(&str) + Send + Sync + 'static,
    drop_all: impl Fn() + Send + Sync + 'static,
) {
    let items = items
        .snapshots(guards.snapshots)
        .instance_id(guards.instance.clone())
        .on_key(invalidate)
        .on_catch_up(drop_all);
    state.keep(tokio::spawn(items.run_until(state.stopping())));
    let users = users
        .snapshots(guards.snapshots)
        .instance_id(guards.instance.clone());
    state.keep(tokio::spawn(users.run_until(state.stopping())));
}
