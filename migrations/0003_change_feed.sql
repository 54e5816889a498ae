-- The NOTIFY-per-key triggers of 0002 are replaced by bloom-guard's durable
-- change feed, which the service installs after these migrations
-- (`bloom_guard_sqlx::install`, then `Watch::install` on `items`): keys now
-- travel in a table written in the writer's transaction, and NOTIFY is only
-- a wake-up.
drop trigger if exists items_bloom_guard_inserted on items;
drop trigger if exists items_bloom_guard_updated on items;
drop function if exists items_bloom_guard_inserted();
drop function if exists items_bloom_guard_updated();
drop function if exists bloom_guard_notify_key(text, bigint, text);
