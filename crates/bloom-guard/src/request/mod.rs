//! The request path: from a request to a verdict, and the answer.
//!
//! A [`BloomGuardLayer`] (`layer`) binds a guard to where the key is (`extract`,
//! `path_param`) and the methods it checks (`methods`); its
//! [`BloomGuardService`] (`service`) reads the key, asks for a verdict
//! (`verdict`) and either calls the inner service or answers itself
//! (`response`, `body`, `future`). [`Checked`] (`checked`) is the same
//! check in extractor form, after the app's own extractors.
//!
//! Uses `keys/` (canonical keys), the guard's shared state (`handle/`) and
//! `switches::mode`; nothing in the filter's life or the control plane
//! depends on this folder.

pub(crate) mod body;
#[cfg(feature = "axum")]
pub(crate) mod checked;
pub(crate) mod extract;
pub(crate) mod found;
pub(crate) mod future;
pub(crate) mod layer;
pub(crate) mod methods;
#[cfg(feature = "axum")]
pub(crate) mod path_param;
pub(crate) mod response;
pub(crate) mod service;
pub(crate) mod verdict;
