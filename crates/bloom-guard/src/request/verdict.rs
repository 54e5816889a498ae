//! What the guard decides for one request's key: the one place that turns
//! an extracted key into "pass", "absent" or a refusal.

use std::sync::Arc;

use http::{HeaderMap, StatusCode};

use crate::handle::shared::Shared;
use crate::keys::key::{Key, KeyError};
use crate::keys::key_type::KeyType;
use crate::lifecycle::barrier::{LookupKey, Lookups, Ticket};
use crate::request::response::CannedResponse;
use crate::switches::mode::Mode;

/// What the guard decided for one request.
pub(crate) enum Verdict<'a> {
    /// Pass it on.
    Pass,
    /// Pass it on, and check the answer: the filter said absent, but the
    /// guard is in shadow mode or the request was drawn for an audit. Holds
    /// the key in canonical form, for an [`AuditToken`].
    Audit(Box<[u8]>),
    /// Answer it as absent.
    Reject(&'a CannedResponse),
    /// Answer it as absent if a feed read that began after now does not
    /// bring the key (see [`Confirm`]).
    Confirm(Confirm),
    /// Answer it with the key's own error (an over-long key, when the
    /// guard refuses those).
    Refuse(KeyError),
}

/// Decides a request whose key the extractor read as `extracted`.
///
/// Only a key put in canonical form with certainty can be answered
/// "absent"; every other request goes on, counted by why.
pub(crate) fn decide<'s, 'k>(
    shared: &'s Shared,
    extract: impl FnOnce() -> Result<Option<Key<'k>>, KeyError>,
) -> Verdict<'s> {
    let mode = shared.control.mode();
    // Off: not even the key is read.
    if mode == Mode::Off {
        return Verdict::Pass;
    }
    let key = match extract() {
        Ok(Some(key)) => key,
        Ok(None) => return Verdict::Pass,
        Err(why) => {
            shared.counters.unchecked(&why);
            return Verdict::Pass;
        }
    };
    let max = shared.config.max_key_len;
    if key.len() > max {
        let why = KeyError::TooLong {
            len: key.len(),
            max,
        };
        if shared.config.refuse_long_keys {
            shared.counters.bad_key();
            return Verdict::Refuse(why);
        }
        shared.counters.unchecked(&why);
        return Verdict::Pass;
    }
    let key_type = shared.config.key_type;
    // A collation's weights are no text to look a key up by: a lookup
    // takes the request's own spelling.
    let spelling = matches!(key_type, KeyType::Collated(_)).then(|| key.clone());
    let key = match key_type.to_canonical(key) {
        Ok(key) => key,
        Err(why) => {
            shared.counters.unchecked(&why);
            return Verdict::Pass;
        }
    };
    if shared.may_contain(&key) {
        shared.counters.passed();
        return Verdict::Pass;
    }
    if mode == Mode::Shadow {
        shared.counters.shadow_would_reject();
    } else if audit(shared.control.audit_rate()) {
        shared.counters.audited();
    } else if shared.barrier.active() {
        let wait = match shared.barrier.lookups() {
            Some(lookups) => {
                Wait::Lookup(lookups, spelling.map(|spelling| spelling.as_bytes().into()))
            }
            None => Wait::Read(shared.barrier.ticket()),
        };
        return Verdict::Confirm(Confirm {
            key: key.as_bytes().into(),
            wait,
        });
    } else {
        shared.counters.rejected();
        return Verdict::Reject(&shared.config.absent);
    }
    Verdict::Audit(key.as_bytes().into())
}

/// A would-be refusal waiting for the read barrier: the key in canonical
/// form, and what it waits for.
#[derive(Debug)]
pub(crate) struct Confirm {
    key: Box<[u8]>,
    wait: Wait,
}

/// What a would-be refusal waits for.
#[derive(Debug)]
enum Wait {
    /// A feed read of every follower, begun after the request arrived.
    Read(Ticket),
    /// A lookup in every follower's table, begun after the request
    /// arrived; with the request's own spelling of the key, where the
    /// canonical form is not text to look it up by.
    Lookup(Vec<Arc<Lookups>>, Option<Box<[u8]>>),
}

impl Confirm {
    /// Whether the key is still absent once the filter holds every row
    /// committed before the request arrived, or the table itself says it
    /// held no row of it after the request arrived. `false` (pass it on)
    /// when the read or the lookup found the key, or when no answer came
    /// within the bound: a refusal never trusts a filter older than its
    /// request.
    pub(crate) async fn absent(self, shared: &Shared) -> bool {
        let (fresh, found) = match self.wait {
            Wait::Read(ticket) => {
                let fresh = shared.barrier.wait(ticket).await;
                (fresh, fresh && shared.may_contain(&Key::from(&*self.key)))
            }
            Wait::Lookup(lookups, spelling) => {
                let key = LookupKey::new(self.key, spelling);
                match shared.barrier.look_up(lookups, key).await {
                    Some(found) => (true, found),
                    None => (false, false),
                }
            }
        };
        shared.counters.barrier_wait(found, !fresh);
        if fresh && !found {
            shared.counters.rejected();
            true
        } else {
            shared.counters.passed();
            false
        }
    }
}

/// Whether to pass on and check this would-be rejection, one in
/// `1 / rate`.
#[inline]
fn audit(rate: f64) -> bool {
    rate > 0.0 && fastrand::f64() < rate
}

/// What checking the answer to an audited request takes: the guard's core,
/// the key the filter said was absent, and when the request came.
#[derive(Debug)]
pub(crate) struct AuditToken {
    shared: Arc<Shared>,
    key: Box<[u8]>,
    /// The reads enforce mode would have waited for; none without a
    /// barrier.
    ticket: Option<Ticket>,
}

impl AuditToken {
    pub(crate) fn new(shared: Arc<Shared>, key: Box<[u8]>) -> Self {
        // Noted now, as enforce mode would; the followers are asked for
        // the reads only if the answer says the key exists.
        let ticket = shared.barrier.active().then(|| shared.barrier.note());
        Self {
            shared,
            key,
            ticket,
        }
    }

    /// Records a false negative if the inner service's answer says the key
    /// exists ([`Builder::found_when`](crate::Builder::found_when)) and
    /// enforce mode would have refused it. With a read barrier, enforce mode
    /// waits for a feed read begun after the request: a key committed
    /// elsewhere a moment before is served, not refused, so it is checked
    /// the same way here, on a task of its own, off the response's path.
    pub(crate) fn report(self, status: StatusCode, headers: &HeaderMap) {
        if !self.shared.config.found.test(status, headers) {
            return;
        }
        let runtime = tokio::runtime::Handle::try_current();
        match runtime {
            Ok(runtime) if self.ticket.is_some() => {
                runtime.spawn(async move {
                    let Self {
                        shared,
                        key,
                        ticket,
                    } = self;
                    // Enforce mode passes a request whose read did not
                    // come (the database down, the followers stopped).
                    let Some(ticket) = ticket else { return };
                    let read = shared.barrier.wait(ticket).await;
                    if read && !shared.may_contain(&Key::from(&*key)) {
                        shared.record_false_negative(&key);
                    }
                });
            }
            _ => self.shared.record_false_negative(&self.key),
        }
    }
}
