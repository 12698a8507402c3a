//! The example trainer: a small MLP with dropout, AdamW and a cosine LR schedule on a
//! deterministic synthetic regression dataset, checkpointed at optimizer-step boundaries.
//!
//! This is the logic behind `cargo run --example train` (which only parses flags, draws a
//! progress bar and writes the report), kept in the library so end-to-end tests run exactly
//! the same code. The training loop owns the model, the [`ModuleOptimizer`] and the
//! [`ModuleLrScheduler`] (Burn's `Learner` keeps the optimizer and scheduler private and offers
//! no step hook), and follows the built-in single-device loop's order: batch, forward and
//! backward, scheduler step, optimizer step.
//!
//! Exact resume: the backend RNG is re-seeded from `(seed, step)` before every step, the data
//! order is a pure function of `(seed, epoch)`, ParamIds are derived from the seed, and the
//! checkpoint holds the model, optimizer, scheduler and data cursor of the same boundary. A run
//! aborted anywhere and resumed to step N writes the same bytes as an uninterrupted run to N.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::InMemDataset;
use burn::module::Module;
use burn::nn::loss::{MseLoss, Reduction};
use burn::nn::{Dropout, DropoutConfig, Linear, LinearConfig, Relu};
use burn::optim::lr_scheduler::cosine::CosineAnnealingLrSchedulerConfig;
use burn::optim::lr_scheduler::module_lr_scheduler::ModuleLrScheduler;
use burn::optim::{AdamWConfig, GradientsParams, ModuleOptimizer};
use burn::store::ModuleRecord;
use burn::tensor::{Device, Tensor};
use burn::train::checkpoint::{AsyncCheckpointer, Checkpointer, FileCheckpointer};
use ckpt_core::{
    Backpressure, Engine, EngineConfig, FrequencyController, FrequencyPolicy, Retention, SaveEvent,
    SubmitOutcome,
};
use serde::Serialize;

use crate::{
    Error, FrozenState, Result, ResumableDataLoader, SaveMemory, SaveRoute, TrainerState,
    assign_param_ids, load_model, mix_seed, restore, step_seed,
};

/// Input features of the synthetic dataset.
pub const INPUT_DIM: usize = 16;
/// Iterations of the cosine schedule (fixed, so a resumed run with a larger `--steps`
/// continues the same curve).
pub const SCHEDULE_ITERS: usize = 2000;

/// The MLP: `layers` hidden `Linear + ReLU` blocks, dropout, and a linear head.
#[derive(Module, Debug)]
pub struct Mlp {
    layers: Vec<Linear>,
    act: Relu,
    dropout: Dropout,
    head: Linear,
}

impl Mlp {
    /// A freshly initialized model; weights come from the device RNG, so seed it first.
    pub fn new(hidden: usize, layers: usize, dropout: f64, device: &Device) -> Self {
        let mut v = Vec::with_capacity(layers);
        let mut d_in = INPUT_DIM;
        for _ in 0..layers.max(1) {
            v.push(LinearConfig::new(d_in, hidden).init(device));
            d_in = hidden;
        }
        Self {
            layers: v,
            act: Relu::new(),
            dropout: DropoutConfig::new(dropout).init(),
            head: LinearConfig::new(d_in, 1).init(device),
        }
    }

    /// Forward pass: `[batch, INPUT_DIM] -> [batch, 1]`.
    pub fn forward(&self, mut x: Tensor<2>) -> Tensor<2> {
        for l in &self.layers {
            x = self.act.forward(l.forward(x));
        }
        self.head.forward(self.dropout.forward(x))
    }
}

/// One sample of the synthetic dataset.
#[derive(Debug, Clone)]
pub struct Sample {
    x: [f32; INPUT_DIM],
    y: f32,
}

/// A batch on a device.
#[derive(Debug, Clone)]
pub struct Batch {
    /// Inputs `[n, INPUT_DIM]`.
    pub x: Tensor<2>,
    /// Targets `[n, 1]`.
    pub y: Tensor<2>,
}

/// Builds [`Batch`]es.
#[derive(Debug, Clone, Copy)]
pub struct SampleBatcher;

