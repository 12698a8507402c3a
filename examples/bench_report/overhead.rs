//! Section 3 of the report, end-to-end overhead of the example trainer: runs at a fixed interval
//! and at overhead budgets of 2 % and 5 %, each between two runs without checkpoints, and the
//! overhead and noise derived from them.

use std::{fmt::Write as _, path::Path};

use anyhow::{Context, Result};
use ckpt_demo::perf::StateSize;
use ckpt_demo::{DemoConfig, DemoReport, Frequency, SaveMode};

use crate::{
    cli::E2eShape,
    progress::Progress,
    report::Inputs,
    stats::{mb, median, min_max, num},
};

#[derive(Debug, Clone)]
/// Section 3 samples: one run of the example trainer.
pub(crate) struct RunRow {
    pub name: String,
    pub mode: Option<SaveMode>,
    pub budget: Option<f64>,
    pub fixed: Option<u64>,
    pub report: DemoReport,
    /// Mean training-loop time of the baselines run just before and after this one, and
    /// their difference as a fraction of it (the local noise).
    pub paired: Option<(f64, f64)>,
}

impl RunRow {
    /// Training-loop time: every step (including any slowdown from a concurrent persist) plus
    /// every stall on the training thread. Set-up and the final drain are excluded.
    pub(crate) fn train_ms(&self) -> f64 {
        self.report.step_ms.iter().sum::<f64>()
            + self.report.saves.iter().map(|s| s.stall_ms).sum::<f64>()
    }
}

/// The runs of section 3 in order (`every`: the fixed interval).
fn plan(every: u64) -> [(&'static str, Frequency, SaveMode); 11] {
    // Every configuration runs between two baselines (a paired comparison): the machine's
    // speed drifts over minutes, and the neighbours see the same drift.
    let off = Frequency::EverySteps(0);
    let fixed = Frequency::EverySteps(every);
    let (b2, b5) = (
        Frequency::OverheadBudget(0.02),
        Frequency::OverheadBudget(0.05),
    );
    [
        ("baseline 1 (no checkpoints)", off, SaveMode::Async),
        ("async, fixed interval", fixed, SaveMode::Async),
        ("baseline 2 (no checkpoints)", off, SaveMode::Async),
        ("async, budget 2 %", b2, SaveMode::Async),
        ("baseline 3 (no checkpoints)", off, SaveMode::Async),
        ("async, budget 5 %", b5, SaveMode::Async),
        ("baseline 4 (no checkpoints)", off, SaveMode::Async),
        ("sync, fixed interval", fixed, SaveMode::Sync),
        ("baseline 5 (no checkpoints)", off, SaveMode::Async),
        ("Burn built-in, fixed interval", fixed, SaveMode::Burn),
        ("baseline 6 (no checkpoints)", off, SaveMode::Async),
    ]
}

/// Runs the example trainer in every configuration of [`plan`], under `tmp`.
pub(crate) fn measure(shape: &E2eShape, tmp: &Path, p: &Progress) -> Result<Vec<RunRow>> {
    let mut rows = Vec::new();
    for (i, (name, freq, mode)) in plan(shape.every).into_iter().enumerate() {
        rows.push(run_one(i, name, freq, mode, shape, tmp, p)?);
        p.done_unit();
    }
    pair_with_baselines(&mut rows);
    Ok(rows)
}

/// Runs configuration `i` of the plan.
fn run_one(
    i: usize,
    name: &str,
    freq: Frequency,
    mode: SaveMode,
    shape: &E2eShape,
    tmp: &Path,
    p: &Progress,
) -> Result<RunRow> {
    let dir = tmp.join(format!("e2e-{i}"));
    let mut cfg = DemoConfig::new(&dir);
    cfg.hidden = shape.hidden;
    cfg.layers = shape.layers;
    cfg.steps = shape.steps;
    cfg.frequency = freq;
    cfg.save_mode = mode;
    cfg.keep_last = Some(2);
    let steps = shape.steps;
    let report = ckpt_demo::run(&cfg, &mut |s| {
        if s.step % 10 == 0 || s.step == steps {
            p.status(format!("e2e {name}: step {}/{steps}", s.step));
        }
    })
    .with_context(|| format!("end-to-end run {name:?}"))?;
    let _ = std::fs::remove_dir_all(&dir);
    let row = RunRow {
        name: name.to_string(),
        mode: (!matches!(freq, Frequency::EverySteps(0))).then_some(mode),
        budget: match freq {
            Frequency::OverheadBudget(b) => Some(b),
            _ => None,
        },
        fixed: match freq {
            Frequency::EverySteps(n) if n > 0 => Some(n),
            _ => None,
        },
        report,
        paired: None,
    };
    p.line(format!(
        "e2e {name}: training loop {:.2} s, {} saves, interval {}",
        row.train_ms() / 1e3,
        row.report.saves.len(),
        row.report
            .interval
            .map_or("-".to_string(), |k| k.to_string())
    ));
    Ok(row)
}

/// Pairs every configuration with the baselines run just before and after it.
fn pair_with_baselines(rows: &mut [RunRow]) {
    for k in 0..rows.len() {
        if rows[k].mode.is_none() {
            continue;
        }
        let flank: Vec<f64> = [k.checked_sub(1), Some(k + 1)]
            .into_iter()
            .flatten()
            .filter_map(|j| rows.get(j))
            .filter(|r| r.mode.is_none())
            .map(RunRow::train_ms)
            .collect();
        if !flank.is_empty() {
            let mean = flank.iter().sum::<f64>() / flank.len() as f64;
            let (lo, hi) = min_max(&flank);
            rows[k].paired = Some((mean, (hi - lo) / mean));
        }
    }
}

/// The baselines (runs without checkpoints) of section 3, summarized.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Baselines {
    /// Mean training-loop time of the baselines.
    pub mean: f64,
    /// Spread of the baselines' training-loop times over their mean (NaN for fewer than two).
    pub noise: f64,
    /// Mean of the baselines' [`excess_frac`].
    pub excess_mean: f64,
    /// Spread of the baselines' [`excess_frac`] (NaN for fewer than two).
    pub noise_norm: f64,
}

