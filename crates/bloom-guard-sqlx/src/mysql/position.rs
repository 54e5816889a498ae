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

use std::collections::BTreeMap;
use std::fmt;

/// A feed position: every row up to `high` is behind it but those of `open`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Cursor {
    pub(super) high: i64,
    /// The digest of row `high`; `None` before any row, or where row
    /// `high` was pruned.
    pub(super) digest: Option<String>,
    /// Ids below `high` not read yet.
    pub(super) open: OpenIds,
}

impl Cursor {
    /// The position before any row.
    pub(super) const START: Self = Self {
        high: 0,
        digest: None,
        open: OpenIds::new(),
    };

    /// Reads back a position written by `Display`: `high:digest` (`high:-`
    /// without a digest), then
    /// `~` and the open ids as ascending runs (`7,9-12`) if any.
    pub(super) fn parse(text: &str) -> Option<Self> {
        let (head, open) = match text.split_once('~') {
            Some((head, runs)) => (head, parse_runs(runs)?),
            None => (text, OpenIds::new()),
        };
        let (high, digest) = match head.split_once(':') {
            Some((high, "-")) => (high.parse().ok()?, None),
            Some((high, digest)) if digest.len() == 16 => (high.parse().ok()?, Some(digest)),
            Some(_) => return None,
            None if head == "0" => (0, None),
            None => return None,
        };
        if open.first().is_some_and(|first| first <= 0)
            || open.last().is_some_and(|last| last >= high)
        {
            return None;
        }
        Some(Self {
            high,
            digest: digest.map(str::to_owned),
            open,
        })
    }
}

fn parse_runs(text: &str) -> Option<OpenIds> {
    let mut open = OpenIds::new();
    for run in text.split(',') {
        let (first, last): (i64, i64) = match run.split_once('-') {
            Some((first, last)) => (first.parse().ok()?, last.parse().ok()?),
            None => {
                let id = run.parse().ok()?;
                (id, id)
            }
        };
        // Ascending, without overlaps: the form `Display` writes.
        if last < first || open.last().is_some_and(|before| first <= before) {
            return None;
        }
        open.insert_run(first, last);
    }
    Some(open)
}

/// A set of feed ids kept as runs of consecutive ids: a transaction that
/// wrote a million rows and has not committed is one run, not a million
/// ids.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct OpenIds {
    /// First id of each run → its last id; runs neither overlap nor touch.
    runs: BTreeMap<i64, i64>,
    len: u64,
}

impl OpenIds {
    pub(super) const fn new() -> Self {
        Self {
            runs: BTreeMap::new(),
            len: 0,
        }
    }

    /// How many ids.
    pub(super) fn len(&self) -> u64 {
        self.len
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub(super) fn first(&self) -> Option<i64> {
        self.runs.first_key_value().map(|(&first, _)| first)
    }

    pub(super) fn last(&self) -> Option<i64> {
        self.runs.last_key_value().map(|(_, &last)| last)
    }

    pub(super) fn contains(&self, id: i64) -> bool {
        self.runs
            .range(..=id)
            .next_back()
            .is_some_and(|(_, &last)| id <= last)
    }

    /// Adds `first..=last` (nothing if empty); ids already in stay once.
    pub(super) fn insert_run(&mut self, first: i64, last: i64) {
        if last < first {
            return;
        }
        let (mut first, mut last) = (first, last);
        // Merge with every run that overlaps or touches.
        let touching: Vec<(i64, i64)> = self
            .runs
            .range(..=last.saturating_add(1))
            .rev()
            .take_while(|(_, &end)| end.saturating_add(1) >= first)
            .map(|(&start, &end)| (start, end))
            .collect();
        for (start, end) in touching {
            self.runs.remove(&start);
            self.len -= run_len(start, end);
            first = first.min(start);
            last = last.max(end);
        }
        self.runs.insert(first, last);
        self.len += run_len(first, last);
    }

    /// Removes `id` if it is in.
    pub(super) fn remove(&mut self, id: i64) {
        let Some((&start, &end)) = self.runs.range(..=id).next_back() else {
            return;
        };
        if id > end {
            return;
        }
        self.runs.remove(&start);
        if start < id {
            self.runs.insert(start, id - 1);
        }
        if id < end {
            self.runs.insert(id + 1, end);
        }
        self.len -= 1;
    }

    /// Removes every id up to `id`.
    pub(super) fn remove_up_to(&mut self, id: i64) {
        while let Some((&start, &end)) = self.runs.first_key_value() {
            if start > id {
                return;
            }
            self.runs.remove(&start);
            self.len -= run_len(start, end);
            if end > id {
                self.insert_run(id + 1, end);
                return;
            }
        }
    }

    /// The runs, ascending: first and last id of each.
    pub(super) fn runs(&self) -> impl Iterator<Item = (i64, i64)> + '_ {
        self.runs.iter().map(|(&first, &last)| (first, last))
    }

    /// Every id, ascending.
    pub(super) fn ids(&self) -> impl Iterator<Item = i64> + '_ {
        self.runs().flat_map(|(first, last)| first..=last)
    }
}

impl FromIterator<i64> for OpenIds {
    fn from_iter<I: IntoIterator<Item = i64>>(ids: I) -> Self {
        let mut open = Self::new();
        for id in ids {
            open.insert_run(id, id);
        }
        open
    }
}

fn run_len(first: i64, last: i64) -> u64 {
    last.abs_diff(first) + 1
}

impl fmt::Display for Cursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.digest {
            Some(digest) => write!(f, "{}:{digest}", self.high)?,
            None if self.high == 0 => f.write_str("0")?,
            None => write!(f, "{}:-", self.high)?,
        }
        for (index, (first, last)) in self.open.runs().enumerate() {
            f.write_str(if index == 0 { "~" } else { "," })?;
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
            open: open.iter().copied().collect(),
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
            open: [35].into_iter().collect(),
        };
        assert_eq!(pruned.to_string(), "40:-~35");
        assert_eq!(Cursor::parse("40:-~35"), Some(pruned));
    }

    #[test]
    fn a_long_run_of_open_ids_is_one_run() {
        let mut open = OpenIds::new();
        open.insert_run(10, 5_000_009);
        assert_eq!(open.len(), 5_000_000);
        let written = Cursor {
            high: 6_000_000,
            digest: Some("0011223344556677".to_owned()),
            open,
        };
        let text = written.to_string();
        assert_eq!(text, "6000000:0011223344556677~10-5000009");
        assert_eq!(Cursor::parse(&text), Some(written));
    }

    #[test]
    fn open_ids_are_added_and_removed_as_runs() {
        let mut open: OpenIds = [3, 4, 5, 9].into_iter().collect();
        assert_eq!(open.runs().collect::<Vec<_>>(), [(3, 5), (9, 9)]);
        open.insert_run(6, 8);
        assert_eq!(open.runs().collect::<Vec<_>>(), [(3, 9)]);
        assert_eq!(open.len(), 7);
        open.remove(5);
        open.remove(3);
        open.remove(42);
        assert_eq!(open.runs().collect::<Vec<_>>(), [(4, 4), (6, 9)]);
        assert!(open.contains(7) && !open.contains(5) && !open.contains(10));
        open.remove_up_to(6);
        assert_eq!(open.ids().collect::<Vec<_>>(), [7, 8, 9]);
        assert_eq!(
            (open.first(), open.last(), open.len()),
            (Some(7), Some(9), 3)
        );
        open.remove_up_to(9);
        assert!(open.is_empty());
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