impl Batcher<Sample, Batch> for SampleBatcher {
    fn batch(&self, items: Vec<Sample>, device: &Device) -> Batch {
        let n = items.len();
        let xs: Vec<f32> = items.iter().flat_map(|s| s.x).collect();
        let ys: Vec<f32> = items.iter().map(|s| s.y).collect();
        Batch {
            x: Tensor::<1>::from_floats(xs.as_slice(), device).reshape([n, INPUT_DIM]),
            y: Tensor::<1>::from_floats(ys.as_slice(), device).reshape([n, 1]),
        }
    }
}

/// The deterministic synthetic dataset: `n` samples, a smooth nonlinear target.
pub fn synthetic_dataset(n: usize, seed: u64) -> Vec<Sample> {
    (0..n)
        .map(|i| {
            let mut x = [0f32; INPUT_DIM];
            for (j, v) in x.iter_mut().enumerate() {
                let r = mix_seed(&[seed, i as u64, j as u64]);
                *v = (r >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
            }
            let s: f32 = x
                .iter()
                .enumerate()
                .map(|(j, v)| v * ((j % 5) as f32 - 2.0))
                .sum();
            Sample {
                x,
                y: s.sin() + 0.1 * x[0] * x[1],
            }
        })
        .collect()
}

/// How checkpoints are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SaveMode {
    /// Handle-clone snapshot, encoded and persisted on the background thread.
    Async,
    /// The same bytes, encoded and persisted while the trainer waits.
    Sync,
    /// Burn's own `AsyncCheckpointer<FileCheckpointer>` (records built on the trainer
    /// thread), at the same steps, into `DIR/checkpoint/{model,optim,scheduler}-<step>.bpk`.
    Burn,
}

/// When to checkpoint.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Frequency {
    /// Every N steps; 0 disables checkpointing.
    EverySteps(u64),
    /// As often as keeps the overhead under this fraction.
    OverheadBudget(f64),
}

/// What the trainer does when a checkpoint fails to persist (disk full, I/O error).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SaveErrorPolicy {
    /// Stop training and return the error (it names the step and the file).
    #[default]
    Stop,
    /// Count the failed save in [`DemoReport::failed_saves`] and keep training; later saves
    /// are attempted as usual. A failure of the run's final checkpoint still stops the run
    /// with the error, since nothing would be left to resume the last steps from.
    Continue,
}

/// The compute backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// Burn's pure-Rust CPU backend.
    Flex,
    /// CubeCL through wgpu (feature `wgpu`).
    #[cfg(feature = "wgpu")]
    Wgpu,
}

impl Backend {
    /// The device for this backend.
    pub fn device(self) -> Device {
        match self {
            Backend::Flex => Device::flex(),
            #[cfg(feature = "wgpu")]
            Backend::Wgpu => Device::wgpu(burn::tensor::DeviceKind::DefaultDevice),
        }
    }
}

