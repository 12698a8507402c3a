//! The example trainer: a small MLP with dropout, AdamW and a cosine LR schedule on a
//! deterministic synthetic regression dataset, checkpointed at optimizer-step boundaries.
//!
//! This is the logic behind `cargo run --example train` (which only parses flags, draws a
//! progress bar and writes the report), kept in this crate so end-to-end tests run exactly
//! the same code. The training loop owns the model, the [`ModuleOptimizer`] and the
//! [`ModuleLrScheduler`] (Burn's `Learner` keeps the optimizer and scheduler private and offers
//! no step hook), and follows the built-in single-device loop's order: batch, forward and
//! backward, scheduler step, optimizer step. Every checkpoint decision and policy is the
//! [`CheckpointSession`]'s; the loop only captures its state.
//!
//! Exact resume: the backend RNG is re-seeded from `(seed, step)` before every step, the data
//! order is a pure function of `(seed, epoch)`, ParamIds are derived from the seed, and the
//! checkpoint holds the model, optimizer, scheduler and data cursor of the same boundary. A run
//! aborted anywhere and resumed to step N writes the same bytes as an uninterrupted run to N.

use std::{
    path::PathBuf,
    sync::{Arc, atomic::AtomicBool},
    time::{Duration, Instant},
};

use burn::data::dataset::InMemDataset;
use burn::nn::loss::{MseLoss, Reduction};
use burn::optim::GradientsParams;
use burn::optim::ModuleOptimizer;
use burn::optim::lr_scheduler::module_lr_scheduler::ModuleLrScheduler;
use burn::tensor::Device;
use ckpt_burn::{
    CheckpointManager, ManagerConfig, ResumableDataLoader, SaveTuning, TrainerState,
    assign_param_ids, load_model, restore, step_seed,
};
use ckpt_core::{
    Backpressure, CheckpointSession, EngineConfig, FrequencyPolicy, Retention, SaveRoute,
    SessionConfig, SessionReport, Submitted,
};
pub use ckpt_core::{
    SaveErrorPolicy,
    session::{FailedSave, SaveRecord, StopOutcome, StopReport},
};
use serde::Serialize;

