//! The example trainer: an MLP with dropout, AdamW and a cosine LR schedule on a deterministic
//! synthetic dataset, checkpointed with burn-ckpt at optimizer-step boundaries.
//!
//! ```text
//! cargo run --example train -- --dir runs/demo --steps 200 --save-every 25
//! cargo run --example train -- --dir runs/demo --steps 400 --resume
//! ```
//!
//! Flags are described in DESIGN.md ("Example trainer"). Exit status 0 on success, non-zero
//! with a one-line reason on stderr otherwise.

use std::{io::IsTerminal, path::PathBuf, process::ExitCode};

use anyhow::{Context, bail};
use burn_ckpt::ckpt_burn::demo::{Backend, DemoConfig, Frequency, SaveMode, StepInfo, run};
use clap::{Parser, ValueEnum};

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Mode {
    Async,
    Sync,
    Burn,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum BackendArg {
    Flex,
    Wgpu,
    Cuda,
}

/// Train a small MLP with non-stalling, crash-safe checkpoints.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// Checkpoint root.
    #[arg(long, default_value = "runs/train")]
    dir: PathBuf,
    /// Base seed (weights, ParamIds, data order, dropout).
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Global step the run ends at (a resumed run continues up to it).
    #[arg(long, default_value_t = 200)]
    steps: u64,
    /// Hidden width.
    #[arg(long, default_value_t = 256)]
    hidden: usize,
    /// Hidden layers.
    #[arg(long, default_value_t = 2)]
    layers: usize,
    /// Samples per batch.
    #[arg(long, default_value_t = 32)]
    batch_size: usize,
    /// Samples per epoch.
    #[arg(long, default_value_t = 1000)]
    dataset_size: usize,
    /// Checkpoint every N steps (0 disables checkpointing).
    #[arg(long, conflicts_with = "overhead_budget")]
    save_every: Option<u64>,
    /// Checkpoint as often as keeps the overhead under this fraction (e.g. 0.02).
    #[arg(long)]
    overhead_budget: Option<f64>,
    /// Keep only the newest K checkpoints.
    #[arg(long)]
    keep_last: Option<usize>,
    /// async: our pipeline; sync: our blocking path (same bytes); burn: Burn's checkpointer.
    #[arg(long, value_enum, default_value_t = Mode::Async)]
    save_mode: Mode,
    /// Continue from the newest valid checkpoint in --dir, if there is one.
    #[arg(long)]
    resume: bool,
    /// A fresh start takes its model (ParamIds included) from this checkpoint directory.
    #[arg(long)]
    init_from: Option<PathBuf>,
    /// Abort the process right after step N's update (and its checkpoint submit).
    #[arg(long)]
    abort_at_step: Option<u64>,
    /// Compute backend.
    #[arg(long, value_enum, default_value_t = BackendArg::Flex)]
    backend: BackendArg,
    /// Write a JSON report here.
    #[arg(long)]
    report: Option<PathBuf>,
}

fn backend(b: BackendArg) -> anyhow::Result<Backend> {
    match b {
        BackendArg::Flex => Ok(Backend::Flex),
        #[cfg(feature = "wgpu")]
        BackendArg::Wgpu => Ok(Backend::Wgpu),
        #[cfg(not(feature = "wgpu"))]
        BackendArg::Wgpu => bail!("--backend wgpu needs a build with `--features wgpu`"),
        BackendArg::Cuda => bail!("--backend cuda is not supported by this trainer yet"),
    }
}

fn main_inner() -> anyhow::Result<()> {
    let args = Args::parse();
    let mut cfg = DemoConfig::new(&args.dir);
    cfg.seed = args.seed;
    cfg.steps = args.steps;
    cfg.hidden = args.hidden;
    cfg.layers = args.layers;
    cfg.batch_size = args.batch_size;
    cfg.dataset_size = args.dataset_size;
    cfg.keep_last = args.keep_last;
    cfg.frequency = match (args.save_every, args.overhead_budget) {
        (_, Some(f)) => Frequency::OverheadBudget(f),
        (Some(n), None) => Frequency::EverySteps(n),
        (None, None) => Frequency::EverySteps(25),
    };
    cfg.save_mode = match args.save_mode {
        Mode::Async => SaveMode::Async,
        Mode::Sync => SaveMode::Sync,
        Mode::Burn => SaveMode::Burn,
    };
    cfg.resume = args.resume;
    cfg.init_from = args.init_from;
    cfg.abort_at_step = args.abort_at_step;
    cfg.backend = backend(args.backend)?;

    let tty = std::io::stderr().is_terminal();
    let bar = tty.then(|| {
        let b = indicatif::ProgressBar::new(cfg.steps);
        b.set_style(
            indicatif::ProgressStyle::with_template(
                "{bar:40} {pos}/{len} [{elapsed_precise}<{eta_precise}] {msg}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        b
    });
    let every = (cfg.steps / 20).max(1);
    let mut on_step = |s: &StepInfo| match &bar {
        Some(b) => {
            b.set_position(s.step);
            b.set_message(format!(
                "epoch {} loss {:.4} saved {} in-flight {}",
                s.epoch, s.loss, s.published, s.in_flight
            ));
        }
        None => {
            if s.step.is_multiple_of(every) || s.step == s.steps {
                eprintln!(
                    "step {}/{} epoch {} loss {:.4} saved {} in-flight {}",
                    s.step, s.steps, s.epoch, s.loss, s.published, s.in_flight
                );
            }
        }
    };
    let report = run(&cfg, &mut on_step).context("training failed")?;
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    let stall: f64 = report.saves.iter().map(|s| s.stall_ms).sum();
    eprintln!(
        "done: steps {}..{} in {:.1}s, {} checkpoints, total stall {:.2} ms{}",
        report.start_step,
        report.final_step,
        report.wall_s,
        report.saves.len(),
        stall,
        report
            .resumed_from
            .as_ref()
            .map(|p| format!(", resumed from {}", p.display()))
            .unwrap_or_default()
    );
    if let Some(path) = &args.report {
        let json = serde_json::to_vec_pretty(&report).context("encoding the report")?;
        std::fs::write(path, json)
            .with_context(|| format!("writing the report to {}", path.display()))?;
    }
    Ok(())
}

fn main() -> ExitCode {
    match main_inner() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One line; skip causes already contained in the message before them.
            let mut line = String::new();
            for cause in e.chain().map(|c| c.to_string()) {
                if !line.ends_with(&cause) {
                    if !line.is_empty() {
                        line.push_str(": ");
                    }
                    line.push_str(&cause);
                }
            }
            eprintln!("error: {line}");
            ExitCode::FAILURE
        }
    }
}
