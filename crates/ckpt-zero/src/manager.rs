//! [`RankManager`]: one ZeRO-1 rank's checkpointing, the sharded counterpart of
//! [`ckpt_burn::CheckpointManager`]. The example trainer's ZeRO loop (rank threads and MPI
//! processes) and [`crate::strategy::ZeroTrainingStrategy`] both go through it.
//!
//! Before the ranks start, rank 0 opens the root ([`ShardedRoot`]: the writer lock, start-up
//! recovery, the used-root policy and, with an object-store tier, a newer valid remote
//! checkpoint restored into the root). Then every rank starts a [`RankManager`] over its
//! training group, which splits the checkpoint group (and, with a tier, the upload group) off
//! it. At each optimizer-step boundary [`RankManager::step`] agrees with the other ranks on
//! rank 0's save decision and on any rank's stop request ([`crate::agree_on_boundary`]), hands
//! this rank's part of the checkpoint to its checkpoint thread ([`ShardedSaver`]) when they
//! save, and returns the failure of an earlier save. [`RankManager::finish`] waits for every
//! save and upload and returns what they cost.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use burn::module::Module;
use ckpt_core::session::{Boundary, FrequencyController, SaveMemory};
use ckpt_core::{
    CheckpointSession, Engine, EngineConfig, FrequencyPolicy, SaveEvent, SaveTarget, SessionConfig,
    SessionReport, Submitted,
};

use crate::checkpoint::Job;
use crate::collective::Collective;
use crate::memory_tier::{MemoryTier, MemoryTierReport, TierSaver};
use crate::restore::RankRestore;
use crate::{
    Error, MemorySaveVerdict, Result, ShardFormat, ShardJob, ShardedSaver, agree_on_boundary,
    agree_on_memory_save, run_id,
};

pub use ckpt_burn::UploadRecord;

/// Rank 0's checkpoint root, opened before the ranks start (see the module docs).
#[derive(Debug)]
pub struct ShardedRoot {
    engine: Engine,
    latest: Option<PathBuf>,
    remote: Option<String>,
}

impl ShardedRoot {
    /// Opens `config`'s root: takes its writer lock (a second process gets a clear error) and
    /// runs start-up recovery (stale temporary data removed, invalid checkpoints moved aside,
    /// each a warning naming it).
    pub fn open(config: EngineConfig) -> Result<Self> {
        let (engine, report) = Engine::open(config)?;
        Ok(Self {
            engine,
            latest: report.latest.map(|c| c.path),
            remote: None,
        })
    }

    /// The root's directory.
    pub fn root(&self) -> &Path {
        self.engine.root()
    }

    /// The newest valid checkpoint of the root (after [`Self::restore_from`], the one it
    /// restored).
    pub fn latest(&self) -> Option<&Path> {
        self.latest.as_deref()
    }

    /// The object-store URL of the checkpoint [`Self::restore_from`] restored, if it did.
    pub fn restored_from(&self) -> Option<&str> {
        self.remote.as_deref()
    }

    /// For a resume with an object-store tier: restores the newest valid checkpoint of
    /// `remote` into the root when no valid local checkpoint is as new (a warning says so).
    /// With a memory tier, leave it to [`RankManager::resume_from`], which downloads only when
    /// no memory-tier step is as new.
    #[cfg(feature = "remote")]
    pub fn restore_from(&mut self, remote: &ckpt_remote::Remote) -> Result<()> {
        let local = self
            .latest
            .as_deref()
            .and_then(|p| p.file_name())
            .and_then(|n| n.to_str())
            .and_then(ckpt_core::layout::parse_step_dir);
        if let Some(r) = remote.restore_newest(&mut self.engine, local)? {
            let from = remote.checkpoint_url(r.step);
            tracing::warn!(
                step = r.step,
                local = ?local,
                "restored the checkpoint from {from}: no valid local checkpoint is as new"
            );
            self.latest = Some(r.event.path);
            self.remote = Some(from);
        }
        Ok(())
    }

