//! The canonical form of each kind of key.

use std::borrow::Cow;

use crate::key::Key;
use crate::source::KeyBatch;

/// What a guard's keys are, and so the one form in which the filter holds
/// them: stored keys (from a scan, a change feed, `insert`) and request keys
/// are put in that form before hashing, so every spelling that the database
/// and the handler accept for a stored value finds it.
///
/// A request value that is not a key of the type (`abc` for an integer key)
/// is passed to the handler, which answers it as it would unguarded.
///
/// | type | canonical form | request forms accepted |
/// |---|---|---|
/// | `Text` | the UTF-8 bytes | exactly those |
/// | `CaseInsensitiveText` | ASCII lower case | any case (non-ASCII keys are passed unchecked) |
/// | `Integer` | decimal `i64`, as Postgres prints it | `007`, `+7`, ` 7 ` |
/// | `Uuid` | lower-case hyphenated, as Postgres prints it | upper case, no hyphens, braces, `urn:uuid:` |
///
/// Composite keys (several columns) are text: see
/// `bloom_guard_sqlx::Watch` for their encoding and [`PathParams`](crate::PathParams)
/// for the extractor that builds them.
///
/// # Example
///
/// ```
/// use bloom_guard::{BloomGuard, KeyList, KeyType};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let users = BloomGuard::builder().key_type(KeyType::Uuid).build();
/// users.rebuild(&KeyList::new(["550e8400-e29b-41d4-a716-446655440000"])).await.expect("build");
/// assert!(users.may_contain("550E8400E29B41D4A716446655440000"));
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum KeyType {
    /// Text compared byte for byte (the default).
    #[default]
    Text,
    /// Text compared without regard to ASCII case, as `citext` or
    /// `lower(key)` compare it.
    CaseInsensitiveText,
    /// A 64-bit signed integer.
    Integer,
    /// A UUID.
    Uuid,
}

impl KeyType {
    /// `key` in canonical form, or `None` if it is not a key of this type.
    pub fn canonical<'k>(self, key: Key<'k>) -> Option<Key<'k>> {
        let text = std::str::from_utf8(key.as_bytes()).ok()?;
        match self {
            KeyType::Text => Some(key),
            KeyType::CaseInsensitiveText => {
                if !text.is_ascii() {
                    return None;
                }
                if text.bytes().any(|b| b.is_ascii_uppercase()) {
                    Some(Key::from(text.to_ascii_lowercase()))
                } else {
                    Some(key)
                }
            }
            KeyType::Integer => {
                let number: i64 = text
                    .trim_matches(|c: char| c.is_ascii_whitespace())
                    .parse()
                    .ok()?;
                Some(Key::from(number.to_string()))
            }
            KeyType::Uuid => {
                let uuid = uuid::Uuid::try_parse(text).ok()?;
                Some(Key::from(uuid.hyphenated().to_string()))
            }
        }
    }

    /// `batch` in canonical form; keys that are not of this type are kept
    /// as they are (a harmless false positive at worst).
    pub(crate) fn canonical_batch(self, batch: &KeyBatch) -> Cow<'_, KeyBatch> {
        if self == KeyType::Text {
            return Cow::Borrowed(batch);
        }
        let mut canonical = KeyBatch::with_capacity(batch.len(), batch.byte_len());
        for key in batch.iter() {
            canonical.push(self.canonical_or_same(key).as_bytes());
        }
        for _ in 0..batch.skipped() {
            canonical.skip();
        }
        Cow::Owned(canonical)
    }

    /// A stored key in canonical form, or as it is if not of this type.
    pub(crate) fn canonical_or_same(self, key: Key<'_>) -> Key<'_> {
        self.canonical(key.clone()).unwrap_or(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn canonical(key_type: KeyType, key: &str) -> Option<String> {
        key_type
            .canonical(Key::from(key))
            .map(|k| String::from_utf8(k.as_bytes().to_vec()).expect("utf-8"))
    }

    #[test]
    fn each_type_has_one_form() {
        assert_eq!(canonical(KeyType::Text, "AbC"), Some("AbC".into()));
        assert_eq!(
            canonical(KeyType::CaseInsensitiveText, "AbC"),
            Some("abc".into())
        );
        assert_eq!(canonical(KeyType::CaseInsensitiveText, "Äb"), None);
        for form in ["7", "007", "+7", " 7 "] {
            assert_eq!(
                canonical(KeyType::Integer, form),
                Some("7".into()),
                "{form}"
            );
        }
        assert_eq!(canonical(KeyType::Integer, "-0"), Some("0".into()));
        assert_eq!(canonical(KeyType::Integer, "seven"), None);
        assert_eq!(canonical(KeyType::Integer, "99999999999999999999"), None);
        let lower = "550e8400-e29b-41d4-a716-446655440000";
        for form in [
            lower,
            "550E8400-E29B-41D4-A716-446655440000",
            "550e8400e29b41d4a716446655440000",
            "{550e8400-e29b-41d4-a716-446655440000}",
            "urn:uuid:550e8400-e29b-41d4-a716-446655440000",
        ] {
            assert_eq!(canonical(KeyType::Uuid, form), Some(lower.into()), "{form}");
        }
        assert_eq!(canonical(KeyType::Uuid, "not-a-uuid"), None);
        assert_eq!(KeyType::Text.canonical(Key::from(&b"\xff"[..])), None);
    }

    proptest! {
        #[test]
        fn every_form_of_a_uuid_finds_its_postgres_text(bytes in any::<[u8; 16]>(), upper in any::<bool>(), form in 0..4_u8) {
            let uuid = uuid::Uuid::from_bytes(bytes);
            let stored = uuid.hyphenated().to_string(); // Postgres's uuid_out
            let mut request = match form {
                0 => uuid.hyphenated().to_string(),
                1 => uuid.simple().to_string(),
                2 => uuid.braced().to_string(),
                _ => uuid.urn().to_string(),
            };
            if upper {
                request = request.to_uppercase().replace("URN:UUID:", "urn:uuid:");
            }
            prop_assert_eq!(canonical(KeyType::Uuid, &request), Some(stored));
        }

        #[test]
        fn every_form_of_an_integer_finds_its_postgres_text(n in any::<i64>(), zeros in 0..4_usize, plus in any::<bool>()) {
            let stored = n.to_string(); // Postgres's int8out
            let digits = n.unsigned_abs().to_string();
            let sign = if n < 0 { "-" } else if plus { "+" } else { "" };
            let request = format!("{sign}{}{digits}", "0".repeat(zeros));
            prop_assert_eq!(canonical(KeyType::Integer, &request), Some(stored));
        }
    }
}
