//! Snapshots written, read back, damaged and refused.

use super::format::PREFIX_LEN;
use super::*;
use crate::{feed::AdoptError, keys::KeyBatch, BloomGuard, KeyList};

const QUERY: &str = "select key from items";

async fn built(keys: usize) -> (BloomGuard, Vec<String>) {
    let guard = BloomGuard::builder().name("items").build();
    let keys: Vec<String> = (0..keys).map(|i| format!("key-{i}")).collect();
    guard
        .rebuild(&KeyList::new(keys.clone()))
        .await
        .expect("build");
    (guard, keys)
}

fn bytes_of(guard: &BloomGuard, position: &str) -> Vec<u8> {
    guard
        .feed()
        .snapshot(&position.into(), QUERY)
        .expect("a complete filter")
        .chunks(4096)
        .flatten()
        .collect()
}

async fn adopt(snapshot: Snapshot) -> Result<BloomGuard, AdoptError> {
    let guard = BloomGuard::builder().name("items").build();
    guard
        .feed()
        .adopt(snapshot, QUERY, async { Ok::<(), std::io::Error>(()) })
        .await?;
    Ok(guard)
}

#[tokio::test]
async fn a_snapshot_read_in_any_chunks_is_the_same_filter() {
    let (guard, keys) = built(5_000).await;
    let writer = guard
        .feed()
        .snapshot(&"pos-1".into(), QUERY)
        .expect("complete");
    let len = writer.info().len;
    let chunks: Vec<Vec<u8>> = writer.chunks(1000).collect();
    assert!(chunks.iter().all(|chunk| chunk.len() <= 1000));
    let bytes: Vec<u8> = chunks.concat();
    assert_eq!(bytes.len() as u64, len);
    // Pushed in pieces that cut the header, words and checksum anywhere.
    for piece in [1, 3, 7, 8, 13, 4096, bytes.len()] {
        let mut reader = SnapshotReader::new(len);
        for part in bytes.chunks(piece) {
            reader.push(part).expect("intact");
        }
        let snapshot = reader.finish().expect("intact");
        assert_eq!(snapshot.info().position, "pos-1");
        assert_eq!(snapshot.info().guard, "items");
        let restored = adopt(snapshot).await.expect("adopted");
        assert!(keys.iter().all(|key| restored.may_contain(key)));
        assert_eq!(
            restored.stats().origin,
            Some(crate::stats::FilterOrigin::Snapshot)
        );
        // Counted from its bits too: within a hair of the original's count.
        let (restored_keys, keys) = (restored.stats().keys, guard.stats().keys);
        assert!(restored_keys >= keys && restored_keys <= keys + keys / 100);
        // Same seed and bits: the same answer for absent keys too.
        for i in 0..2_000 {
            let absent = format!("absent-{i}");
            assert_eq!(restored.may_contain(&absent), guard.may_contain(&absent));
        }
    }
}

#[tokio::test]
async fn every_flipped_byte_is_refused() {
    let (guard, _) = built(200).await;
    let bytes = bytes_of(&guard, "7");
    for at in (0..bytes.len()).step_by(7).chain([bytes.len() - 1]) {
        let mut damaged = bytes.clone();
        damaged[at] ^= 0x10;
        assert!(
            Snapshot::decode(&damaged).is_err(),
            "byte {at} flipped was accepted"
        );
    }
}

#[tokio::test]
async fn a_truncated_or_padded_snapshot_is_refused() {
    let (guard, _) = built(200).await;
    let bytes = bytes_of(&guard, "7");
    let writer = guard.feed().snapshot(&"7".into(), QUERY).expect("complete");
    let chunks: Vec<Vec<u8>> = writer.chunks(256).collect();
    // A chunk missing from the middle, then a chunk cut short.
    let mut without: Vec<u8> = Vec::new();
    for (i, chunk) in chunks.iter().enumerate() {
        if i != 2 {
            without.extend_from_slice(chunk);
        }
    }
    let mut reader = SnapshotReader::new(bytes.len() as u64);
    let refused = reader.push(&without).and_then(|()| reader.finish());
    assert!(refused.is_err());
    assert!(matches!(
        Snapshot::decode(&bytes[..bytes.len() - 10]),
        Err(SnapshotError::Length { .. })
    ));
    let mut padded = bytes.clone();
    padded.push(0);
    assert!(Snapshot::decode(&padded).is_err());
    let mut reader = SnapshotReader::new(bytes.len() as u64);
    reader.push(&bytes[..100]).expect("a prefix");
    assert!(matches!(reader.finish(), Err(SnapshotError::Length { .. })));
}

