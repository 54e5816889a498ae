use super::*;

fn key(text: &str) -> Key<'_> {
    Key::from(text.as_bytes())
}

#[test]
fn a_key_stays_until_its_last_copy_goes() {
    let filter = CountingFilter::new(1000, 0.001, 7);
    filter.insert(&key("a"));
    filter.insert(&key("a"));
    filter.remove(&key("a"));
    assert!(filter.contains(&key("a")), "one row of two removed the key");
    filter.remove(&key("a"));
    assert!(!filter.contains(&key("a")));
    assert_eq!(filter.keys(), 0);
    assert_eq!((filter.removed(), filter.missed()), (2, 0));
}

#[test]
fn removing_what_is_not_there_is_counted_and_removes_nothing_else() {
    let filter = CountingFilter::new(1000, 0.001, 7);
    filter.insert(&key("a"));
    filter.remove(&key("b"));
    assert!(filter.contains(&key("a")));
    assert_eq!(filter.missed(), 1);
}

#[test]
fn grows_past_its_capacity_and_keeps_its_rate_within_twice_the_target() {
    let target = 0.01;
    let filter = CountingFilter::new(10_000, target, 11);
    let keys: Vec<String> = (0..40_000).map(|i| format!("key-{i}")).collect();
    for k in &keys {
        filter.insert(&key(k));
    }
    assert!(keys.iter().all(|k| filter.contains(&key(k))));
    assert!(!filter.overflowed());
    let absent = (0..100_000)
        .filter(|i| filter.contains(&key(&format!("absent-{i}"))))
        .count();
    let rate = absent as f64 / 100_000.0;
    assert!(rate <= 2.0 * target, "{rate}");
    assert!(
        filter.estimated_fpp() <= 2.0 * target,
        "{}",
        filter.estimated_fpp()
    );
}

/// The share of `count` never-inserted keys the filter finds.
fn false_positives(filter: &CountingFilter, tag: &str, count: usize) -> f64 {
    let found = (0..count)
        .filter(|i| filter.contains(&key(&format!("{tag}-{i}"))))
        .count();
    found as f64 / count as f64
}

#[test]
fn grows_stages_from_a_tiny_start_with_every_key_and_its_rate_within_twice_the_target() {
    let target = 0.01;
    let filter = CountingFilter::new(100, target, 3);
    let keys: Vec<String> = (0..200_000).map(|i| format!("k{i}")).collect();
    for k in &keys {
        filter.insert(&key(k));
    }
    assert!(filter.stage_count() > 2, "{filter:?}");
    assert!(!filter.overflowed());
    assert!(keys.iter().all(|k| filter.contains(&key(k))));
    assert_eq!(filter.keys(), 200_000);
    let rate = false_positives(&filter, "absent", 200_000);
    assert!(rate <= 2.0 * target, "{rate}");
    assert!(
        filter.estimated_fpp() <= 2.0 * target,
        "{}",
        filter.estimated_fpp()
    );
}

#[test]
fn deletes_reach_the_stage_that_holds_each_row() {
    let target = 0.01;
    let filter = CountingFilter::new(1_000, target, 5);
    // Rows of the first stage, then enough to grow two more.
    let old: Vec<String> = (0..1_000).map(|i| format!("old-{i}")).collect();
    let new: Vec<String> = (0..100_000).map(|i| format!("new-{i}")).collect();
    for k in old.iter().chain(&new) {
        filter.insert(&key(k));
    }
    assert!(filter.stage_count() >= 3, "{filter:?}");
    for k in old.iter().step_by(2).chain(new.iter().step_by(2)) {
        filter.remove(&key(k));
    }
    assert_eq!(filter.missed(), 0);
    assert_eq!(filter.removed() + filter.kept(), 50_500);
    let live = old
        .iter()
        .skip(1)
        .step_by(2)
        .chain(new.iter().skip(1).step_by(2));
    assert!(live.clone().all(|k| filter.contains(&key(k))));
    // Deleted keys pass no more often than never-seen ones, give or take
    // the ones several stages matched.
    let deleted = old.iter().step_by(2).chain(new.iter().step_by(2));
    let passed = deleted.filter(|k| filter.contains(&key(k))).count() as f64 / 50_500.0;
    assert!(passed <= 2.0 * target, "{passed}");
}

