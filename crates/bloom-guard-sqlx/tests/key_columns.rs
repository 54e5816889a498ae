//! The guard answers "absent" only for keys it compares as the database
//! does: every key stored by plain SQL is served through the guard, however
//! the request spells it, and a key type that does not fit its column keeps
//! the guard open with an error naming the type to use.

mod common;

use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{Request, StatusCode};
use axum::routing::get;
use axum::Router;
use bloom_guard::{extract::PathParam, stats::GuardState, BloomGuard, KeyType};
use bloom_guard_sqlx::{postgres, Watch};
use common::{exec, spawn, spellings, wait_until, Running};
use sqlx::PgPool;
use tower::ServiceExt;

/// A table of profiles whose usernames compare as `column_type` says,
/// watched, with `usernames` written by plain SQL.
async fn profiles(pool: &PgPool, column_type: &str, usernames: &[&str]) {
    bloom_guard_sqlx::postgres::install(pool)
        .await
        .expect("install");
    exec(
        pool,
        "create extension if not exists citext;
         create collation if not exists case_insensitive
             (provider = icu, locale = 'und-u-ks-level2', deterministic = false)",
    )
    .await;
    exec(
        pool,
        &format!("create table profiles (username {column_type} not null unique)"),
    )
    .await;
    Watch::table("profiles")
        .key("username")
        .install(pool)
        .await
        .expect("watch");
    for username in usernames {
        sqlx::query("insert into profiles (username) values ($1)")
            .bind(username)
            .execute(pool)
            .await
            .expect("insert by SQL");
    }
}

/// A guard of `key_type` over `profiles`, once its first filter is built.
async fn followed(pool: &PgPool, key_type: KeyType) -> (BloomGuard, Running) {
    let guard = BloomGuard::builder()
        .name("profiles")
        .key_type(key_type)
        .build();
    let follower = postgres::Follower::new(
        guard.clone(),
        pool.clone(),
        Watch::table("profiles").key("username"),
    )
    .check_interval(Duration::from_millis(200));
    let task = spawn(follower);
    wait_until("the first filter", Duration::from_secs(10), || {
        guard.stats().generation > 0
    })
    .await;
    (guard, task)
}

/// `GET /profiles/{username}`: 200 if the database finds the username by
/// `=` on its column (the parameter cast to the column's type, as an
/// application's typed query would), 404 if not; guarded by `guard`.
fn app(pool: PgPool, guard: &BloomGuard, column_type: &'static str) -> Router {
    let profile = move |State(pool): State<PgPool>, Path(username): Path<String>| async move {
        let sql = format!(
            "select exists(select 1 from profiles where username = $1::text::{column_type})"
        );
        let found: bool = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .bind(username)
            .fetch_one(&pool)
            .await
            .expect("lookup");
        if found {
            StatusCode::OK
        } else {
            StatusCode::NOT_FOUND
        }
    };
    Router::new()
        .route("/profiles/{username}", get(profile))
        .route_layer(guard.layer(PathParam("username")))
        .with_state(pool)
}

async fn status(app: &Router, uri: &str) -> StatusCode {
    let request = Request::get(uri)
        .body(Body::empty())
        .expect("valid request");
    app.clone()
        .oneshot(request)
        .await
        .expect("infallible")
        .status()
}

#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn every_stored_username_is_served_however_it_is_spelt(pool: PgPool) {
    let long = "l".repeat(600);
    let stored = ["..", ".", "a%ZZ", "100%", "x%2", "EdgeCase", long.as_str()];
    profiles(&pool, "text collate case_insensitive", &stored).await;
    let (guard, _task) = followed(&pool, KeyType::CaseInsensitiveText).await;
    assert_eq!(guard.stats().state, GuardState::Ready);
    let app = app(pool, &guard, "text");
    let long_path = format!("/profiles/{long}");
    for path in [
        "/profiles/%2e%2e",
        "/profiles/%2E",
        "/profiles/a%ZZ",
        "/profiles/A%zz",
        "/profiles/100%",
        "/profiles/X%2",
        "/profiles/edgecase",
        "/profiles/EDGECASE",
        // The collation ignores control characters; the key type cannot.
        "/profiles/edg%01ecase",
        "/profiles/Edge%7FCase",
        &long_path,
    ] {
        assert_eq!(status(&app, path).await, StatusCode::OK, "{path}");
    }
    for path in ["/profiles/nobody", "/profiles/%2e%2e%2e", "/profiles/99%"] {
        assert_eq!(status(&app, path).await, StatusCode::NOT_FOUND, "{path}");
    }
    let stats = guard.stats();
    assert_eq!(
        stats.rejected, 3,
        "the absent usernames were answered by the guard"
    );
    assert_eq!(stats.unchecked.uncomparable, 2);
    assert_eq!(stats.unchecked.too_long, 1);
}

