//! The canonical key: the exact bytes hashed into and looked up in the filter.

use std::borrow::Cow;
use std::fmt;

use percent_encoding::percent_decode_str;

/// A key in its canonical form: the exact bytes the filter hashes.
///
/// Both sides of the guard go through this one type: keys loaded from the
/// database (`Key::from(&str)`, the stored bytes as they are) and keys taken
/// from requests (`Key::from_percent_encoded`, decoded once, exactly as axum's
/// `Path` extractor decodes them: malformed escapes such as `100%` stay as
/// they are, and `.` and `..` are keys like any other). Because the filter only ever hashes a
/// `Key`'s bytes, a key stored as `a/b c` and requested as `/items/a%2Fb%20c`
/// hash identically.
///
/// # Example
///
/// ```
/// use bloom_guard::keys::Key;
///
/// let stored = Key::from("a/b c\tü");
/// let requested = Key::from_percent_encoded("a%2Fb%20c%09%C3%BC");
/// assert_eq!(stored, requested);
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key<'a>(Cow<'a, [u8]>);

impl<'a> Key<'a> {
    /// Decodes a percent-encoded URL component (a path segment) into a key.
    ///
    /// Decoding follows axum's `Path` extractor byte for byte: `%XX` becomes
    /// the byte `XX`, a `%` not followed by two hex digits stays as it is, and
    /// `+` stays `+`. Borrows when there is nothing to decode.
    pub fn from_percent_encoded(encoded: &'a str) -> Self {
        Key(percent_decode_str(encoded).into())
    }

    /// The key's canonical bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The number of canonical bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the key has no bytes at all.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Detaches the key from the buffer it borrows from.
    pub fn into_owned(self) -> Key<'static> {
        Key(Cow::Owned(self.0.into_owned()))
    }
}

impl fmt::Debug for Key<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({:?})", String::from_utf8_lossy(&self.0))
    }
}

impl AsRef<[u8]> for Key<'_> {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl<'a> From<&'a str> for Key<'a> {
    fn from(key: &'a str) -> Self {
        Key(Cow::Borrowed(key.as_bytes()))
    }
}

impl<'a> From<&'a String> for Key<'a> {
    fn from(key: &'a String) -> Self {
        Key(Cow::Borrowed(key.as_bytes()))
    }
}

impl<'a> From<&'a [u8]> for Key<'a> {
    fn from(key: &'a [u8]) -> Self {
        Key(Cow::Borrowed(key))
    }
}

impl<'a> From<&'a Key<'_>> for Key<'a> {
    fn from(key: &'a Key<'_>) -> Self {
        Key(Cow::Borrowed(key.as_bytes()))
    }
}

impl From<String> for Key<'static> {
    fn from(key: String) -> Self {
        Key(Cow::Owned(key.into_bytes()))
    }
}

impl From<Vec<u8>> for Key<'static> {
    fn from(key: Vec<u8>) -> Self {
        Key(Cow::Owned(key))
    }
}

impl<'a> From<Cow<'a, str>> for Key<'a> {
    fn from(key: Cow<'a, str>) -> Self {
        match key {
            Cow::Borrowed(s) => Key::from(s),
            Cow::Owned(s) => Key::from(s),
        }
    }
}