/// A random workload of inserts and deletes (duplicates, re-inserts,
/// growth through several stages) on a filter with a loose rate, where
/// stages often disagree: every key with a live row is found, always.
#[test]
fn a_random_workload_never_loses_a_live_key() {
    let mut rng = fastrand::Rng::with_seed(42);
    let filter = CountingFilter::new(50, 0.2, 9);
    let mut live: std::collections::HashMap<u32, u32> = std::collections::HashMap::new();
    let mut rows: Vec<u32> = Vec::new();
    // Deletes whose key matched several stages: the latest one gave a copy.
    let mut several = 0;
    for step in 0..60_000 {
        if rows.is_empty() || rng.u8(..) < 170 {
            let k = rng.u32(..20_000);
            filter.insert(&key(&k.to_string()));
            *live.entry(k).or_default() += 1;
            rows.push(k);
        } else {
            let k = rows.swap_remove(rng.usize(..rows.len()));
            let hash = filter.hash(k.to_string().as_bytes());
            several += usize::from(filter.chain.matching(hash) > 1);
            filter.remove(&key(&k.to_string()));
            let count = live.get_mut(&k).expect("a live row");
            *count -= 1;
            if *count == 0 {
                live.remove(&k);
            }
        }
        if step % 5_000 == 0 {
            assert!(
                live.keys().all(|k| filter.contains(&key(&k.to_string()))),
                "step {step}"
            );
        }
    }
    assert!(live.keys().all(|k| filter.contains(&key(&k.to_string()))));
    assert!(filter.stage_count() > 2, "{filter:?}");
    assert!(
        several > 100,
        "{several} deletes matched several stages: the test proves little"
    );
    assert_eq!((filter.missed(), filter.kept()), (0, 0));
}

#[test]
fn a_key_with_rows_in_two_stages_is_forgotten_with_its_last_row() {
    let filter = CountingFilter::new(100, 0.001, 21);
    filter.insert(&key("dup"));
    for i in 0..5_000 {
        filter.insert(&key(&format!("k{i}")));
    }
    assert!(filter.stage_count() > 1);
    filter.insert(&key("dup"));
    filter.remove(&key("dup"));
    assert!(
        filter.contains(&key("dup")),
        "one row of two removed the key"
    );
    filter.remove(&key("dup"));
    assert!(!filter.contains(&key("dup")));
    assert_eq!((filter.missed(), filter.kept()), (0, 0));
    assert!((0..5_000).all(|i| filter.contains(&key(&format!("k{i}")))));
}

#[test]
fn stages_that_do_not_nest_remove_only_where_one_matches() {
    // Stage 0 of three shards, with keys; stage 1 of two: not a multiple.
    let three = CountingFilter::new(150_000, 0.2, 1);
    let old: Vec<String> = (0..20_000).map(|i| format!("old-{i}")).collect();
    for k in &old {
        three.insert(&key(k));
    }
    let two = CountingFilter::new(100_000, 0.2, 1);
    let (mut parts, _) = three.to_parts();
    parts.stages.push(two.to_parts().0.stages.remove(0));
    let filter = CountingFilter::from_parts(parts).expect("decodes");
    assert_eq!(filter.stage_count(), 2);
    // New keys land in the second stage; at a rate of 0.2 many of them
    // also match the first, where another key's copy may be the match.
    let new: Vec<String> = (0..20_000).map(|i| format!("new-{i}")).collect();
    for k in &new {
        filter.insert(&key(k));
    }
    for k in &new {
        filter.remove(&key(k));
    }
    assert_eq!(filter.missed(), 0);
    assert_eq!(filter.removed() + filter.kept(), 20_000);
    assert!(filter.kept() > 10, "{}", filter.kept());
    assert!(old.iter().all(|k| filter.contains(&key(k))));
}

