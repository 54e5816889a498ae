-- The items of the example service. Every column but `key` has a default so
-- that `insert into items (key) values ('...')` works from any SQL client:
-- such rows must reach every instance's filter like the service's own.
create table items (
    id bigint generated always as identity primary key,
    key text not null unique,
    value text not null default '',
    created_at timestamptz not null default now()
);