/// Why the guard did not look a request's key up: the request goes to the
/// handler, which answers it as it would unguarded.
///
/// The guard answers "absent" only for a key it has put in canonical form
/// with certainty. Each of these reasons is counted in
/// [`Stats::unchecked`](crate::Stats::unchecked) and the metric
/// `bloom_guard_unchecked_total{reason}` (see [`reason`](Self::reason)),
/// except [`Unguardable`](Self::Unguardable), a wiring mistake counted in
/// [`Stats::unguarded`](crate::Stats::unguarded).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The key is longer than [`Builder::max_key_len`](crate::Builder::max_key_len).
    /// Passed on unchecked, or answered with a 400 when the guard is built
    /// with [`refuse_long_keys`](crate::Builder::refuse_long_keys). Raise
    /// the limit to your column's longest key to check such keys.
    #[error("key is {len} bytes long, the limit is {max}")]
    TooLong {
        /// The key's length in bytes, after decoding.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The decoded key is not UTF-8, so no text key type can compare it
    /// (axum's `Path` refuses such a value itself).
    #[error("key is not valid UTF-8")]
    NotUtf8,
    /// The request names the key more than once (a query parameter given
    /// twice), and the application may read either.
    #[error("key is given more than once")]
    Ambiguous,
    /// The value is not a key of the guard's [`KeyType`](crate::KeyType)
    /// (`abc` for an integer key): it names no stored key in that form.
    #[error("value is not a key of the guard's key type")]
    NotOfKeyType,
    /// The key holds characters whose equality the guard's
    /// [`KeyType`](crate::KeyType) cannot reproduce as the database
    /// compares them (non-ASCII or ignorable control characters under
    /// case-insensitive text).
    #[error("key has characters the key type cannot compare as the database does")]
    Uncomparable,
    /// The extractor cannot find keys where this layer sits (a
    /// [`PathParam`](crate::extract::PathParam) outside an axum router): the request
    /// passes unguarded, is counted in
    /// [`Stats::unguarded`](crate::Stats::unguarded), and the first one is
    /// logged at warn level. Fix the wiring.
    #[error("cannot guard this request: {0}")]
    Unguardable(&'static str),
}

impl KeyError {
    /// The `reason` label of `bloom_guard_unchecked_total`: `too_long`,
    /// `not_utf8`, `ambiguous`, `not_of_key_type`, `uncomparable`, or
    /// `unguardable`.
    pub fn reason(&self) -> &'static str {
        match self {
            KeyError::TooLong { .. } => "too_long",
            KeyError::NotUtf8 => "not_utf8",
            KeyError::Ambiguous => "ambiguous",
            KeyError::NotOfKeyType => "not_of_key_type",
            KeyError::Uncomparable => "uncomparable",
            KeyError::Unguardable(_) => "unguardable",
        }
    }

    /// The status the guard answers with when it refuses the key itself
    /// (only [`TooLong`](Self::TooLong) with
    /// [`refuse_long_keys`](crate::Builder::refuse_long_keys)).
    pub fn status(&self) -> http::StatusCode {
        http::StatusCode::BAD_REQUEST
    }

    /// The JSON body the guard answers with when it refuses the key itself.
    pub fn body(&self) -> &'static str {
        match self {
            KeyError::TooLong { .. } => r#"{"error":"key too long"}"#,
            _ => r#"{"error":"malformed key"}"#,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn percent_decoding_matches_the_stored_form() {
        let cases = [
            ("plain", "plain"),
            ("a%2Fb", "a/b"),
            ("tab%09nl%0Abs%5C", "tab\tnl\nbs\\"),
            ("%C3%BC%F0%9F%A6%80", "ü🦀"),
            ("100%25", "100%"),
            ("a+b", "a+b"),
            ("bad%zz", "bad%zz"),
            ("trailing%", "trailing%"),
            ("..", ".."),
            ("%2e%2E", ".."),
            ("x%2", "x%2"),
            ("a%ZZ", "a%ZZ"),
        ];
        for (encoded, stored) in cases {
            assert_eq!(
                Key::from_percent_encoded(encoded),
                Key::from(stored),
                "{encoded}"
            );
        }
    }

    #[test]
    fn decoding_borrows_when_nothing_is_encoded() {
        assert!(matches!(
            Key::from_percent_encoded("abc").0,
            Cow::Borrowed(_)
        ));
    }

    proptest! {
        #[test]
        fn any_string_round_trips_through_path_encoding(stored in "\\PC*|[\\t\\n\\\\/%+ ?#]*") {
            let encoded = percent_encoding::utf8_percent_encode(
                &stored,
                percent_encoding::NON_ALPHANUMERIC,
            ).to_string();
            prop_assert_eq!(Key::from_percent_encoded(&encoded), Key::from(stored.as_str()));
        }

    }
}
