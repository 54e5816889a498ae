//! The binary log, streamed: each committed transaction's feed rows, in
//! commit order, once.
//!
//! A transaction is the events from a `BEGIN` (MariaDB sends one for each
//! transaction to a reader that does not ask for its GTID events) to the
//! `XID` or `COMMIT` that ends it; a statement outside one (DDL) is one on
//! its own. A transaction ends at its last event's end: the point the
//! producer's progress records with the transaction's rows, and the
//! stream resumes after.
//!
//! What the rows cannot carry starts the feed over for the table's guards
//! (a resync: every instance rebuilds): a statement that names a watched
//! table outside `BEGIN`/`COMMIT` (`TRUNCATE`, `ALTER TABLE`, `RENAME
//! TABLE`, partition DDL, `DROP`) or inside one (a session that writes in
//! `binlog_format=STATEMENT`), and a row change without its key. So does
//! a transaction that changes more than [`HELD_ROWS`] keys of watched
//! tables: its rows are held until its end is read, and a bulk load or a
//! mass delete of millions would be held whole; the rebuild's scan, which
//! begins after the transaction committed, holds its changes instead.

use std::collections::{BTreeSet, HashMap};

use mysql_async::binlog::events::{Event, EventData, RowsEventData};
use mysql_async::binlog::EventType;
use mysql_async::BinlogStream;

use super::position::BinlogPoint;
use super::rows::{feed_rows, KeyError, KeyPart};

/// The most feed rows one transaction holds in the reader's memory (about
/// 100 bytes each): past them, the feeds it changed start over instead.
pub(crate) const HELD_ROWS: usize = 250_000;

/// A feed of the server: the database whose feed tables it is written
/// to, and its name there.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct FeedId {
    pub(crate) database: String,
    pub(crate) feed: String,
}

/// The feed and key columns of a table on the binary log feed.
#[derive(Debug, Clone)]
pub(crate) struct LoggedTable {
    pub(crate) feed: FeedId,
    pub(crate) parts: Vec<KeyPart>,
    /// The table's columns as the catalog listed them when the parts were
    /// read: a row of another count was written under another layout.
    pub(crate) columns: usize,
}

/// The tables on the binary log feed, by schema and name (lower case).
#[derive(Debug, Clone, Default)]
pub(crate) struct LoggedTables {
    by_name: HashMap<(String, String), Vec<LoggedTable>>,
}

impl LoggedTables {
    pub(crate) fn insert(&mut self, schema: &str, table: &str, logged: LoggedTable) {
        self.by_name
            .entry((schema.to_lowercase(), table.to_lowercase()))
            .or_default()
            .push(logged);
    }

    /// Adds `other`'s tables.
    pub(crate) fn extend(&mut self, other: Self) {
        for (name, logged) in other.by_name {
            self.by_name.entry(name).or_default().extend(logged);
        }
    }

    fn get(&self, schema: &str, table: &str) -> &[LoggedTable] {
        self.by_name
            .get(&(schema.to_lowercase(), table.to_lowercase()))
            .map_or(&[], Vec::as_slice)
    }

    /// The feeds whose table a statement may name: any identifier of it
    /// that is a watched table, `schema.table` or unqualified in the
    /// statement's default `schema`. Too many is a rebuild more; too few
    /// would be a skipped change.
    fn named_in(&self, statement: &str, schema: &str) -> BTreeSet<FeedId> {
        let statement = statement.to_lowercase().replace('`', "");
        let schema = schema.to_lowercase();
        statement
            .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == '$' || c == '.'))
            .filter(|word| !word.is_empty())
            .filter_map(|word| {
                let (schema, table) = word.rsplit_once('.').unwrap_or((&schema, word));
                self.by_name.get(&(schema.to_owned(), table.to_owned()))
            })
            .flatten()
            .map(|logged| logged.feed.clone())
            .collect()
    }
}

/// A committed transaction's part of the feed.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Committed {
    /// Where it ends in the log.
    pub(crate) end: Option<BinlogPoint>,
    /// Its feed rows: the feed, the kind, the key.
    pub(crate) rows: Vec<(FeedId, char, Vec<u8>)>,
    /// The feeds it starts over.
    pub(crate) resync: BTreeSet<FeedId>,
    /// Whether it changed a table other than the feed's own: a read's
    /// wait for the producer waits for it (`feed.rs`).
    pub(crate) foreign: bool,
    /// Whether it changed which tables are on the feed.
    pub(crate) tables_changed: bool,
}