    /// Makes the root ready for the run and returns the checkpoint its ranks resume from:
    /// with `resume`, the newest valid one (none in an empty root). A run that does not resume
    /// is refused in a root holding checkpoints ([`Error::UsedRoot`], before any training),
    /// unless `overwrite` moves them aside to `ROOT/.rewound-*` (a warning says so).
    ///
    /// A run that does not resume also gets a new run id (`ROOT/.run-id`,
    /// [`crate::run_id`]), so a memory tier left by an earlier run is never read.
    pub fn settle(&mut self, resume: bool, overwrite: bool) -> Result<Option<PathBuf>> {
        if resume {
            return Ok(self.latest.clone());
        }
        let Some(newest) = &self.latest else {
            run_id::start_new(self.engine.root())?;
            return Ok(None);
        };
        if !overwrite {
            return Err(Error::UsedRoot {
                root: self.engine.root().to_path_buf(),
                newest: newest.clone(),
            });
        }
        let moved = self.engine.rewind(None)?;
        tracing::warn!(
            moved = moved.len(),
            "starting over: the checkpoints already in {} were moved aside to .rewound-*",
            self.engine.root().display()
        );
        self.latest = None;
        run_id::start_new(self.engine.root())?;
        Ok(None)
    }

    /// The engine, for rank 0's [`RankManager::start`].
    pub fn into_engine(self) -> Engine {
        self.engine
    }
}

/// Settings of a [`RankManager`], the same on every rank.
#[derive(Debug, Clone)]
pub struct RankConfig {
    root: PathBuf,
    session: SessionConfig,
    format: ShardFormat,
    need: Option<SaveMemory>,
    memory: Option<MemoryTier>,
    #[cfg(feature = "remote")]
    upload: Option<ckpt_remote::Remote>,
}

impl RankConfig {
    /// Checkpoints under `root` as `session` decides (frequency, last step, stop requests,
    /// what a failed save does, the memory budget), optimizer shards consolidated.
    pub fn new(root: impl Into<PathBuf>, session: SessionConfig) -> Self {
        Self {
            root: root.into(),
            session,
            format: ShardFormat::Consolidated,
            need: None,
            memory: None,
            #[cfg(feature = "remote")]
            upload: None,
        }
    }

    /// Also keep the newest steps in a node-local memory tier replicated to peer ranks (see
    /// [`crate::memory_tier`]); a resume then goes through [`RankManager::resume_from`].
    pub fn memory_tier(mut self, tier: MemoryTier) -> Self {
        self.memory = Some(tier);
        self
    }

    /// How optimizer shards are written (default: consolidated).
    pub fn shard_format(mut self, format: ShardFormat) -> Self {
        self.format = format;
        self
    }

    /// What a save holds in memory on this rank until it is written, for the session's
    /// memory budget (default: not counted; every save goes to the background).
    pub fn save_memory(mut self, need: SaveMemory) -> Self {
        self.need = Some(need);
        self
    }

    /// Upload this rank's part of every published checkpoint to `remote` in the background;
    /// rank 0 publishes it there once every part is up, and [`RankManager::finish`] waits for
    /// the uploads.
    #[cfg(feature = "remote")]
    pub fn upload_to(mut self, remote: ckpt_remote::Remote) -> Self {
        self.upload = Some(remote);
        self
    }
}

/// This rank's part of a checkpoint, handed to [`RankManager::step`].
pub enum ShardSave<M> {
    /// Built on the training thread.
    Now(ShardJob<M>),
    /// Built on the rank's checkpoint thread (for example from Burn's records of a frozen
    /// learner), in the order of the saves.
    Later(Box<dyn FnOnce() -> Result<ShardJob<M>> + Send>),
}

/// What a rank's checkpointing did, from [`RankManager::finish`].
#[derive(Debug, Clone, Default)]
pub struct RankReport {
    /// The saves (on rank 0 they cover whole checkpoints): stalls, persist times, failures.
    pub session: SessionReport,
    /// The uploads this rank made to the object-store tier (empty without one).
    pub uploads: Vec<UploadRecord>,
    /// What the memory tier did on this rank (without one: `None`).
    pub memory: Option<MemoryTierReport>,
}

/// Clean steps (without a memory save) the tier's measured cost needs for its baseline.
const MIN_BASELINE_STEPS: usize = 5;

/// One ZeRO-1 rank's checkpointing (see the module docs).
pub struct RankManager<M> {
    session: CheckpointSession,
    target: Option<RankTarget<M>>,
    need: Option<SaveMemory>,
    memory: Option<MemoryState<M>>,
    /// The newest disk save submitted and the updates' waits charged to the disk saves
    /// ([`Self::before_update`]), counted in their stalls.
    waits: ckpt_burn::UpdateWaits,
    /// The object-store tier, for recovery across the tiers ([`Self::resume_from`]).
    #[cfg(feature = "remote")]
    remote: Option<ckpt_remote::Remote>,
}

