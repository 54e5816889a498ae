//! Keys as the guard holds them: [`Key`], the canonical bytes a filter holds
//! and a request is looked up by; [`KeyBatch`], many in one buffer; and a
//! database's [`Collation`], for keys compared as the database compares them.
//!
//! Inside the crate: the canonical bytes a filter holds and a request is looked up by
//! (`key`), many of them in one buffer (`batch`), and the canonical form of
//! each kind of key, shared by the feed, the scan and the request path
//! (`key_type`), with the weights of a database's collation (`collation`).
//!
//! The ground floor: uses nothing else of the crate.

pub(crate) mod batch;
pub(crate) mod collation;
pub(crate) mod key;
pub(crate) mod key_type;

pub use batch::KeyBatch;
pub use collation::{Collation, CollationBuilder, CollationError};
pub use key::{Key, KeyError};
