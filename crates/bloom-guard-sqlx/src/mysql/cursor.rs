//! A position in the MySQL feed: the highest row id read, the ids below it
//! not read yet, and a digest of the row at the highest id.
//!
//! MySQL hands out auto-increment ids when a row is written, not when its
//! transaction commits: a transaction that took id 7 may commit after one
//! that took id 8 was read. So a position is not one id. It keeps the ids
//! below its highest that no read has seen (`open`): each read asks for
//! them again, until one sees them committed, or until every transaction
//! that could hold them has ended (see `settle.rs`) and a read begun after
//! that still lacks them (rolled back: they never come).
//!
//! The digest tells a feed rewritten under the reader (a restore of an
//! older backup, whose new rows take ids the reader has passed), as on
//! SQLite. A position in a feed pruned empty has no row to digest: its
//! highest id is the one below the horizon, and it holds while the
//! horizon stays above it.

use std::fmt;

/// A feed position: every row up to `high` is behind it but those of `open`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Cursor {
    pub(super) high: i64,
    /// The digest of row `high`; `None` before any row, or where row
    /// `high` was pruned.
    pub(super) digest: Option<String>,
    /// Ids below `high` not read yet, ascending.
    pub(super) open: Vec<i64>,
}

impl Cursor {
    /// The position before any row.
    pub(super) const START: Self = Self {
        high: 0,
        digest: None,
        open: Vec::new(),
    };

    /// Reads back a position written by `Display`: `high:digest` (`high:-`
    /// without a digest), then
    /// `~` and the open ids as ascending runs (`7,9-12`) if any.
    pub(super) fn parse(text: &str) -> Option<Self> {
        let (head, open) = match text.split_once('~') {
            Some((head, runs)) => (head, parse_runs(runs)?),
            None => (text, Vec::new()),
        };
        let (high, digest) = match head.split_once(':') {
            Some((high, "-")) => (high.parse().ok()?, None),
            Some((high, digest)) if digest.len() == 16 => (high.parse().ok()?, Some(digest)),
            Some(_) => return None,
            None if head == "0" => (0, None),
            None => return None,
        };
        if open.iter().any(|&id| id <= 0 || id >= high) {
            return None;
        }
        Some(Self {
            high,
            digest: digest.map(str::to_owned),
            open,
        })
    }
}

fn parse_runs(runs: &str) -> Option<Vec<i64>> {
    let mut open: Vec<i64> = Vec::new();
    for run in runs.split(',') {
        let (first, last): (i64, i64) = match run.split_once('-') {
            Some((first, last)) => (first.parse().ok()?, last.parse().ok()?),
            None => {
                let id = run.parse().ok()?;
                (id, id)
            }
        };
        // Ascending, without overlaps: the form `Display` writes.
        if last < first || open.last().is_some_and(|&before| first <= before) {
            return None;
        }
        // A run longer than this is not a position this crate wrote.
        if last - first > 1_000_000 {
            return None;
        }
        open.extend(first..=last);
    }
    Some(open)
}

impl fmt::Display for Cursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.digest {
            Some(digest) => write!(f, "{}:{digest}", self.high)?,
            None if self.high == 0 => f.write_str("0")?,
            None => write!(f, "{}:-", self.high)?,
        }
        let mut ids = self.open.iter().copied().peekable();
        let mut first_run = true;
        while let Some(first) = ids.next() {
            let mut last = first;
            while ids.peek() == Some(&(last + 1)) {
                last += 1;
                ids.next();
            }
            f.write_str(if first_run { "~" } else { "," })?;
            first_run = false;
            if first == last {
                write!(f, "{first}")?;
            } else {
                write!(f, "{first}-{last}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cursor(high: i64, open: &[i64]) -> Cursor {
        Cursor {
            high,
            digest: Some("0011223344556677".to_owned()),
            open: open.to_vec(),
        }
    }

    #[test]
    fn a_cursor_reads_back_as_written() {
        for open in [&[][..], &[3], &[3, 4, 5, 9], &[1, 2, 7, 8, 11]] {
            let written = cursor(12, open);
            let text = written.to_string();
            assert_eq!(Cursor::parse(&text), Some(written), "{text}");
        }
        assert_eq!(
            cursor(12, &[3, 4, 5, 9]).to_string(),
            "12:0011223344556677~3-5,9"
        );
        assert_eq!(Cursor::parse("0"), Some(Cursor::START));
        let pruned = Cursor {
            high: 40,
            digest: None,
            open: vec![35],
        };
        assert_eq!(pruned.to_string(), "40:-~35");
        assert_eq!(Cursor::parse("40:-~35"), Some(pruned));
    }

    #[test]
    fn malformed_cursors_are_refused() {
        for bad in [
            "",
            "12",
            "x:0011223344556677",
            "12:short",
            "12:0011223344556677~",
            "12:0011223344556677~12",
            "12:0011223344556677~5,3",
            "12:0011223344556677~3-5,4",
            "12:0011223344556677~0",
            "12:0011223344556677~5-3",
        ] {
            assert_eq!(Cursor::parse(bad), None, "{bad}");
        }
    }
}
