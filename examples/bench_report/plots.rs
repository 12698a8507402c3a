//! The PNG plots of the report (feature `plots`): stall against state size, throughput against
//! the floors, end-to-end overhead and peak memory. Without the feature, or without the font,
//! the tables are written anyway and the plots skipped with a warning.

use std::path::Path;

#[cfg(feature = "plots")]
use ckpt_demo::SaveMode;

#[cfg(feature = "plots")]
use crate::{
    charts,
    overhead::{RunRow, overhead},
    stats::{mb, median},
};
use crate::{progress::Progress, report::Inputs};

/// A bar: its label, its value and its color index.
#[cfg(feature = "plots")]
type Bar = (String, f64, usize);

/// Draws the PNGs into `out`; returns (file name, title) of each one written.
#[cfg(feature = "plots")]
pub(crate) fn draw_plots(i: &Inputs, out: &Path, p: &Progress) -> Vec<(String, String)> {
    if !charts::load_font(&i.args.font) {
        p.line(format!(
            "warning: cannot load the font {}; tables written, plots skipped",
            i.args.font.display()
        ));
        return vec![];
    }
    let mut done = Vec::new();
    let mut put = |file: &str, title: &str, r: charts::PlotResult| match r {
        Ok(()) => done.push((file.to_string(), title.to_string())),
        Err(e) => p.line(format!("warning: plot {file} failed: {e}")),
    };
    put(
        "stall.png",
        "Stall per save against state size",
        charts::stall(&out.join("stall.png"), i.stall),
    );
    put(
        "floors.png",
        "Throughput as a fraction of the floor",
        charts::bars(
            &out.join("floors.png"),
            "Throughput / physical floor (persist: write+fsync, restore: read)",
            "fraction of floor",
            &floor_bars(i),
            &[("target 0.8".into(), 0.8)],
        ),
    );
    put(
        "overhead.png",
        "End-to-end overhead",
        charts::bars(
            &out.join("overhead.png"),
            "End-to-end training overhead (%)",
            "overhead vs neighbouring baselines (%)",
            &overhead_bars(i),
            &[("budget 2 %".into(), 2.0), ("budget 5 %".into(), 5.0)],
        ),
    );
    put(
        "memory.png",
        "Peak extra memory per save",
        charts::bars(
            &out.join("memory.png"),
            "Peak extra resident memory around a save (MB)",
            "MB over a plain training step",
            &memory_bars(i),
            &[(
                format!("budget {:.0} MB", mb(i.staging_budget as f64)),
                mb(i.staging_budget as f64),
            )],
        ),
    );
    done
}

/// Fraction of the physical floors (persist, restore), higher is better.
#[cfg(feature = "plots")]
fn floor_bars(i: &Inputs) -> Vec<Bar> {
    let mut bars = vec![(
        format!("persist {:.0} MB", mb(i.persist.bytes as f64)),
        median(&i.persist.floor_ms) / median(&i.persist.engine_ms),
        0usize,
    )];
    for r in i.stall {
        bars.push((
            format!("restore {}", r.size.label),
            median(&r.read_ms) / median(&r.restore_ms),
            1,
        ));
    }
    bars
}

/// End-to-end overhead of each configuration, in percent.
#[cfg(feature = "plots")]
fn overhead_bars(i: &Inputs) -> Vec<Bar> {
    let base: Vec<f64> = i
        .e2e
        .iter()
        .filter(|r| r.mode.is_none())
        .map(RunRow::train_ms)
        .collect();
    let mean = base.iter().sum::<f64>() / base.len().max(1) as f64;
    i.e2e
        .iter()
        .filter(|r| r.mode.is_some())
        .map(|r| {
            let c = match (r.mode, r.budget) {
                (None, _) => 5,
                (Some(SaveMode::Async), Some(_)) => 2,
                (Some(SaveMode::Async), None) => 0,
                (Some(SaveMode::Sync), _) => 1,
                (Some(SaveMode::Burn), _) => 3,
            };
            let name = r
                .name
                .replace(" (no checkpoints)", "")
                .replace(", fixed interval", " fixed")
                .replace(", budget", "")
                .replace("Burn built-in", "Burn");
            (name, overhead(r, mean) * 100.0, c)
        })
        .collect()
}

/// Peak extra memory of each route and size, in MB.
#[cfg(feature = "plots")]
fn memory_bars(i: &Inputs) -> Vec<Bar> {
    let mut bars = Vec::new();
    for r in i.stall {
        let m = &r.mem;
        bars.push((
            format!("{} async", r.size.label),
            mb(m.extra(m.async_peak) as f64),
            0,
        ));
        bars.push((
            format!("{} budgeted", r.size.label),
            mb(m.extra(m.budget_peak) as f64),
            2,
        ));
        bars.push((
            format!("{} sync", r.size.label),
            mb(m.extra(m.sync_peak) as f64),
            1,
        ));
        bars.push((
            format!("{} Burn", r.size.label),
            mb(m.extra(m.burn_peak) as f64),
            3,
        ));
    }
    bars
}

/// Without the `plots` feature: warns and draws nothing.
#[cfg(not(feature = "plots"))]
pub(crate) fn draw_plots(_: &Inputs, _: &Path, p: &Progress) -> Vec<(String, String)> {
    p.line(
        "warning: built without the `plots` feature; tables written, plots skipped \
         (cargo run --release --features plots --example bench_report)",
    );
    vec![]
}
