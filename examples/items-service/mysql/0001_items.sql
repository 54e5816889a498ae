-- The items table on MySQL or MariaDB: the same contract as the Postgres
-- schema in /migrations (every column but `key` has a default). The key is
-- varbinary: compared byte for byte, with no padding, as the guard
-- compares keys (a text collation would equate `Apple`, `apple` and
-- `apple `, and the follower would keep the guard open).
create table items (
    id bigint auto_increment primary key,
    `key` varbinary(2048) not null unique,
    value mediumtext not null default (''),
    created_at timestamp(6) not null default current_timestamp(6)
);
