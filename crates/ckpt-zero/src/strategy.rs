//! ZeRO-1 inside Burn's learner: a [`SupervisedLearningStrategy`] (`TrainingStrategy::Custom`)
//! that runs the learner on N rank threads with ZeRO-1 and checkpoints sharded state at
//! optimizer-step boundaries, the same hook style as `ckpt_burn::strategy`.
//!
//! ```no_run
//! # use burn::train::{Learner, SupervisedTraining, LearnerModel};
//! # use burn::tensor::Device;
//! # fn demo<M: LearnerModel>(training: SupervisedTraining<M>, learner: Learner<M>, device: Device)
//! # -> Result<(), ckpt_zero::Error> {
//! use ckpt_core::{EngineConfig, FrequencyPolicy};
//! use ckpt_zero::{ShardFormat, strategy::ZeroTrainingStrategy};
//!
//! let zero = ZeroTrainingStrategy::new(device, 4, EngineConfig::new("runs/zero"), FrequencyPolicy::EverySteps(100))?
//!     .seed(42) // the seed your program gives Burn's data loader and `device.seed`
//!     .shard_format(ShardFormat::PerRank)
//!     .resume_latest(); // continue from the newest valid checkpoint, on any number of ranks
//! let result = training.with_training_strategy(zero.into_training_strategy()).launch(learner);
//! # Ok(()) }
//! ```
//!
//! How it works, and its limits (what Burn's public API allows):
//! - Every rank is a thread with a clone of the `Learner`; each reads its own slice of the
//!   training loader (or, with [`ZeroTrainingStrategy::replicate_data`], the whole loader), and
//!   steps stop together when any rank runs out of data. Rank 0 (the calling thread) emits the
//!   learner events and runs validation.
//! - A step: `learner.train_step`, gradients all-reduced on the training group, the rank's
//!   `optimizer_step` with the gradients of the parameters it owns only (so its optimizer holds
//!   only that shard), then the owners' parameters are all-gathered and loaded into every rank's
//!   learner (`Learner::load_model`: a host round trip per step).
//! - A save does not stall training: at the step boundary each rank freezes its learner
//!   (`ckpt_burn::HeldLearner`: handle clones, copy-on-write) and hands it to its checkpoint
//!   thread, which takes Burn's records of it there (`ckpt_burn::LearnerTap`: the learner keeps
//!   its optimizer private, and `LearningCheckpointer::checkpoint` is the one public reader)
//!   and moves the shard over the dedicated checkpoint group: the same
//!   [`crate::RankManager`] as the example trainer's ZeRO loop. Rank 0 writes `model.bpk` from the model record that call builds anyway, and the
//!   records are written through scratch files in the root, with no buffer of a whole record
//!   (on a device backend, read to host memory before the learner is given back).
//! - The optimizer update after a save waits until the frozen learners are given back (their
//!   records taken, beside the next forward and backward passes), so it writes in place
//!   instead of copying the state on write: [`ckpt_burn::UpdateWait::Auto`], as on the
//!   single-device learner route; [`ZeroTrainingStrategy::tuning`] changes it. The rank
//!   threads share one process, so each waits for every rank's save. No snapshot budget
//!   applies on this route: one save is in flight at a time, and the next waits for it.
//! - A stop through Burn's interrupter is agreed by all ranks at the next step boundary
//!   (`ckpt_zero::agree_on_boundary`), and that step is checkpointed before training ends.
//! - Checkpoints every N optimizer steps, or as often as an overhead budget allows
//!   (`FrequencyPolicy::budget` given to [`ZeroTrainingStrategy::new`]: rank 0's controller decides at each step and
//!   broadcasts the decision over the training group); no gradient accumulation.
//! - Resume on the same number of ranks replays each rank's shuffled-loader draws of the
//!   earlier epochs, so a shuffled `DataLoaderBuilder` loader resumes mid-epoch exactly
//!   (tested on 2 ranks). With [`ZeroTrainingStrategy::deterministic`] every rank re-seeds the
//!   backend RNG from `(seed, step, rank)` before its forward/backward pass, so dropout masks
//!   replay too.
//! - The ranks' forward/backward passes run one at a time, under a process-wide lock: Burn
//!   0.22.1's autodiff graph registry deadlocks when threads run passes at once on graphs that
//!   share nodes, as the ranks' learners share their parameters' nodes. Each pass still uses
//!   every core the backend uses; what runs beside it is the other ranks' all-reduce, optimizer
//!   step and checkpoint threads. Ranks as MPI processes do not share a registry (the example
//!   trainer's rank threads take the same lock).

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use burn::optim::OptimizerRecord;
use burn::optim::lr_scheduler::LrSchedulerRecord;
use burn::store::ModuleRecord;
use burn::tensor::{Bytes, Device};
use burn::train::checkpoint::CheckpointerError;
use burn::train::metric::store::EventStoreClient;
use burn::train::{
    EventProcessorTraining, Interrupter, Learner, LearnerEvent, LearnerModel, LearningResult,
    SupervisedLearningStrategy, SupervisedTrainingEventProcessor, TrainLoader, TrainingComponents,
    TrainingItem, TrainingStrategy, ValidLoader,
};
use ckpt_burn::strategy::{train_from_epoch, valid_epoch};
use ckpt_burn::{
    DataCursor, HeldLearner, LearnerRecords, LearnerTap, MODEL_FILE, SCHEDULER_FILE, SaveTuning,
    TrainerState, load_trainer_state, write_model_record, write_optimizer_record,
};
use ckpt_core::{Engine, EngineConfig, FrequencyPolicy, SessionConfig};