/// Configuration of a demo run (the example's flags).
#[derive(Debug, Clone)]
pub struct DemoConfig {
    /// Checkpoint root.
    pub dir: PathBuf,
    /// Base seed (weights, ParamIds, data order, dropout).
    pub seed: u64,
    /// Global step the run ends at.
    pub steps: u64,
    /// Hidden width.
    pub hidden: usize,
    /// Hidden layers.
    pub layers: usize,
    /// Samples per batch.
    pub batch_size: usize,
    /// Samples in the dataset (an epoch).
    pub dataset_size: usize,
    /// Dropout probability.
    pub dropout: f64,
    /// Peak learning rate.
    pub lr: f64,
    /// When to checkpoint.
    pub frequency: Frequency,
    /// Keep only the newest K checkpoints.
    pub keep_last: Option<usize>,
    /// How to write checkpoints.
    pub save_mode: SaveMode,
    /// Continue from the newest valid checkpoint in `dir`, if any.
    pub resume: bool,
    /// A fresh start takes its model (ParamIds included) from this checkpoint.
    pub init_from: Option<PathBuf>,
    /// `std::process::abort()` after this step's update (and its checkpoint submit, if any).
    pub abort_at_step: Option<u64>,
    /// Backend.
    pub backend: Backend,
    /// Cooperative stop request (e.g. set by a SIGTERM handler). Checked at every step
    /// boundary: once set, the run checkpoints the step just completed (unless checkpointing
    /// is off), waits for it to be durable (bounded by `grace_period`) and returns with
    /// [`DemoReport::stopped`] filled in.
    pub stop: Option<Arc<AtomicBool>>,
    /// Longest wait for the final checkpoint after a stop request (`None`: wait as long as it
    /// takes). When it runs out, `run` returns at once with [`StopOutcome::GraceExpired`];
    /// the unfinished save keeps going on a background thread until the process exits.
    pub grace_period: Option<Duration>,
    /// What to do when a checkpoint fails to persist.
    pub on_save_error: SaveErrorPolicy,
    /// Checkpoints persisting at once (the engine's bound; at least 1).
    pub max_in_flight: usize,
    /// What a save does when `max_in_flight` are already persisting.
    pub backpressure: Backpressure,
    /// Extra memory (bytes) a save may take: saves whose background peak (held handle clones
    /// plus Burn's optimizer record, see [`crate::SaveMemory`]) would exceed it are written
    /// while the trainer waits instead (`None`: no limit, every save in the background).
    pub snapshot_budget: Option<u64>,
}

impl DemoConfig {
    /// Defaults (a couple of minutes at most on a CPU) for root `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            seed: 42,
            steps: 200,
            hidden: 256,
            layers: 2,
            batch_size: 32,
            dataset_size: 1000,
            dropout: 0.1,
            lr: 1e-3,
            frequency: Frequency::EverySteps(25),
            keep_last: Some(3),
            save_mode: SaveMode::Async,
            resume: false,
            init_from: None,
            abort_at_step: None,
            backend: Backend::Flex,
            stop: None,
            grace_period: None,
            on_save_error: SaveErrorPolicy::Stop,
            max_in_flight: 1,
            backpressure: Backpressure::Block,
            snapshot_budget: None,
        }
    }

    fn checkpointing(&self) -> bool {
        !matches!(self.frequency, Frequency::EverySteps(0))
    }
}

/// One checkpoint in the report.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct SaveRecord {
    /// Step.
    pub step: u64,
    /// Time the training thread was blocked by this save.
    pub stall_ms: f64,
    /// Time writing and publishing took (`null` for Burn's checkpointer, which reports none).
    pub persist_ms: Option<f64>,
    /// Bytes written.
    pub bytes: u64,
    /// Part of `stall_ms` spent waiting for a free persist slot (backpressure `block`).
    pub blocked_ms: f64,
}

/// A checkpoint that failed to persist (kept going under [`SaveErrorPolicy::Continue`]).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct FailedSave {
    /// Step of the failed checkpoint.
    pub step: Option<u64>,
    /// The error, naming the step, the protocol stage and the file.
    pub error: String,
}

/// How a stopped run ended.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum StopOutcome {
    /// The checkpoint of the stop step (and every earlier one) is durable and published.
    Saved,
    /// The grace period ran out before the final checkpoint was durable; the checkpoints
    /// published before it are intact.
    GraceExpired,
    /// Checkpointing is off: nothing was saved.
    NotSaved,
}

/// Why and where a run stopped before its last step (a stop request, e.g. SIGTERM).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct StopReport {
    /// Step boundary the run stopped at (its checkpoint is the final one).
    pub step: u64,
    /// Whether the final checkpoint was made durable in time.
    pub outcome: StopOutcome,
    /// Time spent waiting for in-flight checkpoints after the stop.
    pub wait_ms: f64,
}

