//! The performance report: runs every issue-5 comparison on this machine, side by side in one
//! run, and writes `LIBRARY.md` (ratios first, then medians), `library.json` (every sample) and,
//! with the `plots` feature, PNG plots into `--out` (default `docs/perf`).
//!
//! ```text
//! cargo run --release --features plots --example bench_report               # ~10-15 min
//! cargo run --release --features plots --example bench_report -- --quick    # smoke test
//! cargo run --release --example bench_report -- --sizes 10mb,100mb,1gb,4gb  # tables only
//! ```
//!
//! What is measured (Flex backend; the kernels are `ckpt_demo::perf`, shared with the criterion
//! benches in `benches/`):
//!
//! 1. training-thread stall per save for each `--sizes` state (model + AdamW): our async path,
//!    our blocking path, Burn's built-in checkpointer route, handle cloning alone and the
//!    memcpy floor, with one training step between saves and the median of several saves;
//! 2. engine persist throughput beside a `write` + `fsync` floor of the same bytes;
//! 3. end-to-end overhead of the example trainer at a fixed interval and at overhead budgets
//!    of 2 % and 5 %, each against the same steps without checkpoints run just before and
//!    after it (their difference: the noise);
//! 4. time to durable (submit to published) and restore time beside a read floor;
//! 5. peak extra resident memory around a save against a 1 GiB budget;
//! 6. ZeRO-1 on 4 rank threads: consolidated (gather to one writer) vs per-rank shards.
//!
//! The plots use `plotters` (optional dependency behind the `plots` feature, so that ordinary
//! builds do not change the feature set Burn is compiled with) and the DejaVu Sans font loaded
//! at run time (`--font`); without the feature or the font the tables are written anyway and
//! the plots are skipped with a warning.
//!
//! One module per part of the run: [`cli`] (flags and the plan derived from them), the
//! measurements with the report section each writes ([`stall`] section 1, [`persist`] 2,
//! [`overhead`] 3, [`restore`] 4, [`memory`] 5, [`zero`] 6), [`targets`] (the targets table),
//! [`report`] (the Markdown around the sections), [`json`] (`library.json`) and [`plots`].

#[cfg(feature = "plots")]
mod charts;
mod cli;
mod json;
mod machine;
mod memory;
mod overhead;
mod persist;
mod plots;
mod progress;
mod report;
mod restore;
mod stall;
mod stats;
mod targets;
mod zero;

use std::{
    path::{Path, PathBuf},
    time::Instant,
};

use anyhow::{Context, Result};
use clap::Parser;

use crate::{
    cli::{Args, Plan},
    progress::Progress,
    report::Inputs,
};

fn main() -> Result<()> {
    let args = Args::parse();
    let t0 = Instant::now();
    let started = machine::utc_now();
    let load_before = machine::loadavg();
    let cmdline = cli::cmdline();
    let plan = Plan::from_args(&args)?;

    let base = args
        .dir
        .clone()
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/bench-report"));
    std::fs::create_dir_all(&base).with_context(|| format!("creating {}", base.display()))?;
    let tmp = tempfile::tempdir_in(&base)
        .with_context(|| format!("creating a directory in {}", base.display()))?;
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;

    let p = Progress::new(plan.units());
    p.line(format!(
        "bench_report: sizes {}, {} saves per mode, checkpoints under {}; load {load_before}",
        plan.sizes
            .iter()
            .map(|s| s.label)
            .collect::<Vec<_>>()
            .join(","),
        plan.reps,
        tmp.path().display()
    ));

    let mut stall = Vec::new();
    for s in &plan.sizes {
        stall.push(stall::measure(
            *s,
            plan.reps,
            plan.restore_reps,
            tmp.path(),
            &p,
        )?);
    }
    let persist = persist::measure(plan.persist_bytes, plan.persist_reps, tmp.path(), &p)?;
    let e2e = overhead::measure(&plan.e2e_shape, tmp.path(), &p)?;
    let zero = zero::measure(&plan.zero_shape, plan.zero_rounds, tmp.path(), &p)?;
    p.finish();

    let mut inputs = Inputs {
        args: &args,
        cmdline,
        started,
        load_before,
        load_after: machine::loadavg(),
        elapsed: t0.elapsed(),
        stall: &stall,
        persist: &persist,
        e2e: &e2e,
        e2e_shape: &plan.e2e_shape,
        zero: &zero,
        zero_shape: &plan.zero_shape,
        staging_budget: plan.staging_budget,
        plots: &[],
    };
    let plots = plots::draw_plots(&inputs, &args.out, &p);
    inputs.plots = &plots;
    write_outputs(&inputs, &args.out, &p, t0)
}

/// Writes `LIBRARY.md` and `library.json` into `out`.
fn write_outputs(inputs: &Inputs, out: &Path, p: &Progress, t0: Instant) -> Result<()> {
    let md = report::write_report(inputs);
    let report = out.join("LIBRARY.md");
    std::fs::write(&report, md).with_context(|| format!("writing {}", report.display()))?;
    let json = out.join("library.json");
    std::fs::write(
        &json,
        serde_json::to_string_pretty(&json::write_json(inputs))?,
    )
    .with_context(|| format!("writing {}", json.display()))?;
    p.line(format!(
        "wrote {} ({} plots) in {:.1} min",
        report.display(),
        inputs.plots.len(),
        t0.elapsed().as_secs_f64() / 60.0
    ));
    Ok(())
}