use crate::collective::{Collective, ThreadGroup};
use crate::manager::{RankConfig, RankManager, RankReport, ShardSave, ShardedRoot};
use crate::{
    Error, MemoryTier, MemoryTierReport, ModelPart, OptimShard, Partition, RankRestore,
    RestoreSource, Result, ShardFormat, ShardJob, Zero1, join_ranks,
};

/// Failpoint: a rank's checkpoint thread, right before it takes Burn's records of the learner
/// frozen at a save (tests hold it back with `sleep(ms)`; with the `failpoints` feature).
#[cfg(feature = "failpoints")]
pub const FP_BEFORE_RECORDS: &str = "zero_before_records";
#[cfg(not(feature = "failpoints"))]
#[allow(dead_code)]
const FP_BEFORE_RECORDS: &str = "zero_before_records";

/// ZeRO-1 on `ranks` threads inside `SupervisedTraining`, with sharded step checkpoints.
pub struct ZeroTrainingStrategy {
    device: Device,
    ranks: usize,
    policy: FrequencyPolicy,
    format: ShardFormat,
    replicate: bool,
    timeout: Duration,
    root: PathBuf,
    /// Rank 0's root, opened in `new`; taken when training starts.
    opened: Mutex<Option<ShardedRoot>>,
    latest: Option<PathBuf>,
    resume: bool,
    overwrite: bool,
    seed: Option<u64>,
    deterministic: Option<u64>,
    tuning: SaveTuning,
    memory: Option<MemoryTier>,
    reports: ZeroReports,
}

/// What each rank's checkpointing did in a [`ZeroTrainingStrategy`]'s run: a handle taken
/// with [`ZeroTrainingStrategy::reports`] before training, filled as each rank finishes
/// (disk saves, uploads, the memory tier's saves, stalls and bytes).
#[derive(Debug, Clone, Default)]
pub struct ZeroReports(Arc<Mutex<Vec<(usize, RankReport)>>>);

impl ZeroReports {
    /// Rank `rank`'s report, once its training has ended cleanly (`None` before, or when the
    /// rank failed).
    pub fn rank(&self, rank: usize) -> Option<RankReport> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .find(|(r, _)| *r == rank)
            .map(|(_, report)| report.clone())
    }

    fn put(&self, rank: usize, report: RankReport) {
        let mut all = self.0.lock().unwrap_or_else(|e| e.into_inner());
        all.retain(|(r, _)| *r != rank);
        all.push((rank, report));
    }
}

