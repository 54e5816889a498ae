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
-- at or before it, and is skipped. A transaction too large to hold whole
-- is written in parts at `part_at` (just past its commit's start), and
-- `part_rows` says how many of its rows are: sent again, those are skipped.
create table if not exists bloom_guard.log_progress (
    slot text primary key,
    applied pg_lsn not null,
    part_at pg_lsn,
    part_rows bigint not null default 0
);

do $parts$
begin
    -- A feed from before the parts: the columns added once (no lock taken
    -- at later starts).
    if not exists (select from pg_catalog.pg_attribute
                    where attrelid = 'bloom_guard.log_progress'::regclass and attname = 'part_at') then
        alter table bloom_guard.log_progress
            add column part_at pg_lsn,
            add column part_rows bigint not null default 0;
    end if;
end
$parts$;

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
-- Pruning deletes by age: rows are appended in time order, so a block
-- range index finds the old ones without reading the rest (a few pages of
-- index for millions of rows, next to nothing per insert).
create index if not exists log_changes_written_at on bloom_guard.log_changes using brin (written_at);

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

-- An ALTER TABLE of a log-fed table or of a table in its family (a
-- partition attached with its rows, a key column's type or collation
-- changed) brings keys, or changes how keys compare, with no change in the
-- log for them. So does an inheritance child made under one (CREATE TABLE
-- ... INHERITS, ALTER TABLE ... INHERIT): the parent's rows include the
-- child's, which the publication does not carry. A message in the
-- command's own transaction tells the producer, which records a resync
-- ('r') of each guard of the table at that commit: its followers hold the
-- guard open from there, and rebuild once their check finds no gap (a
-- child is one: it stays open while the child is there). A new partition
-- is none of these: it comes through the partitioned table. An event
-- trigger needs a superuser: installed by another role, the check's
-- interval is the bound (the family is in each guard's fingerprint).
create or replace function bloom_guard.on_alter_logged_table()
returns event_trigger
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    g text;
begin
    for g in select distinct l.guard
               from bloom_guard.logged l
              cross join lateral bloom_guard.family(l.rel) f(rel)
               join pg_catalog.pg_event_trigger_ddl_commands() c
                 on (c.command_tag = 'ALTER TABLE' and c.objid = f.rel::oid)
                 or (c.command_tag in ('CREATE TABLE', 'ALTER TABLE')
                     and exists (select from pg_catalog.pg_inherits i
                                   join pg_catalog.pg_class k on k.oid = i.inhrelid
                                  where i.inhrelid = c.objid and i.inhparent = f.rel::oid
                                    and not k.relispartition)) loop
        perform pg_catalog.pg_logical_emit_message(true, 'bloom_guard.resync', g);
    end loop;
exception when others then
    -- Never fail the user's command for our sake: the check rebuilds at its
    -- next run.
    raise warning 'bloom_guard: cannot record a resync in the log feed: %', sqlerrm;
end
$$;

do $event$
begin
    -- Made once: each start runs this script, and the function above is
    -- replaced in place. One made by schema 3 or before fires for ALTER
    -- TABLE only: made again.
    if exists (select from pg_catalog.pg_roles where rolname = current_user and rolsuper) then
        if exists (select from pg_catalog.pg_event_trigger
                    where evtname = 'bloom_guard_alter_logged_table'
                      and not 'CREATE TABLE' = any (evttags)) then
            drop event trigger bloom_guard_alter_logged_table;
        end if;
        if not exists (select from pg_catalog.pg_event_trigger
                        where evtname = 'bloom_guard_alter_logged_table') then
            create event trigger bloom_guard_alter_logged_table on ddl_command_end
                when tag in ('ALTER TABLE', 'CREATE TABLE')
                execute function bloom_guard.on_alter_logged_table();
            alter event trigger bloom_guard_alter_logged_table enable always;
        end if;
    end if;
end
$event$;

-- The producer's commit-to-feed lag as of its last write: the oldest
-- commit of that write's batch to the write. Added once (no lock taken at
-- later starts: followers and the producer use the table meanwhile).
do $lag$
begin
    if not exists (select from pg_catalog.pg_attribute
                    where attrelid = 'bloom_guard.log_progress'::regclass and attname = 'lag') then
        alter table bloom_guard.log_progress
            add column lag interval,
            add column written_at timestamptz;
    end if;
end
$lag$;

-- A producer's write of committed transactions, in one round trip: `p_ends`
-- holds each row's transaction end, `p_end` the batch's last. Under the
-- progress row's lock the rows at or before the progress another producer
-- wrote are left out, and the progress only moves on: two producers (one
-- stalled while the other took the slot) never write a change twice. The
-- write is durable before the server hears of it (synchronous_commit on
-- for this transaction). Returns the rows written, or -1 (nothing written)
-- if the slot was made again since the stream began (`p_epoch` is not
-- the feed's epoch).
create or replace function bloom_guard.log_write(
    p_slot text, p_epoch text, p_end pg_catalog.pg_lsn,
    p_guards text[], p_kinds text[], p_keys text[], p_ends pg_catalog.int8[],
    p_oldest_commit timestamptz)
returns bigint
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    applied_before pg_lsn;
    written bigint;
begin
    perform set_config('synchronous_commit', 'on', true);
    insert into bloom_guard.log_progress (slot, applied) values (p_slot, '0/0')
        on conflict (slot) do nothing;
    select p.applied into applied_before
      from bloom_guard.log_progress p where p.slot = p_slot for update;
    if coalesce((select s.slot || '@' || s.state || '@' || coalesce(s.made::text, '')
                   from bloom_guard.log_slot s), '') is distinct from p_epoch then
        return -1;
    end if;
    insert into bloom_guard.log_changes (lsn, guard, kind, key)
    select '0/0'::pg_lsn + r.e::numeric, r.g, r.k::"char", r.key
      from unnest(p_guards, p_kinds, p_keys, p_ends) as r(g, k, key, e)
     where '0/0'::pg_lsn + r.e::numeric > applied_before;
    get diagnostics written = row_count;
    update bloom_guard.log_progress
       set applied = greatest(applied, p_end),
           lag = clock_timestamp() - p_oldest_commit,
           written_at = clock_timestamp()
     where slot = p_slot;
    -- Followers read at once; the producer is no writer of the user's, so
    -- its commit may take the notification lock.
    perform pg_notify('bloom_guard', '*');
    return written;
end
$$;

-- It runs with its caller's rights (those on the feed's tables that
-- `grant_runtime` gives): EXECUTE is everyone's, also where the database's
-- default privileges take it from PUBLIC.
grant execute on function bloom_guard.log_write(text, text, pg_catalog.pg_lsn, text[], text[], text[],
                                                pg_catalog.int8[], timestamptz) to public;

-- A read of the feeds `p_guards`, each after its position in `p_afters`,
-- up to the furthest the producer wrote that this function's snapshot
-- sees: its progress row, or `p_confirmed` (the slot's confirmed position,
-- seen by the caller before the call). VOLATILE, so its statement takes a
-- snapshot of its own, after the caller looked at the slot: the caller's
-- look and this read are one round trip. Nothing when `p_confirmed` is
-- null (the caller's barrier is not reached). One row per feed row, and
-- one with no row for each feed (`r_n`, from 1), in feed and log order;
-- each carries the feed's new position, the horizon, the epoch and the
-- producer's lag as that snapshot saw them.
create or replace function bloom_guard.log_read(
    p_slot text, p_confirmed pg_catalog.pg_lsn, p_guards text[], p_afters pg_catalog.pg_lsn[])
returns table (r_n bigint, r_upto pg_catalog.pg_lsn, r_below pg_catalog.pg_lsn, r_epoch text,
               r_lag pg_catalog.float8, r_guard text, r_kind "char", r_key text)
language plpgsql
volatile
set search_path = pg_catalog, pg_temp
as $$
begin
    if p_confirmed is null then
        return;
    end if;
    return query
    with u as (
        select greatest((select p.applied from bloom_guard.log_progress p where p.slot = p_slot),
                        p_confirmed) as lsn,
               (select h.below from bloom_guard.log_horizon h) as below,
               (select date_part('epoch', p.lag) from bloom_guard.log_progress p
                 where p.slot = p_slot) as lag,
               coalesce((select s.slot || '@' || s.state || '@' || coalesce(s.made::text, '')
                           from bloom_guard.log_slot s), '') as epoch)
    select f.n, greatest(u.lsn, f.after), u.below, u.epoch, u.lag, c.guard, c.kind, c.key
      from u
     cross join unnest(p_guards, p_afters) with ordinality as f(guard, after, n)
      left join lateral (
            select c.guard, c.kind, c.key, c.lsn from bloom_guard.log_changes c
             where c.guard = f.guard and c.lsn > f.after and c.lsn <= u.lsn) c on true
     order by f.n, c.lsn;
end
$$;

grant execute on function bloom_guard.log_read(text, pg_catalog.pg_lsn, text[], pg_catalog.pg_lsn[])
    to public;

-- The schema's version: `install_log` runs nothing more once it is this
-- and the table is on the feed (a runtime role's start needs no DDL right).
comment on table bloom_guard.log_progress is 'bloom_guard log feed, schema 6';
