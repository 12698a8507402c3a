//! [`CheckpointManager`]: a run's checkpointing for a training loop of your own, in a few
//! lines (Orbax's `CheckpointManager` shape: one object, `step` decides by policy).
//!
//! The example is on [`CheckpointManager`].
//!
//! What it owns: opening the root (the writer lock, start-up recovery, refusing a used root
//! unless the run resumes or [`ManagerConfig::overwrite`] says to start over), restoring the
//! newest valid checkpoint, the per-step decision ([`CheckpointSession`]: frequency, the last
//! step, stop requests), the save itself ([`FrozenState::capture`] then
//! [`FrozenState::submit`]: handle clones on the training thread, staging, encoding and
//! writing in the background, under the snapshot budget), background errors (returned from
//! the next `step`), retention, and the final wait with its report.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use burn::module::Module;
use burn::optim::ModuleOptimizer;
use burn::optim::lr_scheduler::module_lr_scheduler::ModuleLrScheduler;
use ckpt_core::{
    Backpressure, CheckpointSession, Engine, EngineConfig, FrequencyPolicy, Retention,
    SaveErrorPolicy, SaveEvent, SaveRoute, SaveTarget, SessionConfig, SessionReport, Submitted,
};
use serde::Serialize;

use crate::{DataCursor, Error, FrozenState, Result, SaveTuning, TrainerState, UpdateWaits};

/// Settings of a [`CheckpointManager`]; [`ManagerConfig::new`] has the defaults.
#[derive(Debug, Clone)]
pub struct ManagerConfig {
    root: PathBuf,
    policy: FrequencyPolicy,
    keep_last: Option<usize>,
    seed: u64,
    end_step: Option<u64>,
    overwrite: bool,
    stop: Option<(Arc<AtomicBool>, Option<Duration>)>,
    on_save_error: SaveErrorPolicy,
    max_in_flight: usize,
    backpressure: Backpressure,
    tuning: SaveTuning,
    blocking: bool,
    #[cfg(feature = "remote")]
    upload: Option<(String, ckpt_remote::RemoteConfig)>,
}

