//! The follower's part in its guard's fleet: putting the settings stored
//! for every instance in force, and reporting this instance in a
//! heartbeat that the fleet view lists.

use std::sync::Arc;
use std::time::Duration;

use bloom_guard::{
    fleet::{Fleet, FleetStoreError, Instance},
    settings::Settings,
    Mode, Stats,
};
use futures_util::future::BoxFuture;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::{Database, Engine, FleetTable, Stores};
use crate::error::error_chain;

/// How often the stored settings are read: a change is in force on every
/// instance within this and a read.
pub(super) const SETTINGS_EVERY: Duration = Duration::from_secs(1);

/// How often a follower whose database announces changes of the stored
/// settings reads them anyway. An announcement reaches every listener; a
/// listener that reconnects reads the settings at once, so this only
/// bounds what nothing else can: a change made while a notification was
/// in flight on a connection that then broke.
const SETTINGS_FALLBACK: Duration = Duration::from_secs(30);

/// The shortest heartbeat interval.
const MIN_HEARTBEAT: Duration = Duration::from_millis(50);

/// The longest a heartbeat may wait: the fleet view forgets an instance
/// 30 s after its last one.
const MAX_HEARTBEAT: Duration = Duration::from_secs(10);

impl<B: Database> Engine<B> {
    /// Puts the fleet's settings in force every second and records a
    /// heartbeat at the heartbeat interval, or at once when the guard's
    /// state, mode or filter changed; runs until dropped.
    pub(super) async fn keep_in_fleet(self: Arc<Self>, announced: Arc<Notify>) {
        let heartbeat = self
            .schedule
            .heartbeat_interval
            .clamp(MIN_HEARTBEAT, MAX_HEARTBEAT);
        // The guard's own state is looked at every second (no query); the
        // stored settings are read when a change is announced, and every
        // `SETTINGS_FALLBACK` in case an announcement was lost.
        let mut ticks = tokio::time::interval(SETTINGS_EVERY.min(heartbeat));
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let read_every = if self.backend.announces_changes() {
            SETTINGS_FALLBACK
        } else {
            SETTINGS_EVERY
        };
        let mut last_read = Instant::now();
        let mut last_beat: Option<(Instant, Reported)> = None;
        let mut failing = false;
        loop {
            let announcement = tokio::select! {
                _ = ticks.tick() => false,
                () = announced.notified() => true,
            };
            // The first tick follows the read made before the first filter.
            // A read that failed (no rights yet, the database away) is
            // tried again every second: announcements may have been missed.
            let read_due = announcement || failing || last_read.elapsed() >= read_every;
            let mut result: Result<(), FleetStoreError> = match last_beat {
                Some(_) if read_due => {
                    last_read = Instant::now();
                    self.guard.refresh_settings().await.map_err(Into::into)
                }
                _ => Ok(()),
            };
            let stats = self.guard.stats();
            let now = Reported::of(&stats);
            let due = last_beat
                .as_ref()
                .is_none_or(|(at, reported)| *reported != now || at.elapsed() >= heartbeat);
            if due {
                last_beat = Some((Instant::now(), now));
                result = result.and(self.beat(&stats).await.map_err(Into::into));
            }
            match result {
                Err(error) if !failing => {
                    failing = true;
                    tracing::warn!(error = %error_chain(&*error), "cannot read the fleet's settings or record this instance's heartbeat; the settings in force stay as they are (the service's role needs select, insert, update and delete on the fleet's tables: see the feed's docs)");
                }
                Err(_) => {}
                Ok(()) if failing => {
                    failing = false;
                    tracing::info!("the fleet's settings and heartbeats are back");
                }
                Ok(()) => {}
            }
        }
    }

    /// Records this instance's heartbeat, its guard's `stats`.
    async fn beat(&self, stats: &Stats) -> Result<(), sqlx::Error> {
        let report = Instance::new(self.schedule.instance_id.clone(), stats);
        let report =
            serde_json::to_string(&report).map_err(|error| sqlx::Error::Encode(error.into()))?;
        self.backend
            .stores()
            .fleet()
            .beat(self.guard.name(), &self.schedule.instance_id, report)
            .await
    }

    /// Takes this instance out of the fleet view: it stops.
    pub(super) async fn leave(&self) {
        let leaving = self
            .backend
            .stores()
            .fleet()
            .leave(self.guard.name(), &self.schedule.instance_id);
        match tokio::time::timeout(Duration::from_secs(2), leaving).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => {
                tracing::debug!(error = %error_chain(&error), "cannot remove this instance's heartbeat; it expires");
            }
            Err(_) => {
                tracing::debug!("removing this instance's heartbeat took too long; it expires");
            }
        }
    }
}

/// What a heartbeat is recorded for at once when it changes.
#[derive(PartialEq)]
struct Reported {
    state: bloom_guard::stats::GuardState,
    mode: Mode,
    generation: u64,
    audit_rate: f64,
}

impl Reported {
    fn of(stats: &Stats) -> Self {
        Self {
            state: stats.state,
            mode: stats.mode,
            generation: stats.generation,
            audit_rate: stats.audit_rate,
        }
    }
}

/// A guard's fleet as its follower's database keeps it.
pub(super) struct Link<F>(pub(super) F);

impl<F: FleetTable> Fleet for Link<F> {
    fn store<'a>(
        &'a self,
        guard: &'a str,
        change: Settings,
    ) -> BoxFuture<'a, Result<(), FleetStoreError>> {
        Box::pin(async move {
            let mode = change.get_mode().map(Mode::as_str);
            self.0.store(guard, mode, change.get_audit_rate()).await?;
            Ok(())
        })
    }

    fn settings<'a>(&'a self, guard: &'a str) -> BoxFuture<'a, Result<Settings, FleetStoreError>> {
        Box::pin(async move {
            let (mode, audit_rate) = self.0.settings(guard).await?;
            let mut settings = Settings::new();
            match mode.as_deref().map(str::parse::<Mode>) {
                Some(Ok(mode)) => settings = settings.mode(mode),
                Some(Err(error)) => tracing::warn!(%error, "ignoring the fleet's stored mode"),
                None => {}
            }
            if let Some(rate) = audit_rate {
                settings = settings.audit_rate(rate);
            }
            Ok(settings)
        })
    }

    fn reset<'a>(&'a self, guard: &'a str) -> BoxFuture<'a, Result<(), FleetStoreError>> {
        Box::pin(async move { Ok(self.0.reset(guard).await?) })
    }

    fn instances<'a>(
        &'a self,
        guard: &'a str,
    ) -> BoxFuture<'a, Result<Vec<Instance>, FleetStoreError>> {
        Box::pin(async move {
            let rows = self.0.instances(guard).await?;
            Ok(rows
                .into_iter()
                .filter_map(|(report, seen_ago_ms)| {
                    match serde_json::from_str::<Instance>(&report) {
                        Ok(mut instance) => {
                            instance.seen_ago_ms = u64::try_from(seen_ago_ms).unwrap_or(0);
                            Some(instance)
                        }
                        Err(error) => {
                            tracing::warn!(%error, "skipping a heartbeat this version cannot read");
                            None
                        }
                    }
                })
                .collect())
        })
    }
}
