//! The service binary under hostile HTTP: many idle sockets, silent and
//! half-spoken connections, idle HTTP/2 connections, a connection cap.
//! Started with the operating system's usual soft limit of 1024 open files,
//! as a service manager would start it.

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use axum::http::Request;

/// The HTTP/2 connection preface.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// A free loopback port (released at once for the service to take).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

struct Service {
    child: Child,
    public: u16,
    admin: u16,
}

impl Service {
    fn start(extra_env: &[(&str, &str)]) -> Self {
        // This process holds thousands of sockets in some tests.
        rlimit::increase_nofile_limit(u64::MAX).expect("the open files limit");
        let (public, admin) = (free_port(), free_port());
        let db = std::env::temp_dir().join(format!("items-hostile-{public}.db"));
        let _ = std::fs::remove_file(&db);
        let mut command = Command::new("prlimit");
        command
            .args(["--nofile=1024:", "--"])
            .arg(env!("CARGO_BIN_EXE_items-service"))
            .env_remove("DATABASE_URL")
            .env("SQLITE_PATH", &db)
            .env("ADMIN_TOKEN", "secret")
            .env("BIND_ADDR", format!("127.0.0.1:{public}"))
            .env("ADMIN_ADDR", format!("127.0.0.1:{admin}"))
            .env("RUST_LOG", "warn")
            // Rejections are counted exactly: no audits.
            .env("BLOOM_AUDIT_RATE", "0")
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        for (name, value) in extra_env {
            command.env(name, value);
        }
        let child = command.spawn().expect("prlimit and the service binary");
        let service = Self {
            child,
            public,
            admin,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while status(public, "/readyz").as_deref() != Some("200") {
            assert!(Instant::now() < deadline, "the service did not get ready");
            std::thread::sleep(Duration::from_millis(50));
        }
        service
    }
}

/// The status of `GET path`, within one second, by curl.
fn status(port: u16, path: &str) -> Option<String> {
    let output = Command::new("curl")
        .args(["-s", "-m", "1", "-o", "/dev/null", "-w", "%{http_code}"])
        .args(["-H", "authorization: Bearer secret"])
        .arg(format!("http://127.0.0.1:{port}{path}"))
        .output()
        .ok()?;
    let code = String::from_utf8_lossy(&output.stdout).into_owned();
    (code != "000").then_some(code)
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn idle_sockets_do_not_stop_new_clients() {
    let service = Service::start(&[]);
    // More idle sockets than the soft limit of open files allows.
    let idle: Vec<TcpStream> = (0..1100)
        .map(|i| {
            let port = if i % 2 == 0 {
                service.public
            } else {
                service.admin
            };
            TcpStream::connect(("127.0.0.1", port)).expect("connect")
        })
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        status(service.public, "/items/apple").as_deref(),
        Some("200")
    );
    assert_eq!(
        status(service.admin, "/admin/bloom").as_deref(),
        Some("200")
    );
    drop(idle);
}

/// Whether the service has closed `stream`: a read returns end of file or
/// an error. Anything the service sent before is read and dropped.
fn is_closed(stream: &mut TcpStream) -> bool {
    stream.set_nonblocking(true).expect("non-blocking");
    let mut buffer = [0; 1024];
    loop {
        match stream.read(&mut buffer) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(error) if error.kind() == ErrorKind::WouldBlock => return false,
            Err(_) => return true,
        }
    }
}

