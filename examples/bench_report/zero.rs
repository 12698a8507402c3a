//! Section 6 of the report, ZeRO-1 on 4 rank threads: consolidated checkpoints (gathered to one
//! writer) against per-rank shards, the formats alternating.

use std::{fmt::Write as _, path::Path};

use anyhow::{Context, Result};
use burn_ckpt::ckpt_zero::ShardFormat;
use ckpt_demo::perf::StateSize;
use ckpt_demo::zero::{ZeroConfig, run_threads};
use ckpt_demo::{DemoConfig, Frequency};

use crate::{
    cli::E2eShape,
    progress::Progress,
    report::Inputs,
    stats::{mb, med_range, median, num},
};

#[derive(Debug, Clone)]
/// Section 6 samples of one shard format.
pub(crate) struct ZeroRow {
    pub format: ShardFormat,
    pub persist_ms: Vec<f64>,
    pub stall_ms: Vec<f64>,
    pub bytes: u64,
}

impl ZeroRow {
    /// A row without samples.
    fn new(format: ShardFormat) -> Self {
        Self {
            format,
            persist_ms: vec![],
            stall_ms: vec![],
            bytes: 0,
        }
    }
}

/// Runs the ZeRO loop `rounds` times per shard format, alternating, under `tmp`.
pub(crate) fn measure(
    shape: &E2eShape,
    rounds: usize,
    tmp: &Path,
    p: &Progress,
) -> Result<Vec<ZeroRow>> {
    let mut rows = vec![
        ZeroRow::new(ShardFormat::Consolidated),
        ZeroRow::new(ShardFormat::PerRank),
    ];
    for r in 0..rounds {
        for row in rows.iter_mut() {
            let dir = tmp.join(format!("zero-{}-{r}", row.format));
            let mut demo = DemoConfig::new(&dir);
            demo.hidden = shape.hidden;
            demo.layers = shape.layers;
            demo.steps = shape.steps;
            demo.frequency = Frequency::EverySteps(shape.every);
            demo.keep_last = Some(2);
            let mut cfg = ZeroConfig::new(demo, 4);
            cfg.shard_format = row.format;
            let steps = shape.steps;
            let fmt = row.format;
            let report = run_threads(&cfg, &mut |s| {
                p.status(format!("zero {fmt}: step {}/{steps}", s.step));
            })
            .with_context(|| format!("ZeRO run ({})", row.format))?;
            let _ = std::fs::remove_dir_all(&dir);
            for s in &report.saves {
                row.persist_ms.extend(s.persist_ms);
                row.stall_ms.push(s.stall_ms);
                row.bytes = s.bytes;
            }
            p.done_unit();
        }
    }
    p.line(format!(
        "zero: persist per save consolidated {} ms, per-rank {} ms (medians)",
        num(median(&rows[0].persist_ms)),
        num(median(&rows[1].persist_ms))
    ));
    Ok(rows)
}

/// Writes section 6.
pub(crate) fn write_section(w: &mut String, i: &Inputs) {
    let zs = i.zero_shape;
    let _ = writeln!(w, "## 6. ZeRO-1: consolidated vs per-rank shards\n");
    let (c, pr) = (&i.zero[0], &i.zero[1]);
    let _ = writeln!(
        w,
        "`ckpt_demo::zero::run_threads`, 4 rank threads, MLP {} x {} ({:.0} MB of model + AdamW), \
         {} steps, a save every {} steps, {} runs per format alternating. Persist: rank 0's \
         `saves[].persist_ms` (encode the shard, move or write it, publish, all ranks agree).\n",
        zs.layers,
        zs.hidden,
        mb(StateSize {
            label: "",
            hidden: zs.hidden,
            layers: zs.layers
        }
        .state_bytes() as f64),
        zs.steps,
        zs.every,
        c.persist_ms.len() / (zs.steps / zs.every).max(1) as usize,
    );
    let _ = writeln!(
        w,
        "| consolidated / per-rank persist | consolidated ms | per-rank ms | consolidated stall ms | per-rank stall ms | checkpoint MB (consolidated) |\n|---|---|---|---|---|---|\n| **{:.2}x** | {} | {} | {} | {} | {:.1} |\n",
        median(&c.persist_ms) / median(&pr.persist_ms),
        med_range(&c.persist_ms),
        med_range(&pr.persist_ms),
        med_range(&c.stall_ms),
        med_range(&pr.stall_ms),
        mb(c.bytes as f64),
    );
    let _ = writeln!(
        w,
        "Consolidated gathers every shard to rank 0, which merges them into one `optim.bpk` (the \
         bytes a single rank would write) and writes everything; per-rank lets each rank write \
         and fsync its own shard in parallel and rank 0 only publishes. The 4 ranks share 2 \
         cores and one disk here, so the parallel writes gain less than on separate machines.\n"
    );
}