impl std::fmt::Debug for ZeroTrainingStrategy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZeroTrainingStrategy")
            .field("ranks", &self.ranks)
            .field("policy", &self.policy)
            .field("format", &self.format)
            .field("root", &self.root)
            .finish()
    }
}

impl ZeroTrainingStrategy {
    /// `ranks` ZeRO-1 ranks on `device` (made autodiff), checkpointing into `engine`'s root
    /// per `policy` (as [`ckpt_burn::strategy::CkptTrainingStrategy::new`]; with an overhead
    /// budget, rank 0's [`ckpt_core::session::FrequencyController`] decides at each step
    /// boundary and every rank follows). Opens the root now: recovery runs and the root is
    /// locked for this process. An overhead budget outside (0, 1) is an error.
    pub fn new(
        device: Device,
        ranks: usize,
        engine: EngineConfig,
        policy: FrequencyPolicy,
    ) -> Result<Self> {
        if ranks == 0 {
            return Err(Error::Config("ranks must be at least 1".into()));
        }
        if let FrequencyPolicy::OverheadBudget { fraction, .. } = policy
            && !(fraction > 0.0 && fraction < 1.0)
        {
            return Err(Error::Config(format!(
                "the overhead budget must be a fraction in (0, 1), not {fraction}"
            )));
        }
        let device = if device.is_autodiff() {
            device
        } else {
            device.autodiff()
        };
        let root = engine.root.clone();
        let opened = ShardedRoot::open(engine)?;
        let latest = opened.latest().map(Path::to_path_buf);
        Ok(Self {
            device,
            ranks,
            policy,
            format: ShardFormat::Consolidated,
            replicate: false,
            timeout: Duration::from_secs(600),
            root,
            opened: Mutex::new(Some(opened)),
            latest,
            resume: false,
            overwrite: false,
            seed: None,
            deterministic: None,
            tuning: SaveTuning::default(),
            memory: None,
            reports: ZeroReports::default(),
        })
    }

    /// The base seed of the run (the one your program gives Burn's data loader and
    /// `device.seed`), recorded in every checkpoint's `trainer.bin`. Required when
    /// checkpointing: a checkpoint must not claim a seed it was not trained with.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Deterministic mode, for exact resume of models that draw from the backend RNG
    /// (dropout): before its forward/backward pass of step `s`, rank `r` re-seeds the backend
    /// RNG from `(seed, s, r)`, holding [`ckpt_burn::backend_rng_lock`] until the pass is done
    /// (Burn's backend RNG is process-global, shared by the rank threads). A resumed run then
    /// draws exactly the masks of the uninterrupted one. What it changes compared with a plain
    /// run: the masks differ (equally random), and the ranks' forward/backward passes no longer
    /// overlap (the collectives and optimizer steps still do). Also sets [`Self::seed`] if it
    /// was not given.
    pub fn deterministic(mut self, seed: u64) -> Self {
        self.deterministic = Some(seed);
        self.seed.get_or_insert(seed);
        self
    }

    fn policy(&self) -> FrequencyPolicy {
        self.policy
    }

    /// How saves trade memory against training time ([`SaveTuning`], `auto` by default). On
    /// this route only [`SaveTuning::update_wait`] applies: whether the optimizer update after
    /// a save waits until the frozen learners are given back (`auto`: it does, on host memory
    /// too, as on [`ckpt_burn::strategy::CkptTrainingStrategy`]). The other settings are for
    /// saves staged tensor by tensor, which this route does not make: they are not used, and
    /// setting them emits a warning that says so.
    pub fn tuning(mut self, tuning: SaveTuning) -> Self {
        if tuning != SaveTuning::default().update_wait(tuning.wait()) {
            tracing::warn!(
                ?tuning,
                "ZeroTrainingStrategy uses only SaveTuning::update_wait: the memory budget, \
                 model staging and optimizer read settings are ignored on this route"
            );
        }
        self.tuning = SaveTuning::default().update_wait(tuning.wait());
        self
    }

