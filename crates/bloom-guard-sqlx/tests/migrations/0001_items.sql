-- The table the tests watch: a key column and an id of its own, so tests
-- can change either.
create table items (
    id bigint generated always as identity primary key,
    key text not null unique,
    value text not null default ''
);