use crate::baseline::BurnBaseline;
use crate::model::{
    Backend, Batch, Mlp, Sample, SampleBatcher, optimizer, scheduler, synthetic_dataset,
};
use crate::{Error, Result};

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
    /// Start over in a root that holds checkpoints: they are moved aside to `.rewound-*`
    /// first. Without it (and without `resume`) such a root is refused before training.
    pub fresh: bool,
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
    /// How background saves trade memory against training time: the snapshot budget, the
    /// optimizer read and the update wait ([`ckpt_burn::SaveTuning`], each `auto` by default).
    pub tuning: SaveTuning,
    /// Upload every published checkpoint to this object-store prefix (`s3://bucket/prefix`,
    /// feature `remote`); a resume falls back to it when no local checkpoint is as new.
    pub upload_to: Option<String>,
    /// Remote retention (`None`: the same as `keep_last`).
    pub upload_keep_last: Option<usize>,
    /// Upload bandwidth cap in MB/s (`None`: unlimited).
    pub upload_max_mbps: Option<f64>,
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
            fresh: false,
            init_from: None,
            abort_at_step: None,
            backend: Backend::Flex,
            stop: None,
            grace_period: None,
            on_save_error: SaveErrorPolicy::Stop,
            max_in_flight: 1,
            backpressure: Backpressure::Block,
            tuning: SaveTuning::default(),
            upload_to: None,
            upload_keep_last: None,
            upload_max_mbps: None,
        }
    }

    fn checkpointing(&self) -> bool {
        !matches!(self.frequency, Frequency::EverySteps(0))
    }

    /// The checkpoint frequency policy of `frequency`.
    pub fn policy(&self) -> FrequencyPolicy {
        match self.frequency {
            Frequency::EverySteps(0) => FrequencyPolicy::Never,
            Frequency::EverySteps(n) => FrequencyPolicy::EverySteps(n),
            Frequency::OverheadBudget(f) => FrequencyPolicy::budget(f),
        }
    }

    /// The checkpointing session of this run: frequency, error policy, stop flag and grace
    /// period, memory budget, and `steps` as the always-saved final step.
    pub fn session(&self) -> CheckpointSession {
        CheckpointSession::new(self.session_config())
    }

    /// The checkpoint policies of these settings (frequency, last step, stop, save errors,
    /// memory budget).
    pub fn session_config(&self) -> SessionConfig {
        let mut s = SessionConfig::new(self.policy())
            .end_step(self.steps)
            .on_save_error(self.on_save_error)
            .memory_budget(self.tuning.budget());
        s.stop = self.stop.clone();
        s.grace_period = self.grace_period;
        s
    }

    /// Checks the settings every loop shares.
    pub fn validate(&self) -> Result<()> {
        if self.steps == 0 {
            return Err(Error::Config("--steps must be at least 1".into()));
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return Err(Error::Config("dropout must be in [0, 1)".into()));
        }
        if let Frequency::OverheadBudget(f) = self.frequency
            && !(f > 0.0 && f < 1.0)
        {
            return Err(Error::Config(
                "the overhead budget must be a fraction in (0, 1)".into(),
            ));
        }
        if self.max_in_flight == 0 {
            return Err(Error::Config("--max-in-flight must be at least 1".into()));
        }
        Ok(())
    }
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
    /// The object-store URL `resumed_from` was downloaded from, when the resume fell back to
    /// the remote copy.
    pub resumed_from_remote: Option<String>,
    /// Where a ZeRO rank's resume came from when it was the memory tier (its own part, or a
    /// peer's replica); `None` for a disk checkpoint.
    pub resumed_from_memory: Option<String>,
    /// What the memory tier did (ZeRO runs with one).
    pub memory_tier: Option<ckpt_zero::MemoryTierReport>,
    /// Finished uploads (`--upload-to`).
    pub uploads: Vec<crate::UploadRecord>,
    /// Loss of the last step.
    pub final_loss: Option<f32>,
    /// Save mode.
    pub save_mode: Option<SaveMode>,
    /// Checkpoints dropped by the `skip` backpressure policy.
    pub skipped: u64,
    /// Steps saved blocking (`--save-mode sync`: the trainer waited for the whole persist).
    pub blocking_saves: Vec<u64>,
    /// Steps whose background save would have exceeded the snapshot budget: the trainer waited
    /// after submitting them until what they still held fit.
    pub throttled_saves: Vec<u64>,
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
    /// The training time checkpoints cost (stalls, slower steps after each save, the final
    /// wait), as the session measured it.
    pub lost: ckpt_core::session::LostTime,
    /// This process's direct-I/O counters at the end of the run: reused write buffers and the
    /// bytes written past the page cache.
    pub direct_io: ckpt_core::storage::DirectIoStats,
    /// For each save, the state its snapshot still held handle clones of when the next
    /// optimizer update ran (sampled just before it): what that update had to copy instead of
    /// writing in place (host memory on Flex, device memory on wgpu).
    pub pinned_at_next_update: Vec<PinnedSample>,
    /// How the run's saves read the optimizer's state from the device
    /// ([`ckpt_burn::SaveTuning::optimizer_read`] as it applied to the run's device): `at-capture` (inside
    /// the save call) or `background` (on the staging helper); `None` on host memory (Flex),
    /// where it does not apply.
    pub optimizer_read: Option<&'static str>,
}