    /// A handle on what each rank's checkpointing did, filled when training ends: take it
    /// before [`Self::into_training_strategy`] (rank 0 also logs the memory tier's summary).
    pub fn reports(&self) -> ZeroReports {
        self.reports.clone()
    }

    /// Also keep the newest steps in a node-local memory tier replicated to peer ranks (see
    /// [`crate::memory_tier`]): a resume ([`Self::resume_latest`]) then restores the newest
    /// step every rank can restore from the tier when it is newer than the disk's.
    pub fn memory_tier(mut self, tier: MemoryTier) -> Self {
        self.memory = Some(tier);
        self
    }

    /// How optimizer shards are written (default: consolidated).
    pub fn shard_format(mut self, format: ShardFormat) -> Self {
        self.format = format;
        self
    }

    /// Every rank reads the whole training loader instead of its slice (default: no).
    pub fn replicate_data(mut self, yes: bool) -> Self {
        self.replicate = yes;
        self
    }

    /// Deadline of every collective call (default 10 minutes: rank 0 validates while the
    /// others wait).
    pub fn timeout(mut self, t: Duration) -> Self {
        self.timeout = t;
        self
    }

    /// Continue from the newest valid checkpoint of the root, if there is one, on any number
    /// of ranks (an empty root is a fresh start), as
    /// [`ckpt_burn::strategy::CkptTrainingStrategy::resume_latest`].
    pub fn resume_latest(mut self) -> Self {
        self.resume = true;
        self
    }

    /// Start over in a root that holds checkpoints of an earlier run: they are moved aside to
    /// `ROOT/.rewound-*` (each a warning) when training starts. Without it (and without
    /// [`Self::resume_latest`]) such a root is refused before any training, so the old run's steps
    /// are never replaced.
    pub fn overwrite(mut self, yes: bool) -> Self {
        self.overwrite = yes;
        self
    }

    /// The checkpoint a resume starts from.
    pub fn latest(&self) -> Option<&Path> {
        self.latest.as_deref()
    }

    /// For `SupervisedTraining::with_training_strategy`.
    pub fn into_training_strategy<M: LearnerModel>(self) -> TrainingStrategy<M> {
        TrainingStrategy::Custom(Arc::new(self))
    }

    fn resume_dir(&self) -> Option<&Path> {
        if self.resume { self.latest() } else { None }
    }
}

/// What rank 0 needs that the other ranks do not have.
struct Leader<'a, M: LearnerModel> {
    events: &'a mut SupervisedTrainingEventProcessor<M>,
    interrupter: &'a Interrupter,
}

struct RankRun<M: LearnerModel> {
    zero: Zero1,
    ckpt: RankManager<M>,
    /// Reads Burn's optimizer and scheduler records of the rank's learner.
    records: LearnerTap<M>,
    seed: u64,
    deterministic: Option<u64>,
    device: Device,
    step: u64,
    rank: usize,
    /// Whether an optimizer update waits until the saves give the frozen learners back.
    wait_before_update: bool,
    /// The checkpoint root (scratch files of the records go there).
    root: PathBuf,
    /// Bytes of this rank's optimizer shard, estimated (two f32 moments per owned parameter),
    /// for what a frozen learner counts in `ckpt_burn::pinned_state_bytes`.
    shard_bytes: u64,
}

fn bad_record(dir: &Path, file: &str, e: impl std::fmt::Display) -> Error {
    Error::Shard {
        file: dir.join(file),
        reason: e.to_string(),
    }
}