impl ManagerConfig {
    /// Checkpoints under `root`: every 100 steps, the newest 3 kept, one save persisting at a
    /// time (the next waits for it), a failed save stopping the run, and [`SaveTuning`]'s
    /// `auto` settings (the snapshot budget: half the memory available at start).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            policy: FrequencyPolicy::EverySteps(100),
            keep_last: Some(3),
            seed: 0,
            end_step: None,
            overwrite: false,
            stop: None,
            on_save_error: SaveErrorPolicy::Stop,
            max_in_flight: 1,
            backpressure: Backpressure::Block,
            tuning: SaveTuning::default(),
            blocking: false,
            #[cfg(feature = "remote")]
            upload: None,
        }
    }

    /// Checkpoint every `n` optimizer steps (0: checkpointing off, no save at all, not even
    /// at a stop request or the last step).
    pub fn every_steps(mut self, n: u64) -> Self {
        self.policy = match n {
            0 => FrequencyPolicy::Never,
            n => FrequencyPolicy::EverySteps(n),
        };
        self
    }

    /// When to checkpoint ([`FrequencyPolicy`]: steps, seconds, or an overhead budget).
    pub fn frequency(mut self, policy: FrequencyPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Keep the newest `n` checkpoints (`None`: all). Retention runs after each publication
    /// and never removes the newest valid checkpoint.
    pub fn keep_last(mut self, n: Option<usize>) -> Self {
        self.keep_last = n;
        self
    }

    /// The run's base seed, recorded in `trainer.bin`.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// The run's last step: always checkpointed, and `step` returns `true` there.
    pub fn end_step(mut self, step: u64) -> Self {
        self.end_step = Some(step);
        self
    }

    /// Start over in a root that holds checkpoints of an earlier run: `resume` restores
    /// nothing, and at the first `step` the old checkpoints are moved aside to
    /// `ROOT/.rewound-*` (each a warning), instead of that `step` failing with
    /// [`Error::UsedRoot`] before anything is written.
    pub fn overwrite(mut self, yes: bool) -> Self {
        self.overwrite = yes;
        self
    }

    /// Stop cleanly once `flag` is set (by a signal handler, [`crate::stop::StopOnSignal`], or
    /// a batch system's notice): the next `step` checkpoints that step and returns `true`, and
    /// [`CheckpointManager::finish`] waits at most `grace` (`None`: as long as it takes) for
    /// it to be durable.
    pub fn stop_on(mut self, flag: Arc<AtomicBool>, grace: Option<Duration>) -> Self {
        self.stop = Some((flag, grace));
        self
    }

    /// What a save that fails in the background does to the run (default: stop it with the
    /// error at the next `step`).
    pub fn on_save_error(mut self, policy: SaveErrorPolicy) -> Self {
        self.on_save_error = policy;
        self
    }

    /// Checkpoints persisting at once (at least 1; default 1).
    pub fn max_in_flight(mut self, n: usize) -> Self {
        self.max_in_flight = n.max(1);
        self
    }

    /// What a save does when `max_in_flight` are persisting already (default: wait).
    pub fn backpressure(mut self, b: Backpressure) -> Self {
        self.backpressure = b;
        self
    }

    /// How background saves trade memory against training time ([`SaveTuning`]; every
    /// setting `auto` by default).
    pub fn tuning(mut self, tuning: SaveTuning) -> Self {
        self.tuning = tuning;
        self
    }

    /// Write each checkpoint before `step` returns (encoded on the training thread), the same
    /// bytes as a background save: for comparisons and debugging.
    pub fn blocking(mut self, yes: bool) -> Self {
        self.blocking = yes;
        self
    }

    /// Upload every published checkpoint to `url` (`s3://bucket/prefix`) in the background;
    /// `resume` restores from there when no valid local checkpoint is as new, and `finish`
    /// waits for the uploads.
    #[cfg(feature = "remote")]
    pub fn upload_to(mut self, url: impl Into<String>, config: ckpt_remote::RemoteConfig) -> Self {
        self.upload = Some((url.into(), config));
        self
    }
}

/// Where a checkpoint a run resumed from came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResumedFrom {
    /// Its step.
    pub step: u64,
    /// Its directory in the root.
    pub dir: PathBuf,
    /// The object-store URL it was restored from, when no valid local checkpoint was as new.
    pub remote: Option<String>,
}

/// What a run's checkpointing did, from [`CheckpointManager::finish`].
#[derive(Debug, Clone, Default, Serialize)]
pub struct ManagerReport {
    /// The saves: their stalls, persist times, routes, failures, the stop and the lost time.
    #[serde(flatten)]
    pub session: SessionReport,
    /// The object-store tier's uploads (empty without one).
    pub uploads: Vec<UploadRecord>,
}

/// One finished upload to the object-store tier, for a run's report.
#[derive(Debug, Clone, Serialize)]
pub struct UploadRecord {
    /// Step.
    pub step: u64,
    /// Bytes uploaded.
    pub bytes: u64,
    /// Time the upload took, in milliseconds.
    pub ms: f64,
}

/// The engine and the object-store tier behind it.
struct Saves {
    engine: Engine,
    #[cfg(feature = "remote")]
    tier: Option<crate::upload::UploadTier>,
}

impl Saves {
    /// Hands newly published checkpoints to the object-store tier.
    fn published(&mut self, events: Vec<SaveEvent>) -> Result<Vec<SaveEvent>> {
        #[cfg(feature = "remote")]
        if let Some(tier) = &mut self.tier {
            tier.published(&events)?;
        }
        Ok(events)
    }

