//! [`CheckpointManager`]: a run's checkpointing for a training loop of your own, in a few
//! lines (Orbax's `CheckpointManager` shape: one object, `step` decides by policy).
//!
//! ```no_run
//! # use burn::optim::ModuleOptimizer;
//! # use burn::optim::lr_scheduler::module_lr_scheduler::ModuleLrScheduler;
//! # fn demo<M: burn::module::Module + 'static>(
//! #     mut model: M, mut optim: ModuleOptimizer, mut sched: ModuleLrScheduler, steps: u64,
//! # ) -> Result<(), ckpt_burn::Error> {
//! use ckpt_burn::{CheckpointManager, DataCursor, ManagerConfig};
//!
//! let mut ckpt = CheckpointManager::open(ManagerConfig::new("runs/x").every_steps(100))?;
//! let start = ckpt.resume(&mut model, &mut optim, &mut sched)?.map_or(0, |t| t.step);
//! for step in start + 1..=steps {
//!     // ... forward, backward, `model = optim.step(lr, model, grads)` ...
//!     if ckpt.step(step, &model, &optim, &sched, DataCursor::default())? { break; }
//! }
//! ckpt.finish()?;
//! # Ok(()) }
//! ```
//!
//! What it owns: opening the root (the writer lock, start-up recovery, refusing a used root
//! unless the run resumes or [`ManagerConfig::overwrite`] says to start over), restoring the
//! newest valid checkpoint, the per-step decision ([`CheckpointSession`]: frequency, the last
//! step, stop requests), the save itself ([`FrozenState::capture`] then
//! [`FrozenState::submit`]: handle clones on the training thread, staging, encoding and
//! writing in the background, under the snapshot budget), background errors (returned from
//! the next `step`), retention, and the final wait with its report.

use std::path::PathBuf;
use std::time::Instant;

use burn::module::Module;
use burn::optim::ModuleOptimizer;
use burn::optim::lr_scheduler::module_lr_scheduler::ModuleLrScheduler;
use ckpt_core::{
    CheckpointSession, Engine, EngineConfig, FrequencyPolicy, Retention, SessionConfig,
    SessionReport,
};

use crate::{DataCursor, Error, FrozenState, Result, TrainerState};

/// Settings of a [`CheckpointManager`]; [`ManagerConfig::new`] has the defaults.
#[derive(Debug, Clone)]
pub struct ManagerConfig {
    root: PathBuf,
    policy: FrequencyPolicy,
    keep_last: Option<usize>,
    seed: u64,
    memory_budget: Option<Option<u64>>,
    end_step: Option<u64>,
    overwrite: bool,
}

impl ManagerConfig {
    /// Checkpoints under `root`: every 100 steps, the newest 3 kept, the snapshot budget
    /// `auto` (half the memory available at start), no known last step.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            policy: FrequencyPolicy::EverySteps(100),
            keep_last: Some(3),
            seed: 0,
            memory_budget: None,
            end_step: None,
            overwrite: false,
        }
    }

    /// Checkpoint every `n` optimizer steps.
    pub fn every_steps(mut self, n: u64) -> Self {
        self.policy = FrequencyPolicy::EverySteps(n);
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

    /// The run's base seed, recorded in `trainer.bin` and checked by nothing here.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Extra memory a save may take, in bytes (`None`: no limit); by default `auto`.
    pub fn memory_budget(mut self, bytes: Option<u64>) -> Self {
        self.memory_budget = Some(bytes);
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
}

/// A run's checkpointing for a loop of your own (see the module docs).
pub struct CheckpointManager {
    engine: Engine,
    session: CheckpointSession,
    seed: u64,
    /// The newest valid checkpoint found at open.
    latest: Option<(u64, PathBuf)>,
    /// Whether the run resumed from `latest`.
    resumed: bool,
    overwrite: bool,
    /// Whether the root is ready for this run's saves.
    settled: bool,
    /// When the previous `step` call returned (a step's time is measured between calls).
    last_step: Option<Instant>,
}

impl std::fmt::Debug for CheckpointManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CheckpointManager")
            .field("root", &self.engine.root())
            .field("latest", &self.latest)
            .finish_non_exhaustive()
    }
}

