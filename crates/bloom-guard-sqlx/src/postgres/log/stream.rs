//! A logical replication slot, streamed: each committed transaction's feed
//! rows, in commit order, once.
//!
//! The slot sends again what it sent since the position it last saved
//! (after a crash, or a reconnect before an acknowledgement reached it).
//! A transaction is identified by its commit's end position, which grows
//! with commit order: one at or before `after` was applied already and is
//! skipped, so no change is applied twice (a delete applied twice would
//! remove another key's fingerprint).

use std::collections::HashMap;
use std::time::Duration;

use pgwire_replication::{Lsn, ReplicationClient, ReplicationEvent};

pub(crate) use super::error::StreamError;
use super::pgoutput::{self, Message, Relation};
use super::rows::{FeedRow, KeyColumns};
use super::url::{config, Server};

/// The longest an acknowledgement waits before it is sent, and only when
/// it moved: a refusal's read waits for the acknowledgement of a position
/// at or past the log's insert position when the request arrived.
const ACK_EVERY: Duration = Duration::from_millis(5);

/// A transaction's rows held at most: more go to the feed in parts of
/// this many, before its commit is received.
pub(crate) const PART_ROWS: usize = 10_000;

/// A table the log feeds, and the guards that watch it (none: a table
/// published for another reason, whose changes are passed over).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LoggedTable {
    pub(crate) schema: String,
    pub(crate) table: String,
    /// Each guard watching it, with its key columns.
    pub(crate) guards: Vec<(String, Vec<String>)>,
}

/// What the stream brings next.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Event {
    /// A committed transaction's feed rows (none if it changed no watched
    /// key), at its commit's end position; of a transaction sent in
    /// parts, the rows after them. With its commit's time, in
    /// microseconds since 2000-01-01 (the server's clock).
    Committed {
        end: u64,
        rows: Vec<FeedRow>,
        committed_at: i64,
    },
    /// [`PART_ROWS`] rows of a committed transaction being received, from
    /// its `offset`th row on: the transaction whose commit starts at
    /// `begin`.
    Part {
        begin: u64,
        offset: u64,
        rows: Vec<FeedRow>,
    },
    /// Every transaction before `wal_end` was sent: the server said so
    /// with no transaction open.
    CaughtUp { wal_end: u64 },
    /// The log feed's tables changed in the transaction being received:
    /// the stream takes up the tables as they are now
    /// ([`set_tables`](LogStream::set_tables)) before anything after,
    /// once that transaction (`xid`) is visible.
    Relogged { xid: Option<u64> },
}

/// The prefix of the message `install_log` writes to the log when the log
/// feed's tables change.
pub(crate) const LOGGED_MESSAGE: &str = "bloom_guard.logged";

/// The prefix of the message the event trigger writes to the log when a
/// log-fed table's family is altered; its content is the guard's name.
pub(crate) const RESYNC_MESSAGE: &str = "bloom_guard.resync";

/// Each guard watching a table, with its key columns, by (schema, table).
type Watched = HashMap<(String, String), Vec<(String, Vec<String>)>>;

/// A slot's stream of committed transactions.
pub(crate) struct LogStream {
    client: ReplicationClient,
    watched: Watched,
    /// Key columns by relation id, for the watched relations described so
    /// far; an empty list for a relation no guard watches.
    relations: HashMap<u32, Vec<KeyColumns>>,
    /// The relations as described, to find their key columns again when
    /// the tables change.
    descriptions: HashMap<u32, Relation>,
    /// The rows of the transaction being received, if one is open.
    open: Option<Vec<FeedRow>>,
    /// Where that transaction's commit starts, and how many of its rows
    /// went in parts.
    begin: u64,
    parted: u64,
    /// The end of the last transaction applied.
    after: u64,
}

