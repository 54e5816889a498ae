//! Keys from axum path parameters (feature `axum`, on by default).

use http::Request;

use crate::extract::KeyExtractor;
use crate::key::{Key, KeyError};

/// The value of a named axum path parameter, such as `key` in `/items/{key}`.
///
/// Decoded as axum's `Path` extractor decodes it ([`Key::from_percent_encoded`]):
/// `%2e%2e` is the key `..`, and a malformed escape such as `100%` stays as
/// it is. A differential test runs axum's own extractor on arbitrary paths
/// and checks that the guard reads the same value or passes the request.
///
/// Reads axum's [`MatchedPath`](axum::extract::MatchedPath), so the guard
/// must sit inside the router: use `Router::route_layer` (recommended: unknown
/// routes keep their normal 404) or `Router::layer`. Placed anywhere else it
/// cannot find keys: requests pass unchecked, are counted in
/// [`Stats::unguarded`](crate::Stats::unguarded), and the first is logged
/// at warn level. A catch-all
/// parameter (`/files/{*key}`) works for routers that are not nested; use a
/// closure for those.
///
/// # Example
///
/// ```
/// use axum::{routing::get, Router};
/// use bloom_guard::{BloomGuard, PathParam};
///
/// let guard = BloomGuard::builder().build();
/// let app: Router = Router::new()
///     .route("/items/{key}", get(|| async { "found" }))
///     .route_layer(guard.layer(PathParam("key")));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathParam(pub &'static str);

impl<B> KeyExtractor<B> for PathParam {
    fn extract<'r>(&self, req: &'r Request<B>) -> Result<Option<Key<'r>>, KeyError> {
        let Some(matched) = req.extensions().get::<axum::extract::MatchedPath>() else {
            return Err(KeyError::Unguardable(
                "PathParam found no axum MatchedPath: put the layer on the router with route_layer",
            ));
        };
        Ok(path_param(matched.as_str(), req.uri().path(), self.0).map(Key::from_percent_encoded))
    }
}

/// Several axum path parameters as one composite key, for a table whose key
/// is several columns: each decoded value prefixed by its length in bytes
/// and a colon (`/orders/{tenant}/{number}` with `42` and `abc` gives
/// `2:423:abc`), the encoding `bloom_guard_sqlx::Watch` gives rows with
/// several key columns. A request missing one of the parameters has no key.
///
/// # Example
///
/// ```
/// use axum::{routing::get, Router};
/// use bloom_guard::{BloomGuard, PathParams};
///
/// let orders = BloomGuard::builder().name("orders").build();
/// let app: Router = Router::new()
///     .route("/orders/{tenant}/{number}", get(|| async { "an order" }))
///     .route_layer(orders.layer(PathParams(&["tenant", "number"])));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathParams(pub &'static [&'static str]);

impl<B> KeyExtractor<B> for PathParams {
    fn extract<'r>(&self, req: &'r Request<B>) -> Result<Option<Key<'r>>, KeyError> {
        let mut composite = Vec::new();
        for &name in self.0 {
            let Some(part) = PathParam(name).extract(req)? else {
                return Ok(None);
            };
            composite.extend_from_slice(part.len().to_string().as_bytes());
            composite.push(b':');
            composite.extend_from_slice(part.as_bytes());
        }
        Ok(Some(Key::from(composite)))
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
