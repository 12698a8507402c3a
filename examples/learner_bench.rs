//! A plain Burn program, as a user writes one: an MLP of `--layers` Linear(`--hidden`,
//! `--hidden`) layers, AdamW, Burn's shuffled `DataLoaderBuilder`, `SupervisedTraining`. With
//! `--mode ours` it adds the README's learner lines (`CkptTrainingStrategy`, saving every
//! `--steps-per-epoch` steps and at each epoch's end); with `--mode burn` Burn's own
//! checkpointer (`with_default_checkpointers`, which saves at each epoch's end: the same
//! steps); with `--mode zero` ZeRO-1 through the learner (`ZeroTrainingStrategy` on `--ranks`
//! rank threads, each reading the whole loader, saving at the same steps; the step times are
//! rank 0's); with `--mode off` no checkpoints. With `--mode custom`, `custom-burn` and
//! `custom-off` the same model and data go through a training loop of its own instead of the
//! learner (forward, backward, `GradientsParams`, `optim.step`): with the README's custom-loop
//! lines (`CheckpointManager`: open, resume, `step` after each update, finish), with Burn's
//! own checkpointer as such a loop would use it (`AsyncCheckpointer` over `FileCheckpointer`
//! for the model, optimizer and scheduler records, keeping 2 like Burn's learner), or without
//! checkpoints. `bench_defaults` runs it for the report's learner and custom-loop sections; it writes `--report FILE.json`: the wall time (to the last save durable), the
//! time at which each training step started (gaps spanning a save, against the same gaps of a
//! run without checkpoints, are that save's stall), the steps saved.
//!
//! ```text
//! cargo run --release --example learner_bench -- --mode ours --hidden 1024 --layers 8
//! ```

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::{Context, Result};
use burn::data::dataloader::batcher::Batcher;
use burn::data::dataloader::{DataLoader, DataLoaderBuilder};
use burn::data::dataset::InMemDataset;
use burn::module::Module;
use burn::nn::loss::{MseLoss, Reduction};
use burn::nn::{Linear, LinearConfig, Relu};
use burn::optim::lr_scheduler::LrSchedulerRecord;
use burn::optim::lr_scheduler::cosine::CosineAnnealingLrSchedulerConfig;
use burn::optim::lr_scheduler::module_lr_scheduler::ModuleLrScheduler;
use burn::optim::{AdamWConfig, GradientsParams, ModuleOptimizer, OptimizerRecord};
use burn::store::ModuleRecord;
use burn::tensor::{Device, Tensor};
use burn::train::checkpoint::{AsyncCheckpointer, Checkpointer, FileCheckpointer};
use burn::train::{
    InferenceStep, Learner, RegressionOutput, SupervisedTraining, TrainOutput, TrainStep,
};
use burn_ckpt::ckpt_burn::checkpointers::CkptCheckpointers;
use burn_ckpt::ckpt_burn::strategy::CkptTrainingStrategy;
use burn_ckpt::ckpt_burn::{SaveTuning, UpdateWait};
use burn_ckpt::ckpt_core::{EngineConfig, FrequencyPolicy, Retention};
use burn_ckpt::ckpt_zero::MemoryTier;
use burn_ckpt::ckpt_zero::strategy::ZeroTrainingStrategy;
use burn_ckpt::{CheckpointManager, DataCursor, ManagerConfig};
use clap::Parser;

