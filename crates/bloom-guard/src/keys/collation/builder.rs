//! Building a [`Collation`] from a database's weights, character by
//! character and level by level.

use super::{identity, registry, Collation, Level, Table, BMP};

/// The weights of a collation, character by character: see
/// [`Collation::builder`].
#[derive(Debug, Clone)]
pub struct CollationBuilder {
    name: String,
    server: String,
    /// Per level, per BMP character.
    weights: Vec<Vec<Option<Vec<u16>>>>,
    supplementary: Option<Vec<u16>>,
    pad_space: bool,
}

/// Why a collation's weights cannot make a [`Collation`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CollationError {
    /// PAD SPACE, but the space's weights are not exactly one at a level.
    #[error("collation {0} pads with spaces, but the space does not weigh exactly one weight")]
    Padding(String),
    /// A level beyond the third, or with several levels a zero weight (the
    /// levels' separator) or weights outside the BMP.
    #[error("collation {0} has weights at a level the guard does not reproduce")]
    Level(String),
    /// The table covers no character.
    #[error("collation {0} has no weights")]
    Empty(String),
}

impl CollationBuilder {
    pub(super) fn new(name: String, server: String) -> Self {
        Self {
            name,
            server,
            weights: vec![vec![None; BMP]],
            supplementary: None,
            pad_space: false,
        }
    }

    /// Gives character `c` its weights, as the database weighs it alone
    /// (no weights: the database ignores it). Characters outside the Basic
    /// Multilingual Plane are covered only by
    /// [`supplementary`](Self::supplementary); a character never weighed
    /// is not covered.
    #[must_use]
    pub fn weigh(self, c: char, weights: &[u16]) -> Self {
        self.weigh_at(1, c, weights)
    }

    /// Gives character `c` its weights at `level` (1 to 3) of a collation
    /// that compares several (an accent-sensitive one: accents at level
    /// 2; a case-sensitive one: case at level 3), as the database weighs
    /// it alone at that level. A character is covered once weighed at
    /// every level given.
    #[must_use]
    pub fn weigh_at(mut self, level: usize, c: char, weights: &[u16]) -> Self {
        if !(1..=3).contains(&level) {
            self.weights.clear(); // refused by `build`
            return self;
        }
        while self.weights.len() < level {
            self.weights.push(vec![None; BMP]);
        }
        if let Some(slot) = self.weights[level - 1].get_mut(c as usize) {
            *slot = Some(weights.to_vec());
        }
        self
    }

    /// Every character outside the Basic Multilingual Plane weighs
    /// `weights` (MariaDB's `utf8mb4_general_ci` weighs them all as
    /// U+FFFD). Of a collation of one level only.
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
        let several = self.weights.len() > 1;
        let zero = || {
            self.weights
                .iter()
                .flatten()
                .flatten()
                .any(|weights| weights.contains(&0))
        };
        if self.weights.is_empty() || (several && (self.supplementary.is_some() || zero())) {
            return Err(CollationError::Level(self.name));
        }
        let mut covered = vec![0_u64; BMP / 64];
        for c in 0..BMP {
            if self.weights.iter().all(|level| level[c].is_some()) {
                covered[c / 64] |= 1 << (c % 64);
            }
        }
        if covered.iter().all(|bits| *bits == 0) {
            return Err(CollationError::Empty(self.name));
        }
        let mut levels = Vec::with_capacity(self.weights.len());
        for (at, weights) in self.weights.iter().enumerate() {
            let pad = if self.pad_space {
                match weights[usize::from(b' ')].as_deref() {
                    Some(&[space]) => Some(space),
                    _ => return Err(CollationError::Padding(self.name)),
                }
            } else {
                None
            };
            let mut starts = Vec::with_capacity(BMP + 1);
            let mut units = Vec::with_capacity(BMP * 2);
            for weights in weights {
                starts.push(units.len() as u32);
                units.extend_from_slice(weights.as_deref().unwrap_or_default());
            }
            starts.push(units.len() as u32);
            levels.push(Level {
                starts: starts.into(),
                units: units.into(),
                supplementary: (at == 0)
                    .then(|| self.supplementary.clone().map(Into::into))
                    .flatten(),
                pad,
            });
        }
        let table: &'static Table = Box::leak(Box::new(Table {
            name: self.name,
            server: self.server,
            levels: levels.into(),
            covered: covered.into(),
        }));
        registry.insert(identity, table);
        Ok(Collation(table))
    }
}