/// Waits until the service has closed every one of `streams`, for at most
/// `within`; returns how long that took.
fn wait_all_closed(streams: &mut Vec<TcpStream>, within: Duration) -> Duration {
    let started = Instant::now();
    loop {
        streams.retain_mut(|stream| !is_closed(stream));
        if streams.is_empty() {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < within,
            "{} connections still open after {within:?}",
            streams.len()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Opens `count` connections to `port`, each sending `first` and nothing more.
fn open_and_stall(port: u16, count: usize, first: &[u8]) -> Vec<TcpStream> {
    (0..count)
        .map(|_| {
            let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
            stream.write_all(first).expect("write");
            stream
        })
        .collect()
}

#[test]
fn silent_connections_are_closed_at_the_first_bytes_deadline() {
    let service = Service::start(&[("FIRST_BYTES_TIMEOUT_SECS", "1")]);
    let mut silent = open_and_stall(service.public, 1000, b"");
    let took = wait_all_closed(&mut silent, Duration::from_secs(4));
    eprintln!("1000 silent connections closed {took:?} after the last was opened");
    assert_eq!(
        status(service.public, "/items/apple").as_deref(),
        Some("200")
    );
}

#[test]
fn half_http2_prefaces_are_closed_at_the_first_bytes_deadline() {
    let service = Service::start(&[("FIRST_BYTES_TIMEOUT_SECS", "1")]);
    let mut halves = open_and_stall(service.public, 1000, &PREFACE[..PREFACE.len() / 2]);
    let took = wait_all_closed(&mut halves, Duration::from_secs(4));
    eprintln!("1000 half prefaces closed {took:?} after the last was opened");
}

#[test]
fn http2_clients_that_do_not_answer_pings_are_closed() {
    // The idle timeout at its default of 60 s: only the pings close them.
    let service = Service::start(&[
        ("HTTP2_KEEP_ALIVE_SECS", "1"),
        ("HTTP2_KEEP_ALIVE_TIMEOUT_SECS", "1"),
    ]);
    // The preface and an empty SETTINGS frame, then deaf.
    let hello = [PREFACE, &[0, 0, 0, 4, 0, 0, 0, 0, 0]].concat();
    let mut deaf = open_and_stall(service.public, 1000, &hello);
    let took = wait_all_closed(&mut deaf, Duration::from_secs(5));
    eprintln!("1000 deaf HTTP/2 connections closed {took:?} after the last was opened");
}

/// An HTTP/2 connection (h2c) that has had one `GET /items/apple` answered
/// and stays open, answering the service's pings, until the service closes
/// it.
async fn idle_http2_connection(port: u16) -> IdleHttp2 {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    let (client, connection) = h2::client::handshake(tcp).await.expect("h2c handshake");
    let connection = tokio::spawn(connection);
    let mut client = client.ready().await.expect("ready");
    let request = Request::get(format!("http://127.0.0.1:{port}/items/apple"))
        .body(())
        .expect("request");
    let (response, _) = client.send_request(request, true).expect("send");
    let response = response.await.expect("response");
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    while let Some(chunk) = body.data().await {
        chunk.expect("body");
    }
    IdleHttp2 {
        idle_from: Instant::now(),
        _client: client,
        connection,
    }
}

struct IdleHttp2 {
    idle_from: Instant,
    // Held: an h2 client with no handle left closes its connection itself.
    _client: h2::client::SendRequest<axum::body::Bytes>,
    connection: tokio::task::JoinHandle<Result<(), h2::Error>>,
}

impl IdleHttp2 {
    /// Waits for the service to close the connection, for at most
    /// `within`; returns how long it had been idle then. A GOAWAY or a
    /// closed socket, the connection ends either way.
    async fn closed_within(&mut self, within: Duration) -> Duration {
        let _ended_by_the_service = tokio::time::timeout(within, &mut self.connection)
            .await
            .unwrap_or_else(|_| panic!("still open after {within:?}"))
            .expect("the connection task");
        self.idle_from.elapsed()
    }
}

#[tokio::test]
async fn idle_http2_connections_are_closed_at_the_idle_timeout() {
    // Pings every second, answered: only the idle timeout closes them.
    let service = Service::start(&[
        ("IDLE_TIMEOUT_SECS", "2"),
        ("HTTP2_KEEP_ALIVE_SECS", "1"),
        ("HTTP2_KEEP_ALIVE_TIMEOUT_SECS", "1"),
    ]);
    // In batches: a burst of a thousand connects overflows the listen
    // queue (128), and the kernel resets some.
    let mut idle = Vec::new();
    for _ in 0..1000 / 50 {
        let batch: Vec<_> = (0..50)
            .map(|_| tokio::spawn(idle_http2_connection(service.public)))
            .collect();
        for connection in batch {
            idle.push(connection.await.expect("an idle HTTP/2 connection"));
        }
    }
    let mut longest = Duration::ZERO;
    let mut shortest = Duration::MAX;
    for mut connection in idle {
        let idle_for = connection.closed_within(Duration::from_secs(6)).await;
        assert!(
            idle_for >= Duration::from_millis(1500),
            "closed after {idle_for:?} idle"
        );
        longest = longest.max(idle_for);
        shortest = shortest.min(idle_for);
    }
    eprintln!("1000 idle HTTP/2 connections closed {shortest:?} to {longest:?} after going idle");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_cap_a_new_client_takes_the_place_of_the_oldest_idle_connection() {
    let service = Service::start(&[("MAX_CONNECTIONS", "500")]);
    // The readiness probes' connections release their places once the
    // service has seen them close.
    tokio::time::sleep(Duration::from_millis(300)).await;
    // One after the other, so the first is the oldest idle.
    let mut idle = Vec::new();
    for _ in 0..500 {
        idle.push(idle_http2_connection(service.public).await);
    }
    let port = service.public;
    let started = Instant::now();
    let answer = tokio::task::spawn_blocking(move || status(port, "/items/apple"))
        .await
        .expect("curl");
    let took = started.elapsed();
    assert_eq!(answer.as_deref(), Some("200"));
    assert!(took < Duration::from_secs(1), "answered after {took:?}");
    eprintln!("answered in {took:?} with 500 idle connections at the cap");
    idle[0].closed_within(Duration::from_secs(2)).await;
    let closed = idle.iter().filter(|c| c.connection.is_finished()).count();
    assert_eq!(closed, 1, "only the oldest made room");
}

#[test]
fn at_the_cap_idle_connections_are_closed_oldest_first() {
    let service = Service::start(&[("MAX_CONNECTIONS", "20")]);
    std::thread::sleep(Duration::from_millis(300));
    let mut held = open_and_stall(service.public, 30, b"");
    std::thread::sleep(Duration::from_millis(300));
    let closed: Vec<usize> = (0..held.len())
        .filter(|&i| is_closed(&mut held[i]))
        .collect();
    assert_eq!(
        closed,
        (0..10).collect::<Vec<_>>(),
        "the ten oldest make room for the ten over the cap"
    );
}

#[test]
fn at_the_cap_connections_with_requests_in_flight_are_kept_and_new_ones_closed() {
    let service = Service::start(&[("MAX_CONNECTIONS", "20")]);
    std::thread::sleep(Duration::from_millis(300));
    // Requests whose bodies never come: in flight until the request deadline.
    let mut busy = open_and_stall(
        service.public,
        20,
        b"POST /items HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{",
    );
    std::thread::sleep(Duration::from_millis(300));
    let mut new = open_and_stall(service.public, 10, b"");
    wait_all_closed(&mut new, Duration::from_secs(1));
    assert!(
        busy.iter_mut().all(|stream| !is_closed(stream)),
        "a connection with a request in flight was closed"
    );
    drop(busy);
    // Once they go, the service answers again.
    let deadline = Instant::now() + Duration::from_secs(5);
    while status(service.public, "/items/apple").as_deref() != Some("200") {
        assert!(
            Instant::now() < deadline,
            "no answer after the busy connections left"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn the_service_metrics_are_recorded_as_they_happen_with_help_and_histograms() {
    let service = Service::start(&[]);
    // One present and one absent key, through the guard.
    assert_eq!(
        status(service.public, "/items/apple").as_deref(),
        Some("200")
    );
    assert_eq!(
        status(service.public, "/items/no-such-item").as_deref(),
        Some("404")
    );
    let output = Command::new("curl")
        .args(["-s", "-m", "2", "-H", "authorization: Bearer secret"])
        .arg(format!("http://127.0.0.1:{}/metrics", service.admin))
        .output()
        .expect("curl");
    let text = String::from_utf8_lossy(&output.stdout);
    for expected in [
        "# HELP bloom_guard_rejected_total",
        "# TYPE bloom_guard_build_duration_seconds histogram",
        r#"bloom_guard_build_duration_seconds_bucket{guard="items",source="scan",le="0.005"}"#,
        r#"bloom_guard_build_duration_seconds_bucket{guard="users",source="scan",le="+Inf"} 1"#,
        r#"bloom_guard_rejected_total{guard="items"} 1"#,
        r#"bloom_guard_ready{guard="items"} 1"#,
        r#"bloom_guard_ready{guard="users"} 1"#,
    ] {
        assert!(text.contains(expected), "{expected} missing from\n{text}");
    }
}