/// What a run did (written as JSON by `--report`).
#[derive(Debug, Clone, Serialize, Default)]
pub struct DemoReport {
    /// Checkpoints, by step.
    pub saves: Vec<SaveRecord>,
    /// Time of each training step (without checkpoint stalls), in milliseconds.
    pub step_ms: Vec<f64>,
    /// Wall time of the run.
    pub wall_s: f64,
    /// Save interval in steps in force at the end.
    pub interval: Option<u64>,
    /// Step the run started after (0 for a fresh start).
    pub start_step: u64,
    /// Step the run ended at.
    pub final_step: u64,
    /// Checkpoint the run resumed from.
    pub resumed_from: Option<PathBuf>,
    /// Loss of the last step.
    pub final_loss: Option<f32>,
    /// Save mode.
    pub save_mode: Option<SaveMode>,
    /// Checkpoints dropped by the `skip` backpressure policy.
    pub skipped: u64,
    /// Steps saved blocking (the trainer waited for the persist) because a background save
    /// would have exceeded `snapshot_budget`.
    pub blocking_saves: Vec<u64>,
    /// Checkpoints that failed to persist (only under [`SaveErrorPolicy::Continue`]).
    pub failed_saves: Vec<FailedSave>,
    /// Total time saves waited for a free persist slot (backpressure `block`).
    pub blocked_ms: f64,
    /// Configured bound on checkpoints persisting at once.
    pub max_in_flight: usize,
    /// Most checkpoints seen persisting at once (sampled after every submit and step).
    pub max_in_flight_seen: usize,
    /// Backpressure policy in force.
    pub backpressure: Option<Backpressure>,
    /// Set when a stop request ended the run early.
    pub stopped: Option<StopReport>,
}

/// Progress information passed to the callback after every step.
#[derive(Debug, Clone, Copy)]
pub struct StepInfo {
    /// Step just completed.
    pub step: u64,
    /// Step the run ends at.
    pub steps: u64,
    /// Epoch of the step's batch.
    pub epoch: u64,
    /// Loss of the step.
    pub loss: f32,
    /// Checkpoints published so far in this run.
    pub published: usize,
    /// Checkpoints being persisted now.
    pub in_flight: usize,
}

struct BurnCheckpointers {
    model: AsyncCheckpointer<ModuleRecord>,
    optim: AsyncCheckpointer<burn::optim::OptimizerRecord>,
    sched: AsyncCheckpointer<burn::optim::lr_scheduler::LrSchedulerRecord>,
    dir: PathBuf,
    saved: Vec<u64>,
}

impl BurnCheckpointers {
    fn new(root: &Path) -> Self {
        let dir = root.join("checkpoint");
        Self {
            model: AsyncCheckpointer::new(FileCheckpointer::new(&dir, "model")),
            optim: AsyncCheckpointer::new(FileCheckpointer::new(&dir, "optim")),
            sched: AsyncCheckpointer::new(FileCheckpointer::new(&dir, "scheduler")),
            dir,
            saved: Vec::new(),
        }
    }

    fn save(
        &mut self,
        step: u64,
        model: &Mlp,
        optim: &ModuleOptimizer,
        sched: &ModuleLrScheduler,
        keep_last: Option<usize>,
    ) -> Result<()> {
        let e = |e: burn::train::checkpoint::CheckpointerError| Error::Record {
            path: self.dir.clone(),
            reason: e.to_string(),
        };
        let s = step as usize;
        self.model.save(s, model.clone().into_record()).map_err(e)?;
        self.optim.save(s, optim.to_record()).map_err(e)?;
        self.sched.save(s, sched.to_record()).map_err(e)?;
        self.saved.push(step);
        if let Some(k) = keep_last
            && self.saved.len() > k.max(1)
        {
            let old = self.saved.remove(0) as usize;
            self.model.delete(old).map_err(e)?;
            self.optim.delete(old).map_err(e)?;
            self.sched.delete(old).map_err(e)?;
        }
        Ok(())
    }

    fn bytes(dir: &Path, step: u64) -> u64 {
        ["model", "optim", "scheduler"]
            .iter()
            .filter_map(|n| std::fs::metadata(dir.join(format!("{n}-{step}.bpk"))).ok())
            .map(|m| m.len())
            .sum()
    }
}

/// The engine configuration of `cfg` (root, persist slots, backpressure, retention).
pub fn engine_config(cfg: &DemoConfig) -> EngineConfig {
    let ec = EngineConfig::new(&cfg.dir)
        .max_in_flight(cfg.max_in_flight)
        .backpressure(cfg.backpressure);
    match cfg.keep_last {
        Some(k) => ec.retention(Retention::keep_last(k.max(1))),
        None => ec,
    }
}

