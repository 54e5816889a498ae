//! Where in a request the key is found.

use http::{HeaderName, Request};

use crate::keys::key::{Key, KeyError};

/// Finds a request's key.
///
/// Returning `Ok(None)` means the request has no key: the guard passes it on
/// untouched. Returning an error passes it on unchecked, counted under the
/// error's [`reason`](KeyError::reason): an extractor that cannot read the
/// key exactly as the application will must not guess.
///
/// Implemented by the extractors of this module and by any closure
/// `Fn(&Request<B>) -> Option<K>` where `K` converts into a [`Key`] (a
/// `String`, a `Vec<u8>`, a `Key<'static>`).
///
/// # Example
///
/// ```
/// use axum::body::Body;
/// use bloom_guard::BloomGuard;
/// use http::Request;
///
/// // The key is the `X-Tenant` header and the last path segment, joined.
/// let guard = BloomGuard::builder().build();
/// let layer = guard.layer(|req: &Request<Body>| {
///     let tenant = req.headers().get("x-tenant")?.to_str().ok()?;
///     let id = req.uri().path().rsplit('/').next()?;
///     Some(format!("{tenant}:{id}"))
/// });
/// # drop(layer);
/// ```
pub trait KeyExtractor<B>: Clone {
    /// Extracts the key of `req`, borrowing from it where possible.
    ///
    /// # Errors
    ///
    /// A [`KeyError`] when the key cannot be read as the application reads
    /// it; the request then passes unchecked.
    fn extract<'r>(&self, req: &'r Request<B>) -> Result<Option<Key<'r>>, KeyError>;
}

impl<B, F, K> KeyExtractor<B> for F
where
    F: Fn(&Request<B>) -> Option<K> + Clone,
    K: Into<Key<'static>>,
{
    fn extract<'r>(&self, req: &'r Request<B>) -> Result<Option<Key<'r>>, KeyError> {
        Ok(self(req).map(Into::into))
    }
}

/// The path segment at an index (0 is the segment after the first `/`),
/// percent-decoded as axum's `Path` decodes it (see
/// [`Key::from_percent_encoded`]). Works outside axum, in any tower stack.
///
/// # Example
///
/// ```
/// use bloom_guard::{BloomGuard, extract::PathSegment};
///
/// // `/items/{key}`: the key is segment 1.
/// let guard = BloomGuard::builder().build();
/// let layer = guard.layer(PathSegment(1));
/// # drop(layer);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathSegment(pub usize);

impl<B> KeyExtractor<B> for PathSegment {
    fn extract<'r>(&self, req: &'r Request<B>) -> Result<Option<Key<'r>>, KeyError> {
        let path = req.uri().path();
        let segment = path
            .strip_prefix('/')
            .unwrap_or(path)
            .split('/')
            .nth(self.0);
        Ok(segment
            .filter(|s| !s.is_empty())
            .map(Key::from_percent_encoded))
    }
}

/// A query string parameter, decoded as a form value (`+` is a space), as
/// axum's `Query` extractor decodes it. A parameter given twice passes
/// unchecked ([`KeyError::Ambiguous`]): axum's `Query` refuses it for a
/// struct and takes the last one for a map.
///
/// # Example
///
/// ```
/// use bloom_guard::{BloomGuard, extract::QueryParam};
///
/// // `/lookup?id=42`
/// let guard = BloomGuard::builder().build();
/// let layer = guard.layer(QueryParam("id"));
/// # drop(layer);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueryParam(pub &'static str);

impl<B> KeyExtractor<B> for QueryParam {
    fn extract<'r>(&self, req: &'r Request<B>) -> Result<Option<Key<'r>>, KeyError> {
        let Some(query) = req.uri().query() else {
            return Ok(None);
        };
        let mut values = form_urlencoded::parse(query.as_bytes())
            .filter(|(name, _)| name == self.0)
            .map(|(_, value)| value);
        let Some(value) = values.next() else {
            return Ok(None);
        };
        if values.next().is_some() {
            return Err(KeyError::Ambiguous);
        }
        Ok(Some(Key::from(value)))
    }
}

/// The raw bytes of a request header.
///
/// # Example
///
/// ```
/// use bloom_guard::{BloomGuard, extract::Header};
/// use http::HeaderName;
///
/// let guard = BloomGuard::builder().build();
/// let layer = guard.layer(Header(HeaderName::from_static("x-api-key")));
/// # drop(layer);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header(pub HeaderName);

impl<B> KeyExtractor<B> for Header {
    fn extract<'r>(&self, req: &'r Request<B>) -> Result<Option<Key<'r>>, KeyError> {
        Ok(req
            .headers()
            .get(&self.0)
            .map(|value| Key::from(value.as_bytes())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(uri: &str) -> Request<()> {
        Request::builder()
            .uri(uri)
            .body(())
            .expect("valid test uri")
    }

    fn bytes(key: Option<Key<'_>>) -> Option<Vec<u8>> {
        key.map(|k| k.as_bytes().to_vec())
    }

    #[test]
    fn path_segment_counts_from_the_first_slash() {
        assert_eq!(
            bytes(PathSegment(1).extract(&request("/items/a%09b")).unwrap()),
            Some(b"a\tb".to_vec())
        );
        assert_eq!(
            bytes(PathSegment(0).extract(&request("/items/x")).unwrap()),
            Some(b"items".to_vec())
        );
        assert_eq!(
            bytes(PathSegment(2).extract(&request("/items/x")).unwrap()),
            None
        );
        assert_eq!(
            bytes(PathSegment(1).extract(&request("/items/")).unwrap()),
            None
        );
        for (raw, decoded) in [("100%", "100%"), ("%2e%2e", ".."), ("a%ZZ", "a%ZZ")] {
            let uri = format!("/items/{raw}");
            assert_eq!(
                bytes(PathSegment(1).extract(&request(&uri)).unwrap()),
                Some(decoded.as_bytes().to_vec())
            );
        }
    }

    #[test]
    fn query_param_decodes_form_values() {
        let req = request("/lookup?x=1&id=a+b%2Bc%26&y=2");
        assert_eq!(
            bytes(QueryParam("id").extract(&req).unwrap()),
            Some(b"a b+c&".to_vec())
        );
        assert_eq!(
            bytes(QueryParam("id").extract(&request("/lookup")).unwrap()),
            None
        );
        assert_eq!(
            bytes(QueryParam("id").extract(&request("/lookup?idx=1")).unwrap()),
            None
        );
        assert_eq!(
            QueryParam("id").extract(&request("/lookup?id=1&i%64=2")),
            Err(KeyError::Ambiguous)
        );
    }

    #[test]
    fn header_takes_raw_bytes() {
        let req = Request::builder()
            .header("x-api-key", "k\\1")
            .body(())
            .expect("valid test request");
        let extractor = Header(HeaderName::from_static("x-api-key"));
        assert_eq!(
            bytes(extractor.extract(&req).unwrap()),
            Some(b"k\\1".to_vec())
        );
    }

    #[test]
    fn closures_are_extractors() {
        let extractor = |req: &Request<()>| req.uri().query().map(str::to_owned);
        assert_eq!(
            bytes(extractor.extract(&request("/?abc")).unwrap()),
            Some(b"abc".to_vec())
        );
    }
}