#[tokio::test]
async fn a_header_asking_for_any_size_is_refused_before_allocating() {
    let (guard, _) = built(10).await;
    let bytes = bytes_of(&guard, "7");
    // The first sub-filter's word count: after the prefix, key type,
    // seed, skipped keys, sub-filter count, and the sub-filter's hashes,
    // rate, capacity and keys.
    let at = PREFIX_LEN + 1 + 16 + 8 + 4 + 4 + 8 * 3;
    for words in [u64::MAX, u64::MAX / 8, 1 << 40, 0] {
        let mut hostile = bytes.clone();
        hostile[at..at + 8].copy_from_slice(&words.to_le_bytes());
        assert!(Snapshot::decode(&hostile).is_err(), "{words} words");
    }
    let mut hostile = bytes.clone();
    hostile[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
    assert_eq!(
        Snapshot::decode(&hostile).err(),
        Some(SnapshotError::Field("header length"))
    );
}

#[tokio::test]
async fn another_format_is_refused_by_name() {
    let (guard, _) = built(10).await;
    let mut bytes = bytes_of(&guard, "7");
    // Format 1, before filters grew sub-filters, and one from the future.
    for format in [1_u32, SNAPSHOT_FORMAT + 1] {
        bytes[8..12].copy_from_slice(&format.to_le_bytes());
        assert_eq!(
            Snapshot::decode(&bytes).err(),
            Some(SnapshotError::Format {
                found: format,
                supported: SNAPSHOT_FORMAT
            })
        );
    }
    assert_eq!(
        Snapshot::decode(b"PNG not a snapshot at all").err(),
        Some(SnapshotError::NotASnapshot)
    );
}

#[tokio::test]
async fn another_guard_key_type_or_query_is_refused() {
    let (guard, _) = built(10).await;
    let bytes = bytes_of(&guard, "7");
    let users = BloomGuard::builder().name("users").build();
    let uuids = BloomGuard::builder()
        .name("items")
        .key_type(crate::KeyType::Uuid)
        .build();
    let items = BloomGuard::builder().name("items").build();
    let nothing = || async { Ok::<(), std::io::Error>(()) };
    for (candidate, query, what) in [
        (&users, QUERY, "guard"),
        (&uuids, QUERY, "key type"),
        (&items, "select other from items", "key query"),
    ] {
        let snapshot = Snapshot::decode(&bytes).expect("intact");
        match candidate.feed().adopt(snapshot, query, nothing()).await {
            Err(AdoptError::Mismatch { what: found, .. }) => assert_eq!(found, what),
            other => panic!("{what}: {other:?}"),
        }
        assert_eq!(candidate.stats().generation, 0, "{what}");
    }
}

#[tokio::test]
async fn keys_replayed_by_the_catch_up_are_in_the_adopted_filter() {
    let (guard, _) = built(100).await;
    let snapshot = Snapshot::decode(&bytes_of(&guard, "7")).expect("intact");
    let other = BloomGuard::builder().name("items").build();
    let replaying = other.clone();
    other
        .feed()
        .adopt(snapshot, QUERY, async move {
            let batch: KeyBatch = ["committed-after-the-snapshot"].into_iter().collect();
            replaying.insert_batch(&batch);
            Ok::<(), std::io::Error>(())
        })
        .await
        .expect("adopted");
    assert!(other.may_contain("committed-after-the-snapshot"));
    assert!(other.is_ready());
}

#[tokio::test]
async fn a_failed_catch_up_keeps_the_filter_in_use() {
    let (guard, _) = built(100).await;
    let snapshot = Snapshot::decode(&bytes_of(&guard, "7")).expect("intact");
    let (other, _) = built(5).await;
    let failed = other
        .feed()
        .adopt(snapshot, QUERY, async {
            Err::<(), _>(std::io::Error::other("the feed is gone"))
        })
        .await;
    assert!(matches!(failed, Err(AdoptError::CatchUp(_))));
    assert_eq!(other.stats().generation, 1);
    assert_eq!(other.stats().origin, Some(crate::stats::FilterOrigin::Scan));
}

#[tokio::test]
async fn an_incomplete_filter_gives_no_snapshot_and_none_shows_its_secret() {
    let guard = BloomGuard::builder().name("items").build();
    assert!(
        guard.feed().snapshot(&"1".into(), QUERY).is_none(),
        "no filter yet"
    );
    guard.rebuild(&KeyList::new(["a"])).await.expect("build");
    let hold = guard.fail_open();
    assert!(
        guard.feed().snapshot(&"1".into(), QUERY).is_none(),
        "held open"
    );
    drop(hold);
    let writer = guard.feed().snapshot(&"1".into(), QUERY).expect("complete");
    let seed = guard
        .shared
        .complete_filter()
        .and_then(|filter| filter.bloom().map(|bloom| bloom.seed()))
        .expect("filter");
    let mut shown = format!("{writer:?}");
    let bytes: Vec<u8> = writer.chunks(64).flatten().collect();
    shown.push_str(&format!("{:?}", Snapshot::decode(&bytes)));
    assert!(
        !shown.contains(&seed.to_string()) && !shown.contains(&format!("{seed:x}")),
        "{shown}"
    );
}

#[tokio::test]
async fn a_grown_filter_travels_with_its_sub_filters_and_keeps_growing() {
    let guard = BloomGuard::builder()
        .name("items")
        .expected_items(1_000)
        .headroom(0.0)
        .build();
    let keys: Vec<String> = (0..10_000).map(|i| format!("key-{i}")).collect();
    guard
        .rebuild(&KeyList::new(&keys[..1_000]))
        .await
        .expect("build");
    keys[1_000..].iter().for_each(|key| guard.insert(key));
    let info = guard
        .feed()
        .snapshot(&"7".into(), QUERY)
        .expect("complete")
        .info()
        .clone();
    // 1 000 + 2 000 + 4 000 + 8 000 keys of room.
    assert_eq!((info.sub_filters, info.capacity), (4, 15_000));
    let snapshot = Snapshot::decode(&bytes_of(&guard, "7")).expect("intact");
    assert_eq!(snapshot.info().sub_filters, 4);
    let restored = adopt(snapshot).await.expect("adopted");
    assert!(keys.iter().all(|key| restored.may_contain(key)));
    for i in 0..2_000 {
        let absent = format!("absent-{i}");
        assert_eq!(restored.may_contain(&absent), guard.may_contain(&absent));
    }
    // The replay after an adoption grows it further, at the target rate.
    let more: Vec<String> = (0..10_000).map(|i| format!("later-{i}")).collect();
    restored.insert_batch(&more.iter().collect());
    let stats = restored.stats();
    assert_eq!(stats.sub_filters, 5, "{stats:?}");
    // The rate its fill implies, around the target: a full 1 000-key
    // sub-filter's estimate varies by about 9% (its bits set, to the power
    // of its 11 hashes), and five sub-filters leave 3% of the target
    // unspent. Far below the rate that makes a rebuild due (twice the
    // target by default).
    assert!(stats.estimated_fpp <= 1.25 * stats.target_fpp, "{stats:?}");
    assert!(more.iter().all(|key| restored.may_contain(key)));
}

#[tokio::test]
async fn an_overfull_snapshot_is_never_put_in_use() {
    let (guard, _) = built(100).await;
    let mut snapshot = Snapshot::decode(&bytes_of(&guard, "7")).expect("intact");
    // Every bit set: a filter that says "maybe" to everything.
    let crate::filters::filter::FilterParts::Bloom(parts) = &mut snapshot.parts else {
        panic!("a Bloom filter's snapshot");
    };
    for stage in &mut parts.stages {
        stage.words.iter_mut().for_each(|word| *word = u64::MAX);
    }
    let other = BloomGuard::builder().name("items").build();
    let refused = other
        .feed()
        .adopt(snapshot, QUERY, async { Ok::<(), std::io::Error>(()) })
        .await;
    assert!(
        matches!(refused, Err(AdoptError::Overfull { .. })),
        "{refused:?}"
    );
    let stats = other.stats();
    assert_eq!(
        (stats.generation, stats.state),
        (0, crate::stats::GuardState::Warming)
    );
    assert!(!other.is_ready());
}

/// The offset of sub-filter `i`'s key count in a (Bloom filter's)
/// snapshot's bytes: after the key type and the filter kind.
fn keys_at(i: usize) -> usize {
    PREFIX_LEN + 1 + 1 + 16 + 8 + 4 + 36 * i + 4 + 8 + 8
}

#[tokio::test]
async fn counts_that_overflow_are_refused_not_summed() {
    let guard = BloomGuard::builder()
        .name("items")
        .expected_items(100)
        .headroom(0.0)
        .build();
    guard.rebuild(&KeyList::new(["a"])).await.expect("build");
    (0..150).for_each(|i| guard.insert(format!("k{i}")));
    let mut bytes = bytes_of(&guard, "7");
    for stage in 0..2 {
        bytes[keys_at(stage)..keys_at(stage) + 8].copy_from_slice(&u64::MAX.to_le_bytes());
    }
    assert_eq!(
        std::panic::catch_unwind(|| Snapshot::decode(&bytes).err()).expect("no panic"),
        Some(SnapshotError::Field("keys"))
    );
}

#[tokio::test]
async fn a_rate_or_capacity_no_filter_has_is_refused_even_with_a_fresh_checksum() {
    use crate::filters::bloom::{BloomFilter, BloomParts};
    use crate::filters::filter::Filter;
    use crate::filters::stage::StageParts;
    use std::sync::Arc;
    for (fpp, capacity, field) in [(f64::from_bits(1), 1, "rate"), (0.01, u64::MAX, "capacity")] {
        let forged = Filter::Bloom(BloomFilter::from_parts(BloomParts {
            seed: 1,
            skipped: 0,
            stages: vec![StageParts {
                words: vec![0; 16],
                hashes: 3,
                fpp,
                capacity,
                keys: 1,
            }],
        }));
        let bytes: Vec<u8> =
            SnapshotWriter::bloom(Arc::new(forged), "items", KeyType::Text, QUERY, "7")
                .expect("a Bloom filter")
                .chunks(4096)
                .flatten()
                .collect();
        assert_eq!(
            Snapshot::decode(&bytes).err(),
            Some(SnapshotError::Field(field))
        );
    }
}

#[tokio::test]
async fn keys_inserted_while_a_snapshot_is_written_are_counted_after_adoption() {
    let guard = BloomGuard::builder()
        .name("items")
        .expected_items(10_000)
        .build();
    let first: Vec<String> = (0..1_000).map(|i| format!("first-{i}")).collect();
    guard.rebuild(&KeyList::new(first)).await.expect("build");
    let writer = guard.feed().snapshot(&"7".into(), QUERY).expect("complete");
    // After the header, before the bits: in the bits, not in the counts.
    let late: Vec<String> = (0..5_000).map(|i| format!("late-{i}")).collect();
    late.iter().for_each(|key| guard.insert(key));
    let bytes: Vec<u8> = writer.chunks(4096).flatten().collect();
    let other = BloomGuard::builder().name("items").build();
    let replay = other.clone();
    other
        .feed()
        .adopt(
            Snapshot::decode(&bytes).expect("intact"),
            QUERY,
            async move {
                replay.insert_batch(&late.iter().collect());
                Ok::<(), std::io::Error>(())
            },
        )
        .await
        .expect("adopted");
    let (adopted, original) = (other.stats().keys, guard.stats().keys);
    assert!(
        adopted + 100 >= original,
        "{adopted} keys counted of {original}"
    );
}

#[test]
fn counting_stages_are_read_only_in_order_from_the_first() {
    use super::format::Header;
    use super::parts::{Parts, ShardHead};
    let header = |stages: &[u32]| Header {
        info: SnapshotInfo {
            guard: "items".to_owned(),
            key_type: KeyType::Text,
            fingerprint: QUERY.to_owned(),
            position: "7".to_owned(),
            keys: 0,
            capacity: 0,
            sub_filters: 1,
            bits: 0,
            len: 0,
        },
        seed: 1,
        skipped: 0,
        parts: Parts::Counting {
            target_fpp: 0.01,
            shards: stages
                .iter()
                .map(|&stage| ShardHead {
                    keys: 0,
                    bytes: 8,
                    stage,
                })
                .collect(),
        },
    };
    let decode = |stages: &[u32]| {
        let head = header(stages).encode();
        let format = u32::from_le_bytes([head[8], head[9], head[10], head[11]]);
        Header::decode(&head[PREFIX_LEN..], format).map(|header| header.info.sub_filters)
    };
    assert_eq!(decode(&[0, 0, 0]).ok(), Some(1), "one stage");
    assert_eq!(decode(&[0, 0, 1, 2, 2]).ok(), Some(3));
    let beyond: Vec<u32> = (0..=32).collect();
    for stages in [&[1][..], &[0, 2], &[0, 1, 0], &beyond] {
        assert_eq!(
            decode(stages).err(),
            Some(SnapshotError::Field("stage")),
            "{stages:?}"
        );
    }
}

/// A toy case-insensitive collation, built once per `name`.
fn collated(name: &str) -> crate::KeyType {
    let mut builder = crate::keys::Collation::builder(name, "test");
    for c in ' '..='~' {
        builder = builder.weigh(c, &[u16::from(c.to_ascii_uppercase() as u8)]);
    }
    crate::KeyType::Collated(builder.pad_space(true).build().expect("weights"))
}

#[tokio::test]
async fn a_collated_snapshot_names_its_collation() {
    let guard = BloomGuard::builder()
        .name("items")
        .key_type(collated("snap_ci"))
        .build();
    guard
        .rebuild(&KeyList::new(vec!["Apple-Pie".to_owned()]))
        .await
        .expect("build");
    let bytes = bytes_of(&guard, "7");
    let nothing = || async { Ok::<(), std::io::Error>(()) };
    let same = BloomGuard::builder()
        .name("items")
        .key_type(collated("snap_ci"))
        .build();
    same.feed()
        .adopt(Snapshot::decode(&bytes).expect("intact"), QUERY, nothing())
        .await
        .expect("adopted under the same collation");
    assert!(same.may_contain("apple-pie "));
    for other in [collated("snap_other_ci"), crate::KeyType::Text] {
        let candidate = BloomGuard::builder().name("items").key_type(other).build();
        match candidate
            .feed()
            .adopt(Snapshot::decode(&bytes).expect("intact"), QUERY, nothing())
            .await
        {
            Err(AdoptError::Mismatch { what, .. }) => assert_eq!(what, "key type"),
            other => panic!("{other:?}"),
        }
    }
}

#[tokio::test]
async fn a_key_the_collation_cannot_weigh_may_be_stored() {
    let guard = BloomGuard::builder().key_type(collated("may_ci")).build();
    guard
        .rebuild(&KeyList::new(vec!["cafe".to_owned()]))
        .await
        .expect("build");
    assert!(guard.may_contain("CAFE "));
    assert!(!guard.may_contain("tea"));
    // `é` is not in the table: another spelling of it may be stored.
    assert!(guard.may_contain("café"));
}
