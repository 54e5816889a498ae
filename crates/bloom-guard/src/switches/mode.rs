//! What a guard does with its verdicts: enforce them, only watch them, or
//! nothing.

use std::fmt;
use std::str::FromStr;

/// How a guard acts on requests for keys its filter does not hold.
///
/// Switch at run time with [`BloomGuard::set_mode`](crate::BloomGuard::set_mode),
/// on every instance of the fleet, or with
/// [`BloomGuard::override_settings`](crate::BloomGuard::override_settings)
/// on one (the admin API: `PUT /admin/bloom/{guard}/mode`).
///
/// Start in `Shadow`: the guard decides every request and counts the ones
/// it would reject ([`Stats::shadow_would_reject`](crate::Stats::shadow_would_reject)),
/// but passes them all on and looks at the answer: an answer that says
/// found (a 2xx or 3xx unless
/// [`Builder::found_when`](crate::Builder::found_when) says otherwise) for
/// a key it would have rejected is a false negative caught before it could hurt
/// ([`Stats::shadow_false_negatives`](crate::Stats::shadow_false_negatives)).
/// Once that count stays at 0, switch to `Enforce`. The guide below takes
/// a fleet through it.
///
/// # Example
///
/// ```
/// use bloom_guard::{BloomGuard, Mode};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), bloom_guard::settings::SettingsError> {
/// let guard = BloomGuard::builder().mode(Mode::Shadow).build();
/// assert_eq!(guard.mode(), Mode::Shadow);
/// guard.set_mode("enforce".parse().expect("a mode")).await?;
/// assert_eq!(guard.mode(), Mode::Enforce);
/// # Ok(()) }
/// ```
///
#[doc = include_str!("../../docs/rollout.md")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "lowercase"))]
pub enum Mode {
    /// Answer absent keys (the default), auditing a sample if
    /// [`Builder::audit_rate`](crate::Builder::audit_rate) says so.
    #[default]
    Enforce,
    /// Decide and count, pass every request on, and check the answers of
    /// the ones that would have been rejected.
    Shadow,
    /// Pass every request on, unchecked and uncounted.
    Off,
}

impl Mode {
    /// `enforce`, `shadow` or `off`.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Enforce => "enforce",
            Mode::Shadow => "shadow",
            Mode::Off => "off",
        }
    }

    pub(crate) fn to_u8(self) -> u8 {
        match self {
            Mode::Enforce => 0,
            Mode::Shadow => 1,
            Mode::Off => 2,
        }
    }

    pub(crate) fn from_u8(value: u8) -> Self {
        match value {
            1 => Mode::Shadow,
            2 => Mode::Off,
            _ => Mode::Enforce,
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A mode name that is none of `enforce`, `shadow`, `off`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown mode {0:?}: use enforce, shadow or off")]
pub struct UnknownMode(String);

impl FromStr for Mode {
    type Err = UnknownMode;

    fn from_str(name: &str) -> Result<Self, UnknownMode> {
        match name.to_ascii_lowercase().as_str() {
            "enforce" => Ok(Mode::Enforce),
            "shadow" => Ok(Mode::Shadow),
            "off" => Ok(Mode::Off),
            _ => Err(UnknownMode(name.to_owned())),
        }
    }
}
