//! The items service: an axum API guarded by bloom-guard, with a moka
//! read-through cache, on Postgres, MySQL or MariaDB, or an embedded SQLite file.
//!
//! The binary (`src/main.rs`) wires these together; tests drive [`app`]
//! with `oneshot`.

pub mod admin;
pub mod config;
pub mod db;
pub mod error;
pub mod feeds;
pub mod guards;
pub mod routes;
pub mod server;
pub mod startup;
pub mod state;

pub use admin::admin_app;
pub use config::Config;
pub use config::MAX_KEY_LEN;
pub use db::{Database, Item, MigrateError, Pool, UrlError, User};
pub use feeds::{items_feed, users_feed};
pub use guards::{guards, guards_for, Guards};
pub use routes::app;
pub use server::{serve, Limits};
pub use startup::prepare;
pub use state::AppState;

/// The repository README's library example, compiled as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct RepositoryReadme;
