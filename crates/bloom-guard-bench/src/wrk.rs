//! Running `wrk` against a service: requests a second, p50 and p99.

use std::path::Path;

use tokio::process::Command;

/// Runs `wrk` against `addr` with `script`: requests a second, p50 and
/// p99 in milliseconds.
pub(crate) async fn wrk(
    addr: &str,
    script: &Path,
    connections: usize,
    seconds: u64,
) -> Result<(f64, f64, f64), Box<dyn std::error::Error>> {
    let threads = connections.clamp(1, 2);
    let output = Command::new("wrk")
        .arg(format!("-t{threads}"))
        .arg(format!("-c{connections}"))
        .arg(format!("-d{seconds}s"))
        .arg("--latency")
        .arg("-s")
        .arg(script)
        .arg(format!("http://{addr}"))
        .output()
        .await
        .map_err(|e| format!("cannot run wrk: {e} (apt-get install wrk)"))?;
    let text = String::from_utf8_lossy(&output.stdout);
    let rps = text
        .lines()
        .find_map(|line| line.strip_prefix("Requests/sec:"))
        .and_then(|value| value.trim().parse().ok())
        .ok_or_else(|| {
            format!(
                "no Requests/sec in wrk's output:\n{text}{}",
                String::from_utf8_lossy(&output.stderr)
            )
        })?;
    let percentile = |name: &str| {
        text.lines()
            .find_map(|line| line.trim().strip_prefix(name))
            .and_then(|value| millis(value.trim()))
            .unwrap_or(f64::NAN)
    };
    Ok((rps, percentile("50%"), percentile("99%")))
}

/// A wrk duration (`812.00us`, `1.20ms`, `2.01s`) in milliseconds.
fn millis(text: &str) -> Option<f64> {
    let split = text.find(|c: char| c.is_ascii_alphabetic())?;
    let (value, unit) = text.split_at(split);
    let value: f64 = value.parse().ok()?;
    match unit {
        "us" => Some(value / 1000.0),
        "ms" => Some(value),
        "s" => Some(value * 1000.0),
        "m" => Some(value * 60_000.0),
        _ => None,
    }
}

pub(crate) fn tempfile_dir() -> std::io::Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("bloom-load-barrier-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::millis;

    #[test]
    fn reads_wrk_durations() {
        assert_eq!(millis("812.00us"), Some(0.812));
        assert_eq!(millis("1.50ms"), Some(1.5));
        assert_eq!(millis("2.00s"), Some(2000.0));
        assert_eq!(millis("fast"), None);
    }
}
