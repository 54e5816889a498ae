#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_auto_cfg))]

mod builder;
mod counter;
mod extract;
mod filter;
mod future;
mod guard;
mod key;
mod layer;
mod metrics;
mod rebuild;
mod response;
mod service;
mod shared;
mod source;
mod stats;

#[cfg(feature = "admin")]
pub mod admin;
#[cfg(feature = "cache")]
mod cache;

pub use builder::Builder;
pub use extract::{Header, KeyExtractor, PathParam, PathSegment, QueryParam};
pub use future::ResponseFuture;
pub use guard::{BloomGuard, HoldOpen};
pub use key::{Key, KeyError};
pub use rebuild::BuildError;
pub use response::not_found_response;
pub use service::BloomGuardService;
pub use source::{KeyBatch, KeyList, KeySource};
pub use stats::{State, Stats};

#[cfg(feature = "cache")]
pub use cache::{CacheBuilder, CacheStats, ReadThroughCache};