impl LogStream {
    /// Streams `slot` for `publication`, skipping transactions that end at
    /// or before `after` (applied already), once the connection is found
    /// to reach the database `server` (if known).
    pub(crate) async fn start(
        url: &str,
        server: Option<&Server>,
        slot: &str,
        publication: &str,
        tables: &[LoggedTable],
        after: u64,
    ) -> Result<Self, StreamError> {
        // The server hears of what was written within `ACK_EVERY`: a read
        // for the barrier waits for that.
        let config = config(url, slot, publication)?
            .with_ack_lsn(Lsn::from_u64(after))
            .with_status_interval(ACK_EVERY);
        let mut client = ReplicationClient::connect_gated(config)
            .await
            .map_err(StreamError::Replication)?;
        if let Some(server) = server {
            server.check(&mut client).await?;
        }
        client.start().await.map_err(StreamError::Replication)?;
        Ok(Self {
            client,
            watched: watched(tables),
            relations: HashMap::new(),
            descriptions: HashMap::new(),
            open: None,
            begin: 0,
            parted: 0,
            after,
        })
    }

    /// The next committed transaction, or word that the stream caught up.
    pub(crate) async fn next(&mut self) -> Result<Event, StreamError> {
        loop {
            let event = self
                .client
                .recv()
                .await
                .map_err(StreamError::Replication)?
                .ok_or(StreamError::Ended)?;
            match event {
                ReplicationEvent::Begin { final_lsn, .. } => {
                    self.open = Some(Vec::new());
                    self.begin = final_lsn.as_u64();
                    self.parted = 0;
                }
                ReplicationEvent::XLogData { data, .. } => {
                    self.change(&data)?;
                    if let Some(part) = self.part() {
                        return Ok(part);
                    }
                }
                ReplicationEvent::Commit {
                    end_lsn,
                    commit_time_micros,
                    ..
                } => {
                    let rows = self.open.take().unwrap_or_default();
                    let end = end_lsn.as_u64();
                    if end > self.after {
                        return Ok(Event::Committed {
                            end,
                            rows,
                            committed_at: commit_time_micros,
                        });
                    }
                }
                ReplicationEvent::Message {
                    transactional: true,
                    prefix,
                    content,
                    ..
                } if prefix == LOGGED_MESSAGE => {
                    return Ok(Event::Relogged {
                        xid: std::str::from_utf8(&content)
                            .ok()
                            .and_then(|xid| xid.parse().ok()),
                    })
                }
                // A guard's table altered (a partition attached with its
                // rows): its followers rebuild from this commit.
                ReplicationEvent::Message {
                    transactional: true,
                    prefix,
                    content,
                    ..
                } if prefix == RESYNC_MESSAGE => {
                    if let Ok(guard) = std::str::from_utf8(&content) {
                        self.open.get_or_insert_with(Vec::new).push(FeedRow {
                            guard: guard.to_owned(),
                            kind: b'r',
                            key: String::new(),
                        });
                    }
                }
                ReplicationEvent::KeepAlive { wal_end, .. } if self.open.is_none() => {
                    return Ok(Event::CaughtUp {
                        wal_end: wal_end.as_u64(),
                    });
                }
                _ => {}
            }
        }
    }

    /// The open transaction's rows as a part, once there are
    /// [`PART_ROWS`] (none of a transaction applied already).
    fn part(&mut self) -> Option<Event> {
        let open = self.open.as_mut()?;
        if open.len() < PART_ROWS {
            return None;
        }
        let rows = std::mem::take(open);
        let offset = self.parted;
        self.parted += rows.len() as u64;
        // Its end is past its commit's start: applied already if that is.
        (self.begin >= self.after).then_some(Event::Part {
            begin: self.begin,
            offset,
            rows,
        })
    }

    /// Tells the server every transaction up to `end` is applied: the slot
    /// keeps no log before it.
    pub(crate) fn applied(&mut self, end: u64) {
        self.after = self.after.max(end);
        self.client.update_applied_lsn(Lsn::from_u64(self.after));
    }

    /// Takes up `tables` as the log feed's tables from the next change on.
    pub(crate) fn set_tables(&mut self, tables: &[LoggedTable]) -> Result<(), StreamError> {
        self.watched = watched(tables);
        let mut relations = HashMap::with_capacity(self.descriptions.len());
        for (id, relation) in &self.descriptions {
            relations.insert(*id, self.key_columns(relation)?);
        }
        self.relations = relations;
        Ok(())
    }

