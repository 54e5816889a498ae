#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_auto_cfg))]

mod extract;
mod filter;
mod future;
mod guard;
mod key;
mod layer;
mod response;
mod service;
mod source;
mod stats;
mod warm;

#[cfg(feature = "admin")]
pub mod admin;
#[cfg(feature = "cache")]
mod cache;

pub use extract::{Header, KeyExtractor, PathParam, PathSegment, QueryParam};
pub use future::ResponseFuture;
pub use guard::{BloomGuard, Builder};
pub use key::{Key, KeyError};
pub use response::not_found_response;
pub use service::BloomGuardService;
pub use source::{KeyBatch, KeyList, KeySource};
pub use stats::{State, Stats};
pub use warm::BuildError;

#[cfg(feature = "cache")]
pub use cache::{CacheBuilder, CacheStats, ReadThroughCache};
