//! The example trainer with its **default flags** at every state size, beside Burn's own
//! checkpointer (`--save-mode burn`) and runs without checkpoints, all in one run: what
//! checkpoints cost training (issue 12). Writes `REPORT.md` and `report.json` into `--out`.
//!
//! ```text
//! cargo build --release --features wgpu --example train --example bench_defaults --example learner_bench
//! target/release/examples/bench_defaults                              # ~15 min on 2 cores
//! target/release/examples/bench_defaults --sizes 10mb --budgets '' --no-cubecl --learner-sizes ''  # smoke test
//! target/release/examples/bench_defaults --sizes '' --budgets '' --cubecl-sizes 1gb,4gb \
//!     --note "GPU: ..."                                               # on a GPU (scripts/gpu-check.sh)
//! ```
//!
//! Each size runs, in turn: no checkpoints, ours with default flags, Burn's checkpointer, no
//! checkpoints again (the machine's speed drifts; the two baselines bound the noise). At 1gb the
//! snapshot budgets of `--budgets` (fractions of the state) follow. Last, runs on `--backend
//! wgpu` at the `--cubecl-sizes` (the CubeCL path: no checkpoints, ours, ours with the
//! optimizer read on the staging helper with and without the wait before the update, Burn's)
//! measure what a save still holds at the next update and in device memory one step later,
//! and the stall and lost time beside Burn's (`--no-cubecl` skips them). Every run
//! is a separate process: its peak memory is sampled while it runs (resident set + tmpfs
//! growth, where the scratch files go). *Lost time* is the run's wall time
//! to `done` (which includes waiting for the last save to be durable) minus the mean of the two
//! baselines: every stall and every slowdown of the following steps, until each save is
//! durable. The physical floor beside it: writing and `fsync`ing the state's bytes once.

use std::{
    fs::File,
    io::Write,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Instant,
};

use anyhow::{Context, Result, bail};
use clap::Parser;
use serde_json::{Value, json};

// The machine description and number helpers of the library-level report.
#[path = "bench_report/machine.rs"]
mod machine;
// This report uses a few of them.
#[allow(dead_code)]
#[path = "bench_report/stats.rs"]
mod stats;

use stats::num;

// `wait4`: a child's exit status, peak RSS and CPU time; its memory sampled while it runs.
#[path = "bench_report/process.rs"]
mod process;
use process::wait_sampled;

// The learner route's section.
#[path = "bench_report/learner.rs"]
mod learner;

/// Flags.
#[derive(Parser, Debug)]
#[command(about = "The example trainer with default flags against Burn's checkpointer")]
struct Args {
    /// State sizes to run (10mb, 100mb, 1gb, 2gb, 4gb).
    #[arg(long, value_delimiter = ',', default_value = "10mb,100mb,1gb,2gb,4gb")]
    sizes: Vec<String>,
    /// Snapshot budgets run at 1gb, as fractions of the state ('' for none).
    #[arg(long, value_delimiter = ',', default_value = "0.25,0.5,1.0")]
    budgets: Vec<String>,
    /// Output directory for REPORT.md and report.json.
    #[arg(long, default_value = "docs/perf")]
    out: PathBuf,
    /// Where runs write their checkpoints (each run's are deleted after it). Default:
    /// `target/bench-defaults` of this workspace.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// The trainer binary. Default: `train` beside this binary (`cargo build --release
    /// --example train`).
    #[arg(long)]
    train: Option<PathBuf>,
    /// Skip the CubeCL run (`--backend wgpu`, which needs a trainer built with `--features
    /// wgpu` and a Vulkan driver such as Mesa's lavapipe).
    #[arg(long)]
    no_cubecl: bool,
    /// CubeCL-path sizes to run (38mb, 151mb, 1gb, 4gb; the last two are for a GPU: lavapipe
    /// runs their kernels on the CPU for many minutes).
    #[arg(long, value_delimiter = ',', default_value = "38mb,151mb")]
    cubecl_sizes: Vec<String>,
    /// A line about the machine for the report's header (for example the GPU a run used).
    #[arg(long)]
    note: Option<String>,
    /// Learner-route sizes (100mb, 1gb, 4gb; '' for none): `learner_bench` with the README's
    /// learner lines against Burn's checkpointer.
    #[arg(long, value_delimiter = ',', default_value = "100mb,1gb")]
    learner_sizes: Vec<String>,
    /// Rounds of (off, ours, Burn; ours and Burn's swap places each pass) per learner and
    /// custom-loop size.
    #[arg(long, default_value_t = 2)]
    learner_passes: usize,
    /// Custom-loop sizes (100mb, 1gb, 4gb; '' for none): `learner_bench --mode custom`, a
    /// training loop of its own with the README's custom-loop lines, against Burn's
    /// checkpointers in the same loop.
    #[arg(long, value_delimiter = ',', default_value = "100mb,1gb")]
    custom_sizes: Vec<String>,
    /// Learner-route sizes measured again with the opt-in huge-pages allocator in every
    /// program (`learner_bench --huge-pages`; '' for none): a finding beside the default rows.
    #[arg(long, value_delimiter = ',', default_value = "1gb")]
    huge_learner_sizes: Vec<String>,
    /// Rounds of (off, ours, Burn) of the GPU shape: the trainer at 1gb training on one core
    /// (`RAYON_NUM_THREADS=1`), the other free, 30 steps, a save every 6 (0 for none).
    #[arg(long, default_value_t = 3)]
    gpu_shape_passes: usize,
    /// The `learner_bench` binary. Default: beside this binary.
    #[arg(long)]
    learner: Option<PathBuf>,
}

/// The CubeCL runs, in order: no checkpoints, ours with default flags (on wgpu the save call
/// reads the optimizer's state), ours with the staging helper reading it and the update
/// waiting for it, the same without that wait, Burn's checkpointer.
const CUBECL_RUNS: [(&str, &[&str]); 5] = [
    ("base", &["--save-every", "0"]),
    ("ours", &[]),
    ("ours-background", &["--optimizer-read", "background"]),
    (
        "ours-background-no-wait",
        &["--optimizer-read", "background", "--update-wait", "never"],
    ),
    ("burn", &["--save-mode", "burn"]),
];

/// The CubeCL-path shapes: the trainer on `--backend wgpu` (through Mesa's lavapipe here, the
/// Vulkan driver of a GPU machine there). The first two are the default; `cubecl-1gb` and
/// `cubecl-4gb` are the Flex 1gb and 4gb shapes, for a GPU (lavapipe runs their kernels on the
/// CPU for many minutes).
const CUBECL_SHAPES: [Shape; 4] = [
    Shape {
        label: "cubecl-38mb",
        hidden: 1024,
        layers: 4,
        steps: 14,
        save_every: 2,
    },
    Shape {
        label: "cubecl-151mb",
        hidden: 2048,
        layers: 4,
        steps: 8,
        save_every: 2,
    },
    Shape {
        label: "cubecl-1gb",
        hidden: 4096,
        layers: 6,
        steps: 12,
        save_every: 4,
    },
    Shape {
        label: "cubecl-4gb",
        hidden: 4096,
        layers: 21,
        steps: 12,
        save_every: 4,
    },
];