/// Text over a column that ignores case (or control characters) would
/// refuse `edgecase` for `EdgeCase`: the guard stays open and says which
/// key type to use.
#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn text_over_a_case_insensitive_column_keeps_the_guard_open(pool: PgPool) {
    profiles(&pool, "text collate case_insensitive", &["EdgeCase"]).await;
    let (guard, _task) = followed(&pool, KeyType::Text).await;
    let app = app(pool, &guard, "text");
    assert_eq!(status(&app, "/profiles/edgecase").await, StatusCode::OK);
    assert_eq!(
        status(&app, "/profiles/nobody").await,
        StatusCode::NOT_FOUND
    );
    let stats = guard.stats();
    // Never ready: it would not protect.
    assert_eq!(stats.state, GuardState::Warming);
    assert!(!guard.is_ready());
    assert_eq!(stats.rejected, 0);
    let error = stats.last_error.unwrap_or_default();
    assert!(error.contains("KeyType::CaseInsensitiveText"), "{error}");
}

#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn text_over_citext_keeps_the_guard_open(pool: PgPool) {
    profiles(&pool, "citext", &["EdgeCase"]).await;
    let (guard, _task) = followed(&pool, KeyType::Text).await;
    assert!(guard.may_contain("edgecase"));
    let error = guard.stats().last_error.unwrap_or_default();
    assert!(error.contains("KeyType::CaseInsensitiveText"), "{error}");
}

#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn text_over_integers_keeps_the_guard_open(pool: PgPool) {
    profiles(&pool, "bigint", &[]).await;
    let (guard, _task) = followed(&pool, KeyType::Text).await;
    assert!(guard.may_contain("007"));
    let error = guard.stats().last_error.unwrap_or_default();
    assert!(error.contains("KeyType::Integer"), "{error}");
}

/// `char(n)` ignores trailing spaces: `Text` would refuse `ab ` for `ab`,
/// so the guard stays open and names the key type that fits.
#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn text_over_char_n_keeps_the_guard_open(pool: PgPool) {
    profiles(&pool, "char(8)", &["ab"]).await;
    let (guard, _task) = followed(&pool, KeyType::Text).await;
    assert!(guard.may_contain("ab "));
    assert_eq!(guard.stats().state, GuardState::Warming);
    assert!(!guard.is_ready());
    let error = guard.stats().last_error.unwrap_or_default();
    assert!(error.contains("KeyType::SpacePaddedText"), "{error}");
}

/// A model of `char(6)` under `SpacePaddedText`: random keys written by
/// SQL before the start and through the feed after it, and random
/// spellings asked through the guard. The guard refuses none the database
/// finds by `=`, and refuses the absent ones but for false positives.
#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn char_n_under_space_padded_text_refuses_only_absent_spellings(pool: PgPool) {
    let mut rng = common::seeded("BLOOM_GUARD_SEED");
    profiles(&pool, "char(6)", &[]).await;
    exec(
        &pool,
        "alter table profiles drop constraint profiles_username_key",
    )
    .await;
    let insert = async |key: String| {
        sqlx::query("insert into profiles (username) values ($1)")
            .bind(key)
            .execute(&pool)
            .await
            .expect("insert by SQL");
    };
    for _ in 0..20 {
        insert(common::spelling(&mut rng)).await;
    }
    let (guard, _task) = followed(&pool, KeyType::SpacePaddedText).await;
    assert_eq!(guard.stats().state, GuardState::Ready);
    let app = app(pool.clone(), &guard, "char(6)");
    common::answers_as_the_table(
        &mut rng,
        &guard,
        insert,
        async |key: &str| {
            sqlx::query_scalar(
                "select exists(select 1 from profiles where username = $1::text::char(6))",
            )
            .bind(key)
            .fetch_one(&pool)
            .await
            .expect("the table's answer")
        },
        async |key: &str| status(&app, &format!("/profiles/{key}")).await,
    )
    .await;
}

/// The fitting key types answer absent keys, and the default collation
/// with `Text` is left alone.
#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn fitting_key_types_answer(pool: PgPool) {
    profiles(&pool, "citext", &["EdgeCase"]).await;
    let (guard, _task) = followed(&pool, KeyType::CaseInsensitiveText).await;
    let app = app(pool, &guard, "citext");
    assert_eq!(status(&app, "/profiles/EDGEcase").await, StatusCode::OK);
    assert_eq!(
        status(&app, "/profiles/nobody").await,
        StatusCode::NOT_FOUND
    );
    let stats = guard.stats();
    assert_eq!((stats.state, stats.rejected), (GuardState::Ready, 1));
    assert_eq!(stats.last_error, None);
}