/// Flags.
#[derive(Parser, Debug)]
struct Args {
    /// `ours` (the README's learner lines), `ours-epoch` (the same with
    /// `FrequencyPolicy::Never`: epoch ends only), `burn` (Burn's checkpointer), `zero`
    /// (`ZeroTrainingStrategy`), `zero-off` (its ranks without checkpoints), `off`; or a loop of
    /// its own: `custom` (the README's custom-loop lines), `custom-burn` (Burn's checkpointer),
    /// `custom-off`.
    #[arg(long, default_value = "ours")]
    mode: String,
    /// `--mode ours` and `zero`: whether an update waits for the save to give the learner's
    /// state back (`auto`, the default: on these routes always; `always`; `never`). For
    /// comparisons.
    #[arg(long, default_value = "auto")]
    update_wait: String,
    /// Rank threads of `--mode zero` and `zero-off`.
    #[arg(long, default_value_t = 1)]
    ranks: usize,
    /// `--mode zero`: the memory tier's node-local directory (`{node}`: the node index).
    #[arg(long)]
    memory_tier: Option<PathBuf>,
    /// `--mode zero`: steps between two memory saves, at the most.
    #[arg(long, default_value_t = 1)]
    memory_every: u64,
    /// `--mode zero`: the memory tier's overhead budget (a fraction, or `off`).
    #[arg(long, default_value = "0.05")]
    memory_budget: String,
    /// `--mode zero`: ranks per simulated node of the memory tier.
    #[arg(long, default_value_t = 1)]
    ranks_per_node: usize,
    /// Width of each layer.
    #[arg(long, default_value_t = 1024)]
    hidden: usize,
    /// Linear layers.
    #[arg(long, default_value_t = 8)]
    layers: usize,
    /// Epochs (one save at the end of each).
    #[arg(long, default_value_t = 4)]
    epochs: usize,
    /// Optimizer steps per epoch (batches of 8).
    #[arg(long, default_value_t = 8)]
    steps_per_epoch: usize,
    /// Where the run writes (its checkpoints, Burn's logs).
    #[arg(long, default_value = "runs/learner-bench")]
    dir: PathBuf,
    /// The JSON report.
    #[arg(long)]
    report: Option<PathBuf>,
    /// Back large blocks with transparent huge pages (`ckpt_alloc::HugePages`, the one line a
    /// program adds to opt in). Off by default: a plain Burn program uses the system
    /// allocator. For comparisons.
    #[arg(long)]
    huge_pages: bool,
}

/// The allocator a program opts into with one line; advice off unless `--huge-pages`.
#[global_allocator]
static ALLOC: burn_ckpt::ckpt_alloc::HugePages = burn_ckpt::ckpt_alloc::HugePages::new();

/// When each training step started (on the thread that launched training: rank 0 of
/// `--mode zero`).
static STEP_STARTS: Mutex<Vec<Instant>> = Mutex::new(Vec::new());

std::thread_local! {
    /// Whether this thread records its step starts.
    static RECORDS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Layers of Linear(hidden, hidden) with ReLUs between.
#[derive(Module, Debug)]
struct Mlp {
    layers: Vec<Linear>,
    act: Relu,
}

#[derive(Clone, Debug)]
struct Batch {
    x: Tensor<2>,
    y: Tensor<2>,
}

#[derive(Clone, Debug)]
struct Rows(usize);

impl Batcher<Vec<f32>, Batch> for Rows {
    fn batch(&self, items: Vec<Vec<f32>>, device: &Device) -> Batch {
        let n = items.len();
        let flat: Vec<f32> = items.into_iter().flatten().collect();
        let x = Tensor::<1>::from_floats(flat.as_slice(), device).reshape([n, self.0]);
        Batch {
            y: x.clone().sin(),
            x,
        }
    }
}

impl Mlp {
    fn new(hidden: usize, layers: usize, device: &Device) -> Self {
        Self {
            layers: (0..layers)
                .map(|_| LinearConfig::new(hidden, hidden).init(device))
                .collect(),
            act: Relu::new(),
        }
    }

    fn regress(&self, b: Batch) -> RegressionOutput {
        let mut h = b.x;
        let last = self.layers.len().saturating_sub(1);
        for (i, l) in self.layers.iter().enumerate() {
            h = l.forward(h);
            if i < last {
                h = self.act.forward(h);
            }
        }
        let loss = MseLoss::new().forward(h.clone(), b.y.clone(), Reduction::Mean);
        RegressionOutput::new(loss, h, b.y)
    }
}

impl TrainStep for Mlp {
    type Input = Batch;
    type Output = RegressionOutput;
    fn step(&self, b: Batch) -> TrainOutput<RegressionOutput> {
        step_started();
        let o = self.regress(b);
        TrainOutput::new(self, o.loss.backward(), o)
    }
}

impl InferenceStep for Mlp {
    type Input = Batch;
    type Output = RegressionOutput;
    fn step(&self, b: Batch) -> RegressionOutput {
        self.regress(b)
    }
}

fn samples(n: usize, hidden: usize) -> Vec<Vec<f32>> {
    (0..n)
        .map(|i| {
            (0..hidden)
                .map(|j| ((i * 31 + j * 7) % 97) as f32 / 97.0 - 0.5)
                .collect()
        })
        .collect()
}

/// Records that a training step starts (on a thread that records them).
fn step_started() {
    if RECORDS.get() {
        STEP_STARTS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Instant::now());
    }
}

