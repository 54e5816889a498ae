#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod adopt;
mod body;
mod builder;
#[cfg(feature = "axum")]
mod checked;
mod config;
mod counter;
mod error;
mod extract;
mod filter;
mod filter_set;
mod fleet;
mod future;
mod guard;
mod guard_settings;
mod journal;
mod key;
mod key_type;
mod layer;
mod lock;
mod methods;
mod metrics;
mod mode;
#[cfg(feature = "axum")]
mod path_param;
mod rebuild;
mod response;
mod scan;
mod service;
mod settings;
mod shared;
mod single_flight;
mod snapshot;
mod source;
mod stage;
mod stats;
mod verdict;

#[cfg(feature = "admin")]
pub mod admin;
#[cfg(feature = "cache")]
mod cache;

pub use adopt::Adoption;
pub use body::ResponseBody;
pub use builder::Builder;
#[cfg(feature = "axum")]
pub use checked::{AsKey, Checked, CheckedRejection};
pub use error::{AdoptError, BuildError};
pub use extract::{Header, KeyExtractor, PathSegment, QueryParam};
pub use fleet::{instance_id, Fleet, FleetStoreError, Instance, SettingsError};
pub use future::ResponseFuture;
pub use guard::{BloomGuard, HoldOpen};
pub use guard_settings::Membership;
pub use key::{Key, KeyError};
pub use key_type::KeyType;
pub use layer::GuardLayer;
pub use methods::Methods;
pub use mode::{Mode, UnknownMode};
#[cfg(feature = "axum")]
pub use path_param::{PathParam, PathParams};
pub use response::not_found_response;
pub use service::BloomGuardService;
pub use settings::{InvalidAuditRate, SetBy, Settings};
pub use snapshot::{
    Snapshot, SnapshotChunks, SnapshotError, SnapshotInfo, SnapshotReader, SnapshotWriter,
    SNAPSHOT_FORMAT,
};
pub use source::{KeyBatch, KeyList, KeySource};
pub use stats::{FeedStatus, FilterOrigin, GuardState, Stats, UncheckedCounts};

#[cfg(feature = "metrics")]
pub use metrics::{describe_metrics, DURATION_BUCKETS};

#[cfg(feature = "cache")]
pub use cache::{CacheBuilder, CacheStats, ReadThroughCache};

/// The repository README's quick start, compiled and run as a doctest.
#[cfg(all(doctest, feature = "axum"))]
#[doc = include_str!("../../../README.md")]
struct ReadmeQuickStart;
