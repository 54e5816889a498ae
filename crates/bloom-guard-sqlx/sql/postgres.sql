-- bloom-guard's change feed, filter snapshots and fleet tables for Postgres,
-- schema version 9.
--
-- Idempotent: installing twice is a no-op, and every statement can run over
-- an earlier install of this version. `bloom_guard_sqlx::install` runs it in
-- one transaction under an advisory lock, so instances starting together
-- install it once.
--
-- Every reference is schema-qualified and every function pins its
-- search_path: a writer's search_path (empty during a pg_dump restore)
-- never changes what runs.

-- The event trigger (below) ignores this script's own DDL.
set bloom_guard.installing = on;

create schema if not exists bloom_guard;

comment on schema bloom_guard is
    'bloom-guard: the change feed that keeps every instance''s Bloom filter complete';

-- One row per new key ('i'), key gone ('d') or table truncated ('t'), written
-- in the writer's transaction, and nothing else: no lock, no NOTIFY, no wait
-- for our sake in a writer's commit. Readers select the rows of the
-- transactions that committed between two snapshots of theirs, by `xid`.
--
-- Partitioned by `part`, a slot that rotates: new rows go to the current
-- slot, and a slot retired for longer than the retention is emptied by
-- TRUNCATE, never by row deletes, so the feed leaves no dead tuples.
--
-- Version 2 had one plain table: it becomes slot 0, rows and all, so no
-- change is lost across the upgrade (writers wait for it, none fails).
--
-- An upgrade from any earlier version first locks the watched tables, then
-- the feed, in the order a writer takes them (its table, then the feed from
-- its trigger): writers wait for the upgrade instead of deadlocking with it.
do $lock$
declare
    rel regclass;
begin
    -- Nested: the inner test is planned only once the table is known.
    if pg_catalog.to_regclass('bloom_guard.schema_version') is not null then
        if exists (select from bloom_guard.schema_version where version < 4) then
            for rel in
                select bloom_guard.family(w.rel) from bloom_guard.watched w
                where exists (select from pg_catalog.pg_class c where c.oid = w.rel)
                order by 1
            loop
                begin
                    execute pg_catalog.format('lock table %s in access exclusive mode', rel);
                exception when insufficient_privilege then
                    -- Its triggers stay as they are (see below).
                    null;
                end;
            end loop;
            lock table bloom_guard.changes in access exclusive mode;
        end if;
    end if;
end
$lock$;

do $upgrade$
begin
    if exists (
        select from pg_catalog.pg_class c join pg_catalog.pg_namespace n on n.oid = c.relnamespace
        where n.nspname = 'bloom_guard' and c.relname = 'changes' and c.relkind = 'r'
    ) then
        alter table bloom_guard.changes rename to changes_0;
        alter index if exists bloom_guard.changes_xid rename to changes_0_xid;
        alter table bloom_guard.changes_0 add column part smallint not null default 0;
    end if;
end
$upgrade$;

-- The slot new rows go to, and when each slot was retired: the snapshot
-- then, and when.
create table if not exists bloom_guard.slots (
    slot smallint primary key,
    current boolean not null default false,
    since timestamptz not null default pg_catalog.now(),
    retired pg_snapshot
);

insert into bloom_guard.slots (slot, current) values (0, true), (1, false), (2, false)
on conflict do nothing;

-- The slot new feed rows go to.
create or replace function bloom_guard.current_slot()
returns smallint
language sql stable
set search_path = pg_catalog, pg_temp
as $$ select coalesce((select slot from bloom_guard.slots where current limit 1), 0::smallint) $$;

create table if not exists bloom_guard.changes (
    xid xid8 not null default pg_catalog.pg_current_xact_id(),
    guard text not null,
    kind "char" not null,
    key text not null,
    -- The default serves writers still running version 2's trigger
    -- functions during the upgrade; version 3's pass the slot.
    part smallint not null default bloom_guard.current_slot()
) partition by list (part);

create index if not exists changes_xid on bloom_guard.changes (xid);

-- A reader's rows, and only its guard's, by (guard, xid): index
-- `changes_guard_xid` (version 8). `bloom_guard_sqlx::install` builds it
-- after this script, partition by partition with CREATE INDEX
-- CONCURRENTLY, so writers never wait for the build on a feed that holds
-- a bulk load's rows, then attaches the partitions' indexes to it.

do $slots$
declare
    slot integer;
begin
    for slot in 0..2 loop
        if pg_catalog.to_regclass('bloom_guard.changes_' || slot) is null then
            execute pg_catalog.format(
                'create table bloom_guard.%I partition of bloom_guard.changes for values in (%s)',
                'changes_' || slot, slot);
        elsif not exists (
            select from pg_catalog.pg_inherits
            where inhrelid = pg_catalog.to_regclass('bloom_guard.changes_' || slot)
        ) then
            execute pg_catalog.format(
                'alter table bloom_guard.changes attach partition bloom_guard.%I for values in (%s)',
                'changes_' || slot, slot);
        end if;
    end loop;
end
$slots$;

-- Rows below `below` are pruned: a reader whose snapshot's xmin is lower may
-- have missed some and must rebuild.
create table if not exists bloom_guard.horizon (
    singleton boolean primary key default true check (singleton),
    below xid8 not null default '0'
);

insert into bloom_guard.horizon default values on conflict do nothing;

-- Version 2 pruned by row deletes at marks; slots replace both.
drop table if exists bloom_guard.marks;

-- The tables each guard watches, and their key columns.
create table if not exists bloom_guard.watched (
    guard text not null,
    rel regclass not null,
    key_columns text[] not null,
    primary key (guard, rel)
);

