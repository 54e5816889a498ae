//! Key sources: any sqlx query (`query`), and the decoder of Postgres'
//! `COPY` text (`copy_text`) behind `postgres::CopySource`; both stream key
//! batches from a task of their own (`batches`). No backend state.

pub(crate) mod batches;
pub(crate) mod copy_text;
pub(crate) mod query;