/// `citext` equates `İstanbul` with `istanbul` (its `lower()` maps `İ` to
/// `i`): the follower reads such stored keys as the database lowers them,
/// so the guard stays ready and finds every spelling the database finds,
/// whether the key was there at start or brought by the feed.
#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn citext_keys_beyond_ascii_are_held_as_the_database_lowers_them(pool: PgPool) {
    profiles(&pool, "citext", &["EdgeCase", "Straße"]).await;
    let (guard, _task) = followed(&pool, KeyType::CaseInsensitiveText).await;
    wait_until("ready", Duration::from_secs(5), || guard.is_ready()).await;
    exec(&pool, "insert into profiles (username) values ('İstanbul')").await;
    wait_until("the feed", Duration::from_secs(5), || {
        guard.may_contain("istanbul")
    })
    .await;
    let app = app(pool.clone(), &guard, "citext");
    for (spelling, found) in [
        ("istanbul", true),
        ("ISTANBUL", true),
        ("STRA%C3%9FE", true),
        ("edgecase", true),
        ("strasse", false),
        ("nobody", false),
    ] {
        let expected = if found {
            StatusCode::OK
        } else {
            StatusCode::NOT_FOUND
        };
        assert_eq!(
            status(&app, &format!("/profiles/{spelling}")).await,
            expected,
            "{spelling}"
        );
    }
    let stats = guard.stats();
    assert_eq!(stats.state, GuardState::Ready);
    assert_eq!(stats.rejected, 2, "strasse and nobody, by the guard");

    // Found at start too.
    let (again, _again) = followed(&pool, KeyType::CaseInsensitiveText).await;
    wait_until("ready at start", Duration::from_secs(5), || {
        again.is_ready()
    })
    .await;
    assert!(again.may_contain("ISTANBUL"));
}

/// An ICU case-insensitive collation equates full-width letters with
/// ASCII ones, which `lower()` does not: once such a key is stored (found
/// at start, or brought by the feed) the guard stays open, saying why.
#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn a_stored_key_the_key_type_cannot_compare_keeps_the_guard_open(pool: PgPool) {
    profiles(&pool, "text collate case_insensitive", &["EdgeCase"]).await;
    let (guard, _task) = followed(&pool, KeyType::CaseInsensitiveText).await;
    wait_until("ready", Duration::from_secs(5), || guard.is_ready()).await;
    assert_eq!(guard.stats().state, GuardState::Ready);
    assert!(!guard.may_contain("abc"));
    exec(&pool, "insert into profiles (username) values ('ＡＢＣ')").await;
    wait_until("held open", Duration::from_secs(5), || {
        guard.stats().state == GuardState::Degraded
    })
    .await;
    let app = app(pool.clone(), &guard, "text collate case_insensitive");
    assert_eq!(status(&app, "/profiles/abc").await, StatusCode::OK);
    let error = guard.stats().last_error.unwrap_or_default();
    assert!(error.contains("printable ASCII"), "{error}");

    // Found at start too.
    let (again, _again) = followed(&pool, KeyType::CaseInsensitiveText).await;
    wait_until("held open at start", Duration::from_secs(5), || {
        again.stats().generation == 1
            && again
                .stats()
                .reason
                .is_some_and(|why| why.contains("printable ASCII"))
    })
    .await;
    assert!(!again.is_ready());
}

/// A key column no key type compares as Postgres does (an ICU collation
/// that ignores accents, a date parsed from many spellings) is refused at
/// watch, naming the column and why; nothing is installed on it.
#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn a_key_column_no_key_type_compares_is_refused_at_watch(pool: PgPool) {
    bloom_guard_sqlx::postgres::install(&pool)
        .await
        .expect("install");
    exec(
        &pool,
        "create collation if not exists accent_insensitive
             (provider = icu, locale = 'und-u-ks-level1', deterministic = false);
         create table people (name text collate accent_insensitive not null);
         create table days (day date not null)",
    )
    .await;
    for (table, column, why) in [
        ("people", "name", "ignores accents"),
        ("days", "day", "parsed"),
    ] {
        let watched = Watch::table(table).key(column).install(&pool).await;
        let Err(bloom_guard_sqlx::FeedError::Uncomparable(message)) = watched else {
            panic!("{table}: {watched:?}");
        };
        assert!(
            message.contains(&format!("{table}.{column}")) && message.contains(why),
            "{message}"
        );
    }
    let triggers: i64 = sqlx::query_scalar(
        "select count(*) from pg_trigger where tgrelid in ('people'::regclass, 'days'::regclass)",
    )
    .fetch_one(&pool)
    .await
    .expect("triggers");
    assert_eq!(triggers, 0);
}

