//! Keys under MariaDB's case- and accent-insensitive collations, proven
//! against the server: a corpus of every code point of the Basic
//! Multilingual Plane, alone and beside ASCII letters, is stored in a
//! watched table under each collation (half scanned, half through the
//! feed); a probe table holds each stored string and its other spellings
//! (upper and lower case, trailing spaces). Every probe the server finds
//! in the watched table (`join ... on p.w = t.w`, the server's own
//! equality) must not be refused by the guard, every probe the guard
//! weighs itself must weigh as the server weighs it, and random absent
//! keys are refused.

mod common;

use std::time::Duration;

use bloom_guard::{
    keys::{Collation, Key},
    BloomGuard, KeyType,
};
use bloom_guard_sqlx::{mysql, Watch};
use common::mysql::fresh;
use common::{spawn, spellings, wait_until};
use sqlx::MySqlPool;

/// The collations proven with the whole corpus.
const COLLATIONS: &[&str] = &[
    "utf8mb4_general_ci",
    "utf8mb4_unicode_ci",
    "utf8mb4_unicode_520_ci",
    "utf8mb4_uca1400_ai_ci",
];

/// The other supported collations: the same weights as one above, without
/// padding, in `utf8mb3`, or with accents or case at further levels,
/// proven with every character alone and with trailing spaces (not beside
/// letters).
const VARIANTS: &[&str] = &[
    "utf8mb4_general_nopad_ci",
    "utf8mb4_unicode_nopad_ci",
    "utf8mb4_unicode_520_nopad_ci",
    "utf8mb4_uca1400_nopad_ai_ci",
    "utf8mb3_general_ci",
    "utf8mb3_unicode_ci",
    "utf8mb4_uca1400_as_ci",
    "utf8mb4_uca1400_ai_cs",
    "utf8mb4_uca1400_as_cs",
    "utf8mb4_uca1400_nopad_as_ci",
];

/// Spellings the docs promise, each beside what it must find.
const SPELLINGS: &[(&str, &[&str])] = &[
    ("Apple-Pie", &["apple-pie", "APPLE-PIE", "Apple-Pie "]),
    ("cafe", &["café", "cafe ", "CAFÉ"]),
];

/// The stored corpus ([`spellings::corpus`]) and the documented
/// spellings.
fn corpus(beside: bool) -> Vec<String> {
    let mut corpus = spellings::corpus(beside);
    corpus.extend(SPELLINGS.iter().map(|(stored, _)| (*stored).to_owned()));
    // An expansion; U+0000 (a zero weight under general_ci); Catalan's
    // middle dot, which contracts with the `l` before it under uca1400.
    corpus.extend(["straße", "\0", "a\0b", "col·lecció", "L·L", "l·"].map(str::to_owned));
    corpus
}

/// What requests ask for ([`spellings::probes`]), and the documented
/// spellings.
fn probes(corpus: &[String]) -> Vec<String> {
    let mut probes = spellings::probes(corpus);
    for (_, spellings) in SPELLINGS {
        probes.extend(spellings.iter().map(|s| (*s).to_owned()));
    }
    // A contraction under the UCA collations: `И` and a combining breve
    // weigh as `Й`.
    probes.extend(
        [
            "strasse",
            "И\u{306}",
            "и\u{306}",
            "A\0B",
            "colleccio",
            "COL·LECCIÓ",
            "ll",
            "l",
        ]
        .map(str::to_owned),
    );
    probes
}

async fn insert_all(pool: &MySqlPool, table: &str, rows: &[String]) {
    for chunk in rows.chunks(2000) {
        let values = vec!["(?)"; chunk.len()].join(", ");
        let mut query = sqlx::query(sqlx::AssertSqlSafe(format!(
            "insert into {table} (w) values {values}"
        )));
        for row in chunk {
            query = query.bind(row);
        }
        query.execute(pool).await.expect("insert rows");
    }
}