/// Opens `cfg`'s root (recovery under the lock; skipped invalid checkpoints are logged) and
/// returns the engine and the checkpoint a resume starts from.
pub fn open_engine(cfg: &DemoConfig) -> Result<(Engine, Option<PathBuf>)> {
    let (engine, report) = Engine::open(engine_config(cfg))?;
    for (p, why) in &report.quarantined {
        tracing::warn!(path = %p.display(), reason = %why, "skipped an invalid checkpoint");
    }
    Ok((engine, report.latest.map(|c| c.path)))
}

/// The fresh model of `cfg`: weights from the device RNG seeded with `cfg.seed`, ParamIds
/// derived from it. Seeds the (process-global) RNG: serialize with other users.
pub fn fresh_model(cfg: &DemoConfig, device: &Device) -> Mlp {
    device.seed(cfg.seed);
    assign_param_ids(
        Mlp::new(cfg.hidden, cfg.layers, cfg.dropout, device),
        cfg.seed,
    )
}

/// The synthetic dataset of `cfg` behind a resumable loader shuffled with `shuffle_seed`.
pub fn data_loader(
    cfg: &DemoConfig,
    shuffle_seed: u64,
    device: &Device,
) -> Result<ResumableDataLoader<Sample, Batch>> {
    let dataset = Arc::new(InMemDataset::new(synthetic_dataset(
        cfg.dataset_size,
        cfg.seed ^ 0xda7a,
    )));
    ResumableDataLoader::new(
        dataset,
        Arc::new(SampleBatcher),
        cfg.batch_size,
        shuffle_seed,
        device.clone(),
    )
}

/// The demo's optimizer: AdamW with weight decay 0.01.
pub fn optimizer() -> ModuleOptimizer {
    AdamWConfig::new().with_weight_decay(1e-2).init()
}

