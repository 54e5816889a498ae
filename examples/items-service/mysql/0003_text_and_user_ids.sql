-- Text in any database's default character set: `value` and `name` hold
-- any Unicode text (a database created latin1 would refuse "🦀"), and a
-- user written by SQL without an id gets one, as on Postgres.
alter table items modify value mediumtext character set utf8mb4 collate utf8mb4_bin not null default ('');
alter table users modify name mediumtext character set utf8mb4 collate utf8mb4_bin not null default ('');
alter table users modify id varbinary(36) not null default (uuid());
