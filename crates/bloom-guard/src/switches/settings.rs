//! What an operator switches at run time, the mode and the audit rate, in
//! three layers: the builder's default, the fleet's (stored in the
//! database, the same on every instance) and this instance's override.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Mutex;

use crate::lock::lock;
use crate::switches::mode::Mode;

/// Where a setting in force comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "lowercase"))]
pub enum SetBy {
    /// The [builder](crate::Builder::mode) (the example: `BLOOM_MODE`):
    /// nothing was set at run time.
    #[default]
    Default,
    /// Set for the fleet ([`BloomGuard::set_settings`](crate::BloomGuard::set_settings)):
    /// stored in the database by a follower, so that every instance applies
    /// it, also those started later. A guard without a follower is a fleet
    /// of one.
    Fleet,
    /// Overridden on this instance only
    /// ([`BloomGuard::override_settings`](crate::BloomGuard::override_settings)),
    /// whatever the fleet's setting.
    Instance,
}

impl SetBy {
    /// `default`, `fleet` or `instance`.
    pub fn as_str(self) -> &'static str {
        match self {
            SetBy::Default => "default",
            SetBy::Fleet => "fleet",
            SetBy::Instance => "instance",
        }
    }
}

/// A change of a guard's run-time settings, or the settings a fleet has
/// stored: each one is either given or left as it is.
///
/// # Example
///
/// ```
/// use bloom_guard::{Mode, settings::Settings};
///
/// let rollout = Settings::new().mode(Mode::Enforce).audit_rate(0.001);
/// assert_eq!(rollout.get_mode(), Some(Mode::Enforce));
/// assert_eq!(Settings::new().get_audit_rate(), None);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Settings {
    mode: Option<Mode>,
    audit_rate: Option<f64>,
}

impl Settings {
    /// No setting given.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the [`Mode`].
    #[must_use]
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = Some(mode);
        self
    }

    /// Sets the [audit rate](crate::Builder::audit_rate), between 0 and 1
    /// (checked where the settings are applied).
    #[must_use]
    pub fn audit_rate(mut self, rate: f64) -> Self {
        self.audit_rate = Some(rate);
        self
    }

    /// The mode given, if any.
    pub fn get_mode(&self) -> Option<Mode> {
        self.mode
    }

    /// The audit rate given, if any.
    pub fn get_audit_rate(&self) -> Option<f64> {
        self.audit_rate
    }

    /// Whether no setting is given.
    pub fn is_empty(&self) -> bool {
        self.mode.is_none() && self.audit_rate.is_none()
    }

    /// An error if the audit rate given is not between 0 and 1.
    pub(crate) fn check(&self) -> Result<(), InvalidAuditRate> {
        match self.audit_rate {
            Some(rate) if !(0.0..=1.0).contains(&rate) => Err(InvalidAuditRate(rate)),
            _ => Ok(()),
        }
    }

    /// `self`'s settings, and `under`'s where `self` gives none.
    fn or(self, under: Settings) -> Settings {
        Settings {
            mode: self.mode.or(under.mode),
            audit_rate: self.audit_rate.or(under.audit_rate),
        }
    }
}

/// An audit rate that is not between 0 and 1.
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
#[error("the audit rate must be between 0 and 1, got {0}")]
pub struct InvalidAuditRate(pub f64);

/// The layers' places, lowest first.
const DEFAULT: usize = 0;
const FLEET: usize = 1;
const INSTANCE: usize = 2;

/// The layers, and the settings in force read by every request.
#[derive(Debug)]
pub(crate) struct Layers {
    /// The mode in force, as `Mode::to_u8`.
    mode: AtomicU8,
    /// The audit rate in force, as `f64::to_bits`.
    audit_rate: AtomicU64,
    /// The builder's, the fleet's, this instance's.
    layers: Mutex<[Settings; 3]>,
    /// Changes of the fleet's layer made here: a read of the stored
    /// settings that started before one is stale.
    epoch: AtomicU64,
}

/// What changed when a layer changed: the mode before and after.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Change {
    pub(crate) from: Mode,
    pub(crate) to: Mode,
}

impl Layers {
    pub(crate) fn new(mode: Mode, audit_rate: f64) -> Self {
        Self {
            mode: AtomicU8::new(mode.to_u8()),
            audit_rate: AtomicU64::new(audit_rate.to_bits()),
            layers: Mutex::new([
                Settings::new().mode(mode).audit_rate(audit_rate),
                Settings::new(),
                Settings::new(),
            ]),
            epoch: AtomicU64::new(0),
        }
    }

    /// The count of the fleet's settings changed from here, for
    /// [`apply_stored`](Self::apply_stored).
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Changes the fleet's layer from here.
    pub(crate) fn set_fleet(&self, settings: Settings, replace: bool) -> Change {
        let mut layers = lock(&self.layers);
        self.epoch.fetch_add(1, Ordering::AcqRel);
        self.apply(&mut layers, FLEET, settings, replace)
    }

