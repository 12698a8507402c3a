//! A drop-in for Burn's `SupervisedTraining::with_custom_checkpointers`: the three records Burn
//! hands over at a checkpoint (model, optimizer, LR scheduler) are joined by key and published
//! through a [`ckpt_core::Engine`] as **one** atomic checkpoint directory with a manifest,
//! instead of Burn's three independent files.
//!
//! The example is on [`CkptCheckpointers`].
//!
//! Behaviour:
//! - Burn's `AsyncCheckpointer` calls the three checkpointers from three threads, each with the
//!   record of one kind. The shared [`Collector`] keeps the records of a key until all three have
//!   arrived, then submits one [`Snapshot`] (`step-<key:08>/{model,optim,scheduler}.bpk` plus
//!   `manifest.json`). The records are encoded to burnpack on the engine's persist thread; the
//!   checkpointer threads only hand them over.
//! - The key is Burn's `epoch` argument: the directory is `step-<epoch:08>` and its manifest
//!   says so (entry `checkpoint_key: "epoch"`; `ckpt ls` shows the epoch and no step). With [`Collector::annotate`] a caller that passes a
//!   step as the key (the step-level [`crate::strategy::CkptTrainingStrategy`]) records the
//!   real epoch and extra manifest entries for that key.
//! - `restore(key)` reads the part from `step-<key:08>`, verifying size and checksum against the
//!   manifest, after waiting for in-flight saves.
//! - `delete(key)` does nothing: retention is the engine's ([`EngineConfig::retention`]), which
//!   runs only after a publication and never removes the newest valid checkpoint. Burn's
//!   per-kind deletes could otherwise break the set.
//! - Saving a key that is already published (training resumed from an earlier epoch and reached
//!   it again) replaces the old directory in one atomic exchange, so the key always has a valid
//!   copy (Burn's file checkpointer overwrites its files in the same situation).
//! - **Safe by default.** A run that does not resume never writes into a root that holds
//!   checkpoints: its first save fails with [`crate::Error::UsedRoot`], saying how to resume
//!   or start over, and the old run's checkpoints stay untouched.
//!   [`CkptCheckpointers::overwrite`] starts over explicitly: the old checkpoints are moved
//!   aside to `ROOT/.rewound-*` (each a warning) before the first save.
//! - **Rewind.** A run resumed from a checkpoint older than the newest one (Burn's
//!   `.checkpoint(k)`) abandons the later timeline: at the restore, every newer checkpoint is
//!   moved aside to `ROOT/.rewound-*` ([`ckpt_core::Engine::rewind`], each a warning) and
//!   `latest` names `k`, so `latest` always names a checkpoint of the current timeline.
//! - **CubeCL backends (wgpu, CUDA)** read a record's tensor data lazily: an optimizer record
//!   read after the next optimizer step holds that step's state. The collector reads the
//!   optimizer record as soon as it arrives ([`Collector::wait_optimizer_read`] waits for
//!   that). Burn's own epoch loop (these checkpointers without the strategy) does not wait: on
//!   CubeCL use the step-level strategy, which freezes the learner and takes its records
//!   itself ([`crate::FrozenState::capture_learner`]).
//! - Errors (encode, I/O, a background failure of an earlier save) are returned from `save` /
//!   `restore`; Burn's `AsyncCheckpointer` then fails the training through its interrupter, and
//!   they show in `LearningResult::error`.
//!
//! [`EngineConfig::retention`]: ckpt_core::EngineConfig

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use burn::optim::OptimizerRecord;
use burn::optim::lr_scheduler::LrSchedulerRecord;
use burn::store::ModuleRecord;
use burn::tensor::Bytes;
use burn::train::checkpoint::{
    Checkpoint, Checkpointer, CheckpointerError, CheckpointingAction, CheckpointingStrategy,
};
use burn::train::metric::store::EventStoreClient;
use ckpt_core::{
    Engine, EngineConfig, RecoveryReport, Snapshot, engine::Summary, layout::checkpoint_dir_name,
};

use crate::{MODEL_FILE, OPTIM_FILE, Result, SCHEDULER_FILE};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn unknown(e: impl std::fmt::Display) -> CheckpointerError {
    CheckpointerError::Unknown(e.to_string())
}

#[derive(Default)]
struct Pending {
    model: Option<ModuleRecord>,
    /// Read as soon as it arrives (see [`Collector::wait_optimizer_read`]).
    optim: Option<Bytes>,
    scheduler: Option<LrSchedulerRecord>,
}

