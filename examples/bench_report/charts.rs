//! The chart kinds of the PNG plots (feature `plots`): the stall against state size, log-log,
//! and labelled bars with dashed reference lines, drawn with `plotters`.

use std::path::Path;

use plotters::prelude::*;

use crate::{
    stall::StallRow,
    stats::{mb, median, min_max, num},
};

/// What drawing a plot returns.
pub(crate) type PlotResult = std::result::Result<(), Box<dyn std::error::Error>>;

const W: (u32, u32) = (960, 560);
const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(127, 127, 127),
];
/// Reference lines (targets, budgets), distinct from the bar colors.
const REF_COLORS: [RGBColor; 2] = [RGBColor(0, 0, 0), RGBColor(140, 86, 75)];

/// Registers the font as plotters' `sans-serif`; `false` (with a warning) if it cannot.
pub(crate) fn load_font(path: &Path) -> bool {
    match std::fs::read(path) {
        Ok(bytes) => {
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok()
        }
        Err(_) => false,
    }
}

/// A named line: the samples of one mode in a row.
type Series = (&'static str, fn(&StallRow) -> &Vec<f64>);

/// Stall per save against the state size, log-log, one line per mode.
pub(crate) fn stall(path: &Path, rows: &[StallRow]) -> PlotResult {
    let root = BitMapBackend::new(path, W).into_drawing_area();
    root.fill(&WHITE)?;
    let series: [Series; 5] = [
        ("Burn built-in", |r| &r.burn_ms),
        ("ours, sync", |r| &r.sync_ms),
        ("memcpy floor", |r| &r.memcpy_ms),
        ("ours, async", |r| &r.async_ms),
        ("handle clone", |r| &r.clone_ms),
    ];
    let xs: Vec<f64> = rows.iter().map(|r| mb(r.bytes as f64)).collect();
    let (x0, x1) = min_max(&xs);
    let ys: Vec<f64> = rows
        .iter()
        .flat_map(|r| series.iter().map(move |(_, f)| median(f(r))))
        .filter(|y| y.is_finite() && *y > 0.0)
        .collect();
    let (y0, y1) = min_max(&ys);
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Training-thread stall per save (median, log-log)",
            ("sans-serif", 24),
        )
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d(
            (x0 / 1.5..x1 * 1.5).log_scale(),
            (y0 / 3.0..y1 * 3.0).log_scale(),
        )?;
    chart
        .configure_mesh()
        .x_desc("model + AdamW state (MB)")
        .y_desc("stall per save (ms)")
        .x_label_formatter(&|x| num(*x))
        .y_label_formatter(&|y| num(*y))
        .label_style(("sans-serif", 15))
        .draw()?;
    for (k, (name, f)) in series.iter().enumerate() {
        let c = COLORS[k];
        let pts: Vec<(f64, f64)> = rows
            .iter()
            .map(|r| (mb(r.bytes as f64), median(f(r))))
            .collect();
        chart
            .draw_series(LineSeries::new(pts.clone(), c.stroke_width(3)))?
            .label(*name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], c.stroke_width(3)));
        chart.draw_series(pts.iter().map(|&p| Circle::new(p, 5, c.filled())))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font(("sans-serif", 16))
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

/// Vertical bars with labels under them and optional dashed reference lines.
pub(crate) fn bars(
    path: &Path,
    title: &str,
    y_desc: &str,
    bars: &[(String, f64, usize)],
    refs: &[(String, f64)],
) -> PlotResult {
    let root = BitMapBackend::new(path, W).into_drawing_area();
    root.fill(&WHITE)?;
    let n = bars.len().max(1) as f64;
    let vals = bars
        .iter()
        .map(|b| b.1)
        .chain(refs.iter().map(|r| r.1))
        .filter(|v| v.is_finite());
    let (lo, hi) = vals.fold((0f64, 0f64), |(a, b), v| (a.min(v), b.max(v)));
    let pad = (hi - lo).max(1e-9) * 0.12;
    let labels: Vec<String> = bars.iter().map(|b| b.0.clone()).collect();
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 24))
        .margin(16)
        .x_label_area_size(90)
        .y_label_area_size(72)
        .build_cartesian_2d(
            -0.5f64..n - 0.5,
            if lo < 0.0 { lo - pad } else { 0.0 }..hi + pad,
        )?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(bars.len().max(1) * 2 + 1)
        .x_label_formatter(&|x| {
            let k = x.round();
            if (x - k).abs() < 1e-6 && k >= 0.0 && (k as usize) < labels.len() {
                labels[k as usize].clone()
            } else {
                String::new()
            }
        })
        .x_label_style(("sans-serif", 13))
        .y_desc(y_desc)
        .y_label_formatter(&|y| num(*y))
        .label_style(("sans-serif", 15))
        .draw()?;
    chart.draw_series(bars.iter().enumerate().map(|(k, (_, v, c))| {
        let x = k as f64;
        Rectangle::new([(x - 0.35, 0.0), (x + 0.35, *v)], COLORS[*c].filled())
    }))?;
    chart.draw_series(bars.iter().enumerate().map(|(k, (_, v, _))| {
        Text::new(
            num(*v),
            (k as f64 - 0.2, *v + pad * 0.25),
            ("sans-serif", 14).into_font(),
        )
    }))?;
    for (k, (name, v)) in refs.iter().enumerate() {
        let c = REF_COLORS[k % REF_COLORS.len()];
        chart
            .draw_series(DashedLineSeries::new(
                vec![(-0.5, *v), (n - 0.5, *v)],
                10,
                6,
                c.stroke_width(2),
            ))?
            .label(name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], c.stroke_width(2)));
    }
    if !refs.is_empty() {
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .label_font(("sans-serif", 15))
            .background_style(WHITE.mix(0.9))
            .border_style(BLACK)
            .draw()?;
    }
    root.present()?;
    Ok(())
}