create table if not exists bloom_guard.schema_version (
    singleton boolean primary key default true check (singleton),
    version integer not null
);

-- The canonical text of a key from the text expressions of its parts,
-- `parts`, and the expressions `nulls` whose NULL makes a part NULL: one
-- part's text, or for several each part's text prefixed by its length in
-- bytes and a colon (`3:abc2:42`), which no two different keys share. NULL
-- if any part is.
create or replace function bloom_guard.key_of(parts text[], nulls text[])
returns text
language sql immutable strict
set search_path = pg_catalog, pg_temp
as $$
    select case
        when pg_catalog.cardinality(parts) = 1 then parts[1]
        else
            pg_catalog.format('case when %s then null else pg_catalog.concat(%s) end',
                pg_catalog.string_agg(pg_catalog.format('%s is null', nulls[n::pg_catalog.int4]), ' or ' order by n),
                pg_catalog.string_agg(
                    pg_catalog.format('pg_catalog.octet_length(pg_catalog.convert_to(%1$s, ''UTF8'')), '':'', %1$s', p),
                    ', ' order by n))
    end
    from pg_catalog.unnest(parts) with ordinality as u(p, n)
$$;

-- The canonical key of the key columns of row `alias`, from their text form.
create or replace function bloom_guard.key_expression(key_columns text[], alias text)
returns text
language sql immutable strict
set search_path = pg_catalog, pg_temp
as $$
    select bloom_guard.key_of(
        pg_catalog.array_agg(pg_catalog.format('(%I.%I)::pg_catalog.text', alias, c) order by n),
        pg_catalog.array_agg(pg_catalog.format('%I.%I', alias, c) order by n))
    from pg_catalog.unnest(key_columns) with ordinality as u(c, n)
$$;

-- The same canonical key, read by column name from `j`, an expression of a
-- row as jsonb (whose text of text, integer, uuid, enum and citext values
-- is their text form): a column renamed or dropped is missing from the
-- row, not an error. For the replica role's row trigger.
create or replace function bloom_guard.key_from_json(key_columns text[], j text)
returns text
language sql immutable strict
set search_path = pg_catalog, pg_temp
as $$
    select bloom_guard.key_of(parts, parts)
    from (select pg_catalog.array_agg(pg_catalog.format('(%s operator(pg_catalog.->>) %L)', j, c) order by n)
          from pg_catalog.unnest(key_columns) with ordinality as u(c, n)) as k(parts)
$$;

-- Whether the row `j` (jsonb) has every key column.
create or replace function bloom_guard.key_present(key_columns text[], j text)
returns text
language sql immutable strict
set search_path = pg_catalog, pg_temp
as $$
    select pg_catalog.string_agg(pg_catalog.format('%s operator(pg_catalog.?) %L', j, c), ' and ' order by n)
    from pg_catalog.unnest(key_columns) with ordinality as u(c, n)
$$;

-- A test, for a statement trigger's function, that one of `key_columns` is
-- no longer a column of the trigger's table under its name.
create or replace function bloom_guard.key_columns_gone(key_columns text[])
returns text
language sql immutable strict
set search_path = pg_catalog, pg_temp
as $$
    select pg_catalog.format(
        '(select pg_catalog.count(*) from pg_catalog.pg_attribute a
           where a.attrelid operator(pg_catalog.=) tg_relid and a.attnum operator(pg_catalog.>) 0
             and not a.attisdropped and a.attname operator(pg_catalog.=) any (%L::pg_catalog.name[]))
         operator(pg_catalog.<) %s',
        key_columns, pg_catalog.cardinality(key_columns))
$$;

-- Version 2's trigger functions, read the key columns from the trigger's
-- arguments with dynamic SQL; version 3 writes a function per guard. They
-- stay, without their NOTIFY, for any trigger the upgrade could not replace.
-- The keys of an INSERT's new rows ('i') or a DELETE's old rows ('d').
-- Trigger arguments: the guard's name, then the key columns.
create or replace function bloom_guard.record_rows() returns trigger
language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    inserted boolean := tg_op = 'INSERT';
    rows text := case when inserted then 'new_rows' else 'old_rows' end;
begin
    execute pg_catalog.format(
        'insert into bloom_guard.changes (guard, kind, key, part)
         select $1, $2, k, $3 from (select %s as k from %I r) s where k is not null',
        bloom_guard.key_expression(tg_argv[1:], 'r'), rows)
    using tg_argv[0], case when inserted then 'i' else 'd' end, bloom_guard.current_slot();
    return null;
end
$$;

create or replace function bloom_guard.record_updated() returns trigger
language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    key_columns text[] := tg_argv[1:];
    new_key text := bloom_guard.key_expression(key_columns, 'n');
    old_key text := bloom_guard.key_expression(key_columns, 'o');
begin
    execute pg_catalog.format(
        'with n as (select %s as k from new_rows n), o as (select %s as k from old_rows o)
         insert into bloom_guard.changes (guard, kind, key, part)
         select $1, ''i'', k, $2 from (select k from n where k is not null except all select k from o) added
         union all
         select $1, ''d'', k, $2 from (select k from o where k is not null except all select k from n) removed',
        new_key, old_key)
    using tg_argv[0], bloom_guard.current_slot();
    return null;
end
$$;

create or replace function bloom_guard.record_truncated() returns trigger
language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
begin
    insert into bloom_guard.changes (guard, kind, key, part)
    values (tg_argv[0], 't', '', bloom_guard.current_slot());
    return null;
end
$$;

