-- Tell every running instance about new keys, so each can add them to its
-- Bloom filter. NOTIFY is delivered at commit, in commit order, and never for
-- a transaction that rolls back. The channel is the trigger's first argument.
--
-- Payloads:  k<key>  a key (up to 7900 bytes: NOTIFY payloads must stay
--                    under 8000 bytes, and the trigger must never make an
--                    insert fail)
--            i<id>   a longer key: fetch it by id
--            c       too many rows at once (a bulk load): catch up with a
--                    rebuild instead of one notification per row

create function bloom_guard_notify_key(channel text, id bigint, key text) returns void
language sql as $$
    select pg_notify(channel, case
        when octet_length(key) <= 7900 then 'k' || key
        else 'i' || id::text
    end)
$$;

create function items_bloom_guard_inserted() returns trigger
language plpgsql as $$
begin
    if (select count(*) from new_rows) > 10000 then
        perform pg_notify(tg_argv[0], 'c');
    else
        perform bloom_guard_notify_key(tg_argv[0], id, key) from new_rows;
    end if;
    return null;
end
$$;

-- Only a changed key matters on update.
create function items_bloom_guard_updated() returns trigger
language plpgsql as $$
begin
    if (select count(*) from new_rows) > 10000 then
        perform pg_notify(tg_argv[0], 'c');
    else
        perform bloom_guard_notify_key(tg_argv[0], n.id, n.key)
        from new_rows n join old_rows o using (id)
        where n.key is distinct from o.key;
    end if;
    return null;
end
$$;

create trigger items_bloom_guard_inserted
    after insert on items
    referencing new table as new_rows
    for each statement execute function items_bloom_guard_inserted('bloom_guard');

create trigger items_bloom_guard_updated
    after update on items
    referencing old table as old_rows new table as new_rows
    for each statement execute function items_bloom_guard_updated('bloom_guard');