/// A key column altered while the follower runs (to `citext`, which text
/// keys cannot compare): the ALTER's own transaction records a resync, so
/// a request for another spelling of a stored key that arrives after it
/// is never refused; the guard stays open, and answers again once the
/// column is altered back.
#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn a_key_column_altered_while_following_holds_the_guard_open(pool: PgPool) {
    common::install(&pool).await;
    exec(
        &pool,
        "create extension if not exists citext; insert into items (key) values ('Apple')",
    )
    .await;
    let guard = BloomGuard::builder().expected_items(1000).build();
    let _task = spawn(common::follower(&guard, &pool));
    wait_until("ready", Duration::from_secs(20), || guard.is_ready()).await;
    assert_eq!(common::status(&guard, "apple").await, StatusCode::NOT_FOUND);
    exec(&pool, "alter table items alter column key type citext").await;
    // The database finds `Apple` for `apple` now: the read barrier's read
    // brings the resync before any refusal.
    assert_ne!(common::status(&guard, "apple").await, StatusCode::NOT_FOUND);
    wait_until("held open for the column", Duration::from_secs(20), || {
        let stats = guard.stats();
        stats.state != GuardState::Ready
            && stats
                .reason
                .as_deref()
                .is_some_and(|reason| reason.contains("items.key"))
    })
    .await;
    exec(&pool, "alter table items alter column key type text").await;
    wait_until("answering again", Duration::from_secs(20), || {
        guard.stats().state == GuardState::Ready
    })
    .await;
}

/// Every code point of the Basic Multilingual Plane alone, and after and
/// before an ASCII letter, stored in a `citext` column (half before the
/// follower starts, half through the feed); every probe (each stored
/// string, its upper and lower case by Rust and by the database) that the
/// database finds there
/// (`join ... on p.w = t.w`, `citext`'s own equality) must be found by the
/// guard, and absent keys are refused.
#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn every_spelling_citext_finds_is_found(pool: PgPool) {
    bloom_guard_sqlx::postgres::install(&pool)
        .await
        .expect("install");
    exec(
        &pool,
        "create extension if not exists citext;
         create table words (w citext not null);
         create index on words (w);
         create table probes (w citext not null)",
    )
    .await;
    let watch = Watch::table("words").key("w");
    watch.install(&pool).await.expect("watch");
    let corpus = spellings::corpus(true);
    let probes = spellings::probes(&corpus);
    let insert = async |table: &str, rows: &[String]| {
        for chunk in rows.chunks(20_000) {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "insert into {table} (w) select unnest($1::text[])"
            )))
            .bind(chunk)
            .execute(&pool)
            .await
            .expect("insert");
        }
    };
    let (scanned, fed) = corpus.split_at(corpus.len() / 2);
    insert("words", scanned).await;
    let guard = BloomGuard::builder()
        .name("words")
        .key_type(KeyType::CaseInsensitiveText)
        .expected_items(corpus.len() as u64 * 2)
        .false_positive_rate(0.001)
        .build();
    let _task = spawn(
        postgres::Follower::new(guard.clone(), pool.clone(), watch)
            .check_interval(Duration::from_millis(200))
            .poll_interval(Duration::from_millis(200)),
    );
    wait_until("ready", Duration::from_secs(60), || guard.is_ready()).await;
    insert("words", fed).await;
    insert("words", &["zz-last".to_owned()]).await;
    wait_until("the feed", Duration::from_secs(60), || {
        guard.may_contain("zz-last")
    })
    .await;
    insert("probes", &probes).await;
    // And each stored string as the database lowers and uppers it: ASCII
    // spellings of stored keys that are not (`sİ` lowers to `si`).
    exec(
        &pool,
        "insert into probes (w) select lower(w::text) from words;
         insert into probes (w) select upper(w::text) from words",
    )
    .await;
    let matched: Vec<String> = sqlx::query_scalar(
        "select p.w::text from probes p where exists (select 1 from words t where t.w = p.w)",
    )
    .fetch_all(&pool)
    .await
    .expect("the probes the database finds");
    spellings::assert_exact("citext", &guard, &matched, corpus.len());
    assert_eq!(guard.stats().state, GuardState::Ready);
}
