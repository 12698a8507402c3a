//! The report's learner and custom-loop sections: the routes users adopt. `learner_bench` (a
//! plain Burn program) with the README's lines, against the same program with Burn's own
//! checkpointer saving at the same steps and without checkpoints, interleaved, each run a
//! separate process (peak memory sampled while it runs, CPU time from `wait4`): through `SupervisedTraining` ([`Route::Learner`])
//! or through a training loop of the program's own ([`Route::CustomLoop`]).

use std::fs::File;
use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

/// One size of the learner section.
pub(crate) struct LearnerShape {
    pub(crate) label: &'static str,
    hidden: u32,
    layers: u32,
    epochs: u32,
    steps_per_epoch: u32,
}

/// `layers * hidden^2` parameters (plus biases), times 12 bytes (weights and AdamW's moments).
pub(crate) const LEARNER_SHAPES: [LearnerShape; 3] = [
    LearnerShape {
        label: "100mb",
        hidden: 1024,
        layers: 8,
        epochs: 4,
        steps_per_epoch: 8,
    },
    LearnerShape {
        label: "1gb",
        hidden: 4096,
        layers: 5,
        epochs: 3,
        steps_per_epoch: 4,
    },
    LearnerShape {
        label: "4gb",
        hidden: 4096,
        layers: 20,
        epochs: 3,
        steps_per_epoch: 4,
    },
];

/// Which of `learner_bench`'s routes a section measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Route {
    /// `SupervisedTraining` with the README's learner lines (`--mode ours`), Burn's
    /// `with_default_checkpointers()` (`burn`), none (`off`).
    Learner,
    /// A loop of the program's own with the README's custom-loop lines (`--mode custom`), Burn's
    /// checkpointers (`custom-burn`), none (`custom-off`).
    CustomLoop,
    /// [`Route::Learner`] with the opt-in huge-pages allocator (`ckpt_alloc::HugePages`) in
    /// every program, ours, Burn's and the baselines alike (`--huge-pages`): not a default
    /// setting, a finding beside the default rows.
    LearnerHugePages,
}

impl Route {
    /// `learner_bench`'s `--mode` for one of `off`, `ours`, `burn`.
    fn mode(self, which: &str) -> String {
        match (self, which) {
            (Route::Learner | Route::LearnerHugePages, w) => w.to_string(),
            (Route::CustomLoop, "ours") => "custom".to_string(),
            (Route::CustomLoop, w) => format!("custom-{w}"),
        }
    }

    /// A word for file names and progress messages.
    fn label(self) -> &'static str {
        match self {
            Route::Learner => "learner",
            Route::CustomLoop => "custom",
            Route::LearnerHugePages => "learner-huge",
        }
    }

    /// Flags every `learner_bench` run of the route gets besides its mode and shape.
    fn extra_flags(self) -> &'static [&'static str] {
        match self {
            Route::LearnerHugePages => &["--huge-pages"],
            Route::Learner | Route::CustomLoop => &[],
        }
    }
}

/// The shapes named by `labels` (empty labels skipped).
pub(crate) fn shapes(labels: &[String]) -> Result<Vec<&'static LearnerShape>> {
    labels
        .iter()
        .filter(|l| !l.is_empty())
        .map(|l| {
            LEARNER_SHAPES
                .iter()
                .find(|s| s.label == l)
                .with_context(|| format!("unknown learner size {l:?}: one of 100mb, 1gb, 4gb"))
        })
        .collect()
}

/// One `learner_bench` process.
pub(crate) struct LearnerRun {
    /// `off`, `ours` or `burn` (the route's own `--mode` is in the report).
    mode: String,
    wall_s: f64,
    /// Peak resident set + tmpfs growth (the scratch files in `/dev/shm`), sampled
    /// ([`process::Exit::peak_mem`]); what the extra-memory columns use.
    peak_mem: u64,
    /// Peak resident set, the kernel's (`wait4`).
    peak_rss: u64,
    /// CPU seconds of the whole process (user + kernel, all threads), from `wait4`.
    cpu_s: f64,
    report: Value,
}

impl LearnerRun {
    fn starts(&self) -> Vec<f64> {
        self.report["step_starts_s"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_f64).collect())
            .unwrap_or_default()
    }

    /// The gap between the start of step `s` (1-based) and the next step's start, where the
    /// run's step `s` has a following step.
    fn gap_after(&self, s: usize) -> Option<f64> {
        let t = self.starts();
        Some(t.get(s)? - t.get(s - 1)?)
    }

    fn saved(&self) -> Vec<usize> {
        self.report["saved_steps"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_u64().map(|v| v as usize))
                    .collect()
            })
            .unwrap_or_default()
    }

    fn state_bytes(&self) -> f64 {
        self.report["state_bytes"].as_f64().unwrap_or(f64::NAN)
    }
}

