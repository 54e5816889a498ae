-- The items table for the embedded SQLite database: the same contract as the
-- Postgres schema in /migrations (every column but `key` has a default).
create table items (
    id integer primary key autoincrement,
    key text not null unique,
    value text not null default '',
    created_at text not null default current_timestamp
);