/// A training loop of the program's own, `steps` optimizer steps over Burn's loader, saving
/// every `every` steps and the last: `custom` with the README's custom-loop lines,
/// `custom-burn` with Burn's checkpointer, `custom-off` without checkpoints.
#[allow(clippy::too_many_arguments)]
fn custom_loop(
    mode: &str,
    dir: &std::path::Path,
    mut model: Mlp,
    mut optim: ModuleOptimizer,
    mut sched: ModuleLrScheduler,
    train: &Arc<dyn DataLoader<Batch>>,
    steps: u64,
    every: u64,
) -> Result<()> {
    let mut burn = (mode == "custom-burn").then(|| BurnCheckpointers::new(&dir.join("checkpoint")));
    // The README's custom-loop lines: open and resume here, `step` in the loop, `finish` after.
    let mut ckpt = if mode == "custom" {
        let mut ckpt = CheckpointManager::open(
            ManagerConfig::new(dir.join("ckpt"))
                .every_steps(every)
                .end_step(steps),
        )?;
        let start = ckpt
            .resume(&mut model, &mut optim, &mut sched)?
            .map_or(0, |t| t.step);
        anyhow::ensure!(
            start == 0,
            "{} held a checkpoint (step {start})",
            dir.display()
        );
        Some(ckpt)
    } else {
        None
    };
    let mut step = 0;
    'epochs: while step < steps {
        for batch in train.iter() {
            let batch = batch.map_err(|e| anyhow::anyhow!("the training data: {e}"))?;
            step += 1;
            step_started();
            let o = model.regress(batch);
            let grads = GradientsParams::from_grads(o.loss.backward(), &model);
            let lr = sched.step();
            model = optim.step(lr, model, grads);
            if let Some(ckpt) = &mut ckpt {
                if ckpt.step(step, &model, &optim, &sched, DataCursor::default())? {
                    break 'epochs;
                }
            } else if let Some(burn) = &mut burn
                && (step % every == 0 || step == steps)
            {
                burn.save(step, &model, &optim, &sched)?;
            }
            if step == steps {
                break 'epochs;
            }
        }
    }
    if let Some(ckpt) = ckpt {
        ckpt.finish()?;
    }
    // Dropping Burn's checkpointers waits for their writes.
    drop(burn);
    Ok(())
}

/// Burn's checkpointers as a loop of one's own would use them: the records built on the
/// training thread, written by Burn's threads, the newest 2 kept (Burn's learner's default).
struct BurnCheckpointers {
    model: AsyncCheckpointer<ModuleRecord>,
    optim: AsyncCheckpointer<OptimizerRecord>,
    sched: AsyncCheckpointer<LrSchedulerRecord>,
    saved: Vec<usize>,
}