fn run(
    bin: &Path,
    dir: &Path,
    route: Route,
    shape: &LearnerShape,
    mode: &str,
    pass: usize,
) -> Result<LearnerRun> {
    let name = format!("{}-{}-{mode}-{pass}", route.label(), shape.label);
    let root = dir.join(&name);
    let report_path = dir.join(format!("{name}.json"));
    let log_path = dir.join(format!("{name}.log"));
    let log =
        File::create(&log_path).with_context(|| format!("creating {}", log_path.display()))?;
    let child = Command::new(bin)
        .args(["--mode", &route.mode(mode)])
        .args(["--hidden", &shape.hidden.to_string()])
        .args(["--layers", &shape.layers.to_string()])
        .args(["--epochs", &shape.epochs.to_string()])
        .args(["--steps-per-epoch", &shape.steps_per_epoch.to_string()])
        .args(route.extra_flags())
        .arg("--dir")
        .arg(&root)
        .arg("--report")
        .arg(&report_path)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    let exit = super::wait_sampled(child.id())?;
    let status = exit.code;
    let _ = std::fs::remove_dir_all(&root);
    if status != 0 {
        bail!(
            "{} {} {mode} exited with status {status} (log {})",
            route.label(),
            shape.label,
            log_path.display()
        );
    }
    let report: Value = serde_json::from_slice(&std::fs::read(&report_path)?)
        .with_context(|| format!("parsing {}", report_path.display()))?;
    Ok(LearnerRun {
        mode: mode.to_string(),
        wall_s: report["wall_s"].as_f64().unwrap_or(f64::NAN),
        peak_mem: exit.peak_mem,
        peak_rss: exit.peak_rss,
        cpu_s: exit.cpu_s,
        report,
    })
}

/// The order of one pass: the run without checkpoints first, then ours and Burn's, which swap
/// places from one pass to the next. A run's place in the pass moves its times (on this VM the
/// run right after a run without checkpoints was slower: session 36), so neither side always
/// takes the same place.
pub(crate) fn pass_order(pass: usize) -> [&'static str; 3] {
    if pass.is_multiple_of(2) {
        ["off", "ours", "burn"]
    } else {
        ["off", "burn", "ours"]
    }
}

/// Runs one size of a route: `passes` rounds of (off, then ours and Burn's in
/// [`pass_order`]), then off once more.
pub(crate) fn measure(
    bin: &Path,
    dir: &Path,
    route: Route,
    shape: &LearnerShape,
    passes: usize,
    mut tick: impl FnMut(&str),
) -> Result<Vec<LearnerRun>> {
    let mut runs = Vec::new();
    let r = route.label();
    for pass in 0..passes {
        for mode in pass_order(pass) {
            tick(&format!("{r} {} {mode} {pass}", shape.label));
            runs.push(run(bin, dir, route, shape, mode, pass)?);
        }
    }
    tick(&format!("{r} {} off {passes}", shape.label));
    runs.push(run(bin, dir, route, shape, "off", passes)?);
    Ok(runs)
}

