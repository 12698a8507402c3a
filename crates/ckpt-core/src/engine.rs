//! The engine: one background persist thread per root, a bounded number of checkpoints in
//! flight, an explicit backpressure policy, and non-blocking status for the trainer.

use std::{
    collections::VecDeque,
    path::{Path, PathBuf},
    sync::{
        Arc, Condvar, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use crossbeam_channel::{Receiver, Sender};
use serde::Serialize;

use crate::{
    Error, RecoveryReport, Result, Retention, RootLock, Snapshot,
    publish::Publisher,
    recovery,
    storage::{LocalDisk, Storage, StoragePath},
};

/// What `submit` does when `max_in_flight` checkpoints are already being persisted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Backpressure {
    /// Wait for a slot (the wait counts as stall).
    #[default]
    Block,
    /// Drop this checkpoint and count it.
    Skip,
    /// Persist this checkpoint on the calling thread.
    Sync,
}

/// Configuration of an [`Engine`].
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Checkpoint root directory.
    pub root: PathBuf,
    /// Checkpoints queued or being written at once (at least 1).
    pub max_in_flight: usize,
    /// Policy when full.
    pub backpressure: Backpressure,
    /// Retention after each publication.
    pub retention: Retention,
    /// Nice value of the persist thread, which also runs as `SCHED_BATCH` so that waking it
    /// never preempts the trainer and its encoding yields to training on shared cores
    /// (Linux). `None` keeps the creating thread's priority: choose it when other CPU-heavy
    /// processes share the machine, where a niced persist thread gets little CPU, saves take
    /// longer to become durable and, with `Backpressure::Block`, the next save waits.
    pub persist_nice: Option<i32>,
    /// Where the root lives: [`LocalDisk`] unless set ([`EngineConfig::storage`]).
    pub storage: Arc<dyn Storage>,
}

impl EngineConfig {
    /// Defaults: one checkpoint in flight, block when full, keep everything, a
    /// background-priority persist thread.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            max_in_flight: 1,
            backpressure: Backpressure::Block,
            retention: Retention::keep_all(),
            persist_nice: Some(Self::PERSIST_NICE),
            storage: Arc::new(LocalDisk),
        }
    }
    /// Sets the storage the root lives on (the default is the local disk).
    pub fn storage(mut self, storage: Arc<dyn Storage>) -> Self {
        self.storage = storage;
        self
    }
    /// The default nice value of the persist thread.
    pub const PERSIST_NICE: i32 = 10;
    /// Sets the persist thread's nice value (`None`: normal priority).
    pub fn persist_nice(mut self, nice: Option<i32>) -> Self {
        self.persist_nice = nice;
        self
    }
    /// Sets `max_in_flight`.
    pub fn max_in_flight(mut self, n: usize) -> Self {
        self.max_in_flight = n.max(1);
        self
    }
    /// Sets the backpressure policy.
    pub fn backpressure(mut self, b: Backpressure) -> Self {
        self.backpressure = b;
        self
    }
    /// Sets retention.
    pub fn retention(mut self, r: Retention) -> Self {
        self.retention = r;
        self
    }
}

/// How a submitted snapshot was handled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubmitOutcome {
    /// Handed to the persist thread.
    Queued {
        /// Step.
        step: u64,
        /// Time spent waiting for a free slot.
        blocked: Duration,
    },
    /// Dropped by the `Skip` policy.
    Skipped {
        /// Step.
        step: u64,
    },
    /// Persisted and published on the calling thread (`Sync` policy).
    WrittenSync(SaveEvent),
}

/// A published checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SaveEvent {
    /// Step.
    pub step: u64,
    /// Published directory.
    pub path: PathBuf,
    /// Bytes written (all parts).
    pub bytes: u64,
    /// Time the training thread was blocked: capture plus submit (including backpressure).
    pub stall: Duration,
    /// Part of `stall` spent waiting for a free slot.
    pub blocked: Duration,
    /// Time writing and publishing took.
    pub persist: Duration,
    /// From submit to published.
    pub to_durable: Duration,
    /// Whether it was written on the calling thread.
    pub sync: bool,
    /// Steps removed by retention afterwards.
    pub removed: Vec<u64>,
}

impl SaveEvent {
    /// Persist throughput in bytes per second.
    pub fn throughput(&self) -> f64 {
        self.bytes as f64 / self.persist.as_secs_f64().max(1e-9)
    }
}