/// Loads checkpoint `dir` into this rank's learner (its shard of the optimizer state) and
/// returns (step, epoch, iterations done in that epoch).
fn restore_rank<M: LearnerModel>(
    from: &mut RankRestore,
    learner: &mut Learner<M>,
    partition: &Partition,
    rank: usize,
) -> Result<(u64, usize, usize)> {
    let dir = from.dir().to_path_buf();
    let record = ModuleRecord::from_bytes(Bytes::from_bytes_vec(from.model_bytes()?))
        .map_err(|e| bad_record(&dir, MODEL_FILE, e))?;
    learner.load_model(record);
    let mine = from.optimizer_shard(partition, rank)?;
    let record = OptimizerRecord::from_bytes(Bytes::from_bytes_vec(mine))
        .map_err(|e| bad_record(&dir, ckpt_burn::OPTIM_FILE, e))?;
    learner.load_optim(record);
    let record = LrSchedulerRecord::from_bytes(Bytes::from_bytes_vec(from.scheduler_bytes()?))
        .map_err(|e| bad_record(&dir, SCHEDULER_FILE, e))?;
    learner.load_scheduler(record);
    let t = from.trainer_state()?;
    Ok((t.step, t.cursor.epoch as usize, t.cursor.position as usize))
}

impl<M: LearnerModel> RankRun<M> {
    /// One epoch of training on this rank; returns whether training should go on.
    fn epoch(
        &mut self,
        learner: &mut Learner<M>,
        loader: &TrainLoader<M>,
        epoch: usize,
        skip: usize,
        mut leader: Option<&mut Leader<'_, M>>,
    ) -> Result<bool> {
        let mut iterator = loader.iter();
        let mut iteration = 0usize;
        loop {
            let item = iterator.next();
            let stop = leader.as_ref().is_some_and(|l| l.interrupter.should_stop());
            let go = self.zero.group().all_agree(item.is_some() && !stop)?;
            let Some(item) = item.filter(|_| go) else {
                return Ok(!stop);
            };
            let item = item.map_err(|e| Error::Config(format!("training data: {e}")))?;
            iteration += 1;
            if iteration <= skip {
                continue;
            }
            let progress = iterator.progress();
            let t_step = Instant::now();
            let out = match self.deterministic {
                Some(_) => ckpt_burn::seeded_pass(
                    &self.device,
                    self.deterministic,
                    self.step + 1,
                    self.rank as u64,
                    || learner.train_step(item),
                ),
                // One rank's pass at a time: Burn 0.22.1's autodiff graph registry deadlocks
                // when threads run passes at once on graphs that share nodes (the ranks'
                // learners share their parameters' nodes, and a forward merging into a graph
                // holds the registry's lock while a backward holding that graph's lock waits
                // for it; Burn's issue 5573 is a related race that loses a gradient).
                None => {
                    let _one_pass = ckpt_burn::backend_rng_lock();
                    learner.train_step(item)
                }
            };
            let owned = self.zero.reduce_owned(&learner.model(), out.grads)?;
            self.ckpt.before_update(self.wait_before_update);
            learner.lr_step();
            learner.optimizer_step(owned);
            if self.zero.world() > 1 {
                let model = self.zero.exchange(learner.model())?;
                learner.load_model(model.into_record());
            }
            self.step += 1;
            if let Some(l) = leader.as_mut() {
                let item = TrainingItem::new(
                    out.item,
                    progress,
                    Some(iteration),
                    Some(learner.lr_current()),
                );
                l.interrupter
                    .fail_on_error(l.events.process_train(LearnerEvent::ProcessedItem(item)));
            }
            let step_time = t_step.elapsed();
            let stop = leader.as_ref().is_some_and(|l| l.interrupter.should_stop());
            let (step, rank, seed) = (self.step, self.rank, self.seed);
            let cursor = DataCursor {
                epoch: epoch as u64,
                position: iteration as u64,
                shuffle_seed: seed,
            };
            let (records, root, shard_bytes) = (&self.records, &self.root, self.shard_bytes);
            // Every rank follows rank 0's save decision and any rank's stop, at this boundary.
            let b = self
                .ckpt
                .step(step, step_time, stop, self.zero.group(), || {
                    // The learner frozen at this step: handle clones (copy-on-write), so the
                    // training thread goes on at once. Burn's records of it are taken on the
                    // rank's checkpoint thread (ckpt_burn's tap).
                    let held = HeldLearner::freeze(learner, records, shard_bytes);
                    let root = root.clone();
                    ShardSave::Later(Box::new(move || {
                        fail::fail_point!(FP_BEFORE_RECORDS);
                        let trainer = TrainerState::new(step, cursor, seed);
                        held.take(|r| shard_job(r, rank, &root, trainer))
                            .map_err(|e| {
                                Error::Config(format!("step {step}: the learner's records: {e}"))
                            })
                    }))
                })?;
            if b.stop {
                return Ok(false);
            }
        }
    }
}

