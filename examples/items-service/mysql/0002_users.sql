-- Users on MySQL or MariaDB: the id is a UUID stored as its text, lower
-- case and hyphenated (the service writes it so; the guard reads any form),
-- in a varbinary column that compares it byte for byte.
create table users (
    id varbinary(36) primary key,
    name mediumtext not null default ('')
);
