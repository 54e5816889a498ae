//! Configuring a `BloomGuard`; the settings of a guard with a change
//! feed are in `feed.rs`.

mod feed;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Response;

use crate::handle::config::Config;
use crate::handle::guard::BloomGuard;
use crate::handle::shared::Shared;
use crate::keys::key_type::KeyType;
use crate::request::response::CannedResponse;
use crate::switches::mode::Mode;

/// Configures and builds a [`BloomGuard`].
///
/// # Example
///
/// ```
/// use bloom_guard::{BloomGuard, KeyType};
///
/// let guard = BloomGuard::builder()
///     .name("orders")
///     .key_type(KeyType::Integer)
///     .expected_items(10_000_000)
///     .false_positive_rate(0.0001)
///     .max_key_len(64)
///     .build();
/// # drop(guard);
/// ```
///
#[doc = include_str!("../../../docs/filters.md")]
#[derive(Debug, Clone, Default)]
pub struct Builder {
    config: Config,
}

impl BloomGuard {
    /// A builder with the defaults: text keys, 1000 expected items, a 0.1% false-positive rate, keys of at
    /// most 512 bytes, and [`not_found_response`](crate::not_found_response)
    /// for absent keys.
    pub fn builder() -> Builder {
        Builder::default()
    }
}

impl Builder {
    /// What the keys are, and so the one form in which stored and request
    /// keys are compared (default [`KeyType::Text`]). See [`KeyType`].
    #[must_use]
    pub fn key_type(mut self, key_type: KeyType) -> Self {
        self.config.key_type = key_type;
        self
    }

    /// A floor for the filter's size. Each build sizes the filter for the
    /// larger of this and the source's count hint, plus headroom.
    #[must_use]
    pub fn expected_items(mut self, items: u64) -> Self {
        self.config.expected_items = items;
        self
    }

    /// The false-positive rate to size the filter for (default 0.001): the
    /// share of absent keys that still reach your cache and database.
    ///
    /// # Panics
    ///
    /// If `rate` is not strictly between 0 and 1.
    #[must_use]
    pub fn false_positive_rate(mut self, rate: f64) -> Self {
        assert!(
            rate > 0.0 && rate < 1.0,
            "false_positive_rate must be in (0, 1), got {rate}"
        );
        self.config.target_fpp = rate;
        self
    }

    /// Extra room for keys inserted after a build, as a fraction of the
    /// build's count (default 0.25: 25% more keys before the filter grows
    /// a second sub-filter).
    ///
    /// # Panics
    ///
    /// If `fraction` is negative or not finite.
    #[must_use]
    pub fn headroom(mut self, fraction: f64) -> Self {
        assert!(
            fraction >= 0.0 && fraction.is_finite(),
            "headroom must be >= 0, got {fraction}"
        );
        self.config.headroom = fraction;
        self
    }

    /// The longest key the guard looks up, in bytes after decoding
    /// (default 512). Longer keys go to the handler unchecked, counted in
    /// [`Stats::unchecked`](crate::Stats::unchecked), unless
    /// [`refuse_long_keys`](Self::refuse_long_keys) is on. Set it to the
    /// longest key your column holds, so every request for a key that can
    /// exist is checked.
    ///
    /// # Panics
    ///
    /// If `bytes` is 0.
    #[must_use]
    pub fn max_key_len(mut self, bytes: usize) -> Self {
        assert!(bytes > 0, "max_key_len must be at least 1");
        self.config.max_key_len = bytes;
        self
    }

    /// Answers keys longer than [`max_key_len`](Self::max_key_len) with
    /// `400 {"error":"key too long"}` instead of passing them on unchecked
    /// (default off). Turn it on only if your application refuses such keys
    /// itself (then no key it serves is refused, and random long keys no
    /// longer reach it); they are counted in
    /// [`Stats::bad_keys`](crate::Stats::bad_keys). Under a key type that
    /// finds longer spellings of a stored key (`SpacePaddedText`: trailing
    /// spaces; `Collated`: trailing spaces, ignorable characters), the
    /// application must refuse those lengths too, or leave it off.
    #[must_use]
    pub fn refuse_long_keys(mut self, refuse: bool) -> Self {
        self.config.refuse_long_keys = refuse;
        self
    }

