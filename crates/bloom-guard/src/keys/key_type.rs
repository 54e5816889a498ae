//! The canonical form of each kind of key.

use std::borrow::Cow;

use crate::keys::batch::KeyBatch;
use crate::keys::collation::Collation;
use crate::keys::key::{Key, KeyError};

#[doc = include_str!("../../docs/key_types.md")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum KeyType {
    /// Text compared byte for byte (the default).
    #[default]
    Text,
    /// Text compared without regard to ASCII case, as `citext` or
    /// `lower(key)` compare it.
    CaseInsensitiveText,
    /// Text compared as if padded with spaces: trailing spaces are
    /// ignored, as MySQL's and MariaDB's PAD SPACE binary collations
    /// (`utf8mb4_bin`), SQLite's `RTRIM` and Postgres's `char(n)` compare
    /// it.
    SpacePaddedText,
    /// A 64-bit signed integer.
    Integer,
    /// A UUID.
    Uuid,
    /// Text under a case- or accent-insensitive database collation
    /// (MariaDB's `utf8mb4_general_ci`, `utf8mb4_unicode_ci`): keys are
    /// held and looked up by their weights under the collation, so every
    /// spelling the database calls equal finds the stored key.
    /// `bloom_guard_sqlx::Watch::key_type` reads the collation of a
    /// watched column and returns this key type with its weights.
    Collated(Collation),
}

impl KeyType {
    /// `key` in canonical form, or `None` if the guard cannot compare it
    /// (see [`to_canonical`](Self::to_canonical)).
    pub fn canonical<'k>(self, key: Key<'k>) -> Option<Key<'k>> {
        self.to_canonical(key).ok()
    }

    /// `key` in canonical form, or why the guard cannot compare it as the
    /// database does: then a request passes to the handler unchecked.
    ///
    /// # Errors
    ///
    /// [`KeyError::NotUtf8`] for bytes that are not UTF-8,
    /// [`KeyError::NotOfKeyType`] for a value of another type (`abc` for
    /// an integer key), [`KeyError::Uncomparable`] for characters the type
    /// cannot compare as the database does.
    ///
    /// # Example
    ///
    /// ```
    /// use bloom_guard::{keys::{Key, KeyError}, KeyType};
    ///
    /// assert_eq!(KeyType::Integer.to_canonical(Key::from("007")), Ok(Key::from("7")));
    /// assert_eq!(KeyType::Integer.to_canonical(Key::from("seven")), Err(KeyError::NotOfKeyType));
    /// // An ICU case-insensitive collation ignores control characters.
    /// assert_eq!(
    ///     KeyType::CaseInsensitiveText.to_canonical(Key::from("edg\u{1}ecase")),
    ///     Err(KeyError::Uncomparable)
    /// );
    /// ```
    pub fn to_canonical<'k>(self, key: Key<'k>) -> Result<Key<'k>, KeyError> {
        let text = std::str::from_utf8(key.as_bytes()).map_err(|_| KeyError::NotUtf8)?;
        match self {
            KeyType::Text => Ok(key),
            KeyType::CaseInsensitiveText => {
                if !text.bytes().all(comparable_without_case) {
                    return Err(KeyError::Uncomparable);
                }
                if text.bytes().any(|b| b.is_ascii_uppercase()) {
                    Ok(Key::from(text.to_ascii_lowercase()))
                } else {
                    Ok(key)
                }
            }
            KeyType::SpacePaddedText => {
                let trimmed = text.trim_end_matches(' ');
                if trimmed.len() == text.len() {
                    Ok(key)
                } else {
                    Ok(Key::from(trimmed.to_owned()))
                }
            }
            KeyType::Integer => {
                let number: i64 = text
                    .trim_matches(|c: char| c.is_ascii_whitespace())
                    .parse()
                    .map_err(|_| KeyError::NotOfKeyType)?;
                Ok(Key::from(number.to_string()))
            }
            KeyType::Uuid => {
                let uuid = uuid::Uuid::try_parse(text).map_err(|_| KeyError::NotOfKeyType)?;
                Ok(Key::from(uuid.hyphenated().to_string()))
            }
            KeyType::Collated(collation) => collation
                .weights(text)
                .map(Key::from)
                .ok_or(KeyError::Uncomparable),
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
    /// Under a collation, a key the database weighed
    /// ([`Collation::weighed`]) is its weights.
    pub(crate) fn canonical_or_same(self, key: Key<'_>) -> Key<'_> {
        if let KeyType::Collated(collation) = self {
            return match collation.stored(key.as_bytes()) {
                Some(weights) => Key::from(weights),
                None => key,
            };
        }
        self.canonical(key.clone()).unwrap_or(key)
    }
}

/// Whether a byte compares as its ASCII lower case does under every
/// case-insensitive comparison: ASCII, but not the control characters an
/// ICU collation ignores (0–8, 14–31, 127), so `edg\u{1}ecase` is not
/// taken for `edgecase`'s absence.
fn comparable_without_case(byte: u8) -> bool {
    byte.is_ascii() && !matches!(byte, 0..=8 | 14..=31 | 127)
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
        for form in ["a b", "a b ", "a b   "] {
            assert_eq!(
                canonical(KeyType::SpacePaddedText, form),
                Some("a b".into()),
                "{form:?}"
            );
        }
        // Only spaces: a tab or a no-break space is compared.
        assert_eq!(
            canonical(KeyType::SpacePaddedText, " a\t"),
            Some(" a\t".into())
        );
        assert_eq!(
            canonical(KeyType::SpacePaddedText, "a\u{a0}"),
            Some("a\u{a0}".into())
        );
        assert_eq!(canonical(KeyType::SpacePaddedText, "  "), Some("".into()));
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

    #[test]
    fn each_refusal_names_its_reason() {
        let ci = KeyType::CaseInsensitiveText;
        assert_eq!(
            KeyType::Text.to_canonical(Key::from(&b"\xff"[..])),
            Err(KeyError::NotUtf8)
        );
        // Ignorable under an ICU collation: not comparable without it.
        for text in [
            "edg\u{1}ecase",
            "a\u{8}",
            "a\u{e}",
            "a\u{1f}",
            "a\u{7f}",
            "Äb",
        ] {
            assert_eq!(
                ci.to_canonical(Key::from(text)),
                Err(KeyError::Uncomparable),
                "{text:?}"
            );
        }
        // Whitespace controls compare as themselves.
        assert_eq!(ci.to_canonical(Key::from("A\tB")), Ok(Key::from("a\tb")));
        assert_eq!(
            KeyType::Uuid.to_canonical(Key::from("x")),
            Err(KeyError::NotOfKeyType)
        );
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
