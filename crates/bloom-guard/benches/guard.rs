//! The guard's cost per request, against the same inner service without it;
//! key extraction; each key type's canonical form; lookups in the Bloom and
//! the counting filter at 1M and 10M keys (50M with `BENCH_50M=1`), in one
//! filter and in filters grown into 2 and 4 sub-filters.
//!
//! Run with `cargo bench -p bloom-guard --bench guard`.

use std::convert::Infallible;
use std::future::{ready, Ready};
use std::hint::black_box;

use axum::extract::MatchedPath;
use bloom_guard::{
    extract::{Header, KeyExtractor, PathParam, PathSegment, QueryParam},
    feed::{CatchUp, KeyLookup, LookupError, LookupKey, PendingFilter},
    keys::{Collation, Key, KeyBatch},
    BloomGuard, BuildError, KeySource, KeyType,
};
use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use futures_util::future::BoxFuture;
use futures_util::stream::{self, BoxStream, StreamExt};
use futures_util::FutureExt;
use http::{HeaderName, Request, Response};
use tower::{Layer, Service};

/// `count` keys, generated batch by batch without holding them all.
struct Generated {
    count: u64,
}

/// The same keys behind a count hint that may be wrong.
struct Hinted {
    keys: Generated,
    hint: u64,
}

impl KeySource for Hinted {
    type Error = Infallible;

    async fn count_hint(&self) -> Result<Option<u64>, Infallible> {
        Ok(Some(self.hint))
    }

    fn keys(&self) -> BoxStream<'static, Result<KeyBatch, Infallible>> {
        self.keys.keys()
    }
}

impl KeySource for Generated {
    type Error = Infallible;

    async fn count_hint(&self) -> Result<Option<u64>, Infallible> {
        Ok(Some(self.count))
    }

    fn keys(&self) -> BoxStream<'static, Result<KeyBatch, Infallible>> {
        let count = self.count;
        stream::iter((0..count).step_by(10_000))
            .map(move |start| {
                Ok((start..(start + 10_000).min(count))
                    .map(|i| format!("item-{i:08}"))
                    .collect())
            })
            .boxed()
    }
}

fn warm_guard(guard: BloomGuard, keys: u64) -> BloomGuard {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    runtime
        .block_on(guard.rebuild(&Generated { count: keys }))
        .expect("build");
    guard
}

/// The cheapest inner service: answers at once.
#[derive(Clone)]
struct Inner;

impl<B> Service<Request<B>> for Inner {
    type Response = Response<bytes::Bytes>;
    type Error = Infallible;
    type Future = Ready<Result<Self::Response, Infallible>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<B>) -> Self::Future {
        ready(Ok(Response::new(bytes::Bytes::new())))
    }
}

fn request(key: &str, matched: &MatchedPath) -> Request<()> {
    let mut request = Request::get(format!("/items/{key}"))
        .body(())
        .expect("valid request");
    request.extensions_mut().insert(matched.clone());
    request
}

/// The `MatchedPath` axum gives requests of `path`. It has no public
/// constructor: route one request to get it.
fn matched_path(path: &'static str) -> MatchedPath {
    use tower::ServiceExt;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let (tx, rx) = std::sync::mpsc::channel();
    let app: axum::Router = axum::Router::new().route(
        path,
        axum::routing::get(move |matched: MatchedPath| {
            let tx = tx.clone();
            async move {
                let _ = tx.send(matched);
            }
        }),
    );
    let uri = path.replace("{key}", "x");
    runtime
        .block_on(
            app.oneshot(
                Request::get(uri)
                    .body(axum::body::Body::empty())
                    .expect("valid request"),
            ),
        )
        .expect("infallible");
    rx.recv().expect("matched path")
}

fn service(c: &mut Criterion) {
    let guard = warm_guard(
        BloomGuard::builder().expected_items(1_000_000).build(),
        1_000_000,
    );
    let matched = matched_path("/items/{key}");
    let mut group = c.benchmark_group("service");
    let mut inner = Inner;
    let mut guarded = guard.layer(PathParam("key")).layer(Inner);
    for (name, key) in [("present", "item-00000042"), ("absent", "absent-00000042")] {
        group.bench_function(format!("inner_alone/{name}"), |b| {
            b.iter_batched(
                || request(key, &matched),
                |req| inner.call(req).now_or_never(),
                BatchSize::NumIterations(64),
            );
        });
        group.bench_function(format!("guarded/{name}"), |b| {
            b.iter_batched(
                || request(key, &matched),
                |req| guarded.call(req).now_or_never(),
                BatchSize::NumIterations(64),
            );
        });
    }
    group.finish();
}

