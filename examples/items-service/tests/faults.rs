//! Faults: the database down at start, lost while serving, gone in the
//! middle of a rebuild; shutdown with requests in flight. Postgres is
//! reached through a TCP proxy the tests switch off and on.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use bloom_guard::stats::GuardState;
use items_service::{app, prepare, AppState, Config, Database, Pool};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::broadcast;
use tower::ServiceExt;

/// A TCP proxy to Postgres. Down, it drops every connection and refuses new
/// ones, as a database host that went away.
struct Proxy {
    addr: SocketAddr,
    up: Arc<AtomicBool>,
    cut: broadcast::Sender<()>,
}

impl Proxy {
    async fn start(upstream: SocketAddr, up: bool) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("proxy address");
        let up = Arc::new(AtomicBool::new(up));
        let (cut, _) = broadcast::channel(1);
        let (accepting, cuts) = (Arc::clone(&up), cut.clone());
        tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                if !accepting.load(Ordering::SeqCst) {
                    continue; // dropped: the connection is refused
                }
                let mut cut = cuts.subscribe();
                tokio::spawn(async move {
                    let Ok(mut server) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                        _ = cut.recv() => {}
                    }
                });
            }
        });
        Self { addr, up, cut }
    }

    fn down(&self) {
        self.up.store(false, Ordering::SeqCst);
        let _ = self.cut.send(());
    }

    fn up(&self) {
        self.up.store(true, Ordering::SeqCst);
    }

    /// A lazily connecting pool through the proxy to `pool`'s database.
    fn pool_like(&self, pool: &PgPool) -> PgPool {
        let options: PgConnectOptions = (*pool.connect_options())
            .clone()
            .host(&self.addr.ip().to_string())
            .port(self.addr.port());
        PgPoolOptions::new()
            .max_connections(8)
            .acquire_timeout(Duration::from_secs(2))
            .connect_lazy_with(options)
    }
}

fn upstream(pool: &PgPool) -> SocketAddr {
    let options = pool.connect_options();
    let host = match options.get_host() {
        "localhost" => "127.0.0.1",
        host => host,
    };
    format!("{host}:{}", options.get_port())
        .parse()
        .expect("a TCP Postgres address")
}

async fn status(app: &Router, path: &str) -> StatusCode {
    let request = Request::get(path)
        .body(Body::empty())
        .expect("valid request");
    app.clone()
        .oneshot(request)
        .await
        .expect("infallible")
        .status()
}

async fn eventually(what: &str, limit: Duration, mut check: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + limit;
    while !check().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn seed(pool: &PgPool, keys: &[&str]) {
    for key in keys {
        sqlx::query("insert into items (key) values ($1)")
            .bind(key)
            .execute(pool)
            .await
            .expect("seed");
    }
}

fn guarded_state(pool: PgPool) -> AppState {
    let guard = items_service::guards(&Config::from_env().expect("config"));
    AppState::new(Database::from_pool(Pool::Postgres(pool)), Some(guard))
}

#[sqlx::test(migrations = "../../migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn starts_with_the_database_down_and_gets_ready_when_it_returns(pool: PgPool) {
    seed(&pool, &["apple"]).await;
    let proxy = Proxy::start(upstream(&pool), false).await;
    let state = guarded_state(proxy.pool_like(&pool));
    let app = app(state.clone());
    tokio::spawn(prepare(state.clone()));

    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        status(&app, "/readyz").await,
        StatusCode::SERVICE_UNAVAILABLE
    );
    let guard = state.guards.clone().expect("guarded").items;
    let stats = guard.stats();
    assert_eq!(stats.state, GuardState::Degraded);
    assert!(stats.last_error.is_some());
    // Fail open: an existing key is never a 404, and the outage is a 503.
    assert_eq!(
        status(&app, "/items/apple").await,
        StatusCode::SERVICE_UNAVAILABLE
    );

    proxy.up();
    let back = tokio::time::Instant::now();
    eventually("readiness", Duration::from_secs(30), async || {
        status(&app, "/readyz").await == StatusCode::OK
    })
    .await;
    eprintln!("ready {:?} after the database came back", back.elapsed());
    assert_eq!(status(&app, "/items/apple").await, StatusCode::OK);
    assert_eq!(status(&app, "/items/absent").await, StatusCode::NOT_FOUND);
}

