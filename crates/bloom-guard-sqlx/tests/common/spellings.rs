//! The differential tests of key types against a database's own equality:
//! a corpus of stored strings, the probes requests ask for, and the
//! guard's answers.

use bloom_guard::{keys::Key, BloomGuard};

/// Every Basic Multilingual Plane character but U+0000 (which Postgres
/// text cannot hold) alone, and (`beside`) after and before an ASCII
/// letter (another for each character, so contractions with any letter
/// are met), or (otherwise) followed by a space.
pub(crate) fn corpus(beside: bool) -> Vec<String> {
    let mut corpus = Vec::new();
    for c in (1_u32..0x1_0000).filter_map(char::from_u32) {
        corpus.push(c.to_string());
        if !beside {
            corpus.push(format!("{c} "));
            continue;
        }
        let letter = char::from(b'a' + (c as u32 % 26) as u8);
        corpus.push(format!("{letter}{c}"));
        corpus.push(format!("{c}{}", letter.to_ascii_uppercase()));
    }
    corpus
}

/// What requests ask for: every stored string, and each single character
/// in upper and lower case and with trailing spaces.
pub(crate) fn probes(corpus: &[String]) -> Vec<String> {
    let mut probes = corpus.to_vec();
    for stored in corpus.iter().filter(|s| s.chars().count() == 1) {
        probes.push(stored.to_uppercase());
        probes.push(stored.to_lowercase());
        probes.push(format!("{stored} "));
        probes.push(format!("{stored}  "));
    }
    probes
}

/// Whether the guard refuses `key` as a request: a canonical form the
/// filter does not hold.
pub(crate) fn refuses(guard: &BloomGuard, key: &str) -> bool {
    guard.key_type().to_canonical(Key::from(key)).is_ok() && !guard.may_contain(key)
}

/// Asserts that the guard refuses none of the keys the database `matched`,
/// and at least 99% of 10 000 random absent ones.
pub(crate) fn assert_exact(what: &str, guard: &BloomGuard, matched: &[String], stored: usize) {
    assert!(matched.len() >= stored, "{what}: {} matched", matched.len());
    let refused: Vec<&String> = matched.iter().filter(|key| refuses(guard, key)).collect();
    assert!(
        refused.is_empty(),
        "{what}: {} of {} keys the database finds were refused, such as {:?}",
        refused.len(),
        matched.len(),
        &refused[..refused.len().min(10)]
    );
    let mut rng = fastrand::Rng::with_seed(7);
    let absent = (0..10_000)
        .filter(|_| {
            refuses(
                guard,
                &(0..12).map(|_| rng.alphanumeric()).collect::<String>(),
            )
        })
        .count();
    assert!(
        absent >= 9_900,
        "{what}: only {absent} of 10 000 absent keys refused"
    );
}