/// Runs per size of [`measure`].
pub(crate) fn runs_per_size(passes: usize) -> u64 {
    3 * passes as u64 + 1
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// What one mode measured at one size, over its passes.
struct Figures {
    /// Median over saves (and passes) of the step gap spanning the save minus the baselines'
    /// median gap at that step, in seconds.
    stall: f64,
    /// The same for the gap of the step after the save (where the learner route's update waits
    /// for the save's records), in seconds.
    after: f64,
    /// Per pass: (wall - mean baseline wall) / saves, in seconds.
    lost: Vec<f64>,
    /// Per pass: peak memory (RSS + tmpfs growth) minus the mean of the baselines', in bytes.
    extra_mem: Vec<f64>,
    /// Per pass: (CPU seconds - mean baseline CPU seconds) / saves.
    cpu: Vec<f64>,
}

fn figures(runs: &[LearnerRun], mode: &str) -> Figures {
    let base: Vec<&LearnerRun> = runs.iter().filter(|r| r.mode == "off").collect();
    let base_wall = base.iter().map(|r| r.wall_s).sum::<f64>() / base.len().max(1) as f64;
    let base_mem = base.iter().map(|r| r.peak_mem as f64).sum::<f64>() / base.len().max(1) as f64;
    let base_cpu = base.iter().map(|r| r.cpu_s).sum::<f64>() / base.len().max(1) as f64;
    let mut cpu = Vec::new();
    let mut stalls = Vec::new();
    let mut afters = Vec::new();
    let mut lost = Vec::new();
    let mut extra_mem = Vec::new();
    // The gap of step `s` minus the baselines' median gap there, where both have it.
    let excess = |r: &LearnerRun, s: usize| {
        let gap = r.gap_after(s)?;
        let mut base_gaps: Vec<f64> = base.iter().filter_map(|b| b.gap_after(s)).collect();
        (!base_gaps.is_empty()).then(|| gap - median(&mut base_gaps))
    };
    for r in runs.iter().filter(|r| r.mode == mode) {
        let saved = r.saved();
        for &s in &saved {
            if let Some(x) = excess(r, s) {
                stalls.push(x);
                afters.extend(excess(r, s + 1));
            }
        }
        lost.push((r.wall_s - base_wall) / saved.len().max(1) as f64);
        extra_mem.push(r.peak_mem as f64 - base_mem);
        cpu.push((r.cpu_s - base_cpu) / saved.len().max(1) as f64);
    }
    Figures {
        stall: median(&mut stalls),
        after: median(&mut afters),
        lost,
        extra_mem,
        cpu,
    }
}

fn range(v: &[f64], f: impl Fn(f64) -> String) -> String {
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if v.len() < 2 || (hi - lo).abs() < 1e-9 {
        f(lo)
    } else {
        format!("{}..{}", f(lo), f(hi))
    }
}

/// The intro of a route's section.
fn intro(route: Route) -> &'static str {
    match route {
        Route::Learner => {
            "## The learner route (`SupervisedTraining` with the README's lines)\n\n\
         `examples/learner_bench.rs`: a plain Burn program (an MLP of Linear(h, h) layers, AdamW, \
         Burn's shuffled `DataLoaderBuilder`, batches of 8, one validation batch), with the \
         README's learner lines (*ours*: `CkptTrainingStrategy`, every epoch's steps, \
         `.resume_latest().deterministic(42)`, keep 3), against the same program with Burn's \
         `with_default_checkpointers()` (*Burn*), which saves at each epoch's end: the same \
         steps. Default settings. Interleaved with runs without checkpoints (*off*): each pass runs *off* first, then ours and Burn's, which swap places from one pass to the next. "
        }
        Route::CustomLoop => {
            "## The custom-loop route (a loop of one's own with the README's lines)\n\n\
         `learner_bench --mode custom`: the same program, model, data and steps as the learner \
         route, trained by a loop of its own (forward, backward, `GradientsParams`, \
         `optim.step`), with the README's custom-loop lines (*ours*: `CheckpointManager::open` \
         with `every_steps(steps per epoch).end_step(steps)`, `resume`, `step` after each update, \
         `finish`; keep 3 by default), against the same loop with Burn's checkpointers \
         (*Burn*: `AsyncCheckpointer` over `FileCheckpointer` for the model, optimizer and \
         scheduler records built on the training thread, keeping 2 like Burn's learner), saving \
         at the same steps. No validation, no huge-pages allocator (the example trainer's). \
         Default settings. Interleaved with runs without checkpoints (*off*): each pass runs *off* first, then ours and Burn's, which swap places from one pass to the next. "
        }
        Route::LearnerHugePages => {
            "## The learner route with huge pages (not a default: a finding)\n\n\
         The learner route's programs (ours, Burn's and the runs without checkpoints alike) with \
         the one line that installs the opt-in allocator `ckpt_alloc::HugePages` \
         (`learner_bench --huge-pages`): large blocks are backed by transparent huge pages, so \
         Burn's fresh buffers fault in 2 MiB at a time instead of 4 KiB. A plain Burn program \
         does not have it, so these rows are not the default settings and meet no target; they \
         show what the line changes on a machine where page faults are dear (this VM). Every \
         other setting is the default. Interleaved with runs without checkpoints (*off*): each pass runs *off* first, then ours and Burn's, which swap places from one pass to the next. "
        }
    }
}

