//! Sharded checkpoints of ZeRO-1 training: every rank snapshots its optimizer shard at the same
//! step, and a background thread per rank moves it over the dedicated checkpoint group (never
//! the training group) and publishes it through rank 0's [`Engine`].
//!
//! Two layouts ([`ShardFormat`]):
//! - **consolidated**: shards are gathered to rank 0, merged into the `optim.bpk` a single rank
//!   would write (byte for byte), and written with the model, scheduler and trainer state;
//! - **per-rank**: every rank writes and fsyncs `optim.rank-<r>-of-<n>.bpk` itself (under a
//!   `.tmp-` name in the root, which start-up recovery removes if the run dies), sends its size
//!   and checksum to rank 0, and rank 0 publishes a checkpoint that adopts every shard file.
//!
//! A checkpoint is published only when every rank's part is durable, and all ranks agree on
//! the outcome (`all_agree`) before reporting it: a rank that fails or disappears makes every
//! other rank's save fail within the group's timeout, and nothing is published for that step.

use std::{
    fmt,
    io::Write,
    path::{Path, PathBuf},
    str::FromStr,
    thread::JoinHandle,
    time::{Duration, Instant},
};

use burn::module::Module;
use burn::optim::ModuleOptimizer;
use burn::optim::OptimizerRecord;
use burn::optim::lr_scheduler::LrSchedulerRecord;
use burn::store::ModuleRecord;
use ckpt_burn::{
    MODEL_FILE, OPTIM_FILE, SCHEDULER_FILE, TRAINER_FILE, TrainerState, encode_optimizer,
    encode_scheduler, write_model_record, write_optimizer_record,
};
use ckpt_core::{DurableFile, Engine, Snapshot, Storage};
use crossbeam_channel::{Receiver, Sender, TryRecvError};
use serde::{Deserialize, Serialize};

use crate::collective::Collective;
use crate::shards::{merge_optimizer_shards, shard_file_name};
use crate::{Error, Result};

/// Failpoint: a rank's checkpoint thread dies right before the gather (for fault tests; with
/// the `failpoints` feature).
#[cfg(feature = "failpoints")]
pub const FP_BEFORE_GATHER: &str = "zero_before_gather";
#[cfg(not(feature = "failpoints"))]
#[allow(dead_code)]
const FP_BEFORE_GATHER: &str = "zero_before_gather";

/// How sharded optimizer state is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ShardFormat {
    /// Gathered to rank 0 and merged into one `optim.bpk`.
    #[default]
    Consolidated,
    /// One `optim.rank-<r>-of-<n>.bpk` per rank, written by that rank.
    PerRank,
}

impl ShardFormat {
    /// The layout name recorded in the manifest.
    pub fn layout(self) -> &'static str {
        match self {
            ShardFormat::Consolidated => "consolidated",
            ShardFormat::PerRank => "per-rank",
        }
    }
}

impl fmt::Display for ShardFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.layout())
    }
}

impl FromStr for ShardFormat {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "consolidated" => Ok(ShardFormat::Consolidated),
            "per-rank" => Ok(ShardFormat::PerRank),
            other => Err(Error::Config(format!(
                "unknown shard format {other:?} (consolidated or per-rank)"
            ))),
        }
    }
}

/// A rank's optimizer shard as captured.
pub enum OptimShard {
    /// The rank's optimizer, cloned (handles; encoded in the background).
    Live(ModuleOptimizer),
    /// Burn's record of it, whose data are host memory (Flex) or otherwise still readable:
    /// written out on the checkpoint thread through a scratch file
    /// ([`ckpt_burn::write_optimizer_record`]), with no buffer of the whole record.
    Record {
        /// The record.
        record: OptimizerRecord,
        /// About how many bytes it holds (where its scratch file goes depends on it).
        bytes: u64,
    },
    /// Already encoded: canonical burnpack bytes ([`ckpt_burn::write_optimizer_record`]).
    Encoded(Vec<u8>),
}

impl From<ModuleOptimizer> for OptimShard {
    fn from(o: ModuleOptimizer) -> Self {
        OptimShard::Live(o)
    }
}

impl OptimShard {
    /// Writes the shard into `sink` as canonical burnpack bytes (a record through a scratch
    /// file, for a checkpoint under `root`); returns the bytes written.
    pub(crate) fn write(self, root: &Path, step: u64, sink: &mut dyn Write) -> Result<u64> {
        let bytes = match self {
            OptimShard::Record { record, bytes } => {
                return Ok(write_optimizer_record(record, bytes, root, step, sink)?);
            }
            OptimShard::Live(o) => encode_optimizer(&o)?,
            OptimShard::Encoded(b) => b,
        };
        sink.write_all(&bytes).map_err(|e| Error::Shard {
            file: PathBuf::from(OPTIM_FILE),
            reason: e.to_string(),
        })?;
        Ok(bytes.len() as u64)
    }

