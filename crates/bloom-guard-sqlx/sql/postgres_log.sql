-- The log feed's tables, over the change feed's schema (installed first):
-- which tables the write-ahead log feeds, for which guards, and how far
-- each slot's producer wrote. Idempotent.

-- A table fed by the log for `guard`: never also by the feed's triggers
-- (two copies of a change would apply its delete twice).
create table if not exists bloom_guard.logged (
    guard text not null,
    rel regclass not null,
    key_columns text[] not null,
    primary key (guard, rel)
);

-- The end of the last transaction a slot's producer wrote to the feed, in
-- the same transaction as its rows: a transaction the slot sends again ends
-- at or before it, and is skipped.
create table if not exists bloom_guard.log_progress (
    slot text primary key,
    applied pg_lsn not null
);

-- The log feed's rows: a guard's key added ('i'), removed ('d') or its
-- table truncated ('t'), at the end of the commit that made the change.
-- A reader's position is such an end: the rows after it are the changes
-- committed after it, each once, whatever the producer's own transactions.
create table if not exists bloom_guard.log_changes (
    lsn pg_lsn not null,
    guard text not null,
    kind "char" not null,
    key text not null,
    written_at timestamptz not null default pg_catalog.clock_timestamp()
);

-- Rows at or before `below` were pruned: a reader behind it rebuilds.
create table if not exists bloom_guard.log_horizon (
    singleton boolean primary key default true check (singleton),
    below pg_lsn not null default '0/0'
);

insert into bloom_guard.log_horizon default values on conflict do nothing;

create index if not exists log_changes_guard_lsn on bloom_guard.log_changes (guard, lsn);

revoke all on bloom_guard.log_horizon, bloom_guard.log_changes, bloom_guard.logged, bloom_guard.log_progress from public;

-- The slot the feed's state belongs to, once made ('made'), or while it is
-- made again ('making'): a slot missing (dropped, a failover, a restore into
-- another cluster) or lost (past max_slot_wal_keep_size) is made again, and
-- the feed's rows, progress and horizon start over at its start. Part of
-- each log-fed guard's fingerprint: a filter of an older slot rebuilds.
create table if not exists bloom_guard.log_slot (
    singleton boolean primary key default true check (singleton),
    slot text not null,
    state text not null check (state in ('making', 'made')),
    made pg_lsn
);

revoke all on bloom_guard.log_slot from public;
