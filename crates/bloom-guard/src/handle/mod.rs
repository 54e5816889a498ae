//! The handle: [`BloomGuard`] (`guard`), its [`Builder`] and the settings
//! its clones share (`config`), and the state they share (`shared`): the
//! filters, the guard's health (`health`: holds, readiness, failures) and
//! the counters, each reached through its own type.
//!
//! Ties the other folders together: the request path, the filter's life
//! and control all hold a `Shared`; it holds their pieces of state.

pub(crate) mod builder;
pub(crate) mod config;
pub(crate) mod feed;
pub(crate) mod guard;
pub(crate) mod health;
pub(crate) mod shared;