    /// The shard as canonical burnpack bytes.
    fn into_bytes(self, root: &Path, step: u64) -> Result<Vec<u8>> {
        match self {
            OptimShard::Encoded(b) => Ok(b),
            other => {
                let mut out = Vec::new();
                other.write(root, step, &mut out)?;
                Ok(out)
            }
        }
    }
}

/// The model as rank 0 captured it, for `model.bpk`.
pub enum ModelPart<M> {
    /// The model, cloned (handles; encoded in the background).
    Live(M),
    /// Burn's record of it (from a learner: `LearningCheckpointer` builds it anyway), whose
    /// data are host memory or otherwise still readable; written through a scratch file
    /// ([`ckpt_burn::write_model_record`]).
    Record {
        /// The record.
        record: ModuleRecord,
        /// About how many bytes it holds (where its scratch file goes depends on it).
        bytes: u64,
    },
    /// Already encoded: `model.into_record().save(..)`'s bytes.
    Encoded(Vec<u8>),
}

impl<M: Module + 'static> ModelPart<M> {
    /// Adds the model to `snap` as `model.bpk`, encoded when the snapshot is written (a record
    /// through a scratch file under `root`, named for `step`).
    pub(crate) fn add_to(self, snap: Snapshot, root: &Path, step: u64) -> Snapshot {
        match self {
            ModelPart::Encoded(bytes) => snap.with_bytes(MODEL_FILE, bytes),
            ModelPart::Live(model) => {
                snap.with_producer(MODEL_FILE, move |sink: &mut dyn Write| {
                    let bytes = model.into_record().into_bytes()?;
                    sink.write_all(&bytes)?;
                    Ok(())
                })
            }
            ModelPart::Record { record, bytes } => {
                let root = root.to_path_buf();
                snap.with_producer(MODEL_FILE, move |sink: &mut dyn Write| {
                    write_model_record(record, bytes, &root, step, sink)?;
                    Ok(())
                })
            }
        }
    }
}

impl<M: Module> From<M> for ModelPart<M> {
    fn from(m: M) -> Self {
        ModelPart::Live(m)
    }
}

/// What one rank captured at a step boundary: handle clones, encoded in the background.
pub struct ShardJob<M> {
    /// The model (rank 0 only; it writes `model.bpk`).
    pub model: Option<ModelPart<M>>,
    /// This rank's optimizer shard.
    pub optim: OptimShard,
    /// The scheduler record.
    pub scheduler: LrSchedulerRecord,
    /// Step, epoch, data cursor, seed.
    pub trainer: TrainerState,
}

/// Builds a rank's [`ShardJob`] on its checkpoint thread (see [`ShardedSaver::submit_later`]).
pub(crate) type BuildShardJob<M> = Box<dyn FnOnce() -> Result<ShardJob<M>> + Send>;

/// What a rank hands its checkpoint thread.
pub(crate) enum Job<M> {
    /// Captured whole on the training thread.
    Ready(ShardJob<M>),
    /// Step `.0`'s job, built on the checkpoint thread.
    Later(u64, BuildShardJob<M>),
}

impl<M> Job<M> {
    pub(crate) fn step(&self) -> u64 {
        match self {
            Job::Ready(j) => j.trainer.step,
            Job::Later(step, _) => *step,
        }
    }

    /// The job's [`ShardJob`], built now where it was handed over as a closure.
    pub(crate) fn build(self) -> Result<ShardJob<M>> {
        match self {
            Job::Ready(job) => Ok(job),
            Job::Later(_, build) => build(),
        }
    }
}

/// What a rank's checkpoint thread is handed.
enum Work<M> {
    /// A save.
    Save(Job<M>),
    /// Something to run with rank 0's engine between saves ([`ShardedSaver::with_engine`]).
    #[cfg_attr(not(feature = "remote"), allow(dead_code))]
    WithEngine(Box<dyn FnOnce(&mut Engine) + Send>),
}

/// The outcome of one sharded save, as this rank saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct ShardOutcome {
    /// Step.
    pub step: u64,
    /// Bytes this rank wrote or sent (rank 0: the whole checkpoint).
    pub bytes: u64,
    /// From the start of the background work to agreement.
    pub persist: Duration,
}

