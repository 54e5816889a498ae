//! The results as an SVG bar chart of requests per second.

use std::path::Path;

use plotters::prelude::*;

use crate::Row;

/// Draws one bar per run: its requests per second.
pub(crate) fn draw(path: &Path, rows: &[Row]) -> Result<(), Box<dyn std::error::Error>> {
    let root = SVGBackend::new(path, (1100, 520)).into_drawing_area();
    root.fill(&WHITE)?;
    let max = rows
        .iter()
        .map(|r| r.measured.requests_per_sec)
        .fold(1.0, f64::max)
        * 1.15;
    let labels: Vec<String> = rows
        .iter()
        .map(|r| format!("{} / {:?}", r.target, r.workload).to_lowercase())
        .collect();
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "items-service: requests per second by target and workload",
            ("sans-serif", 20),
        )
        .margin(16)
        .x_label_area_size(150)
        .y_label_area_size(80)
        .build_cartesian_2d((0..rows.len() - 1).into_segmented(), 0.0..max)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .y_desc("req/s")
        .x_labels(rows.len())
        .x_label_style(
            ("sans-serif", 13)
                .into_font()
                .transform(FontTransform::Rotate90),
        )
        .x_label_formatter(&|segment| match segment {
            SegmentValue::CenterOf(i) | SegmentValue::Exact(i) => {
                labels.get(*i).cloned().unwrap_or_default()
            }
            SegmentValue::Last => String::new(),
        })
        .draw()?;
    chart.draw_series(rows.iter().enumerate().map(|(i, row)| {
        let color = match row.target {
            "guarded" | "guarded, rebuilding" => RGBColor(46, 125, 50),
            "unguarded" => RGBColor(198, 40, 40),
            _ => RGBColor(96, 96, 96),
        };
        let mut bar = Rectangle::new(
            [
                (SegmentValue::Exact(i), 0.0),
                (SegmentValue::Exact(i + 1), row.measured.requests_per_sec),
            ],
            color.filled(),
        );
        bar.set_margin(0, 0, 8, 8);
        bar
    }))?;
    root.present()?;
    Ok(())
}
