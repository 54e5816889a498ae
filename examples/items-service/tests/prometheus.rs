//! The monitoring parts against the real thing: the service binary, scraped
//! by a real Prometheus with the alert rules loaded, queried through its
//! HTTP API; and every query of the Grafana dashboard run by that
//! Prometheus. Needs the `prometheus` binary (see build.rs): without it the
//! test shows as ignored.

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// A child process killed when dropped, its output kept in a file.
struct Process {
    child: Child,
    log: std::path::PathBuf,
}

impl Process {
    fn start(mut command: Command, log: std::path::PathBuf) -> Self {
        let out = std::fs::File::create(&log).expect("log file");
        let err = out.try_clone().expect("log file");
        let child = command
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .expect("start the process");
        Self { child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
}

/// `GET path` over HTTP/1.0 (no chunking, the body ends with the
/// connection): the status and the body.
fn get(addr: SocketAddr, path: &str, token: Option<&str>) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .ok()?;
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n{auth}\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let status = response.split(' ').nth(1)?.parse().ok()?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())?;
    Some((status, body))
}

/// `text` as a URL query value.
fn encode(text: &str) -> String {
    text.bytes()
        .map(|byte| match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (byte as char).to_string()
            }
            _ => format!("%{byte:02X}"),
        })
        .collect()
}

/// Waits up to 60 s for `check` to give a value.
fn wait_for<T>(what: &str, logs: &[&Process], mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(value) = check() {
            return value;
        }
        if Instant::now() > deadline {
            let logs: Vec<String> = logs.iter().map(|p| p.log()).collect();
            panic!(
                "timed out waiting for {what}; logs:\n{}",
                logs.join("\n---\n")
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Prometheus's answer to `query` (an instant query), if it succeeded.
fn query(prometheus: SocketAddr, query: &str) -> Result<Value, String> {
    let path = format!("/api/v1/query?query={}", encode(query));
    let (_, body) = get(prometheus, &path, None).ok_or("no answer")?;
    let answer: Value = serde_json::from_str(&body).map_err(|e| e.to_string())?;
    if answer["status"] == "success" {
        Ok(answer["data"]["result"].clone())
    } else {
        Err(format!("{query}: {answer}"))
    }
}

/// Every query of the dashboard, its variables set as Grafana would.
fn dashboard_queries(repo: &Path) -> Vec<String> {
    let text =
        std::fs::read_to_string(repo.join("docs/grafana/bloom-guard.json")).expect("dashboard");
    let dashboard: Value = serde_json::from_str(&text).expect("dashboard JSON");
    let mut queries = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().into_iter().flatten() {
            if let Some(expr) = target["expr"].as_str() {
                queries.push(
                    expr.replace("$guard", ".*")
                        .replace("$__rate_interval", "1m")
                        .replace("$__range", "1h"),
                );
            }
        }
    }
    queries
}

#[test]
#[cfg_attr(
    not(prometheus),
    ignore = "needs the prometheus binary: apt-get install prometheus, or set PROMETHEUS"
)]
fn a_real_prometheus_scrapes_the_service_and_loads_the_rules_and_the_dashboard() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dir = tempfile::tempdir().expect("temp dir");
    let (api, admin, prometheus) = (free_port(), free_port(), free_port());

    let mut service = Command::new(env!("CARGO_BIN_EXE_items-service"));
    service
        .env_remove("DATABASE_URL")
        .env("SQLITE_PATH", dir.path().join("items.db"))
        .env("BIND_ADDR", api.to_string())
        .env("ADMIN_ADDR", admin.to_string())
        .env("ADMIN_TOKEN", "s3cret")
        // Rejections are counted exactly: no audits.
        .env("BLOOM_AUDIT_RATE", "0")
        .env("RUST_LOG", "warn");
    let service = Process::start(service, dir.path().join("service.log"));
    wait_for("the service's /readyz", &[&service], || {
        get(api, "/readyz", None).filter(|(status, _)| *status == 200)
    });
    for i in 0..20 {
        let (status, _) = get(api, &format!("/items/absent-{i}"), None).expect("an answer");
        assert_eq!(status, 404);
    }

    let config = format!(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {rules}\n\
         scrape_configs:\n  - job_name: items-service\n    authorization:\n      credentials: s3cret\n\
         \x20   static_configs:\n      - targets: [\"{admin}\"]\n",
        rules = repo.join("docs/prometheus/alerts.yml").display(),
    );
    std::fs::write(dir.path().join("prometheus.yml"), config).expect("config");
    // Set by build.rs when it found the binary; without it this test is
    // ignored, and run by hand it says what is missing.
    let Some(binary) = option_env!("ITEMS_SERVICE_PROMETHEUS") else {
        panic!("no prometheus binary at build time: apt-get install prometheus, or set PROMETHEUS");
    };
    let mut server = Command::new(binary);
    server
        .arg(format!(
            "--config.file={}",
            dir.path().join("prometheus.yml").display()
        ))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.path().join("data").display()
        ))
        .arg(format!("--web.listen-address={prometheus}"));
    let server = Process::start(server, dir.path().join("prometheus.log"));
    let logs = [&service, &server];

    // The rejections, scraped and queried back through Prometheus.
    let rejected = wait_for(
        "bloom_guard_rejected_total through Prometheus",
        &logs,
        || {
            let result = query(prometheus, r#"bloom_guard_rejected_total{guard="items"}"#).ok()?;
            let value: f64 = result[0]["value"][1].as_str()?.parse().ok()?;
            (value >= 20.0).then_some(value)
        },
    );
    assert_eq!(rejected, 20.0);
    let (_, targets) = get(prometheus, "/api/v1/targets", None).expect("targets");
    assert!(targets.contains(r#""health":"up""#), "{targets}");

    // The alert rules, loaded and evaluated without error.
    let rules: Value = wait_for("the rules evaluated", &logs, || {
        let (_, body) = get(prometheus, "/api/v1/rules", None)?;
        let rules: Value = serde_json::from_str(&body).ok()?;
        let all = rules["data"]["groups"][0]["rules"].as_array()?.clone();
        all.iter()
            .all(|rule| {
                rule["lastEvaluation"]
                    .as_str()
                    .is_some_and(|at| !at.starts_with("0001"))
            })
            .then_some(Value::Array(all))
    });
    let rules = rules.as_array().expect("rules");
    let written = std::fs::read_to_string(repo.join("docs/prometheus/alerts.yml"))
        .expect("alerts.yml")
        .lines()
        .filter(|line| line.trim_start().starts_with("- alert:"))
        .count();
    assert_eq!(rules.len(), written, "every rule of alerts.yml loaded");
    for rule in rules {
        assert_eq!(rule["health"], "ok", "{rule}");
    }
    // A healthy, ready service fires none of them.
    let firing = query(prometheus, "ALERTS").expect("ALERTS");
    assert_eq!(firing, Value::Array(Vec::new()), "{firing}");

    // Every dashboard query is one Prometheus runs; the gauges have data.
    for expr in dashboard_queries(&repo) {
        query(prometheus, &expr).unwrap_or_else(|error| panic!("a dashboard query fails: {error}"));
    }
    for gauge in [
        "bloom_guard_ready",
        "bloom_guard_keys",
        "bloom_guard_capacity",
        "bloom_guard_estimated_fpp",
    ] {
        let result = query(prometheus, &format!(r#"{gauge}{{guard="items"}}"#)).expect(gauge);
        assert_eq!(
            result.as_array().map(Vec::len),
            Some(1),
            "{gauge}: {result}"
        );
    }
}