/// Counters for a progress bar or a report.
#[derive(Debug, Clone, Default, Serialize)]
pub struct EngineMetrics {
    /// Checkpoints published.
    pub published: u64,
    /// Checkpoints that failed.
    pub failed: u64,
    /// Checkpoints dropped by the `Skip` policy.
    pub skipped: u64,
    /// Checkpoints queued or being written now.
    pub in_flight: usize,
    /// Total time `submit` waited for a slot.
    pub blocked_total: Duration,
    /// Newest published step.
    pub last_step: Option<u64>,
}

/// What [`Engine::finish`] returns.
#[derive(Debug, Clone, Default)]
pub struct Summary {
    /// Events not yet returned by `poll`.
    pub events: Vec<SaveEvent>,
    /// Final counters.
    pub metrics: EngineMetrics,
}

struct Job {
    snapshot: Snapshot,
    submitted: Instant,
    stall: Duration,
    blocked: Duration,
}

type Slots = Arc<(Mutex<usize>, Condvar)>;

/// Jobs handed to the persist thread. `submit` only enqueues: waking a sleeping thread costs a
/// system call, and on a VM an inter-processor interrupt, tens of microseconds on the training
/// thread. The persist thread instead looks for work every [`JobQueue::POLL`] (every
/// [`JobQueue::IDLE_POLL`] after a second without work); whoever waits for it (`wait_idle`,
/// `finish`) wakes it at once.
#[derive(Default)]
struct JobQueue {
    jobs: Mutex<VecDeque<Job>>,
    closed: AtomicBool,
}

impl JobQueue {
    /// How often an active persist thread looks for a job.
    const POLL: Duration = Duration::from_millis(2);
    /// How often an idle one does.
    const IDLE_POLL: Duration = Duration::from_millis(20);
    /// Without a job for this long, the persist thread counts as idle.
    const IDLE_AFTER: Duration = Duration::from_secs(1);

    fn push(&self, job: Job) {
        self.jobs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push_back(job);
    }

    fn is_empty(&self) -> bool {
        self.jobs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty()
    }

    fn pop(&self) -> Option<Job> {
        self.jobs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop_front()
    }
}

/// The checkpoint engine for one root. See the crate docs.
pub struct Engine {
    config: EngineConfig,
    publisher: Arc<Publisher>,
    jobs: Arc<JobQueue>,
    done: Receiver<Result<SaveEvent>>,
    worker: Option<JoinHandle<()>>,
    slots: Slots,
    ready: VecDeque<Result<SaveEvent>>,
    metrics: EngineMetrics,
    held: Arc<crate::held::HeldLedger>,
    _lock: RootLock,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("root", &self.config.root)
            .field("metrics", &self.metrics)
            .finish()
    }
}

impl Engine {
    /// Takes the writer lock on the root, runs start-up recovery and starts the persist thread.
    pub fn open(config: EngineConfig) -> Result<(Self, RecoveryReport)> {
        let lock = RootLock::acquire(StoragePath::new(&*config.storage, &config.root))?;
        let report = recovery::recover(StoragePath::new(&*config.storage, &config.root))?;
        let latest = report.latest.as_ref().map(|c| c.step);
        let publisher = Arc::new(Publisher::new(
            config.storage.clone(),
            config.root.clone(),
            config.retention,
            latest,
        ));
        let jobs = Arc::new(JobQueue::default());
        let (done_tx, done_rx) = crossbeam_channel::unbounded();
        let slots: Slots = Arc::new((Mutex::new(0), Condvar::new()));
        let worker = {
            let publisher = publisher.clone();
            let slots = slots.clone();
            let jobs = jobs.clone();
            let nice = config.persist_nice;
            std::thread::Builder::new()
                .name("ckpt-persist".into())
                .spawn(move || {
                    if let Some(n) = nice
                        && !crate::priority::lower_current_thread(n)
                    {
                        tracing::debug!("could not lower the persist thread's priority");
                    }
                    persist_loop(publisher, &jobs, done_tx, slots)
                })
                .map_err(|e| Error::io(&config.root, e))?
        };
        let metrics = EngineMetrics {
            last_step: latest,
            ..Default::default()
        };
        let engine = Self {
            config,
            publisher,
            jobs,
            done: done_rx,
            worker: Some(worker),
            slots,
            ready: VecDeque::new(),
            metrics,
            held: Arc::default(),
            _lock: lock,
        };
        Ok((engine, report))
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.config.root
    }