/// A rank's job from Burn's records of its frozen learner (rank 0 also writes the model). Host
/// memory: the records go to the checkpoint thread's writers as they are. A device backend: they
/// are read to host memory here, before the learner is given back.
fn shard_job<M: LearnerModel>(
    r: LearnerRecords,
    rank: usize,
    root: &Path,
    trainer: TrainerState,
) -> std::result::Result<ShardJob<M>, Box<dyn std::error::Error + Send + Sync>> {
    let step = trainer.step;
    let (model, optim) = if r.host_memory {
        (
            (rank == 0).then_some(ModelPart::Record {
                record: r.model,
                bytes: r.model_bytes,
            }),
            OptimShard::Record {
                record: r.optim,
                bytes: r.optim_bytes,
            },
        )
    } else {
        let model = if rank == 0 {
            let mut bytes = Vec::new();
            write_model_record(r.model, r.model_bytes, root, step, &mut bytes)?;
            Some(ModelPart::Encoded(bytes))
        } else {
            None
        };
        let mut optim = Vec::new();
        write_optimizer_record(r.optim, r.optim_bytes, root, step, &mut optim)?;
        (model, OptimShard::Encoded(optim))
    };
    Ok(ShardJob {
        model,
        optim,
        scheduler: r.scheduler,
        trainer,
    })
}

