-- Users for the embedded SQLite database: the id is a UUID stored as text
-- (lower case, hyphenated: the service writes it so; the guard reads any
-- form).
create table users (
    id text primary key,
    name text not null default ''
);
