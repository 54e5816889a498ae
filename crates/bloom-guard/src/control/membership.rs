//! A guard's control state: its settings in three layers, the fleets it
//! joined, and the log line and gauge of every change of mode.

use std::sync::{Arc, Mutex};

use crate::control::fleet::Fleet;
use crate::lock::lock;
use crate::report::metrics::mode_in_force;
use crate::switches::mode::Mode;
use crate::switches::settings::{Change, Layers, SetBy, Settings};

/// A guard's fleet, in a slot `Debug` can show.
struct FleetSlot(Arc<dyn Fleet>);

impl std::fmt::Debug for FleetSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Fleet")
    }
}

/// The settings in force and the fleets joined, of one guard.
#[derive(Debug)]
pub(crate) struct Control {
    guard: &'static str,
    /// The mode and audit rate, by layer and in force.
    settings: Layers,
    /// The fleets the guard joined (its followers'), the last one in use.
    fleets: Mutex<Vec<FleetSlot>>,
}

impl Control {
    pub(crate) fn new(guard: &'static str, mode: Mode, audit_rate: f64) -> Self {
        Self {
            guard,
            settings: Layers::new(mode, audit_rate),
            fleets: Mutex::new(Vec::new()),
        }
    }

    #[inline]
    pub(crate) fn mode(&self) -> Mode {
        self.settings.mode()
    }

    #[inline]
    pub(crate) fn audit_rate(&self) -> f64 {
        self.settings.audit_rate()
    }

    /// Who set the mode and the audit rate in force.
    pub(crate) fn set_by(&self) -> (SetBy, SetBy) {
        self.settings.set_by()
    }

    /// The settings' epoch, for [`Self::apply_stored`].
    pub(crate) fn epoch(&self) -> u64 {
        self.settings.epoch()
    }

    /// Changes this instance's overrides.
    pub(crate) fn override_settings(&self, settings: Settings) {
        self.changed(self.settings.set_overrides(settings), SetBy::Instance);
    }

    /// Changes the fleet's settings from here.
    pub(crate) fn set_fleet_settings(&self, settings: Settings, replace: bool) {
        self.changed(self.settings.set_fleet(settings, replace), SetBy::Fleet);
    }

    /// Puts the fleet's stored settings in force, unless they were changed
    /// from here since `epoch`.
    pub(crate) fn apply_stored(&self, settings: Settings, epoch: u64) {
        if let Some(change) = self.settings.apply_stored(settings, epoch) {
            self.changed(change, SetBy::Fleet);
        }
    }

    /// Drops this instance's overrides.
    pub(crate) fn clear_overrides(&self) {
        let change = self.settings.clear_overrides();
        self.changed(change, self.settings.set_by().0);
    }

    fn changed(&self, change: Change, by: SetBy) {
        let Change { from, to } = change;
        if from != to {
            mode_in_force(self.guard, to);
            tracing::info!(guard = self.guard, %from, %to, by = by.as_str(), "guard mode changed");
        }
    }

    /// The fleet the guard belongs to, if it joined one: the last joined.
    pub(crate) fn fleet(&self) -> Option<Arc<dyn Fleet>> {
        lock(&self.fleets).last().map(|slot| Arc::clone(&slot.0))
    }

    pub(crate) fn join_fleet(&self, fleet: Arc<dyn Fleet>) {
        lock(&self.fleets).push(FleetSlot(fleet));
    }

    /// Leaves `fleet`; the guard stays in the others it joined.
    pub(crate) fn leave_fleet(&self, fleet: &Arc<dyn Fleet>) {
        let mut fleets = lock(&self.fleets);
        if let Some(at) = fleets
            .iter()
            .rposition(|joined| Arc::ptr_eq(&joined.0, fleet))
        {
            fleets.remove(at);
        }
    }
}