#[allow(clippy::too_many_arguments)]
fn run_rank<M: LearnerModel>(
    strategy: &ZeroTrainingStrategy,
    mut group: Box<dyn Collective>,
    engine: Option<Engine>,
    mut learner: Learner<M>,
    loader: TrainLoader<M>,
    store: Arc<EventStoreClient>,
    epochs: std::ops::RangeInclusive<usize>,
    mut leader: Option<Leader<'_, M>>,
    mut after_epoch: impl FnMut(
        &mut Learner<M>,
        usize,
        &mut SupervisedTrainingEventProcessor<M>,
    ) -> bool,
) -> Result<Learner<M>> {
    let rank = group.rank();
    let mut config = RankConfig::new(&strategy.root, SessionConfig::new(strategy.policy()))
        .shard_format(strategy.format);
    if let Some(tier) = &strategy.memory {
        config = config.memory_tier(tier.clone());
    }
    let mut ckpt = RankManager::start(config, engine, group.as_mut())?;
    // Where this rank resumes from: the disk's newest, or a newer step of the memory tier.
    let mut from = match strategy.resume {
        true => ckpt.resume_from(strategy.latest.clone())?,
        false => None,
    };
    let seed = match (ckpt.enabled(), strategy.seed) {
        (_, Some(s)) => s,
        (false, None) => 0,
        (true, None) => {
            return Err(Error::Config(
                "ZeroTrainingStrategy::seed is required when checkpointing: trainer.bin \
                 records the seed the run was trained with"
                    .into(),
            ));
        }
    };
    let zero = Zero1::new(&learner.model(), group);
    let shard_bytes = zero
        .partition()
        .owned_by(rank)
        .map(|p| p.numel() as u64 * 8)
        .sum();
    let (mut start_step, mut first_epoch, mut skip) = (0, *epochs.start(), 0);
    if let Some(from) = from.as_mut() {
        let (step, epoch, done) = restore_rank(from, &mut learner, zero.partition(), rank)?;
        (start_step, first_epoch, skip) = (step, epoch.max(1), done);
        if rank == 0
            && matches!(
                from.source(),
                RestoreSource::OwnMemory | RestoreSource::PeerReplica { .. }
            )
        {
            tracing::info!(step, source = ?from.source(), "resumed from the memory tier");
        }
    }
    let resumed = from.is_some();
    let mut run = RankRun {
        zero,
        ckpt,
        records: LearnerTap::new(store),
        seed,
        deterministic: strategy.deterministic,
        device: strategy.device.clone(),
        step: start_step,
        rank,
        wait_before_update: strategy.tuning.wait().applies_to_learner(&strategy.device),
        root: strategy.root.clone(),
        shard_bytes,
    };
    run.ckpt.resumed_at(start_step);
    // Burn's shuffled loaders draw a new order at every `iter()` from an RNG that starts afresh
    // in each process: replay the earlier epochs' draws (same rank count: same slices).
    if resumed {
        for _ in 1..first_epoch {
            drop(loader.iter());
        }
    }
    for epoch in first_epoch.max(*epochs.start())..=*epochs.end() {
        if let Some(l) = leader.as_mut() {
            l.interrupter
                .fail_on_error(l.events.process_train(LearnerEvent::StartSplit {
                    epoch_number: epoch,
                    total_items: loader.num_items(),
                }));
        }
        let s = if epoch == first_epoch { skip } else { 0 };
        let went_on = run.epoch(&mut learner, &loader, epoch, s, leader.as_mut())?;
        if let Some(l) = leader.as_mut() {
            l.interrupter
                .fail_on_error(l.events.process_train(LearnerEvent::EndSplit(epoch)));
        }
        // Rank 0 validates and decides whether to go on; everyone follows.
        let mine = went_on
            && match leader.as_mut() {
                Some(l) => after_epoch(&mut learner, epoch, l.events),
                None => true,
            };
        if !run.zero.group().all_agree(mine)? {
            break;
        }
    }
    let report = run.ckpt.finish()?;
    if rank == 0
        && let Some(m) = &report.memory
    {
        log_memory_tier(m);
    }
    strategy.reports.put(rank, report);
    Ok(learner)
}

/// Rank 0's summary of what the memory tier did (the learner route prints nothing else).
fn log_memory_tier(m: &MemoryTierReport) {
    let median = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied()
    };
    tracing::info!(
        saved = m.saved.len(),
        newest = ?m.saved.last(),
        skipped_while_one_ran = m.skipped,
        over_the_budget = m.throttled,
        not_whole = m.failed,
        median_save_ms = ?median(&m.save_ms),
        median_stall_ms = ?median(&m.stall_ms),
        cost_s = ?m.lost_s,
        training_s = m.training_s,
        peak_bytes = m.peak_bytes,
        off = m.off,
        "memory tier (rank 0)"
    );
}

impl<M: LearnerModel> SupervisedLearningStrategy<M> for ZeroTrainingStrategy {
    fn train(
        &self,
        learner: Learner<M>,
        dataloader_train: TrainLoader<M>,
        dataloader_valid: ValidLoader<M>,
        components: TrainingComponents<M>,
    ) -> LearningResult<M> {
        let interrupter = components.interrupter.clone();
        let starting_epoch = match self.resume_dir().map(load_trainer_state) {
            Some(Ok(t)) => (t.cursor.epoch as usize).max(1),
            Some(Err(e)) => {
                interrupter.fail(CheckpointerError::Unknown(e.to_string()));
                1
            }
            None => 1,
        };
        train_from_epoch(
            self,
            learner,
            dataloader_train,
            dataloader_valid,
            components,
            starting_epoch,
        )
    }