/// The feed's own tables: their changes are not the watched tables'.
pub(crate) fn is_feed_table(table: &str) -> bool {
    table.to_ascii_lowercase().starts_with("bloom_guard_")
}

/// The transactions of a binary log stream, one event at a time.
#[derive(Debug)]
pub(crate) struct Transactions {
    file: String,
    tables: LoggedTables,
    open: Option<Committed>,
    /// The end of the last event outside any transaction: every commit
    /// up to it has been taken.
    boundary: BinlogPoint,
}

impl Transactions {
    /// Reads the log from `start`, for `tables`.
    pub(crate) fn new(start: BinlogPoint, tables: LoggedTables) -> Self {
        Self {
            file: start.file.clone(),
            tables,
            open: None,
            boundary: start,
        }
    }

    /// The end of the last event outside any transaction.
    pub(crate) fn boundary(&self) -> &BinlogPoint {
        &self.boundary
    }

    /// Whether the stream is inside a transaction: its rows so far were
    /// read for the tables it was given then.
    pub(crate) fn in_transaction(&self) -> bool {
        self.open.is_some()
    }

    /// Reads on for `tables`, as the catalog lists them now (after a
    /// transaction that changed them).
    pub(crate) fn set_tables(&mut self, tables: LoggedTables) {
        self.tables = tables;
    }

    /// Takes one event; a transaction it ends comes back, and so does a
    /// new file (an empty transaction at its start), so the progress
    /// follows the log across files.
    pub(crate) fn event(
        &mut self,
        event: &Event,
        stream: &BinlogStream,
    ) -> Result<Option<Committed>, mysql_async::Error> {
        let taken = self.take(event, stream)?;
        let end = event.header().log_pos();
        let heartbeat = matches!(event.header().event_type(), Ok(EventType::HEARTBEAT_EVENT));
        if let Some(committed) = &taken {
            if let Some(end) = &committed.end {
                self.boundary = end.clone();
            }
        } else if self.open.is_none() && end != 0 && !heartbeat {
            self.boundary = BinlogPoint {
                file: self.file.clone(),
                pos: u64::from(end),
            };
        }
        Ok(taken)
    }

    fn take(
        &mut self,
        event: &Event,
        stream: &BinlogStream,
    ) -> Result<Option<Committed>, mysql_async::Error> {
        let end = event.header().log_pos();
        let data = event.read_data().map_err(mysql_async::Error::from)?;
        let at = |file: &str| BinlogPoint {
            file: file.to_owned(),
            pos: u64::from(end),
        };
        match data {
            Some(EventData::RotateEvent(rotate)) => {
                // The first event of a stream is an artificial rotate that
                // names the file asked for (its name may carry the checksum
                // bytes): the file is already known.
                if rotate.is_fake() || end == 0 {
                    return Ok(None);
                }
                self.file = rotate.name().into_owned();
                self.open = None;
                Ok(Some(Committed {
                    end: Some(BinlogPoint {
                        file: self.file.clone(),
                        pos: rotate.position(),
                    }),
                    ..Committed::default()
                }))
            }
            Some(EventData::QueryEvent(query)) => {
                let statement = query.query();
                let statement = statement.trim();
                if statement.starts_with('#') {
                    // MariaDB's stand-in for an event this reader did not
                    // ask for (a GTID, an annotation).
                    return Ok(None);
                }
                if statement.eq_ignore_ascii_case("BEGIN") {
                    self.open = Some(Committed::default());
                    return Ok(None);
                }
                if statement.eq_ignore_ascii_case("COMMIT") {
                    return Ok(Some(self.commit(at(&self.file.clone()))));
                }
                if statement.eq_ignore_ascii_case("ROLLBACK") {
                    // Only what a non-transactional table kept reaches
                    // the log: its end is a boundary, its rows were none.
                    self.open = None;
                    return Ok(Some(Committed {
                        end: Some(at(&self.file)),
                        ..Committed::default()
                    }));
                }
                let named = self.tables.named_in(statement, &query.schema());
                let lower = statement.to_ascii_lowercase();
                let explicit = self.open.is_some();
                let transaction = self.open.get_or_insert_with(Committed::default);
                transaction.foreign |= !lower.contains("bloom_guard_") || !named.is_empty();
                transaction.tables_changed |= lower.contains("bloom_guard_log_tables");
                transaction.resync.extend(named);
                if explicit {
                    // A statement inside a transaction (a session writing
                    // in `binlog_format=STATEMENT`): it ends with the
                    // transaction.
                    return Ok(None);
                }
                // DDL, a transaction of its own.
                Ok(Some(self.commit(at(&self.file.clone()))))
            }
            Some(EventData::XidEvent(_)) => Ok(Some(self.commit(at(&self.file.clone())))),
            Some(EventData::RowsEvent(rows)) => {
                self.rows(&rows, stream)?;
                Ok(None)
            }
            _ => Ok(None),
        }
    }

