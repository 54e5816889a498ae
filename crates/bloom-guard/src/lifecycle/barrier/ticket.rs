//! What a request waits for: per follower, the first read to begin after
//! it arrived.

/// What a request waits for: the first read to begin after it arrived, of
/// every follower.
#[derive(Debug)]
pub(crate) struct Ticket {
    /// Nanoseconds after the barrier's epoch.
    pub(super) arrived: u64,
    pub(super) reads: Reads,
    /// Whether the followers were asked for the reads.
    pub(super) asked: bool,
}

/// The read each follower owes a request, by slot id.
#[derive(Debug)]
pub(super) enum Reads {
    None,
    One(u64, u64),
    Many(Vec<(u64, u64)>),
}

impl Reads {
    pub(super) fn of(&self, id: u64) -> Option<u64> {
        match self {
            Self::None => None,
            Self::One(slot, read) => (*slot == id).then_some(*read),
            Self::Many(reads) => reads
                .iter()
                .find_map(|(slot, read)| (*slot == id).then_some(*read)),
        }
    }

    pub(super) fn push(&mut self, id: u64, read: u64) {
        *self = match std::mem::replace(self, Self::None) {
            Self::None => Self::One(id, read),
            Self::One(slot, first) => Self::Many(vec![(slot, first), (id, read)]),
            Self::Many(mut reads) => {
                reads.push((id, read));
                Self::Many(reads)
            }
        };
    }
}