/// One collation: the corpus stored, the probes the server matches, and
/// the guard's answers.
async fn prove(pool: &MySqlPool, collation: &str, beside: bool) {
    let charset = collation.split('_').next().unwrap_or("utf8mb4");
    for table in ["words", "probes"] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "drop table if exists {table};
             create table {table} (id bigint auto_increment primary key,
                                   w varchar(40) character set {charset} collate {collation} not null,
                                   key (w))"
        )))
        .execute(pool)
        .await
        .expect("create the tables");
    }
    let corpus = corpus(beside);
    let (scanned, fed) = corpus.split_at(corpus.len() / 2);
    insert_all(pool, "words", scanned).await;
    let watch = Watch::table("words").key("w");
    watch.install(pool).await.expect("watch words");
    let key_type = watch.key_type(pool).await.expect("the key type");
    let KeyType::Collated(found) = key_type else {
        panic!("{collation}: {key_type:?}");
    };
    assert_eq!(found.name(), collation);
    let guard = BloomGuard::builder()
        .key_type(key_type)
        .expected_items(corpus.len() as u64 * 2)
        .false_positive_rate(0.001)
        .build();
    let _running = spawn(
        mysql::Follower::new(guard.clone(), pool.clone(), watch.clone())
            .check_interval(Duration::from_millis(200))
            .poll_interval(Duration::from_millis(200)),
    );
    wait_until("the warm-up", Duration::from_secs(60), || guard.is_ready()).await;
    insert_all(pool, "words", fed).await;
    let last = format!("zz-last-{}", fastrand::u64(..));
    insert_all(pool, "words", std::slice::from_ref(&last)).await;
    wait_until("the feed", Duration::from_secs(60), || {
        guard.may_contain(&last)
    })
    .await;

    let probes = probes(&corpus);
    insert_all(pool, "probes", &probes).await;
    if beside {
        // Each stored string as the server lowers and uppers it.
        sqlx::raw_sql(
            "insert into probes (w) select lower(w) from words;
             insert into probes (w) select upper(w) from words",
        )
        .execute(pool)
        .await
        .expect("the server's spellings");
    }
    let matched: Vec<String> = sqlx::query_scalar(
        "select p.w from probes p where exists (select 1 from words t where t.w = p.w)",
    )
    .fetch_all(pool)
    .await
    .expect("the probes the server finds");
    spellings::assert_exact(collation, &guard, &matched, corpus.len());
    // Every probe the guard weighs itself weighs as the server weighs it,
    // level after level.
    let levels: &[u8] = match collation {
        c if c.ends_with("_as_cs") => &[1, 2, 3],
        c if c.ends_with("_as_ci") => &[1, 2],
        c if c.ends_with("_ai_cs") => &[1, 3],
        _ => &[1],
    };
    assert_eq!(found.levels(), levels.len(), "{collation}");
    let server = match levels {
        [_] => "weight_string(w)".to_owned(),
        levels => {
            let each: Vec<String> = levels
                .iter()
                .map(|level| format!("weight_string(w level {level})"))
                .collect();
            format!("concat({})", each.join(", x'0000', "))
        }
    };
    let weighed: Vec<(String, Vec<u8>)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "select w, {server} from probes"
    )))
    .fetch_all(pool)
    .await
    .expect("the server's weights");
    let mut differ = Vec::new();
    for (probe, server) in &weighed {
        if let Some(own) = found.weights(probe) {
            if Some(own) != found.stored(&Collation::weighed(server)) {
                differ.push(probe);
            }
        }
    }
    assert!(
        differ.is_empty(),
        "{collation}: {} probes weigh otherwise than on the server, such as {:?}",
        differ.len(),
        &differ[..differ.len().min(10)]
    );
    // The documented spellings, under the four collations that promise
    // them (case- and accent-insensitive, PAD SPACE).
    for (stored, spellings) in SPELLINGS.iter().filter(|_| beside) {
        for spelling in *spellings {
            assert!(
                matched.iter().any(|found| found == spelling),
                "{collation}: the server finds {spelling}"
            );
            assert!(
                !spellings::refuses(&guard, spelling),
                "{collation}: {spelling} for {stored}"
            );
        }
    }
}

