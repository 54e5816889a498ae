//! Control: what an operator switches at run time and where it is stored.
//! The mode (`mode`), the mode and audit rate in three layers (`settings`),
//! the guard's API over them and its fleet membership (`guard_settings`),
//! the fleet's store of settings and instances (`fleet`), the admin
//! router over all of it (`admin/`, feature `admin`), and a readiness
//! handler for the application's router (`readiness`, feature `axum`).
//!
//! Uses `report/` for what it shows and the guard's shared state
//! (`handle/`); the filter's life does not depend on it.

#[cfg(feature = "admin")]
pub mod admin;
pub(crate) mod fleet;
pub(crate) mod guard_settings;
pub(crate) mod membership;
pub(crate) mod mode;
#[cfg(feature = "axum")]
pub(crate) mod readiness;
pub(crate) mod settings;
