//! SHA-256 over length-prefixed parts: the fingerprints that name a key set
//! (SQLite, MySQL) and the short digest of a feed row that positions keep
//! to tell a feed rewritten under its reader.

use sha2::{Digest, Sha256};

/// SHA-256 over `parts`, each prefixed by its length, in hex.
pub(crate) fn parts_digest(parts: &[&str]) -> String {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update((part.len() as u64).to_le_bytes());
        hasher.update(part.as_bytes());
    }
    hasher
        .finalize()
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

/// The first 64 bits of [`parts_digest`], in hex.
pub(crate) fn row_digest(parts: &[&str]) -> String {
    let mut digest = parts_digest(parts);
    digest.truncate(16);
    digest
}