-- The table and every inheritance child or partition below it: a key query
-- on the table reads them all, and a write straight into one of them fires
-- only its own statement triggers.
create or replace function bloom_guard.family(root regclass)
returns setof regclass
language sql stable
rows 4
set search_path = pg_catalog, pg_temp
as $$
    with recursive tree(rel) as (
        select root
        union
        select i.inhrelid::regclass from pg_catalog.pg_inherits i join tree on i.inhparent = tree.rel
    )
    select rel from tree
$$;

-- The feed's triggers of `guard`: (name suffix, event, transition tables).
create or replace function bloom_guard.trigger_name(guard text, event text)
returns name
language sql immutable strict
set search_path = pg_catalog, pg_temp
as $$
    -- Whole while it fits in a name (63 bytes); a longer guard's name is
    -- hashed, so no two events of a guard ever share a trigger.
    select case when pg_catalog.octet_length('bloom_guard_' || guard || '_' || event) <= 63
                then 'bloom_guard_' || guard || '_' || event
                else 'bloom_guard_' || pg_catalog.left(pg_catalog.md5(guard), 16) || '_' || event end::name
$$;

-- The name of the function that records `event` ('inserted', 'updated',
-- 'deleted') for `guard` over `key_columns`: one set per guard and key, so
-- two tables watched under one guard with different key columns each get
-- their own.
create or replace function bloom_guard.record_function(guard text, key_columns text[], event text)
returns name
language sql immutable strict
set search_path = pg_catalog, pg_temp
as $$
    -- Whole while it fits in a name; a longer one is hashed, so no two
    -- events or guards ever share a function.
    select case
        when pg_catalog.octet_length('bloom_guard_' || guard || '_' || pg_catalog.left(pg_catalog.md5(key_columns::text), 8) || '_' || event) <= 63
            then 'bloom_guard_' || guard || '_' || pg_catalog.left(pg_catalog.md5(key_columns::text), 8) || '_' || event
        else 'bloom_guard_' || pg_catalog.left(pg_catalog.md5(guard || ':' || key_columns::text), 16) || '_' || event
    end::name
$$;

-- The functions of `guard`'s triggers, with its key expression written in:
-- static SQL, planned once per session, so a writer's statement pays one
-- cached insert into the feed and nothing else. SECURITY DEFINER: writers
-- need no grant on the feed. They name every relation, function and type
-- with its schema and use no operator (IS NOT NULL, EXCEPT and UNION ALL
-- resolve nothing by name; the transition tables are found before any
-- schema), so a writer's search_path cannot change what runs, and they go
-- without a SET search_path, which would cost every writing statement a
-- configuration change (about 4% of a one-row insert, measured).
create or replace function bloom_guard.create_record_functions(guard text, key_columns text[])
returns void
language plpgsql
set search_path = pg_catalog, pg_temp
set jit = off
as $$
declare
    -- The current slot, once per statement.
    slot constant text := '(select s.slot from bloom_guard.slots s where s.current)';
    header constant text := 'create or replace function bloom_guard.%I() returns trigger
        language plpgsql security definer as %L';
    -- Whether a statement's key columns are gone, tested by every
    -- statement (one index probe of pg_attribute): however a column went
    -- (a rename, a drop, a cascade from a type), the write does not fail.
    gone constant text := bloom_guard.key_columns_gone(key_columns);