/// A rank's background checkpoint thread.
pub struct ShardedSaver<M> {
    tx: Option<Sender<Work<M>>>,
    done: Receiver<Result<ShardOutcome>>,
    thread: Option<JoinHandle<Result<()>>>,
    rank: usize,
    root: PathBuf,
    in_flight: usize,
    blocked: Duration,
    finished: Vec<ShardOutcome>,
}

impl<M> fmt::Debug for ShardedSaver<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShardedSaver")
            .field("in_flight", &self.in_flight)
            .finish()
    }
}

/// Called on a rank's checkpoint thread with the step and the directory of each checkpoint
/// every rank agreed was published, before the thread takes any later save: the checkpoint's
/// files are all still there (retention removes a checkpoint only when a later one is
/// published), so the hook can hand them on, as [`crate::upload::ShardUploader`] does.
pub type AfterPublish = Box<dyn FnMut(u64, &Path) + Send>;

struct Worker {
    group: Box<dyn Collective>,
    format: ShardFormat,
    root: PathBuf,
    engine: Option<Engine>,
    after_publish: Option<AfterPublish>,
}

#[derive(Serialize, Deserialize)]
enum ShardReport {
    Written { size: u64, xxh3: u64 },
    Failed(String),
}

fn staged_shard_path(root: &Path, step: u64, rank: usize, world: usize) -> PathBuf {
    root.join(format!(
        ".tmp-shard-{step:08}-{}",
        shard_file_name(rank, world)
    ))
}

