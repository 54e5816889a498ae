//! Keys compared under a database's collation: each character's weights,
//! as the database itself reported them, and keys the database weighed.

mod builder;

use std::collections::HashMap;
use std::fmt;
use std::sync::{Mutex, OnceLock};

pub use builder::{CollationBuilder, CollationError};

/// The first byte of a stored key given as the database's own weights
/// (see [`Collation::weighed`]): never the first byte of UTF-8 text.
pub(crate) const WEIGHED: u8 = 0xff;

/// Code points of the Basic Multilingual Plane.
const BMP: usize = 0x1_0000;

/// A case- or accent-insensitive collation of a database, reproduced from
/// the weights the database gives each character: two keys the database
/// calls equal have the same weights, so the guard holds and looks up
/// weights, not spellings ([`KeyType::Collated`](crate::KeyType::Collated)).
///
/// A collation is built once per process from a table of weights (the
/// followers of `bloom_guard_sqlx` read it from the database with
/// `WEIGHT_STRING`) and lives as long as the process; building the same
/// collation again returns the first one.
///
/// The table covers characters whose weight does not depend on their
/// neighbours. A request key holding any other character (one the table
/// leaves out: a combining mark that may contract with the letter before
/// it, a character outside the Basic Multilingual Plane) passes to the
/// handler unchecked; stored keys are weighed by the database itself
/// ([`weighed`](Self::weighed)), so every stored key is held exactly.
///
/// # Example
///
/// ```
/// use bloom_guard::{keys::{Collation, Key}, KeyType};
///
/// // A toy collation that ignores ASCII case and pads with spaces.
/// let mut weights = Collation::builder("toy_ci", "example 1.0");
/// for c in ' '..='~' {
///     weights = weights.weigh(c, &[u16::from(c.to_ascii_uppercase() as u8)]);
/// }
/// let toy = weights.pad_space(true).build()?;
/// let key_type = KeyType::Collated(toy);
/// assert_eq!(
///     key_type.to_canonical(Key::from("Apple ")),
///     key_type.to_canonical(Key::from("APPLE"))
/// );
/// // A character the table leaves out: the request is passed unchecked.
/// assert!(key_type.to_canonical(Key::from("café")).is_err());
/// # Ok::<(), bloom_guard::keys::CollationError>(())
/// ```
#[derive(Clone, Copy)]
pub struct Collation(&'static Table);

/// A collation's weights: those of each character the table covers, level
/// by level.
struct Table {
    name: String,
    server: String,
    levels: Box<[Level]>,
    /// Bit `c`: the table covers BMP character `c` (at every level).
    covered: Box<[u64]>,
}

/// The weights of one level (primary: letters; secondary: accents;
/// tertiary: case).
struct Level {
    /// `starts[c]..starts[c + 1]` are the weights of BMP character `c`.
    starts: Box<[u32]>,
    units: Box<[u16]>,
    /// The weights of every character outside the BMP, when the database
    /// gives them all the same ones.
    supplementary: Option<Box<[u16]>>,
    /// PAD SPACE: the space's weight, which trailing weights of it are
    /// compared away.
    pad: Option<u16>,
}

/// What separates the levels of a key's weights: a collation of several
/// levels has no zero weight (`build` refuses one that has).
const LEVEL_SEPARATOR: [u8; 2] = [0, 0];

/// Every collation built in this process, by identity: a table is built
/// once per collation and server, however many guards use it.
fn registry() -> &'static Mutex<HashMap<String, &'static Table>> {
    static REGISTRY: OnceLock<Mutex<HashMap<String, &'static Table>>> = OnceLock::new();
    REGISTRY.get_or_init(Mutex::default)
}

fn identity(name: &str, server: &str) -> String {
    format!("{name} on {server}")
}

impl Collation {
    /// Starts a collation's weights: `name` as the database names the
    /// collation, `server` the database's name and version (weights are
    /// the server's: another server's are another collation).
    pub fn builder(name: impl Into<String>, server: impl Into<String>) -> CollationBuilder {
        CollationBuilder::new(name.into(), server.into())
    }

    /// A collation built before in this process, by its
    /// [`identity`](Self::identity).
    pub fn find(identity: &str) -> Option<Collation> {
        let registry = registry().lock().unwrap_or_else(|e| e.into_inner());
        registry.get(identity).map(|table| Collation(table))
    }

    /// The collation's name, as the database names it.
    pub fn name(&self) -> &str {
        &self.0.name
    }

    /// The database server whose weights these are.
    pub fn server(&self) -> &str {
        &self.0.server
    }

    /// The name and the server: what tells two collations apart.
    pub fn identity(&self) -> String {
        identity(self.name(), self.server())
    }

    /// Whether trailing spaces are compared away (PAD SPACE).
    pub fn pads_spaces(&self) -> bool {
        self.0.levels.iter().any(|level| level.pad.is_some())
    }

    /// The number of levels it compares (1: letters only; 2: accents too;
    /// 3: case too).
    pub fn levels(&self) -> usize {
        self.0.levels.len()
    }

    /// A stored key as the database weighed it (`WEIGHT_STRING(key)` on
    /// MySQL and MariaDB): the form in which a follower hands the guard a
    /// stored key under this collation, exact whatever characters it
    /// holds.
    ///
    /// # Example
    ///
    /// ```
    /// # use bloom_guard::keys::Collation;
    /// let weighed = Collation::weighed(&[0x0e, 0x33]);
    /// assert_eq!(weighed, [0xff, 0x0e, 0x33]);
    /// ```
    pub fn weighed(weights: &[u8]) -> Vec<u8> {
        let mut key = Vec::with_capacity(weights.len() + 1);
        key.push(WEIGHED);
        key.extend_from_slice(weights);
        key
    }

    /// `text`'s weights, as big-endian bytes without trailing pad
    /// weights, or `None` if it holds a character the table does not
    /// cover.
    pub fn weights(&self, text: &str) -> Option<Vec<u8>> {
        let table = self.0;
        let mut weights = Vec::with_capacity(text.len() * 2 * table.levels.len());
        for (at, level) in table.levels.iter().enumerate() {
            if at > 0 {
                weights.extend_from_slice(&LEVEL_SEPARATOR);
            }
            let from = weights.len();
            for c in text.chars() {
                let c = c as usize;
                let units = if c < BMP {
                    if table.covered[c / 64] & (1 << (c % 64)) == 0 {
                        return None;
                    }
                    &level.units[level.starts[c] as usize..level.starts[c + 1] as usize]
                } else {
                    level.supplementary.as_deref()?
                };
                for unit in units {
                    weights.extend_from_slice(&unit.to_be_bytes());
                }
            }
            trim(&mut weights, from, level.pad);
        }
        Some(weights)
    }

    /// A stored key in canonical form: the weights of a key the database
    /// weighed ([`weighed`](Self::weighed)), without trailing pad weights;
    /// otherwise its text's [`weights`](Self::weights), or `None` for text
    /// with a character the table does not cover.
    ///
    /// # Example
    ///
    /// ```
    /// # use bloom_guard::keys::Collation;
    /// let mut builder = Collation::builder("doc_stored_ci", "example 1.0");
    /// for (c, weight) in [(' ', 0x20), ('a', 0x41), ('A', 0x41)] {
    ///     builder = builder.weigh(c, &[weight]);
    /// }
    /// let ci = builder.pad_space(true).build()?;
    /// let weighed = Collation::weighed(&[0, 0x41, 0, 0x20]); // `a ` as the database weighs it
    /// assert_eq!(ci.stored(&weighed), ci.weights("A"));
    /// # Ok::<(), bloom_guard::keys::CollationError>(())
    /// ```
    pub fn stored(&self, key: &[u8]) -> Option<Vec<u8>> {
        match key.split_first() {
            Some((&WEIGHED, weights)) if weights.len().is_multiple_of(2) => self.trimmed(weights),
            _ => self.weights(std::str::from_utf8(key).ok()?),
        }
    }

    /// Weights the database gave, level after level with
    /// [`LEVEL_SEPARATOR`] between, each level without trailing pad
    /// weights; `None` for another number of levels.
    fn trimmed(&self, weights: &[u8]) -> Option<Vec<u8>> {
        let levels = &self.0.levels;
        if let [level] = &levels[..] {
            // One level: a zero weight is a weight (U+0000 under
            // `general_ci`), not a separator.
            let mut trimmed = weights.to_vec();
            trim(&mut trimmed, 0, level.pad);
            return Some(trimmed);
        }
        let mut trimmed = Vec::with_capacity(weights.len());
        let mut parts = weights.chunks_exact(2);
        for (at, level) in levels.iter().enumerate() {
            if at > 0 {
                trimmed.extend_from_slice(&LEVEL_SEPARATOR);
            }
            let from = trimmed.len();
            for unit in parts.by_ref() {
                if unit == LEVEL_SEPARATOR {
                    if at + 1 == levels.len() {
                        return None; // more levels than the table's
                    }
                    break;
                }
                trimmed.extend_from_slice(unit);
            }
            trim(&mut trimmed, from, level.pad);
        }
        Some(trimmed)
    }
}

/// Drops the trailing `pad` weights of the level that starts at `from`.
fn trim(weights: &mut Vec<u8>, from: usize, pad: Option<u16>) {
    if let Some(pad) = pad {
        let pad = pad.to_be_bytes();
        while weights.len() >= from + 2 && weights[weights.len() - 2..] == pad {
            weights.truncate(weights.len() - 2);
        }
    }
}

impl PartialEq for Collation {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self.0, other.0)
    }
}