    fn fit(
        &self,
        components: TrainingComponents<M>,
        mut learner: Learner<M>,
        dataloader_train: TrainLoader<M>,
        dataloader_valid: ValidLoader<M>,
        starting_epoch: usize,
    ) -> (M, SupervisedTrainingEventProcessor<M>) {
        let TrainingComponents {
            interrupter,
            mut early_stopping,
            mut event_processor,
            event_store,
            num_epochs,
            grad_accumulation,
            ..
        } = components;
        if grad_accumulation.is_some() {
            interrupter.fail(CheckpointerError::Unknown(
                "ZeroTrainingStrategy does not support gradient accumulation".into(),
            ));
            return (learner.model(), event_processor);
        }
        learner.fork(&self.device);
        let train = dataloader_train.to_device(&self.device);
        let valid = dataloader_valid.to_device(&self.device.clone().inner());
        let n = self.ranks;
        let total = train.num_items();
        let shard = |r: usize| -> TrainLoader<M> {
            if self.replicate || n == 1 {
                train.slice(0, total)
            } else {
                train.slice(r * total / n, (r + 1) * total / n)
            }
        };
        // The root opened in `new` serves one training: a second one through the same
        // strategy (an `Arc` of it handed to two launches) finds it taken.
        let Some(mut opened) = self.opened.lock().unwrap_or_else(|e| e.into_inner()).take() else {
            interrupter.fail(CheckpointerError::Unknown(
                Error::Config(format!(
                    "this ZeroTrainingStrategy already trained into {}: it checkpoints one \
                     training; make a new strategy (ZeroTrainingStrategy::new, with \
                     resume_latest() to go on from its checkpoints) for each launch",
                    self.root.display()
                ))
                .to_string(),
            ));
            return (learner.model(), event_processor);
        };
        // A fresh run never writes into a used root (see `overwrite`).
        if let Err(e) = opened.settle(self.resume, self.overwrite) {
            interrupter.fail(CheckpointerError::Unknown(e.to_string()));
            return (learner.model(), event_processor);
        }
        let engine = Some(opened.into_engine());
        let mut groups = ThreadGroup::new(n, self.timeout).into_iter();
        let epochs = starting_epoch..=num_epochs;
        let outcome: Result<Learner<M>> = std::thread::scope(|s| {
            let mut handles = Vec::new();
            let g0 = groups
                .next()
                .ok_or_else(|| Error::Config("no ranks".into()))?;
            for g in groups {
                let rank = g.rank();
                let (l, loader, store) = (learner.clone(), shard(rank), event_store.clone());
                let epochs = epochs.clone();
                handles.push((
                    rank,
                    s.spawn(move || {
                        run_rank(
                            self,
                            Box::new(g),
                            None,
                            l,
                            loader,
                            store,
                            epochs,
                            None,
                            |_, _, _| true,
                        )
                        .map(|_| ())
                    }),
                ));
            }
            let leader = Leader {
                events: &mut event_processor,
                interrupter: &interrupter,
            };
            let valid = &valid;
            let store = event_store.clone();
            let validate = |learner: &mut Learner<M>,
                            epoch: usize,
                            events: &mut SupervisedTrainingEventProcessor<M>|
             -> bool {
                valid_epoch(learner, valid, epoch, events, &interrupter);
                !interrupter.should_stop()
                    && early_stopping
                        .as_mut()
                        .is_none_or(|es| !es.should_stop(epoch, &store))
            };
            let r0 = run_rank(
                self,
                Box::new(g0),
                engine,
                learner.clone(),
                shard(0),
                event_store.clone(),
                epochs.clone(),
                Some(leader),
                validate,
            );
            join_ranks(r0, handles)
        });
        match outcome {
            Ok(l) => (l.model(), event_processor),
            Err(e) => {
                interrupter.fail(CheckpointerError::Unknown(e.to_string()));
                (learner.model(), event_processor)
            }
        }
    }
}
