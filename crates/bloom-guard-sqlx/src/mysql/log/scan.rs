//! Every key of a table on the binary log feed, for a scan, from one
//! snapshot whose exact place in the log names the scan's position.
//!
//! MariaDB gives the log position of a consistent snapshot
//! (`binlog_snapshot_file`, `binlog_snapshot_position`): every transaction
//! committed up to it is in the snapshot, none after. MySQL has no such
//! status; a scan there is refused rather than replayed from a guess, where
//! a change could be applied twice.

use bloom_guard::{keys::KeyBatch, KeySource};
use futures_util::stream::BoxStream;
use sqlx::MySqlPool;

use super::position::{BinlogPoint, LogPosition};
use crate::error::SourceError;
use crate::mysql::scan::{send_keys, MySqlScan};
use crate::source::batches::spawn_scan;

/// The keys of a table on the binary log feed, at a point of the log.
#[derive(Debug, Clone)]
pub(crate) struct LogScan {
    pub(crate) inner: MySqlScan,
    pool: MySqlPool,
}

impl LogScan {
    pub(crate) fn new(inner: MySqlScan, pool: MySqlPool) -> Self {
        Self { inner, pool }
    }
}

impl KeySource for LogScan {
    type Error = SourceError;

    async fn count_hint(&self) -> Result<Option<u64>, SourceError> {
        self.inner.count_hint().await
    }

    fn keys(&self) -> BoxStream<'static, Result<KeyBatch, SourceError>> {
        let (pool, query, weighed) = (
            self.pool.clone(),
            self.inner.query().to_owned(),
            self.inner.weighed(),
        );
        spawn_scan(move |batches| async move {
            // A transaction that rolls back when dropped: a scan that ends
            // early leaves no snapshot open on a pooled connection.
            let mut connection = pool
                .begin_with(
                    "set transaction isolation level repeatable read; start transaction with consistent snapshot, read only",
                )
                .await?;
            let point = snapshot_point(&mut connection).await?;
            let epoch: Option<String> =
                sqlx::query_scalar("select epoch from bloom_guard_log_progress where id = 1")
                    .fetch_optional(&mut *connection)
                    .await?;
            let Some(epoch) = epoch else {
                return Err(SourceError::LogPoint(
                    "the binary log feed is not installed: call Watch::install_log".to_owned(),
                ));
            };
            let position = LogPosition {
                epoch,
                seq: point.sequence().unwrap_or(0),
                pos: point.pos,
            };
            let Some(batch) = send_keys(
                &mut connection,
                &query,
                weighed,
                position.to_string(),
                &batches,
            )
            .await?
            else {
                return Ok(());
            };
            connection.commit().await?;
            batches.finish(batch).await;
            Ok(())
        })
    }
}

/// The log position of the session's consistent snapshot (MariaDB).
async fn snapshot_point(
    connection: &mut sqlx::MySqlConnection,
) -> Result<BinlogPoint, SourceError> {
    let rows: Vec<(String, String)> = sqlx::query_as(
        "show status where variable_name in ('binlog_snapshot_file', 'binlog_snapshot_position')",
    )
    .fetch_all(&mut *connection)
    .await?;
    let value = |name: &str| {
        rows.iter()
            .find(|(variable, _)| variable.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.clone())
    };
    match (value("binlog_snapshot_file"), value("binlog_snapshot_position")) {
        (Some(file), Some(pos)) if !file.is_empty() => Ok(BinlogPoint {
            file,
            pos: pos.parse().map_err(|_| {
                SourceError::LogPoint(format!("binlog_snapshot_position is {pos}"))
            })?,
        }),
        _ => Err(SourceError::LogPoint(
            "the server gives no binary log position of a snapshot (binlog_snapshot_file is MariaDB's): the binary log feed scans on MariaDB only".to_owned(),
        )),
    }
}
