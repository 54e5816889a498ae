//! The session a URL asks for (`target_session_attrs`), what a server
//! answers about its own, and why a URL of several servers cannot be used.

use std::str::FromStr;

/// Why a URL of several servers cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServersError {
    /// The URL does not parse: write it as
    /// `postgres://user:password@host1:port1,host2:port2/database?target_session_attrs=read-write`.
    #[error("invalid Postgres URL: {0}")]
    Url(String),
    /// No server listed is the kind `target_session_attrs` asks for (or
    /// none answered); each server is named with what it answered.
    #[error("no server is {target}: {servers}")]
    NoneMatches {
        /// The `target_session_attrs` asked for.
        target: TargetSession,
        /// Each server and its answer.
        servers: String,
    },
}

/// The session a URL asks for (`target_session_attrs`), as libpq names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum TargetSession {
    /// The first server that answers (the default).
    #[default]
    Any,
    /// A server whose sessions may write (`read-write`).
    ReadWrite,
    /// A server whose sessions are read-only (`read-only`).
    ReadOnly,
    /// A server not in recovery (`primary`).
    Primary,
    /// A server in recovery (`standby`).
    Standby,
    /// A standby if one answers, any server otherwise (`prefer-standby`).
    PreferStandby,
}

impl FromStr for TargetSession {
    type Err = ServersError;

    fn from_str(value: &str) -> Result<Self, ServersError> {
        Ok(match value {
            "any" => Self::Any,
            "read-write" => Self::ReadWrite,
            "read-only" => Self::ReadOnly,
            "primary" => Self::Primary,
            "standby" => Self::Standby,
            "prefer-standby" => Self::PreferStandby,
            other => {
                return Err(ServersError::Url(format!(
                    "target_session_attrs={other:?} is none of any, read-write, read-only, primary, standby, prefer-standby"
                )))
            }
        })
    }
}

impl std::fmt::Display for TargetSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Any => "any",
            Self::ReadWrite => "read-write",
            Self::ReadOnly => "read-only",
            Self::Primary => "primary",
            Self::Standby => "standby",
            Self::PreferStandby => "prefer-standby",
        })
    }
}

/// What a server answered about its sessions.
#[derive(Debug, Clone, Copy)]
pub(super) struct Answer {
    pub(super) in_recovery: bool,
    pub(super) read_only: bool,
}

impl TargetSession {
    /// Whether a server that answered `answer` is one of this kind; a
    /// `prefer-standby` takes a standby on the first pass.
    pub(super) fn takes(self, answer: Answer) -> bool {
        match self {
            Self::Any => true,
            Self::ReadWrite => !answer.read_only,
            Self::ReadOnly => answer.read_only,
            Self::Primary => !answer.in_recovery,
            Self::Standby | Self::PreferStandby => answer.in_recovery,
        }
    }
}