#[sqlx::test(migrations = "../../migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn a_database_lost_while_serving_keeps_the_guard_and_loses_no_key(pool: PgPool) {
    seed(&pool, &["apple", "banana"]).await;
    let proxy = Proxy::start(upstream(&pool), true).await;
    let state = guarded_state(proxy.pool_like(&pool));
    let app = app(state.clone());
    prepare(state.clone()).await;
    assert_eq!(status(&app, "/items/apple").await, StatusCode::OK);

    proxy.down();
    // Not cached: it needs the database, which is gone.
    assert_eq!(
        status(&app, "/items/banana").await,
        StatusCode::SERVICE_UNAVAILABLE
    );
    let guard = state.guards.clone().expect("guarded").items;
    // Without the feed the filter may lack keys committed elsewhere since
    // its last read: the read barrier sends would-be refusals on to the
    // handler (here a 503, the database being gone), never a 404 from a
    // stale filter. The guard stays ready: it protects again at once.
    let before = guard.stats();
    for _ in 0..20 {
        assert_eq!(guard.stats().state, GuardState::Ready);
        assert_eq!(
            status(&app, "/items/absent").await,
            StatusCode::SERVICE_UNAVAILABLE
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Each went on through the read barrier, or (a follower between its
    // reads' failures holding the guard open for a moment) past an open
    // filter: none was refused.
    let after = guard.stats();
    assert_eq!(after.rejected, before.rejected, "{after:?}");
    assert!(
        after.barrier_timeouts > before.barrier_timeouts,
        "the read barrier sent none on: {after:?}"
    );
    // A key committed while this instance cannot read the feed arrives
    // once it can.
    sqlx::query("insert into items (key) values ('written-meanwhile')")
        .execute(&pool)
        .await
        .expect("insert");

    proxy.up();
    eventually("recovery", Duration::from_secs(30), async || {
        status(&app, "/items/banana").await == StatusCode::OK
            && status(&app, "/items/written-meanwhile").await == StatusCode::OK
    })
    .await;
    assert_eq!(status(&app, "/items/absent").await, StatusCode::NOT_FOUND);
    assert_eq!(
        guard.stats().generation,
        1,
        "caught up from the feed, no rebuild"
    );
}

#[sqlx::test(migrations = "../../migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn a_rebuild_that_loses_the_database_keeps_the_old_filter(pool: PgPool) {
    sqlx::query("insert into items (key) select 'key-' || g from generate_series(1, 300000) g")
        .execute(&pool)
        .await
        .expect("fill");
    let proxy = Proxy::start(upstream(&pool), true).await;
    let state = guarded_state(proxy.pool_like(&pool));
    prepare(state.clone()).await;
    let guard = state.guards.clone().expect("guarded").items;
    let before = guard.stats();

    let source = bloom_guard_sqlx::postgres::CopySource::new(
        proxy.pool_like(&pool),
        "select key from items",
    );
    let rebuild = {
        let guard = guard.clone();
        tokio::spawn(async move { guard.rebuild(&source).await })
    };
    tokio::time::sleep(Duration::from_millis(30)).await;
    proxy.down();
    let outcome = rebuild.await.expect("rebuild task");
    assert!(
        outcome.is_err(),
        "the rebuild should have failed: {outcome:?}"
    );
    let after = guard.stats();
    assert_eq!(
        after.generation, before.generation,
        "a failed rebuild swapped its filter in"
    );
    assert!(after.last_error.is_some());
    assert!(guard.may_contain("key-1") && guard.may_contain("key-300000"));
    assert!(guard.is_ready());
}

#[tokio::test]
async fn shutdown_lets_requests_in_flight_finish() {
    let app = Router::new().route(
        "/slow",
        axum::routing::get(|| async {
            tokio::time::sleep(Duration::from_millis(500)).await;
            "done"
        }),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(items_service::serve(
        listener,
        app,
        async {
            let _ = stopped.await;
        },
        items_service::Limits::default(),
    ));
    let request = tokio::spawn(async move {
        let mut stream = TcpStream::connect(addr).await.expect("connect");
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        stream
            .write_all(b"GET /slow HTTP/1.1\r\nhost: test\r\nconnection: close\r\n\r\n")
            .await
            .expect("write");
        let mut response = String::new();
        stream.read_to_string(&mut response).await.expect("read");
        response
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    stop.send(()).expect("stop");
    let response = request.await.expect("request task");
    assert!(
        response.starts_with("HTTP/1.1 200") && response.ends_with("done"),
        "{response}"
    );
    server.await.expect("server task").expect("serve");
}

#[sqlx::test(migrations = "../../migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn shutdown_closes_the_listener_and_feed_connections(pool: PgPool) {
    // A pool of the service's own: shutting down closes it.
    let own = PgPoolOptions::new().connect_lazy_with((*pool.connect_options()).clone());
    let state = guarded_state(own);
    prepare(state.clone()).await;
    let listeners = || {
        sqlx::query_scalar::<_, i64>(
            "select count(*) from pg_stat_activity where application_name = $1 and datname = current_database()",
        )
        .bind(bloom_guard_sqlx::postgres::LISTENER_APPLICATION_NAME)
        .fetch_one(&pool)
    };
    // One per guard: items and users.
    assert_eq!(listeners().await.expect("count"), 2);
    // And the connections kept for feed reads, once a read has run.
    let feed_connections = || {
        sqlx::query_scalar::<_, i64>(
            "select count(*) from pg_stat_activity where application_name = $1 and datname = current_database()",
        )
        .bind(bloom_guard_sqlx::postgres::FEED_APPLICATION_NAME)
        .fetch_one(&pool)
    };
    let mut kept = feed_connections().await.expect("count");
    for _ in 0..250 {
        if kept == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        kept = feed_connections().await.expect("count");
    }
    assert_eq!(kept, 2, "one feed connection per guard");
    state.shut_down().await;
    let mut remaining = (
        listeners().await.expect("count"),
        feed_connections().await.expect("count"),
    );
    for _ in 0..50 {
        if remaining == (0, 0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        remaining = (
            listeners().await.expect("count"),
            feed_connections().await.expect("count"),
        );
    }
    assert_eq!(
        remaining,
        (0, 0),
        "listeners and feed connections left open"
    );
}