/// The demo's LR schedule: cosine annealing from `lr` to `0.05 * lr` over [`SCHEDULE_ITERS`].
pub fn scheduler(lr: f64) -> Result<ModuleLrScheduler> {
    CosineAnnealingLrSchedulerConfig::new(lr, SCHEDULE_ITERS)
        .with_min_lr(lr * 0.05)
        .init()
        .map_err(Error::Config)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Applies [`SaveErrorPolicy`] to an engine error. Under `Continue`, a failed persist that
/// does not lose the run's final checkpoint is recorded and training goes on; everything else
/// (including every error under `Stop`) is returned.
fn save_failed(
    cfg: &DemoConfig,
    report: &mut DemoReport,
    err: ckpt_core::Error,
    final_step: u64,
) -> Result<()> {
    use ckpt_core::Error as E;
    let save_error = matches!(
        err,
        E::Persist { .. } | E::Producer { .. } | E::Retention { .. }
    );
    // A retention failure comes after publication: the checkpoint itself is there.
    let loses_final = err.step() == Some(final_step) && !matches!(err, E::Retention { .. });
    if cfg.on_save_error == SaveErrorPolicy::Continue && save_error && !loses_final {
        tracing::warn!(error = %err, "checkpoint failed; training continues");
        report.failed_saves.push(FailedSave {
            step: err.step(),
            error: err.to_string(),
        });
        return Ok(());
    }
    Err(err.into())
}

/// Non-blocking: published events, with failed saves passed through the policy.
fn poll_saves(
    e: &mut Engine,
    cfg: &DemoConfig,
    report: &mut DemoReport,
    final_step: u64,
) -> Result<Vec<SaveEvent>> {
    loop {
        match e.poll() {
            Ok(evs) => return Ok(evs),
            Err(err) => save_failed(cfg, report, err, final_step)?,
        }
    }
}

/// Waits until nothing is in flight; events and failures as in [`poll_saves`].
fn wait_saves(
    e: &mut Engine,
    cfg: &DemoConfig,
    report: &mut DemoReport,
    final_step: u64,
) -> Result<Vec<SaveEvent>> {
    let mut out = Vec::new();
    loop {
        match e.wait_idle() {
            Ok(evs) => {
                out.extend(evs);
                return Ok(out);
            }
            Err(err) => save_failed(cfg, report, err, final_step)?,
        }
    }
}

/// Feeds published saves to the frequency controller, with the whole stall the training
/// thread saw for each (`stalls`, when known), and keeps them.
fn record_saves(
    ctrl: &mut FrequencyController,
    stalls: &BTreeMap<u64, Duration>,
    events: &mut Vec<SaveEvent>,
    published: impl IntoIterator<Item = SaveEvent>,
) {
    for ev in published {
        ctrl.observe_save(
            stalls.get(&ev.step).copied().unwrap_or(ev.stall),
            ev.persist,
        );
        events.push(ev);
    }
}

/// Runs the demo trainer. `progress` is called after every step.
pub fn run(cfg: &DemoConfig, progress: &mut dyn FnMut(&StepInfo)) -> Result<DemoReport> {
    let wall = Instant::now();
    if cfg.steps == 0 {
        return Err(Error::Config("--steps must be at least 1".into()));
    }
    if !(0.0..1.0).contains(&cfg.dropout) {
        return Err(Error::Config("dropout must be in [0, 1)".into()));
    }
    if let Frequency::OverheadBudget(f) = cfg.frequency
        && !(f > 0.0 && f < 1.0)
    {
        return Err(Error::Config(
            "the overhead budget must be a fraction in (0, 1)".into(),
        ));
    }
    let device = cfg.backend.device().autodiff();

    // Our engine (async and sync modes) owns the root; recovery runs under its lock.
    let use_engine = cfg.checkpointing() && cfg.save_mode != SaveMode::Burn;
    let mut engine = None;
    let mut latest = None;
    if use_engine {
        let (e, l) = open_engine(cfg)?;
        latest = l;
        engine = Some(e);
    } else if cfg.resume {
        latest = crate::latest_valid(&cfg.dir)?;
    }

    let mut model = fresh_model(cfg, &device);
    let mut optim = optimizer();
    let mut sched = scheduler(cfg.lr)?;
    let loader = data_loader(cfg, cfg.seed, &device)?;

    let mut report = DemoReport {
        save_mode: cfg.checkpointing().then_some(cfg.save_mode),
        ..Default::default()
    };
    let mut start = 0;
    match (cfg.resume, latest) {
        (true, Some(dir)) => {
            let r = restore(&dir, model, optim, sched)?;
            model = r.model;
            optim = r.optim;
            sched = r.scheduler;
            if r.trainer.base_seed != cfg.seed {
                return Err(Error::Config(format!(
                    "{} was written with --seed {}, not {}",
                    dir.display(),
                    r.trainer.base_seed,
                    cfg.seed
                )));
            }
            loader.set_cursor(r.trainer.cursor)?;
            start = r.trainer.step;
            report.resumed_from = Some(dir);
        }
        _ => {
            if let Some(init) = &cfg.init_from {
                model = load_model(init, model)?;
            }
        }
    }
    report.start_step = start;

    let policy = match cfg.frequency {
        Frequency::EverySteps(0) => FrequencyPolicy::Never,
        Frequency::EverySteps(n) => FrequencyPolicy::EverySteps(n),
        Frequency::OverheadBudget(f) => FrequencyPolicy::budget(f),
    };
    let mut ctrl = FrequencyController::new(policy);
    let mut burn_ckpt = (cfg.checkpointing() && cfg.save_mode == SaveMode::Burn)
        .then(|| BurnCheckpointers::new(&cfg.dir));
    let mut stalls: BTreeMap<u64, Duration> = BTreeMap::new();
    let mut events: Vec<SaveEvent> = Vec::new();
    let mut burn_steps: Vec<u64> = Vec::new();
    // Background-peak memory of the newest background save (what an in-flight one holds).
    let mut held_per_save = 0u64;
    let mut waited: Vec<SaveEvent> = Vec::new();
    let mse = MseLoss::new();
    // The step whose checkpoint is the run's last: `cfg.steps`, or the stop step.
    let mut final_step = cfg.steps;
    let mut stopped_at: Option<(u64, Instant)> = None;

    for step in start + 1..=cfg.steps {
        let t_step = Instant::now();
        device.seed(step_seed(cfg.seed, step));
        let (epoch, batch) = loader.next_batch()?;
        let out = model.forward(batch.x);
        let loss = mse.forward(out, batch.y, Reduction::Mean);
        let loss_value = loss.clone().try_into_scalar::<f32>().ok();
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        let lr = sched.step();
        model = optim.step(lr, model, grads);
        let step_time = t_step.elapsed();
        report.step_ms.push(ms(step_time));
        report.final_loss = loss_value;

        let in_flight = engine.as_ref().map(|e| e.in_flight()).unwrap_or(0);
        ctrl.observe_step(step_time, in_flight > 0);
        let now = wall.elapsed();
        // A stop request is honoured at this step boundary: this step's checkpoint is the
        // run's final one.
        let stop_now =
            step < cfg.steps && cfg.stop.as_ref().is_some_and(|s| s.load(Ordering::SeqCst));
        if stop_now {
            final_step = step;
        }
        let due = cfg.checkpointing()
            && (ctrl.should_save(step, now, in_flight > 0) || step == final_step);
        if due {
            let t0 = Instant::now();
            let trainer = TrainerState::new(step, loader.cursor(), cfg.seed);
            match (cfg.save_mode, engine.as_mut(), burn_ckpt.as_mut()) {
                (SaveMode::Async, Some(e), _) => {
                    // Failures of earlier saves first, so this one is not refused for them.
                    let polled = poll_saves(e, cfg, &mut report, final_step)?;
                    record_saves(&mut ctrl, &stalls, &mut events, polled);
                    loop {
                        let frozen = FrozenState::capture(&model, &optim, &sched, trainer.clone());
                        let route = match cfg.snapshot_budget {
                            None => SaveRoute::Background,
                            Some(budget) => {
                                // The optimizer record's size: the last checkpoint's bytes
                                // beyond the model (`None` before the first).
                                let model_bytes = frozen.model_bytes();
                                let optim_bytes =
                                    events.last().map(|ev| ev.bytes.saturating_sub(model_bytes));
                                let need = SaveMemory::new(model_bytes, optim_bytes);
                                let held = e.in_flight() as u64 * held_per_save;
                                held_per_save = need.background;
                                need.route(held, budget, step)
                            }
                        };
                        let submitted = e.submit(frozen.into_snapshot());
                        if route == SaveRoute::Blocking && submitted.is_ok() {
                            report.blocking_saves.push(step);
                            // Observed below, once this save's whole stall is known.
                            waited.extend(wait_saves(e, cfg, &mut report, final_step)?);
                        }
                        match submitted {
                            Ok(SubmitOutcome::Skipped { .. }) if step == final_step => {
                                // The final checkpoint is never skipped: wait for a slot.
                                events.extend(wait_saves(e, cfg, &mut report, final_step)?);
                            }
                            Ok(SubmitOutcome::Skipped { .. }) => {
                                report.skipped += 1;
                                break;
                            }
                            Ok(SubmitOutcome::WrittenSync(ev)) => {
                                ctrl.observe_save(ev.stall, ev.persist);
                                events.push(ev);
                                break;
                            }
                            Ok(SubmitOutcome::Queued { .. }) => break,
                            Err(err) => {
                                // An earlier save's failure surfaced here: retry this one.
                                let about_this_step = err.step() == Some(step);
                                save_failed(cfg, &mut report, err, final_step)?;
                                if about_this_step {
                                    break;
                                }
                            }
                        }
                    }
                    report.max_in_flight_seen = report.max_in_flight_seen.max(e.in_flight());
                }
                (SaveMode::Sync, Some(e), _) => {
                    let frozen = FrozenState::capture(&model, &optim, &sched, trainer);
                    let snap = frozen.encode()?.into_snapshot();
                    if let Err(err) = e.submit(snap.with_capture_time(t0.elapsed())) {
                        save_failed(cfg, &mut report, err, final_step)?;
                    }
                    events.extend(wait_saves(e, cfg, &mut report, final_step)?);
                }
                (SaveMode::Burn, _, Some(b)) => {
                    b.save(step, &model, &optim, &sched, cfg.keep_last)?;
                    burn_steps.push(step);
                }
                _ => {}
            }
            let stall = t0.elapsed();
            stalls.insert(step, stall);
            ctrl.saved(step, wall.elapsed());
            record_saves(&mut ctrl, &stalls, &mut events, waited.drain(..));
            if cfg.save_mode == SaveMode::Burn {
                ctrl.observe_save(stall, Duration::ZERO);
            }
        }
        if let Some(e) = engine.as_mut() {
            report.max_in_flight_seen = report.max_in_flight_seen.max(e.in_flight());
            let polled = poll_saves(e, cfg, &mut report, final_step)?;
            record_saves(&mut ctrl, &stalls, &mut events, polled);
        }
        progress(&StepInfo {
            step,
            steps: cfg.steps,
            epoch,
            loss: loss_value.unwrap_or(f32::NAN),
            published: events.len() + burn_steps.len(),
            in_flight: engine.as_ref().map(|e| e.in_flight()).unwrap_or(0),
        });
        if cfg.abort_at_step == Some(step) {
            std::process::abort();
        }
        if stop_now {
            stopped_at = Some((step, Instant::now()));
            break;
        }
    }

    // After a stop, wait for the final checkpoint only as long as the grace period allows.
    let mut stop_outcome = if cfg.checkpointing() {
        StopOutcome::Saved
    } else {
        StopOutcome::NotSaved
    };
    if let (Some((_, t_stop)), Some(e), Some(grace)) =
        (stopped_at, engine.as_ref(), cfg.grace_period)
    {
        while e.in_flight() > 0 && t_stop.elapsed() < grace {
            std::thread::sleep(Duration::from_millis(2));
        }
        if e.in_flight() > 0 {
            stop_outcome = StopOutcome::GraceExpired;
        }
    }
    if let Some(mut e) = engine {
        report.max_in_flight = cfg.max_in_flight.max(1);
        report.backpressure = Some(cfg.backpressure);
        if stop_outcome == StopOutcome::GraceExpired {
            events.extend(poll_saves(&mut e, cfg, &mut report, final_step)?);
            report.blocked_ms = ms(e.metrics().blocked_total);
            // Dropping the engine joins its persist thread, which a stalled disk can hold up
            // for any time: a helper thread does it, and the caller is free to exit (an
            // unfinished save is then never published; recovery removes its leftovers).
            let _ = std::thread::Builder::new()
                .name("ckpt-late-finish".into())
                .spawn(move || drop(e));
        } else {
            // Wait for every save first (failures go through the policy), then close.
            events.extend(wait_saves(&mut e, cfg, &mut report, final_step)?);
            report.blocked_ms = ms(e.metrics().blocked_total);
            events.extend(e.finish()?.events);
        }
    }
    for ev in &events {
        report.saves.push(SaveRecord {
            step: ev.step,
            stall_ms: ms(stalls.get(&ev.step).copied().unwrap_or(ev.stall)),
            persist_ms: Some(ms(ev.persist)),
            bytes: ev.bytes,
            blocked_ms: ms(ev.blocked),
        });
    }
    if let Some(b) = burn_ckpt {
        let dir = b.dir.clone();
        drop(b); // joins Burn's checkpointer threads: every file is written
        for s in burn_steps {
            report.saves.push(SaveRecord {
                step: s,
                stall_ms: ms(stalls.get(&s).copied().unwrap_or_default()),
                persist_ms: None,
                bytes: BurnCheckpointers::bytes(&dir, s),
                blocked_ms: 0.0,
            });
        }
    }
    report.saves.sort_by_key(|s| s.step);
    report.interval = ctrl.interval();
    report.final_step = stopped_at.map_or(cfg.steps.max(start), |(k, _)| k);
    report.stopped = stopped_at.map(|(step, t_stop)| StopReport {
        step,
        outcome: stop_outcome,
        wait_ms: ms(t_stop.elapsed()),
    });
    report.wall_s = wall.elapsed().as_secs_f64();
    Ok(report)
}
