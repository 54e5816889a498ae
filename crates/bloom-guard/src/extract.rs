//! Where in a request the key is found.

use http::{HeaderName, Request};

use crate::key::{Key, KeyError};

/// Finds a request's key.
///
/// Returning `Ok(None)` means the request has no key: the guard passes it on
/// untouched. Returning an error answers the request with a 400 before any
/// hashing.
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
/// let guard = BloomGuard::builder()
///     .key(|req: &Request<Body>| {
///         let tenant = req.headers().get("x-tenant")?.to_str().ok()?;
///         let id = req.uri().path().rsplit('/').next()?;
///         Some(format!("{tenant}:{id}"))
///     })
///     .build();
/// # drop(guard);
/// ```
pub trait KeyExtractor<B>: Clone {
    /// Extracts the key of `req`, borrowing from it where possible.
    ///
    /// # Errors
    ///
    /// A [`KeyError`] when the request names a key that can never exist.
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

/// The value of a named axum path parameter, such as `key` in `/items/{key}`.
///
/// Decoded with [`Key::from_path_segment`]: malformed escapes and dot
/// segments get a 400.
///
/// Reads axum's [`MatchedPath`](axum::extract::MatchedPath), so the guard
/// must sit inside the router: use `Router::route_layer` (recommended: unknown
/// routes keep their normal 404) or `Router::layer`. The value is
/// percent-decoded exactly as axum's `Path` extractor decodes it. A catch-all
/// parameter (`/files/{*key}`) works for routers that are not nested; use a
/// closure for those.
///
/// # Example
///
/// ```
/// use axum::{routing::get, Router};
/// use bloom_guard::{BloomGuard, PathParam};
///
/// let guard = BloomGuard::builder().key(PathParam("key")).build();
/// let app: Router = Router::new()
///     .route("/items/{key}", get(|| async { "found" }))
///     .route_layer(guard);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathParam(pub &'static str);

impl<B> KeyExtractor<B> for PathParam {
    fn extract<'r>(&self, req: &'r Request<B>) -> Result<Option<Key<'r>>, KeyError> {
        let Some(matched) = req.extensions().get::<axum::extract::MatchedPath>() else {
            return Ok(None);
        };
        path_param(matched.as_str(), req.uri().path(), self.0)
            .map(Key::from_path_segment)
            .transpose()
    }
}

/// Finds the raw (still percent-encoded) value of parameter `name` of the
/// route `template` in `path`.
///
/// Segments are counted from the end, because a nested router sees its own
/// part of the path while `MatchedPath` holds the whole route.
fn path_param<'p>(template: &str, path: &'p str, name: &str) -> Option<&'p str> {
    // The common route, `/.../{name}`: the last segment, found from the end.
    if let Some(last) = template.strip_suffix('}') {
        if last.ends_with(name) && last[..last.len() - name.len()].ends_with("/{") {
            return path.rsplit_once('/').map(|(_, value)| value);
        }
    }
    let is_param = |segment: &str, wildcard: bool| {
        let inner = segment.strip_prefix('{')?.strip_suffix('}')?;
        let inner = if wildcard {
            inner.strip_prefix('*')?
        } else {
            inner
        };
        (inner == name).then_some(())
    };
    if let Some(last) = template.rsplit('/').next() {
        if is_param(last, true).is_some() {
            let before = template.split('/').count() - 1;
            return path.splitn(before + 1, '/').nth(before);
        }
    }
    let from_end = template
        .rsplit('/')
        .position(|s| is_param(s, false).is_some())?;
    path.rsplit('/').nth(from_end)
}

/// The path segment at an index (0 is the segment after the first `/`),
/// percent-decoded. Works outside axum, in any tower stack.
///
/// # Example
///
/// ```
/// use bloom_guard::{BloomGuard, PathSegment};
///
/// // `/items/{key}`: the key is segment 1.
/// let guard = BloomGuard::builder().key(PathSegment(1)).build();
/// # drop(guard);
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
/// axum's `Query` extractor decodes it.
///
/// # Example
///
/// ```
/// use bloom_guard::{BloomGuard, QueryParam};
///
/// // `/lookup?id=42`
/// let guard = BloomGuard::builder().key(QueryParam("id")).build();
/// # drop(guard);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueryParam(pub &'static str);

impl<B> KeyExtractor<B> for QueryParam {
    fn extract<'r>(&self, req: &'r Request<B>) -> Result<Option<Key<'r>>, KeyError> {
        let Some(query) = req.uri().query() else {
            return Ok(None);
        };
        Ok(form_urlencoded::parse(query.as_bytes())
            .find(|(name, _)| name == self.0)
            .map(|(_, value)| Key::from(value)))
    }
}

/// The raw bytes of a request header.
///
/// # Example
///
/// ```
/// use bloom_guard::{BloomGuard, Header};
/// use http::HeaderName;
///
/// let guard = BloomGuard::builder()
///     .key(Header(HeaderName::from_static("x-api-key")))
///     .build();
/// # drop(guard);
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
    fn path_param_finds_the_named_segment() {
        assert_eq!(
            path_param("/items/{key}", "/items/a%2Fb", "key"),
            Some("a%2Fb")
        );
        assert_eq!(
            path_param("/t/{tenant}/items/{key}", "/t/x/items/y", "tenant"),
            Some("x")
        );
        assert_eq!(
            path_param("/t/{tenant}/items/{key}", "/t/x/items/y", "key"),
            Some("y")
        );
        // nested: the router saw `/items/y` while the route is `/api/items/{key}`
        assert_eq!(path_param("/api/items/{key}", "/items/y", "key"), Some("y"));
        assert_eq!(
            path_param("/files/{*key}", "/files/a/b%20c", "key"),
            Some("a/b%20c")
        );
        assert_eq!(path_param("/items/{id}", "/items/y", "key"), None);
        assert_eq!(path_param("/items/key", "/items/key", "key"), None);
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
