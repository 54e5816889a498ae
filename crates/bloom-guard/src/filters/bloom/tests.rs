//! Tests of `bloom.rs`.

use super::*;

fn key(i: u64) -> String {
    format!("key-{i}")
}

/// The share of `probes` absent keys the filter says it may hold.
fn observed_fpp(filter: &BloomFilter, probes: u64) -> f64 {
    let hits = (0..probes)
        .filter(|i| filter.contains(&Key::from(format!("absent-{i}"))))
        .count();
    hits as f64 / probes as f64
}

#[test]
fn every_filter_has_its_own_secret_hasher() {
    let a = BloomFilter::new(1000, 0.01);
    let b = BloomFilter::new(1000, 0.01);
    for i in 0..100 {
        a.insert(&Key::from(key(i)));
        b.insert(&Key::from(key(i)));
    }
    assert_eq!(a.bits(), b.bits());
    assert_ne!(
        a.stage_parts()[0].words,
        b.stage_parts()[0].words,
        "two filters of the same keys share a hasher key"
    );
}

#[test]
fn batches_and_single_keys_set_the_same_bits() {
    let one_by_one = BloomFilter::new(1000, 0.01);
    let batched = BloomFilter::from_parts(BloomParts {
        seed: one_by_one.seed(),
        stages: one_by_one.stage_parts(),
        skipped: 0,
    });
    // Past the first stage's capacity: the second stage too.
    let keys: Vec<String> = (0..1500).map(key).collect();
    for k in &keys {
        one_by_one.insert(&Key::from(k));
    }
    let batch: KeyBatch = keys.iter().collect();
    batched.insert_batch(&batch, &mut Vec::new());
    assert_eq!(one_by_one.stage_count(), 2);
    assert_eq!(one_by_one.stage_parts(), batched.stage_parts());
    assert!(keys.iter().all(|k| batched.contains(&Key::from(k))));
}

#[test]
fn counts_distinct_keys_and_estimates_its_rate() {
    let filter = BloomFilter::new(10_000, 0.002);
    assert_eq!((filter.fill(), filter.estimated_fpp()), (0.0, 0.0));
    for i in 0..9_000 {
        filter.insert(&Key::from(key(i)));
        filter.insert(&Key::from(key(i)));
    }
    assert_eq!(filter.stage_count(), 1, "duplicates count once");
    assert!(
        filter.keys() <= 9_000 && filter.keys() > 8_900,
        "{}",
        filter.keys()
    );
    let estimated = filter.estimated_fpp();
    assert!(estimated > 0.0003 && estimated < 0.0015, "{estimated}");
    let keys = filter.estimated_keys();
    assert!((8_700..=9_300).contains(&keys), "{keys}");
}

#[test]
fn grown_ten_times_past_its_capacity_it_keeps_the_target_rate() {
    let target = 0.01;
    let by_insert = BloomFilter::new(10_000, target);
    let by_batch = BloomFilter::new(10_000, target);
    let keys: Vec<String> = (0..100_000).map(key).collect();
    for k in &keys {
        by_insert.insert(&Key::from(k));
    }
    for chunk in keys.chunks(7_000) {
        by_batch.insert_batch(&chunk.iter().collect(), &mut Vec::new());
    }
    for filter in [&by_insert, &by_batch] {
        // 10 000 + 20 000 + 40 000 + 80 000 keys of room.
        assert_eq!(filter.stage_count(), 4, "{filter:?}");
        assert!(keys.iter().all(|k| filter.contains(&Key::from(k))));
        assert!(
            filter.estimated_fpp() <= target,
            "{}",
            filter.estimated_fpp()
        );
        let observed = observed_fpp(filter, 100_000);
        assert!(observed <= target, "{observed}");
        assert!(filter.keys() > 99_000 && filter.capacity() == 150_000);
    }
}

#[test]
fn a_filter_without_growth_would_be_saturated() {
    // What the chain prevents: one stage ten times overfull.
    let stage = Stage::new(1_000, 0.005, 7);
    for i in 0..10_000 {
        stage.insert(stage.source_hash(key(i).as_bytes()));
    }
    assert!(stage.estimated_fpp() > 0.3, "{}", stage.estimated_fpp());
}

#[test]
fn words_are_written_across_the_stages_in_order() {
    let filter = BloomFilter::new(100, 0.01);
    for i in 0..300 {
        filter.insert(&Key::from(key(i)));
    }
    let all: Vec<u8> = filter
        .stage_parts()
        .iter()
        .flat_map(|stage| stage.words.iter().flat_map(|w| w.to_le_bytes()))
        .collect();
    let words: usize = filter.stages().map(Stage::word_count).sum();
    let mut pieces = Vec::new();
    for from in (0..words).step_by(3) {
        filter.write_words(from, 3, &mut pieces);
    }
    assert_eq!(pieces, all);
    let mut past_the_end = Vec::new();
    filter.write_words(words, 5, &mut past_the_end);
    assert!(past_the_end.is_empty());
}

#[test]
fn capacity_within_counts_the_stages_to_come() {
    let filter = BloomFilter::new(1_000, 0.01);
    assert_eq!(filter.capacity_within(1), 1_000);
    assert_eq!(filter.capacity_within(3), 7_000);
    for i in 0..1_500 {
        filter.insert(&Key::from(key(i)));
    }
    assert_eq!(filter.capacity_within(1), 1_000);
    assert_eq!(filter.capacity_within(3), 7_000);
}
