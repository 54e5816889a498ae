//! What a second start sends to Postgres when nothing changed: the feed
//! installed at this version, the table watched, a snapshot published. No
//! DDL, and a fixed, small number of statements (the figure is in
//! `docs/feed.md`, "What a start costs").
//!
//! One test in its own binary: it counts every statement sqlx logs in this
//! process.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{exec, follower, guard, install, items, spawn, wait_until};
use sqlx::PgPool;
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::Layer;

/// The statements of a second start up to its guard's readiness, besides
/// its feed reads and the notifier's looks: at most. 23 to 25 in practice:
/// the fleet's settings are read again once the listener listens, if the
/// first read came before it (a change announced in between was missed);
/// three are the session check's (`check_session`: LISTEN on a connection
/// of its own, one NOTIFY through the pool, UNLISTEN as it closes).
const STATEMENTS_AT_MOST: usize = 25;

/// Every statement sqlx logs while `recording` is on.
#[derive(Clone, Default)]
struct Statements {
    recording: Arc<Mutex<Option<Vec<String>>>>,
}

impl<S: tracing::Subscriber> Layer<S> for Statements {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        if event.metadata().target() != "sqlx::query" {
            return;
        }
        let Ok(mut recording) = self.recording.lock() else {
            return;
        };
        if let Some(statements) = recording.as_mut() {
            let mut text = Text::default();
            event.record(&mut text);
            statements.push(text.statement.unwrap_or(text.summary));
        }
    }
}

/// A logged statement: its full text when sqlx gives one, else its summary.
#[derive(Default)]
struct Text {
    summary: String,
    statement: Option<String>,
}

impl Visit for Text {
    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "summary" => self.summary = value.to_owned(),
            "db.statement" if !value.is_empty() => self.statement = Some(value.to_owned()),
            _ => {}
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.record_str(field, &format!("{value:?}"));
    }
}

#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn a_second_start_of_an_unchanged_schema_sends_no_ddl_and_few_statements(pool: PgPool) {
    let statements = Statements::default();
    let subscriber = tracing_subscriber::registry().with(
        statements
            .clone()
            .with_filter(tracing_subscriber::filter::LevelFilter::TRACE),
    );
    tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");

    // The first start: installs, watches, scans and publishes a snapshot.
    install(&pool).await;
    exec(
        &pool,
        "insert into items (key) select 'k' || g from generate_series(1, 1000) g",
    )
    .await;
    let first = guard();
    let running = spawn(follower(&first, &pool).snapshots(true));
    wait_until("a published snapshot", Duration::from_secs(20), || {
        first.is_ready()
    })
    .await;
    for _ in 0..200 {
        let published: i64 = sqlx::query_scalar("select count(*) from bloom_guard.snapshots")
            .fetch_one(&pool)
            .await
            .expect("snapshots");
        if published > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(running);
    tokio::time::sleep(Duration::from_millis(200)).await;

    // The second start, recorded up to readiness.
    *statements.recording.lock().expect("recording") = Some(Vec::new());
    bloom_guard_sqlx::postgres::install(&pool)
        .await
        .expect("install");
    items().install(&pool).await.expect("watch");
    let second = guard();
    let _running = spawn(follower(&second, &pool).snapshots(true));
    wait_until("the second start", Duration::from_secs(20), || {
        second.is_ready()
    })
    .await;
    let sent = statements
        .recording
        .lock()
        .expect("recording")
        .take()
        .unwrap_or_default();

    assert!(
        second.stats().origin == Some(bloom_guard::stats::FilterOrigin::Snapshot),
        "the second start adopted no snapshot: {:?}",
        second.stats().origin
    );
    // The feed's reads and the notifier's looks run on their own pace from
    // the start on: counted apart, they are not the start's work.
    let (periodic, sent): (Vec<String>, Vec<String>) = sent.into_iter().partition(|statement| {
        statement.contains("from now cross join m") || statement.contains("pg_notify($2, '*')")
    });
    assert!(!periodic.is_empty(), "no feed read before readiness");
    let ddl: Vec<&String> = sent
        .iter()
        .filter(|statement| {
            let lower = statement.trim_start().to_lowercase();
            [
                "create", "alter", "drop", "comment", "grant", "revoke", "do ",
            ]
            .iter()
            .any(|word| lower.starts_with(word))
        })
        .collect();
    assert!(
        ddl.is_empty(),
        "DDL at a start of an unchanged schema: {ddl:#?}"
    );
    assert!(
        sent.len() <= STATEMENTS_AT_MOST,
        "{} statements (at most {STATEMENTS_AT_MOST}): {sent:#?}",
        sent.len()
    );
}