/// Which record a checkpointer handles.
enum Record {
    Model(ModuleRecord),
    Optim(OptimizerRecord),
    Scheduler(LrSchedulerRecord),
}

/// A record as the collector keeps it: the optimizer's already read into memory.
enum Arrived {
    Model(ModuleRecord),
    Optim(Bytes),
    Scheduler(LrSchedulerRecord),
}

/// Joins the three records of one key and publishes them as one checkpoint. Shared by the three
/// checkpointers of [`CkptCheckpointers`].
pub struct Collector {
    root: PathBuf,
    engine: Mutex<Option<Engine>>,
    /// What start-up recovery did when the engine was opened.
    recovery: RecoveryReport,
    guard: Mutex<RunGuard>,
    pending: Mutex<BTreeMap<usize, Pending>>,
    /// Per key: epoch and extra manifest entries (absent: the key is the epoch).
    annotations: Mutex<BTreeMap<usize, Annotation>>,
    /// Per key: extra parts published with the three records (`trainer.bin`).
    extra: Mutex<BTreeMap<usize, Vec<Part>>>,
    /// Keys whose optimizer record has been read into memory (or failed to be), with the
    /// condition variable [`Collector::wait_optimizer_read`] waits on.
    optim_read: Mutex<BTreeMap<usize, std::result::Result<(), String>>>,
    optim_read_cv: std::sync::Condvar,
    /// Whether the first epoch-keyed save (Burn's own epoch loop) has said what it costs.
    epoch_route_said: std::sync::atomic::AtomicBool,
}

type Annotation = (u64, BTreeMap<String, serde_json::Value>);

/// An extra part of a checkpoint: its name and bytes.
type Part = (String, Vec<u8>);

/// How this run relates to the checkpoints already in the root.
#[derive(Debug, Default)]
struct RunGuard {
    /// The checkpoint this run resumed from (Burn restored it, or the strategy did).
    resumed: Option<u64>,
    /// Start over in a used root: move its checkpoints aside.
    overwrite: bool,
    /// The rewind (if any) is done and the run may save.
    settled: bool,
}

impl std::fmt::Debug for Collector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Collector")
            .field("root", &self.root)
            .finish()
    }
}