/// Each collation in turn, on a database of its own.
async fn prove_each(collations: &[&str], beside: bool) {
    let pool = fresh(4).await;
    let server: String = sqlx::query_scalar("select version()")
        .fetch_one(&pool)
        .await
        .expect("version");
    for collation in collations {
        if collation.contains("uca1400") && !server.contains("MariaDB") {
            continue; // MariaDB 10.10 and later only
        }
        prove(&pool, collation, beside).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(mysql_database), ignore = "needs MySQL or MariaDB: set MYSQL_URL")]
async fn every_spelling_the_server_finds_is_found_under_each_collation() {
    prove_each(COLLATIONS, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(mysql_database), ignore = "needs MySQL or MariaDB: set MYSQL_URL")]
async fn every_spelling_the_server_finds_is_found_under_each_variant() {
    prove_each(VARIANTS, false).await;
}

/// `straße` is found as `strasse` under `utf8mb4_unicode_ci`, not under
/// `general_ci`, which compares them as the server does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(mysql_database), ignore = "needs MySQL or MariaDB: set MYSQL_URL")]
async fn expansions_follow_the_collation() {
    let pool = fresh(2).await;
    for (collation, equal) in [("utf8mb4_unicode_ci", true), ("utf8mb4_general_ci", false)] {
        let table = format!("t_{}", collation.replace("utf8mb4_", ""));
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "create table {table} (id int primary key, w varchar(20) collate {collation})"
        )))
        .execute(&pool)
        .await
        .expect("create");
        let key_type = Watch::table(&table)
            .key("w")
            .key_type(&pool)
            .await
            .expect("key type");
        let form = |text| key_type.to_canonical(Key::from(text)).ok();
        let server: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "select _utf8mb4'straße' collate {collation} = _utf8mb4'strasse'"
        )))
        .fetch_one(&pool)
        .await
        .expect("compare");
        assert_eq!(server == 1, equal, "{collation}");
        assert_eq!(form("straße") == form("strasse"), equal, "{collation}");
    }
}

/// A language's collation (contractions of letters) and an accent-
/// sensitive one are refused by `Watch::key_type`, naming the supported
/// collations.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(mysql_database), ignore = "needs MySQL or MariaDB: set MYSQL_URL")]
async fn collations_without_a_form_are_a_clear_error() {
    let pool = fresh(2).await;
    sqlx::raw_sql(
        "create table spanish (id int primary key, w varchar(20) collate utf8mb4_spanish2_ci)",
    )
    .execute(&pool)
    .await
    .expect("create");
    let error = Watch::table("spanish")
        .key("w")
        .key_type(&pool)
        .await
        .expect_err("refused");
    let message = error.to_string();
    for named in ["spanish.w", "utf8mb4_spanish2_ci", "utf8mb4_general_ci"] {
        assert!(message.contains(named), "{named} not in {message}");
    }
}

/// A new table `(id, w)` with `w` under `collation`, watched.
async fn watched(pool: &MySqlPool, table: &str, collation: &str) -> Watch {
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "create table {table} (id bigint auto_increment primary key,
                               w varchar(40) character set utf8mb4 collate {collation} not null,
                               key (w))"
    )))
    .execute(pool)
    .await
    .expect("create");
    let watch = Watch::table(table).key("w");
    watch.install(pool).await.expect("watch");
    watch
}

