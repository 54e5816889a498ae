//! The fleet: every instance of a service running one guard, sharing
//! settings and reporting to each other through a database.

use std::sync::Arc;

use futures_util::future::BoxFuture;

use crate::mode::Mode;
use crate::settings::{InvalidAuditRate, SetBy, Settings};
use crate::stats::{FilterOrigin, GuardState, Stats};

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
/// let id = bloom_guard::instance_id();
/// assert!(id.ends_with(&format!(":{}", std::process::id())));
/// ```
pub fn instance_id() -> String {
    let host = gethostname::gethostname();
    format!("{}:{}", host.to_string_lossy(), std::process::id())
}

/// The guard's membership of a fleet, from
/// [`BloomGuard::join_fleet`](crate::BloomGuard::join_fleet): it leaves
/// when dropped.
#[must_use = "the guard leaves the fleet when this is dropped"]
pub struct Membership {
    pub(crate) shared: Arc<crate::shared::Shared>,
    pub(crate) fleet: Arc<dyn Fleet>,
}

impl std::fmt::Debug for Membership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Membership")
            .field("guard", &self.shared.config.name)
            .finish_non_exhaustive()
    }
}

impl Drop for Membership {
    fn drop(&mut self) {
        self.shared.leave_fleet(&self.fleet);
    }
}

/// Run-time settings and the fleet.
impl crate::guard::BloomGuard {
    /// Switches the guard's [`Mode`] on every instance of its fleet: see
    /// [`set_settings`](Self::set_settings).
    ///
    /// # Errors
    ///
    /// As [`set_settings`](Self::set_settings).
    pub async fn set_mode(&self, mode: Mode) -> Result<(), SettingsError> {
        self.set_settings(Settings::new().mode(mode)).await
    }

    /// Sets the guard's [audit rate](crate::Builder::audit_rate) on every
    /// instance of its fleet: see [`set_settings`](Self::set_settings).
    ///
    /// # Errors
    ///
    /// As [`set_settings`](Self::set_settings).
    pub async fn set_audit_rate(&self, rate: f64) -> Result<(), SettingsError> {
        self.set_settings(Settings::new().audit_rate(rate)).await
    }

    /// Changes the settings given in `change` on every instance of the
    /// guard's fleet, and on this one at once.
    ///
    /// With a follower running, the settings are stored in its database
    /// and every instance applies them within 2 s, also instances started
    /// later, whose [builder's](crate::Builder::mode) settings are only the
    /// default until settings are stored. Without one, they apply to this
    /// instance (a fleet of one). An instance's own
    /// [override](Self::override_settings) stays in force over them.
    ///
    /// # Errors
    ///
    /// [`SettingsError::InvalidAuditRate`], or [`SettingsError::Fleet`]
    /// if the fleet's database failed; nothing changed then, here or
    /// anywhere.
    ///
    /// # Example
    ///
    /// ```
    /// use bloom_guard::{BloomGuard, Mode, SetBy, Settings};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), bloom_guard::SettingsError> {
    /// let guard = BloomGuard::builder().mode(Mode::Shadow).build();
    /// guard.set_settings(Settings::new().mode(Mode::Enforce).audit_rate(0.001)).await?;
    /// let stats = guard.stats();
    /// assert_eq!((stats.mode, stats.mode_set_by), (Mode::Enforce, SetBy::Fleet));
    /// assert_eq!(stats.audit_rate, 0.001);
    /// # Ok(()) }
    /// ```
    pub async fn set_settings(&self, change: Settings) -> Result<(), SettingsError> {
        change.check()?;
        if let Some(fleet) = self.shared.fleet() {
            fleet.store(self.name(), change).await.map_err(|error| {
                self.fleet_failed(
                    "cannot store the fleet's settings; nothing changed here",
                    error,
                )
            })?;
        }
        self.shared.set_fleet_settings(change, false);
        Ok(())
    }