impl Collector {
    fn new(engine: Engine, recovery: RecoveryReport) -> Self {
        Self {
            root: engine.root().to_path_buf(),
            engine: Mutex::new(Some(engine)),
            recovery,
            guard: Mutex::new(RunGuard::default()),
            pending: Mutex::new(BTreeMap::new()),
            annotations: Mutex::new(BTreeMap::new()),
            extra: Mutex::new(BTreeMap::new()),
            optim_read: Mutex::new(BTreeMap::new()),
            optim_read_cv: std::sync::Condvar::new(),
            epoch_route_said: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The checkpoint root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// What start-up recovery did when the engine was opened (removed temporary data,
    /// quarantined checkpoints, the newest valid one).
    pub fn recovery(&self) -> &RecoveryReport {
        &self.recovery
    }

    /// The newest valid checkpoint found when the engine was opened.
    pub fn latest_step(&self) -> Option<u64> {
        self.recovery.latest.as_ref().map(|c| c.step)
    }

    /// Records that this run resumed from checkpoint `step` and rewinds to it (see the module
    /// docs). Burn's restore through the checkpointers calls it; so does a strategy that
    /// restores the learner itself.
    pub fn resumed_from(&self, step: u64) -> Result<()> {
        {
            let mut g = lock(&self.guard);
            if g.resumed.is_some() {
                return Ok(());
            }
            g.resumed = Some(step);
        }
        self.settle()
    }

    /// Makes the root ready for this run's first save: the rewind of a resumed run, the
    /// moving aside of an overwritten run; [`crate::Error::UsedRoot`] for a run that neither
    /// resumes nor overwrites a root holding checkpoints. Idempotent once it succeeded.
    pub fn settle(&self) -> Result<()> {
        let mut g = lock(&self.guard);
        if g.settled {
            return Ok(());
        }
        if let Some(to) =
            rewind_before_first_save(&self.root, self.latest_step(), g.resumed, g.overwrite)?
            && let Some(engine) = lock(&self.engine).as_mut()
        {
            engine.rewind(to)?;
        }
        g.settled = true;
        Ok(())
    }

    /// Records `epoch` and extra manifest entries for the checkpoint of `key` (for callers
    /// whose key is a step, not an epoch). Call it before handing the records over. Without it
    /// the key is recorded as the epoch.
    pub fn annotate(&self, key: usize, epoch: u64, meta: BTreeMap<String, serde_json::Value>) {
        lock(&self.annotations).insert(key, (epoch, meta));
    }

    /// Adds part `name` with `bytes` to the checkpoint of `key` (the strategy's `trainer.bin`).
    /// Call it before handing the records over.
    pub fn attach(&self, key: usize, name: impl Into<String>, bytes: Vec<u8>) {
        lock(&self.extra)
            .entry(key)
            .or_default()
            .push((name.into(), bytes));
    }

    /// Checkpoints queued or being written; `None` when the engine is busy accepting one (treat
    /// as persisting) or finished.
    pub fn in_flight(&self) -> Option<usize> {
        match self.engine.try_lock() {
            Ok(g) => g.as_ref().map(|e| e.in_flight()),
            Err(_) => None,
        }
    }

    /// Checkpoints published since the last call (non-blocking; empty when the engine is busy).
    /// A background error is returned once, here or from the next save.
    pub fn poll(&self) -> Result<Vec<ckpt_core::SaveEvent>> {
        match self.engine.try_lock() {
            Ok(mut g) => match g.as_mut() {
                Some(e) => Ok(e.poll()?),
                None => Ok(Vec::new()),
            },
            Err(_) => Ok(Vec::new()),
        }
    }

    /// Waits until every submitted checkpoint is published; the first background failure.
    pub fn wait_idle(&self) -> Result<Vec<ckpt_core::SaveEvent>> {
        match lock(&self.engine).as_mut() {
            Some(e) => Ok(e.wait_idle()?),
            None => Ok(Vec::new()),
        }
    }

    /// Waits until the optimizer record of checkpoint `key` has been read into memory, at
    /// most `timeout`. On CubeCL backends (wgpu, CUDA) a record's tensor data is read lazily
    /// and an optimizer record read after the next optimizer step can hold that step's state
    /// (found by two identical wgpu runs writing different `optim.bpk`), so the step-level
    /// strategy waits for this before training goes on. The model and scheduler records are
    /// not affected.
    pub fn wait_optimizer_read(&self, key: usize, timeout: std::time::Duration) -> Result<()> {
        let deadline = std::time::Instant::now() + timeout;
        let mut read = lock(&self.optim_read);
        loop {
            if let Some(r) = read.remove(&key) {
                return r.map_err(crate::Error::Config);
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Err(crate::Error::Config(format!(
                    "the optimizer record of checkpoint {key} did not arrive within {timeout:?}"
                )));
            }
            read = self
                .optim_read_cv
                .wait_timeout(read, left)
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
    }

    fn add(&self, key: usize, record: Record) -> std::result::Result<(), CheckpointerError> {
        let record = match record {
            Record::Model(r) => Arrived::Model(r),
            Record::Scheduler(r) => Arrived::Scheduler(r),
            Record::Optim(r) => {
                // Read now, before training goes on (see `wait_optimizer_read`).
                let read = r.into_bytes();
                let outcome = read
                    .as_ref()
                    .map(|_| ())
                    .map_err(|e| format!("reading the optimizer record of checkpoint {key}: {e}"));
                lock(&self.optim_read).insert(key, outcome.clone());
                self.optim_read_cv.notify_all();
                Arrived::Optim(read.map_err(|_| unknown(outcome.err().unwrap_or_default()))?)
            }
        };
        let complete = {
            let mut pending = lock(&self.pending);
            let slot = pending.entry(key).or_default();
            let dup = match record {
                Arrived::Model(r) => slot.model.replace(r).is_some(),
                Arrived::Optim(b) => slot.optim.replace(b).is_some(),
                Arrived::Scheduler(r) => slot.scheduler.replace(r).is_some(),
            };
            if dup {
                tracing::warn!(
                    key,
                    "a record for this checkpoint arrived twice; keeping the newer one"
                );
            }
            if slot.model.is_some() && slot.optim.is_some() && slot.scheduler.is_some() {
                pending.remove(&key)
            } else {
                None
            }
        };
        match complete {
            Some(Pending {
                model: Some(model),
                optim: Some(optim),
                scheduler: Some(scheduler),
            }) => self.publish(key, model, optim, scheduler),
            _ => Ok(()),
        }
    }

    fn publish(
        &self,
        key: usize,
        model: ModuleRecord,
        optim: Bytes,
        scheduler: LrSchedulerRecord,
    ) -> std::result::Result<(), CheckpointerError> {
        let step = key as u64;
        // Unannotated, the key is Burn's epoch number: said in the manifest, so that listings
        // tell these checkpoints from step-keyed ones (`ckpt ls` shows no step for them).
        let (epoch, meta) = lock(&self.annotations).remove(&key).unwrap_or_else(|| {
            if !self
                .epoch_route_said
                .swap(true, std::sync::atomic::Ordering::Relaxed)
            {
                tracing::info!(
                    root = %self.root.display(),
                    epoch = key,
                    "epoch checkpoints through Burn's own loop: Burn builds the model and \
                     optimizer records on the training thread before it hands them over, so each \
                     save stalls training as long as with Burn's own checkpointer; \
                     CkptTrainingStrategy with FrequencyPolicy::Never saves at the same epoch \
                     ends without that stall"
                );
            }
            let mut meta = BTreeMap::new();
            meta.insert(
                ckpt_core::Manifest::CHECKPOINT_KEY.to_string(),
                serde_json::Value::from("epoch"),
            );
            (step, meta)
        });
        let model_part = move |sink: &mut dyn Write| -> std::result::Result<(), BoxError> {
            sink.write_all(&model.into_bytes()?)?;
            Ok(())
        };
        // Burn lays optimizer tensors out in HashMap order; stream them out in the canonical
        // (name-sorted) layout the rest of this crate writes.
        let optim_part = move |sink: &mut dyn Write| -> std::result::Result<(), BoxError> {
            crate::encode::write_canonical_optimizer(optim, sink).map(drop)
        };
        let sched_part = move |sink: &mut dyn Write| -> std::result::Result<(), BoxError> {
            sink.write_all(&scheduler.into_bytes()?)?;
            Ok(())
        };
        self.settle().map_err(unknown)?;
        let mut snapshot = Snapshot::new(step)
            .with_epoch(epoch)
            .with_meta("source", "burn-learning-checkpointer")
            .with_producer(MODEL_FILE, model_part)
            .with_producer(OPTIM_FILE, optim_part)
            .with_producer(SCHEDULER_FILE, sched_part)
            // Resumed from an earlier key and reached this one again: swap atomically.
            .with_replace(true);
        snapshot.meta.extend(meta);
        for (name, bytes) in lock(&self.extra).remove(&key).unwrap_or_default() {
            snapshot = snapshot.with_bytes(name, bytes);
        }
        let mut guard = lock(&self.engine);
        let engine = guard
            .as_mut()
            .ok_or_else(|| unknown("checkpoint engine already finished"))?;
        engine.submit(snapshot).map_err(unknown)?;
        Ok(())
    }

    /// Submits a frozen training state as the checkpoint of its step (see
    /// [`crate::FrozenState::submit`]), once the root is ready for this run
    /// ([`Collector::settle`]).
    pub(crate) fn submit_frozen<M: burn::module::Module + 'static>(
        &self,
        frozen: crate::FrozenState<M>,
        gate: &mut ckpt_core::MemoryGate,
        decorate: impl FnOnce(Snapshot) -> Snapshot,
    ) -> Result<ckpt_core::Submitted> {
        self.settle()?;
        let mut guard = lock(&self.engine);
        let engine = guard.as_mut().ok_or_else(|| {
            crate::Error::Config("the checkpoint engine has already finished".into())
        })?;
        frozen.submit(engine, gate, decorate)
    }

    fn read(&self, key: usize, part: &str) -> std::result::Result<Bytes, CheckpointerError> {
        if let Some(engine) = lock(&self.engine).as_mut() {
            engine.wait_idle().map_err(unknown)?;
        }
        let dir = self.root.join(checkpoint_dir_name(key as u64));
        if !dir.exists() {
            return Err(unknown(format!(
                "{} holds no checkpoint {}: SupervisedTraining::checkpoint(n) takes the step of \
                 a published checkpoint ({}), or let CkptTrainingStrategy::resume_latest() find it",
                self.root.display(),
                checkpoint_dir_name(key as u64),
                match self.latest_step() {
                    Some(s) => format!("the newest is {s}"),
                    None => "there are none".into(),
                }
            )));
        }
        let bytes = ckpt_core::read_part(&dir, part).map_err(unknown)?;
        // Burn restores before training: this run continues from `key`.
        self.resumed_from(key as u64).map_err(unknown)?;
        Ok(Bytes::from_bytes_vec(bytes))
    }

    fn finish(&self) -> Result<Summary> {
        let engine = lock(&self.engine).take();
        let dropped = std::mem::take(&mut *lock(&self.pending));
        if !dropped.is_empty() {
            tracing::warn!(
                keys = ?dropped.keys().collect::<Vec<_>>(),
                "incomplete checkpoint record sets dropped at finish"
            );
        }
        match engine {
            Some(e) => Ok(e.finish()?),
            None => Ok(Summary::default()),
        }
    }
}

/// What a run does to its root before its first save, given the root's newest valid
/// checkpoint, the checkpoint the run resumed from and whether it starts over: nothing
/// (`None`: an empty root), a rewind to the resumed step or, starting over, of every
/// checkpoint (`Some(to)`, for [`Engine::rewind`]), or [`crate::Error::UsedRoot`] for a run
/// that neither resumes nor starts over in a root holding checkpoints. The one used-root
/// policy of the learner route and [`crate::CheckpointManager`].
pub(crate) fn rewind_before_first_save(
    root: &Path,
    newest: Option<u64>,
    resumed: Option<u64>,
    overwrite: bool,
) -> Result<Option<Option<u64>>> {
    match (newest, resumed, overwrite) {
        (None, _, _) => Ok(None),
        (Some(_), Some(k), _) => Ok(Some(Some(k))),
        (Some(_), None, true) => Ok(Some(None)),
        (Some(newest), None, false) => Err(crate::Error::UsedRoot {
            root: root.to_path_buf(),
            newest,
        }),
    }
}

/// The handle that owns the shared [`Collector`] and hands out the three checkpointers.
///
/// ```no_run
/// # use burn::train::{Learner, SupervisedTraining, LearnerModel};
/// # fn demo<M: LearnerModel>(training: SupervisedTraining<M>, learner: Learner<M>)
/// # -> Result<(), ckpt_burn::Error> {
/// use ckpt_burn::checkpointers::{AlwaysSave, CkptCheckpointers};
/// use ckpt_core::EngineConfig;
///
/// let ckpt = CkptCheckpointers::open(EngineConfig::new("runs/demo/ckpt"))?;
/// let (model_ckpt, optim_ckpt, sched_ckpt) = ckpt.checkpointers();
/// let result = training
///     .with_custom_checkpointers(model_ckpt, optim_ckpt, sched_ckpt)
///     .with_checkpointing_strategy(AlwaysSave) // optional: Burn's default also saves every epoch
///     .launch(learner);
/// ckpt.finish()?; // waits for the last checkpoint and returns any background error
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct CkptCheckpointers {
    collector: Arc<Collector>,
}

impl CkptCheckpointers {
    /// Opens a [`ckpt_core::Engine`] on `config.root` (writer lock, start-up recovery).
    pub fn open(config: EngineConfig) -> Result<Self> {
        Ok(Self::open_with_report(config)?.0)
    }

    /// Like [`Self::open`], also returning the start-up recovery report.
    pub fn open_with_report(config: EngineConfig) -> Result<(Self, RecoveryReport)> {
        let (engine, report) = Engine::open(config)?;
        Ok((
            Self::from_engine_with_report(engine, report.clone()),
            report,
        ))
    }

    /// Uses an engine that is already open (its recovery report unknown).
    pub fn from_engine(engine: Engine) -> Self {
        Self::from_engine_with_report(engine, RecoveryReport::default())
    }

    /// Uses an engine that is already open, with the report its `open` returned.
    pub fn from_engine_with_report(engine: Engine, recovery: RecoveryReport) -> Self {
        Self {
            collector: Arc::new(Collector::new(engine, recovery)),
        }
    }

    /// Start over in a root that holds checkpoints of an earlier run: before this run's first
    /// save they are moved aside to `ROOT/.rewound-*` (each a warning), instead of the save
    /// being refused ([`crate::Error::UsedRoot`]). No effect on a run that resumes.
    pub fn overwrite(self, yes: bool) -> Self {
        lock(&self.collector.guard).overwrite = yes;
        self
    }

    /// The shared collector.
    pub fn collector(&self) -> &Arc<Collector> {
        &self.collector
    }

    /// The three checkpointers for `SupervisedTraining::with_custom_checkpointers`.
    pub fn checkpointers(&self) -> (ModelCheckpointer, OptimCheckpointer, SchedulerCheckpointer) {
        (
            ModelCheckpointer(self.collector.clone()),
            OptimCheckpointer(self.collector.clone()),
            SchedulerCheckpointer(self.collector.clone()),
        )
    }

    /// Waits for every submitted checkpoint to be published and stops the engine (releasing
    /// the root's lock). Returns the first background error, if any. Call it after `launch`
    /// returned (Burn's checkpointer threads have handed everything over by then).
    pub fn finish(&self) -> Result<Summary> {
        self.collector.finish()
    }

    /// [`Self::finish`] within `grace` (after a stop signal, say): when the last checkpoint is
    /// not durable by then, returns [`crate::Error::GraceExpired`] and leaves the wait to a
    /// helper thread, so the caller can exit; an unfinished checkpoint is then never
    /// published, the checkpoints published before it are intact.
    pub fn finish_within(&self, grace: std::time::Duration) -> Result<Summary> {
        let collector = self.collector.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("ckpt-finish".into())
            .spawn(move || {
                let _ = tx.send(collector.finish());
            })
            .map_err(|e| crate::Error::Config(format!("cannot start the finish thread: {e}")))?;
        match rx.recv_timeout(grace) {
            Ok(r) => r,
            Err(_) => Err(crate::Error::GraceExpired {
                root: self.collector.root.clone(),
                grace,
            }),
        }
    }
}

macro_rules! checkpointer {
    ($name:ident, $rec:ty, $variant:ident, $file:expr, $doc:literal) => {
        #[doc = $doc]
        #[derive(Debug, Clone)]
        pub struct $name(Arc<Collector>);

        impl $name {
            /// The checkpointer of `collector`'s root.
            pub fn new(collector: Arc<Collector>) -> Self {
                Self(collector)
            }
        }

        impl Checkpointer<$rec> for $name {
            fn save(
                &self,
                epoch: usize,
                record: $rec,
            ) -> std::result::Result<(), CheckpointerError> {
                self.0.add(epoch, Record::$variant(record))
            }
            fn delete(&self, _epoch: usize) -> std::result::Result<(), CheckpointerError> {
                Ok(())
            }
            fn restore(&self, epoch: usize) -> std::result::Result<$rec, CheckpointerError> {
                let bytes = self.0.read(epoch, $file)?;
                <$rec as Checkpoint>::checkpoint_from_bytes(bytes)
                    .map_err(CheckpointerError::Record)
            }
        }
    };
}

checkpointer!(
    ModelCheckpointer,
    ModuleRecord,
    Model,
    MODEL_FILE,
    "Checkpointer of the model record (`model.bpk`)."
);
checkpointer!(
    OptimCheckpointer,
    OptimizerRecord,
    Optim,
    OPTIM_FILE,
    "Checkpointer of the optimizer record (`optim.bpk`)."
);
checkpointer!(
    SchedulerCheckpointer,
    LrSchedulerRecord,
    Scheduler,
    SCHEDULER_FILE,
    "Checkpointer of the LR-scheduler record (`scheduler.bpk`)."
);

/// A `CheckpointingStrategy` that saves at every call and never deletes (retention belongs to
/// the engine). Burn's default strategy also saves every epoch, but additionally asks to delete
/// old epochs, which these checkpointers ignore.
#[derive(Debug, Clone, Copy, Default)]
pub struct AlwaysSave;

impl CheckpointingStrategy for AlwaysSave {
    fn checkpointing(
        &mut self,
        _epoch: usize,
        _store: &EventStoreClient,
    ) -> Vec<CheckpointingAction> {
        vec![CheckpointingAction::Save]
    }
}

/// The collector as a [`ckpt_core::SaveTarget`], for a [`ckpt_core::CheckpointSession`] whose
/// saves are handed over through Burn's `LearningCheckpointer`.
impl ckpt_core::SaveTarget for &Collector {
    type Error = crate::Error;
    fn in_flight(&self) -> usize {
        // Busy accepting a checkpoint counts as persisting.
        Collector::in_flight(self).unwrap_or(1)
    }
    fn poll(&mut self) -> Result<Vec<ckpt_core::SaveEvent>> {
        Collector::poll(self)
    }
    fn wait_idle(&mut self) -> Result<Vec<ckpt_core::SaveEvent>> {
        Collector::wait_idle(self)
    }
    fn held_bytes(&self) -> Option<u64> {
        lock(&self.engine).as_ref().map(|e| e.held_bytes())
    }
    fn wait_held_at_most(&mut self, limit: u64) -> Result<bool> {
        match lock(&self.engine).as_ref() {
            Some(e) => Ok(e.wait_held_at_most(limit).map(|_| true)?),
            None => Ok(false),
        }
    }
}