/// A route's section in Markdown for the sizes measured.
pub(crate) fn markdown(route: Route, sizes: &[(&LearnerShape, Vec<LearnerRun>)]) -> String {
    let mut o = String::from(intro(route));
    o.push_str(
        "*Stall per \
         save*: the gap between the start of the saved step and the next one, minus the median \
         gap of the runs without checkpoints at that step, median over \
         saves that training followed. *The step after*: the same for the step that follows the \
         save; on the learner route its update waits until Burn's records of the saved step \
         are taken (`UpdateWait::Auto`, so that it does not copy the state on write), so that \
         part of a save's cost shows there and not in the stall. *Lost per save*: wall time (the last save durable) minus \
         the mean of the runs without checkpoints, over the saves. *Extra peak memory*: peak memory (the run's resident set plus what tmpfs gained while it ran, sampled every 5 ms, at least the kernel's peak RSS from `wait4`; a save's scratch files go to `/dev/shm`, memory no process's RSS shows) \
         minus the mean of the runs without checkpoints, against the state (weights + AdamW's \
         moments). *Extra CPU per save*: the process's CPU time (user + kernel, all threads, \
         from `wait4`) minus the mean of the runs without checkpoints, over the saves: the work \
         a save costs, whichever thread does it.\n\n\
         | size | state | stall per save, ours / Burn | ratio | the step after, ours / Burn | lost per save, ours / Burn | ratio (median) | extra peak memory, ours / Burn (x state) | extra CPU per save, ours / Burn |\n\
         |---|---|---|---|---|---|---|---|---|\n",
    );
    for (shape, runs) in sizes {
        let state = runs.first().map_or(f64::NAN, LearnerRun::state_bytes);
        let ours = figures(runs, "ours");
        let burn = figures(runs, "burn");
        let (mut lo, mut lb) = (ours.lost.clone(), burn.lost.clone());
        let ratio_lost = median(&mut lo) / median(&mut lb);
        let x = |b: f64| format!("{:.2}", b / state);
        let stall_ratio = if ours.stall > 0.0 {
            format!("1/{:.0}", burn.stall / ours.stall)
        } else {
            "ours in the noise (<= 0)".to_string()
        };
        o.push_str(&format!(
            "| {} | {:.0} MB | {:.1} ms / {:.1} ms | {stall_ratio} | {:+.1} ms / {:+.1} ms | {} s / {} s | {:.2} | {} / {} | {} s / {} s |\n",
            shape.label,
            state / 1e6,
            ours.stall * 1e3,
            burn.stall * 1e3,
            ours.after * 1e3,
            burn.after * 1e3,
            range(&ours.lost, |v| format!("{v:.2}")),
            range(&burn.lost, |v| format!("{v:.2}")),
            ratio_lost,
            range(&ours.extra_mem, x),
            range(&burn.extra_mem, x),
            range(&ours.cpu, |v| format!("{v:.2}")),
            range(&burn.cpu, |v| format!("{v:.2}")),
        ));
    }
    o.push('\n');
    o
}

/// For each size measured both ways, the training time of the runs without checkpoints with
/// the huge-pages allocator (`huge`) against without it (`plain`): what the line changes
/// before any checkpoint.
pub(crate) fn huge_pages_baselines(
    plain: &[(&LearnerShape, Vec<LearnerRun>)],
    huge: &[(&LearnerShape, Vec<LearnerRun>)],
) -> String {
    let off_walls = |runs: &[LearnerRun]| -> Vec<f64> {
        runs.iter()
            .filter(|r| r.mode == "off")
            .map(|r| r.wall_s)
            .collect()
    };
    let mut o = String::new();
    for (shape, h) in huge {
        let Some((_, p)) = plain.iter().find(|(s, _)| s.label == shape.label) else {
            continue;
        };
        let (mut hw, mut pw) = (off_walls(h), off_walls(p));
        let (hm, pm) = (median(&mut hw), median(&mut pw));
        o.push_str(&format!(
            "At {}, the runs without checkpoints took {:.2} s (median) with the allocator against {:.2} s without it in the learner section above: {:.2}x as fast before any checkpoint.\n\n",
            shape.label,
            hm,
            pm,
            pm / hm,
        ));
    }
    o
}

/// A route's runs as JSON.
pub(crate) fn to_json(sizes: &[(&LearnerShape, Vec<LearnerRun>)]) -> Value {
    Value::Array(
        sizes
            .iter()
            .map(|(shape, runs)| {
                json!({
                    "size": shape.label,
                    "runs": runs.iter().map(|r| json!({
                        "mode": r.mode, "wall_s": r.wall_s, "peak_mem": r.peak_mem, "peak_rss": r.peak_rss, "cpu_s": r.cpu_s, "report": r.report,
                    })).collect::<Vec<_>>(),
                })
            })
            .collect(),
    )
}