impl<M: Module + 'static> ShardedSaver<M> {
    /// Starts the background thread. `group` must be the dedicated checkpoint group; `engine`
    /// is rank 0's (it owns the root), `None` on the other ranks.
    pub fn start(
        group: Box<dyn Collective>,
        format: ShardFormat,
        root: PathBuf,
        engine: Option<Engine>,
    ) -> Result<Self> {
        Self::start_with(group, format, root, engine, None)
    }

    /// [`Self::start`], with a hook called after every published save (see [`AfterPublish`]).
    pub fn start_with(
        group: Box<dyn Collective>,
        format: ShardFormat,
        root: PathBuf,
        engine: Option<Engine>,
        after_publish: Option<AfterPublish>,
    ) -> Result<Self> {
        if (group.rank() == 0) != engine.is_some() {
            return Err(Error::Config(
                "exactly rank 0 of the checkpoint group owns the engine".into(),
            ));
        }
        let rank = group.rank();
        let (tx, rx) = crossbeam_channel::bounded::<Work<M>>(1);
        let (done_tx, done) = crossbeam_channel::unbounded();
        let mut worker = Worker {
            group,
            format,
            root: root.clone(),
            engine,
            after_publish,
        };
        let thread = std::thread::Builder::new()
            .name(format!("ckpt-zero-rank-{rank}"))
            .spawn(move || -> Result<()> {
                // Encoding shards yields to training, as the engine's persist thread does.
                ckpt_core::priority::lower_current_thread(ckpt_core::EngineConfig::PERSIST_NICE);
                for work in rx {
                    let job = match work {
                        Work::Save(job) => job,
                        Work::WithEngine(f) => {
                            if let Some(engine) = worker.engine.as_mut() {
                                f(engine);
                            }
                            continue;
                        }
                    };
                    let r = worker.save(job);
                    if let (Ok(o), Some(hook)) = (&r, worker.after_publish.as_mut()) {
                        hook(
                            o.step,
                            &worker
                                .root
                                .join(ckpt_core::layout::checkpoint_dir_name(o.step)),
                        );
                    }
                    // After a failure every rank agreed on, the ranks are still in step and
                    // the next save can be taken; after any other, the group is unusable.
                    let go_on = !matches!(r, Err(Error::CheckpointGroupFailed { .. }));
                    if done_tx.send(r).is_err() || !go_on {
                        break;
                    }
                }
                match worker.engine.take() {
                    Some(e) => e.finish().map(|_| ()).map_err(Error::from),
                    None => Ok(()),
                }
            })
            .map_err(|e| Error::Rank {
                rank,
                reason: format!("cannot start the checkpoint thread: {e}"),
            })?;
        Ok(Self {
            tx: Some(tx),
            done,
            thread: Some(thread),
            rank,
            root,
            in_flight: 0,
            blocked: Duration::ZERO,
            finished: Vec::new(),
        })
    }

    /// Saves being persisted.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Hands a captured shard to the background thread. Blocks while the previous save is
    /// still being persisted (one in flight), and returns its error if it failed.
    pub fn submit(&mut self, job: ShardJob<M>) -> Result<()> {
        self.send(Job::Ready(job))
    }

    /// [`Self::submit`] for step `step`'s job, built by `build` on the checkpoint thread: the
    /// training thread only freezes the state (clones handles) and goes on. `build` must read
    /// only what was frozen at the step boundary; an error it returns fails this step's save
    /// on every rank, like any other error of the save.
    pub fn submit_later(
        &mut self,
        step: u64,
        build: impl FnOnce() -> Result<ShardJob<M>> + Send + 'static,
    ) -> Result<()> {
        self.send(Job::Later(step, Box::new(build)))
    }

    fn send(&mut self, job: Job<M>) -> Result<()> {
        let t0 = Instant::now();
        let waited = self.wait_idle_inner();
        self.blocked += t0.elapsed();
        waited?;
        let tx = self.tx.as_ref().ok_or_else(|| self.gone("submit"))?;
        tx.send(Work::Save(job)).map_err(|_| self.gone("submit"))?;
        self.in_flight += 1;
        Ok(())
    }

    /// Runs `f` with rank 0's engine on the checkpoint thread once the saves in flight are
    /// done, and returns what it returned (recovery restores a checkpoint into the root this
    /// way after the engine went to the thread). An error on any other rank.
    #[cfg_attr(not(feature = "remote"), allow(dead_code))]
    pub(crate) fn with_engine<T: Send + 'static>(
        &mut self,
        f: impl FnOnce(&mut Engine) -> T + Send + 'static,
    ) -> Result<T> {
        self.wait_idle_inner()?;
        let (back, answer) = crossbeam_channel::bounded(1);
        let tx = self
            .tx
            .as_ref()
            .ok_or_else(|| self.gone("use the engine"))?;
        tx.send(Work::WithEngine(Box::new(move |engine: &mut Engine| {
            let _ = back.send(f(engine));
        })))
        .map_err(|_| self.gone("use the engine"))?;
        answer.recv().map_err(|_| Error::Rank {
            rank: self.rank,
            reason: "only rank 0's checkpoint thread owns the engine".into(),
        })
    }

    /// Waits until no save is in flight; the first failure is returned (the outcomes of the
    /// others stay for [`Self::poll`]).
    pub fn wait_idle(&mut self) -> Result<Vec<ShardOutcome>> {
        self.wait_idle_inner()?;
        Ok(std::mem::take(&mut self.finished))
    }

    fn wait_idle_inner(&mut self) -> Result<()> {
        while self.in_flight > 0 {
            self.wait_one()?;
        }
        Ok(())
    }

    fn wait_one(&mut self) -> Result<()> {
        match self.done.recv() {
            Ok(r) => {
                self.in_flight -= 1;
                self.finished.push(r?);
                Ok(())
            }
            Err(_) => Err(self.gone("wait")),
        }
    }

    /// Total time [`Self::submit`] waited for the previous save.
    pub fn blocked_total(&self) -> Duration {
        self.blocked
    }

    /// The error for a checkpoint thread that is gone: its own failure if it returned one.
    fn gone(&self, op: &str) -> Error {
        Error::Rank {
            rank: self.rank,
            reason: format!("the checkpoint thread is gone ({op})"),
        }
    }

    /// Outcomes of saves finished since the last call (non-blocking); a failed save's error.
    pub fn poll(&mut self) -> Result<Vec<ShardOutcome>> {
        loop {
            match self.done.try_recv() {
                Ok(r) => {
                    self.in_flight -= 1;
                    self.finished.push(r?);
                }
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) if self.in_flight == 0 => break,
                Err(TryRecvError::Disconnected) => return Err(self.gone("poll")),
            }
        }
        Ok(std::mem::take(&mut self.finished))
    }

    /// Waits for every save, stops the thread, and returns the outcomes not yet polled.
    /// On rank 0 this also closes the engine, whose error (a failed retention, say) comes
    /// back here.
    pub fn finish(mut self) -> Result<Vec<ShardOutcome>> {
        self.wait_idle_inner()?;
        self.tx = None;
        if let Some(t) = self.thread.take() {
            t.join().map_err(|_| self.gone("finish"))??;
        }
        Ok(std::mem::take(&mut self.finished))
    }

    /// A published outcome as the engine's event, for a [`ckpt_core::CheckpointSession`].
    fn event(&self, o: ShardOutcome) -> ckpt_core::SaveEvent {
        shard_event(&self.root, o)
    }

    /// [`Self::finish`], as the session's events.
    pub fn close(self) -> Result<Vec<ckpt_core::SaveEvent>> {
        let root = self.root.clone();
        let outcomes = self.finish()?;
        Ok(outcomes
            .into_iter()
            .map(|o| shard_event(&root, o))
            .collect())
    }
}

