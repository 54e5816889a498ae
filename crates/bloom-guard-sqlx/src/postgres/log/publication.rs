//! What the log carries of a table's family: the members it never
//! carries (unlogged, foreign), a publication that drifted, a fed
//! ancestor a member is published as, inheritance; and the tables on the
//! log feed with their guards.

use sqlx::PgPool;

use super::stream::LoggedTable;
use crate::postgres::install::PUBLICATION;

/// The members of `table`'s family whose rows the log never carries,
/// named; `None` when there are none ([`unseen_in`]).
pub(super) async fn unseen(pool: &PgPool, table: &str) -> Result<Option<String>, sqlx::Error> {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "select {}",
        unseen_in("pg_catalog.to_regclass($1)")
    )))
    .bind(table)
    .fetch_one(pool)
    .await
}

/// SQL for how the publication no longer publishes every change of the
/// table `rel` (a `regclass` expression) as `install_log` made it,
/// described, or null: an operation left out, `publish_via_partition_root`
/// turned off, a row filter or a column list on the table. Changed outside
/// `install_log`, it would silently drop rows the guard must hold.
pub(crate) fn publication_drift(rel: &str) -> String {
    format!(
        "(select nullif(pg_catalog.concat_ws('; ',
                    case when not (p.pubinsert and p.pubupdate and p.pubdelete and p.pubtruncate)
                         then 'it does not publish every operation' end,
                    case when not p.pubviaroot then 'publish_via_partition_root is off' end,
                    case when r.prqual is not null then 'a row filter on the table' end,
                    case when r.prattrs is not null then 'a column list on the table' end), '')
            from pg_catalog.pg_publication p
            left join pg_catalog.pg_publication_rel r on r.prpubid = p.oid and r.prrelid = {rel}
           where p.pubname = '{PUBLICATION}')"
    )
}

/// SQL for the tables on the log feed that `rel` (a `regclass`
/// expression) is a partition of, at any depth, named, or null: the server
/// publishes a partition's changes as its topmost published ancestor, so a
/// guard on the partition gets none of them.
pub(crate) fn fed_ancestors(rel: &str) -> String {
    format!(
        "(select pg_catalog.string_agg(a.relid::pg_catalog.regclass::pg_catalog.text, ', ')
            from pg_catalog.pg_partition_ancestors({rel}) a
           where a.relid <> {rel}
             and exists (select from bloom_guard.logged o where o.rel = a.relid))"
    )
}

/// SQL for the members of the family of `root` (a `regclass` expression)
/// whose rows the log never carries, named and comma-separated, or null:
/// an unlogged table (its writes make no WAL) or a foreign table (its rows
/// live on another server).
pub(crate) fn unseen_in(root: &str) -> String {
    format!(
        "(select pg_catalog.string_agg(u.oid::pg_catalog.regclass::pg_catalog.text, ', ' order by u.oid)
            from bloom_guard.family({root}) f(rel)
            join pg_catalog.pg_class u on u.oid = f.rel
           where u.relpersistence <> 'p' or u.relkind = 'f')"
    )
}

/// Whether a table of `table`'s family inherits from a table that is not
/// partitioned: an inheritance child's changes come as its own, and one
/// made after the table went into the publication is not in it.
pub(super) async fn inherited(pool: &PgPool, table: &str) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar(
        "select exists (select from bloom_guard.family(pg_catalog.to_regclass($1)) f(rel)
                          join pg_catalog.pg_inherits i on i.inhrelid = f.rel
                          join pg_catalog.pg_class p on p.oid = i.inhparent
                         where p.relkind <> 'p')",
    )
    .bind(table)
    .fetch_one(pool)
    .await
}

/// The tables the log feeds, and each one's guards and key columns.
pub(crate) async fn logged_tables(pool: &PgPool) -> Result<Vec<LoggedTable>, sqlx::Error> {
    let rows: Vec<(String, String, String, Vec<String>)> = sqlx::query_as(
        "select n.nspname::text, c.relname::text, l.guard, l.key_columns
           from bloom_guard.logged l
           join pg_catalog.pg_class c on c.oid = l.rel
           join pg_catalog.pg_namespace n on n.oid = c.relnamespace
          order by 1, 2, 3",
    )
    .fetch_all(pool)
    .await?;
    let mut tables: Vec<LoggedTable> = Vec::new();
    for (schema, table, guard, columns) in rows {
        match tables.last_mut() {
            Some(last) if last.schema == schema && last.table == table => {
                last.guards.push((guard, columns));
            }
            _ => tables.push(LoggedTable {
                schema,
                table,
                guards: vec![(guard, columns)],
            }),
        }
    }
    Ok(tables)
}
