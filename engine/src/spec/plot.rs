//! `bench --spec --plot FILE.svg`: speed-up over greedy decoding against the oracle's p, one line per
//! method, since the crossing points read faster from a plot than from a table.

use std::path::Path;

use plotters::prelude::*;

use super::sweep::SpecRow;
use crate::error::{EngineError, Result};

/// Draws the speculative rows of `rows` (greedy's is the 1x line) into an SVG file at `path`.
pub fn write_svg(path: &Path, rows: &[SpecRow]) -> Result<()> {
    draw(path, rows).map_err(|e| EngineError::Plot { file: path.display().to_string(), reason: e.to_string() })
}

fn draw(path: &Path, rows: &[SpecRow]) -> std::result::Result<(), Box<dyn std::error::Error>> {
    let mut methods: Vec<&str> = Vec::new();
    for r in rows.iter().filter(|r| r.p.is_some()) {
        if !methods.contains(&r.method.as_str()) {
            methods.push(&r.method);
        }
    }
    let ps = rows.iter().filter_map(|r| r.p);
    let (p_min, p_max) = ps.fold((1.0f64, 0.0f64), |(lo, hi), p| (lo.min(p), hi.max(p)));
    let top = rows.iter().map(|r| r.speedup).fold(1.0, f64::max) * 1.15;
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption("speed-up over greedy decoding, noisy-oracle drafter", ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(52)
        .right_y_label_area_size(0)
        .build_cartesian_2d((p_min - 0.02)..(p_max + 0.02), 0.0..top)?;
    chart.configure_mesh().x_desc("p (oracle accuracy)").y_desc("speed-up (x)").draw()?;
    chart.draw_series(LineSeries::new([(p_min - 0.02, 1.0), (p_max + 0.02, 1.0)], BLACK.stroke_width(1)))?;
    for (i, method) in methods.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let points: Vec<(f64, f64)> =
            rows.iter().filter(|r| r.method == *method).filter_map(|r| Some((r.p?, r.speedup))).collect();
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)).point_size(3))?
            .label(*method)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], color.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}
