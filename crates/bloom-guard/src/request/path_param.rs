//! Keys from axum path parameters (feature `axum`, on by default).

use http::Request;

use crate::keys::key::{Key, KeyError};
use crate::request::extract::KeyExtractor;

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
/// use bloom_guard::{BloomGuard, extract::PathParam};
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
        path_param(matched.as_str(), req.uri().path(), self.0)
            .map(|raw| raw.map(Key::from_percent_encoded))
            .map_err(KeyError::Unguardable)
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
/// use bloom_guard::{BloomGuard, extract::PathParams};
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
/// route `template` in `path`: `Ok(None)` if the route has no such
/// parameter, an error if the path cannot be lined up with the route.
///
/// A nested router sees its own part of the path while `MatchedPath` holds
/// the whole route, so the segments are lined up from the start when the
/// route's literal segments match there, else from the end; a route with a
/// catch-all can only be lined up from the start.
fn path_param<'p>(
    template: &str,
    path: &'p str,
    name: &str,
) -> Result<Option<&'p str>, &'static str> {
    // The common route, `/.../{name}`: the last segment, found from the end.
    if let Some(last) = template.strip_suffix('}') {
        if last.ends_with(name) && last[..last.len() - name.len()].ends_with("/{") {
            return Ok(path.rsplit_once('/').map(|(_, value)| value));
        }
    }
    let route: Vec<&str> = template.split('/').collect();
    let Some(at) = route.iter().position(|s| param_name(s) == Some(name)) else {
        return Ok(None);
    };
    let wildcard = route.last().is_some_and(|s| s.starts_with("{*"));
    let segments: Vec<&str> = path.split('/').collect();
    let literal_matches = |route_segment: &str, path_segment: &str| {
        route_segment.starts_with('{') || route_segment == path_segment
    };
    // From the start: every literal in place, the catch-all taking the rest.
    let fixed = if wildcard {
        route.len() - 1
    } else {
        route.len()
    };
    let from_start = segments.len() >= fixed
        && (wildcard || segments.len() == route.len())
        && route[..fixed]
            .iter()
            .zip(&segments)
            .all(|(r, p)| literal_matches(r, p));
    if from_start {
        if wildcard && at == route.len() - 1 {
            return Ok(path.splitn(route.len(), '/').nth(at));
        }
        return Ok(segments.get(at).copied());
    }
    // From the end, for a router nested under a prefix.
    if !wildcard && segments.len() < route.len() {
        let from_end = route.len() - at;
        let overlap = segments.len() - 1;
        let lined_up = route[route.len() - overlap..]
            .iter()
            .zip(&segments[1..])
            .all(|(r, p)| literal_matches(r, p));
        if lined_up && from_end <= overlap {
            return Ok(segments.get(segments.len() - from_end).copied());
        }
    }
    Err("PathParam cannot line the path up with its route (a catch-all in a nested router?)")
}

/// The name of a `{name}` or `{*name}` route segment.
fn param_name(segment: &str) -> Option<&str> {
    let inner = segment.strip_prefix('{')?.strip_suffix('}')?;
    Some(inner.strip_prefix('*').unwrap_or(inner))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_param_finds_the_named_segment() {
        let found = |template, path, name| path_param(template, path, name);
        assert_eq!(
            found("/items/{key}", "/items/a%2Fb", "key"),
            Ok(Some("a%2Fb"))
        );
        assert_eq!(
            found("/t/{tenant}/items/{key}", "/t/x/items/y", "tenant"),
            Ok(Some("x"))
        );
        assert_eq!(
            found("/t/{tenant}/items/{key}", "/t/x/items/y", "key"),
            Ok(Some("y"))
        );
        // nested: the router saw `/items/y` while the route is `/api/items/{key}`
        assert_eq!(found("/api/items/{key}", "/items/y", "key"), Ok(Some("y")));
        assert_eq!(
            found("/api/t/{tenant}/items/{key}", "/t/x/items/y", "tenant"),
            Ok(Some("x"))
        );
        assert_eq!(
            found("/files/{*key}", "/files/a/b%20c", "key"),
            Ok(Some("a/b%20c"))
        );
        // a parameter before a catch-all
        assert_eq!(
            found("/t/{tenant}/files/{*path}", "/t/acme/files/a/b", "tenant"),
            Ok(Some("acme"))
        );
        assert_eq!(
            found("/t/{tenant}/files/{*path}", "/t/acme/files/a/b", "path"),
            Ok(Some("a/b"))
        );
        // a catch-all in a nested router cannot be lined up: unguarded, not guessed
        assert!(found("/api/files/{*key}", "/files/a/b", "key").is_err());
        assert_eq!(found("/items/{id}", "/items/y", "key"), Ok(None));
        assert_eq!(found("/items/key", "/items/key", "key"), Ok(None));
    }
}