begin
    -- In a session of the replica role the row trigger records each row
    -- (it fires there, ENABLE REPLICA): the statement triggers, which fire
    -- too (ENABLE ALWAYS), record nothing, so no row is counted twice (a
    -- delete counted twice would remove another key's fingerprint).
    --
    -- Static SQL names the key columns, planned once per session, and runs
    -- only while they are there under their names (`gone`): a key column
    -- renamed or dropped never makes a writer's statement fail. The
    -- statement then records 'r' instead, and readers fail open and
    -- rebuild (the trigger check names the column). Within a statement the
    -- table's lock keeps the columns as the test saw them.
    execute pg_catalog.format(header, bloom_guard.record_function(guard, key_columns, 'inserted'), pg_catalog.format(
        'begin
             -- bloom_guard: rows counted (7)
             if pg_catalog.current_setting(''session_replication_role'') operator(pg_catalog.=) ''replica'' then
                 return null;
             end if;
             if %3$s then
                 insert into bloom_guard.changes (guard, kind, key, part) values (%1$L, ''r'', '''', %2$s);
                 return null;
             end if;
             insert into bloom_guard.changes (guard, kind, key, part)
             select %1$L, ''i'', k, %2$s from (select %4$s as k from new_rows r) x where k is not null;
             return null;
         end', guard, slot, gone, bloom_guard.key_expression(key_columns, 'r')));
    execute pg_catalog.format(header, bloom_guard.record_function(guard, key_columns, 'deleted'), pg_catalog.format(
        'begin
             -- bloom_guard: rows counted (7)
             if pg_catalog.current_setting(''session_replication_role'') operator(pg_catalog.=) ''replica'' then
                 return null;
             end if;
             if %3$s then
                 return null;
             end if;
             insert into bloom_guard.changes (guard, kind, key, part)
             select %1$L, ''d'', k, %2$s from (select %4$s as k from old_rows r) x where k is not null;
             return null;
         end', guard, slot, gone, bloom_guard.key_expression(key_columns, 'r')));
    -- Keys of the new rows that no old row had, whatever the rows' ids (an
    -- update may change both), and keys that went away, counted row by row
    -- (EXCEPT ALL): two rows of one key changed to another remove it twice
    -- and add the other twice, as deleting and inserting them would, so a
    -- filter that counts a key's rows removes it only with its last row.
    execute pg_catalog.format(header, bloom_guard.record_function(guard, key_columns, 'updated'), pg_catalog.format(
        'begin
             -- bloom_guard: rows counted (7)
             if pg_catalog.current_setting(''session_replication_role'') operator(pg_catalog.=) ''replica'' then
                 return null;
             end if;
             if %5$s then
                 insert into bloom_guard.changes (guard, kind, key, part) values (%1$L, ''r'', '''', %2$s);
                 return null;
             end if;
             with n as (select %3$s as k from new_rows n), o as (select %4$s as k from old_rows o)
             insert into bloom_guard.changes (guard, kind, key, part)
             select %1$L, ''i'', k, %2$s from (select k from n where k is not null except all select k from o) added
             union all
             select %1$L, ''d'', k, %2$s from (select k from o where k is not null except all select k from n) removed;
             return null;
         end', guard, slot, bloom_guard.key_expression(key_columns, 'n'), bloom_guard.key_expression(key_columns, 'o'),
               gone));
    -- Row by row, for the replica role only: logical replication's apply
    -- worker fires row triggers and never statement triggers. It reads the
    -- keys from each row as jsonb, by name (a missing column is then a
    -- missing field, not an error). No operator but pg_catalog's, named as
    -- such.
    execute pg_catalog.format(header, bloom_guard.record_function(guard, key_columns, 'row'), pg_catalog.format(
        'declare
             n jsonb;
             o jsonb;
         begin
             -- bloom_guard: rows counted (7)
             if tg_op operator(pg_catalog.<>) ''DELETE'' then
                 n := pg_catalog.to_jsonb(new);
             end if;
             if tg_op operator(pg_catalog.<>) ''INSERT'' then
                 o := pg_catalog.to_jsonb(old);
             end if;
             insert into bloom_guard.changes (guard, kind, key, part)
             select %1$L, ''i'', k, %2$s from (select %3$s as k except select %4$s) added where k is not null
             union all
             select %1$L, ''d'', k, %2$s from (select %4$s as k except select %3$s) removed where k is not null
             union all
             select %1$L, ''r'', '''', %2$s where n is not null and not (%5$s);
             return null;
         end', guard, slot, bloom_guard.key_from_json(key_columns, 'n'), bloom_guard.key_from_json(key_columns, 'o'),
               bloom_guard.key_present(key_columns, 'n')));
    execute pg_catalog.format('revoke all on function bloom_guard.%I() from public', bloom_guard.record_function(guard, key_columns, 'row'));
    execute pg_catalog.format('revoke all on function bloom_guard.%I() from public', bloom_guard.record_function(guard, key_columns, 'inserted'));
    execute pg_catalog.format('revoke all on function bloom_guard.%I() from public', bloom_guard.record_function(guard, key_columns, 'deleted'));
    execute pg_catalog.format('revoke all on function bloom_guard.%I() from public', bloom_guard.record_function(guard, key_columns, 'updated'));
end
$$;

-- Puts `guard`'s triggers on `target` and its children and partitions,
-- replacing any there: statement triggers ENABLE ALWAYS, so they fire in
-- `session_replication_role = replica` sessions too, and a row trigger
-- ENABLE REPLICA, which only logical replication's apply worker (and
-- replica sessions) fire: the apply worker fires no statement trigger.
-- Whether `rel` has every feed trigger of `guard` over `key_columns`, each
-- enabled as it must be and calling this key's function: then
-- `create_triggers` leaves it alone (version 9), so a new partition or
-- child gets its triggers without locking the rest of the tree.
create or replace function bloom_guard.triggers_complete(rel regclass, key_columns text[], guard text)
returns boolean
language sql stable
set search_path = pg_catalog, pg_temp
set jit = off
as $$
    select pg_catalog.count(t.oid) = pg_catalog.count(*)
    from (values
        ('inserted', 'A', bloom_guard.record_function(guard, key_columns, 'inserted')::text),
        ('updated', 'A', bloom_guard.record_function(guard, key_columns, 'updated')::text),
        ('deleted', 'A', bloom_guard.record_function(guard, key_columns, 'deleted')::text),
        ('truncated', 'A', 'record_truncated'),
        ('replica', 'R', bloom_guard.record_function(guard, key_columns, 'row')::text)) e(event, mode, function)
    left join pg_catalog.pg_trigger t
      on t.tgrelid = rel
     and t.tgname = bloom_guard.trigger_name(guard, e.event)
     and t.tgenabled = e.mode
     and t.tgfoid = (select p.oid from pg_catalog.pg_proc p
                      where p.proname = e.function and p.pronamespace = 'bloom_guard'::regnamespace
                      limit 1)
    -- A partitioned table holds no rows: no row trigger of its own.
    where not (e.event = 'replica'
               and exists (select from pg_catalog.pg_class c where c.oid = rel and c.relkind = 'p'))
$$;

create or replace function bloom_guard.create_triggers(target regclass, key_columns text[], guard text)
returns void
language plpgsql
set search_path = pg_catalog, pg_temp
set jit = off
as $$
declare
    rel regclass;
    event text;
    installing constant text := pg_catalog.current_setting('bloom_guard.installing', true);
begin
    -- Its own ALTERs pass through states with a trigger missing: the event
    -- trigger ignores them (watch records one resync for the whole).
    perform pg_catalog.set_config('bloom_guard.installing', 'on', true);
    perform bloom_guard.create_record_functions(guard, key_columns);
    for rel in select bloom_guard.family(target) loop
        -- Tables already complete are not locked again: watching the tree
        -- after a partition was added touches only the new partition.
        continue when bloom_guard.triggers_complete(rel, key_columns, guard);
        foreach event in array array['inserted', 'updated', 'deleted', 'truncated', 'replica'] loop
            execute pg_catalog.format('drop trigger if exists %I on %s', bloom_guard.trigger_name(guard, event), rel);
        end loop;
        -- On tables that hold rows only: Postgres would clone a partitioned
        -- table's row trigger onto its partitions, where this loop puts
        -- their own.
        if exists (select from pg_catalog.pg_class c where c.oid = rel and c.relkind <> 'p') then
            execute pg_catalog.format(
                'create trigger %I after insert or update or delete on %s
                 for each row execute function bloom_guard.%I()',
                bloom_guard.trigger_name(guard, 'replica'), rel, bloom_guard.record_function(guard, key_columns, 'row'));
            execute pg_catalog.format('alter table %s enable replica trigger %I', rel, bloom_guard.trigger_name(guard, 'replica'));
        end if;
        execute pg_catalog.format(
            'create trigger %I after insert on %s referencing new table as new_rows
             for each statement execute function bloom_guard.%I()',
            bloom_guard.trigger_name(guard, 'inserted'), rel, bloom_guard.record_function(guard, key_columns, 'inserted'));
        execute pg_catalog.format(
            'create trigger %I after update on %s referencing old table as old_rows new table as new_rows
             for each statement execute function bloom_guard.%I()',
            bloom_guard.trigger_name(guard, 'updated'), rel, bloom_guard.record_function(guard, key_columns, 'updated'));
        execute pg_catalog.format(
            'create trigger %I after delete on %s referencing old table as old_rows
             for each statement execute function bloom_guard.%I()',
            bloom_guard.trigger_name(guard, 'deleted'), rel, bloom_guard.record_function(guard, key_columns, 'deleted'));
        execute pg_catalog.format(
            'create trigger %I after truncate on %s
             for each statement execute function bloom_guard.record_truncated(%s)',
            bloom_guard.trigger_name(guard, 'truncated'), rel, pg_catalog.quote_literal(guard));
        execute pg_catalog.format(
            'alter table %s enable always trigger %I, enable always trigger %I, enable always trigger %I, enable always trigger %I',
            rel,
            bloom_guard.trigger_name(guard, 'inserted'), bloom_guard.trigger_name(guard, 'updated'),
            bloom_guard.trigger_name(guard, 'deleted'), bloom_guard.trigger_name(guard, 'truncated'));
    end loop;
    perform pg_catalog.set_config('bloom_guard.installing', coalesce(installing, ''), true);
end
$$;

-- Records every key written to `target` (and its children and partitions)
-- for `guard`, by any SQL. Run it again after adding a partition or child
-- table. The caller must own the tables.
create or replace function bloom_guard.watch(target regclass, key_columns text[], guard text)
returns void
language plpgsql
set search_path = pg_catalog, pg_temp
set jit = off
as $$
declare
    col text;
begin
    if guard is null or guard = '' or coalesce(pg_catalog.cardinality(key_columns), 0) = 0 then
        raise exception 'bloom_guard.watch needs a guard name and at least one key column';
    end if;
    foreach col in array key_columns loop
        if not exists (
            select from pg_catalog.pg_attribute
            where attrelid = target and attname = col and attnum > 0 and not attisdropped
        ) then
            raise exception 'table % has no column %', target, col;
        end if;
    end loop;
    -- Watched already, with the same key and every trigger in place: only
    -- the functions are written again (this version's, if an earlier one's
    -- were kept), which changes no trigger and needs no rebuild.
    if exists (
        select from bloom_guard.watched w
        where w.guard = watch.guard and w.rel = target and w.key_columns = watch.key_columns
    ) and not exists (select from bloom_guard.gaps(guard)) then
        if not bloom_guard.counts_rows(guard) then
            perform bloom_guard.create_record_functions(guard, key_columns);
        end if;
        return;
    end if;
    -- Tables of this guard dropped since (a restore, a swap): forgotten.
    delete from bloom_guard.watched w
    where w.guard = watch.guard and not exists (select from pg_catalog.pg_class c where c.oid = w.rel);
    insert into bloom_guard.watched (guard, rel, key_columns) values (guard, target, key_columns)
    on conflict on constraint watched_pkey do update set key_columns = excluded.key_columns;
    perform bloom_guard.create_triggers(target, key_columns, guard);
    -- Keys written before the triggers existed are not in the feed: readers
    -- rebuild on this.
    insert into bloom_guard.changes (guard, kind, key, part)
    values (guard, 'r', '', bloom_guard.current_slot());
    perform pg_catalog.pg_notify('bloom_guard', guard);
end
$$;

-- Stops recording `guard`'s keys from `target` and its children and
-- partitions: drops the feed's triggers. A follower of the guard that still
-- runs reports a gap and lets every request through. The caller must own
-- the tables.
create or replace function bloom_guard.unwatch(target regclass, guard text)
returns void
language plpgsql
set search_path = pg_catalog, pg_temp
set jit = off
as $$
declare
    rel regclass;
    event text;
    unwatched text[];
begin
    for rel in select bloom_guard.family(target) loop
        foreach event in array array['inserted', 'updated', 'deleted', 'truncated', 'replica'] loop
            execute pg_catalog.format('drop trigger if exists %I on %s', bloom_guard.trigger_name(guard, event), rel);
        end loop;
    end loop;
    delete from bloom_guard.watched w where w.guard = unwatch.guard and w.rel = target
    returning w.key_columns into unwatched;
    if unwatched is not null and not exists (
        select from bloom_guard.watched w where w.guard = unwatch.guard and w.key_columns = unwatched
    ) then
        foreach event in array array['inserted', 'updated', 'deleted', 'row'] loop
            execute pg_catalog.format('drop function if exists bloom_guard.%I()',
                bloom_guard.record_function(guard, unwatched, event));
        end loop;
    end if;
end
$$;

-- Whether every trigger function of `guard` records one feed row per
-- table row (schema version 7): a counting filter removes keys only then.
-- A function an earlier version wrote (kept by an install whose role did
-- not own it) may record a row twice or two rows once.
create or replace function bloom_guard.counts_rows(guard text)
returns boolean
language sql stable
set search_path = pg_catalog, pg_temp
set jit = off
as $$
    select coalesce(bool_and(coalesce(p.prosrc, '') like '%bloom_guard: rows counted (7)%'), false)
    from bloom_guard.watched w
    cross join lateral pg_catalog.unnest(array['inserted', 'updated', 'deleted', 'row']) e(event)
    left join pg_catalog.pg_proc p
      on p.proname = bloom_guard.record_function(w.guard, w.key_columns, e.event)
     and p.pronamespace = 'bloom_guard'::regnamespace
    where w.guard = counts_rows.guard
$$;

-- Every table of `guard` whose feed triggers are missing, or not enabled
-- as they must be (statement triggers ALWAYS, the row trigger REPLICA),
-- with what is wrong. Empty when the feed is complete.
create or replace function bloom_guard.gaps(guard text)
returns table (rel regclass, problem text)
language sql stable
set search_path = pg_catalog, pg_temp
set jit = off
as $$
    select f.rel, case when t.oid is null then 'trigger ' || e.name || ' is missing'
                       else 'trigger ' || e.name || ' is not ENABLE ' || e.mode_name end
    from bloom_guard.watched w
    cross join lateral bloom_guard.family(w.rel) f(rel)
    cross join lateral (values
        (bloom_guard.trigger_name(w.guard, 'inserted'), 'A', 'ALWAYS'),
        (bloom_guard.trigger_name(w.guard, 'updated'), 'A', 'ALWAYS'),
        (bloom_guard.trigger_name(w.guard, 'deleted'), 'A', 'ALWAYS'),
        (bloom_guard.trigger_name(w.guard, 'replica'), 'R', 'REPLICA')) e(name, mode, mode_name)
    left join pg_catalog.pg_trigger t on t.tgrelid = f.rel and t.tgname = e.name
    where w.guard = gaps.guard and (t.oid is null or t.tgenabled <> e.mode)
      and exists (select from pg_catalog.pg_class c where c.oid = w.rel)
      -- A partitioned table holds no rows: its partitions have the row trigger.
      and not (e.mode = 'R' and exists (select from pg_catalog.pg_class c where c.oid = f.rel and c.relkind = 'p'))
    union all
    select f.rel, 'key column ' || c.name || ' is gone (renamed or dropped): watch the table with its key columns again'
    from bloom_guard.watched w
    cross join lateral bloom_guard.family(w.rel) f(rel)
    cross join lateral pg_catalog.unnest(w.key_columns) c(name)
    where w.guard = gaps.guard
      and exists (select from pg_catalog.pg_class k where k.oid = w.rel)
      and not exists (
          select from pg_catalog.pg_attribute a
          where a.attrelid = f.rel and a.attname = c.name and a.attnum > 0 and not a.attisdropped)
    union all
    select null, 'the watched table with OID ' || w.rel::oid || ' was dropped'
    from bloom_guard.watched w
    where w.guard = gaps.guard and not exists (select from pg_catalog.pg_class c where c.oid = w.rel)
    union all
    select null, 'no table is watched for guard ' || guard
    where not exists (select from bloom_guard.watched w where w.guard = gaps.guard)
$$;

-- Retention without row deletes, one caller at a time (others return at
-- once): retires the current slot once it has been current for the
-- retention (if the next slot is empty), and empties a slot retired for
-- longer than the retention with TRUNCATE. The truncate waits at most 50 ms
-- for its lock (a long read holds it; it is tried again later), and the
-- horizon moves past every row it removes under that lock: a reader whose
-- position is older rebuilds. Returns about how many rows it removed.
create or replace function bloom_guard.prune(retention interval)
returns bigint
language plpgsql security definer
set search_path = pg_catalog, pg_temp
set jit = off
as $$
declare
    old record;
    cut xid8;
    removed bigint := 0;
begin
    if not pg_catalog.pg_try_advisory_xact_lock(pg_catalog.hashtext('bloom_guard.prune')) then
        return 0;
    end if;
    for old in
        select s.slot, s.retired from bloom_guard.slots s
        where not s.current and s.retired is not null and s.since <= pg_catalog.now() - retention
    loop
        begin
            perform pg_catalog.set_config('lock_timeout', '50ms', true);
            execute pg_catalog.format('lock table bloom_guard.%I in access exclusive mode', 'changes_' || old.slot);
            -- No writer holds the slot now. Its rows go only once every
            -- transaction that wrote them is older than every transaction
            -- still running: then a reader has read them all unless its
            -- position's xmin is at most the newest of them (a long
            -- transaction anywhere in the cluster holds the truncation
            -- back, as it holds back vacuum).
            execute pg_catalog.format(
                'select pg_catalog.max(xid), (select greatest(c.reltuples, 0)::int8 from pg_catalog.pg_class c
                  where c.oid = %L::regclass) from bloom_guard.%I',
                'bloom_guard.changes_' || old.slot, 'changes_' || old.slot)
            into cut, removed;
            if cut >= pg_catalog.pg_snapshot_xmin(pg_catalog.pg_current_snapshot()) then
                removed := 0;
                continue;
            end if;
            update bloom_guard.horizon
               set below = greatest(below, coalesce((cut::text::numeric + 1)::text::xid8, '0'::xid8));
            execute pg_catalog.format('truncate bloom_guard.%I', 'changes_' || old.slot);
            update bloom_guard.slots set retired = null where slot = old.slot;
        exception when lock_not_available then
            removed := 0;
        end;
    end loop;
    -- Rotate once the current slot is old enough and the next one is empty.
    update bloom_guard.slots s set current = s.slot = n.next, since = pg_catalog.now(),
           retired = case when s.current then pg_catalog.pg_current_snapshot() else s.retired end
    from (select (c.slot + 1) % 3 as next from bloom_guard.slots c
          where c.current and c.since <= pg_catalog.now() - retention) n
    where (s.current or s.slot = n.next)
      and exists (select from bloom_guard.slots f where f.slot = n.next and not f.current and f.retired is null);
    return removed;
end
$$;

-- Snapshots of the guards' filters, which instances adopt at start instead
-- of scanning: one row each, its bytes in chunks (stored uncompressed: a
-- filter's bits do not compress). They hold each filter's secret hasher
-- seed, so only the service's role should read them.
create table if not exists bloom_guard.snapshots (
    id bigint generated always as identity primary key,
    guard text not null,
    format integer not null,
    fingerprint text not null,
    position text not null,
    scanned_at timestamptz not null,
    created_at timestamptz not null default pg_catalog.now(),
    len bigint not null,
    keys bigint not null
);

create index if not exists snapshots_guard on bloom_guard.snapshots (guard, id);

create table if not exists bloom_guard.snapshot_chunks (
    snapshot bigint not null references bloom_guard.snapshots (id) on delete cascade,
    seq integer not null,
    data bytea not null,
    primary key (snapshot, seq)
);

alter table bloom_guard.snapshot_chunks alter column data set storage external;

revoke all on bloom_guard.snapshots, bloom_guard.snapshot_chunks from public;

revoke all on function bloom_guard.record_rows() from public;
revoke all on function bloom_guard.record_updated() from public;
revoke all on function bloom_guard.record_truncated() from public;
revoke all on function bloom_guard.prune(interval) from public;
revoke all on function bloom_guard.watch(regclass, text[], text) from public;
revoke all on function bloom_guard.create_triggers(regclass, text[], text) from public;
revoke all on function bloom_guard.create_record_functions(text, text[]) from public;
revoke all on function bloom_guard.unwatch(regclass, text) from public;

-- Earlier versions' watched tables get this version's triggers (version 4
-- added the replica row trigger), in this transaction: no write between
-- the two goes unrecorded. A table the installing role does not own keeps
-- its triggers until `bloom_guard.watch` runs again for it, and its
-- follower reports the missing one as a gap.
do $retrigger$
declare
    w record;
begin
    if exists (select from bloom_guard.schema_version where version < 4) then
        for w in
            select * from bloom_guard.watched x
            where exists (select from pg_catalog.pg_class c where c.oid = x.rel)
        loop
            begin
                perform bloom_guard.create_triggers(w.rel, w.key_columns, w.guard);
            exception when insufficient_privilege then
                raise warning 'bloom_guard: keeping the earlier triggers on %: %', w.rel, sqlerrm;
            end;
        end loop;
    end if;
end
$retrigger$;

-- Version 6: a feed trigger turned off by ALTER TABLE (a bulk load's
-- `disable trigger user`, rows, `enable trigger user`, in one transaction)
-- is recorded in the feed by the ALTER's own transaction: every follower
-- reads a resync when that transaction commits, lets every request through
-- and rebuilds, so the rows loaded meanwhile are never refused (without
-- this, only the next trigger check, up to its interval later, noticed).
-- Only ALTERs that leave one of the feed's triggers disabled record one.
-- An event trigger needs a superuser: installed by another role, the
-- trigger check's interval is the bound.
create or replace function bloom_guard.on_alter_table()
returns event_trigger
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
set jit = off
as $$
declare
    g text;
begin
    -- Whatever the command did (a trigger disabled or set to REPLICA or
    -- ORIGIN, dropped, a partition attached or created, a child table
    -- inherited): a guard with a gap now gets a resync in this transaction.
    -- Not while bloom-guard's own install or watch runs.
    if pg_catalog.current_setting('bloom_guard.installing', true) = 'on' then
        return;
    end if;
    for g in select distinct w.guard from bloom_guard.watched w loop
        -- Version 9: any ALTER TABLE of a watched table too (a key
        -- column's type or collation may have changed how the database
        -- compares keys): followers hold the guard open from the read
        -- that sees this row, look at the key columns again, and rebuild.
        if exists (select from bloom_guard.gaps(g) x where x.rel is not null)
           or exists (select from pg_catalog.pg_event_trigger_ddl_commands() c
                        join bloom_guard.watched w on w.guard = g
                       cross join lateral bloom_guard.family(w.rel) f(rel)
                       where c.command_tag = 'ALTER TABLE' and c.objid = f.rel::oid) then
            insert into bloom_guard.changes (guard, kind, key, part)
            values (g, 'r', '', bloom_guard.current_slot());
        end if;
    end loop;
exception when others then
    -- Never fail the user's command for our sake: the trigger check names
    -- the gap at its next run.
    raise warning 'bloom_guard: cannot record a gap in the change feed: %', sqlerrm;
end
$$;

-- Version 7: the event trigger fires for every command that can open a
-- gap (not only ALTER TABLE), and in every session, those of the replica
-- role too (ENABLE ALWAYS; a plain event trigger skips them).
do $event$
begin
    if exists (select from pg_catalog.pg_roles where rolname = current_user and rolsuper) then
        drop event trigger if exists bloom_guard_alter_table;
        create event trigger bloom_guard_alter_table on ddl_command_end
            when tag in ('ALTER TABLE', 'CREATE TABLE', 'DROP TRIGGER', 'ALTER TRIGGER')
            execute function bloom_guard.on_alter_table();
        alter event trigger bloom_guard_alter_table enable always;
    end if;
end
$event$;

-- A fleet's settings, which every instance of a guard reads every second
-- and puts in force (`PUT /admin/bloom/{guard}/mode`, `BloomGuard::set_settings`):
-- null where none was stored, and the instance's default applies.
create table if not exists bloom_guard.settings (
    guard text primary key,
    mode text check (mode in ('enforce', 'shadow', 'off')),
    audit_rate double precision check (audit_rate >= 0 and audit_rate <= 1),
    updated_at timestamptz not null default pg_catalog.now()
);

-- Every instance's heartbeat, per guard, at most every 10 s: the fleet
-- view (`GET /admin/bloom/{guard}/fleet`) lists those seen in the last
-- 30 s, and a heartbeat deletes its guard's older rows.
create table if not exists bloom_guard.instances (
    guard text not null,
    id text not null,
    seen_at timestamptz not null default pg_catalog.now(),
    report jsonb not null,
    primary key (guard, id)
);

revoke all on bloom_guard.settings, bloom_guard.instances from public;

-- Version 7: feed rows counted row by row (EXCEPT ALL in the update
-- functions), for filters that remove a key with its last row. Every
-- watched guard's functions are written again in this transaction; the
-- triggers call them by name and stay as they are.
do $recount$
declare
    w record;
begin
    if exists (select from bloom_guard.schema_version where version < 7) then
        for w in select distinct guard, key_columns from bloom_guard.watched loop
            begin
                perform bloom_guard.create_record_functions(w.guard, w.key_columns);
            exception when insufficient_privilege then
                raise warning 'bloom_guard: keeping the earlier functions of guard %: %', w.guard, sqlerrm;
            end;
        end loop;
    end if;
end
$recount$;

-- Version 9: the runtime role's rights. The role that installs the feed
-- owns it (its SECURITY DEFINER trigger functions run as that role); the
-- application's role needs only what followers, snapshots and the fleet's
-- tables use, and nothing that changes the feed's schema or a watched
-- table's triggers (`watch`, `unwatch`, the trigger functions stay the
-- owner's). Run by the owner: `select bloom_guard.grant_runtime('app')`.
create or replace function bloom_guard.grant_runtime(runtime regrole)
returns void
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
    execute pg_catalog.format('grant usage on schema bloom_guard to %s', runtime);
    execute pg_catalog.format(
        'grant select on bloom_guard.changes, bloom_guard.slots, bloom_guard.horizon,
                         bloom_guard.watched, bloom_guard.schema_version to %s', runtime);
    execute pg_catalog.format(
        'grant select, insert, delete on bloom_guard.snapshots, bloom_guard.snapshot_chunks to %s', runtime);
    execute pg_catalog.format(
        'grant select, insert, update, delete on bloom_guard.settings, bloom_guard.instances to %s', runtime);
    execute pg_catalog.format('grant execute on function bloom_guard.prune(interval) to %s', runtime);
    -- The read-only helpers the followers' checks call, by name: a
    -- database whose default privileges revoke EXECUTE from PUBLIC keeps
    -- them from everyone else.
    execute pg_catalog.format(
        'grant execute on function bloom_guard.current_slot(), bloom_guard.family(regclass),
             bloom_guard.trigger_name(text, text), bloom_guard.record_function(text, text[], text),
             bloom_guard.key_of(text[], text[]), bloom_guard.key_expression(text[], text),
             bloom_guard.key_columns_gone(text[]), bloom_guard.counts_rows(text), bloom_guard.gaps(text),
             bloom_guard.triggers_complete(regclass, text[], text) to %s', runtime);
    -- The log feed's tables, once installed (`install_log`): every instance
    -- may be elected to stream the slot and write its rows, prune them,
    -- and make the slot again. The REPLICATION attribute, which streaming
    -- and making a slot need, is not a grant: `alter role ... replication`.
    if pg_catalog.to_regclass('bloom_guard.log_changes') is not null then
        execute pg_catalog.format(
            'grant select, insert, delete on bloom_guard.log_changes to %s', runtime);
        execute pg_catalog.format(
            'grant select, insert, update on bloom_guard.log_progress, bloom_guard.log_horizon,
                                             bloom_guard.log_slot to %s', runtime);
        execute pg_catalog.format('grant select on bloom_guard.logged to %s', runtime);
        -- Version 10: the producer's one-call write (log feed schema 5).
        if pg_catalog.to_regprocedure('bloom_guard.log_write(text, text, pg_lsn, text[], text[], text[], int8[], timestamptz)') is not null then
            execute pg_catalog.format(
                'grant execute on function bloom_guard.log_write(text, text, pg_catalog.pg_lsn, text[], text[], text[], pg_catalog.int8[], timestamptz) to %s',
                runtime);
        end if;
        -- Version 11: the followers' one-statement read (log feed schema 6).
        if pg_catalog.to_regprocedure('bloom_guard.log_read(text, pg_lsn, text[], pg_lsn[])') is not null then
            execute pg_catalog.format(
                'grant execute on function bloom_guard.log_read(text, pg_catalog.pg_lsn, text[], pg_catalog.pg_lsn[]) to %s',
                runtime);
        end if;
        if not (select r.rolreplication or r.rolsuper from pg_catalog.pg_roles r where r.oid = runtime) then
            raise warning 'bloom_guard: role % has no REPLICATION attribute: it cannot stream the log feed''s slot (alter role % replication)', runtime, runtime;
        end if;
    end if;
end
$$;

revoke all on function bloom_guard.grant_runtime(regrole) from public;

insert into bloom_guard.schema_version (version) values (11)
on conflict (singleton) do update set version = excluded.version;

reset bloom_guard.installing;