    /// Checkpoints queued or being written.
    pub fn in_flight(&self) -> usize {
        *self.slots.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Bytes the parts of submitted, not yet written snapshots declare they hold
    /// ([`Snapshot::holding`]); each part's share is given back once it is written or its
    /// save failed.
    pub fn held_bytes(&self) -> u64 {
        self.held.held()
    }

    /// Waits until [`Self::held_bytes`] is at most `limit`: what a trainer under a memory
    /// budget does after submitting a save larger than the budget, so it resumes as soon as
    /// the rest fits rather than after the whole save. Returns how long it waited; an error
    /// if the persist thread is gone (its held parts would never be written).
    pub fn wait_held_at_most(&self, limit: u64) -> Result<Duration> {
        let t0 = Instant::now();
        self.wake_worker();
        while !self.held.wait_at_most(limit, Duration::from_millis(50)) {
            if self.worker.as_ref().is_none_or(|w| w.is_finished()) {
                return Err(Error::WorkerGone(
                    "persist thread stopped with snapshot data still held".into(),
                ));
            }
        }
        Ok(t0.elapsed())
    }

    /// Current counters.
    pub fn metrics(&self) -> EngineMetrics {
        let mut m = self.metrics.clone();
        m.in_flight = self.in_flight();
        m
    }

    fn collect(&mut self) {
        while let Ok(r) = self.done.try_recv() {
            match &r {
                Ok(ev) => {
                    self.metrics.published += 1;
                    self.metrics.last_step = self.metrics.last_step.max(Some(ev.step));
                }
                Err(_) => self.metrics.failed += 1,
            }
            self.ready.push_back(r);
        }
    }

    fn take_error(&mut self) -> Result<()> {
        if let Some(i) = self.ready.iter().position(|r| r.is_err())
            && let Some(Err(e)) = self.ready.remove(i)
        {
            return Err(e);
        }
        Ok(())
    }

    /// Non-blocking: returns checkpoints published since the last call, or the first
    /// background error (events stay queued for the next call).
    pub fn poll(&mut self) -> Result<Vec<SaveEvent>> {
        self.collect();
        self.take_error()?;
        Ok(self.ready.drain(..).filter_map(|r| r.ok()).collect())
    }

    /// Blocks until nothing is in flight, then polls.
    pub fn wait_idle(&mut self) -> Result<Vec<SaveEvent>> {
        self.wait_drained();
        self.poll()
    }

    /// Blocks until nothing is in flight (outcomes stay queued).
    fn wait_drained(&self) {
        self.wake_worker();
        let (m, cv) = &*self.slots;
        let mut n = m.lock().unwrap_or_else(|e| e.into_inner());
        while *n > 0 {
            n = cv.wait(n).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Submits a snapshot. After it returns the caller may mutate anything: the snapshot owns
    /// its data. A pending background error is returned first (and this snapshot is then not
    /// written).
    pub fn submit(&mut self, mut snapshot: Snapshot) -> Result<SubmitOutcome> {
        let t0 = Instant::now();
        self.collect();
        self.take_error()?;
        snapshot.validate()?;
        let step = snapshot.step;
        let (m, cv) = &*self.slots;
        let mut n = m.lock().unwrap_or_else(|e| e.into_inner());
        if *n >= self.config.max_in_flight {
            match self.config.backpressure {
                Backpressure::Skip => {
                    self.metrics.skipped += 1;
                    tracing::debug!(step, "checkpoint skipped: persist pipeline full");
                    return Ok(SubmitOutcome::Skipped { step });
                }
                Backpressure::Sync => {
                    drop(n);
                    let capture = snapshot.capture_time;
                    let published = self.publisher.persist(snapshot);
                    let ev = match published {
                        Ok(p) => p,
                        Err(e) => {
                            self.metrics.failed += 1;
                            return Err(e);
                        }
                    };
                    let stall = capture + t0.elapsed();
                    let ev = SaveEvent {
                        step,
                        path: ev.path,
                        bytes: ev.bytes,
                        stall,
                        blocked: Duration::ZERO,
                        persist: ev.persist,
                        to_durable: t0.elapsed(),
                        sync: true,
                        removed: ev.removed,
                    };
                    self.metrics.published += 1;
                    self.metrics.last_step = self.metrics.last_step.max(Some(step));
                    return Ok(SubmitOutcome::WrittenSync(ev));
                }
                Backpressure::Block => {
                    // Its background work may start while it waits for a slot.
                    snapshot.take_accepted()();
                    while *n >= self.config.max_in_flight {
                        n = cv.wait(n).unwrap_or_else(|e| e.into_inner());
                    }
                }
            }
        }
        *n += 1;
        drop(n);
        let blocked = t0.elapsed();
        self.metrics.blocked_total += blocked;
        for part in &mut snapshot.parts {
            if part.holds > 0 {
                part.guard = Some(self.held.hold(part.holds));
            }
        }
        let accepted = snapshot.take_accepted();
        let job = Job {
            stall: snapshot.capture_time + t0.elapsed(),
            snapshot,
            submitted: t0,
            blocked,
        };
        let running = self.worker.as_ref().is_some_and(|w| !w.is_finished());
        if !running || self.jobs.closed.load(Ordering::Acquire) {
            let (m, cv) = &*self.slots;
            *m.lock().unwrap_or_else(|e| e.into_inner()) -= 1;
            cv.notify_all();
            return Err(Error::WorkerGone("persist thread is not running".into()));
        }
        self.jobs.push(job);
        accepted();
        Ok(SubmitOutcome::Queued { step, blocked })
    }

    /// An explicit rewind, for a run that resumed from `to` (or starts over: `None`) in a root
    /// holding newer checkpoints of the timeline it abandons: waits for in-flight saves, moves
    /// every checkpoint newer than `to` aside to `ROOT/.rewound-step-*` (kept for the user,
    /// invisible to listing, resume and retention), points `latest` at `to` and lets later
    /// saves publish from there, so `latest` never names a checkpoint of the abandoned
    /// timeline. Each moved checkpoint is a warning. Returns the steps moved and where.
    pub fn rewind(&mut self, to: Option<u64>) -> Result<Vec<(u64, PathBuf)>> {
        // Events stay queued for the next poll.
        self.wait_drained();
        self.collect();
        self.take_error()?;
        let moved = self.publisher.rewind(to)?;
        for (step, aside) in &moved {
            tracing::warn!(
                step,
                moved_to = %aside.display(),
                resumed_from = ?to,
                "checkpoint of the abandoned timeline moved aside (rewind)"
            );
        }
        if !moved.is_empty() {
            self.metrics.last_step = to;
        }
        Ok(moved)
    }

    /// Waits for every in-flight checkpoint and stops the persist thread. Returns the events
    /// not yet polled, or the first error.
    pub fn finish(mut self) -> Result<Summary> {
        self.shutdown()?;
        self.collect();
        self.take_error()?;
        let events = self.ready.drain(..).filter_map(|r| r.ok()).collect();
        Ok(Summary {
            events,
            metrics: self.metrics(),
        })
    }

    fn wake_worker(&self) {
        if let Some(w) = &self.worker {
            w.thread().unpark();
        }
    }

    fn shutdown(&mut self) -> Result<()> {
        self.jobs.closed.store(true, Ordering::Release);
        self.wake_worker();
        if let Some(w) = self.worker.take() {
            w.join()
                .map_err(|_| Error::WorkerGone("persist thread panicked".into()))?;
        }
        Ok(())
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        // Pending saves finish; errors nobody can receive any more are logged.
        let _ = self.shutdown();
        self.collect();
        for r in self.ready.drain(..) {
            if let Err(e) = r {
                tracing::error!(error = %e, "checkpoint failed after the engine was dropped");
            }
        }
    }
}

fn persist_loop(
    publisher: Arc<Publisher>,
    jobs: &JobQueue,
    done: Sender<Result<SaveEvent>>,
    slots: Slots,
) {
    let mut last_job = Instant::now();
    loop {
        let Some(job) = jobs.pop() else {
            if jobs.closed.load(Ordering::Acquire) {
                // Closed after the last push (`submit` and `finish` both take `&mut Engine`):
                // one more look drains anything pushed before the flag was seen.
                if jobs.is_empty() {
                    break;
                }
                continue;
            }
            let idle = last_job.elapsed() >= JobQueue::IDLE_AFTER;
            std::thread::park_timeout(if idle {
                JobQueue::IDLE_POLL
            } else {
                JobQueue::POLL
            });
            continue;
        };
        last_job = Instant::now();
        let step = job.snapshot.step;
        let started = Instant::now();
        let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            publisher.persist(job.snapshot)
        }))
        .unwrap_or_else(|p| {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            Err(Error::WorkerGone(format!(
                "panic while persisting step {step}: {msg}"
            )))
        });
        let ev = res.map(|p| SaveEvent {
            step,
            path: p.path,
            bytes: p.bytes,
            stall: job.stall,
            blocked: job.blocked,
            persist: started.elapsed(),
            to_durable: job.submitted.elapsed(),
            sync: false,
            removed: p.removed,
        });
        if let Err(e) = &ev {
            tracing::warn!(step, error = %e, "checkpoint failed");
        }
        let _ = done.send(ev);
        let (m, cv) = &*slots;
        *m.lock().unwrap_or_else(|e| e.into_inner()) -= 1;
        cv.notify_all();
    }
}
