-- Users, the example's second resource: typed (UUID) ids behind a guard of
-- their own. `name` has a default so `insert into users default values`
-- works from any SQL client (and reaches every instance through the feed).
create table users (
    id uuid primary key default gen_random_uuid(),
    name text not null default ''
);
