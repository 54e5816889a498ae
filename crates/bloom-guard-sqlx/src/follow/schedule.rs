//! The follower's schedule: how often it reads, checks, publishes and
//! reports, as the public followers' builders set it.

use std::time::Duration;

/// When the engine reads, checks, keeps and publishes; owned by the engine,
/// set once by the follower's builder before it runs.
#[derive(Debug, Clone)]
pub(crate) struct Schedule {
    /// The longest wait between two feed reads while no wake-up comes.
    pub(crate) poll_interval: Duration,
    /// The shortest gap between two reads of one follower.
    pub(crate) min_read_gap: Duration,
    /// How often the feed's triggers and the table are checked.
    pub(crate) check_interval: Duration,
    /// How long feed rows are kept before the fleet prunes them.
    pub(crate) retention: Duration,
    /// Whether snapshots are published and adopted.
    pub(crate) snapshots: bool,
    /// How often a snapshot is published.
    pub(crate) snapshot_interval: Duration,
    /// This instance's name in the fleet view.
    pub(crate) instance_id: String,
    /// How often this instance's heartbeat is recorded.
    pub(crate) heartbeat_interval: Duration,
}

impl Default for Schedule {
    fn default() -> Self {
        Self {
            poll_interval: Duration::from_secs(15),
            min_read_gap: Duration::from_millis(50),
            check_interval: Duration::from_secs(10),
            retention: Duration::from_secs(3600),
            snapshots: true,
            snapshot_interval: Duration::from_secs(600),
            instance_id: bloom_guard::fleet::instance_id(),
            heartbeat_interval: Duration::from_secs(10),
        }
    }
}
