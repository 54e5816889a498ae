#![doc = include_str!("../README.md")]
#![doc = include_str!("../docs/architecture.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

// The folders, in the order of the map above; the test at the bottom keeps
// the two in step.
#[cfg(feature = "cache")]
mod cache;
mod control;
mod error;
mod filters;
mod handle;
mod keys;
mod lifecycle;
mod lock;
mod report;
mod request;

#[cfg(feature = "admin")]
pub use control::admin;

pub use control::fleet::{instance_id, Fleet, FleetStoreError, Instance, SettingsError};
pub use control::guard_settings::Membership;
pub use control::mode::{Mode, UnknownMode};
#[cfg(feature = "axum")]
pub use control::readiness::readiness;
pub use control::settings::{InvalidAuditRate, SetBy, Settings};
pub use error::{AdoptError, BuildError};
pub use handle::builder::Builder;
pub use handle::guard::{BloomGuard, HoldOpen};
pub use keys::batch::KeyBatch;
pub use keys::collation::{Collation, CollationBuilder, CollationError};
pub use keys::key::{Key, KeyError};
pub use keys::key_type::KeyType;
pub use lifecycle::adopt::Adoption;
pub use lifecycle::barrier::{FeedReader, ReadPace, ReadStart};
pub use lifecycle::catch_up::{CatchUp, PendingFilter};
pub use lifecycle::snapshot::{
    Snapshot, SnapshotChunks, SnapshotError, SnapshotInfo, SnapshotReader, SnapshotWriter,
    SNAPSHOT_FORMAT,
};
pub use lifecycle::source::{KeyList, KeySource};
pub use report::stats::{
    FeedStatus, FeedStorage, FilterKind, FilterOrigin, GuardState, Stats, UncheckedCounts,
};
pub use request::body::ResponseBody;
#[cfg(feature = "axum")]
pub use request::checked::{AsKey, Checked, CheckedRejection};
pub use request::extract::{Header, KeyExtractor, PathSegment, QueryParam};
pub use request::future::ResponseFuture;
pub use request::layer::GuardLayer;
pub use request::methods::Methods;
#[cfg(feature = "axum")]
pub use request::path_param::{PathParam, PathParams};
pub use request::response::not_found_response;
pub use request::service::BloomGuardService;

#[cfg(feature = "metrics")]
pub use report::metrics::{describe_metrics, DURATION_BUCKETS};

#[cfg(feature = "cache")]
pub use cache::{CacheBuilder, CacheStats, ReadThroughCache};

/// The repository README's quick start, compiled and run as a doctest.
#[cfg(all(doctest, feature = "axum"))]
#[doc = include_str!("../../../README.md")]
struct ReadmeQuickStart;

#[cfg(test)]
mod tests {
    /// Every entry of `src/` has a row in the architecture map, and every
    /// row names an entry that exists.
    #[test]
    fn the_map_names_every_top_level_module() {
        let map = include_str!("../docs/architecture.md");
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut entries = Vec::new();
        for entry in std::fs::read_dir(&src).expect("src/ is readable") {
            let name = entry.expect("an entry of src/").file_name();
            let name = name.to_string_lossy().into_owned();
            if name == "lib.rs" {
                continue;
            }
            let shown = if name.ends_with(".rs") {
                name.clone()
            } else {
                format!("{name}/")
            };
            assert!(
                map.contains(&format!("`{shown}`")),
                "src/{name} has no row in docs/architecture.md: add one"
            );
            entries.push(shown);
        }
        for row in map.lines().filter(|line| line.starts_with("| `")) {
            let named = row.split('`').nth(1).expect("a row names a place");
            assert!(
                entries.iter().any(|entry| entry == named),
                "docs/architecture.md names `{named}`, which is not in src/"
            );
        }
    }
}
