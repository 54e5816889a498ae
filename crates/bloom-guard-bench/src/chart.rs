//! The results as an SVG bar chart of requests per second.

use std::path::Path;

use plotters::prelude::*;

use crate::load::Row;

/// Draws one bar per run: its requests per second.
pub(crate) fn draw(path: &Path, rows: &[Row]) -> Result<(), Box<dyn std::error::Error>> {
    let height = 90 + 46 * rows.len() as u32;
    let root = SVGBackend::new(path, (1000, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let max = rows
        .iter()
        .map(|r| r.measured.requests_per_sec)
        .fold(1.0, f64::max)
        * 1.1;
    let labels: Vec<String> = rows
        .iter()
        .map(|r| format!("{} / {:?}", r.target, r.workload).to_lowercase())
        .collect();
    let mut chart = ChartBuilder::on(&root)
        .caption("items-service: requests per second", ("sans-serif", 20))
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(260)
        .build_cartesian_2d(0.0..max, (0..rows.len() - 1).into_segmented())?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .x_desc("requests per second")
        .x_label_formatter(&|v| format!("{:.0}k", v / 1000.0))
        .y_labels(rows.len())
        .y_label_style(("sans-serif", 14))
        .y_label_formatter(&|segment| match segment {
            SegmentValue::CenterOf(i) | SegmentValue::Exact(i) => {
                labels.get(*i).cloned().unwrap_or_default()
            }
            SegmentValue::Last => String::new(),
        })
        .draw()?;
    chart.draw_series(rows.iter().enumerate().map(|(i, row)| {
        let color = match row.target.as_str() {
            "guarded" | "guarded, rebuilding" => RGBColor(46, 125, 50),
            "unguarded" => RGBColor(198, 40, 40),
            _ => RGBColor(96, 96, 96),
        };
        let mut bar = Rectangle::new(
            [
                (0.0, SegmentValue::Exact(i)),
                (row.measured.requests_per_sec, SegmentValue::Exact(i + 1)),
            ],
            color.filled(),
        );
        bar.set_margin(6, 6, 0, 0);
        bar
    }))?;
    chart.draw_series(rows.iter().enumerate().map(|(i, row)| {
        Text::new(
            format!("{:.0}", row.measured.requests_per_sec),
            (
                row.measured.requests_per_sec + max * 0.01,
                SegmentValue::CenterOf(i),
            ),
            ("sans-serif", 13).into_font(),
        )
    }))?;
    root.present()?;
    Ok(())
}

/// Draws one bar per cell: the watched table's throughput over the
/// unwatched twin's, with the 0.8 target marked.
pub(crate) fn draw_ratios(
    path: &Path,
    cells: &[(String, f64)],
) -> Result<(), Box<dyn std::error::Error>> {
    let height = 90 + 30 * cells.len() as u32;
    let root = SVGBackend::new(path, (900, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "writers: watched ÷ unwatched throughput",
            ("sans-serif", 20),
        )
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(220)
        .build_cartesian_2d(0.0..1.2, (0..cells.len() - 1).into_segmented())?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .x_desc("ratio")
        .y_labels(cells.len())
        .y_label_style(("sans-serif", 13))
        .y_label_formatter(&|segment| match segment {
            SegmentValue::CenterOf(i) | SegmentValue::Exact(i) => cells
                .get(*i)
                .map(|(label, _)| label.clone())
                .unwrap_or_default(),
            SegmentValue::Last => String::new(),
        })
        .draw()?;
    chart.draw_series(cells.iter().enumerate().map(|(i, (_, ratio))| {
        let color = if *ratio >= 0.8 {
            BLUE.mix(0.6)
        } else {
            RED.mix(0.6)
        };
        Rectangle::new(
            [
                (0.0, SegmentValue::Exact(i)),
                (*ratio, SegmentValue::Exact(i + 1)),
            ],
            color.filled(),
        )
    }))?;
    chart.draw_series(std::iter::once(PathElement::new(
        vec![(0.8, SegmentValue::Exact(0)), (0.8, SegmentValue::Last)],
        BLACK.stroke_width(1),
    )))?;
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::{Measured, Workload};

    #[test]
    fn draws_one_bar_per_run() {
        let row = |target: &str, rps| Row {
            target: target.to_owned(),
            workload: Workload::Attack,
            measured: Measured {
                requests: 1,
                all_requests: 1,
                errors: 0,
                seconds: 1.0,
                requests_per_sec: rps,
                p50_us: 1,
                p99_us: 1,
                p999_us: 1,
                statuses: vec![(404, 1)],
            },
            db_lookups_per_1000: None,
            db_transactions_per_sec: None,
        };
        let path =
            std::env::temp_dir().join(format!("bloom-load-chart-{}.svg", std::process::id()));
        draw(
            &path,
            &[row("guarded", 80_000.0), row("unguarded", 10_000.0)],
        )
        .expect("chart");
        let svg = std::fs::read_to_string(&path).expect("svg");
        assert!(
            svg.contains("guarded / attack") && svg.contains("80000"),
            "{svg}"
        );
        let _ = std::fs::remove_file(&path);
    }
}