/// A guard with the key type of `watch`'s column, and its follower, once
/// ready.
async fn followed(pool: &MySqlPool, watch: &Watch) -> (BloomGuard, common::Running) {
    let guard = BloomGuard::builder()
        .key_type(watch.key_type(pool).await.expect("the key type"))
        .build();
    let running = spawn(
        mysql::Follower::new(guard.clone(), pool.clone(), watch.clone())
            .check_interval(Duration::from_millis(200))
            .poll_interval(Duration::from_millis(200)),
    );
    wait_until("ready", Duration::from_secs(20), || guard.is_ready()).await;
    (guard, running)
}

/// A key written through one pool is found at once, under another
/// spelling, through a guard following the table on its own connections
/// (another instance): the read barrier's promise under a collation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(mysql_database), ignore = "needs MySQL or MariaDB: set MYSQL_URL")]
async fn a_key_written_elsewhere_is_found_at_once_under_any_spelling() {
    let pool = fresh(2).await;
    let watch = watched(&pool, "names", "utf8mb4_unicode_ci").await;
    let elsewhere = common::mysql::with_isolation(&pool, "repeatable read", 2).await;
    let (guard, _running) = followed(&elsewhere, &watch).await;
    for i in 0..200 {
        sqlx::query("insert into names (w) values (?)")
            .bind(format!("Straße-{i}"))
            .execute(&pool)
            .await
            .expect("insert");
        let spelling = format!("STRASSE-{i}%20");
        assert_ne!(
            common::status(&guard, &spelling).await,
            http::StatusCode::NOT_FOUND,
            "{spelling} refused right after its row committed"
        );
    }
    assert!(guard.stats().barrier_waits > 0, "{:?}", guard.stats());
}

/// Deletes under a collation: a row's key is weighed the same when it is
/// inserted and when it is deleted (by any spelling), so the counting
/// filter forgets it exactly once; two rows of equal spellings stay found
/// until both are gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(mysql_database), ignore = "needs MySQL or MariaDB: set MYSQL_URL")]
async fn deletes_under_a_collation_are_forgotten_once() {
    let pool = fresh(2).await;
    let watch = watched(&pool, "names", "utf8mb4_general_ci").await;
    let (guard, _running) = followed(&pool, &watch).await;
    let exec = async |sql: &str| {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
            .execute(&pool)
            .await
            .expect("statement");
    };
    exec("insert into names (w) values ('Apple-Pie'), ('café'), ('CAFE ')").await;
    wait_until("the inserts", Duration::from_secs(10), || {
        guard.may_contain("apple-pie") && guard.may_contain("cafe")
    })
    .await;
    // Deleted by another spelling: the row's own key is what is forgotten.
    exec("delete from names where w = 'APPLE-PIE'").await;
    wait_until("the delete", Duration::from_secs(10), || {
        !guard.may_contain("apple-pie")
    })
    .await;
    // Two rows the collation equates: one gone, the other still found.
    exec("delete from names where w = 'café' collate utf8mb4_bin").await;
    exec("insert into names (w) values ('zz-after')").await;
    wait_until("the feed", Duration::from_secs(10), || {
        guard.may_contain("zz-after")
    })
    .await;
    assert!(
        guard.may_contain("Café"),
        "a row spelt CAFE  is still stored"
    );
    exec("delete from names where w = 'cafe'").await;
    wait_until("the last delete", Duration::from_secs(10), || {
        !guard.may_contain("cafe")
    })
    .await;
    assert!(guard.stats().deletes_applied >= 3, "{:?}", guard.stats());
}

/// A spelling of one of a few words, as users type them: any case, an
/// accent or a decomposed one, `ß` for `ss`, Catalan's middle dot,
/// trailing spaces.
fn spelling(rng: &mut fastrand::Rng) -> String {
    let word = ["apple", "cafe", "strasse", "pie", "colleccio", "ab"][rng.usize(..6)];
    let mut out = String::new();
    let mut chars = word.chars().peekable();
    while let Some(c) = chars.next() {
        let c = if rng.bool() {
            c.to_ascii_uppercase()
        } else {
            c
        };
        match (c, rng.u8(..6)) {
            ('e' | 'E', 0) => out.push(if c == 'e' { 'é' } else { 'É' }),
            ('e' | 'E', 1) => {
                out.push(c);
                out.push('\u{301}');
            }
            ('s', 2) if chars.peek() == Some(&'s') => {
                chars.next();
                out.push('ß');
            }
            ('l' | 'L', 3) => {
                out.push(c);
                out.push('·');
            }
            _ => out.push(c),
        }
    }
    out.push_str(&" ".repeat(rng.usize(..3)));
    out
}

