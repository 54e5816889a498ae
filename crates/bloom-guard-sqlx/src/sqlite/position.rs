//! A position in the SQLite feed: a row id, and a digest of that row.
//!
//! Row ids alone cannot tell that the feed was rewritten under a reader:
//! after a `.restore` of an older backup, new rows take ids the reader has
//! passed already. The digest of the row at the position tells: if that
//! row is gone (and not pruned) or different, the feed is not the one the
//! position was taken in, and the reader rebuilds.

use std::fmt;

/// A feed position: every row up to `id` is behind it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Mark {
    pub(super) id: i64,
    /// The digest of row `id`; `None` for the empty feed (id 0).
    pub(super) digest: Option<String>,
}

impl Mark {
    /// The position before any row.
    pub(super) const START: Self = Self {
        id: 0,
        digest: None,
    };

    /// The position at row `id`, whose columns `guard`, `kind`,
    /// `hex(quote(key))` and `at` are given.
    pub(super) fn at(id: i64, guard: &str, kind: &str, quoted_key: &str, at: i64) -> Self {
        Self {
            id,
            digest: Some(digest(id, guard, kind, quoted_key, at)),
        }
    }

    pub(super) fn parse(text: &str) -> Option<Self> {
        match text.split_once(':') {
            Some((id, digest)) if digest.len() == 16 => Some(Self {
                id: id.parse().ok()?,
                digest: Some(digest.to_owned()),
            }),
            Some(_) => None,
            None => (text == "0").then_some(Self::START),
        }
    }
}

impl fmt::Display for Mark {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.digest {
            Some(digest) => write!(f, "{}:{digest}", self.id),
            None => write!(f, "{}", self.id),
        }
    }
}

/// The digest of a feed row's columns.
fn digest(id: i64, guard: &str, kind: &str, quoted_key: &str, at: i64) -> String {
    crate::digest::row_digest(&[&id.to_string(), guard, kind, quoted_key, &at.to_string()])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mark_reads_back_as_written() {
        let mark = Mark::at(42, "items", "i", "'apple'", 1_700_000_000);
        assert_eq!(Mark::parse(&mark.to_string()), Some(mark.clone()));
        assert_eq!(Mark::parse("0"), Some(Mark::START));
        for bad in ["", "42", "x:0011223344556677", "42:short"] {
            assert_eq!(Mark::parse(bad), None, "{bad}");
        }
        assert_ne!(mark, Mark::at(42, "items", "i", "'pear'", 1_700_000_000));
    }
}
