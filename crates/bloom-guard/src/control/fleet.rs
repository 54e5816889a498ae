//! The fleet: every instance of a service running one guard, sharing
//! settings and reporting to each other through a database.

use futures_util::future::BoxFuture;

use crate::report::stats::{FilterOrigin, GuardState, Stats};
use crate::switches::mode::Mode;
use crate::switches::settings::{InvalidAuditRate, SetBy, Settings};

/// Any error of a [`Fleet`]'s database.
pub type FleetStoreError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Where a guard's fleet keeps its settings and its instances' heartbeats:
/// a follower's database (`bloom_guard_sqlx`'s followers join the guard
/// to theirs while they run). Implement it to share a guard's settings
/// through another store.
pub trait Fleet: Send + Sync + 'static {
    /// Stores the settings given in `change` for every instance of
    /// `guard`, leaving the others as stored.
    fn store<'a>(
        &'a self,
        guard: &'a str,
        change: Settings,
    ) -> BoxFuture<'a, Result<(), FleetStoreError>>;

    /// The settings stored for `guard`; those never stored (or reset) not
    /// given.
    fn settings<'a>(&'a self, guard: &'a str) -> BoxFuture<'a, Result<Settings, FleetStoreError>>;

    /// Forgets the settings stored for `guard`: every instance goes back
    /// to its builder's.
    fn reset<'a>(&'a self, guard: &'a str) -> BoxFuture<'a, Result<(), FleetStoreError>>;

    /// The instances of `guard` seen lately, as their last heartbeats
    /// reported them.
    fn instances<'a>(
        &'a self,
        guard: &'a str,
    ) -> BoxFuture<'a, Result<Vec<Instance>, FleetStoreError>>;
}

/// Why a setting was not changed, or the fleet not read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SettingsError {
    /// An audit rate that is not between 0 and 1: nothing was changed.
    #[error(transparent)]
    InvalidAuditRate(#[from] InvalidAuditRate),
    /// The fleet's database failed (unreachable, or the service's role may
    /// not use the fleet's tables): nothing was changed here.
    #[error("the fleet's settings or heartbeats cannot be read or stored")]
    Fleet(#[source] FleetStoreError),
}

/// One instance of a guard's fleet, as its last heartbeat reported it:
/// the rows of `GET /admin/bloom/{guard}/fleet`.
#[derive(Debug, Clone, PartialEq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default))]
#[non_exhaustive]
pub struct Instance {
    /// The instance's name: its host and process id unless configured.
    pub id: String,
    /// The version of bloom-guard it runs.
    pub version: String,
    /// Where its guard is in its life.
    pub state: GuardState,
    /// Why it does not protect, if it does not.
    pub reason: Option<String>,
    /// Its mode, and where that comes from.
    pub mode: Mode,
    /// Whether its mode is the fleet's, its default, or its own override.
    pub mode_set_by: SetBy,
    /// Its audit rate.
    pub audit_rate: f64,
    /// Filters put in place since it started.
    pub generation: u64,
    /// Where its filter in use came from.
    pub origin: Option<FilterOrigin>,
    /// Keys in its filter.
    pub keys: u64,
    /// Its filter's estimated false-positive rate.
    pub estimated_fpp: f64,
    /// The false-positive rate it is sized for.
    pub target_fpp: f64,
    /// Requests it passed on.
    pub passed: u64,
    /// Requests it answered as absent.
    pub rejected: u64,
    /// False negatives its shadow mode or audits caught: anything but 0
    /// is a defect to report.
    pub false_negatives: u64,
    /// Milliseconds since it last read the change feed, if it follows
    /// one: how far behind the database its filter may be.
    pub feed_age_ms: Option<u64>,
    /// Milliseconds since its heartbeat, by the database's clock.
    pub seen_ago_ms: u64,
}

impl Instance {
    /// The report of an instance named `id` whose guard has `stats`.
    pub fn new(id: impl Into<String>, stats: &Stats) -> Self {
        Self {
            id: id.into(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            state: stats.state,
            reason: stats.reason.clone(),
            mode: stats.mode,
            mode_set_by: stats.mode_set_by,
            audit_rate: stats.audit_rate,
            generation: stats.generation,
            origin: stats.origin,
            keys: stats.keys,
            estimated_fpp: stats.estimated_fpp,
            target_fpp: stats.target_fpp,
            passed: stats.passed,
            rejected: stats.rejected,
            false_negatives: stats.shadow_false_negatives,
            feed_age_ms: stats.feed.as_ref().map(|feed| feed.read_ago_ms),
            seen_ago_ms: 0,
        }
    }
}

/// This process's name in a fleet: `host:pid`.
///
/// ```
/// let id = bloom_guard::fleet::instance_id();
/// assert!(id.ends_with(&format!(":{}", std::process::id())));
/// ```
pub fn instance_id() -> String {
    let host = gethostname::gethostname();
    format!("{}:{}", host.to_string_lossy(), std::process::id())
}