    /// Waits for every save and upload; the uploads of the run.
    fn close(self) -> Result<(Vec<SaveEvent>, Vec<UploadRecord>)> {
        #[cfg(feature = "remote")]
        let Self { engine, mut tier } = self;
        #[cfg(not(feature = "remote"))]
        let Self { engine } = self;
        let events = engine.finish()?.events;
        #[cfg(feature = "remote")]
        let uploads = match &mut tier {
            Some(tier) => {
                tier.published(&events)?;
                tier.finish()?
            }
            None => Vec::new(),
        };
        #[cfg(not(feature = "remote"))]
        let uploads = Vec::new();
        Ok((events, uploads))
    }
}

impl SaveTarget for Saves {
    type Error = Error;
    fn in_flight(&self) -> usize {
        self.engine.in_flight()
    }
    fn poll(&mut self) -> Result<Vec<SaveEvent>> {
        let events = self.engine.poll()?;
        self.published(events)
    }
    fn wait_idle(&mut self) -> Result<Vec<SaveEvent>> {
        let events = self.engine.wait_idle()?;
        self.published(events)
    }
    fn blocked_total(&self) -> Duration {
        self.engine.metrics().blocked_total
    }
    fn held_bytes(&self) -> Option<u64> {
        Some(self.engine.held_bytes())
    }
    fn wait_held_at_most(&mut self, limit: u64) -> Result<bool> {
        Ok(self.engine.wait_held_at_most(limit).map(|_| true)?)
    }
}

/// A run's checkpointing for a loop of your own (see the module docs).
///
/// ```no_run
/// # use burn::optim::ModuleOptimizer;
/// # use burn::optim::lr_scheduler::module_lr_scheduler::ModuleLrScheduler;
/// # fn demo<M: burn::module::Module + 'static>(
/// #     mut model: M, mut optim: ModuleOptimizer, mut sched: ModuleLrScheduler, steps: u64,
/// # ) -> Result<(), ckpt_burn::Error> {
/// use ckpt_burn::{CheckpointManager, DataCursor, ManagerConfig};
///
/// let mut ckpt = CheckpointManager::open(ManagerConfig::new("runs/x").every_steps(100))?;
/// let start = ckpt.resume(&mut model, &mut optim, &mut sched)?.map_or(0, |t| t.step);
/// for step in start + 1..=steps {
///     // ... forward, backward, `model = optim.step(lr, model, grads)` ...
///     if ckpt.step(step, &model, &optim, &sched, DataCursor::default())? { break; }
/// }
/// ckpt.finish()?;
/// # Ok(()) }
/// ```
pub struct CheckpointManager {
    saves: Saves,
    session: CheckpointSession,
    seed: u64,
    tuning: SaveTuning,
    blocking: bool,
    /// The newest valid checkpoint found at open.
    latest: Option<(u64, PathBuf)>,
    /// The checkpoint the run resumed from.
    resumed: Option<ResumedFrom>,
    overwrite: bool,
    /// Whether the root is ready for this run's saves.
    settled: bool,
    /// When the previous `step` call returned (a step's time is measured between calls).
    last_step: Option<Instant>,
    /// Whether updates wait for the saves ([`SaveTuning::update_wait`] on the state's device),
    /// decided at the first save.
    update_waits: Option<bool>,
    /// The newest save submitted and the updates' waits by save, added to those saves' stalls
    /// in the report.
    waits: UpdateWaits,
}

impl std::fmt::Debug for CheckpointManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CheckpointManager")
            .field("root", &self.saves.engine.root())
            .field("latest", &self.latest)
            .finish_non_exhaustive()
    }
}