/// [`DemoReport::pinned_at_next_update`]: one save's sample.
#[derive(Debug, Clone, Copy, Serialize, Default)]
pub struct PinnedSample {
    /// The save's step.
    pub save_step: u64,
    /// The step whose update followed it.
    pub update_step: u64,
    /// Bytes of state still held by snapshots when the update ran
    /// ([`ckpt_burn::pinned_state_bytes`], after any wait before the update).
    pub bytes: u64,
    /// Time the training thread waited before that update for the snapshot to give the
    /// state back ([`ckpt_burn::SaveTuning::update_wait`]); also counted in the save's `stall_ms`.
    pub update_wait_ms: f64,
    /// Bytes the device's allocator had in use at the end of the save's step, before the
    /// capture (`Device::memory_pool_usage`, CubeCL's `memory_report(MemoryScope::Device)`;
    /// `None` on a backend that does not report it, such as Flex).
    pub device_in_use_before: Option<u64>,
    /// The same at the end of the following step, after its update: beyond
    /// `device_in_use_before`, the device memory the save still holds one step later.
    pub device_in_use_after: Option<u64>,
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

impl DemoReport {
    /// Fills in what the checkpointing session did.
    pub fn absorb(&mut self, s: SessionReport) {
        self.saves = s.saves;
        self.skipped = s.skipped;
        self.blocking_saves = s.blocking_saves;
        self.throttled_saves = s.throttled_saves;
        self.failed_saves = s.failed_saves;
        self.blocked_ms = s.blocked_ms;
        self.max_in_flight_seen = s.max_in_flight_seen;
        self.interval = s.interval;
        self.stopped = s.stopped;
        self.lost = s.lost;
        self.direct_io = ckpt_core::storage::direct_io_stats();
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
    Ok(ResumableDataLoader::new(
        dataset,
        Arc::new(SampleBatcher),
        cfg.batch_size,
        shuffle_seed,
        device.clone(),
    )?)
}

/// The library's checkpointer configured by `cfg`'s flags.
pub fn manager_config(cfg: &DemoConfig) -> Result<ManagerConfig> {
    let mut m = ManagerConfig::new(&cfg.dir)
        .frequency(cfg.policy())
        .keep_last(cfg.keep_last)
        .seed(cfg.seed)
        .end_step(cfg.steps)
        .overwrite(cfg.fresh && !cfg.resume)
        .on_save_error(cfg.on_save_error)
        .max_in_flight(cfg.max_in_flight)
        .backpressure(cfg.backpressure)
        .tuning(cfg.tuning)
        .blocking(cfg.save_mode == SaveMode::Sync);
    if let Some(stop) = &cfg.stop {
        m = m.stop_on(stop.clone(), cfg.grace_period);
    }
    if let Some(url) = &cfg.upload_to {
        m = crate::tier::upload_to(m, url, cfg)?;
    }
    Ok(m)
}

/// Opens the library's checkpointer for `cfg`, refusing before any training a root that holds
/// checkpoints when the run neither resumes nor starts over (`--fresh`).
fn open_manager(cfg: &DemoConfig) -> Result<CheckpointManager> {
    let m = CheckpointManager::open(manager_config(cfg)?)?;
    if let Some((step, _)) = m.latest()
        && !cfg.resume
        && !cfg.fresh
    {
        return Err(used_root(
            cfg,
            &ckpt_core::layout::checkpoint_dir_name(step),
        ));
    }
    Ok(m)
}

/// The error of a run that neither resumes nor starts over in a root holding checkpoints
/// (`newest`: the newest one's directory name), in the trainer's flags.
pub(crate) fn used_root(cfg: &DemoConfig, newest: &str) -> Error {
    Error::Config(format!(
        "{} already holds checkpoints (newest {newest}): add --resume to continue that run, or \
         --fresh to start over (its checkpoints are moved aside to .rewound-*), or use \
         another --dir",
        cfg.dir.display(),
    ))
}

/// Where this run's checkpoints go.
enum Saver {
    /// The library's checkpointer (`--save-mode async` and `sync`).
    Ours(Box<CheckpointManager>),
    /// Burn's own checkpointer (the baseline) or none, decided by a session of the loop's own.
    Other(Box<CheckpointSession>, Baseline),
}

/// The saves of a run without the library's checkpointer.
enum Baseline {
    /// Checkpointing is off.
    Off,
    /// Burn's own checkpointer.
    Burn(BurnBaseline),
}

impl ckpt_core::SaveTarget for Baseline {
    type Error = Error;
    fn in_flight(&self) -> usize {
        0
    }
    fn poll(&mut self) -> Result<Vec<ckpt_core::SaveEvent>> {
        Ok(Vec::new())
    }
    fn wait_idle(&mut self) -> Result<Vec<ckpt_core::SaveEvent>> {
        Ok(Vec::new())
    }
    fn held_bytes(&self) -> Option<u64> {
        None
    }
    fn wait_held_at_most(&mut self, _limit: u64) -> Result<bool> {
        Ok(false)
    }
}

impl Saver {
    /// After optimizer step `step` (which took `took`): checkpoints it where the policy says
    /// so; whether it did, and whether the run stops here.
    fn after_step(
        &mut self,
        step: u64,
        took: Duration,
        (model, optim, sched): (&Mlp, &ModuleOptimizer, &ModuleLrScheduler),
        trainer: impl FnOnce() -> TrainerState,
    ) -> Result<(bool, bool)> {
        match self {
            Saver::Ours(m) => {
                let stop = m.step(step, model, optim, sched, trainer().cursor)?;
                Ok((m.last_saved() == Some(step), stop))
            }
            Saver::Other(session, target) => {
                let b = session.boundary(step, took, 0, Ok::<_, Error>)?;
                if b.save {
                    let trainer = trainer();
                    session.save(target, step, |t, _gate| match t {
                        Baseline::Burn(burn) => {
                            let ev = burn.save(trainer.step, model, optim, sched)?;
                            Ok(Submitted {
                                outcome: ckpt_core::engine::SubmitOutcome::WrittenSync(ev),
                                route: SaveRoute::Background,
                            })
                        }
                        Baseline::Off => Err(Error::Config("checkpointing is off".into())),
                    })?;
                }
                session.poll(target)?;
                Ok((b.save, b.stop))
            }
        }
    }