impl Baselines {
    /// Summarizes the baselines among `e2e`.
    pub(crate) fn of(e2e: &[RunRow]) -> Self {
        let base: Vec<&RunRow> = e2e.iter().filter(|r| r.mode.is_none()).collect();
        let base_ms: Vec<f64> = base.iter().map(|r| r.train_ms()).collect();
        let base_mean = base_ms.iter().sum::<f64>() / base_ms.len().max(1) as f64;
        let noise = if base_ms.len() >= 2 {
            let (lo, hi) = min_max(&base_ms);
            (hi - lo) / base_mean
        } else {
            f64::NAN
        };
        let base_excess: Vec<f64> = base.iter().map(|r| excess_frac(r)).collect();
        let base_excess_mean = base_excess.iter().sum::<f64>() / base_excess.len().max(1) as f64;
        let noise_norm = if base_excess.len() >= 2 {
            let (lo, hi) = min_max(&base_excess);
            hi - lo
        } else {
            f64::NAN
        };
        Self {
            mean: base_mean,
            noise,
            excess_mean: base_excess_mean,
            noise_norm,
        }
    }
}

/// A run's time above its own typical step, as a fraction: training-loop time minus
/// steps x the run's median step time, over steps x median. Checkpoints add to it (stalls, the
/// slower steps while a persist runs); a change in machine load between runs, which moves every
/// step alike, does not. Baselines have some too (warm-up, load spikes): subtract theirs.
pub(crate) fn excess_frac(r: &RunRow) -> f64 {
    let med = median(&r.report.step_ms);
    let n = r.report.step_ms.len() as f64;
    (r.train_ms() - n * med) / (n * med)
}

/// The overhead split into stalls and slower steps (fractions of the baseline).
pub(crate) fn overhead_parts(r: &RunRow, base: f64) -> (f64, f64) {
    let base = r.paired.map_or(base, |p| p.0);
    // `+ 0.0`: an empty float sum is -0.0.
    let stalls: f64 = r.report.saves.iter().map(|s| s.stall_ms).sum::<f64>() + 0.0;
    let steps: f64 = r.report.step_ms.iter().sum();
    (stalls / base, (steps - base) / base)
}

/// Overhead of `r` against the mean baseline, as a fraction.
/// Configurations are compared with their neighbouring baselines, baselines with the mean of
/// all baselines.
pub(crate) fn overhead(r: &RunRow, base: f64) -> f64 {
    r.train_ms() / r.paired.map_or(base, |p| p.0) - 1.0
}