    /// Stops the stream, saying so to the server.
    pub(crate) async fn stop(mut self) {
        let _ = self.client.shutdown().await;
    }

    fn change(&mut self, data: &[u8]) -> Result<(), StreamError> {
        let message = pgoutput::decode(data)?;
        match &message {
            Message::Relation(relation) => {
                let keys = self.key_columns(relation)?;
                self.relations.insert(relation.id, keys);
                self.descriptions.insert(relation.id, relation.clone());
            }
            Message::Insert { relation, .. }
            | Message::Update { relation, .. }
            | Message::Delete { relation, .. } => {
                let keys = self
                    .relations
                    .get(relation)
                    .ok_or(StreamError::UnknownRelation(*relation))?;
                let rows = self.open.get_or_insert_with(Vec::new);
                for key_columns in keys {
                    key_columns.rows(&message, rows);
                }
            }
            Message::Truncate { relations } => {
                let rows = self.open.get_or_insert_with(Vec::new);
                for relation in relations {
                    let keys = self
                        .relations
                        .get(relation)
                        .ok_or(StreamError::UnknownRelation(*relation))?;
                    for key_columns in keys {
                        key_columns.rows(&message, rows);
                    }
                }
            }
            Message::Other => {}
        }
        Ok(())
    }

    /// The guards' key columns in a newly described relation: none for a
    /// table given without guards, an error for one not given at all (a
    /// change of it is not acknowledged, and comes again to a stream
    /// started with it).
    fn key_columns(&self, relation: &Relation) -> Result<Vec<KeyColumns>, StreamError> {
        let name = (relation.namespace.clone(), relation.name.clone());
        let Some(guards) = self.watched.get(&name) else {
            return Err(StreamError::Unwatched(name.0, name.1));
        };
        Ok(guards
            .iter()
            .map(|(guard, columns)| KeyColumns::of(relation, guard, columns))
            .collect::<Result<_, _>>()?)
    }
}

/// The guards of each table, by (schema, table).
fn watched(tables: &[LoggedTable]) -> Watched {
    tables
        .iter()
        .map(|table| {
            (
                (table.schema.clone(), table.table.clone()),
                table.guards.clone(),
            )
        })
        .collect()
}

/// A scan's place in the log: a snapshot of the database that holds every
/// change committed up to `lsn` and none after, exported by a temporary
/// slot made for it. The snapshot can be taken (`SET TRANSACTION
/// SNAPSHOT`) while this is held; dropping it drops the slot.
pub(crate) struct ScanPoint {
    _session: ReplicationClient,
    pub(crate) snapshot: String,
    pub(crate) lsn: u64,
}

impl ScanPoint {
    /// Makes the temporary slot on a replication connection to `url`. Its
    /// making waits for the transactions running then to end.
    /// The connection is first found to reach the database `server` (if
    /// known): another's snapshot cannot be taken.
    pub(crate) async fn take(url: &str, server: Option<&Server>) -> Result<Self, StreamError> {
        let name = format!("bloom_guard_scan_{:016x}", fastrand::u64(..));
        let mut session = ReplicationClient::connect_gated(config(url, &name, "")?)
            .await
            .map_err(StreamError::Replication)?;
        if let Some(server) = server {
            server.check(&mut session).await?;
        }
        let rows = session
            .simple_query(&format!(
                "CREATE_REPLICATION_SLOT {name} TEMPORARY LOGICAL pgoutput (SNAPSHOT 'export')"
            ))
            .await
            .map_err(StreamError::Replication)?;
        let text = |column: usize| {
            rows.first()
                .and_then(|row| row.get(column))
                .and_then(Option::as_ref)
                .map(|bytes| String::from_utf8_lossy(bytes).into_owned())
                .ok_or(StreamError::Answer("CREATE_REPLICATION_SLOT"))
        };
        let lsn =
            Lsn::parse(&text(1)?).map_err(|_| StreamError::Answer("CREATE_REPLICATION_SLOT"))?;
        Ok(Self {
            snapshot: text(2)?,
            lsn: lsn.as_u64(),
            _session: session,
        })
    }
}