/// A rank's memory tier: its settings, the run id, and the tier's group until the thread
/// that saves to it starts (after recovery, at the first memory save).
struct MemoryState<M> {
    tier: MemoryTier,
    run: String,
    rank: usize,
    world: usize,
    group: Option<Box<dyn Collective>>,
    saver: Option<TierSaver<M>>,
    /// Measures what the tier's saves cost training and, with a budget, decides by it.
    cost: FrequencyController,
    /// Whether a memory save ran during the step now ending.
    ran: bool,
    started: Instant,
    /// Each submitted save's step and time on the training thread at it (ms), for the report.
    stalls: Vec<(u64, f64)>,
    /// The newest memory save submitted and the updates' waits charged to the tier's saves:
    /// those that followed a memory save newer than the newest disk save.
    waits: ckpt_burn::UpdateWaits,
}

impl<M: Module + 'static> MemoryState<M> {
    fn saver(&mut self) -> Result<&mut TierSaver<M>> {
        if self.saver.is_none() {
            let group = self.group.take().ok_or_else(|| {
                Error::Config("the memory tier's group is gone (its thread failed to start)".into())
            })?;
            self.saver = Some(TierSaver::start(
                group,
                self.tier.clone(),
                self.run.clone(),
            )?);
        }
        self.saver
            .as_mut()
            .ok_or_else(|| Error::Config("memory-tier thread not started".into()))
    }
}

impl<M> std::fmt::Debug for RankManager<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RankManager")
            .field("enabled", &self.session.enabled())
            .field("published", &self.session.published())
            .finish_non_exhaustive()
    }
}