impl Eq for Collation {}

impl fmt::Debug for Collation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Collation({})", self.identity())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toy(name: &str, pad: bool) -> Collation {
        let mut builder = Collation::builder(name, "test");
        for c in ' '..='~' {
            builder = builder.weigh(c, &[u16::from(c.to_ascii_uppercase() as u8)]);
        }
        builder
            .weigh('ß', &[u16::from(b'S'), u16::from(b'S')])
            .weigh('\u{200b}', &[])
            .pad_space(pad)
            .build()
            .expect("weights")
    }

    #[test]
    fn equal_spellings_weigh_the_same() {
        let ci = toy("toy_pad", true);
        let form = |text| ci.weights(text).expect("covered");
        assert_eq!(form("strasse"), form("STRAßE"));
        assert_eq!(form("a b"), form("A B  "));
        assert_eq!(form("ab"), form("a\u{200b}b"));
        assert_eq!(form("a \u{200b}"), form("a"), "an ignorable after a pad");
        assert_ne!(form("a b"), form("ab"));
        assert_eq!(ci.weights("é"), None);
        let no_pad = toy("toy_nopad", false);
        assert_ne!(no_pad.weights("a "), no_pad.weights("a"));
    }

    #[test]
    fn a_weighed_key_is_its_weights() {
        let ci = toy("toy_weighed", true);
        let weighed = Collation::weighed(&[0, 0x41, 0, 0x20, 0, 0x20]);
        assert_eq!(ci.stored(&weighed), Some(vec![0, 0x41]));
        assert_eq!(ci.stored(b"a "), ci.weights("A"));
        assert_eq!(ci.stored("é".as_bytes()), None);
        assert_eq!(ci.stored(&[WEIGHED, 1]), None, "odd weights");
        // A zero weight is a weight with one level (U+0000 under general_ci).
        let nul = Collation::builder("toy_nul", "test")
            .weigh('\0', &[0])
            .weigh('a', &[0x41])
            .build()
            .expect("weights");
        assert_eq!(
            nul.stored(&Collation::weighed(&[0, 0x41, 0, 0])),
            nul.weights("a\0")
        );
        let zero_at_two = Collation::builder("toy_zero_levels", "test")
            .weigh('a', &[0x41])
            .weigh_at(2, 'a', &[0])
            .build();
        assert!(matches!(zero_at_two, Err(CollationError::Level(_))));
    }

    #[test]
    fn accents_are_a_second_level() {
        // Letters at level 1, an acute accent at level 2 (0x21; none: 0x20).
        let mut builder = Collation::builder("toy_as_ci", "test").pad_space(true);
        for c in ' '..='~' {
            let letter = u16::from(c.to_ascii_uppercase() as u8);
            builder = builder.weigh(c, &[letter]).weigh_at(2, c, &[0x20]);
        }
        let builder = builder
            .weigh('é', &[u16::from(b'E')])
            .weigh_at(2, 'é', &[0x20, 0x21]);
        let accents = builder.build().expect("weights");
        assert_eq!(accents.levels(), 2);
        let form = |text| accents.weights(text).expect("covered");
        assert_eq!(form("cafe"), form("CAFE  "));
        assert_ne!(form("cafe"), form("café"));
        // As the database gives `café ` level by level.
        let weighed = Collation::weighed(&[
            0, 0x43, 0, 0x41, 0, 0x46, 0, 0x45, 0, 0x20, 0, 0, 0, 0x20, 0, 0x20, 0, 0x20, 0, 0x20,
            0, 0x21, 0, 0x20,
        ]);
        assert_eq!(
            accents.stored(&weighed),
            Some(form("CAFÉ".to_lowercase().as_str()))
        );
        let three = [0, 0x41, 0, 0, 0, 0x20, 0, 0, 0, 0x20];
        assert_eq!(
            accents.stored(&Collation::weighed(&three)),
            None,
            "three levels"
        );
    }

    #[test]
    fn one_table_per_collation_and_server() {
        let first = toy("toy_once", true);
        let again = toy("toy_once", true);
        assert_eq!(first, again);
        assert_eq!(Collation::find("toy_once on test"), Some(first));
        assert_eq!(Collation::find("toy_once on another"), None);
        let padding = Collation::builder("toy_bad", "test")
            .weigh(' ', &[1, 2])
            .pad_space(true)
            .build();
        assert_eq!(padding, Err(CollationError::Padding("toy_bad".to_owned())));
    }
}