#[test]
fn parts_round_trip_with_every_stage() {
    let filter = CountingFilter::new(10_000, 0.001, 5);
    for i in 0..70_000 {
        filter.insert(&key(&format!("k{i}")));
    }
    assert!(filter.stage_count() > 1);
    let copy = CountingFilter::from_parts(filter.to_parts().0).expect("decodes");
    assert_eq!(copy.stage_count(), filter.stage_count());
    assert!((0..70_000).all(|i| copy.contains(&key(&format!("k{i}")))));
    assert_eq!(copy.keys(), filter.keys());
    for i in (0..70_000).step_by(7) {
        copy.remove(&key(&format!("k{i}")));
    }
    assert_eq!(copy.missed(), 0);
    // It grows on from where the original stood.
    for i in 70_000..200_000 {
        copy.insert(&key(&format!("k{i}")));
    }
    assert!((1..200_000)
        .filter(|i| i % 7 != 0)
        .all(|i| copy.contains(&key(&format!("k{i}")))));
}

#[test]
fn deletes_are_applied_only_to_an_exact_filter() {
    let filter = CountingFilter::new(100, 0.001, 1);
    let added: KeyBatch = ["a", "b"].into_iter().collect();
    let removed: KeyBatch = ["a"].into_iter().collect();
    filter.apply(&added, &removed, None, Some("1"));
    assert!(
        filter.contains(&key("a")),
        "an inexact filter removed a key"
    );
    assert_eq!(filter.unapplied(), 1);
    filter.set_exact(true);
    filter.apply(&KeyBatch::default(), &removed, None, Some("2"));
    assert!(!filter.contains(&key("a")) && filter.contains(&key("b")));
    assert_eq!(filter.position().as_deref(), Some("2"));
}

#[test]
fn a_key_deleted_and_inserted_again_in_one_read_stays() {
    let filter = CountingFilter::new(100, 0.001, 1);
    filter.set_exact(true);
    let a: KeyBatch = ["a"].into_iter().collect();
    filter.apply(&a, &KeyBatch::default(), None, None);
    filter.apply(&a, &a, None, None);
    assert!(filter.contains(&key("a")));
}

#[test]
fn parts_keep_their_moment_while_the_filter_changes() {
    let filter = CountingFilter::new(50_000, 0.001, 9);
    for i in 0..40_000 {
        filter.insert(&key(&format!("k{i}")));
    }
    let (parts, _) = filter.to_parts();
    // The filter changes after the parts were taken: every shard loses
    // keys and takes new ones.
    for i in 0..20_000 {
        filter.remove(&key(&format!("k{i}")));
        filter.insert(&key(&format!("n{i}")));
    }
    let taken = CountingFilter::from_parts(parts).expect("shards");
    assert_eq!(taken.keys(), 40_000);
    assert!((0..40_000).all(|i| taken.contains(&key(&format!("k{i}")))));
    let new_found = (0..20_000)
        .filter(|i| taken.contains(&key(&format!("n{i}"))))
        .count();
    assert!(
        new_found < 100,
        "{new_found} keys inserted after the moment"
    );
    assert_eq!(filter.keys(), 40_000);
    assert_eq!(filter.missed(), 0);
}

#[test]
fn a_scan_loaded_in_shard_order_holds_what_inserts_one_by_one_would() {
    // Room for 1 000: the load fills one stage and starts the next, and one key
    // arrives 500 times.
    let loaded = CountingFilter::new(1_000, 0.001, 3);
    let inserted = CountingFilter::new(1_000, 0.001, 3);
    let mut keys: Vec<String> = (0..60_000).map(|i| format!("k{i}")).collect();
    keys.extend(std::iter::repeat_n("again".to_owned(), 500));
    let mut hashes = Vec::new();
    for chunk in keys.chunks(8192) {
        let batch: KeyBatch = chunk.iter().map(String::as_str).collect();
        loaded.hash_batch(&batch, &mut hashes);
        if hashes.len() > 20_000 {
            loaded.insert_hashes(&mut hashes);
            hashes.clear();
        }
        for k in chunk {
            inserted.insert(&key(k));
        }
    }
    loaded.insert_hashes(&mut hashes);
    assert_eq!(loaded.keys(), inserted.keys());
    assert!(loaded.stage_count() > 1);
    assert!(loaded.stage_count() <= inserted.stage_count() + 1);
    assert!(loaded.estimated_fpp() < 0.002, "{}", loaded.estimated_fpp());
    assert!(keys.iter().all(|k| loaded.contains(&key(k))));
    // Every copy stands for a row: each row's delete finds one.
    loaded.set_exact(true);
    for k in &keys {
        loaded.remove(&key(k));
    }
    assert_eq!((loaded.missed(), loaded.keys()), (0, 0));
}