    /// Checkpoints published so far.
    fn published(&self) -> usize {
        match self {
            Saver::Ours(m) => m.published(),
            Saver::Other(s, _) => s.published(),
        }
    }

    /// Checkpoints persisting now.
    fn in_flight(&self) -> usize {
        match self {
            Saver::Ours(m) => m.in_flight(),
            Saver::Other(..) => 0,
        }
    }

    /// Waits for every save; what the saves did and the object-store uploads.
    fn finish(self) -> Result<(SessionReport, Vec<crate::UploadRecord>)> {
        match self {
            Saver::Ours(m) => {
                let r = m.finish()?;
                Ok((r.session, r.uploads))
            }
            Saver::Other(session, target) => {
                let report = session.finish(target, |t| {
                    // Dropping joins Burn's checkpointer threads: every file is written.
                    Ok(match t {
                        Baseline::Burn(b) => b.close(),
                        Baseline::Off => Vec::new(),
                    })
                })?;
                Ok((report, Vec::new()))
            }
        }
    }
}

/// Bytes the device's allocator has in use, where the backend reports it (CubeCL).
fn device_in_use(device: &Device) -> Option<u64> {
    device.memory_pool_usage().map(|u| u.bytes_in_use)
}

/// Runs the demo trainer. `progress` is called after every step.
pub fn run(cfg: &DemoConfig, progress: &mut dyn FnMut(&StepInfo)) -> Result<DemoReport> {
    let wall = Instant::now();
    cfg.validate()?;
    let device = cfg.backend.device().autodiff();

    let ours = cfg.checkpointing() && cfg.save_mode != SaveMode::Burn;
    if cfg.upload_to.is_some() && !ours {
        return Err(Error::Config(
            "--upload-to needs our engine (--save-mode async or sync, checkpointing on)".into(),
        ));
    }
    let mut saver = if ours {
        Saver::Ours(Box::new(open_manager(cfg)?))
    } else {
        let target = if cfg.checkpointing() {
            Baseline::Burn(BurnBaseline::new(&cfg.dir, cfg.keep_last))
        } else {
            Baseline::Off
        };
        Saver::Other(Box::new(cfg.session()), target)
    };

    let mut model = fresh_model(cfg, &device);
    let mut optim = optimizer();
    let mut sched = scheduler(cfg.lr)?;
    let loader = data_loader(cfg, cfg.seed, &device)?;

    let mut report = DemoReport {
        save_mode: cfg.checkpointing().then_some(cfg.save_mode),
        ..Default::default()
    };
    let resumed = match (&mut saver, cfg.resume) {
        (Saver::Ours(m), true) => m
            .resume(&mut model, &mut optim, &mut sched)?
            .zip(m.resumed_from().cloned()),
        (Saver::Other(session, _), true) => match ckpt_burn::latest_valid(&cfg.dir)? {
            Some(dir) => {
                let r = restore(&dir, model, optim, sched)?;
                model = r.model;
                optim = r.optim;
                sched = r.scheduler;
                session.resumed_at(r.trainer.step);
                let from = ckpt_burn::ResumedFrom {
                    step: r.trainer.step,
                    dir,
                    remote: None,
                };
                Some((r.trainer, from))
            }
            None => None,
        },
        (_, false) => None,
    };
    let mut start = 0;
    match resumed {
        Some((trainer, from)) => {
            if trainer.base_seed != cfg.seed {
                return Err(Error::Config(format!(
                    "{} was written with --seed {}, not {}",
                    from.dir.display(),
                    trainer.base_seed,
                    cfg.seed
                )));
            }
            loader.set_cursor(trainer.cursor)?;
            start = trainer.step;
            report.resumed_from = Some(from.dir);
            report.resumed_from_remote = from.remote;
        }
        None => {
            if let Some(init) = &cfg.init_from {
                model = load_model(init, model)?;
            }
        }
    }
    report.start_step = start;

    let mse = MseLoss::new();
    let mut final_step = cfg.steps.max(start);
    let mut saved_before: Option<(u64, Option<u64>)> = None;
    if ours && let Some(at_capture) = cfg.tuning.read().on(&device) {
        report.optimizer_read = Some(if at_capture {
            "at-capture"
        } else {
            "background"
        });
        tracing::info!(
            setting = ?cfg.tuning.read(),
            at_capture,
            "how saves read the optimizer's state from the device"
        );
    }

    for step in start + 1..=cfg.steps {
        let t_step = Instant::now();
        device.seed(step_seed(cfg.seed, step));
        let (epoch, batch) = loader.next_batch()?;
        let out = model.forward(batch.x);
        let loss = mse.forward(out, batch.y, Reduction::Mean);
        let loss_value = loss.clone().try_into_scalar::<f32>().ok();
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        let lr = sched.step();
        // Forward and backward only read the state, so a save's staging overlaps them; the
        // update waits for what is still held where the policy says so (device memory).
        let waited = match &mut saver {
            Saver::Ours(m) => m.before_update(),
            Saver::Other(..) => Duration::ZERO,
        };
        let after_save = saved_before
            .take()
            .map(|(save_step, before)| (save_step, before, ckpt_burn::pinned_state_bytes()));
        model = optim.step(lr, model, grads);
        let step_time = t_step.elapsed();
        // Sampled outside the step's time, which the session measures saves' cost by.
        if let Some((save_step, device_in_use_before, bytes)) = after_save {
            report.pinned_at_next_update.push(PinnedSample {
                save_step,
                update_step: step,
                bytes,
                update_wait_ms: ms(waited),
                device_in_use_before,
                device_in_use_after: device_in_use(&device),
            });
        }
        report.step_ms.push(ms(step_time));
        report.final_loss = loss_value;

        let in_use = device_in_use(&device);
        let (saved, stop) = saver.after_step(step, step_time, (&model, &optim, &sched), || {
            TrainerState::new(step, loader.cursor(), cfg.seed)
        })?;
        if saved {
            saved_before = Some((step, in_use));
        }
        progress(&StepInfo {
            step,
            steps: cfg.steps,
            epoch,
            loss: loss_value.unwrap_or(f32::NAN),
            published: saver.published(),
            in_flight: saver.in_flight(),
        });
        if cfg.abort_at_step == Some(step) {
            std::process::abort();
        }
        if stop {
            final_step = step;
            break;
        }
    }

    let burn = matches!(saver, Saver::Other(_, Baseline::Burn(_)));
    if ours {
        report.max_in_flight = cfg.max_in_flight.max(1);
        report.backpressure = Some(cfg.backpressure);
    }
    let (session, uploads) = saver.finish()?;
    report.absorb(session);
    report.uploads = uploads;
    if burn {
        // Burn's checkpointer reports no persist time; its bytes are on disk now.
        let dir = BurnBaseline::dir(&cfg.dir);
        for s in &mut report.saves {
            s.persist_ms = None;
            s.bytes = BurnBaseline::bytes(&dir, s.step);
        }
    }
    report.final_step = final_step;
    report.wall_s = wall.elapsed().as_secs_f64();
    Ok(report)
}

pub(crate) fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
