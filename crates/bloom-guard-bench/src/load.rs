//! An HTTP/1 load generator: fixed connections, each sending requests back
//! to back for a fixed time, latencies in an HDR histogram.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hdrhistogram::Histogram;
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http1;
use hyper::Request;
use hyper_util::rt::TokioIo;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use tokio::net::TcpStream;

/// Which paths a workload requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Workload {
    /// Random keys that do not exist: the attack.
    Attack,
    /// A hot set of existing keys.
    Hot,
    /// 90% absent keys, 10% hot existing keys.
    Mix,
    /// Random paths no route matches: the HTTP stack's own 404.
    Unrouted,
}

impl Workload {
    /// The path of one request.
    pub(crate) fn path(self, hot_keys: u64) -> String {
        let hot = || format!("/items/key-{}", 1 + fastrand::u64(..hot_keys));
        let absent = || format!("/items/absent-{:016x}", fastrand::u64(..));
        match self {
            Workload::Attack => absent(),
            Workload::Hot => hot(),
            Workload::Mix if fastrand::u8(..10) == 0 => hot(),
            Workload::Mix => absent(),
            Workload::Unrouted => format!("/unrouted/{:016x}", fastrand::u64(..)),
        }
    }
}

/// What one run measured.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub(crate) struct Measured {
    pub(crate) requests: u64,
    /// Requests answered, the warm-up's included.
    #[serde(default)]
    pub(crate) all_requests: u64,
    pub(crate) errors: u64,
    pub(crate) seconds: f64,
    pub(crate) requests_per_sec: f64,
    pub(crate) p50_us: u64,
    pub(crate) p99_us: u64,
    pub(crate) p999_us: u64,
    pub(crate) statuses: Vec<(u16, u64)>,
}

/// Runs `workload` against `addr` over `connections` connections for
/// `duration`, after a `warm_up` whose requests are not counted.
pub(crate) async fn run(
    addr: &str,
    workload: Workload,
    hot_keys: u64,
    connections: usize,
    warm_up: Duration,
    duration: Duration,
    label: &str,
) -> Measured {
    let load = Load {
        addrs: vec![addr.to_owned()],
        workload,
        hot_keys,
        connections,
        rate: None,
    };
    run_load(&load, warm_up, duration, label).await
}

/// A load: where, what, how many connections, and at what total rate
/// (back to back when `None`).
pub(crate) struct Load {
    /// Connection `i` goes to `addrs[i % addrs.len()]`.
    pub(crate) addrs: Vec<String>,
    pub(crate) workload: Workload,
    pub(crate) hot_keys: u64,
    pub(crate) connections: usize,
    /// Requests per second over all connections, each connection sending
    /// on its own fixed schedule.
    pub(crate) rate: Option<f64>,
}

/// Runs `load` for `duration`, after a `warm_up` whose requests are not
/// counted.
pub(crate) async fn run_load(
    load: &Load,
    warm_up: Duration,
    duration: Duration,
    label: &str,
) -> Measured {
    let (workload, hot_keys) = (load.workload, load.hot_keys);
    let interval = load
        .rate
        .map(|rate| Duration::from_secs_f64(load.connections as f64 / rate.max(1e-3)));
    let done = Arc::new(AtomicU64::new(0));
    let all = Arc::new(AtomicU64::new(0));
    let bar = ProgressBar::new(duration.as_millis() as u64);
    bar.set_style(
        ProgressStyle::with_template("{prefix:>34} [{bar:30}] {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_prefix(label.to_owned());
    let measure_from = Instant::now() + warm_up;
    let until = measure_from + duration;
    let tasks: Vec<_> = (0..load.connections)
        .map(|i| {
            let addr = load.addrs[i % load.addrs.len()].clone();
            let (done, all) = (Arc::clone(&done), Arc::clone(&all));
            // Paced connections start spread over one interval.
            let first = Instant::now()
                + interval.map_or(Duration::ZERO, |every| {
                    every.mul_f64(i as f64 / load.connections as f64)
                });
            tokio::spawn(async move {
                let schedule = Schedule {
                    measure_from,
                    until,
                    next: first,
                    interval,
                };
                connection(&addr, workload, hot_keys, schedule, &done, &all).await
            })
        })
        .collect();
    let ticker = {
        let (bar, done) = (bar.clone(), Arc::clone(&done));
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(200)).await;
                let now = Instant::now();
                if now >= measure_from {
                    let elapsed = now.duration_since(measure_from).min(duration);
                    bar.set_position(elapsed.as_millis() as u64);
                    let rate =
                        done.load(Ordering::Relaxed) as f64 / elapsed.as_secs_f64().max(1e-3);
                    bar.set_message(format!("{rate:>9.0} req/s"));
                }
            }
        })
    };
    let mut histogram = Histogram::<u64>::new(3).expect("a valid histogram precision");
    let mut errors = 0;
    let mut statuses = std::collections::BTreeMap::new();
    for task in tasks {
        if let Ok(part) = task.await {
            histogram
                .add(&part.histogram)
                .expect("histograms of one precision");
            errors += part.errors;
            for (status, count) in part.statuses {
                *statuses.entry(status).or_insert(0) += count;
            }
        } else {
            errors += 1;
        }
    }
    ticker.abort();
    bar.finish();
    let requests = histogram.len();
    let seconds = duration.as_secs_f64();
    Measured {
        requests,
        all_requests: all.load(Ordering::Relaxed),
        errors,
        seconds,
        requests_per_sec: requests as f64 / seconds,
        p50_us: histogram.value_at_quantile(0.50),
        p99_us: histogram.value_at_quantile(0.99),
        p999_us: histogram.value_at_quantile(0.999),
        statuses: statuses.into_iter().collect(),
    }
}

