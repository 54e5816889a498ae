//! What the catalog says of the watched tables: trigger gaps, and the key
//! columns' types and collations.

use sqlx::{AssertSqlSafe, PgPool};

use crate::follow::column::KeyColumn;
use crate::follow::dialects::postgres_comparison;
use crate::follow::Catalog;
use crate::watch::Watch;

/// What keeps feed `name` from being complete: tables whose triggers are
/// missing or disabled, the watched table's name now meaning another table
/// (see [`unwatched_table`]), or the feed not installed at all. Empty when
/// all is well. One statement.
pub(super) async fn gaps(pool: &PgPool, watch: &Watch) -> Result<Vec<String>, sqlx::Error> {
    let gaps = sqlx::query_scalar(AssertSqlSafe(format!(
        "select problem from ({}) p order by part, problem",
        gaps_sql()
    )))
    .bind(&watch.table)
    .bind(watch.feed_name())
    .fetch_all(pool)
    .await;
    match gaps {
        // No such table, function or schema.
        Err(sqlx::Error::Database(error))
            if error
                .code()
                .is_some_and(|code| code == "42P01" || code == "42883" || code == "3F000") =>
        {
            Ok(vec![format!("the change feed is not installed ({error}): call bloom_guard_sqlx::postgres::install and Watch::install")])
        }
        gaps => gaps,
    }
}

/// Every gap of feed `$2` whose table `$1` is: `(problem, part)`, the
/// triggers' first, then the table's ([`UNWATCHED`]).
fn gaps_sql() -> String {
    format!(
        "select coalesce(rel::text || ': ', '') || problem as problem, 0 as part
           from bloom_guard.gaps($2)
         union all
         select problem, 1 from ({UNWATCHED}) u(problem) where problem is not null"
    )
}

/// The trigger check in one statement: the gaps, the triggers' versions
/// and whether the functions count rows (see [`gaps`],
/// [`trigger_versions`] and `counts_rows`). Needs the feed installed at
/// version 8; the caller falls back to the three on any error.
pub(super) async fn check(pool: &PgPool, watch: &Watch) -> Result<Catalog, sqlx::Error> {
    let (gaps, versions, counts_rows): (Vec<String>, String, bool) =
        sqlx::query_as(AssertSqlSafe(format!(
            "select coalesce((select pg_catalog.array_agg(problem order by part, problem) from ({}) p),
                             '{{}}'::text[]),
                    ({VERSIONS}),
                    bloom_guard.counts_rows($2)",
            gaps_sql()
        )))
        .bind(&watch.table)
        .bind(watch.feed_name())
        .fetch_one(pool)
        .await?;
    Ok(Catalog {
        gaps,
        versions: Some(versions),
        counts_rows: Some(counts_rows),
    })
}

/// Whether table `$1`, resolved as the app's connections resolve it (the
/// pool's `search_path`), is one that feed `$2` watches; else why not.
const UNWATCHED: &str = "select case
             when pg_catalog.to_regclass($1) is null then 'table ' || $1 || ' does not exist'
             when not exists (
                 select from bloom_guard.watched w
                  cross join lateral bloom_guard.family(w.rel) f(rel)
                  where w.guard = $2 and f.rel::oid = pg_catalog.to_regclass($1)::oid)
             then $1 || ' is now ' || pg_catalog.to_regclass($1)::oid::regclass::text
                  || ' (OID ' || pg_catalog.to_regclass($1)::oid
                  || '), which the feed does not watch: a table swapped, recreated, or shadowed by a schema earlier in the search_path'
         end";

/// Whether the key query's table, resolved as the app's connections resolve
/// it (this pool, its `search_path`), is one the feed watches: after a table
/// swap, a `pg_restore --clean` or a schema put first in the `search_path`,
/// the name means another table, whose writes no trigger records.
pub(super) async fn unwatched_table(
    pool: &PgPool,
    watch: &Watch,
) -> Result<Option<String>, sqlx::Error> {
    sqlx::query_scalar(UNWATCHED)
        .bind(&watch.table)
        .bind(watch.feed_name())
        .fetch_one(pool)
        .await
}

/// The identity (OID) of every table of feed `name` and the row version
/// (`xmin`) of each of its feed triggers' `pg_trigger` rows: any ALTER of a
/// trigger rewrites its row.
pub(super) async fn trigger_versions(pool: &PgPool, watch: &Watch) -> Result<String, sqlx::Error> {
    sqlx::query_scalar(VERSIONS)
        .bind(&watch.table)
        .bind(watch.feed_name())
        .fetch_one(pool)
        .await
}

/// The versions of feed `$2`'s tables and triggers (`$1` unused: the
/// parameters of [`check`]).
const VERSIONS: &str = "select coalesce(pg_catalog.string_agg(f.rel::oid::text || ':' || coalesce(t.tgname::text || '@' || t.xmin::text, ''),
                                               ',' order by f.rel::oid, t.tgname), '')
           from bloom_guard.watched w
          cross join lateral bloom_guard.family(w.rel) f(rel)
           left join pg_catalog.pg_trigger t
             on t.tgrelid = f.rel and pg_catalog.left(t.tgname, 12) = 'bloom_guard_'
          where w.guard = $2 and $1::text is not null";

/// The watched key columns, in the watch's order.
pub(super) async fn key_columns(
    pool: &PgPool,
    watch: &Watch,
) -> Result<Vec<KeyColumn>, sqlx::Error> {
    // `colllocale` since Postgres 17, `colliculocale` before.
    let rows: Vec<(String, String, bool, String, Option<String>, bool)> = sqlx::query_as(
        "select a.attname::text, coalesce(b.typname, t.typname)::text,
                coalesce(b.typtype, t.typtype) = 'e', format_type(a.atttypid, a.atttypmod),
                case when c.collisdeterministic then null
                     else coalesce(to_jsonb(c) ->> 'colllocale', to_jsonb(c) ->> 'colliculocale', c.collcollate) end,
                a.attcollation = 100 -- the default collation, which the feed's lower() uses
                  and pg_catalog.lower('ABCDEFGHIJKLMNOPQRSTUVWXYZ' collate \"default\") = 'abcdefghijklmnopqrstuvwxyz'
           from unnest($2::text[]) with ordinality as k(name, n)
           join pg_catalog.pg_attribute a
             on a.attrelid = $1::regclass and a.attname = k.name and not a.attisdropped
           join pg_catalog.pg_type t on t.oid = a.atttypid
           left join pg_catalog.pg_type b on t.typtype = 'd' and b.oid = t.typbasetype
           left join pg_catalog.pg_collation c on c.oid = a.attcollation
          order by k.n",
    )
    .bind(&watch.table)
    .bind(&watch.key_columns)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(
            |(name, base, is_enum, declared, locale, lowers)| KeyColumn {
                comparison: postgres_comparison(
                    &base,
                    is_enum,
                    &declared,
                    locale.as_deref(),
                    lowers,
                ),
                name,
            },
        )
        .collect())
}