impl CheckpointManager {
    /// Opens `config`'s root: takes its writer lock (a second process gets a clear error) and
    /// runs start-up recovery (stale temporary data removed, invalid checkpoints moved aside,
    /// each a warning).
    pub fn open(config: ManagerConfig) -> Result<Self> {
        let retention = match config.keep_last {
            Some(n) => Retention::keep_last(n),
            None => Retention::keep_all(),
        };
        let (engine, report) = Engine::open(EngineConfig::new(&config.root).retention(retention))?;
        let budget = config
            .memory_budget
            .unwrap_or_else(ckpt_core::auto_snapshot_budget);
        let mut session = SessionConfig::new(config.policy).memory_budget(budget);
        if let Some(end) = config.end_step {
            session = session.end_step(end);
        }
        Ok(Self {
            engine,
            session: CheckpointSession::new(session),
            seed: config.seed,
            latest: report.latest.map(|c| (c.step, c.path)),
            resumed: false,
            overwrite: config.overwrite,
            settled: false,
            last_step: None,
        })
    }

    /// Restores the newest valid checkpoint into `model`, `optim` and `sched` and returns its
    /// trainer state (step, epoch, data cursor), or `None` on an empty root or with
    /// [`ManagerConfig::overwrite`] (nothing changed).
    pub fn resume<M: Module>(
        &mut self,
        model: &mut M,
        optim: &mut ModuleOptimizer,
        sched: &mut ModuleLrScheduler,
    ) -> Result<Option<TrainerState>> {
        let Some((step, dir)) = self.latest.clone() else {
            return Ok(None);
        };
        if self.overwrite {
            tracing::info!(
                step,
                "overwrite: not resuming from the newest checkpoint; the run starts over"
            );
            return Ok(None);
        }
        let r = crate::restore(&dir, model.clone(), optim.clone(), sched.clone())?;
        *model = r.model;
        *optim = r.optim;
        *sched = r.scheduler;
        self.resumed = true;
        self.session.resumed_at(step);
        tracing::info!(step, dir = %dir.display(), "resumed from the newest valid checkpoint");
        Ok(Some(r.trainer))
    }

    /// Makes the root ready for this run's saves (at the first `step`): refuses a used root the
    /// run did not resume, or moves its checkpoints aside ([`ManagerConfig::overwrite`]).
    fn settle(&mut self) -> Result<()> {
        if self.settled {
            return Ok(());
        }
        let newest = self.latest.as_ref().map(|(step, _)| *step);
        let resumed = newest.filter(|_| self.resumed);
        if let Some(to) = crate::checkpointers::rewind_before_first_save(
            self.engine.root(),
            newest,
            resumed,
            self.overwrite,
        )? {
            self.engine.rewind(to)?;
        }
        self.settled = true;
        Ok(())
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
        let took = self.last_step.map_or_else(Default::default, |t| now - t);
        self.settle()?;
        let seed = self.seed;
        let Self {
            engine, session, ..
        } = self;
        let b = session.boundary(step, took, engine.in_flight(), Ok::<_, Error>)?;
        if b.save {
            session.save(engine, step, |e, gate| {
                let trainer = TrainerState::new(step, cursor, seed);
                FrozenState::capture(model, optim, sched, trainer).submit(e, gate, |s| s)
            })?;
        }
        session.poll(engine)?;
        self.last_step = Some(Instant::now());
        Ok(b.stop)
    }

    /// Waits for every save to be durable, releases the root and returns what the saves cost
    /// ([`SessionReport`]), or the first background failure.
    pub fn finish(self) -> Result<SessionReport> {
        Ok(self.session.finish(self.engine, |e| {
            Ok::<_, ckpt_core::Error>(e.finish()?.events)
        })?)
    }
}
