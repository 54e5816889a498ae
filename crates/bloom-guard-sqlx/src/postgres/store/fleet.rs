//! The fleet's settings and heartbeats in `bloom_guard.settings` and
//! `bloom_guard.instances`.

use crate::store::fleet::FleetStatements;

/// The fleet tables' statements; an instance is live for 30 s after its
/// heartbeat, by the database's clock.
pub(crate) const STATEMENTS: FleetStatements = FleetStatements {
    settings: "select mode, audit_rate from bloom_guard.settings where guard = $1",
    // A change is announced to every follower's listener (at commit), so
    // none has to poll the settings to apply it within a second.
    store: "with stored as (
                insert into bloom_guard.settings as s (guard, mode, audit_rate) values ($1, $2, $3)
                on conflict (guard) do update
                   set mode = coalesce(excluded.mode, s.mode),
                       audit_rate = coalesce(excluded.audit_rate, s.audit_rate),
                       updated_at = pg_catalog.now()
                returning guard)
            select pg_catalog.pg_notify('bloom_guard', 'settings:' || guard) from stored",
    reset: "with gone as (delete from bloom_guard.settings where guard = $1)
            select pg_catalog.pg_notify('bloom_guard', 'settings:' || $1::text)",
    // One statement, one transaction: the heartbeat and the expiry of the
    // guard's instances gone for 30 s.
    beat: "with beat as (
               insert into bloom_guard.instances as i (guard, id, report) values ($1, $2, $3::jsonb)
               on conflict (guard, id) do update set report = excluded.report, seen_at = pg_catalog.now()),
           expired as (
               delete from bloom_guard.instances
                where guard = $1 and seen_at < pg_catalog.now() - interval '30 seconds')
           select",
    expire: "",
    instances: "select report::text, (extract(epoch from pg_catalog.now() - seen_at) * 1000)::int8
                  from bloom_guard.instances
                 where guard = $1 and seen_at >= pg_catalog.now() - interval '30 seconds'
                 order by id",
    leave: "delete from bloom_guard.instances where guard = $1 and id = $2",
};