/// The CubeCL section's heading and definitions, before its shapes.
const CUBECL_INTRO: &str = "## The CubeCL path (wgpu)\n\n`train --backend wgpu`: the burn-cubecl code CUDA runs, here through wgpu's Vulkan driver. *Ours* has default flags: on wgpu (one queue) the save call reads the optimizer's state to host itself, ahead of the next step's work, and enqueues the model's read (`--optimizer-read auto`); *background* adds `--optimizer-read background` (the staging helper reads it beside the next forward and backward, and the update waits until it is out, `--update-wait auto`; the wait counted in the save's stall); *background-no-wait* also adds `--update-wait never` (the update copies on write what the save still holds); *Burn* is `--save-mode burn`. *Held at the next update*: `pinned_at_next_update`, the state the save's snapshot still held handles of when the next update ran. *Device extra one step later*: the device allocator's bytes in use at the end of the step after the save minus at the end of the save's step (`Device::memory_pool_usage`, which is CubeCL's `memory_report(MemoryScope::Device)`). *Lost per save*: wall time minus the run without checkpoints, over the saves.\n\n";

/// One CubeCL shape's runs, by mode.
type CubeclRuns = Vec<(&'static str, std::result::Result<Run, String>)>;

/// A run shape: the trainer's model flags for one state size.
struct Shape {
    label: &'static str,
    hidden: u32,
    layers: u32,
    steps: u32,
    save_every: u32,
}

/// `(layers - 1) * hidden^2` parameters, times 12 bytes (weights and AdamW's two moments).
const SHAPES: [Shape; 5] = [
    Shape {
        label: "10mb",
        hidden: 512,
        layers: 4,
        steps: 400,
        save_every: 40,
    },
    Shape {
        label: "100mb",
        hidden: 1024,
        layers: 9,
        steps: 160,
        save_every: 16,
    },
    Shape {
        label: "1gb",
        hidden: 4096,
        layers: 6,
        steps: 12,
        save_every: 4,
    },
    Shape {
        label: "2gb",
        hidden: 4096,
        layers: 11,
        steps: 12,
        save_every: 4,
    },
    Shape {
        label: "4gb",
        hidden: 4096,
        layers: 21,
        steps: 12,
        save_every: 4,
    },
];

/// The shape of GPU training on the CPU: the 1gb state, 30 steps, a save every 6, training on
/// one core (`RAYON_NUM_THREADS=1`) and the other core free, as a GPU leaves the host's cores.
const GPU_SHAPE: Shape = Shape {
    label: "gpu-shape-1gb",
    hidden: 4096,
    layers: 6,
    steps: 30,
    save_every: 6,
};

/// The GPU shape's section: per pass (off, ours, Burn), the lost time while training goes on
/// (the final wait left out) and in all, against the same pass's run without checkpoints.
fn gpu_shape_markdown(passes: &[[Run; 3]]) -> String {
    let mut o = String::from(
        "## The shape of GPU training (one core trains, one is free)\n\n\
         The example trainer at 1 GB (`--hidden 4096 --layers 6 --steps 30 --save-every 6`, 5 \
         saves) with `RAYON_NUM_THREADS=1`: training uses one core and leaves the other to the \
         save, as a GPU leaves the host's cores. Default flags; *Burn* is `--save-mode burn`. \
         Each pass runs off first, then ours and Burn's, which swap places from one pass to the \
         next (the run right after a run without checkpoints was slower on this VM), and each is \
         measured against its own pass's \
         run without checkpoints. *While training*: wall time minus the baseline's, minus the \
         final wait (the last save's persist after the last step, which no training overlaps), \
         over the 4 saves training followed. *In all*: wall time minus the baseline's, over the \
         5 saves. *Extra CPU per save*: the process's CPU time (user + kernel, all threads, from \
         `wait4`) minus the baseline's, over the 5 saves: the work a save costs, whichever thread does \
         it.\n\n\
         | pass | no checkpoints s | while training per save, ours / Burn s | ratio | final wait, ours / Burn s | in all per save, ours / Burn s | ratio | extra peak memory, ours / Burn (x state) | extra CPU per save, ours / Burn s |\n\
         |---|---|---|---|---|---|---|---|---|\n",
    );
    let mut ratios = Vec::new();
    for (i, [off, ours, burn]) in passes.iter().enumerate() {
        let (wo, wb) = (
            ours.lost_while_training(off.wall_s),
            burn.lost_while_training(off.wall_s),
        );
        let (ao, ab) = (
            ours.lost_per_save(off.wall_s),
            burn.lost_per_save(off.wall_s),
        );
        let state = ours.state_bytes().unwrap_or(0) as f64;
        let x = |r: &Run| (r.peak_mem as f64 - off.peak_mem as f64) / state;
        let cpu = |r: &Run| (r.cpu_s - off.cpu_s) / r.saves().len().max(1) as f64;
        let ratio = wo / wb;
        ratios.push(ratio);
        o.push_str(&format!(
            "| {} | {:.1} | {:.2} / {:.2} | {} | {:.2} / {:.2} | {:.2} / {:.2} | {:.2} | {:.2} / {:.2} | {:.2} / {:.2} |\n",
            i + 1,
            off.wall_s,
            wo,
            wb,
            fraction(ratio),
            ours.final_wait(),
            burn.final_wait(),
            ao,
            ab,
            ao / ab,
            x(ours),
            x(burn),
            cpu(ours),
            cpu(burn),
        ));
    }
    o.push_str(&format!(
        "\nWhile training goes on, ours / Burn's, median over the passes: {} (target: at most \
         1/20).\n\n",
        fraction(stats::median(&ratios))
    ));
    o
}

/// A ratio as `1/N` when it is below 1, or in the noise when not positive.
fn fraction(r: f64) -> String {
    if r <= 0.0 {
        format!("{r:.3} (ours in the noise)")
    } else if r < 1.0 {
        format!("1/{:.0}", 1.0 / r)
    } else {
        format!("{r:.2}")
    }
}

/// One trainer process.
struct Run {
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

impl Run {
    fn stalls_ms(&self) -> Vec<f64> {
        self.saves()
            .iter()
            .filter_map(|s| s["stall_ms"].as_f64())
            .collect()
    }
    fn stall_median(&self) -> f64 {
        stats::median(&self.stalls_ms())
    }
    fn saves(&self) -> &[Value] {
        self.report["saves"].as_array().map_or(&[], Vec::as_slice)
    }
    /// Wall time over a baseline's, per save (at least one), in seconds.
    fn lost_per_save(&self, base_wall: f64) -> f64 {
        (self.wall_s - base_wall) / self.saves().len().max(1) as f64
    }
    /// Lost time per save while training goes on, in seconds: the wall time over a baseline's,
    /// less the final wait, over the saves that training followed (the last save, at the last
    /// step, has no following steps: its persist is the final wait).
    fn lost_while_training(&self, base_wall: f64) -> f64 {
        (self.wall_s - base_wall - self.final_wait()) / self.saves_followed()
    }
    /// The saves that training followed (all but the last, at the last step; at least one).
    fn saves_followed(&self) -> f64 {
        self.saves().len().saturating_sub(1).max(1) as f64
    }
    /// The same as the run's own frequency controller measured it (stalls plus the following
    /// steps' excess over its baseline steps, the steps outside any save's window), in seconds.
    /// In a run of a few steps that baseline is mostly warm-up steps, which are slow, so this
    /// undercounts.
    fn controller_while_training(&self) -> f64 {
        self.report["lost"]["during_training_ms"]
            .as_f64()
            .unwrap_or(f64::NAN)
            / 1e3
            / self.saves_followed()
    }
    /// The wait after the last step for the last save to be durable, in seconds.
    fn final_wait(&self) -> f64 {
        self.report["lost"]["final_wait_ms"]
            .as_f64()
            .unwrap_or(f64::NAN)
            / 1e3
    }
    fn state_bytes(&self) -> Option<u64> {
        self.saves().first().and_then(|s| s["bytes"].as_u64())
    }
    /// The run in `report.json`.
    fn to_json(&self) -> Value {
        json!({"mode": self.mode, "wall_s": self.wall_s, "peak_mem": self.peak_mem, "peak_rss": self.peak_rss, "cpu_s": self.cpu_s, "report": self.report})
    }
}

/// Runs the trainer once; its peak memory sampled while it runs, its CPU time from `wait4`.
fn run_trainer(
    train: &Path,
    dir: &Path,
    shape: &Shape,
    mode: &str,
    extra: &[String],
) -> Result<Run> {
    run_trainer_env(train, dir, shape, mode, extra, &[])
}

/// [`run_trainer`] with environment variables set for the trainer.
fn run_trainer_env(
    train: &Path,
    dir: &Path,
    shape: &Shape,
    mode: &str,
    extra: &[String],
    env: &[(&str, &str)],
) -> Result<Run> {
    let root = dir.join(format!("{}-{mode}", shape.label));
    let _ = std::fs::remove_dir_all(&root);
    let report_path = dir.join(format!("{}-{mode}.json", shape.label));
    let log_path = dir.join(format!("{}-{mode}.log", shape.label));
    let log =
        File::create(&log_path).with_context(|| format!("creating {}", log_path.display()))?;
    let mut cmd = Command::new(train);
    cmd.arg("--dir")
        .arg(&root)
        .args([
            "--hidden",
            &shape.hidden.to_string(),
            "--layers",
            &shape.layers.to_string(),
        ])
        .args(["--steps", &shape.steps.to_string()])
        .arg("--report")
        .arg(&report_path)
        .args(extra)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    let t0 = Instant::now();
    let child = cmd
        .spawn()
        .with_context(|| format!("starting {}", train.display()))?;
    let exit = wait_sampled(child.id())?;
    let status = exit.code;
    let elapsed = t0.elapsed().as_secs_f64();
    let _ = std::fs::remove_dir_all(&root);
    if status != 0 {
        let tail = std::fs::read_to_string(&log_path).unwrap_or_default();
        let tail: Vec<&str> = tail.lines().rev().take(20).collect();
        bail!(
            "{} {mode} exited with status {status} (log {}):\n{}",
            shape.label,
            log_path.display(),
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
    let report: Value = serde_json::from_slice(
        &std::fs::read(&report_path)
            .with_context(|| format!("reading {}", report_path.display()))?,
    )
    .with_context(|| format!("parsing {}", report_path.display()))?;
    let wall_s = report["wall_s"].as_f64().unwrap_or(elapsed);
    Ok(Run {
        mode: mode.to_string(),
        wall_s,
        peak_mem: exit.peak_mem,
        peak_rss: exit.peak_rss,
        cpu_s: exit.cpu_s,
        report,
    })
}

/// Seconds to write `bytes` in 8 MiB writes and `fsync` them: the floor of making a save
/// durable on this disk.
fn disk_floor(dir: &Path, bytes: u64) -> Result<f64> {
    let path = dir.join("floor.bin");
    let chunk = vec![0x5au8; 8 << 20];
    let t0 = Instant::now();
    let mut f = File::create(&path)?;
    let mut left = bytes;
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        f.write_all(&chunk[..n])?;
        left -= n as u64;
    }
    f.sync_all()?;
    let s = t0.elapsed().as_secs_f64();
    drop(f);
    std::fs::remove_file(&path)?;
    Ok(s)
}

/// What one size measured.
struct SizeResult {
    label: &'static str,
    shape: String,
    state: u64,
    floor_s: f64,
    base: [Run; 2],
    ours: Run,
    burn: Run,
    budgets: Vec<(f64, Run)>,
    /// At 1gb: no checkpoints, ours and Burn's again with `--huge-pages off`.
    small_pages: Option<[Run; 3]>,
}

impl SizeResult {
    fn base_wall(&self) -> f64 {
        (self.base[0].wall_s + self.base[1].wall_s) / 2.0
    }
    fn base_mem(&self) -> f64 {
        (self.base[0].peak_mem + self.base[1].peak_mem) as f64 / 2.0
    }
    fn lost_per_save(&self, r: &Run) -> f64 {
        r.lost_per_save(self.base_wall())
    }
    fn lost_while_training(&self, r: &Run) -> f64 {
        r.lost_while_training(self.base_wall())
    }
    fn extra_mem(&self, r: &Run) -> f64 {
        r.peak_mem as f64 - self.base_mem()
    }
    /// The least `ours / Burn` lost-time ratio any save that is durable when the run ends can
    /// reach in this run shape: the last save's bytes written and fsynced once at the disk
    /// speed measured in this run (the disk floor), spread over the saves, against Burn's lost
    /// time per save.
    fn drain_bound(&self) -> f64 {
        let saves = self.ours.saves().len().max(1) as f64;
        (self.floor_s / saves) / self.lost_per_save(&self.burn)
    }
}

fn mb(b: f64) -> String {
    format!("{:.0} MB", b / 1e6)
}

fn main() -> Result<()> {
    let args = Args::parse();
    let t0 = Instant::now();
    let here = std::env::current_exe()?;
    let train = match &args.train {
        Some(t) => t.clone(),
        None => here.with_file_name("train"),
    };
    if !train.exists() {
        bail!(
            "no trainer at {}: build it first (`cargo build --release --features wgpu --example train`) or pass --train",
            train.display()
        );
    }
    let dir = args
        .dir
        .clone()
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/bench-defaults"));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::create_dir_all(&args.out)?;
    let shapes: Vec<&Shape> =
        args.sizes
            .iter()
            .filter(|l| !l.is_empty())
            .map(|l| {
                SHAPES.iter().find(|s| s.label == l).with_context(|| {
                    format!("unknown size {l:?}: one of 10mb, 100mb, 1gb, 2gb, 4gb")
                })
            })
            .collect::<Result<_>>()?;
    let budgets: Vec<f64> = args
        .budgets
        .iter()
        .filter(|b| !b.is_empty())
        .map(|b| {
            b.parse::<f64>()
                .with_context(|| format!("budget {b:?} is not a fraction"))
        })
        .collect::<Result<_>>()?;
    let cubecl_shapes: Vec<&Shape> = if args.no_cubecl {
        Vec::new()
    } else {
        args.cubecl_sizes
            .iter()
            .filter(|l| !l.is_empty())
            .map(|l| {
                CUBECL_SHAPES
                    .iter()
                    .find(|s| s.label.strip_prefix("cubecl-") == Some(l.as_str()))
                    .with_context(|| {
                        format!("unknown CubeCL size {l:?}: one of 38mb, 151mb, 1gb, 4gb")
                    })
            })
            .collect::<Result<_>>()?
    };
    let learner_shapes = learner::shapes(&args.learner_sizes)?;
    let custom_shapes = learner::shapes(&args.custom_sizes)?;
    let huge_shapes = learner::shapes(&args.huge_learner_sizes)?;
    let learner_bin = match &args.learner {
        Some(b) => b.clone(),
        None => here.with_file_name("learner_bench"),
    };
    let needs_learner =
        !learner_shapes.is_empty() || !custom_shapes.is_empty() || !huge_shapes.is_empty();
    if needs_learner && !learner_bin.exists() {
        bail!(
            "no learner program at {}: build it first (`cargo build --release --example learner_bench`) or pass --learner",
            learner_bin.display()
        );
    }
    let with_budgets = shapes.iter().any(|s| s.label == "1gb");
    let total = shapes.len() as u64 * 4
        + (cubecl_shapes.len() * CUBECL_RUNS.len()) as u64
        + (learner_shapes.len() + custom_shapes.len() + huge_shapes.len()) as u64
            * learner::runs_per_size(args.learner_passes)
        + 3 * args.gpu_shape_passes as u64
        + if with_budgets {
            budgets.len() as u64 + 3
        } else {
            0
        };
    let bar = indicatif::ProgressBar::new(total);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{elapsed_precise} [{bar:30}] {pos}/{len} runs {msg}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let load_before = machine::loadavg();
    let mut results = Vec::new();
    for shape in shapes {
        let go = |mode: &str, extra: &[String]| -> Result<Run> {
            bar.set_message(format!("{} {mode}", shape.label));
            let r = run_trainer(&train, &dir, shape, mode, extra)?;
            bar.inc(1);
            let line = format!(
                "{} {mode}: {:.1} s, peak memory {}, stall median {} ms ({}/{total} runs)",
                shape.label,
                r.wall_s,
                mb(r.peak_mem as f64),
                num(r.stall_median()),
                bar.position()
            );
            // A hidden bar (output not a terminal) prints nothing, not even `println`.
            if bar.is_hidden() {
                eprintln!("{line}");
            } else {
                bar.println(line);
            }
            Ok(r)
        };
        let every = vec!["--save-every".to_string(), shape.save_every.to_string()];
        let none = vec!["--save-every".to_string(), "0".to_string()];
        // Unrecorded: two steps without checkpoints, so that no recorded run is the first to
        // touch this size's memory. In two runs of this bench before it, the 4gb run without
        // checkpoints before ours took 159-166 s and the one after it 107-113 s.
        bar.set_message(format!("{} warm-up", shape.label));
        let warm: Vec<String> = ["--save-every", "0", "--steps", "2"]
            .map(String::from)
            .into();
        run_trainer(&train, &dir, shape, "warm-up", &warm)?;
        let base0 = go("none-before", &none)?;
        let ours = go("ours", &every)?;
        let mut burn_flags = every.clone();
        burn_flags.extend(["--save-mode".to_string(), "burn".to_string()]);
        let burn = go("burn", &burn_flags)?;
        let base1 = go("none-after", &none)?;
        let state = ours.state_bytes().unwrap_or(0);
        let mut budget_runs = Vec::new();
        if shape.label == "1gb" {
            for &f in &budgets {
                let mib = ((state as f64 * f) / (1 << 20) as f64).round().max(1.0) as u64;
                let mut flags = every.clone();
                flags.extend(["--snapshot-budget-mb".to_string(), mib.to_string()]);
                budget_runs.push((f, go(&format!("budget-{f}"), &flags)?));
            }
        }
        let small_pages = if shape.label == "1gb" {
            let off = |flags: &[String]| {
                let mut f = flags.to_vec();
                f.extend(["--huge-pages".to_string(), "off".to_string()]);
                f
            };
            Some([
                go("none-small-pages", &off(&none))?,
                go("ours-small-pages", &off(&every))?,
                go("burn-small-pages", &off(&burn_flags))?,
            ])
        } else {
            None
        };
        let floor_s = disk_floor(&dir, state)?;
        results.push(SizeResult {
            label: shape.label,
            shape: format!(
                "--hidden {} --layers {} --steps {} --save-every {}",
                shape.hidden, shape.layers, shape.steps, shape.save_every
            ),
            state,
            floor_s,
            base: [base0, base1],
            ours,
            burn,
            budgets: budget_runs,
            small_pages,
        });
    }
    // A trainer without wgpu or a machine without Vulkan: said in the report, not fatal.
    let cubecl: Vec<(&Shape, CubeclRuns)> = cubecl_shapes
        .into_iter()
        .map(|shape| (shape, cubecl_runs(&train, &dir, shape, &bar)))
        .collect();
    let mut learner_runs = Vec::new();
    let mut custom_runs = Vec::new();
    let mut huge_runs = Vec::new();
    for (route, shapes, runs) in [
        (learner::Route::Learner, &learner_shapes, &mut learner_runs),
        (learner::Route::CustomLoop, &custom_shapes, &mut custom_runs),
        (
            learner::Route::LearnerHugePages,
            &huge_shapes,
            &mut huge_runs,
        ),
    ] {
        for shape in shapes {
            let measured =
                learner::measure(&learner_bin, &dir, route, shape, args.learner_passes, |m| {
                    bar.set_message(m.to_string());
                    bar.inc(1);
                })?;
            runs.push((*shape, measured));
        }
    }
    let mut gpu_shape = Vec::new();
    for pass in 0..args.gpu_shape_passes {
        let one = |mode: &str, extra: &[&str]| -> Result<Run> {
            bar.set_message(format!("gpu-shape {mode} {pass}"));
            let mut flags: Vec<String> = ["--save-every", "6"].map(String::from).into();
            flags.extend(extra.iter().map(|f| f.to_string()));
            let r = run_trainer_env(
                &train,
                &dir,
                &GPU_SHAPE,
                &format!("{mode}-{pass}"),
                &flags,
                &[("RAYON_NUM_THREADS", "1")],
            )?;
            bar.inc(1);
            Ok(r)
        };
        // In the learner sections' order: off, then ours and Burn's, which swap places from
        // one pass to the next.
        let (mut off, mut ours, mut burn) = (None, None, None);
        for mode in learner::pass_order(pass) {
            match mode {
                "off" => off = Some(one("none", &["--save-every", "0"])?),
                "ours" => ours = Some(one("ours", &[])?),
                _ => burn = Some(one("burn", &["--save-mode", "burn"])?),
            }
        }
        let (Some(off), Some(ours), Some(burn)) = (off, ours, burn) else {
            bail!("a GPU-shape pass without one of off, ours, Burn's");
        };
        gpu_shape.push([off, ours, burn]);
    }
    bar.finish_and_clear();
    let load_after = machine::loadavg();
    let provenance = Provenance {
        load_before,
        load_after,
        elapsed_s: t0.elapsed().as_secs_f64(),
        note: args.note.clone(),
    };
    let mut md = if results.is_empty() {
        cubecl_header(&provenance)
    } else {
        markdown(&results, &provenance)
    };
    if !learner_runs.is_empty() {
        md.push_str(&learner::markdown(learner::Route::Learner, &learner_runs));
    }
    if !custom_runs.is_empty() {
        md.push_str(&learner::markdown(learner::Route::CustomLoop, &custom_runs));
    }
    if !huge_runs.is_empty() {
        md.push_str(&learner::markdown(
            learner::Route::LearnerHugePages,
            &huge_runs,
        ));
        md.push_str(&learner::huge_pages_baselines(&learner_runs, &huge_runs));
    }
    if !gpu_shape.is_empty() {
        md.push_str(&gpu_shape_markdown(&gpu_shape));
    }
    if !cubecl.is_empty() {
        md.push_str(CUBECL_INTRO);
    }
    for (shape, runs) in &cubecl {
        md.push_str(&cubecl_markdown(shape, runs));
    }
    let out = args.out.join("REPORT.md");
    std::fs::write(&out, md).with_context(|| format!("writing {}", out.display()))?;
    let json_path = args.out.join("report.json");
    let mut json = json!({"sizes": to_json(&results)});
    let cubecl_json: Vec<Value> = cubecl
        .iter()
        .map(|(shape, runs)| {
            let mut c = json!({"shape": shape.label});
            for (mode, r) in runs {
                c[*mode] = match r {
                    Ok(r) => {
                        json!({"wall_s": r.wall_s, "peak_mem": r.peak_mem, "peak_rss": r.peak_rss, "report": r.report})
                    }
                    Err(e) => json!({"error": e}),
                };
            }
            c
        })
        .collect();
    json["cubecl"] = Value::Array(cubecl_json);
    json["learner"] = learner::to_json(&learner_runs);
    json["custom_loop"] = learner::to_json(&custom_runs);
    json["learner_huge_pages"] = learner::to_json(&huge_runs);
    json["gpu_shape"] = Value::Array(
        gpu_shape
            .iter()
            .map(|pass| Value::Array(pass.iter().map(Run::to_json).collect()))
            .collect(),
    );
    std::fs::write(&json_path, serde_json::to_string_pretty(&json)?)?;
    println!(
        "wrote {} and {} in {:.1} min",
        out.display(),
        json_path.display(),
        t0.elapsed().as_secs_f64() / 60.0
    );
    Ok(())
}

fn to_json(results: &[SizeResult]) -> Value {
    let run = Run::to_json;
    Value::Array(
        results
            .iter()
            .map(|s| {
                json!({
                    "size": s.label, "shape": s.shape, "state_bytes": s.state, "disk_floor_s": s.floor_s,
                    "runs": [run(&s.base[0]), run(&s.ours), run(&s.burn), run(&s.base[1])],
                    "budgets": s.budgets.iter().map(|(f, r)| json!({"fraction": f, "run": run(r)})).collect::<Vec<_>>(),
                    "small_pages": s.small_pages.as_ref().map(|runs| runs.iter().map(run).collect::<Vec<_>>()),
                })
            })
            .collect(),
    )
}

/// One row of the targets table over the sizes among `labels` that ran: each one's cell, and
/// the verdict of all of them. No row when none ran.
fn target_row(
    o: &mut String,
    results: &[SizeResult],
    labels: &[&str],
    target: &str,
    prefix: &str,
    cell: impl Fn(&SizeResult) -> String,
    ok: impl Fn(&SizeResult) -> bool,
) {
    let ran: Vec<&SizeResult> = results
        .iter()
        .filter(|s| labels.contains(&s.label))
        .collect();
    if ran.is_empty() {
        return;
    }
    let cells: Vec<String> = ran
        .iter()
        .map(|s| format!("{} {}", s.label, cell(s)))
        .collect();
    o.push_str(&format!(
        "| {target} | {prefix}{} | {} |\n",
        cells.join(", "),
        stats::verdict(ran.iter().all(|s| ok(s)))
    ));
}

/// Where and when a report was made: the machine, the load around the run, its length, and
/// the `--note`.
struct Provenance {
    load_before: String,
    load_after: String,
    elapsed_s: f64,
    note: Option<String>,
}

impl Provenance {
    /// "on DATE (MACHINE); NOTE; load average ... before, ... after; the run took N min".
    fn line(&self) -> String {
        format!(
            "on {} ({}){}; load average {} before, {} after; the run took {:.1} min",
            machine::utc_now(),
            machine::machine(),
            self.note
                .as_deref()
                .map(|n| format!("; {n}"))
                .unwrap_or_default(),
            self.load_before,
            self.load_after,
            self.elapsed_s / 60.0
        )
    }
}

/// The header of a report with only the CubeCL section (`--sizes ''`, as on a GPU machine).
fn cubecl_header(provenance: &Provenance) -> String {
    format!(
        "# The example trainer on the CubeCL path with default flags, against Burn's checkpointer\n\nGenerated by `target/release/examples/bench_defaults` {}. Raw reports of every run: [`report.json`](report.json).\n\n",
        provenance.line()
    )
}

fn markdown(results: &[SizeResult], provenance: &Provenance) -> String {
    let mut o = String::new();
    let w = |o: &mut String, s: String| {
        o.push_str(&s);
        o.push('\n');
    };
    w(
        &mut o,
        "# The example trainer with default flags, against Burn's checkpointer\n".into(),
    );
    w(
        &mut o,
        format!(
            "Generated by `target/release/examples/bench_defaults` (after `cargo build --release --features wgpu --example train --example bench_defaults --example learner_bench`) {}. Backend: Burn Flex (CPU), except the last section (wgpu). Raw reports of every run: [`report.json`](report.json).\n",
            provenance.line()
        ),
    );
    w(&mut o, "Every row comes from the same configuration: `target/release/examples/train` with its **default flags** (`--save-mode async`, `--snapshot-budget-mb auto`, default retention and persist slots) except the model size, the run length and `--save-every`. *Burn* is the same command with `--save-mode burn` (Burn's `AsyncCheckpointer<FileCheckpointer>`, what the learner uses). Each size runs no checkpoints, ours, Burn's, no checkpoints again, one after another, after an unrecorded two-step warm-up run of the same shape (the first run to touch a size's memory is slow on this VM); the two baselines show the machine's drift. The machine is a shared 2-core VM: treat single runs as noisy and read ratios.\n".into());
    w(&mut o, "- *stall*: the training thread's time in the save call, median [min-max] over the run's saves.\n- *lost per save*: (wall time to `done`, which waits for the last save to be durable) minus the mean of the two baselines, divided by the saves: stalls plus every slowdown of the following steps until each save is durable, the last save's whole persist included.\n- *extra memory*: peak memory (the run's resident set plus what tmpfs gained while it ran, sampled every 5 ms, at least the kernel's peak RSS from `wait4`: a save's scratch files go to `/dev/shm`, memory no process's RSS shows) minus the mean of the baselines' peaks.\n- *disk floor*: writing the state's bytes once in 8 MiB writes and `fsync`ing them (no save can be durable sooner).\n".into());

    // Targets.
    w(&mut o, "## Issue-12 targets\n".into());
    w(
        &mut o,
        "| target | measured | verdict |\n|---|---|---|".into(),
    );
    let all = ["10mb", "100mb", "1gb", "2gb", "4gb"];
    target_row(
        &mut o,
        results,
        &all,
        "stall ≤ 1/20 of Burn's at every size",
        "Burn / ours: ",
        |s| format!("{:.0}x", s.burn.stall_median() / s.ours.stall_median()),
        |s| s.ours.stall_median() * 20.0 <= s.burn.stall_median(),
    );
    target_row(
        &mut o,
        results,
        &["100mb", "1gb", "4gb"],
        "lost time per save ≤ 1/5 of Burn's at 100mb, 1gb, 4gb",
        "ours / Burn: ",
        |s| format!("{:.2}", s.lost_per_save(&s.ours) / s.lost_per_save(&s.burn)),
        |s| s.lost_per_save(&s.ours) * 5.0 <= s.lost_per_save(&s.burn),
    );
    target_row(
        &mut o,
        results,
        &["100mb", "1gb", "4gb"],
        "(the same, on the saves training followed: lost while training goes on, the final wait left out)",
        "ours / Burn: ",
        |s| {
            format!(
                "{:.2}",
                s.lost_while_training(&s.ours) / s.lost_while_training(&s.burn)
            )
        },
        |s| s.lost_while_training(&s.ours) * 5.0 <= s.lost_while_training(&s.burn),
    );
    target_row(
        &mut o,
        results,
        &["1gb", "4gb"],
        "extra peak memory (RSS + scratch in tmpfs) ≤ 1.0x the state + 64 MiB at 1gb, 4gb",
        "",
        |s| format!("{:.2}x the state", s.extra_mem(&s.ours) / s.state as f64),
        |s| s.extra_mem(&s.ours) <= s.state as f64 + 64.0 * (1 << 20) as f64,
    );
    target_row(
        &mut o,
        results,
        &all,
        "no staging allocation after the first save (the direct-I/O write buffers, counted)",
        "",
        |s| {
            let d = &s.ours.report["direct_io"];
            format!(
                "{} allocated / {} reused",
                d["buffers_allocated"], d["buffers_reused"]
            )
        },
        |s| {
            s.ours.report["direct_io"]["buffers_allocated"]
                .as_u64()
                .is_some_and(|n| n <= 2)
        },
    );
    for s in results {
        for (f, r) in &s.budgets {
            let st = r.stall_median() <= s.burn.stall_median();
            let lo = s.lost_per_save(r) <= s.lost_per_save(&s.burn);
            w(
                &mut o,
                format!(
                    "| budget {f}x the state at {}: stall and lost time ≤ Burn's | stall {} ms vs {} ms; lost/save {:.2} s vs {:.2} s | {} |",
                    s.label,
                    num(r.stall_median()),
                    num(s.burn.stall_median()),
                    s.lost_per_save(r),
                    s.lost_per_save(&s.burn),
                    stats::verdict(st && lo)
                ),
            );
        }
    }
    w(&mut o, "".into());

    w(&mut o, "## Per size\n".into());
    w(&mut o, "| state | shape | saves | stall ours ms | stall Burn ms | lost/save ours ms | lost/save Burn ms | ours / Burn lost | extra memory ours | extra memory Burn | disk floor s | baselines s |\n|---|---|---|---|---|---|---|---|---|---|---|---|".into());
    for s in results {
        w(
            &mut o,
            format!(
                "| {} ({}) | `{}` | {} | {} | {} | {} | {} | **{:.2}** | {} ({:.2}x) | {} ({:.2}x) | {:.2} | {:.1} / {:.1} |",
                s.label,
                mb(s.state as f64),
                s.shape,
                s.ours.saves().len(),
                stats::med_range(&s.ours.stalls_ms()),
                stats::med_range(&s.burn.stalls_ms()),
                num(s.lost_per_save(&s.ours) * 1e3),
                num(s.lost_per_save(&s.burn) * 1e3),
                s.lost_per_save(&s.ours) / s.lost_per_save(&s.burn),
                mb(s.extra_mem(&s.ours)),
                s.extra_mem(&s.ours) / s.state as f64,
                mb(s.extra_mem(&s.burn)),
                s.extra_mem(&s.burn) / s.state as f64,
                s.floor_s,
                s.base[0].wall_s,
                s.base[1].wall_s
            ),
        );
    }
    w(&mut o, "".into());
    w(&mut o, "Where the lost time falls. *Final wait*: the last save's persist after the last step (the trainer's `lost.final_wait_ms`). *While training, per save*: the lost time less the final wait, over the saves training followed (wall time minus the mean of the baselines, minus the final wait). *Controller's estimate*: the same as the run's own frequency controller measured it (`lost.during_training_ms`: stalls plus the following steps' excess over its baseline, the steps outside any save's window); in these short runs that baseline is mostly slow warm-up steps, so it undercounts, and the wall-time column is the one to read. *Drain bound*: the least ours/Burn ratio of lost time per save that any checkpointer whose last save is durable when the run ends can reach in this shape, from the disk floor alone (floor / saves / Burn's lost per save); above 0.2 the 1/5 target cannot be met here by any durable save.\n".into());
    w(&mut o, "| state | while training, per save: ours ms | Burn ms | controller's estimate: ours ms | Burn ms | final wait: ours ms | Burn ms | our persist ms per save (median) | drain bound | direct-I/O bytes | page-cache bytes |\n|---|---|---|---|---|---|---|---|---|---|---|".into());
    for s in results {
        let persists: Vec<f64> = s
            .ours
            .saves()
            .iter()
            .filter_map(|v| v["persist_ms"].as_f64())
            .collect();
        let d = &s.ours.report["direct_io"];
        w(
            &mut o,
            format!(
                "| {} | {} | {} | {} | {} | {} | {} | {} | {:.2} | {} | {} |",
                s.label,
                num(s.lost_while_training(&s.ours) * 1e3),
                num(s.lost_while_training(&s.burn) * 1e3),
                num(s.ours.controller_while_training() * 1e3),
                num(s.burn.controller_while_training() * 1e3),
                num(s.ours.final_wait() * 1e3),
                num(s.burn.final_wait() * 1e3),
                num(stats::median(&persists)),
                s.drain_bound(),
                mb(d["direct_bytes"].as_f64().unwrap_or(0.0)),
                mb(d["buffered_bytes"].as_f64().unwrap_or(0.0)),
            ),
        );
    }
    w(&mut o, "".into());
    w(&mut o, "*Pinned at the next update*: the state a save's snapshot still held handle clones of just before the optimizer update that followed it (`pinned_at_next_update` in the trainer's report, from `ckpt_burn::pinned_state_bytes`): what the save had not yet written or copied out (on Flex the model's tensors, held for the writer, and the optimizer's handles until Burn's record of them is taken; on a GPU the model tensor by tensor as the staging helper copies it out), and that update had to copy instead of writing in place. On a GPU backend those copies are device memory.\n".into());
    w(
        &mut o,
        "| state | pinned at the next update, per save | of the state |\n|---|---|---|".into(),
    );
    for s in results {
        let pins: Vec<f64> = s.ours.report["pinned_at_next_update"]
            .as_array()
            .map(|a| a.iter().filter_map(|v| v["bytes"].as_f64()).collect())
            .unwrap_or_default();
        let cells: Vec<String> = pins.iter().map(|b| mb(*b)).collect();
        let worst = pins.iter().copied().fold(0.0, f64::max);
        w(
            &mut o,
            format!(
                "| {} | {} | up to {:.0} % |",
                s.label,
                cells.join(", "),
                100.0 * worst / s.state.max(1) as f64
            ),
        );
    }
    w(&mut o, "".into());

    w(&mut o, "Known causes (profiles and timings in [`HISTORY.md`](HISTORY.md)): on this 2-core machine training uses both cores, so the background save's CPU is taken from training almost one for one. A save's CPU is copies into fresh memory: Burn 0.22.1's `ModuleOptimizer::to_record` copies every moment out (the one copy its public API forces); the model's tensors are held for the writer, so an update before they are written allocates fresh buffers for them instead of writing in place (until session 25 a helper copied them out, or not, as a per-save measurement chose: see HISTORY.md). Since session 18 the optimizer record is no longer encoded with `into_bytes` on Flex: the writer streams it out through a scratch file (in `/dev/shm` where it has room, else the root; `OptimizerRecord::save`, each tensor freed once written), then into `optim.bpk` in the canonical layout. `into_bytes` filled one buffer of the whole record and then, through an upstream regression (cubecl-environment 0.11.3's `Bytes::from_bytes_vec` re-allocates every `Vec<u8>` to 16-byte alignment, checking the layout's alignment instead of the pointer's), copied it once more: for a moment the record was in memory twice, and that moment was a save's peak (1.15-1.20x the state at 1gb, 1.04-1.08x at 4gb in the session-17 runs; 0.96x and 0.79x in this one). The scratch file costs one more write and read of the record through the page cache (burn-pack syncs it). Device backends still use `into_bytes` (the record's lazy device reads must be realized before the optimizer's handles go). Burn allocates the record, so the library cannot hand it reused memory, and on this VM most of such a copy is the fresh memory's page faults. Burn's own checkpointer makes the same `to_record` copy on the training thread (its stall) and afterwards only writes; our last save runs `to_record` and the optimizer's write one after the other after the last step, so our final wait can be longer than Burn's. While training goes on our saves cost less than Burn's, but their copies' CPU is still taken from training, mostly in the step after each save. Writing costs little CPU: full chunks go to the disk with direct I/O from reused buffers.\n".into());
    if let Some(s) = results.iter().find(|s| s.small_pages.is_some())
        && let Some([none, ours, burn]) = &s.small_pages
    {
        w(&mut o, "## What the trainer's huge pages change\n".into());
        w(
            &mut o,
            format!(
                "The trainer's global allocator (`ckpt_alloc::HugePages`, on by default, `--huge-pages off` to compare) asks the kernel for transparent huge pages on every block of 4 MiB or more, so Burn's fresh tensors and a save's record copies fault in 2 MiB at a time. The same {} shape with `--huge-pages off`, in the same run as the rows above (one run each; lost per save against the run without checkpoints of the same setting):\n",
                s.label
            ),
        );
        w(&mut o, "| setting | no checkpoints s | ours: lost/save ms | Burn: lost/save ms | ours / Burn lost | ours: extra memory | Burn: extra memory |\n|---|---|---|---|---|---|---|".into());
        let row = |name: &str, base_wall: f64, base_mem: f64, ours: &Run, burn: &Run| {
            let lo = ours.lost_per_save(base_wall);
            let lb = burn.lost_per_save(base_wall);
            format!(
                "| {name} | {:.1} | {} | {} | {:.2} | {:.2}x | {:.2}x |",
                base_wall,
                num(lo * 1e3),
                num(lb * 1e3),
                lo / lb,
                (ours.peak_mem as f64 - base_mem) / s.state as f64,
                (burn.peak_mem as f64 - base_mem) / s.state as f64,
            )
        };
        w(
            &mut o,
            row(
                "huge pages (default)",
                s.base_wall(),
                s.base_mem(),
                &s.ours,
                &s.burn,
            ),
        );
        w(
            &mut o,
            row(
                "`--huge-pages off`",
                none.wall_s,
                none.peak_mem as f64,
                ours,
                burn,
            ),
        );
        let advised = |r: &Run| r.report["huge_pages"]["advised_blocks"].clone();
        w(
            &mut o,
            format!(
                "\nThe kernel's THP mode: {}; large blocks advised in our run: {} (with `off`: {}).\n",
                s.ours.report["huge_pages"]["thp_mode"]
                    .as_str()
                    .unwrap_or("unavailable"),
                advised(&s.ours),
                advised(ours),
            ),
        );
    }
    if results.iter().any(|s| !s.budgets.is_empty()) {
        w(&mut o, "## Smaller snapshot budgets\n".into());
        w(&mut o, "The same command with `--snapshot-budget-mb` set to a fraction of the state (rounded to MiB). A save is over the budget when what it holds plus the copy of the optimizer record that Burn's encoding makes for a moment would not fit (at 1x the state a save is therefore throttled too). Such a save is *throttled*: it persists in the background and training waits after the submit only until what the save still holds leaves room for that copy within the budget, or holds only the optimizer record where that is more (Burn materializes the record whole, and copies it once more, whatever the route, so no budget below about twice the record can be kept; the trainer warns).\n".into());
        w(&mut o, "| state | budget | throttled saves | stall ms | lost/save s | vs Burn's stall | vs Burn's lost | extra memory |\n|---|---|---|---|---|---|---|---|".into());
        for s in results {
            for (f, r) in &s.budgets {
                w(
                    &mut o,
                    format!(
                        "| {} | {f}x ({}) | {} | {} | {:.2} | {:.2}x | {:.2}x | {} ({:.2}x) |",
                        s.label,
                        mb(s.state as f64 * f),
                        r.report["throttled_saves"]
                            .as_array()
                            .map(|a| a.len())
                            .unwrap_or(0),
                        stats::med_range(&r.stalls_ms()),
                        s.lost_per_save(r),
                        r.stall_median() / s.burn.stall_median(),
                        s.lost_per_save(r) / s.lost_per_save(&s.burn),
                        mb(s.extra_mem(r)),
                        s.extra_mem(r) / s.state as f64
                    ),
                );
            }
        }
        w(&mut o, "".into());
    }
    o
}

/// Runs one CubeCL shape: an unrecorded warm-up (the first wgpu run also compiles the shaders),
/// then every mode of [`CUBECL_RUNS`]. A trainer without wgpu or a machine without Vulkan is
/// said in the report, not fatal.
fn cubecl_runs(
    train: &Path,
    dir: &Path,
    shape: &Shape,
    bar: &indicatif::ProgressBar,
) -> CubeclRuns {
    bar.set_message(format!("{} warm-up", shape.label));
    let warm: Vec<String> = ["--backend", "wgpu", "--save-every", "0", "--steps", "2"]
        .map(String::from)
        .into();
    if let Err(e) = run_trainer(train, dir, shape, "warm-up", &warm) {
        bar.println(format!("{} warm-up failed: {e:#}", shape.label));
    }
    CUBECL_RUNS
        .iter()
        .map(|(mode, flags)| {
            bar.set_message(format!("{} {mode}", shape.label));
            // The trainer takes a flag's last value: a run's own `--save-every` overrides.
            let save_every = shape.save_every.to_string();
            let all: Vec<String> = ["--backend", "wgpu", "--save-every", &save_every]
                .into_iter()
                .chain(flags.iter().copied())
                .map(String::from)
                .collect();
            let r = run_trainer(train, dir, shape, mode, &all).map_err(|e| format!("{e:#}"));
            bar.inc(1);
            (*mode, r)
        })
        .collect()
}

/// One shape of the CubeCL section: per save, the state still held when the next update ran,
/// the wait before it and the device memory the save still held one step later, with and
/// without the wait; stalls and lost time beside Burn's, from the trainers' reports.
fn cubecl_markdown(shape: &Shape, runs: &[(&str, std::result::Result<Run, String>)]) -> String {
    let mut o = format!("### {}\n\n", shape.label);
    let get = |mode: &str| runs.iter().find(|(m, _)| *m == mode).map(|(_, r)| r);
    let (Some(Ok(base)), Some(Ok(ours))) = (get("base"), get("ours")) else {
        for (mode, r) in runs {
            if let Err(e) = r {
                o.push_str(&format!("Not run ({mode}): {e}\n"));
            }
        }
        return o;
    };
    let state = ours.state_bytes().unwrap_or(0).max(1) as f64;
    o.push_str(&format!(
        "`train --backend wgpu --hidden {} --layers {} --steps {} --save-every {}` ({} state).\n\n",
        shape.hidden,
        shape.layers,
        shape.steps,
        shape.save_every,
        mb(state),
    ));
    o.push_str("| run | stall ms, median [range] | lost per save ms | extra peak memory |\n|---|---|---|---|\n");
    o.push_str(&format!(
        "| no checkpoints | - | - | (wall {:.1} s) |\n",
        base.wall_s
    ));
    for (mode, r) in runs.iter().filter(|(m, _)| *m != "base") {
        match r {
            Ok(r) => {
                o.push_str(&format!(
                    "| {mode} | {} | {} | {} |\n",
                    stats::med_range(&r.stalls_ms()),
                    num(1e3 * r.lost_per_save(base.wall_s)),
                    mb(r.peak_mem as f64 - base.peak_mem as f64),
                ));
            }
            Err(e) => o.push_str(&format!(
                "| {mode} | failed: {} | | |\n",
                e.lines().next().unwrap_or("")
            )),
        }
    }
    o.push('\n');
    let mut verdicts = String::new();
    if let Some(Ok(burn)) = get("burn") {
        let (ours_med, burn_med) = (
            stats::median(&ours.stalls_ms()),
            stats::median(&burn.stalls_ms()),
        );
        verdicts.push_str(&format!(
            "- median stall no longer than Burn's (default flags): ours {} ms, Burn's {} ms, {}\n",
            num(ours_med),
            num(burn_med),
            stats::verdict(ours_med <= burn_med),
        ));
    }
    for mode in ["ours", "ours-background", "ours-background-no-wait"] {
        let Some(Ok(r)) = get(mode) else { continue };
        let (table, held_max, extra_max, n) = cubecl_samples(r, state);
        o.push_str(&format!("Per save, {mode}:\n\n{table}\n"));
        if mode == "ours" {
            verdicts += &format!(
                "- extra device memory one step after a save ≤ 10 % of the state (default flags): worst {:.0} %, {}\n- state still held when the next update runs (the issue: at most a few handles; default flags): worst {:.0} %, {}\n",
                100.0 * extra_max / state,
                stats::verdict(n > 0 && extra_max <= 0.10 * state),
                100.0 * held_max / state,
                stats::verdict(n > 0 && held_max <= 0.05 * state),
            );
        }
    }
    o.push_str("A negative extra: the save's step ended with an earlier save's copies still allocated, and they were freed during the next step.\n\n");
    o.push_str(&verdicts);
    o.push('\n');
    o
}

/// One run's per-save table of the CubeCL section, with the worst state held at an update,
/// the worst device extra one step later and the number of samples.
fn cubecl_samples(r: &Run, state: f64) -> (String, f64, f64, usize) {
    let mut o = String::from(
        "| save at step | held at the next update | wait before it ms | device extra one step later |\n|---|---|---|---|\n",
    );
    let samples = r.report["pinned_at_next_update"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let (mut held_max, mut extra_max) = (0f64, f64::MIN);
    for p in &samples {
        let held = p["bytes"].as_f64().unwrap_or(0.0);
        let extra = match (
            p["device_in_use_after"].as_f64(),
            p["device_in_use_before"].as_f64(),
        ) {
            (Some(a), Some(b)) => Some(a - b),
            _ => None,
        };
        held_max = held_max.max(held);
        if let Some(x) = extra {
            extra_max = extra_max.max(x);
        }
        o.push_str(&format!(
            "| {} | {} ({:.0} %) | {} | {} |\n",
            p["save_step"],
            mb(held),
            100.0 * held / state,
            num(p["update_wait_ms"].as_f64().unwrap_or(0.0)),
            extra.map_or("not reported".into(), |x| format!(
                "{} ({:.0} %)",
                mb(x),
                100.0 * x / state
            )),
        ));
    }
    (o, held_max, extra_max, samples.len())
}