impl<M: Module + 'static> RankManager<M> {
    /// Starts this rank's checkpointing: splits the checkpoint group off `group` (then, with
    /// an object-store tier, the upload group), so every rank must call it at the same point
    /// of its collective calls. `engine` is rank 0's ([`ShardedRoot::into_engine`]; `None` on
    /// the others).
    pub fn start(
        config: RankConfig,
        engine: Option<Engine>,
        group: &mut dyn Collective,
    ) -> Result<Self> {
        let ckpt_group = group.split()?;
        #[cfg(feature = "remote")]
        let remote = config.upload.clone();
        #[cfg(feature = "remote")]
        let uploader = match config.upload {
            Some(remote) => Some(crate::upload::ShardUploader::start(group.split()?, remote)?),
            None => None,
        };
        let session = CheckpointSession::new(config.session);
        let memory = match config.memory {
            Some(tier) => {
                if !session.enabled() {
                    return Err(Error::Config(
                        "the memory tier needs checkpointing on (a save interval or budget)".into(),
                    ));
                }
                tier.validate(group.size())?;
                let mut tier_group = group.split()?;
                let mut run = match &engine {
                    Some(e) => run_id::read_or_start(e.root())?.into_bytes(),
                    None => Vec::new(),
                };
                tier_group.broadcast(0, &mut run)?;
                // A memory save is cheap next to a disk save: its window closes one step
                // after it ends, and one clean step before the next keeps the baseline.
                let policy = match tier.overhead_budget() {
                    Some(fraction) => FrequencyPolicy::budget(fraction),
                    None => FrequencyPolicy::EverySteps(1),
                };
                Some(MemoryState {
                    cost: FrequencyController::new(policy)
                        .tail_steps(1)
                        .min_clean_steps(1),
                    tier,
                    run: String::from_utf8_lossy(&run).into_owned(),
                    rank: group.rank(),
                    world: group.size(),
                    group: Some(tier_group),
                    saver: None,
                    ran: false,
                    started: Instant::now(),
                    stalls: Vec::new(),
                    waits: ckpt_burn::UpdateWaits::default(),
                })
            }
            None => None,
        };
        let target = if session.enabled() {
            #[cfg(feature = "remote")]
            let hook = uploader.as_ref().map(|u| u.after_publish());
            #[cfg(not(feature = "remote"))]
            let hook = None;
            Some(RankTarget {
                saver: ShardedSaver::start_with(
                    ckpt_group,
                    config.format,
                    config.root,
                    engine,
                    hook,
                )?,
                #[cfg(feature = "remote")]
                uploader,
            })
        } else {
            None
        };
        Ok(Self {
            session,
            target,
            need: config.need,
            memory,
            waits: Default::default(),
            #[cfg(feature = "remote")]
            remote,
        })
    }

    /// Where this rank resumes from, before its first step: `disk` is the newest valid
    /// checkpoint of the disk tier ([`ShardedRoot::settle`]; with a memory tier only rank 0's
    /// is read, and every rank must call this). With a memory tier the ranks agree on the
    /// newest step every rank can restore, from its own part, else from a peer's replica sent
    /// back over the tier's group, never older than the disk's or the object store's newest;
    /// else `disk`, or (with an object-store tier, [`RankConfig::upload_to`]) a newer
    /// checkpoint rank 0 downloads from the object store only then. `None`: nothing to resume.
    /// Parts of the tier newer than the step returned are removed.
    ///
    /// Without a memory tier, [`ShardedRoot::restore_from`] restores from the object store
    /// before the ranks start.
    pub fn resume_from(&mut self, disk: Option<PathBuf>) -> Result<Option<RankRestore>> {
        let Some(m) = self.memory.as_mut() else {
            return disk.map(RankRestore::disk).transpose();
        };
        let group = m
            .group
            .as_mut()
            .ok_or_else(|| Error::Config("resume_from must come before the first step".into()))?;
        #[cfg(feature = "remote")]
        let store = match (&self.remote, self.target.as_mut()) {
            (Some(remote), Some(t)) if m.rank == 0 => Some(object_store(remote, &mut t.saver)?),
            _ => None,
        };
        #[cfg(not(feature = "remote"))]
        let store = None;
        crate::memory_tier::recover(group.as_mut(), &m.tier, &m.run, disk, store)
    }

    /// Whether this run checkpoints at all.
    pub fn enabled(&self) -> bool {
        self.session.enabled()
    }

    /// The run resumed from the checkpoint of `step`: the next save counts from there.
    pub fn resumed_at(&mut self, step: u64) {
        self.session.resumed_at(step);
    }

    /// Checkpoints published so far (on rank 0: whole checkpoints).
    pub fn published(&self) -> usize {
        self.session.published()
    }

    /// This rank's saves being persisted now.
    pub fn in_flight(&self) -> usize {
        self.target.as_ref().map_or(0, |t| t.saver.in_flight())
    }

    /// After optimizer step `step` (it took `took`): agrees over the training `group` with
    /// the other ranks on rank 0's save decision and on any rank's stop request (`stop`: this
    /// rank asks to stop here), hands `part()` to the checkpoint thread when they save (it is
    /// called again when the first submit returned an earlier save's failure), and
    /// returns the failure of an earlier save. Every rank calls it at every step, whether
    /// checkpointing is on or not; the loop ends after a step whose [`Boundary::stop`] is set.
    pub fn step(
        &mut self,
        step: u64,
        took: Duration,
        stop: bool,
        group: &mut dyn Collective,
        mut part: impl FnMut() -> ShardSave<M>,
    ) -> Result<Boundary> {
        let b = self
            .session
            .boundary(step, took, self.in_flight(), |mut p| {
                p.stop |= stop;
                agree_on_boundary(group, p)
            })?;
        let Some(target) = self.target.as_mut() else {
            return Ok(b);
        };
        if b.save {
            let need = self.need;
            self.session.save(target, step, |t, gate| {
                let route = need.map(|n| gate.route(n, step));
                let t0 = Instant::now();
                match part() {
                    ShardSave::Now(job) => t.saver.submit(job)?,
                    ShardSave::Later(build) => t.saver.submit_later(step, build)?,
                }
                let mut submitted = Submitted::queued(step, t0.elapsed());
                if let Some(route) = route {
                    submitted.route = route;
                }
                Ok::<_, Error>(submitted)
            })?;
            self.waits.saved(step);
        }
        self.session.poll(target)?;
        if let Some(m) = self.memory.as_mut() {
            let busy = m.saver()?.busy();
            m.cost.observe_step(took, m.ran || busy);
            m.ran = busy;
            if m.tier.due(step) {
                let asked = Instant::now();
                let now = m.started.elapsed();
                let within = m.cost.should_save(step, now, busy);
                let saver = m.saver()?;
                // Every rank skips when any rank's previous memory save still runs (the tier
                // never makes training wait) or rank 0's account is over the budget; the ranks
                // stay in step.
                let verdict = agree_on_memory_save(group, busy, within)?;
                if verdict == MemorySaveVerdict::Save {
                    let t0 = Instant::now();
                    #[cfg(feature = "failpoints")]
                    fail::fail_point!(crate::memory_tier::FP_MEMORY_TIER_SUBMIT);
                    saver.submit(match part() {
                        ShardSave::Now(job) => Job::Ready(job),
                        ShardSave::Later(build) => Job::Later(step, build),
                    });
                    #[cfg(feature = "failpoints")]
                    if let Some(abort_at) =
                        fail::eval(crate::memory_tier::FP_MEMORY_TIER_WAIT, |arg| arg)
                    {
                        saver.wait();
                        if abort_at.and_then(|a| a.parse::<u64>().ok()) == Some(step) {
                            tracing::error!(step, "failpoint memory_tier_wait: aborting");
                            std::process::abort();
                        }
                    }
                    let stall = t0.elapsed();
                    // It runs during the next step unless it is done already (waited for).
                    m.ran = saver.busy();
                    m.cost.saved_after_stall(step, now, stall);
                    // The stall is training time too (the persist time is not needed here).
                    m.cost.observe_save(stall, Duration::ZERO);
                    m.stalls.push((step, asked.elapsed().as_secs_f64() * 1e3));
                    m.waits.saved(step);
                } else if verdict == MemorySaveVerdict::Busy {
                    saver.skipped(step);
                } else {
                    saver.throttled(step);
                }
            }
        }
        Ok(b)
    }

    /// Between the backward pass and the optimizer update: where `wait` says so
    /// ([`ckpt_burn::UpdateWait::applies_to_learner`]), waits until the saves hold none of the
    /// training state, and counts the time in the stall of the newest save, as a loop of one's
    /// own does (`ckpt_burn::CheckpointManager::before_update`): the newest disk save's, or the
    /// memory tier's newest save's where that is newer (a disk and a memory save of one step:
    /// the disk save's). Returns the time waited.
    pub fn before_update(&mut self, wait: bool) -> Duration {
        match self.memory.as_mut() {
            Some(m) if m.waits.newest() > self.waits.newest() => m.waits.before_update(wait),
            _ => self.waits.before_update(wait),
        }
    }

    /// Waits for every save and upload of this rank, stops its threads and returns what
    /// they cost (an update's wait for a save counts in its stall), or the first background
    /// failure.
    pub fn finish(self) -> Result<RankReport> {
        let Self {
            session,
            target,
            memory,
            waits,
            ..
        } = self;
        let mut report = Self::finish_disk(session, target)?;
        waits.add_to(&mut report.session);
        if let Some(m) = memory {
            let mut r = m.saver.map(TierSaver::finish).unwrap_or_default();
            // A baseline of a few steps comes from the slow warm-up and hides the cost.
            let (baseline, lost) = m.cost.lost();
            let measured = baseline.is_some() && m.cost.baseline_steps() >= MIN_BASELINE_STEPS;
            (r.training_s, r.lost_s) = (m.cost.spent().0, measured.then_some(lost));
            r.stall_ms = m
                .stalls
                .iter()
                .map(|&(step, ms)| ms + m.waits.of(step).as_secs_f64() * 1e3)
                .collect();
            if r.skipped > 0 && m.rank == 0 {
                tracing::warn!(
                    skipped = r.skipped,
                    saved = r.saved.len(),
                    "memory-tier saves skipped because the previous one was still running; a longer \
                     interval would keep every one"
                );
            }
            // The run ended cleanly with its disk tier complete: its memory tier goes.
            crate::memory_tier::remove_rank_dirs(&m.tier, m.rank, m.world, &m.run);
            report.memory = Some(r);
        }
        Ok(report)
    }

    fn finish_disk(
        session: CheckpointSession,
        target: Option<RankTarget<M>>,
    ) -> Result<RankReport> {
        match target {
            Some(t) => {
                let uploads = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
                let slot = uploads.clone();
                let session = session.finish(t, move |t| {
                    let (events, up) = t.close()?;
                    if let Ok(mut u) = slot.lock() {
                        *u = up;
                    }
                    Ok(events)
                })?;
                let uploads = uploads
                    .lock()
                    .map(|mut u| std::mem::take(&mut *u))
                    .unwrap_or_default();
                Ok(RankReport {
                    session,
                    uploads,
                    memory: None,
                })
            }
            None => Ok(RankReport {
                session: session.finish(NoSaves, |_| Ok(Vec::new()))?,
                uploads: Vec::new(),
                memory: None,
            }),
        }
    }
}