/// A published sharded save as the engine's event.
fn shard_event(root: &Path, o: ShardOutcome) -> ckpt_core::SaveEvent {
    ckpt_core::SaveEvent {
        step: o.step,
        path: root.join(ckpt_core::layout::checkpoint_dir_name(o.step)),
        bytes: o.bytes,
        stall: Duration::ZERO,
        blocked: Duration::ZERO,
        persist: o.persist,
        to_durable: o.persist,
        sync: false,
        removed: Vec::new(),
    }
}

/// A sharded saver reports to a [`ckpt_core::CheckpointSession`] like the engine does.
impl<M: Module + 'static> ckpt_core::SaveTarget for ShardedSaver<M> {
    type Error = Error;
    fn in_flight(&self) -> usize {
        self.in_flight
    }
    fn poll(&mut self) -> Result<Vec<ckpt_core::SaveEvent>> {
        let outcomes = ShardedSaver::poll(self)?;
        Ok(outcomes.into_iter().map(|o| self.event(o)).collect())
    }
    fn wait_idle(&mut self) -> Result<Vec<ckpt_core::SaveEvent>> {
        let outcomes = ShardedSaver::wait_idle(self)?;
        Ok(outcomes.into_iter().map(|o| self.event(o)).collect())
    }
    fn blocked_total(&self) -> Duration {
        self.blocked
    }
    // The shard jobs are moved to the checkpoint thread whole; their memory is not counted.
    fn held_bytes(&self) -> Option<u64> {
        None
    }
    fn wait_held_at_most(&mut self, _limit: u64) -> Result<bool> {
        Ok(false)
    }
}

impl<M> Drop for ShardedSaver<M> {
    /// Stops the thread and waits for it (a save in progress finishes or fails, bounded by the
    /// collective timeout), so rank 0's engine, and with it the root's writer lock, is released
    /// before the saver's owner goes on, also when training ends with an error.
    fn drop(&mut self) {
        self.tx = None;
        if let Some(t) = self.thread.take() {
            match t.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::warn!(rank = self.rank, error = %e, "closing the checkpoint engine failed")
                }
                Err(_) => tracing::warn!(rank = self.rank, "the checkpoint thread panicked"),
            }
        }
    }
}