impl CheckpointManager {
    /// Opens `config`'s root: takes its writer lock (a second process gets a clear error) and
    /// runs start-up recovery (stale temporary data removed, invalid checkpoints moved aside,
    /// each a warning), and connects the object-store tier, if any.
    pub fn open(config: ManagerConfig) -> Result<Self> {
        let retention = match config.keep_last {
            Some(n) => Retention::keep_last(n.max(1)),
            None => Retention::keep_all(),
        };
        let (engine, report) = Engine::open(
            EngineConfig::new(&config.root)
                .retention(retention)
                .max_in_flight(config.max_in_flight)
                .backpressure(config.backpressure),
        )?;
        let budget = config.tuning.budget();
        if budget.is_none() {
            tracing::info!("no snapshot memory budget: saves may hold as much as they need");
        }
        let mut session = SessionConfig::new(config.policy)
            .memory_budget(budget)
            .on_save_error(config.on_save_error);
        if let Some(end) = config.end_step {
            session = session.end_step(end);
        }
        if let Some((flag, grace)) = config.stop {
            session = session.stop_on(flag, grace);
        }
        #[cfg(feature = "remote")]
        let tier = match &config.upload {
            Some((url, rc)) => Some(crate::upload::UploadTier::open(url, rc.clone())?),
            None => None,
        };
        Ok(Self {
            saves: Saves {
                engine,
                #[cfg(feature = "remote")]
                tier,
            },
            session: CheckpointSession::new(session),
            seed: config.seed,
            tuning: config.tuning,
            blocking: config.blocking,
            latest: report.latest.map(|c| (c.step, c.path)),
            resumed: None,
            overwrite: config.overwrite,
            settled: false,
            // The first step's time counts from here (or from the end of `resume`), not 0 s,
            // which would pull the frequency controller's baseline down.
            last_step: Some(Instant::now()),
            update_waits: None,
            waits: UpdateWaits::default(),
        })
    }

    /// The checkpoint root.
    pub fn root(&self) -> &Path {
        self.saves.engine.root()
    }

    /// The newest valid local checkpoint found at open: its step and directory.
    pub fn latest(&self) -> Option<(u64, &Path)> {
        self.latest.as_ref().map(|(s, p)| (*s, p.as_path()))
    }

    /// The checkpoint `resume` restored, if any.
    pub fn resumed_from(&self) -> Option<&ResumedFrom> {
        self.resumed.as_ref()
    }

    /// Checkpoints published so far.
    pub fn published(&self) -> usize {
        self.session.published()
    }

    /// The step of the newest save this run submitted.
    pub fn last_saved(&self) -> Option<u64> {
        self.waits.newest()
    }

    /// Checkpoints being persisted now.
    pub fn in_flight(&self) -> usize {
        self.saves.in_flight()
    }

    /// Restores the newest valid checkpoint into `model`, `optim` and `sched` and returns its
    /// trainer state (step, epoch, data cursor), or `None` on an empty root or with
    /// [`ManagerConfig::overwrite`] (nothing changed). With an object-store tier, a newer
    /// valid remote checkpoint is downloaded into the root first (a warning says so).
    pub fn resume<M: Module>(
        &mut self,
        model: &mut M,
        optim: &mut ModuleOptimizer,
        sched: &mut ModuleLrScheduler,
    ) -> Result<Option<TrainerState>> {
        if self.overwrite {
            if let Some((step, _)) = &self.latest {
                tracing::info!(
                    step,
                    "overwrite: not resuming from the newest checkpoint; the run starts over"
                );
            }
            return Ok(None);
        }
        #[allow(unused_mut)]
        let mut remote = None;
        #[cfg(feature = "remote")]
        if let Some(tier) = &self.saves.tier {
            let local = self.latest.as_ref().map(|(s, _)| *s);
            if let Some((step, dir, from)) = tier.restore(&mut self.saves.engine, local)? {
                self.latest = Some((step, dir));
                remote = Some(from);
            }
        }
        let Some((step, dir)) = self.latest.clone() else {
            return Ok(None);
        };
        let r = crate::restore(&dir, model.clone(), optim.clone(), sched.clone())?;
        *model = r.model;
        *optim = r.optim;
        *sched = r.scheduler;
        self.session.resumed_at(step);
        tracing::info!(step, dir = %dir.display(), "resumed from the newest valid checkpoint");
        self.resumed = Some(ResumedFrom { step, dir, remote });
        self.last_step = Some(Instant::now());
        Ok(Some(r.trainer))
    }