/// Rank 0's object-store tier for recovery: its newest valid step now, and a download through
/// the engine on the checkpoint thread.
#[cfg(feature = "remote")]
fn object_store<'a, M: Module + 'static>(
    remote: &ckpt_remote::Remote,
    saver: &'a mut ShardedSaver<M>,
) -> Result<crate::memory_tier::ObjectStore<'a>> {
    let newest = remote
        .list()?
        .iter()
        .rev()
        .find(|c| c.invalid.is_none())
        .map(|c| c.step);
    let remote = remote.clone();
    Ok(crate::memory_tier::ObjectStore {
        newest,
        download: Box::new(move |newer_than| {
            let r = remote.clone();
            let restored =
                saver.with_engine(move |engine| r.restore_newest(engine, newer_than))??;
            Ok(restored.map(|r| (r.event.path, remote.checkpoint_url(r.step))))
        }),
    })
}

/// A rank's save target: its sharded saver and the object-store tier behind it, whose
/// failures come back like the saver's.
struct RankTarget<M> {
    saver: ShardedSaver<M>,
    #[cfg(feature = "remote")]
    uploader: Option<crate::upload::ShardUploader>,
}

impl<M: Module + 'static> RankTarget<M> {
    /// Returns the first upload failure as an error (finished uploads are all reported
    /// by `close`).
    fn uploaded(&mut self) -> Result<()> {
        #[cfg(feature = "remote")]
        if let Some(up) = &mut self.uploader {
            up.poll()?;
        }
        Ok(())
    }

    /// Closes the saver (every save published), then waits for every upload: the saves'
    /// events and every upload of the run.
    fn close(self) -> Result<(Vec<SaveEvent>, Vec<UploadRecord>)> {
        #[cfg(feature = "remote")]
        let Self {
            saver, uploader, ..
        } = self;
        #[cfg(not(feature = "remote"))]
        let Self { saver, .. } = self;
        let events = saver.close()?;
        #[cfg(feature = "remote")]
        let uploads = match uploader {
            Some(up) => up.finish()?.iter().map(upload_record).collect(),
            None => Vec::new(),
        };
        #[cfg(not(feature = "remote"))]
        let uploads = Vec::new();
        Ok((events, uploads))
    }
}