    /// The response for absent keys (default:
    /// [`not_found_response`](crate::not_found_response)). Make it
    /// byte-identical to your handler's own "not found".
    #[must_use]
    pub fn absent_response<B: Into<Bytes>>(mut self, response: Response<B>) -> Self {
        self.config.absent = CannedResponse::from_response(response);
        self
    }

    /// The response for absent keys, from anything axum can answer with
    /// (status, headers and body): the application's own "not found" type,
    /// `Json`, a tuple. The body is taken once, here, and sent with every
    /// answer.
    ///
    /// # Example
    ///
    /// ```
    /// use axum::http::{header, StatusCode};
    /// use axum::response::IntoResponse;
    /// use bloom_guard::BloomGuard;
    ///
    /// // The same answer the handler gives for a missing row.
    /// fn not_found() -> impl IntoResponse {
    ///     (
    ///         StatusCode::NOT_FOUND,
    ///         [(header::CONTENT_TYPE, "application/json")],
    ///         r#"{"error":"no such item"}"#,
    ///     )
    /// }
    /// let guard = BloomGuard::builder().absent_response_from(not_found()).build();
    /// # let _ = guard;
    /// ```
    ///
    /// # Panics
    ///
    /// If the body is not in memory (a stream), or is larger than 64 KiB.
    #[cfg(feature = "axum")]
    #[must_use]
    pub fn absent_response_from(self, response: impl axum::response::IntoResponse) -> Self {
        use futures_util::FutureExt as _;
        let (parts, body) = response.into_response().into_parts();
        let body = axum::body::to_bytes(body, 64 * 1024)
            .now_or_never()
            .and_then(Result::ok)
            .expect("absent_response_from needs a body in memory of at most 64 KiB");
        self.absent_response(Response::from_parts(parts, body))
    }

    /// Marks the guard's own "absent" answers with `x-bloom-guard: absent`
    /// (default off). For operators only: it tells an attacker which keys
    /// are false positives, the oracle that identical answers deny them.
    #[must_use]
    pub fn debug_header(mut self, enabled: bool) -> Self {
        self.config.debug_header = enabled;
        self
    }

    /// How often a build logs its progress (default 5 s).
    #[must_use]
    pub fn progress_interval(mut self, interval: Duration) -> Self {
        self.config.progress_interval = interval;
        self
    }

    /// The cap of the pause between two attempts of [`BloomGuard::warm`]
    /// (default 30 s); pauses start at 100 ms and double up to it, each
    /// lengthened by a random part of up to as much again.
    #[must_use]
    pub fn max_retry_delay(mut self, delay: Duration) -> Self {
        self.config.max_retry_delay = delay;
        self
    }

    /// Rebuild on this schedule (default: never), which purges the keys of
    /// deleted rows. See [`BloomGuard::maintain`].
    #[must_use]
    pub fn rebuild_interval(mut self, every: Duration) -> Self {
        self.config.rebuild_interval = Some(every);
        self
    }

    /// The bound on the estimated false-positive rate, as a factor of the
    /// target (default 2.0). A filter above it is never put in use, the
    /// guard is not [ready](crate::BloomGuard::is_ready) until its filter is
    /// within it, and a filter in use that passes it (one grown past every
    /// sub-filter it can add) is rebuilt. See [`BloomGuard::maintain`].
    ///
    /// # Panics
    ///
    /// If `factor` is below 1.
    #[must_use]
    pub fn rebuild_above(mut self, factor: f64) -> Self {
        assert!(
            factor >= 1.0,
            "rebuild_above must be at least 1, got {factor}"
        );
        self.config.rebuild_above = factor;
        self
    }

    /// Rebuild once the filter has grown into more than this many
    /// sub-filters (default 4), to make them one again: each one costs a
    /// probe per lookup. A filter grows a sub-filter, twice as large as the
    /// one before, each time more keys arrive than it was sized for, so
    /// the default absorbs up to about 15 times the planned keys (an
    /// estimate 10 times too low) without a rebuild. A counting filter (a
    /// guard with a change feed) grows stages without a rebuild whatever
    /// their number: a rebuild would mean a rescan of the table.
    ///
    /// # Panics
    ///
    /// If `sub_filters` is 0.
    #[must_use]
    pub fn compact_above(mut self, sub_filters: usize) -> Self {
        assert!(sub_filters > 0, "compact_above must be at least 1");
        self.config.compact_above = sub_filters;
        self
    }

