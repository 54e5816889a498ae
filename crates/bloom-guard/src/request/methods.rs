//! Which request methods a guard checks.

use http::Method;

/// A set of the standard HTTP methods: the ones a guard checks. Requests
/// with any other method reach the inner service untouched.
///
/// The default is [`READS`](Self::READS), `GET` and `HEAD`: a guard answers
/// "absent" only where the unguarded service would look the key up and
/// answer "not found". A `PUT` that creates a key, a `DELETE`, an `OPTIONS`
/// or a 405 must get exactly the unguarded service's answer; guarding them
/// would refuse writes and tell an attacker which keys the filter holds.
///
/// # Example
///
/// ```
/// use bloom_guard::service::Methods;
/// use http::Method;
///
/// let reads = Methods::READS;
/// assert!(reads.contains(&Method::HEAD) && !reads.contains(&Method::PUT));
/// let with_patch = reads.with(&Method::PATCH);
/// assert!(with_patch.contains(&Method::PATCH));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Methods(u16);

/// The standard methods, each with its bit.
const STANDARD: [Method; 9] = [
    Method::GET,
    Method::HEAD,
    Method::POST,
    Method::PUT,
    Method::DELETE,
    Method::CONNECT,
    Method::OPTIONS,
    Method::TRACE,
    Method::PATCH,
];

fn bit(method: &Method) -> u16 {
    STANDARD
        .iter()
        .position(|standard| standard == method)
        .map_or(0, |i| 1 << i)
}

impl Methods {
    /// `GET` and `HEAD`, the default.
    pub const READS: Self = Self(0b11);

    /// No method: the guard checks nothing.
    pub const NONE: Self = Self(0);

    /// This set and `method` (a non-standard method is never checked).
    #[must_use]
    pub fn with(self, method: &Method) -> Self {
        Self(self.0 | bit(method))
    }

    /// Whether requests with `method` are checked.
    pub fn contains(self, method: &Method) -> bool {
        self.0 & bit(method) != 0
    }
}

impl Default for Methods {
    fn default() -> Self {
        Self::READS
    }
}

impl FromIterator<Method> for Methods {
    fn from_iter<I: IntoIterator<Item = Method>>(methods: I) -> Self {
        methods
            .into_iter()
            .fold(Self::NONE, |set, method| set.with(&method))
    }
}
