//! The settings a guard's clones share.

use std::time::Duration;

use crate::keys::key_type::KeyType;
use crate::lifecycle::barrier::ReadPace;
use crate::request::found::Found;
use crate::request::response::CannedResponse;
use crate::switches::mode::Mode;

/// What [`Builder`](crate::Builder) sets; read by every other part.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub(crate) expected_items: u64,
    pub(crate) target_fpp: f64,
    pub(crate) headroom: f64,
    pub(crate) max_key_len: usize,
    pub(crate) refuse_long_keys: bool,
    pub(crate) key_type: KeyType,
    pub(crate) absent: CannedResponse,
    pub(crate) write_window: Duration,
    pub(crate) progress_interval: Duration,
    pub(crate) max_retry_delay: Duration,
    pub(crate) check_interval: Duration,
    pub(crate) rebuild_interval: Option<Duration>,
    pub(crate) rebuild_above: f64,
    pub(crate) compact_above: usize,
    pub(crate) name: &'static str,
    pub(crate) debug_header: bool,
    pub(crate) mode: Mode,
    pub(crate) audit_rate: f64,
    pub(crate) rebuild_on_false_negative: bool,
    /// How long a refusal waits for a feed read; `None`: no read barrier.
    pub(crate) read_barrier: Option<Duration>,
    /// How often followers read for waiting refusals.
    pub(crate) read_pace: ReadPace,
    /// Which answers mean the key exists, for shadow mode and the audits.
    pub(crate) found: Found,
    /// Whether a guard followed by a change feed builds counting filters,
    /// which forget deleted rows.
    pub(crate) forget_deleted: bool,
}

/// How long a refusal waits for the read barrier unless told.
pub(crate) const DEFAULT_READ_BARRIER: Duration = Duration::from_millis(200);

impl Default for Config {
    fn default() -> Self {
        Self {
            expected_items: 1000,
            target_fpp: 0.001,
            headroom: 0.25,
            max_key_len: 512,
            refuse_long_keys: false,
            key_type: KeyType::Text,
            absent: CannedResponse::not_found(),
            write_window: Duration::from_secs(60),
            progress_interval: Duration::from_secs(5),
            max_retry_delay: Duration::from_secs(30),
            check_interval: Duration::from_secs(10),
            rebuild_interval: None,
            rebuild_above: 2.0,
            compact_above: 4,
            name: "default",
            debug_header: false,
            mode: Mode::Enforce,
            audit_rate: 0.0,
            rebuild_on_false_negative: true,
            read_barrier: Some(DEFAULT_READ_BARRIER),
            read_pace: ReadPace::default(),
            found: Found::default(),
            forget_deleted: true,
        }
    }
}