    /// How often [`BloomGuard::maintain`] checks whether a rebuild is due
    /// (default 10 s).
    #[must_use]
    pub fn check_interval(mut self, every: Duration) -> Self {
        self.config.check_interval = every;
        self
    }

    /// The mode the guard starts in (default [`Mode::Enforce`]); see
    /// [`Mode`] for rolling a guard out in `Shadow` first.
    #[must_use]
    pub fn mode(mut self, mode: Mode) -> Self {
        self.config.mode = mode;
        self
    }

    /// In enforce mode, the share of would-be rejections passed on anyway
    /// and checked like shadow mode's (default 0: none). A small rate such
    /// as 0.001 is a production alarm for false negatives that costs a
    /// bounded trickle of lookups; the sample is random, so nobody can aim
    /// requests at it.
    ///
    /// # Panics
    ///
    /// If `rate` is not between 0 and 1.
    #[must_use]
    pub fn audit_rate(mut self, rate: f64) -> Self {
        assert!(
            (0.0..=1.0).contains(&rate),
            "audit_rate must be in [0, 1], got {rate}"
        );
        self.config.audit_rate = rate;
        self
    }

    /// Whether a false negative caught in shadow mode or by an audit fails
    /// the guard open until its next rebuild and makes that rebuild due
    /// (default true): a filter that missed one key may have missed more.
    #[must_use]
    pub fn rebuild_on_false_negative(mut self, enabled: bool) -> Self {
        self.config.rebuild_on_false_negative = enabled;
        self
    }

    /// The guard's name, the `guard` label of its metrics (default
    /// `default`): tells guards of one process apart. It is also the key
    /// of the fleet's stored settings: guards of different services that
    /// share one database need different names.
    #[must_use]
    pub fn name(mut self, name: &'static str) -> Self {
        self.config.name = name;
        self
    }

    /// Builds the guard. It fails open until [`BloomGuard::warm`] (or
    /// [`BloomGuard::rebuild`]) puts a first filter in place.
    ///
    /// With feature `metrics`, the guard registers its metrics here, with
    /// the recorder installed at this moment: install the application's
    /// recorder (`metrics-exporter-prometheus`'s `install_recorder`, say)
    /// before building the guards, or their figures go nowhere. The
    /// `metrics` facade offers no way to tell whether a recorder is
    /// installed, so nothing can warn.
    pub fn build(mut self) -> BloomGuard {
        if self.config.debug_header {
            self.config.absent = self.config.absent.with_debug_header();
        }
        BloomGuard {
            shared: Arc::new(Shared::new(self.config)),
        }
    }
}

#[cfg(all(test, feature = "axum"))]
mod tests {
    use axum::body::Body;
    use axum::http::{header, Request, StatusCode};
    use axum::routing::get;
    use axum::Router;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    use crate::handle::guard::BloomGuard;
    use crate::lifecycle::source::KeyList;
    use crate::request::path_param::PathParam;

    #[tokio::test]
    async fn the_absent_answer_can_be_any_axum_response() {
        let guard = BloomGuard::builder()
            .absent_response_from((
                StatusCode::GONE,
                [(header::CONTENT_TYPE, "application/json")],
                r#"{"error":"no such item"}"#,
            ))
            .build();
        guard.rebuild(&KeyList::new(["a"])).await.expect("build");
        let app = Router::new()
            .route("/items/{key}", get(|| async { "an item" }))
            .route_layer(guard.layer(PathParam("key")));
        let request = Request::get("/items/absent")
            .body(Body::empty())
            .expect("a request");
        let response = app.oneshot(request).await.expect("infallible");
        assert_eq!(response.status(), StatusCode::GONE);
        assert_eq!(response.headers()[header::CONTENT_TYPE], "application/json");
        let body = response
            .into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes();
        assert_eq!(&body[..], br#"{"error":"no such item"}"#);
    }
}