/// A random workload on a collated column (inserts, deletes and key
/// changes by any spelling, a delete and an insert in one transaction,
/// `REPLACE`), and after every twenty steps, for every spelling ever
/// written or asked for, the table's answer (`exists ... where w = ?`)
/// against the guard's: a spelling the table finds is never refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(mysql_database), ignore = "needs MySQL or MariaDB: set MYSQL_URL")]
async fn a_random_workload_under_a_collation_never_refuses_a_spelling_the_table_finds() {
    let pool = fresh(4).await;
    let server: String = sqlx::query_scalar("select version()")
        .fetch_one(&pool)
        .await
        .expect("version");
    let collations: &[&str] = if server.contains("MariaDB") {
        &["utf8mb4_general_ci", "utf8mb4_uca1400_as_ci"]
    } else {
        &["utf8mb4_general_ci"]
    };
    let mut rng = fastrand::Rng::with_seed(42);
    for collation in collations {
        let table = format!("model_{}", collation.replace("utf8mb4_", ""));
        let watch = watched(&pool, &table, collation).await;
        let (guard, _running) = followed(&pool, &watch).await;
        let mut seen = std::collections::BTreeSet::new();
        let (mut found, mut deletes) = (0, 0);
        for step in 0..200 {
            let (key, other) = (spelling(&mut rng), spelling(&mut rng));
            seen.insert(key.clone());
            seen.insert(other.clone());
            let id = rng.u64(1..=(step as u64 + 1));
            let statement = match rng.u8(..6) {
                0 | 1 => format!("insert into {table} (w) values (?)"),
                2 => {
                    deletes += 1;
                    format!("delete from {table} where w = ?")
                }
                3 => format!("update {table} set w = ? where id = {id}"),
                4 => format!("replace into {table} (id, w) values ({id}, ?)"),
                _ => {
                    deletes += 1;
                    let mut tx = pool.begin().await.expect("begin");
                    for sql in [
                        format!("delete from {table} where w = ?"),
                        format!("insert into {table} (w) values (?)"),
                    ] {
                        sqlx::query(sqlx::AssertSqlSafe(sql))
                            .bind(&key)
                            .execute(&mut *tx)
                            .await
                            .expect("statement");
                    }
                    tx.commit().await.expect("commit");
                    continue;
                }
            };
            sqlx::query(sqlx::AssertSqlSafe(statement))
                .bind(&key)
                .execute(&pool)
                .await
                .expect("statement");
            if step % 20 != 19 {
                continue;
            }
            let last = format!("zz-{step}");
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "insert into {table} (w) values (?)"
            )))
            .bind(&last)
            .execute(&pool)
            .await
            .expect("the last row");
            wait_until("the feed", Duration::from_secs(20), || {
                guard.may_contain(&last)
            })
            .await;
            for key in &seen {
                let exists: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                    "select exists (select 1 from {table} where w = ?)"
                )))
                .bind(key)
                .fetch_one(&pool)
                .await
                .expect("the table's answer");
                if exists == 1 {
                    found += 1;
                    assert!(
                        !spellings::refuses(&guard, key),
                        "{collation}, step {step}: {key:?} is in the table but refused"
                    );
                }
            }
        }
        assert!(
            found > 100 && deletes > 20,
            "{collation}: found {found}, deletes {deletes}"
        );
        assert!(
            guard.stats().deletes_applied > 0,
            "{collation}: {:?}",
            guard.stats()
        );
    }
}