struct Part {
    histogram: Histogram<u64>,
    errors: u64,
    statuses: std::collections::BTreeMap<u16, u64>,
}

/// When one connection sends.
struct Schedule {
    measure_from: Instant,
    until: Instant,
    /// The next request's time, when paced.
    next: Instant,
    interval: Option<Duration>,
}

/// One connection's loop; reconnects after an error.
async fn connection(
    addr: &str,
    workload: Workload,
    hot_keys: u64,
    mut schedule: Schedule,
    done: &AtomicU64,
    all: &AtomicU64,
) -> Part {
    let (measure_from, until) = (schedule.measure_from, schedule.until);
    let mut part = Part {
        histogram: Histogram::new(3).expect("a valid histogram precision"),
        errors: 0,
        statuses: std::collections::BTreeMap::new(),
    };
    'connect: while Instant::now() < until {
        let Ok(stream) = TcpStream::connect(addr).await else {
            part.errors += 1;
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let _ = stream.set_nodelay(true);
        let Ok((mut sender, conn)) =
            http1::handshake::<_, Empty<Bytes>>(TokioIo::new(stream)).await
        else {
            part.errors += 1;
            continue;
        };
        tokio::spawn(conn);
        loop {
            if let Some(every) = schedule.interval {
                tokio::time::sleep_until(schedule.next.into()).await;
                schedule.next += every;
            }
            let started = Instant::now();
            if started >= until {
                break 'connect;
            }
            let request = Request::get(workload.path(hot_keys))
                .header("host", addr)
                .body(Empty::new())
                .expect("a valid request");
            if sender.ready().await.is_err() {
                part.errors += 1;
                continue 'connect;
            }
            let outcome = match sender.send_request(request).await {
                Ok(response) => {
                    let status = response.status().as_u16();
                    response.into_body().collect().await.map(|_| status)
                }
                Err(error) => Err(error),
            };
            if outcome.is_ok() {
                all.fetch_add(1, Ordering::Relaxed);
            }
            if started < measure_from {
                continue;
            }
            match outcome {
                Ok(status) => {
                    let micros = started.elapsed().as_micros() as u64;
                    let _ = part.histogram.record(micros.max(1));
                    *part.statuses.entry(status).or_insert(0) += 1;
                    if status >= 500 {
                        part.errors += 1;
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                }
                Err(_) => {
                    part.errors += 1;
                    continue 'connect;
                }
            }
        }
    }
    part
}

/// One measured run.
#[derive(Debug, Serialize, serde::Deserialize)]
pub(crate) struct Row {
    pub(crate) target: String,
    pub(crate) workload: Workload,
    #[serde(flatten)]
    pub(crate) measured: Measured,
    pub(crate) db_lookups_per_1000: Option<f64>,
    /// Database transactions per second during the run (the guard's feed
    /// reads, the handlers' lookups), where counted.
    #[serde(default)]
    pub(crate) db_transactions_per_sec: Option<f64>,
}
