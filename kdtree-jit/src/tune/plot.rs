//! `--plot FILE.svg`: per shape, time against M for the best variant, cuBLAS bf16 and the
//! bandwidth floor (the time the measured copy bandwidth allows for the bytes moved), since a
//! roofline reads faster than a table.

use std::path::Path;

use plotters::coord::combinators::IntoLogRange;
use plotters::prelude::*;

use super::error::{Result, TuneError};
use super::key::Shape;
use super::report::Row;

const PANEL: (u32, u32) = (640, 420);

/// Draws one panel per shape of `rows` into an SVG file at `path`.
pub fn write_svg(path: &Path, rows: &[Row]) -> Result<()> {
    let mut shapes: Vec<Shape> = rows.iter().map(|r| r.shape).collect();
    shapes.sort();
    shapes.dedup();
    let cols = shapes.len().clamp(1, 2);
    let panel_rows = shapes.len().div_ceil(cols).max(1);
    let err = |e: &dyn std::fmt::Display| TuneError::Plot { path: path.into(), message: e.to_string() };
    let root = SVGBackend::new(path, (PANEL.0 * cols as u32, PANEL.1 * panel_rows as u32)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    for (area, shape) in root.split_evenly((panel_rows, cols)).iter().zip(&shapes) {
        let mut of_shape: Vec<&Row> = rows.iter().filter(|r| r.shape == *shape).collect();
        of_shape.sort_by_key(|r| r.m);
        panel(area, *shape, &of_shape).map_err(|e| err(&e))?;
    }
    root.present().map_err(|e| err(&e))
}

type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;

fn panel(area: &Area<'_>, shape: Shape, rows: &[&Row]) -> std::result::Result<(), Box<dyn std::error::Error>> {
    let m_max = rows.iter().map(|r| r.m).max().unwrap_or(1).max(2) as f64;
    let times = rows.iter().flat_map(|r| [Some(r.us), Some(r.floor_us), r.cublas_bf16_us]).flatten();
    let t_max = times.fold(1.0, f64::max) * 1.15;
    let mut chart = ChartBuilder::on(area)
        .caption(format!("N x K = {} x {}", shape.n, shape.k), ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(52)
        .build_cartesian_2d((1.0..m_max).log_scale(), 0.0..t_max)?;
    chart.configure_mesh().x_desc("M (rows)").y_desc("time (us)").draw()?;

    let series = [
        ("best variant", BLUE, rows.iter().map(|r| (r.m as f64, r.us)).collect::<Vec<_>>()),
        ("cuBLAS bf16", RED, rows.iter().filter_map(|r| Some((r.m as f64, r.cublas_bf16_us?))).collect()),
        ("copy-bandwidth floor", BLACK, rows.iter().map(|r| (r.m as f64, r.floor_us)).collect()),
    ];
    for (label, color, points) in series {
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)).point_size(3))?
            .label(label)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], color.stroke_width(2)));
    }
    chart.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).draw()?;
    Ok(())
}
