//! A short digest of a feed row, which positions keep to tell a feed
//! rewritten under its reader (SQLite, MySQL).

use sha2::{Digest, Sha256};

/// 64 bits of SHA-256 over `parts`, each prefixed by its length, in hex.
pub(crate) fn row_digest(parts: &[&str]) -> String {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update((part.len() as u64).to_le_bytes());
        hasher.update(part.as_bytes());
    }
    hasher.finalize()[..8]
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}
