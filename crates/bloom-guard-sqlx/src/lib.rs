#![doc = include_str!("../README.md")]
#![doc = include_str!("../docs/architecture.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

// The key sources (any sqlx query, Postgres COPY), the SQL tables every
// backend shares (snapshots, fleet), the follower engine, and its backends:
// docs/architecture.md maps them, and the test at the bottom keeps the two
// in step.
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
mod backoff;
#[cfg(any(feature = "postgres", feature = "mysql"))]
mod ddl;
#[cfg(any(feature = "sqlite", feature = "mysql"))]
mod digest;
mod error;
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
mod fleet_rebuild;
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
mod follow;
#[cfg(any(feature = "postgres", feature = "mysql"))]
mod kept;
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
mod lock;
#[cfg(feature = "mysql")]
pub mod mysql;
#[cfg(any(feature = "postgres", feature = "mysql"))]
mod per_database;
#[cfg(feature = "postgres")]
pub mod postgres;
mod source;
#[cfg(feature = "sqlite")]
pub mod sqlite;
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
mod store;
mod watch;

pub use error::{CopyTextError, FeedError, SourceError};
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
pub use fleet_rebuild::FleetRebuild;
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
pub use follow::Follow;
pub use source::copy_text::CopyTextDecoder;
pub use source::query::QuerySource;
#[cfg(any(feature = "log-feed", feature = "binlog-feed"))]
pub use watch::LogFeed;
pub use watch::{TriggerFeed, Watch};

#[cfg(test)]
mod tests {
    /// Every entry of `src/` has a row in the architecture map, and every
    /// row names entries that exist.
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
                map.contains(&format!("| `{shown}`")) || map.contains(&format!(", `{shown}`")),
                "src/{name} has no row in docs/architecture.md: add one"
            );
            entries.push(shown);
        }
        for row in map.lines().filter(|line| line.starts_with("| `")) {
            let first = row.split(" | ").next().unwrap_or_default();
            for named in first.split('`').skip(1).step_by(2) {
                assert!(
                    entries.iter().any(|entry| entry == named),
                    "docs/architecture.md names `{named}`, which is not in src/"
                );
            }
        }
    }
}
