//! Control: where what an operator switches (`switches/`) is stored and
//! served. The guard's API over the settings and its fleet membership
//! (`guard_settings`),
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
#[cfg(feature = "axum")]
pub(crate) mod readiness;
