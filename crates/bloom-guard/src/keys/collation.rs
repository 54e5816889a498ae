//! Keys compared under a database's collation: each character's weights,
//! as the database itself reported them, and keys the database weighed.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Mutex, OnceLock};

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
/// use bloom_guard::{Collation, Key, KeyType};
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
/// # Ok::<(), bloom_guard::CollationError>(())
/// ```
#[derive(Clone, Copy)]
pub struct Collation(&'static Table);

/// A collation's weights: those of each character the table covers.
struct Table {
    name: String,
    server: String,
    /// `starts[c]..starts[c + 1]` are the weights of BMP character `c`.
    starts: Box<[u32]>,
    units: Box<[u16]>,
    /// Bit `c`: the table covers BMP character `c`.
    covered: Box<[u64]>,
    /// The weights of every character outside the BMP, when the database
    /// gives them all the same ones.
    supplementary: Option<Box<[u16]>>,
    /// PAD SPACE: the space's weight, which trailing weights of it are
    /// compared away.
    pad: Option<u16>,
}

/// The weights of a collation, character by character: see
/// [`Collation::builder`].
#[derive(Debug, Clone)]
pub struct CollationBuilder {
    name: String,
    server: String,
    weights: Vec<Option<Vec<u16>>>,
    supplementary: Option<Vec<u16>>,
    pad_space: bool,
}

/// Why a collation's weights cannot make a [`Collation`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CollationError {
    /// PAD SPACE, but the space's weights are not exactly one.
    #[error("collation {0} pads with spaces, but the space does not weigh exactly one weight")]
    Padding(String),
    /// The table covers no character.
    #[error("collation {0} has no weights")]
    Empty(String),
}

impl CollationBuilder {
    /// Gives character `c` its weights, as the database weighs it alone
    /// (no weights: the database ignores it). Characters outside the Basic
    /// Multilingual Plane are covered only by
    /// [`supplementary`](Self::supplementary); a character never weighed
    /// is not covered.
    #[must_use]
    pub fn weigh(mut self, c: char, weights: &[u16]) -> Self {
        if let Some(slot) = self.weights.get_mut(c as usize) {
            *slot = Some(weights.to_vec());
        }
        self
    }

    /// Every character outside the Basic Multilingual Plane weighs
    /// `weights` (MariaDB's `utf8mb4_general_ci` weighs them all as
    /// U+FFFD).
    #[must_use]
    pub fn supplementary(mut self, weights: &[u16]) -> Self {
        self.supplementary = Some(weights.to_vec());
        self
    }

    /// Whether trailing spaces are compared away (PAD SPACE).
    #[must_use]
    pub fn pad_space(mut self, pad_space: bool) -> Self {
        self.pad_space = pad_space;
        self
    }

    /// The collation, or the one built before under the same name and
    /// server.
    ///
    /// # Errors
    ///
    /// [`CollationError`] for a table that covers nothing, or PAD SPACE
    /// with a space that does not weigh exactly one weight.
    pub fn build(self) -> Result<Collation, CollationError> {
        let identity = identity(&self.name, &self.server);
        let mut registry = registry().lock().unwrap_or_else(|e| e.into_inner());
        if let Some(table) = registry.get(&identity) {
            return Ok(Collation(table));
        }
        let pad = if self.pad_space {
            match self.weights.get(usize::from(b' ')).cloned().flatten() {
                Some(space) if space.len() == 1 => Some(space[0]),
                _ => return Err(CollationError::Padding(self.name)),
            }
        } else {
            None
        };
        if self.weights.iter().all(Option::is_none) {
            return Err(CollationError::Empty(self.name));
        }
        let mut starts = Vec::with_capacity(BMP + 1);
        let mut units = Vec::with_capacity(BMP * 2);
        let mut covered = vec![0_u64; BMP / 64];
        for (c, weights) in self.weights.iter().enumerate() {
            starts.push(units.len() as u32);
            if let Some(weights) = weights {
                units.extend_from_slice(weights);
                covered[c / 64] |= 1 << (c % 64);
            }
        }
        starts.push(units.len() as u32);
        let table: &'static Table = Box::leak(Box::new(Table {
            name: self.name,
            server: self.server,
            starts: starts.into(),
            units: units.into(),
            covered: covered.into(),
            supplementary: self.supplementary.map(Into::into),
            pad,
        }));
        registry.insert(identity, table);
        Ok(Collation(table))
    }
}

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
        CollationBuilder {
            name: name.into(),
            server: server.into(),
            weights: vec![None; BMP],
            supplementary: None,
            pad_space: false,
        }
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
        self.0.pad.is_some()
    }

    /// A stored key as the database weighed it (`WEIGHT_STRING(key)` on
    /// MySQL and MariaDB): the form in which a follower hands the guard a
    /// stored key under this collation, exact whatever characters it
    /// holds.
    ///
    /// # Example
    ///
    /// ```
    /// # use bloom_guard::Collation;
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
        let mut weights = Vec::with_capacity(text.len() * 2);
        for c in text.chars() {
            let c = c as usize;
            let units = if c < BMP {
                if table.covered[c / 64] & (1 << (c % 64)) == 0 {
                    return None;
                }
                &table.units[table.starts[c] as usize..table.starts[c + 1] as usize]
            } else {
                table.supplementary.as_deref()?
            };
            for unit in units {
                weights.extend_from_slice(&unit.to_be_bytes());
            }
        }
        Some(self.trimmed(weights))
    }

    /// A stored key in canonical form: the weights of a key the database
    /// weighed ([`weighed`](Self::weighed)), without trailing pad weights;
    /// otherwise its text's [`weights`](Self::weights), or `None` for text
    /// with a character the table does not cover.
    ///
    /// # Example
    ///
    /// ```
    /// # use bloom_guard::Collation;
    /// let mut builder = Collation::builder("doc_stored_ci", "example 1.0");
    /// for (c, weight) in [(' ', 0x20), ('a', 0x41), ('A', 0x41)] {
    ///     builder = builder.weigh(c, &[weight]);
    /// }
    /// let ci = builder.pad_space(true).build()?;
    /// let weighed = Collation::weighed(&[0, 0x41, 0, 0x20]); // `a ` as the database weighs it
    /// assert_eq!(ci.stored(&weighed), ci.weights("A"));
    /// # Ok::<(), bloom_guard::CollationError>(())
    /// ```
    pub fn stored(&self, key: &[u8]) -> Option<Vec<u8>> {
        match key.split_first() {
            Some((&WEIGHED, weights)) if weights.len().is_multiple_of(2) => {
                Some(self.trimmed(weights.to_vec()))
            }
            _ => self.weights(std::str::from_utf8(key).ok()?),
        }
    }

    /// `weights` without trailing pad weights (PAD SPACE).
    fn trimmed(&self, mut weights: Vec<u8>) -> Vec<u8> {
        if let Some(pad) = self.0.pad {
            let pad = pad.to_be_bytes();
            while weights.len() >= 2 && weights[weights.len() - 2..] == pad {
                weights.truncate(weights.len() - 2);
            }
        }
        weights
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