impl Worker {
    /// Saves one step's shards; every error names the step.
    fn save<M: Module + 'static>(&mut self, job: Job<M>) -> Result<ShardOutcome> {
        let step = job.step();
        let t0 = Instant::now();
        let job = job.build();
        // `NotPublished` comes after every rank agreed on the outcome; any other error left
        // the ranks out of step (a rank gone, a timeout, this thread failing before the
        // collective calls of the save).
        job.and_then(|job| self.save_inner(job, t0))
            .map_err(|e| match e {
                Error::NotPublished { .. } => e,
                other => Error::CheckpointGroupFailed {
                    step,
                    reason: format!("rank {}: {other}", self.group.rank()),
                },
            })
    }

    fn save_inner<M: Module + 'static>(
        &mut self,
        job: ShardJob<M>,
        t0: Instant,
    ) -> Result<ShardOutcome> {
        let rank = self.group.rank();
        let world = self.group.size();
        let step = job.trainer.step;
        fail::fail_point!(FP_BEFORE_GATHER, |_| Err(Error::Rank {
            rank,
            reason: format!("failpoint {FP_BEFORE_GATHER} at step {step}"),
        }));
        let (local, bytes): (Result<u64>, u64) = match self.format {
            ShardFormat::Consolidated => {
                let shard = job.optim.into_bytes(&self.root, step)?;
                let sent = shard.len() as u64;
                let gathered = self.group.gather(0, &shard)?;
                drop(shard);
                match gathered {
                    Some(shards) => {
                        let named = shards
                            .into_iter()
                            .enumerate()
                            .map(|(r, b)| (format!("rank {r} of {world}"), b))
                            .collect();
                        let r = merge_optimizer_shards(named).and_then(|merged| {
                            let snap =
                                self.base_snapshot(&job.trainer, job.model, job.scheduler)?;
                            self.publish(snap.with_bytes(OPTIM_FILE, merged))
                        });
                        (r, 0)
                    }
                    None => (Ok(sent), sent),
                }
            }
            ShardFormat::PerRank => {
                let path = staged_shard_path(&self.root, step, rank, world);
                let _ = ckpt_core::LocalDisk.remove_file(&path);
                let root = self.root.clone();
                let written = ckpt_core::write_durable_file(&path, |w| {
                    job.optim
                        .write(&root, step, w)
                        .map(drop)
                        .map_err(std::io::Error::other)
                });
                let report = match &written {
                    Ok(d) => ShardReport::Written {
                        size: d.size,
                        xxh3: d.xxh3,
                    },
                    Err(e) => ShardReport::Failed(format!("{}: {e}", path.display())),
                };
                let msg = bincode::serde::encode_to_vec(&report, bincode::config::standard())
                    .map_err(|e| Error::Config(e.to_string()))?;
                let sent = written.as_ref().map(|d| d.size).unwrap_or(0);
                match self.group.gather(0, &msg)? {
                    Some(reports) => {
                        let r =
                            self.publish_per_rank(&job.trainer, job.model, job.scheduler, reports);
                        if r.is_err() {
                            for q in 0..world {
                                let _ = ckpt_core::LocalDisk
                                    .remove_file(&staged_shard_path(&self.root, step, q, world));
                            }
                        }
                        (r, 0)
                    }
                    None => (
                        written.map(|d| d.size).map_err(|e| Error::Shard {
                            file: path.clone(),
                            reason: e.to_string(),
                        }),
                        sent,
                    ),
                }
            }
        };
        let agreed = self.group.all_agree(local.is_ok())?;
        match (local, agreed) {
            (Ok(total), true) => Ok(ShardOutcome {
                step,
                bytes: if rank == 0 { total } else { bytes },
                persist: t0.elapsed(),
            }),
            (Err(e), _) => Err(Error::NotPublished {
                step,
                reason: format!("rank {rank}: {e}"),
            }),
            (Ok(_), false) => Err(Error::NotPublished {
                step,
                reason: "another rank failed".into(),
            }),
        }
    }

    fn base_snapshot<M: Module + 'static>(
        &self,
        trainer: &TrainerState,
        model: Option<ModelPart<M>>,
        scheduler: LrSchedulerRecord,
    ) -> Result<Snapshot> {
        let model = model.ok_or_else(|| Error::Config("rank 0 captured no model".into()))?;
        let world = self.group.size() as u32;
        let snap = Snapshot::new(trainer.step)
            .with_epoch(trainer.epoch)
            .with_layout(world, self.format.layout());
        let snap = model.add_to(snap, &self.root, trainer.step);
        Ok(snap
            .with_bytes(SCHEDULER_FILE, encode_scheduler(scheduler)?)
            .with_bytes(TRAINER_FILE, trainer.to_bytes()))
    }

    fn publish(&mut self, snap: Snapshot) -> Result<u64> {
        let engine = self
            .engine
            .as_mut()
            .ok_or_else(|| Error::Config("only rank 0 publishes".into()))?;
        engine.submit(snap)?;
        let events = engine.wait_idle()?;
        Ok(events.iter().map(|e| e.bytes).sum())
    }

    fn publish_per_rank<M: Module + 'static>(
        &mut self,
        trainer: &TrainerState,
        model: Option<ModelPart<M>>,
        scheduler: LrSchedulerRecord,
        reports: Vec<Vec<u8>>,
    ) -> Result<u64> {
        let world = self.group.size();
        let step = trainer.step;
        let mut snap = self.base_snapshot(trainer, model, scheduler)?;
        for (r, msg) in reports.into_iter().enumerate() {
            let file = staged_shard_path(&self.root, step, r, world);
            let report: ShardReport =
                bincode::serde::decode_from_slice(&msg, bincode::config::standard())
                    .map(|(v, _)| v)
                    .map_err(|e| Error::Shard {
                        file: file.clone(),
                        reason: format!("undecodable report from rank {r}: {e}"),
                    })?;
            match report {
                ShardReport::Written { size, xxh3 } => {
                    snap = snap.with_adopted(
                        shard_file_name(r, world),
                        DurableFile {
                            path: file,
                            size,
                            xxh3,
                        },
                    );
                }
                ShardReport::Failed(reason) => {
                    return Err(Error::Shard {
                        file,
                        reason: format!("rank {r} could not write its shard: {reason}"),
                    });
                }
            }
        }
        self.publish(snap)
    }
}
