//! The fleet's settings and heartbeats in `bloom_guard_settings` and
//! `bloom_guard_instances`, for the instances sharing one file (one host,
//! one clock: times are SQLite's milliseconds since the epoch).

use crate::store::fleet::FleetStatements;

/// The fleet tables. Idempotent.
pub(crate) const TABLES: &str = "
create table if not exists bloom_guard_settings (
    guard text primary key,
    mode text check (mode in ('enforce', 'shadow', 'off')),
    audit_rate real check (audit_rate >= 0 and audit_rate <= 1),
    updated_at integer not null
);
create table if not exists bloom_guard_instances (
    guard text not null,
    id text not null,
    seen_at integer not null,
    report text not null,
    primary key (guard, id)
);
";

/// The fleet tables' statements; an instance is live for 30 s after its
/// heartbeat.
pub(crate) const STATEMENTS: FleetStatements = FleetStatements {
    settings: "select mode, audit_rate from bloom_guard_settings where guard = ?1",
    store: "insert into bloom_guard_settings as s (guard, mode, audit_rate, updated_at)
            values (?1, ?2, ?3, cast((julianday('now') - 2440587.5) * 86400000 as integer))
            on conflict (guard) do update
               set mode = coalesce(excluded.mode, s.mode),
                   audit_rate = coalesce(excluded.audit_rate, s.audit_rate),
                   updated_at = excluded.updated_at",
    reset: "delete from bloom_guard_settings where guard = ?1",
    beat: "insert into bloom_guard_instances as i (guard, id, report, seen_at)
           values (?1, ?2, ?3, cast((julianday('now') - 2440587.5) * 86400000 as integer))
           on conflict (guard, id) do update set report = excluded.report, seen_at = excluded.seen_at",
    expire: "delete from bloom_guard_instances
              where guard = ?1
                and seen_at < cast((julianday('now') - 2440587.5) * 86400000 as integer) - 30000",
    instances: "select report, cast((julianday('now') - 2440587.5) * 86400000 as integer) - seen_at
                  from bloom_guard_instances
                 where guard = ?1
                   and seen_at >= cast((julianday('now') - 2440587.5) * 86400000 as integer) - 30000
                 order by id",
    leave: "delete from bloom_guard_instances where guard = ?1 and id = ?2",
};