    fn commit(&mut self, end: BinlogPoint) -> Committed {
        let mut committed = self.open.take().unwrap_or_default();
        committed.end = Some(end);
        committed
    }

    fn rows(
        &mut self,
        rows: &RowsEventData<'_>,
        stream: &BinlogStream,
    ) -> Result<(), mysql_async::Error> {
        let Some(table) = stream.get_tme(rows.table_id()) else {
            return Ok(());
        };
        let schema = table.database_name();
        let name = table.table_name();
        let transaction = self.open.get_or_insert_with(Committed::default);
        if is_feed_table(&name) {
            transaction.tables_changed |= name.eq_ignore_ascii_case("bloom_guard_log_tables");
            return Ok(());
        }
        transaction.foreign = true;
        let logged = self.tables.get(&schema, &name);
        if logged.is_empty() {
            return Ok(());
        }
        for row in rows.rows(table) {
            let (before, after) = row.map_err(mysql_async::Error::from)?;
            for watched in logged {
                if transaction.resync.contains(&watched.feed) {
                    // Its guards rebuild from a scan that begins after
                    // this transaction committed: its rows would add
                    // nothing.
                    continue;
                }
                if usize::try_from(table.columns_count()).ok() != Some(watched.columns) {
                    // Written before or after a change of the table's
                    // columns the catalog does not show yet: the key's
                    // place is unknown.
                    transaction.resync.insert(watched.feed.clone());
                    continue;
                }
                match feed_rows(&watched.parts, table, before.as_ref(), after.as_ref()) {
                    Ok(found) => transaction.rows.extend(
                        found
                            .into_iter()
                            .map(|(kind, key)| (watched.feed.clone(), kind, key)),
                    ),
                    Err(KeyError::Missing(column) | KeyError::Unsupported(column)) => {
                        tracing::warn!(
                            database = watched.feed.database,
                            feed = watched.feed.feed,
                            column,
                            "a change reached the binary log without its key; the guard rebuilds"
                        );
                        transaction.resync.insert(watched.feed.clone());
                    }
                }
            }
        }
        if transaction.rows.len() > HELD_ROWS {
            let feeds: BTreeSet<FeedId> = transaction.rows.drain(..).map(|(id, ..)| id).collect();
            tracing::info!(
                rows = HELD_ROWS,
                feeds = feeds.len(),
                "a transaction changed more keys than the reader holds; the guards of its tables rebuild"
            );
            transaction.resync.extend(feeds);
            transaction.rows.shrink_to_fit();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{LoggedTable, LoggedTables};

    #[test]
    fn a_statement_names_a_table_of_its_schema_or_a_qualified_one() {
        let mut tables = LoggedTables::default();
        let logged = LoggedTable {
            feed: super::FeedId {
                database: "shop".to_owned(),
                feed: "items".to_owned(),
            },
            parts: Vec::new(),
            columns: 2,
        };
        tables.insert("shop", "Items", logged);
        let named = |statement: &str, schema: &str| tables.named_in(statement, schema).len();
        assert_eq!(named("truncate table items", "shop"), 1);
        assert_eq!(named("TRUNCATE `items`", "shop"), 1);
        assert_eq!(named("alter table shop.items add column x int", "other"), 1);
        assert_eq!(
            named("rename table `shop`.`items` to old_items", "other"),
            1
        );
        // Another database's table of the same name.
        assert_eq!(named("create table items (id int)", "other"), 0);
        assert_eq!(named("drop table other.items", "shop"), 0);
        assert_eq!(named("create table items_archive (id int)", "shop"), 0);
    }
}
