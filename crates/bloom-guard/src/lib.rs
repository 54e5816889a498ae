#![doc = include_str!("../README.md")]
#![doc = include_str!("../docs/architecture.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

// The folders, in the order of the map above; the test at the bottom keeps
// the two in step.
#[cfg(feature = "cache")]
pub mod cache;
mod control;
mod error;
mod filters;
mod handle;
pub mod keys;
mod lifecycle;
mod lock;
mod report;
mod request;
mod switches;

#[cfg(feature = "admin")]
pub use control::admin;
#[cfg(feature = "axum")]
pub use control::readiness::readiness;
pub use error::BuildError;
pub use handle::builder::Builder;
pub use handle::guard::{BloomGuard, FailOpen};
pub use keys::key_type::KeyType;
pub use lifecycle::source::{KeyList, KeySource};
pub use report::stats::Stats;
pub use request::layer::BloomGuardLayer;
pub use request::response::not_found_response;
pub use switches::mode::Mode;

pub mod extract {
    //! Where a request's key is: the [`KeyExtractor`] trait, the extractors
    //! a layer takes ([`PathParam`], [`PathSegment`], [`QueryParam`],
    //! [`Header`], or a closure), and the check in extractor form after the
    //! app's own extractors ([`Checked`]).

    #[cfg(feature = "axum")]
    pub use crate::request::checked::{AsKey, Checked, CheckedRejection};
    pub use crate::request::extract::{Header, KeyExtractor, PathSegment, QueryParam};
    #[cfg(feature = "axum")]
    pub use crate::request::path_param::{PathParam, PathParams};
}

pub mod service {
    //! The tower service a [`BloomGuardLayer`](crate::BloomGuardLayer)
    //! makes, its future and response body, and the [`Methods`] it checks.

    pub use crate::request::body::ResponseBody;
    pub use crate::request::future::ResponseFuture;
    pub use crate::request::methods::Methods;
    pub use crate::request::service::BloomGuardService;
}

pub mod snapshot {
    //! A filter written to bytes and adopted by another instance instead of
    //! a scan: [`SnapshotWriter`] from
    //! [`FeedHandle::snapshot`](crate::feed::FeedHandle::snapshot),
    //! [`Snapshot::decode`] or [`SnapshotReader`] on the other side.

    pub use crate::lifecycle::snapshot::{
        Snapshot, SnapshotChunks, SnapshotError, SnapshotInfo, SnapshotReader, SnapshotWriter,
        SNAPSHOT_FORMAT,
    };
}

pub mod feed {
    //! What a change feed needs from a guard, for the authors of feeds
    //! (`bloom-guard-sqlx` is one): a [`FeedHandle`] from
    //! [`BloomGuard::feed`](crate::BloomGuard::feed) applies each read at
    //! its typed [`Position`]s, keeps the read barrier ([`FeedReader`],
    //! or a look at the table itself: [`KeyLookup`]), brings a counting filter from its scan to the present
    //! ([`CatchUp`]), and adopts snapshots ([`Adoption`]).

    pub use crate::error::AdoptError;
    pub use crate::handle::feed::{FeedHandle, Position};
    pub use crate::lifecycle::adopt::Adoption;
    pub use crate::lifecycle::barrier::{
        FeedReader, KeyLookup, LookupError, LookupKey, ReadPace, ReadStart,
    };
    pub use crate::lifecycle::catch_up::{CatchUp, PendingFilter};
}

pub mod stats {
    //! What [`Stats`](crate::Stats) is made of: the guard's state, its
    //! filter's kind and origin, its change feed, the requests it could not
    //! check.

    pub use crate::report::stats::{
        FeedStatus, FeedStorage, FilterKind, FilterOrigin, GuardState, UncheckedCounts,
    };
}

pub mod fleet {
    //! A fleet of instances that share their settings: the [`Fleet`] store
    //! a guard joins, its [`Membership`], the [`Instance`]s it lists.

    pub use crate::control::fleet::{instance_id, Fleet, FleetStoreError, Instance};
    pub use crate::control::guard_settings::Membership;
}

pub mod settings {
    //! The guard's settings in three layers (the fleet's, this instance's
    //! overrides, the built defaults): [`Settings`], who set each
    //! ([`SetBy`]), and their errors.

    pub use crate::control::fleet::SettingsError;
    pub use crate::switches::mode::UnknownMode;
    pub use crate::switches::settings::{InvalidAuditRate, SetBy, Settings};
}

#[cfg(feature = "metrics")]
pub mod metrics {
    //! The `metrics` facade's figures: [`describe_metrics`] names them, and
    //! [`DURATION_BUCKETS`] suits their histograms.

    pub use crate::report::metrics::{describe_metrics, DURATION_BUCKETS};
}

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
            // `lib.rs`, and a folder that only holds a file's tests
            // (`cache/tests.rs` beside `cache.rs`).
            let tests_only = src.join(format!("{name}.rs")).exists();
            if name == "lib.rs" || tests_only {
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

    /// The root holds what an application types; the rest lives in the
    /// modules by concern. Counts every `pub use` name and `pub mod`.
    #[test]
    fn the_root_holds_at_most_25_names() {
        let lib = include_str!("lib.rs");
        let mut names = 0;
        let mut statement = String::new();
        for line in lib
            .lines()
            .take_while(|line| !line.starts_with("#[cfg(test)]"))
        {
            if line.starts_with("pub mod ") {
                names += 1;
            } else if line.starts_with("pub use ") || !statement.is_empty() {
                statement.push_str(line);
                if line.ends_with(';') {
                    let list = statement.rsplit("::").next().unwrap_or_default();
                    names += list
                        .split(',')
                        .filter(|name| !name.trim().is_empty())
                        .count();
                    statement.clear();
                }
            }
        }
        assert!(names >= 20, "the count reads lib.rs: {names} names found");
        assert!(
            names <= 25,
            "bloom-guard's root has {names} names: at most 25"
        );
    }
}