fn extraction(c: &mut Criterion) {
    let mut group = c.benchmark_group("extract");
    let plain = request("item-00000042", &matched_path("/items/{key}"));
    group.bench_function("path_param_plain", |b| {
        b.iter(|| black_box(PathParam("key").extract(black_box(&plain)).is_ok()));
    });
    let path = request("a%2Fb%20c", &matched_path("/items/{key}"));
    group.bench_function("path_param", |b| {
        b.iter(|| black_box(PathParam("key").extract(black_box(&path)).is_ok()));
    });
    group.bench_function("path_segment", |b| {
        b.iter(|| black_box(PathSegment(1).extract(black_box(&path)).is_ok()));
    });
    let query = Request::get("/lookup?x=1&id=a+b%2Bc")
        .body(())
        .expect("valid request");
    group.bench_function("query_param", |b| {
        b.iter(|| black_box(QueryParam("id").extract(black_box(&query)).is_ok()));
    });
    let header = Request::get("/")
        .header("x-api-key", "key-123")
        .body(())
        .expect("valid request");
    let extractor = Header(HeaderName::from_static("x-api-key"));
    group.bench_function("header", |b| {
        b.iter(|| black_box(extractor.extract(black_box(&header)).is_ok()));
    });
    group.finish();
}

/// A collation as large as a server's: every BMP character weighed, one
/// weight each (two for a few), case folded for ASCII.
fn bmp_collation() -> Collation {
    let mut builder = Collation::builder("bench_ci", "bench");
    for c in (0_u32..0x1_0000).filter_map(char::from_u32) {
        let folded = c.to_ascii_uppercase() as u32;
        let weight = u16::try_from(folded).unwrap_or(u16::MAX);
        builder = if c == 'ß' {
            builder.weigh(c, &[u16::from(b'S'), u16::from(b'S')])
        } else {
            builder.weigh(c, &[weight])
        };
    }
    builder.pad_space(true).build().expect("weights")
}

/// A request key's canonical form under each key type, for an ASCII key of
/// 13 bytes and a UUID.
fn key_types(c: &mut Criterion) {
    let mut group = c.benchmark_group("canonical");
    let collated = KeyType::Collated(bmp_collation());
    for (name, key_type, key) in [
        ("text", KeyType::Text, "Item-00000042"),
        (
            "case_insensitive",
            KeyType::CaseInsensitiveText,
            "Item-00000042",
        ),
        ("space_padded", KeyType::SpacePaddedText, "Item-00000042"),
        ("collated", collated, "Item-00000042"),
        ("collated_accents", collated, "Café-Straße-1"),
        (
            "uuid",
            KeyType::Uuid,
            "550E8400-E29B-41D4-A716-446655440000",
        ),
    ] {
        group.bench_function(name, |b| {
            b.iter(|| black_box(key_type.to_canonical(Key::from(black_box(key)))));
        });
    }
    group.finish();
}

/// A feed with nothing after the scan's position: it makes a guard's
/// filters counting ones.
struct Quiet;

impl CatchUp for Quiet {
    fn catch_up(&self, pending: PendingFilter) -> BoxFuture<'_, Result<u64, BuildError>> {
        Box::pin(async move { pending.promote() })
    }
}

/// A guard of `keys` keys: a Bloom filter, or a counting one (the filter
/// of a guard that a change feed follows).
fn lookup_guard(keys: u64, counting: bool) -> BloomGuard {
    let guard = BloomGuard::builder()
        .expected_items(keys)
        .read_barrier(false)
        .build();
    if counting {
        guard.feed().reader().catch_up_with(Quiet);
    }
    warm_guard(guard, keys)
}

/// Lookups through `may_contain` at 1M and 10M keys (and 50M with
/// `BENCH_50M=1`: the build takes a minute), in the Bloom filter and in the
/// counting filter.
fn contains(c: &mut Criterion) {
    let mut group = c.benchmark_group("contains");
    let mut sizes = vec![1_000_000_u64, 10_000_000];
    if std::env::var_os("BENCH_50M").is_some() {
        sizes.push(50_000_000);
    }
    for keys in sizes {
        // Keys spread over the whole filter, so lookups miss the CPU caches
        // as they would in production.
        let present: Vec<String> = (0..4096)
            .map(|i| format!("item-{:08}", (i * 7919) % keys))
            .collect();
        let absent: Vec<String> = (0..4096).map(|i| format!("absent-{i:08}")).collect();
        for (kind, counting) in [("bloom", false), ("counting", true)] {
            let guard = lookup_guard(keys, counting);
            group.bench_function(format!("{keys}/{kind}/one_hot_key"), |b| {
                b.iter(|| black_box(guard.may_contain(black_box("item-00000042"))));
            });
            for (name, sample) in [("present", &present), ("absent", &absent)] {
                let mut next = sample.iter().cycle();
                group.bench_function(format!("{keys}/{kind}/{name}"), |b| {
                    b.iter(|| black_box(guard.may_contain(next.next().map_or("", String::as_str))));
                });
            }
        }
    }
    group.finish();
}