/// The noise of [`overhead`] for `r`: its neighbouring baselines' difference, or else the
/// spread of all baselines.
pub(crate) fn overhead_noise(r: &RunRow, global: f64) -> f64 {
    r.paired.map_or(global, |p| p.1)
}

/// Writes section 3.
pub(crate) fn write_section(w: &mut String, i: &Inputs, b: &Baselines) {
    let Baselines {
        mean: base_mean,
        noise,
        excess_mean: base_excess_mean,
        noise_norm,
    } = *b;
    let sh = i.e2e_shape;
    let _ = writeln!(w, "## 3. End-to-end overhead of the example trainer\n");
    let _ = writeln!(
        w,
        "`ckpt_demo::run`: MLP {} x {} ({:.0} MB of model + AdamW state), batch 32, {} \
         steps, the same steps with and without checkpoints. Every configuration runs between \
         two baselines without checkpoints (paired: the machine's speed drifts over minutes).\n\n\
         - **Overhead** = training-loop time (every step, including any slowdown from a \
         concurrent persist, plus every stall) / the mean of the two neighbouring baselines - \
         1. Its noise is the difference of those two baselines (*local noise*); over all \
         baselines the spread is **{:.2} %** (baseline rows show their distance from the mean \
         of all baselines). The verdicts use this overhead and its local noise.\n\
         - **Load-normalized** = the run's time above its own median step (training loop - \
         steps x median step, over steps x median step) minus the same for the baselines: the \
         cost that falls on a minority of steps (stalls, steps while a persist runs), \
         insensitive to load changes that move every step alike, blind to a slowdown of every \
         step. Noise (spread of the baselines' values): **{:.2} %**.\n\n\
         The wall column also counts set-up and the wait for the last save to be durable at \
         the end.\n",
        sh.layers,
        sh.hidden,
        mb(StateSize {
            label: "",
            hidden: sh.hidden,
            layers: sh.layers
        }
        .state_bytes() as f64),
        sh.steps,
        noise * 100.0,
        noise_norm * 100.0,
    );
    let _ = writeln!(
        w,
        "| run | overhead | local noise | from stalls | from slower steps | load-normalized | budget | interval (steps) | saves | median stall ms | median persist ms | training loop s | wall s |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    for r in i.e2e {
        let stalls: Vec<f64> = r.report.saves.iter().map(|s| s.stall_ms).collect();
        let persists: Vec<f64> = r.report.saves.iter().filter_map(|s| s.persist_ms).collect();
        let (sp, tp) = overhead_parts(r, base_mean);
        let _ = writeln!(
            w,
            "| {} | {} | {} | {:+.2} % | {:+.2} % | {:+.2} % | {} | {} | {} | {} | {} | {:.2} | {:.2} |",
            r.name,
            if r.mode.is_some() {
                format!("**{:+.2} %**", overhead(r, base_mean) * 100.0)
            } else {
                format!("{:+.2} %", overhead(r, base_mean) * 100.0)
            },
            r.paired
                .map_or("-".into(), |p| format!("±{:.2} %", p.1 * 100.0)),
            sp * 100.0,
            tp * 100.0,
            (excess_frac(r) - base_excess_mean) * 100.0,
            r.budget
                .map_or("-".into(), |b| format!("{:.0} %", b * 100.0)),
            r.report.interval.map_or("-".into(), |k| {
                if r.fixed.is_some() {
                    format!("{k} (fixed)")
                } else {
                    format!("{k} (chosen)")
                }
            }),
            r.report.saves.len(),
            if stalls.is_empty() {
                "-".into()
            } else {
                num(median(&stalls))
            },
            if persists.is_empty() {
                "-".into()
            } else {
                num(median(&persists))
            },
            r.train_ms() / 1e3,
            r.report.wall_s,
        );
    }
    let _ = writeln!(
        w,
        "\nThe last step is always checkpointed, so every checkpointing run has at least one \
         save. Budget runs wait for the warm-up's slow first steps to settle, take one save to \
         measure its cost (the stall plus every step's excess over a lower-quartile baseline \
         until 3 steps after the persist), and then save whenever the cost spent so far plus \
         the next save's stays within 90 % of the budget, never while the previous save's \
         window is open.\n"
    );
}