    /// Puts the stored `settings`, read after [`epoch`](Self::epoch) gave
    /// `epoch`, in force, unless the fleet's settings were changed from
    /// here since: the read may predate the change.
    pub(crate) fn apply_stored(&self, settings: Settings, epoch: u64) -> Option<Change> {
        let mut layers = lock(&self.layers);
        (self.epoch.load(Ordering::Acquire) == epoch)
            .then(|| self.apply(&mut layers, FLEET, settings, true))
    }

    #[inline]
    pub(crate) fn mode(&self) -> Mode {
        Mode::from_u8(self.mode.load(Ordering::Relaxed))
    }

    #[inline]
    pub(crate) fn audit_rate(&self) -> f64 {
        f64::from_bits(self.audit_rate.load(Ordering::Relaxed))
    }

    /// Which layer the mode and the audit rate in force come from.
    pub(crate) fn set_by(&self) -> (SetBy, SetBy) {
        let layers = lock(&self.layers);
        let top = |given: fn(&Settings) -> bool| {
            if given(&layers[INSTANCE]) {
                SetBy::Instance
            } else if given(&layers[FLEET]) {
                SetBy::Fleet
            } else {
                SetBy::Default
            }
        };
        (top(|s| s.mode.is_some()), top(|s| s.audit_rate.is_some()))
    }

    /// Changes this instance's overrides: the settings given.
    pub(crate) fn set_overrides(&self, settings: Settings) -> Change {
        let mut layers = lock(&self.layers);
        self.apply(&mut layers, INSTANCE, settings, false)
    }

    /// Changes layer `slot` (`replace`: to exactly `settings`; otherwise
    /// only the settings given) and puts what is then in force in place.
    fn apply(
        &self,
        layers: &mut [Settings; 3],
        slot: usize,
        settings: Settings,
        replace: bool,
    ) -> Change {
        layers[slot] = if replace {
            settings
        } else {
            settings.or(layers[slot])
        };
        let in_force = layers[INSTANCE].or(layers[FLEET]).or(layers[DEFAULT]);
        let from = self.mode();
        let to = in_force.mode.unwrap_or(from);
        self.mode.store(to.to_u8(), Ordering::Relaxed);
        if let Some(rate) = in_force.audit_rate {
            self.audit_rate.store(rate.to_bits(), Ordering::Relaxed);
        }
        Change { from, to }
    }

    /// Drops this instance's overrides.
    pub(crate) fn clear_overrides(&self) -> Change {
        let mut layers = lock(&self.layers);
        self.apply(&mut layers, INSTANCE, Settings::new(), true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_override_wins_over_the_fleet_which_wins_over_the_default() {
        let layers = Layers::new(Mode::Shadow, 0.0);
        assert_eq!(layers.set_by(), (SetBy::Default, SetBy::Default));
        layers.set_fleet(Settings::new().mode(Mode::Enforce), true);
        assert_eq!(
            (layers.mode(), layers.set_by().0),
            (Mode::Enforce, SetBy::Fleet)
        );
        layers.set_overrides(Settings::new().mode(Mode::Off));
        layers.set_fleet(Settings::new().mode(Mode::Shadow).audit_rate(0.5), true);
        assert_eq!(layers.mode(), Mode::Off);
        assert_eq!(layers.set_by(), (SetBy::Instance, SetBy::Fleet));
        assert_eq!(layers.audit_rate(), 0.5);
        layers.clear_overrides();
        assert_eq!(
            (layers.mode(), layers.set_by().0),
            (Mode::Shadow, SetBy::Fleet)
        );
        // The fleet's settings deleted: the default again.
        layers.set_fleet(Settings::new(), true);
        assert_eq!((layers.mode(), layers.audit_rate()), (Mode::Shadow, 0.0));
        assert_eq!(layers.set_by(), (SetBy::Default, SetBy::Default));
    }

    #[test]
    fn a_stored_read_older_than_a_change_made_here_is_not_applied() {
        let layers = Layers::new(Mode::Enforce, 0.0);
        let before = layers.epoch();
        // The poll read `enforce`, the operator switched to `off` meanwhile.
        layers.set_fleet(Settings::new().mode(Mode::Off), false);
        assert!(layers
            .apply_stored(Settings::new().mode(Mode::Enforce), before)
            .is_none());
        assert_eq!(layers.mode(), Mode::Off);
        // The next read sees the change.
        let now = layers.epoch();
        assert!(layers
            .apply_stored(Settings::new().mode(Mode::Off), now)
            .is_some());
        assert_eq!(
            (layers.mode(), layers.set_by().0),
            (Mode::Off, SetBy::Fleet)
        );
    }

    #[test]
    fn a_change_of_one_setting_keeps_the_other() {
        let layers = Layers::new(Mode::Enforce, 0.0);
        layers.set_fleet(Settings::new().audit_rate(0.25), false);
        layers.set_fleet(Settings::new().mode(Mode::Shadow), false);
        assert_eq!((layers.mode(), layers.audit_rate()), (Mode::Shadow, 0.25));
        assert!(Settings::new().audit_rate(1.5).check().is_err());
        assert!(Settings::new().audit_rate(f64::NAN).check().is_err());
    }
}
