//! The service binary under hostile HTTP: many idle sockets, silent and
//! half-spoken connections, deaf HTTP/2 clients, a connection cap.
//! Started with the operating system's usual soft limit of 1024 open files,
//! as a service manager would start it.

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

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

#[test]
fn connections_over_the_cap_are_closed_at_once() {
    let service = Service::start(&[("MAX_CONNECTIONS", "20")]);
    // The readiness probes' connections release their permits once the
    // service has seen them close.
    std::thread::sleep(Duration::from_millis(300));
    let mut held: Vec<TcpStream> = (0..30)
        .map(|_| TcpStream::connect(("127.0.0.1", service.public)).expect("connect"))
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let mut closed = 0;
    for stream in &mut held {
        stream
            .set_read_timeout(Some(Duration::from_millis(100)))
            .expect("timeout");
        if matches!(stream.read(&mut [0; 1]), Ok(0)) {
            closed += 1;
        }
    }
    assert_eq!(closed, 10, "the ten over the cap are closed, the rest held");
    drop(held);
    // Once they go, the service answers again.
    let deadline = Instant::now() + Duration::from_secs(5);
    while status(service.public, "/items/apple").as_deref() != Some("200") {
        assert!(
            Instant::now() < deadline,
            "no answer after the idle sockets left"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
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
