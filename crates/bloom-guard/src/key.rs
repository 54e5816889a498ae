//! The canonical key: the exact bytes hashed into and looked up in the filter.

use std::borrow::Cow;
use std::fmt;

use percent_encoding::percent_decode_str;

/// A key in its canonical form: the exact bytes the filter hashes.
///
/// Both sides of the guard go through this one type: keys loaded from the
/// database (`Key::from(&str)`, the stored bytes as they are) and keys taken
/// from requests (`Key::from_percent_encoded`, decoded once, exactly as axum's
/// `Path` extractor decodes them). Because the filter only ever hashes a
/// `Key`'s bytes, a key stored as `a/b c` and requested as `/items/a%2Fb%20c`
/// hash identically.
///
/// # Example
///
/// ```
/// use bloom_guard::Key;
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

    /// Decodes a path segment strictly: as
    /// [`from_percent_encoded`](Self::from_percent_encoded), but a `%` must
    /// start a `%XX` escape, and the dot segments `.` and `..` (which
    /// clients and proxies rewrite) are refused. This is what the path
    /// extractors use.
    ///
    /// # Errors
    ///
    /// [`KeyError::InvalidPercentEncoding`] for a bad escape,
    /// [`KeyError::DotSegment`] for `.` and `..` (also encoded).
    ///
    /// # Example
    ///
    /// ```
    /// use bloom_guard::{Key, KeyError};
    ///
    /// assert_eq!(Key::from_path_segment("a%2Fb"), Ok(Key::from("a/b")));
    /// assert!(matches!(Key::from_path_segment("100%"), Err(KeyError::InvalidPercentEncoding)));
    /// assert!(matches!(Key::from_path_segment("%2E%2E"), Err(KeyError::DotSegment)));
    /// ```
    pub fn from_path_segment(encoded: &'a str) -> Result<Self, KeyError> {
        let key = if !encoded.as_bytes().contains(&b'%') {
            // Most keys: nothing to check or decode.
            Key::from(encoded)
        } else if valid_escapes(encoded.as_bytes()) {
            Self::from_percent_encoded(encoded)
        } else {
            return Err(KeyError::InvalidPercentEncoding);
        };
        if key.as_bytes() == b"." || key.as_bytes() == b".." {
            return Err(KeyError::DotSegment);
        }
        Ok(key)
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

/// Whether every `%` starts a `%XX` escape.
fn valid_escapes(bytes: &[u8]) -> bool {
    let mut rest = bytes;
    while let Some(at) = rest.iter().position(|&b| b == b'%') {
        match rest.get(at + 1..at + 3) {
            Some([hi, lo]) if hi.is_ascii_hexdigit() && lo.is_ascii_hexdigit() => {
                rest = &rest[at + 3..];
            }
            _ => return false,
        }
    }
    true
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

/// Why a request's key was refused before it reached the filter.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The key is longer than [`Builder::max_key_len`](crate::Builder::max_key_len).
    #[error("key is {len} bytes long, the limit is {max}")]
    TooLong {
        /// The key's length in bytes, after decoding.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The key is empty.
    #[error("key must not be empty")]
    Empty,
    /// A `%` not followed by two hex digits.
    #[error("malformed key: invalid percent-encoding")]
    InvalidPercentEncoding,
    /// `.` or `..`, which clients and proxies rewrite: such a key can
    /// never be requested.
    #[error("malformed key: dot segment")]
    DotSegment,
    /// The extractor cannot find keys where this layer sits (a
    /// [`PathParam`](crate::PathParam) outside an axum router): the request
    /// passes unguarded, is counted in
    /// [`Stats::unguarded`](crate::Stats::unguarded), and the first one is
    /// logged at warn level. Not an answer to the client.
    #[error("cannot guard this request: {0}")]
    Unguardable(&'static str),
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
    fn path_segments_are_decoded_strictly() {
        assert_eq!(Key::from_path_segment("a%20b"), Ok(Key::from("a b")));
        assert_eq!(Key::from_path_segment("..."), Ok(Key::from("...")));
        assert_eq!(Key::from_path_segment("%2e"), Err(KeyError::DotSegment));
        assert_eq!(Key::from_path_segment(".."), Err(KeyError::DotSegment));
        for bad in ["%", "%2", "%zz", "a%g1", "ok%2Fthen%"] {
            assert_eq!(
                Key::from_path_segment(bad),
                Err(KeyError::InvalidPercentEncoding),
                "{bad}"
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
