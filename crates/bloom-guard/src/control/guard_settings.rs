//! `BloomGuard`'s run-time settings and its fleet: switching the mode and
//! the audit rate for every instance or for this one, and listing the
//! fleet's instances.

use std::sync::Arc;

use crate::control::fleet::{instance_id, Fleet, FleetStoreError, Instance, SettingsError};
use crate::handle::feed::FeedHandle;
use crate::handle::guard::BloomGuard;
use crate::switches::mode::Mode;
use crate::switches::settings::{InvalidAuditRate, Settings};

/// The guard's membership of a fleet, from
/// [`FeedHandle::join_fleet`](crate::feed::FeedHandle::join_fleet): it leaves
/// when dropped.
#[must_use = "the guard leaves the fleet when this is dropped"]
pub struct Membership {
    pub(crate) shared: Arc<crate::handle::shared::Shared>,
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
        self.shared.control.leave_fleet(&self.fleet);
    }
}

/// Run-time settings and the fleet.
impl BloomGuard {
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
    /// use bloom_guard::{BloomGuard, Mode, settings::{SetBy, Settings}};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), bloom_guard::settings::SettingsError> {
    /// let guard = BloomGuard::builder().mode(Mode::Shadow).build();
    /// guard.set_settings(Settings::new().mode(Mode::Enforce).audit_rate(0.001)).await?;
    /// let stats = guard.stats();
    /// assert_eq!((stats.mode, stats.mode_set_by), (Mode::Enforce, SetBy::Fleet));
    /// assert_eq!(stats.audit_rate, 0.001);
    /// # Ok(()) }
    /// ```
    pub async fn set_settings(&self, change: Settings) -> Result<(), SettingsError> {
        change.check()?;
        if let Some(fleet) = self.shared.control.fleet() {
            fleet.store(self.name(), change).await.map_err(|error| {
                self.fleet_failed(
                    "cannot store the fleet's settings; nothing changed here",
                    error,
                )
            })?;
        }
        self.shared.control.set_fleet_settings(change, false);
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
        if let Some(fleet) = self.shared.control.fleet() {
            fleet.reset(self.name()).await.map_err(|error| {
                self.fleet_failed(
                    "cannot reset the fleet's settings; nothing changed here",
                    error,
                )
            })?;
        }
        self.shared
            .control
            .set_fleet_settings(Settings::new(), true);
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
        let Some(fleet) = self.shared.control.fleet() else {
            return Ok(());
        };
        let epoch = self.shared.control.epoch();
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
        self.shared.control.apply_stored(stored, epoch);
        Ok(())
    }

    fn fleet_failed(&self, what: &'static str, error: FleetStoreError) -> SettingsError {
        tracing::warn!(guard = self.name(), error = %crate::error::error_chain(&*error), "{what}");
        SettingsError::Fleet(error)
    }

    /// Overrides the settings given in `change` on this instance only,
    /// whatever the fleet's; [`clear_overrides`](Self::clear_overrides)
    /// returns to the fleet's. The stats show them as
    /// [`SetBy::Instance`](crate::settings::SetBy::Instance).
    ///
    /// # Errors
    ///
    /// [`InvalidAuditRate`]; nothing changed then.
    ///
    /// # Example
    ///
    /// ```
    /// use bloom_guard::{BloomGuard, Mode, settings::{SetBy, Settings}};
    ///
    /// let guard = BloomGuard::builder().build();
    /// guard.override_settings(Settings::new().mode(Mode::Off)).expect("a valid change");
    /// assert_eq!(guard.stats().mode_set_by, SetBy::Instance);
    /// guard.clear_overrides();
    /// assert_eq!((guard.mode(), guard.stats().mode_set_by), (Mode::Enforce, SetBy::Default));
    /// ```
    pub fn override_settings(&self, change: Settings) -> Result<(), InvalidAuditRate> {
        change.check()?;
        self.shared.control.override_settings(change);
        Ok(())
    }

    /// Drops this instance's [overrides](Self::override_settings): the
    /// fleet's settings, or the default, are in force again.
    pub fn clear_overrides(&self) {
        self.shared.control.clear_overrides();
    }

    /// The live instances of the guard's fleet (heard from in the last
    /// 30 s), by id; without a fleet, this one as
    /// [`instance_id`](crate::fleet::instance_id) names it.
    ///
    /// # Errors
    ///
    /// [`SettingsError::Fleet`] if the fleet's database failed.
    pub async fn fleet(&self) -> Result<Vec<Instance>, SettingsError> {
        match self.shared.control.fleet() {
            Some(fleet) => fleet.instances(self.name()).await.map_err(|error| {
                tracing::warn!(guard = self.name(), error = %crate::error::error_chain(&*error), "cannot list the fleet's instances");
                SettingsError::Fleet(error)
            }),
            None => Ok(vec![Instance::new(instance_id(), &self.stats())]),
        }
    }
}

impl FeedHandle<'_> {
    /// Makes `fleet` where [`set_settings`](BloomGuard::set_settings) stores
    /// the settings and [`fleet`](BloomGuard::fleet) lists the instances, until
    /// the membership is dropped. A follower joins its database's fleet
    /// while it runs.
    pub fn join_fleet(self, fleet: Arc<dyn Fleet>) -> Membership {
        self.guard.shared.control.join_fleet(Arc::clone(&fleet));
        Membership {
            shared: Arc::clone(&self.guard.shared),
            fleet,
        }
    }
}