    /// Forgets the settings stored for the guard's fleet: every instance
    /// goes back to its builder's (the example: `BLOOM_MODE`) within 2 s,
    /// this one at once. Overrides stay.
    ///
    /// # Errors
    ///
    /// [`SettingsError::Fleet`] if the fleet's database failed.
    pub async fn reset_settings(&self) -> Result<(), SettingsError> {
        if let Some(fleet) = self.shared.fleet() {
            fleet.reset(self.name()).await.map_err(|error| {
                self.fleet_failed(
                    "cannot reset the fleet's settings; nothing changed here",
                    error,
                )
            })?;
        }
        self.shared.set_fleet_settings(Settings::new(), true);
        Ok(())
    }

    /// Reads the settings stored for the guard's fleet and puts them in
    /// force (those not stored: the builder's): a follower calls it every
    /// second. A change made here meanwhile wins over what was read. If the
    /// read fails, the settings in force stay.
    ///
    /// # Errors
    ///
    /// [`SettingsError::Fleet`] if the fleet's database failed (not
    /// logged: the caller knows how often it retries).
    pub async fn refresh_settings(&self) -> Result<(), SettingsError> {
        let Some(fleet) = self.shared.fleet() else {
            return Ok(());
        };
        let epoch = self.shared.settings.epoch();
        let stored = fleet
            .settings(self.name())
            .await
            .map_err(SettingsError::Fleet)?;
        let stored = match stored.check() {
            Ok(()) => stored,
            Err(error) => {
                tracing::warn!(guard = self.name(), %error, "ignoring the fleet's stored audit rate");
                stored
                    .get_mode()
                    .map_or_else(Settings::new, |mode| Settings::new().mode(mode))
            }
        };
        self.shared.apply_stored_settings(stored, epoch);
        Ok(())
    }

    fn fleet_failed(&self, what: &'static str, error: FleetStoreError) -> SettingsError {
        tracing::warn!(guard = self.name(), error = %crate::error::error_chain(&*error), "{what}");
        SettingsError::Fleet(error)
    }

    /// Overrides the settings given in `change` on this instance only,
    /// whatever the fleet's; [`clear_overrides`](Self::clear_overrides)
    /// returns to the fleet's. The stats show them as
    /// [`SetBy::Instance`].
    ///
    /// # Errors
    ///
    /// [`InvalidAuditRate`]; nothing changed then.
    ///
    /// # Example
    ///
    /// ```
    /// use bloom_guard::{BloomGuard, Mode, SetBy, Settings};
    ///
    /// let guard = BloomGuard::builder().build();
    /// guard.override_settings(Settings::new().mode(Mode::Off)).expect("a valid change");
    /// assert_eq!(guard.stats().mode_set_by, SetBy::Instance);
    /// guard.clear_overrides();
    /// assert_eq!((guard.mode(), guard.stats().mode_set_by), (Mode::Enforce, SetBy::Default));
    /// ```
    pub fn override_settings(&self, change: Settings) -> Result<(), InvalidAuditRate> {
        change.check()?;
        self.shared.override_settings(change);
        Ok(())
    }

    /// Drops this instance's [overrides](Self::override_settings): the
    /// fleet's settings, or the default, are in force again.
    pub fn clear_overrides(&self) {
        self.shared.clear_overrides();
    }

    /// Makes `fleet` where [`set_settings`](Self::set_settings) stores
    /// the settings and [`fleet`](Self::fleet) lists the instances, until
    /// the membership is dropped. A follower joins its database's fleet
    /// while it runs.
    pub fn join_fleet(&self, fleet: Arc<dyn Fleet>) -> Membership {
        self.shared.join_fleet(Arc::clone(&fleet));
        Membership {
            shared: Arc::clone(&self.shared),
            fleet,
        }
    }

    /// The live instances of the guard's fleet (heard from in the last
    /// 30 s), by id; without a fleet, this one as
    /// [`instance_id`](crate::instance_id) names it.
    ///
    /// # Errors
    ///
    /// [`SettingsError::Fleet`] if the fleet's database failed.
    pub async fn fleet(&self) -> Result<Vec<Instance>, SettingsError> {
        match self.shared.fleet() {
            Some(fleet) => fleet.instances(self.name()).await.map_err(|error| {
                tracing::warn!(guard = self.name(), error = %crate::error::error_chain(&*error), "cannot list the fleet's instances");
                SettingsError::Fleet(error)
            }),
            None => Ok(vec![Instance::new(instance_id(), &self.stats())]),
        }
    }
}