/// The report's record of a finished upload.
#[cfg(feature = "remote")]
fn upload_record(u: &ckpt_remote::Uploaded) -> UploadRecord {
    UploadRecord {
        step: u.step,
        bytes: u.bytes,
        ms: u.elapsed.as_secs_f64() * 1e3,
    }
}

impl<M: Module + 'static> SaveTarget for RankTarget<M> {
    type Error = Error;
    fn in_flight(&self) -> usize {
        self.saver.in_flight()
    }
    fn poll(&mut self) -> Result<Vec<SaveEvent>> {
        let events = SaveTarget::poll(&mut self.saver)?;
        self.uploaded()?;
        Ok(events)
    }
    fn wait_idle(&mut self) -> Result<Vec<SaveEvent>> {
        let events = SaveTarget::wait_idle(&mut self.saver)?;
        self.uploaded()?;
        Ok(events)
    }
    fn blocked_total(&self) -> Duration {
        self.saver.blocked_total()
    }
    // Every rank writes its shard; what the ranks hold is not counted.
    fn held_bytes(&self) -> Option<u64> {
        None
    }
    fn wait_held_at_most(&mut self, _limit: u64) -> Result<bool> {
        Ok(false)
    }
}

/// The target of a run without checkpoints.
struct NoSaves;

impl SaveTarget for NoSaves {
    type Error = Error;
    fn in_flight(&self) -> usize {
        0
    }
    fn poll(&mut self) -> Result<Vec<SaveEvent>> {
        Ok(Vec::new())
    }
    fn wait_idle(&mut self) -> Result<Vec<SaveEvent>> {
        Ok(Vec::new())
    }
    fn held_bytes(&self) -> Option<u64> {
        None
    }
    fn wait_held_at_most(&mut self, _limit: u64) -> Result<bool> {
        Ok(false)
    }
}