    /// Makes the root ready for this run's saves (at the first `step`): refuses a used root the
    /// run did not resume, or moves its checkpoints aside ([`ManagerConfig::overwrite`]).
    fn settle(&mut self) -> Result<()> {
        if self.settled {
            return Ok(());
        }
        let newest = self.latest.as_ref().map(|(step, _)| *step);
        let resumed = self.resumed.as_ref().map(|r| r.step);
        if let Some(to) = crate::checkpointers::rewind_before_first_save(
            self.saves.engine.root(),
            newest,
            resumed,
            self.overwrite,
        )? {
            self.saves.engine.rewind(to)?;
        }
        self.settled = true;
        Ok(())
    }

    /// Between the backward pass and the optimizer update: waits, where
    /// [`SaveTuning::update_wait`] says so (by default on device memory only), until the saves
    /// hold none of the state the update overwrites, so the update writes in place instead of
    /// copying it. A no-op on host memory by default. Returns the time waited, which counts in
    /// the save's stall.
    pub fn before_update(&mut self) -> Duration {
        self.waits.before_update(self.update_waits == Some(true))
    }

    /// After optimizer step `step`: checkpoints the state if the policy says so (a handle
    /// clone on this thread; the rest in the background), records finished saves and returns
    /// a background failure of an earlier save. `true` when the run should stop here (its
    /// last step, or a stop request); the step's state is then being saved.
    pub fn step<M: Module + 'static>(
        &mut self,
        step: u64,
        model: &M,
        optim: &ModuleOptimizer,
        sched: &ModuleLrScheduler,
        cursor: DataCursor,
    ) -> Result<bool> {
        let now = Instant::now();
        let took = self.last_step.map_or_else(Duration::default, |t| now - t);
        self.settle()?;
        let seed = self.seed;
        let (tuning, blocking) = (self.tuning, self.blocking);
        let Self { saves, session, .. } = self;
        let b = session.boundary(step, took, saves.in_flight(), Ok::<_, Error>)?;
        if b.save {
            let mut device = None;
            session.save(saves, step, |s, gate| {
                let trainer = TrainerState::new(step, cursor, seed);
                let frozen = FrozenState::capture(model, optim, sched, trainer)
                    .with_optimizer_read(tuning.read());
                device = frozen.device();
                if blocking {
                    let t0 = Instant::now();
                    let snap = frozen.encode()?.into_snapshot();
                    let outcome = s.engine.submit(snap.with_capture_time(t0.elapsed()))?;
                    return Ok(Submitted {
                        outcome,
                        route: SaveRoute::Blocking,
                    });
                }
                frozen.submit(&mut s.engine, gate, |snap| snap)
            })?;
            if self.update_waits.is_none()
                && let Some(d) = &device
            {
                self.update_waits = Some(tuning.wait().applies_to(d));
            }
            self.waits.saved(step);
        }
        self.session.poll(&mut self.saves)?;
        self.last_step = Some(Instant::now());
        Ok(b.last)
    }

    /// Waits for every save (and upload) to be durable, releases the root and returns what the
    /// saves cost ([`ManagerReport`]; an update's wait for a save counts in its stall), or the
    /// first background failure.
    pub fn finish(self) -> Result<ManagerReport> {
        // `finish` closes the saves on a thread of its own (a stop's grace period can expire).
        let uploads = Arc::new(std::sync::Mutex::new(Vec::new()));
        let slot = uploads.clone();
        let mut session = self.session.finish(self.saves, move |s| {
            let (events, up) = s.close()?;
            if let Ok(mut u) = slot.lock() {
                *u = up;
            }
            Ok::<_, Error>(events)
        })?;
        self.waits.add_to(&mut session);
        let uploads = uploads
            .lock()
            .map(|mut u| std::mem::take(&mut *u))
            .unwrap_or_default();
        Ok(ManagerReport { session, uploads })
    }
}