impl BurnCheckpointers {
    fn new(dir: &std::path::Path) -> Self {
        Self {
            model: AsyncCheckpointer::new(FileCheckpointer::new(dir, "model")),
            optim: AsyncCheckpointer::new(FileCheckpointer::new(dir, "optim")),
            sched: AsyncCheckpointer::new(FileCheckpointer::new(dir, "scheduler")),
            saved: Vec::new(),
        }
    }

    fn save(
        &mut self,
        step: u64,
        model: &Mlp,
        optim: &ModuleOptimizer,
        sched: &ModuleLrScheduler,
    ) -> Result<()> {
        let s = step as usize;
        self.model.save(s, model.clone().into_record())?;
        self.optim.save(s, optim.to_record())?;
        self.sched.save(s, sched.to_record())?;
        self.saved.push(s);
        if self.saved.len() > 2 {
            let old = self.saved.remove(0);
            self.model.delete(old)?;
            self.optim.delete(old)?;
            self.sched.delete(old)?;
        }
        Ok(())
    }
}

/// Sends the libraries' events to stderr: level `warn` by default, `RUST_LOG` overrides (for
/// example `RUST_LOG=ckpt_burn=info` for each save's stall and persist time).
fn install_log_subscriber() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .try_init();
}

fn main() -> Result<()> {
    let args = Args::parse();
    ALLOC.set_enabled(args.huge_pages);
    install_log_subscriber();
    RECORDS.set(true);
    let t0 = Instant::now();
    let device = Device::flex().autodiff();
    let batch = 8;
    let train = DataLoaderBuilder::new(Rows(args.hidden))
        .batch_size(batch)
        .shuffle(7)
        .build(InMemDataset::new(samples(
            batch * args.steps_per_epoch,
            args.hidden,
        )));
    // The learner moves its loaders to the model's device; the custom loop takes this one,
    // which would otherwise yield batches on the default device (wgpu where it is built in).
    let train_loader = train.to_device(&device);
    let valid = DataLoaderBuilder::new(Rows(args.hidden))
        .batch_size(batch)
        .build(InMemDataset::new(samples(batch, args.hidden)));
    let model = Mlp::new(args.hidden, args.layers, &device);
    let params = model.num_params();
    let scheduler = CosineAnnealingLrSchedulerConfig::new(1e-4, 1000)
        .init()
        .map_err(anyhow::Error::msg)?;
    let learner = Learner::new(model, AdamWConfig::new().init(), scheduler);
    let _ = std::fs::remove_dir_all(&args.dir);
    let training = SupervisedTraining::new(args.dir.join("burn"), train, valid)
        .with_application_logger(None)
        .num_epochs(args.epochs);
    let every = args.steps_per_epoch as u64;
    let mut rank0 = None;
    let wait = match args.update_wait.as_str() {
        "auto" => UpdateWait::Auto,
        "always" => UpdateWait::Always,
        "never" => UpdateWait::Never,
        other => anyhow::bail!("--update-wait {other}: auto, always or never"),
    };
    match args.mode.as_str() {
        "ours" | "ours-epoch" => {
            // The README's learner lines (`ours-epoch`: with `FrequencyPolicy::Never`, saving at
            // each epoch's end after validation, as Burn's checkpointer does).
            let policy = if args.mode == "ours" {
                FrequencyPolicy::EverySteps(every)
            } else {
                FrequencyPolicy::Never
            };
            let config =
                EngineConfig::new(args.dir.join("ckpt")).retention(Retention::keep_last(3));
            let ckpt = CkptCheckpointers::open(config)?;
            let result = training
                .with_training_strategy(
                    CkptTrainingStrategy::new(device.clone(), &ckpt, policy)
                        .resume_latest()
                        .deterministic(42)
                        .tuning(SaveTuning::default().update_wait(wait))
                        .into_training_strategy(),
                )
                .launch(learner);
            ckpt.finish()?;
            if let Some(e) = result.error {
                anyhow::bail!("training failed: {e}");
            }
        }
        "burn" => {
            let result = training.with_default_checkpointers().launch(learner);
            if let Some(e) = result.error {
                anyhow::bail!("training failed: {e}");
            }
        }
        "zero" | "zero-off" => {
            let policy = match args.mode.as_str() {
                "zero" => FrequencyPolicy::EverySteps(every),
                _ => FrequencyPolicy::Never,
            };
            let mut zero = ZeroTrainingStrategy::new(
                device.clone(),
                args.ranks,
                EngineConfig::new(args.dir.join("ckpt")).retention(Retention::keep_last(3)),
                policy,
            )?
            .replicate_data(true)
            .tuning(SaveTuning::default().update_wait(wait))
            .seed(42);
            if let Some(dir) = &args.memory_tier {
                // docs/memory-tier.md's learner lines.
                let tier =
                    MemoryTier::new(dir, args.memory_every).ranks_per_node(args.ranks_per_node);
                zero = zero.memory_tier(match args.memory_budget.as_str() {
                    "off" => tier.no_budget(),
                    f => tier.budget(f.parse().context("--memory-budget: a fraction or off")?),
                });
            }
            let reports = zero.reports();
            let result = training
                .with_training_strategy(zero.into_training_strategy())
                .launch(learner);
            if let Some(e) = result.error {
                anyhow::bail!("training failed: {e}");
            }
            rank0 = reports.rank(0);
        }
        "off" => {
            let result = training.launch(learner);
            if let Some(e) = result.error {
                anyhow::bail!("training failed: {e}");
            }
        }
        "custom" | "custom-burn" | "custom-off" => {
            drop(training);
            let sched: ModuleLrScheduler = CosineAnnealingLrSchedulerConfig::new(1e-4, 1000)
                .init()
                .map_err(anyhow::Error::msg)?;
            let steps = (args.epochs * args.steps_per_epoch) as u64;
            custom_loop(
                &args.mode,
                &args.dir,
                Mlp::new(args.hidden, args.layers, &device),
                AdamWConfig::new().init(),
                sched,
                &train_loader,
                steps,
                every,
            )?;
        }
        other => anyhow::bail!(
            "--mode {other}: ours, ours-epoch, burn, zero, zero-off, off, custom, custom-burn or custom-off"
        ),
    }
    let wall_s = t0.elapsed().as_secs_f64();
    let starts = STEP_STARTS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let step_starts_s: Vec<f64> = starts
        .iter()
        .map(|t| t.duration_since(t0).as_secs_f64())
        .collect();
    // Every route saves at each epoch's last step (the custom loop's every `steps_per_epoch`
    // steps and the last are the same steps).
    let saved: Vec<usize> = if args.mode.ends_with("off") {
        Vec::new()
    } else {
        (1..=args.epochs)
            .map(|e| e * args.steps_per_epoch)
            .collect()
    };
    let report = serde_json::json!({
        "mode": args.mode,
        "params": params,
        "state_bytes": params * 12,
        "wall_s": wall_s,
        "step_starts_s": step_starts_s,
        "steps_per_epoch": args.steps_per_epoch,
        "saved_steps": saved,
        "memory_tier": rank0.as_ref().and_then(|r| r.memory.as_ref()),
        "disk_stall_ms": rank0.as_ref().map(|r| r.session.saves.iter().map(|s| s.stall_ms).collect::<Vec<_>>()),
    });
    // What the run left in its checkpoint directory (ours: `ckpt`, Burn's: `burn/checkpoint`
    // or, for the custom loop, `checkpoint`): a check that the saves happened.
    let written: Vec<String> = ["ckpt", "checkpoint", "burn/checkpoint"]
        .iter()
        .filter_map(|d| std::fs::read_dir(args.dir.join(d)).ok())
        .flatten()
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect();
    let mut report = report;
    report["written"] = serde_json::json!(written);
    if let Some(path) = &args.report {
        std::fs::write(path, serde_json::to_vec_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    let _ = std::fs::remove_dir_all(&args.dir);
    println!("{report}");
    Ok(())
}
