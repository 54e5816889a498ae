//! One shard of a counting filter's stage: a qfilter, made and stored.

use std::sync::Arc;

/// How many times each shard may double before it is full.
pub(crate) const GROWTH_ROOM: u64 = 4;

/// One shard, shared: a snapshot holds the shards of one moment while the
/// feed goes on changing the filter, and a shard changed meanwhile is
/// copied first (`Arc::make_mut`), so only the shards that change are ever
/// held twice. A snapshot stores each as qfilter's bytes (postcard).
pub(crate) type Shard = Arc<qfilter::Filter>;

/// A shard that a snapshot carries could not be read.
#[derive(Debug, thiserror::Error)]
#[error("a shard of the counting filter does not decode: {0}")]
pub(crate) struct ShardError(pub(crate) String);

/// One shard: `capacity` keys at a quarter of `rate`, growing in place
/// to [`GROWTH_ROOM`] times that at `rate`. A shard's capacity and rate
/// are within qfilter's bounds by construction (at most a few million
/// keys, a rate of at least `MIN_RATE`); should a combination be refused
/// anyway, a shard without growth room, then one at the loosest rate,
/// which still never misses a key.
pub(super) fn new_shard(capacity: u64, rate: f64) -> qfilter::Filter {
    let grown = capacity.saturating_mul(GROWTH_ROOM);
    let mut tries = [
        (capacity, grown, rate),
        (capacity, capacity, rate),
        (capacity, capacity, 0.5),
        (1, 1, 0.5),
    ]
    .into_iter()
    .filter_map(|(initial, max, rate)| qfilter::Filter::new_resizeable(initial, max, rate).ok());
    tries
        .next()
        .unwrap_or_else(|| unreachable!("qfilter refuses a one-key filter"))
}

/// A shard's bytes in a snapshot.
pub(crate) fn encode_shard(shard: &qfilter::Filter) -> Vec<u8> {
    postcard::to_allocvec(shard).unwrap_or_default()
}

/// The length of [`encode_shard`]'s bytes, without writing them.
pub(crate) fn encoded_len(shard: &qfilter::Filter) -> usize {
    postcard::serialize_with_flavor::<_, postcard::ser_flavors::Size, usize>(
        shard,
        postcard::ser_flavors::Size::default(),
    )
    .unwrap_or(0)
}

/// A shard from a snapshot's bytes.
pub(crate) fn decode_shard(bytes: &[u8]) -> Result<Shard, ShardError> {
    postcard::from_bytes(bytes)
        .map(Arc::new)
        .map_err(|error| ShardError(error.to_string()))
}
