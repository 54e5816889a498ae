-- For the log feed (BLOOM_FEED=log): a delete or key change of an item
-- reaches the write-ahead log with its old key only if the key is in the
-- table's replica identity; the unique index on the key is. With the
-- trigger feed it only adds the old key to the log of such changes. The
-- lock is brief (a catalog change), and waited for at most 5 s.
set local lock_timeout = '5s';
alter table items replica identity using index items_key_key;
