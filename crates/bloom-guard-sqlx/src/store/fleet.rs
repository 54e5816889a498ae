//! A fleet's settings and heartbeats kept in SQL tables, the same way on
//! every database: one settings row per guard, one heartbeat row per guard
//! and instance. Each backend brings its own statements.

use std::future::Future;

use sqlx::{AssertSqlSafe, Database, Decode, Encode, Executor, IntoArguments, Pool, Type};

/// Where a backend keeps its fleets' settings and heartbeats.
pub(crate) trait FleetTable: Clone + Send + Sync + 'static {
    /// The stored mode name and audit rate of `guard`, each null if none
    /// was stored.
    fn settings(
        &self,
        guard: &str,
    ) -> impl Future<Output = Result<(Option<String>, Option<f64>), sqlx::Error>> + Send;

    /// Stores the mode and the audit rate given for `guard`, keeping the
    /// stored ones of those not given.
    fn store(
        &self,
        guard: &str,
        mode: Option<&'static str>,
        audit_rate: Option<f64>,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;

    /// Forgets the settings stored for `guard`.
    fn reset(&self, guard: &str) -> impl Future<Output = Result<(), sqlx::Error>> + Send;

    /// Records the heartbeat of instance `id` of `guard` (its report as
    /// JSON), and forgets the instances of `guard` not heard from lately.
    fn beat(
        &self,
        guard: &str,
        id: &str,
        report: String,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;

    /// The reports of the instances of `guard` heard from lately, with the
    /// milliseconds since, by id.
    fn instances(
        &self,
        guard: &str,
    ) -> impl Future<Output = Result<Vec<(String, i64)>, sqlx::Error>> + Send;

    /// Forgets instance `id` of `guard`: it stopped.
    fn leave(&self, guard: &str, id: &str) -> impl Future<Output = Result<(), sqlx::Error>> + Send;
}

/// A backend's statements for its fleet tables.
#[derive(Debug)]
pub(crate) struct FleetStatements {
    /// The stored mode and audit rate of guard `$1`.
    pub(crate) settings: &'static str,
    /// Stores guard `$1`'s mode `$2` and audit rate `$3`, keeping the
    /// stored one of either where it is null.
    pub(crate) store: &'static str,
    /// Deletes guard `$1`'s stored settings.
    pub(crate) reset: &'static str,
    /// Records instance `$2` of guard `$1`'s heartbeat, the JSON report `$3`.
    pub(crate) beat: &'static str,
    /// Deletes guard `$1`'s rows not heard from in the live window; empty
    /// where `beat` does it in the same statement.
    pub(crate) expire: &'static str,
    /// The reports of guard `$1`'s instances heard from in the live
    /// window, with the milliseconds since, by id.
    pub(crate) instances: &'static str,
    /// Deletes instance `$2` of guard `$1`.
    pub(crate) leave: &'static str,
}

/// The fleet tables of one database.
#[derive(Debug)]
pub(crate) struct FleetTables<DB: Database> {
    pool: Pool<DB>,
    statements: &'static FleetStatements,
}

impl<DB: Database> FleetTables<DB> {
    pub(crate) fn new(pool: &Pool<DB>, statements: &'static FleetStatements) -> Self {
        Self {
            pool: pool.clone(),
            statements,
        }
    }
}

impl<DB: Database> Clone for FleetTables<DB> {
    fn clone(&self) -> Self {
        Self::new(&self.pool, self.statements)
    }
}

impl<DB> FleetTable for FleetTables<DB>
where
    DB: Database,
    for<'c> &'c Pool<DB>: Executor<'c, Database = DB>,
    <DB as Database>::Arguments: IntoArguments<DB>,
    for<'r> (Option<String>, Option<f64>): sqlx::FromRow<'r, DB::Row>,
    for<'r> (String, i64): sqlx::FromRow<'r, DB::Row>,
    for<'r> i64: Decode<'r, DB>,
    for<'q> String: Encode<'q, DB> + Type<DB>,
    for<'q> Option<String>: Encode<'q, DB> + Type<DB>,
    for<'q> Option<f64>: Encode<'q, DB> + Type<DB>,
{
    async fn settings(&self, guard: &str) -> Result<(Option<String>, Option<f64>), sqlx::Error> {
        let row: Option<(Option<String>, Option<f64>)> =
            sqlx::query_as::<DB, _>(AssertSqlSafe(self.statements.settings))
                .bind(guard.to_owned())
                .fetch_optional(&self.pool)
                .await?;
        Ok(row.unwrap_or((None, None)))
    }

    async fn store(
        &self,
        guard: &str,
        mode: Option<&'static str>,
        audit_rate: Option<f64>,
    ) -> Result<(), sqlx::Error> {
        sqlx::query::<DB>(AssertSqlSafe(self.statements.store))
            .bind(guard.to_owned())
            .bind(mode.map(str::to_owned))
            .bind(audit_rate)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn reset(&self, guard: &str) -> Result<(), sqlx::Error> {
        sqlx::query::<DB>(AssertSqlSafe(self.statements.reset))
            .bind(guard.to_owned())
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn beat(&self, guard: &str, id: &str, report: String) -> Result<(), sqlx::Error> {
        sqlx::query::<DB>(AssertSqlSafe(self.statements.beat))
            .bind(guard.to_owned())
            .bind(id.to_owned())
            .bind(report)
            .execute(&self.pool)
            .await?;
        if !self.statements.expire.is_empty() {
            sqlx::query::<DB>(AssertSqlSafe(self.statements.expire))
                .bind(guard.to_owned())
                .execute(&self.pool)
                .await?;
        }
        Ok(())
    }

    async fn instances(&self, guard: &str) -> Result<Vec<(String, i64)>, sqlx::Error> {
        sqlx::query_as::<DB, (String, i64)>(AssertSqlSafe(self.statements.instances))
            .bind(guard.to_owned())
            .fetch_all(&self.pool)
            .await
    }

    async fn leave(&self, guard: &str, id: &str) -> Result<(), sqlx::Error> {
        sqlx::query::<DB>(AssertSqlSafe(self.statements.leave))
            .bind(guard.to_owned())
            .bind(id.to_owned())
            .execute(&self.pool)
            .await?;
        Ok(())
    }
}