/// Lookups in a filter grown into 1, 2 and 4 sub-filters during its scan
/// (sized for a half and a fifteenth of its keys), each sub-filter twice
/// the one before: the cost of growth against one filter of the right size.
fn sub_filters(c: &mut Criterion) {
    let mut group = c.benchmark_group("sub_filters");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    for keys in [1_000_000_u64, 10_000_000] {
        let present: Vec<String> = (0..4096)
            .map(|i| format!("item-{:08}", (i * 7919) % keys))
            .collect();
        let absent: Vec<String> = (0..4096).map(|i| format!("absent-{i:08}")).collect();
        for stages in [1_u32, 2, 4] {
            let planned = keys / (2_u64.pow(stages) - 1);
            let guard = BloomGuard::builder()
                .expected_items(1)
                .headroom(0.0)
                .build();
            let source = Hinted {
                keys: Generated { count: keys },
                hint: planned,
            };
            let stats = runtime.block_on(guard.rebuild(&source)).expect("build");
            assert_eq!(stats.sub_filters, stages, "{stats:?}");
            for (name, sample) in [("present", &present), ("absent", &absent)] {
                let mut next = sample.iter().cycle();
                group.bench_function(format!("{keys}/{stages}/{name}"), |b| {
                    b.iter(|| black_box(guard.may_contain(next.next().map_or("", String::as_str))));
                });
            }
        }
    }
    group.finish();
}

/// A table that holds none of the keys asked, answering at once.
struct Empty;

impl KeyLookup for Empty {
    fn find<'a>(&'a self, _: &'a [LookupKey]) -> BoxFuture<'a, Result<KeyBatch, LookupError>> {
        Box::pin(async { Ok(KeyBatch::default()) })
    }
}

/// Absent keys through a guard whose refusals wait for the barrier, 1 024
/// requests at a time on two worker threads, the follower's feed reads (or
/// its lookups) answering at once: what confirming a refusal costs the
/// process, each way, with no database in it.
fn refusals(c: &mut Criterion) {
    const IN_FLIGHT: usize = 1024;
    const EACH: usize = 16;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .expect("runtime");
    let mut group = c.benchmark_group("refusals");
    group.throughput(criterion::Throughput::Elements((IN_FLIGHT * EACH) as u64));
    for name in ["feed_read", "lookup"] {
        let guard = BloomGuard::builder().expected_items(1_000).build();
        let reader = guard.feed().reader();
        reader.catch_up_with(Quiet);
        let reads = if name == "lookup" {
            reader.look_up_with(Empty);
            None
        } else {
            Some(runtime.spawn(async move {
                loop {
                    reader.asked().await;
                    reader.done(reader.begin());
                }
            }))
        };
        let guard = warm_guard(guard, 1_000);
        let service = guard.layer(PathSegment(1)).layer(Inner);
        group.bench_function(name, |b| {
            b.iter(|| {
                runtime.block_on(async {
                    let tasks: Vec<_> = (0..IN_FLIGHT)
                        .map(|task| {
                            let mut service = service.clone();
                            tokio::spawn(async move {
                                let mut refused = 0;
                                for i in 0..EACH {
                                    let request = Request::get(format!("/items/absent-{task}-{i}"))
                                        .body(())
                                        .expect("a request");
                                    let Ok(response) = service.call(request).await;
                                    refused += usize::from(response.status() == 404);
                                }
                                refused
                            })
                        })
                        .collect();
                    let mut refused = 0;
                    for task in tasks {
                        refused += task.await.expect("the task");
                    }
                    // A few are the filter's false positives.
                    assert!(
                        refused * 100 >= IN_FLIGHT * EACH * 99,
                        "absent keys refused"
                    );
                });
            });
        });
        if let Some(reads) = reads {
            reads.abort();
        }
    }
    group.finish();
}

criterion_group!(
    benches,
    service,
    extraction,
    key_types,
    contains,
    sub_filters,
    refusals
);
criterion_main!(benches);
