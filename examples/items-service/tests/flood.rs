//! A flood of unique random keys leaves memory bounded: every cache and
//! buffer on the way has a limit. Its own test binary, so the process's RSS
//! is this test's alone.

use std::time::{Duration, Instant};

use items_service::{app, prepare, serve, AppState, Config, Database};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// More than the guard's default read pace gathers per read (56): fewer
/// connections back to back are held to one round per 12 ms.
const CONNECTIONS: usize = 64;
const FLOOD: Duration = Duration::from_secs(8);
const LIMIT_MIB: f64 = 64.0;

fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let kib: f64 = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .expect("VmRSS");
    kib / 1024.0
}

/// Sends requests for unique keys back to back until `until`; returns how
/// many were answered 404, and how many otherwise.
async fn flood(addr: std::net::SocketAddr, until: Instant) -> (u64, u64) {
    let (mut not_found, mut other) = (0, 0);
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    let mut buffer = vec![0_u8; 4096];
    while Instant::now() < until {
        let key = format!("{:032x}", fastrand::u128(..));
        let request = format!("GET /items/{key} HTTP/1.1\r\nhost: flood\r\n\r\n");
        stream.write_all(request.as_bytes()).await.expect("write");
        // The 404 body is small: one read holds the whole response.
        let read = stream.read(&mut buffer).await.expect("read");
        if buffer[..read].starts_with(b"HTTP/1.1 404") {
            not_found += 1;
        } else {
            other += 1;
        }
    }
    (not_found, other)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_unique_keys_leaves_memory_bounded() {
    let path = std::env::temp_dir().join(format!("items-flood-{}.db", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let db = Database::sqlite(path.to_str().expect("utf-8 path"))
        .await
        .expect("sqlite");
    let guard = items_service::guards(&Config::from_env().expect("config"));
    let state = AppState::new(db, Some(guard.clone()));
    prepare(state.clone()).await;
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address");
    tokio::spawn(serve(
        listener,
        app(state.clone()),
        std::future::pending(),
        items_service::Limits::default(),
    ));

    // A short flood first, so buffers and allocator pools are in place.
    let warm_up = Instant::now() + Duration::from_secs(1);
    futures_util::future::join_all((0..CONNECTIONS).map(|_| flood(addr, warm_up))).await;
    let before = rss_mib();

    let until = Instant::now() + FLOOD;
    let results =
        futures_util::future::join_all((0..CONNECTIONS).map(|_| tokio::spawn(flood(addr, until))))
            .await;
    let (mut not_found, mut other) = (0, 0);
    for result in results {
        let (n, o) = result.expect("flood task");
        not_found += n;
        other += o;
    }
    let after = rss_mib();
    eprintln!(
        "{not_found} unique absent keys in {FLOOD:?}: RSS {before:.1} -> {after:.1} MiB (+{:.1} MiB)",
        after - before
    );
    assert!(not_found > 10_000, "the flood barely ran: {not_found}");
    assert_eq!(other, 0, "answers other than 404");
    assert!(
        after - before < LIMIT_MIB,
        "RSS grew by {:.1} MiB",
        after - before
    );
    let stats = guard.items.stats();
    assert!(stats.rejected >= not_found * 99 / 100, "{stats:?}");
    assert!(
        state.cache.stats().entries < 1000,
        "{:?}",
        state.cache.stats()
    );
    let _ = std::fs::remove_file(&path);
}
